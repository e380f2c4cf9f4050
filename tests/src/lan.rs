//! The LAN of the tests of traffic from outside the node (TC programs), run through the real
//! agent with the file source.
//!
//! Topology, all made by the test: a switch namespace with a bridge joins an external client
//! (10.77.0.10), node1 (10.77.0.1: the sandbox namespace, where the agent runs) and node2
//! (10.77.0.2). pod1 (10.244.1.10) hangs off node1, pod2 (10.244.2.10) off node2; node1
//! routes pod2's subnet via node2. The client reaches LoadBalancer IPs and externalIPs
//! through node1.
use std::{
    net::{Ipv4Addr, SocketAddrV4},
    process::Command,
};

use crate::{Attempt, ManifestDir, Sandbox, netns::Netns, node_yaml, run};

pub const NODE1: &str = "10.77.0.1";
pub const NODE2: &str = "10.77.0.2";
pub const CLIENT: &str = "10.77.0.10";
pub const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 10);
pub const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 10);
pub const LB_IP: &str = "192.0.2.100";
pub const EXTERNAL_IP: &str = "198.51.100.7";

/// The namespaces around node1; dropped (and with them every veth) after the agent.
pub struct Lan {
    pub client: Netns,
    pub pod1: Netns,
    pub pod2: Netns,
    pub node2: Netns,
    _switch: Netns,
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
    here(&["link", "set", "eth0", "up"]);
    run(Command::new("sysctl").args(["-qw", "net.ipv4.ip_forward=1"]));

    let client = Netns::new(&format!("{prefix}-client"));
    plug("p-client", Some(&client));
    client.ip(&["addr", "add", &format!("{CLIENT}/24"), "dev", "eth0"]);
    client.ip(&["link", "set", "eth0", "up"]);
    for address in [LB_IP, EXTERNAL_IP] {
        client.ip(&["route", "add", address, "via", NODE1]);
    }

    let node2 = Netns::new(&format!("{prefix}-node2"));
    plug("p-node2", Some(&node2));
    node2.ip(&["addr", "add", &format!("{NODE2}/24"), "dev", "eth0"]);
    node2.ip(&["link", "set", "eth0", "up"]);
    node2.sysctl("net.ipv4.ip_forward=1");

    let pod1 = Netns::new(&format!("{prefix}-pod1"));
    run(Command::new("ip").args([
        "link", "add", "pod1", "type", "veth", "peer", "name", "eth0", "netns", &pod1.name,
    ]));
    here(&["addr", "add", "10.244.1.1/24", "dev", "pod1"]);
    here(&["link", "set", "pod1", "up"]);
    pod_addresses(&pod1, POD1, "10.244.1.1");

    let pod2 = Netns::new(&format!("{prefix}-pod2"));
    node2.ip(&[
        "link", "add", "pod2", "type", "veth", "peer", "name", "eth0", "netns", &pod2.name,
    ]);
    node2.ip(&["addr", "add", "10.244.2.1/24", "dev", "pod2"]);
    node2.ip(&["link", "set", "pod2", "up"]);
    pod_addresses(&pod2, POD2, "10.244.2.1");
    here(&["route", "add", "10.244.2.0/24", "via", NODE2]);
    node2.ip(&["route", "add", "10.244.1.0/24", "via", NODE1]);

    Lan {
        client,
        pod1,
        pod2,
        node2,
        _switch: switch,
    }
}

/// `ip <args>` in node1, the namespace of this thread.
pub fn here(args: &[&str]) {
    run(Command::new("ip").args(args));
}

fn pod_addresses(pod: &Netns, address: Ipv4Addr, gateway: &str) {
    pod.ip(&["addr", "add", &format!("{address}/24"), "dev", "eth0"]);
    pod.ip(&["link", "set", "eth0", "up"]);
    pod.ip(&["route", "add", "default", "via", gateway]);
}

/// A Service; `kind_spec` adds to its spec (type, nodePorts, externalIPs, policies).
pub fn service(
    name: &str,
    cluster_ip: &str,
    ports: &str,
    kind_spec: &str,
    lb_ip: Option<&str>,
) -> String {
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
  ports: {ports}
{kind_spec}
{status}"
    )
}

pub fn nodes(manifests: &ManifestDir) {
    manifests.write(
        "nodes.yaml",
        &format!(
            "{}---\n{}",
            node_yaml("node1", "z1", NODE1),
            node_yaml("node2", "z1", NODE2)
        ),
    );
}

/// (address, node) of an endpoint.
pub const POD1_ENDPOINT: (&str, &str) = ("10.244.1.10", "node1");
pub const POD2_ENDPOINT: (&str, &str) = ("10.244.2.10", "node2");

/// An EndpointSlice of `service` for one port (`name`, `port`, `protocol`).
pub fn slice(
    name: &str,
    service: &str,
    port: (&str, u16, &str),
    endpoints: &[(&str, &str)],
) -> String {
    let (port_name, port, protocol) = port;
    let mut yaml = format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}
addressType: IPv4
ports: [{{name: {port_name}, port: {port}, protocol: {protocol}}}]
endpoints:
"
    );
    for (address, node) in endpoints {
        yaml.push_str(&format!("- addresses: [{address}]\n  nodeName: {node}\n"));
    }
    yaml
}

/// Splits probe replies `<server> <address:port it saw>` into (server, address seen).
pub fn answers(attempts: &[Attempt]) -> Vec<(String, SocketAddrV4)> {
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

/// Every reply came from a backend that saw the client's own address (pod1) or this node's
/// address with a SNAT port (pod2), and the client saw the frontend as its peer.
pub fn assert_translated(attempts: &[Attempt], frontend: &str) {
    for attempt in attempts {
        assert_eq!(
            attempt.peer.as_deref(),
            Some(frontend),
            "the client must see the frontend: {attempt:?}"
        );
    }
    for (server, seen) in answers(attempts) {
        match server.as_str() {
            "pod1" => assert_eq!(seen.ip().to_string(), CLIENT, "local backend: source kept"),
            "pod2" => {
                assert_eq!(
                    seen.ip().to_string(),
                    NODE1,
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
/// FORWARD policy of DROP that accepts the pod network both ways.
pub fn cni_netfilter_rules() {
    const POD_CIDR: &str = "10.244.0.0/16";
    let rules: [&[&str]; 6] = [
        &[
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-s",
            POD_CIDR,
            "!",
            "-d",
            POD_CIDR,
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
        &["-A", "FORWARD", "-s", POD_CIDR, "-j", "ACCEPT"],
        &["-A", "FORWARD", "-d", POD_CIDR, "-j", "ACCEPT"],
        &["-P", "FORWARD", "DROP"],
    ];
    for rule in rules {
        // In node1, the namespace of this thread; they go with it.
        run(Command::new("iptables").args(rule));
    }
}
