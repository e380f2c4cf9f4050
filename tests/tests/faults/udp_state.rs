//! UDP flows from outside are confirmed by their backend's first answer: a DNS query and
//! its response through a NodePort (real dig against real dnsmasq) leave the flow in the
//! main conntrack table, not in the table of unconfirmed flows where TCP handshakes wait
//! (request/response UDP at a high rate would otherwise evict them).
use std::net::{IpAddr, Ipv4Addr};

use socklb_agent::inspect;
use socklb_tests::{
    Agent, Dnsmasq, ManifestDir, Sandbox,
    family::Family,
    lan::{Addresses, addresses, lan},
};

/// What dnsmasq answers for `who.test`.
const ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);

#[test]
fn a_dns_answer_through_a_node_port_confirms_the_flow_over_ipv4() {
    a_dns_answer_confirms_the_flow(Family::V4);
}

#[test]
fn a_dns_answer_through_a_node_port_confirms_the_flow_over_ipv6() {
    a_dns_answer_confirms_the_flow(Family::V6);
}

fn a_dns_answer_confirms_the_flow(family: Family) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("udpconfirm{}", family.tag()));
    let lan = lan(&format!("dq{}", family.tag()));
    let _servers = [
        lan.pod1.enter(|| Dnsmasq::start(a.pod1, ANSWER)),
        lan.pod2.enter(|| Dnsmasq::start(a.pod2, ANSWER)),
    ];
    let manifests = ManifestDir::new(&sandbox);
    a.nodes(&manifests);
    let ports = |port: u16| {
        format!("[{{name: dns, port: 53, targetPort: 53, nodePort: {port}, protocol: UDP}}]")
    };
    manifests.write(
        "dns.yaml",
        &format!(
            "{}---\n{}---\n{}---\n{}",
            a.service("local", 53, &ports(30053), "  type: NodePort", false),
            a.slice("local-1", "local", ("dns", 53, "UDP"), &[a.pod1_endpoint()]),
            a.service("remote", 54, &ports(30054), "  type: NodePort", false),
            a.slice(
                "remote-1",
                "remote",
                ("dns", 53, "UDP"),
                &[a.pod2_endpoint()]
            ),
        ),
    );
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);

    for (backend, port) in [("local", 30053), ("remote", 30054)] {
        let dig = lan.client.output(
            "dig",
            &[
                &format!("@{}", a.node1),
                "-p",
                &port.to_string(),
                "who.test",
                "+short",
                "+tries=1",
                "+time=3",
            ],
        );
        let answer = String::from_utf8_lossy(&dig.stdout);
        assert_eq!(
            answer.trim(),
            ANSWER.to_string(),
            "dig through the NodePort to the {backend} backend: {dig:?}"
        );
        let flows = client_flows(&sandbox, &a, port);
        assert_eq!(
            flows.len(),
            2,
            "{backend} backend: the query's flow has its two entries: {flows:#?}"
        );
        assert!(
            flows.iter().all(|flow| flow.confirmed),
            "{backend} backend: one answer confirms a UDP flow (both entries in the main \
             table): {flows:#?}"
        );
    }
}

/// The conntrack entries of the client's flows to the NodePort `port`, both directions.
fn client_flows(sandbox: &Sandbox, a: &Addresses, port: u16) -> Vec<inspect::ConntrackState> {
    let client: IpAddr = a.client.parse().expect("client address");
    inspect::inspect(&sandbox.pin_dir, None)
        .expect("inspect")
        .conntrack
        .into_iter()
        .filter(|flow| {
            (flow.from.ip() == client && flow.to.port() == port)
                || (flow.rewritten_to.ip() == client && flow.rewritten_from.port() == port)
        })
        .collect()
}
