//! The LAN of the tests of traffic from outside the node (TC programs), run through the real
//! agent with the file source.
//!
//! Topology, all made by the test: a switch namespace with a bridge joins an external client
//! (10.77.0.10), node1 (10.77.0.1: the sandbox namespace, where the agent runs) and node2
//! (10.77.0.2). pod1 (10.244.1.10) hangs off node1, pod2 (10.244.2.10) off node2; node1
//! routes pod2's subnet via node2. The client reaches LoadBalancer IPs and externalIPs
//! through node1.
//!
//! The LAN is dual-stack: every one of those has an IPv6 (ULA) address too, added
//! without duplicate address detection so that it is usable at once; a scenario picks its
use std::{
    net::{Ipv4Addr, Ipv6Addr},
    process::Command,
};

use crate::{
    family::Family,
    netns::{Netns, veth},
    run,
};

mod addresses;
mod checks;
mod manifests;
mod node;

pub use addresses::{
    Addresses, CLIENT, EXTERNAL_IP, LB_IP, NODE1, NODE2, POD1, POD2, addresses, lan6,
};
pub use checks::{answers, assert_translated, counters, servers_of};
pub use manifests::{POD1_ENDPOINT, POD2_ENDPOINT, nodes, service, slice};
pub use node::LanNode;

/// The namespaces around node1; dropped (and with them every veth) after the agent.
pub struct Lan {
    pub client: Netns,
    pub pod1: Netns,
    pub pod2: Netns,
    pub node2: Netns,
    switch: Netns,
}

/// Numbers the LANs of this process, so that two tests that chose the same tag never share
/// a namespace name.
static LANS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

pub fn lan(test: &str) -> Lan {
    let number = LANS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let prefix = format!("slb{}{test}{number}", std::process::id());
    let switch = Netns::new(&format!("{prefix}-sw"));
    switch.ip(&["link", "add", "br0", "type", "bridge"]);
    switch.ip(&["link", "set", "br0", "up"]);
    let plug = |port: &str, netns: Option<&Netns>| {
        match netns {
            Some(host) => switch.ip(&veth(port, "eth0", &host.name)),
            // node1: the sandbox namespace this thread is in.
            None => here(&veth("eth0", port, &switch.name)),
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
    here(&veth("pod1", "eth0", &pod1.name));
    here(&["addr", "add", "10.244.1.1/24", "dev", "pod1"]);
    here(&v6_address("fd00:244:1::1", 64, "pod1"));
    here(&["link", "set", "pod1", "up"]);
    pod_addresses(&pod1, POD1, "10.244.1.1");
    pod_addresses6(&pod1, lan6::POD1, "fd00:244:1::1");

    let pod2 = Netns::new(&format!("{prefix}-pod2"));
    node2.ip(&veth("pod2", "eth0", &pod2.name));
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
        self.switch.ip(&veth("p-rt", "eth0", &router.name));
        self.switch
            .ip(&["link", "set", "p-rt", "master", "br0", "up"]);
        router.ip(&["addr", "add", "10.77.0.20/24", "dev", "eth0"]);
        router.ip(&v6_address("fd00:77::20", 64, "eth0"));
        router.ip(&["link", "set", "eth0", "up"]);
        router.sysctl("net.ipv4.ip_forward=1");
        router.sysctl("net.ipv6.conf.all.forwarding=1");

        let client = Netns::new(&format!("{prefix}-far"));
        router.ip(&veth("far0", "eth0", &client.name));
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

/// A workload on node1 whose sockets the socket hooks never see (a VM, a sandbox): its own
/// network namespace behind the veth `vm1` (10.244.3.10 and fd00:244:3::10, its node-side
/// gateway .1), as a CNI plugs a pod, with processes outside the served cgroup. node2
/// routes its network back through node1, and node1 blackholes the service CIDRs, so that a
/// ClusterIP packet the per-packet path did not translate goes nowhere.
pub const VM: &str = "10.244.3.10";
pub const VM6: &str = "fd00:244:3::10";

impl Lan {
    pub fn vm(&self) -> Netns {
        let prefix = self.switch.name.trim_end_matches("-sw");
        let vm = Netns::new(&format!("{prefix}-vm"));
        here(&veth("vm1", "eth0", &vm.name));
        here(&["addr", "add", "10.244.3.1/24", "dev", "vm1"]);
        here(&v6_address("fd00:244:3::1", 64, "vm1"));
        here(&["link", "set", "vm1", "up"]);
        pod_addresses(&vm, VM.parse().expect("VM address"), "10.244.3.1");
        pod_addresses6(&vm, VM6.parse().expect("VM6 address"), "fd00:244:3::1");
        self.node2
            .ip(&["route", "add", "10.244.3.0/24", "via", NODE1]);
        self.node2
            .ip(&["-6", "route", "add", "fd00:244:3::/64", "via", lan6::NODE1]);
        blackhole_service_cidrs();
        vm
    }

    /// The outside client routes the service CIDRs to node1, as a BGP speaker advertising
    /// them would make it; node1 blackholes them, so that a ClusterIP packet socklb did not
    /// translate goes nowhere.
    pub fn route_service_cidrs_to_node1(&self) {
        self.client
            .ip(&["route", "add", crate::testbed::SERVICE_CIDR, "via", NODE1]);
        self.client.ip(&[
            "-6",
            "route",
            "add",
            crate::family::SERVICE_CIDR6,
            "via",
            lan6::NODE1,
        ]);
        blackhole_service_cidrs();
    }
}

/// Blackhole routes for the service CIDRs in node1.
fn blackhole_service_cidrs() {
    here(&[
        "route",
        "replace",
        "blackhole",
        crate::testbed::SERVICE_CIDR,
    ]);
    here(&[
        "-6",
        "route",
        "replace",
        "blackhole",
        crate::family::SERVICE_CIDR6,
    ]);
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
    // As iptables-save writes them.
    let rules = [
        format!("-t nat -A POSTROUTING -s {pod_cidr} ! -d {pod_cidr} -j MASQUERADE"),
        "-A FORWARD -m conntrack --ctstate INVALID -j DROP".to_owned(),
        "-A INPUT -m conntrack --ctstate INVALID -j DROP".to_owned(),
        format!("-A FORWARD -s {pod_cidr} -j ACCEPT"),
        format!("-A FORWARD -d {pod_cidr} -j ACCEPT"),
        "-P FORWARD DROP".to_owned(),
    ];
    for rule in rules {
        // In node1, the namespace of this thread; they go with it.
        run(Command::new(tool).args(rule.split(' ')));
    }
}
