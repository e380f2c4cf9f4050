//! A UDP datagram larger than the MTU reaches a NodePort, a LoadBalancer IP or an
//! externalIP as IP fragments: the first carries the ports, the later ones follow it
//! through the fragment map. It arrives whole at a backend on this node and at one on
//! another node (SNAT), and the backend's answer, as large and fragmented too, returns
//! whole.
use std::{net::SocketAddr, time::Duration};

use socklb_agent::inspect;
use socklb_tests::{
    ServerThread,
    family::Family,
    interrupted::uninterrupted,
    lan::{Addresses, LanNode, cni_netfilter_rules},
    netns::Netns,
};

/// Larger than the 1,500-byte MTU of every link: three fragments.
const DATAGRAM: usize = 4_000;

socklb_tests::for_each_family!(
    a_fragmented_datagram_reaches_local_and_remote_backends_whole_and_its_answer_returns,
    with_a_cni_s_netfilter_rules_a_fragmented_datagram_still_gets_through_both_ways,
);

/// IPv6 fragments carry a Fragment header (the sender fragments; routers never do): the
/// first one's ports are kept under its 32-bit identification.
fn a_fragmented_datagram_reaches_local_and_remote_backends_whole_and_its_answer_returns(
    family: Family,
) {
    fragmented_datagrams(family, "g", false);
}

/// With a CNI's rules, netfilter conntrack reassembles the datagram to a local backend after
/// the TC program (which rewrote every fragment alike) and fragments it again on its way
/// to the pod; the pod's answer is reassembled and fragmented again on its way out, where
/// the egress program meets its fragments.
fn with_a_cni_s_netfilter_rules_a_fragmented_datagram_still_gets_through_both_ways(family: Family) {
    fragmented_datagrams(family, "fc", true);
}

fn fragmented_datagrams(family: Family, tag: &str, cni: bool) {
    let test = if cni { "fragments-cni" } else { "fragments" };
    let node = LanNode::new(family, test, tag);
    let LanNode {
        a, lan, sandbox, ..
    } = &node;
    if cni {
        cni_netfilter_rules(family);
    }
    let _echoes = [
        UdpEcho::start(&lan.pod1, SocketAddr::new(a.pod1, 5353)),
        UdpEcho::start(&lan.pod2, SocketAddr::new(a.pod2, 5353)),
    ];
    // (Service, its endpoint, port, NodePort): each reached through its NodePort, the
    // LoadBalancer IP and the externalIP.
    let services = [
        ("local", a.pod1_endpoint(), 53, 30061),
        ("remote", a.pod2_endpoint(), 54, 30062),
    ];
    for (i, (name, endpoint, port, node_port)) in services.iter().enumerate() {
        node.write(
            &format!("{name}.yaml"),
            &a.exposed(name, 130 + i as u8)
                .port("dns", *port, 5353, *node_port, "UDP")
                .load_balancer()
                .external_ips(&[a.external_ip])
                .endpoints(std::slice::from_ref(endpoint))
                .yaml(),
        );
    }
    let agent = node.agent(&[]);

    let frontends = services.iter().flat_map(|(name, _, port, node_port)| {
        [
            (name, Addresses::at(a.node1, *node_port)),
            (name, Addresses::at(a.lb_ip, *port)),
            (name, Addresses::at(a.external_ip, *port)),
        ]
    });
    for (name, frontend) in frontends {
        let socket = node.udp_client(0);
        let datagram: Vec<u8> = (0..DATAGRAM).map(|i| (i % 251) as u8).collect();
        socket
            .send_to(&datagram, frontend.as_str())
            .expect("send the datagram");
        let mut buffer = vec![0u8; 65_536];
        let (len, from) = uninterrupted(|| socket.recv_from(&mut buffer)).unwrap_or_else(|e| {
            panic!(
                "{name} backend through {frontend}: no answer to a {DATAGRAM}-byte datagram: \
                 {e}; {:?}\n{}",
                node.counters(),
                agent.log()
            )
        });
        assert_eq!(from.to_string(), frontend, "{name}");
        assert_eq!(len, DATAGRAM, "{name}: the answer arrived whole");
        assert!(
            buffer[..len] == datagram[..],
            "{name}: the backend got the datagram whole and echoed it"
        );
    }
    assert_eq!(node.counters().errors, 0);
    // inspect reads the IPv4 fragment map (socklb_frag6_v1: bpftool).
    if family == Family::V4 {
        let shown = inspect::inspect(&sandbox.pin_dir, None).expect("inspect");
        assert!(
            shown.fragments > 0,
            "inspect counts the datagrams whose fragments were followed"
        );
    }
}

/// A UDP server in `netns` that sends every datagram back as it came; stops when dropped.
struct UdpEcho;

impl UdpEcho {
    fn start(netns: &Netns, addr: SocketAddr) -> ServerThread {
        let socket = netns.udp_socket(addr, Duration::from_millis(50));
        let mut buffer = vec![0u8; 65_536];
        ServerThread::run(move || {
            if let Ok((len, from)) = socket.recv_from(&mut buffer) {
                let _ = socket.send_to(&buffer[..len], from);
            }
        })
    }
}
