//! UDP flows from outside are confirmed by their backend's first answer: a DNS query and
//! its response through a NodePort (real dig against real dnsmasq) leave the flow in the
//! main conntrack table, not in the table of unconfirmed flows where TCP handshakes wait;
//! and a handshake waiting there outlives twenty times that table's size in answered UDP
//! flows (which, unconfirmed, evicted it: the test fails without the confirmation).
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket},
    time::Duration,
};

use socklb_agent::inspect;
use socklb_tests::{
    Dnsmasq, NamedServer, Sandbox, eventually,
    family::Family,
    forged::{self, Flags},
    interrupted::uninterrupted,
    lan::{Addresses, LanNode},
};

/// What dnsmasq answers for `who.test`.
const ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 53);

socklb_tests::for_each_family!(a_dns_answer_through_a_node_port_confirms_the_flow);

fn a_dns_answer_through_a_node_port_confirms_the_flow(family: Family) {
    let node = LanNode::new(family, "udpconfirm", "dq");
    let LanNode {
        a, lan, sandbox, ..
    } = &node;
    let _servers = [
        lan.pod1.enter(|| Dnsmasq::start(a.pod1, ANSWER)),
        lan.pod2.enter(|| Dnsmasq::start(a.pod2, ANSWER)),
    ];
    node.local_and_remote("dns.yaml", 53, ("dns", 53, 53, "UDP"), 30053);
    let _agent = node.agent(&[]);

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
        let flows = client_flows(sandbox, a, port);
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

/// A TCP handshake waiting for its ACK (a client on a slow path) keeps its unconfirmed
/// entry while many times the unconfirmed table's size in UDP request/response flows pass:
/// each is confirmed by its answer and leaves that table, so none evicts the handshake.
#[test]
fn answered_udp_flows_leave_a_waiting_tcp_handshake_alone() {
    const NEW_TABLE: usize = 16;
    const UDP_FLOWS: usize = 20 * NEW_TABLE;
    let node = LanNode::new(Family::V4, "udphandshake", "dh");
    let LanNode {
        a, lan, sandbox, ..
    } = &node;
    let pod1: IpAddr = a.pod1;
    let _tcp = NamedServer::tcp_in(&lan.pod1, "web", SocketAddr::new(pod1, 8080));
    let _udp = NamedServer::udp_in(&lan.pod1, "echo", SocketAddr::new(pod1, 5353));
    let services = [
        a.exposed("web", 80).port("web", 80, 8080, 30080, "TCP"),
        a.exposed("echo", 53).port("echo", 53, 5353, 30053, "UDP"),
    ]
    .map(|service| service.endpoints(&[a.pod1_endpoint()]).yaml());
    node.write("services.yaml", &services.join("---\n"));
    let _agent = node.agent(&["--max-conntrack-new-entries", &NEW_TABLE.to_string()]);
    let node1: IpAddr = a.node1.parse().expect("node1");

    // The SYN of a client whose ACK is long in coming: from an address on the LAN that no
    // host holds, so that no RST answers the SYN-ACK and the handshake just waits.
    let waiting = SocketAddr::new("10.77.0.13".parse().expect("address"), 40_000);
    lan.client
        .enter(|| forged::send(waiting, SocketAddr::new(node1, 30080), 1, Flags::Syn));
    let handshake = |sandbox: &Sandbox| {
        inspect::inspect(&sandbox.pin_dir, None)
            .expect("inspect")
            .conntrack
            .into_iter()
            .filter(|flow| flow.from == waiting || flow.rewritten_to == waiting)
            .count()
    };
    eventually(
        "the SYN makes a flow",
        Duration::from_secs(10),
        || match handshake(sandbox) {
            0 => Err("no entry".to_owned()),
            _ => Ok(()),
        },
    );

    let answered = lan.client.enter(|| {
        (0..UDP_FLOWS)
            .filter(|_| {
                let socket = UdpSocket::bind("0.0.0.0:0").expect("bind");
                socket
                    .set_read_timeout(Some(Duration::from_secs(2)))
                    .expect("timeout");
                socket
                    .send_to(b"ping", SocketAddr::new(node1, 30053))
                    .expect("send");
                uninterrupted(|| socket.recv(&mut [0; 64])).is_ok()
            })
            .count()
    });
    assert_eq!(answered, UDP_FLOWS, "every UDP request is answered");
    assert_eq!(
        handshake(sandbox),
        2,
        "the waiting handshake keeps both its entries after {UDP_FLOWS} answered UDP flows \
         through a table of {NEW_TABLE} unconfirmed flows"
    );
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
