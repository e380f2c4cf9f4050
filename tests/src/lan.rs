//! The LAN of the tests of traffic from outside the node (TC programs), run through the real
//! agent with the file source.
//!
//! Topology, all made by the test: a switch namespace with a bridge joins an external client
//! (10.77.0.10), node1 (10.77.0.1: the sandbox namespace, where the agent runs) and node2
//! (10.77.0.2). pod1 (10.244.1.10) hangs off node1, pod2 (10.244.2.10) off node2; node1
//! routes pod2's subnet via node2. The client reaches LoadBalancer IPs and externalIPs
//! through node1.
//!
//! The LAN is dual-stack: every one of those has an IPv6 (ULA) address too ([`Lan6`]), added
//! without duplicate address detection so that it is usable at once; a scenario picks its
//! family's addresses with [`addresses`].
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    process::Command,
};

use crate::{Attempt, ManifestDir, Sandbox, family::Family, netns::Netns, run};

pub const NODE1: &str = "10.77.0.1";
pub const NODE2: &str = "10.77.0.2";
pub const CLIENT: &str = "10.77.0.10";
pub const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 10);
pub const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 10);
pub const LB_IP: &str = "192.0.2.100";
pub const EXTERNAL_IP: &str = "198.51.100.7";

/// The IPv6 twins of the addresses above.
pub mod lan6 {
    use std::net::Ipv6Addr;

    pub const NODE1: &str = "fd00:77::1";
    pub const NODE2: &str = "fd00:77::2";
    pub const CLIENT: &str = "fd00:77::10";
    pub const POD1: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 0x10);
    pub const POD2: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 0x10);
    pub const LB_IP: &str = "fd00:192::100";
    pub const EXTERNAL_IP: &str = "fd00:198::7";
    /// LoadBalancer IPs and externalIPs: blackholed on node1, so that a packet the
    /// programs did not translate goes nowhere.
    pub const FRONTEND_CIDRS: [&str; 2] = ["fd00:192::/64", "fd00:198::/64"];
}

/// The LAN's addresses of one family, as text (what manifests and probes take).
#[derive(Clone, Copy, Debug)]
pub struct Addresses {
    pub family: Family,
    pub node1: &'static str,
    pub node2: &'static str,
    pub client: &'static str,
    pub pod1: IpAddr,
    pub pod2: IpAddr,
    pub lb_ip: &'static str,
    pub external_ip: &'static str,
    /// The pod network (what a CNI's rules name).
    pub pod_cidr: &'static str,
    /// A second externalIP and a client range that excludes the client, for scenarios that
    /// need more than one.
    pub external_ip2: &'static str,
    pub other_clients: &'static str,
    /// A range holding the client (and little else).
    pub client_range: &'static str,
}

pub fn addresses(family: Family) -> Addresses {
    match family {
        Family::V4 => Addresses {
            family,
            node1: NODE1,
            node2: NODE2,
            client: CLIENT,
            pod1: POD1.into(),
            pod2: POD2.into(),
            lb_ip: LB_IP,
            external_ip: EXTERNAL_IP,
            pod_cidr: "10.244.0.0/16",
            external_ip2: "198.51.100.8",
            other_clients: "203.0.113.0/24",
            client_range: "10.77.0.0/28",
        },
        Family::V6 => Addresses {
            family,
            node1: lan6::NODE1,
            node2: lan6::NODE2,
            client: lan6::CLIENT,
            pod1: lan6::POD1.into(),
            pod2: lan6::POD2.into(),
            lb_ip: lan6::LB_IP,
            external_ip: lan6::EXTERNAL_IP,
            pod_cidr: "fd00:244::/32",
            external_ip2: "fd00:198::8",
            other_clients: "fd00:203::/48",
            client_range: "fd00:77::/120",
        },
    }
}

impl Addresses {
    /// `address:port` as a socket address (brackets around IPv6).
    pub fn at(address: &str, port: u16) -> String {
        let address: IpAddr = address
            .parse()
            .unwrap_or_else(|e| panic!("address {address}: {e}"));
        SocketAddr::new(address, port).to_string()
    }

    /// The endpoint of pod1 (on node1) and of pod2 (on node2), as [`slice`] takes them.
    pub fn pod1_endpoint(&self) -> (String, &'static str) {
        (self.pod1.to_string(), "node1")
    }

    pub fn pod2_endpoint(&self) -> (String, &'static str) {
        (self.pod2.to_string(), "node2")
    }
}

/// The namespaces around node1; dropped (and with them every veth) after the agent.
pub struct Lan {
    pub client: Netns,
    pub pod1: Netns,
    pub pod2: Netns,
    pub node2: Netns,
    switch: Netns,
}

pub fn lan(test: &str) -> Lan {
    let prefix = format!("slb{}{test}", std::process::id());
    let switch = Netns::new(&format!("{prefix}-sw"));
    switch.ip(&["link", "add", "br0", "type", "bridge"]);
    switch.ip(&["link", "set", "br0", "up"]);
    let plug = |port: &str, netns: Option<&Netns>| {
        match netns {
            Some(host) => switch.ip(&[
                "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &host.name,
            ]),
            // node1: the sandbox namespace this thread is in.
            None => run(Command::new("ip").args([
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                port,
                "netns",
                &switch.name,
            ])),
        }
        switch.ip(&["link", "set", port, "master", "br0", "up"]);
    };

    plug("p-node1", None);
    here(&["addr", "add", &format!("{NODE1}/24"), "dev", "eth0"]);
    here(&v6_address(lan6::NODE1, 64, "eth0"));
    here(&["link", "set", "eth0", "up"]);
    run(Command::new("sysctl").args(["-qw", "net.ipv4.ip_forward=1"]));
    run(Command::new("sysctl").args(["-qw", "net.ipv6.conf.all.forwarding=1"]));
    for cidr in lan6::FRONTEND_CIDRS {
        here(&["-6", "route", "add", "blackhole", cidr]);
    }

    let client = Netns::new(&format!("{prefix}-client"));
    plug("p-client", Some(&client));
    client.ip(&["addr", "add", &format!("{CLIENT}/24"), "dev", "eth0"]);
    client.ip(&v6_address(lan6::CLIENT, 64, "eth0"));
    client.ip(&["link", "set", "eth0", "up"]);
    for address in [LB_IP, EXTERNAL_IP] {
        client.ip(&["route", "add", address, "via", NODE1]);
    }
    for cidr in lan6::FRONTEND_CIDRS {
        client.ip(&["-6", "route", "add", cidr, "via", lan6::NODE1]);
    }

    let node2 = Netns::new(&format!("{prefix}-node2"));
    plug("p-node2", Some(&node2));
    node2.ip(&["addr", "add", &format!("{NODE2}/24"), "dev", "eth0"]);
    node2.ip(&v6_address(lan6::NODE2, 64, "eth0"));
    node2.ip(&["link", "set", "eth0", "up"]);
    node2.sysctl("net.ipv4.ip_forward=1");
    node2.sysctl("net.ipv6.conf.all.forwarding=1");

    let pod1 = Netns::new(&format!("{prefix}-pod1"));
    run(Command::new("ip").args([
        "link", "add", "pod1", "type", "veth", "peer", "name", "eth0", "netns", &pod1.name,
    ]));
    here(&["addr", "add", "10.244.1.1/24", "dev", "pod1"]);
    here(&v6_address("fd00:244:1::1", 64, "pod1"));
    here(&["link", "set", "pod1", "up"]);
    pod_addresses(&pod1, POD1, "10.244.1.1");
    pod_addresses6(&pod1, lan6::POD1, "fd00:244:1::1");

    let pod2 = Netns::new(&format!("{prefix}-pod2"));
    node2.ip(&[
        "link", "add", "pod2", "type", "veth", "peer", "name", "eth0", "netns", &pod2.name,
    ]);
    node2.ip(&["addr", "add", "10.244.2.1/24", "dev", "pod2"]);
    node2.ip(&v6_address("fd00:244:2::1", 64, "pod2"));
    node2.ip(&["link", "set", "pod2", "up"]);
    pod_addresses(&pod2, POD2, "10.244.2.1");
    pod_addresses6(&pod2, lan6::POD2, "fd00:244:2::1");
    here(&["route", "add", "10.244.2.0/24", "via", NODE2]);
    node2.ip(&["route", "add", "10.244.1.0/24", "via", NODE1]);
    here(&["-6", "route", "add", "fd00:244:2::/64", "via", lan6::NODE2]);
    node2.ip(&["-6", "route", "add", "fd00:244:1::/64", "via", lan6::NODE1]);

    Lan {
        client,
        pod1,
        pod2,
        node2,
        switch,
    }
}

/// An outside client behind a router ([`Lan::far_client`]), of either family.
pub const FAR_CLIENT: &str = "10.78.0.10";
pub const FAR_CLIENT6: &str = "fd00:78::10";

/// The namespaces of [`Lan::far_client`].
pub struct FarClient {
    pub client: Netns,
    pub router: Netns,
}

impl Lan {
    /// An outside client (10.78.0.10, fd00:78::10) behind a router on the LAN (10.77.0.20,
    /// fd00:77::20) whose link towards the client has an MTU of `mtu`, below every other
    /// link's: a tunnel or PPPoE somewhere on the path. The client's own interface keeps
    /// 1,500, so its TCP handshakes offer a segment size the path cannot carry, and the
    /// router answers larger packets with "fragmentation needed" (Packet Too Big) as real
    /// routers do. node1 routes the client's network via the router.
    pub fn far_client(&self, mtu: u32) -> FarClient {
        let prefix = self.switch.name.trim_end_matches("-sw");
        let router = Netns::new(&format!("{prefix}-rt"));
        self.switch.ip(&[
            "link",
            "add",
            "p-rt",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &router.name,
        ]);
        self.switch
            .ip(&["link", "set", "p-rt", "master", "br0", "up"]);
        router.ip(&["addr", "add", "10.77.0.20/24", "dev", "eth0"]);
        router.ip(&v6_address("fd00:77::20", 64, "eth0"));
        router.ip(&["link", "set", "eth0", "up"]);
        router.sysctl("net.ipv4.ip_forward=1");
        router.sysctl("net.ipv6.conf.all.forwarding=1");

        let client = Netns::new(&format!("{prefix}-far"));
        router.ip(&[
            "link",
            "add",
            "far0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &client.name,
        ]);
        router.ip(&["link", "set", "far0", "mtu", &mtu.to_string()]);
        router.ip(&["addr", "add", "10.78.0.1/24", "dev", "far0"]);
        router.ip(&v6_address("fd00:78::1", 64, "far0"));
        router.ip(&["link", "set", "far0", "up"]);
        client.ip(&["addr", "add", &format!("{FAR_CLIENT}/24"), "dev", "eth0"]);
        client.ip(&v6_address(FAR_CLIENT6, 64, "eth0"));
        client.ip(&["link", "set", "eth0", "up"]);
        client.ip(&["route", "add", "default", "via", "10.78.0.1"]);
        client.ip(&["-6", "route", "add", "default", "via", "fd00:78::1"]);
        here(&["route", "add", "10.78.0.0/24", "via", "10.77.0.20"]);
        here(&["-6", "route", "add", "fd00:78::/64", "via", "fd00:77::20"]);
        FarClient { client, router }
    }
}

/// `ip <args>` in node1, the namespace of this thread.
pub fn here<S: AsRef<std::ffi::OsStr>>(args: &[S]) {
    run(Command::new("ip").args(args));
}

fn pod_addresses(pod: &Netns, address: Ipv4Addr, gateway: &str) {
    pod.ip(&["addr", "add", &format!("{address}/24"), "dev", "eth0"]);
    pod.ip(&["link", "set", "eth0", "up"]);
    pod.ip(&["route", "add", "default", "via", gateway]);
}

fn pod_addresses6(pod: &Netns, address: Ipv6Addr, gateway: &str) {
    pod.ip(&v6_address(&address.to_string(), 64, "eth0"));
    pod.ip(&["-6", "route", "add", "default", "via", gateway]);
}

/// `ip` arguments adding an IPv6 address without duplicate address detection: usable at
/// once (not tentative), so no test waits for DAD.
fn v6_address(address: &str, prefix: u8, device: &str) -> [String; 7] {
    [
        "-6".into(),
        "addr".into(),
        "add".into(),
        format!("{address}/{prefix}"),
        "dev".into(),
        device.into(),
        "nodad".into(),
    ]
}

/// A Service; `kind_spec` adds to its spec (type, nodePorts, externalIPs, policies).
pub fn service(
    name: &str,
    cluster_ip: &str,
    ports: &str,
    kind_spec: &str,
    lb_ip: Option<&str>,
) -> String {
    let family = if cluster_ip.contains(':') {
        "  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]\n"
    } else {
        ""
    };
    let status = lb_ip.map_or_else(String::new, |ip| {
        format!("status: {{loadBalancer: {{ingress: [{{ip: {ip}}}]}}}}\n")
    });
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {cluster_ip}
  clusterIPs: [{cluster_ip}]
{family}  ports: {ports}
{kind_spec}
{status}"
    )
}

/// node1 and node2 with their IPv4 InternalIPs.
pub fn nodes(manifests: &ManifestDir) {
    addresses(Family::V4).nodes(manifests);
}

/// (address, node) of an endpoint.
pub const POD1_ENDPOINT: (&str, &str) = ("10.244.1.10", "node1");
pub const POD2_ENDPOINT: (&str, &str) = ("10.244.2.10", "node2");

/// An IPv4 EndpointSlice of `service` for one port (`name`, `port`, `protocol`).
pub fn slice(
    name: &str,
    service: &str,
    port: (&str, u16, &str),
    endpoints: &[(&str, &str)],
) -> String {
    addresses(Family::V4).slice(name, service, port, endpoints)
}

impl Addresses {
    /// node1 and node2 with their InternalIPs: IPv4 only, or (IPv6 scenarios) both
    /// families, IPv4 first, as on a dual-stack cluster.
    pub fn nodes(&self, manifests: &ManifestDir) {
        let node = |name: &str, v4: &str, v6: &str| {
            let v6 = match self.family {
                Family::V4 => String::new(),
                Family::V6 => format!(", {{type: InternalIP, address: {v6}}}"),
            };
            format!(
                "apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{topology.kubernetes.io/zone: z1, kubernetes.io/hostname: {name}}}
status:
  addresses: [{{type: InternalIP, address: {v4}}}{v6}]
"
            )
        };
        manifests.write(
            "nodes.yaml",
            &format!(
                "{}---\n{}",
                node("node1", NODE1, lan6::NODE1),
                node("node2", NODE2, lan6::NODE2)
            ),
        );
    }

    /// A Service of this family whose cluster IP is [`Family::vip`]`(host)`, and whose
    /// LoadBalancer ingress is this family's [`lb_ip`](Self::lb_ip) if `lb`.
    pub fn service(&self, name: &str, host: u8, ports: &str, kind_spec: &str, lb: bool) -> String {
        service(
            name,
            &self.family.vip(host).to_string(),
            ports,
            kind_spec,
            lb.then_some(self.lb_ip),
        )
    }

    /// An EndpointSlice of this family.
    pub fn slice<A: AsRef<str>>(
        &self,
        name: &str,
        service: &str,
        port: (&str, u16, &str),
        endpoints: &[(A, &str)],
    ) -> String {
        let (port_name, port, protocol) = port;
        let address_type = match self.family {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        };
        let mut yaml = format!(
            "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}
addressType: {address_type}
ports: [{{name: {port_name}, port: {port}, protocol: {protocol}}}]
endpoints:
"
        );
        for (address, node) in endpoints {
            let address = address.as_ref();
            yaml.push_str(&format!(
                "- addresses: [\"{address}\"]\n  nodeName: {node}\n"
            ));
        }
        yaml
    }

    /// Every reply came from a backend that saw the client's own address (pod1) or node1's
    /// address with a SNAT port (pod2), and the client saw the frontend as its peer.
    pub fn assert_translated(&self, attempts: &[Attempt], frontend: &str) {
        for attempt in attempts {
            assert_eq!(
                attempt.peer.as_deref(),
                Some(frontend),
                "the client must see the frontend: {attempt:?}"
            );
        }
        for (server, seen) in answers(attempts) {
            match server.as_str() {
                "pod1" => assert_eq!(
                    seen.ip().to_string(),
                    self.client,
                    "local backend: source kept"
                ),
                "pod2" => {
                    assert_eq!(
                        seen.ip().to_string(),
                        self.node1,
                        "remote backend: SNAT to node1"
                    );
                    assert!(
                        (61000..=65535).contains(&seen.port()),
                        "SNAT port {} outside the default range",
                        seen.port()
                    );
                }
                other => panic!("unexpected server {other}"),
            }
        }
    }
}

/// Splits probe replies `<server> <address:port it saw>` into (server, address seen).
pub fn answers(attempts: &[Attempt]) -> Vec<(String, SocketAddr)> {
    attempts
        .iter()
        .map(|attempt| {
            let reply = attempt
                .reply
                .as_deref()
                .unwrap_or_else(|| panic!("attempt failed: {attempt:?}"));
            let (server, seen) = reply
                .split_once(' ')
                .unwrap_or_else(|| panic!("unexpected reply {reply:?}"));
            (
                server.to_owned(),
                seen.parse()
                    .unwrap_or_else(|e| panic!("address in {reply:?}: {e}")),
            )
        })
        .collect()
}

/// [`Addresses::assert_translated`] over IPv4.
pub fn assert_translated(attempts: &[Attempt], frontend: &str) {
    addresses(Family::V4).assert_translated(attempts, frontend);
}

pub fn servers_of(attempts: &[Attempt]) -> Vec<String> {
    let mut servers: Vec<String> = answers(attempts).into_iter().map(|(s, _)| s).collect();
    servers.sort();
    servers.dedup();
    servers
}

/// The counters as `socklb inspect` shows them, run as in the agent's container.
pub fn counters(sandbox: &Sandbox) -> socklb_agent::inspect::CountersView {
    serde_json::from_value(sandbox.inspect()["counters"].clone()).expect("inspect's counters")
}

/// The rules a CNI and kubeadm leave on a node, with conntrack on: flannel's masquerade of
/// pod traffic leaving the pod network, drops of packets conntrack finds INVALID, and a
/// FORWARD policy of DROP that accepts the pod network both ways (iptables, or ip6tables
/// for IPv6 scenarios).
pub fn cni_netfilter_rules(family: Family) {
    let tool = match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    };
    let pod_cidr = addresses(family).pod_cidr;
    let rules: [&[&str]; 6] = [
        &[
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            pod_cidr,
            "!",
            "-d",
            pod_cidr,
            "-j",
            "MASQUERADE",
        ],
        &[
            "-A",
            "FORWARD",
            "-m",
            "conntrack",
            "--ctstate",
            "INVALID",
            "-j",
            "DROP",
        ],
        &[
            "-A",
            "INPUT",
            "-m",
            "conntrack",
            "--ctstate",
            "INVALID",
            "-j",
            "DROP",
        ],
        &["-A", "FORWARD", "-s", pod_cidr, "-j", "ACCEPT"],
        &["-A", "FORWARD", "-d", pod_cidr, "-j", "ACCEPT"],
        &["-P", "FORWARD", "DROP"],
    ];
    for rule in rules {
        // In node1, the namespace of this thread; they go with it.
        run(Command::new(tool).args(rule));
    }
}
