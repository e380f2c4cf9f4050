//! A UDP datagram larger than the MTU reaches a NodePort, a LoadBalancer IP or an
//! externalIP as IP fragments: the first carries the ports, the later ones follow it
//! through the fragment map. It arrives whole at a backend on this node and at one on
//! another node (SNAT), and the backend's answer, as large and fragmented too, returns
//! whole.
use std::{
    net::{IpAddr, SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use socklb_agent::inspect;
use socklb_tests::{
    Agent, ManifestDir, Sandbox,
    family::Family,
    lan::{Addresses, addresses, cni_netfilter_rules, counters, lan},
    netns::Netns,
};

/// Larger than the 1,500-byte MTU of every link: three fragments.
const DATAGRAM: usize = 4_000;

#[test]
fn a_fragmented_datagram_reaches_local_and_remote_backends_whole_and_its_answer_returns() {
    fragmented_datagrams(Family::V4, "g", false);
}

/// IPv6 fragments carry a Fragment header (the sender fragments; routers never do): the
/// first one's ports are kept under its 32-bit identification.
#[test]
fn a_fragmented_ipv6_datagram_reaches_local_and_remote_backends_whole_and_its_answer_returns() {
    fragmented_datagrams(Family::V6, "g", false);
}

/// With a CNI's rules, netfilter conntrack reassembles the datagram to a local backend after
/// the TC program (which rewrote every fragment alike) and fragments it again on its way
/// to the pod; the pod's answer is reassembled and fragmented again on its way out, where
/// the egress program meets its fragments.
#[test]
fn with_a_cni_s_netfilter_rules_a_fragmented_datagram_still_gets_through_both_ways() {
    fragmented_datagrams(Family::V4, "h", true);
}

#[test]
fn with_a_cni_s_netfilter_rules_a_fragmented_ipv6_datagram_still_gets_through_both_ways() {
    fragmented_datagrams(Family::V6, "h", true);
}

fn fragmented_datagrams(family: Family, tag: &str, cni: bool) {
    let a = addresses(family);
    let test = if cni { "fragments-cni" } else { "fragments" };
    let sandbox = Sandbox::new(&format!("{test}{}", family.tag()));
    let lan = lan(&format!("{tag}{}", family.tag()));
    if cni {
        cni_netfilter_rules(family);
    }
    let _echoes = [
        UdpEcho::start(&lan.pod1, SocketAddr::new(a.pod1, 5353)),
        UdpEcho::start(&lan.pod2, SocketAddr::new(a.pod2, 5353)),
    ];
    let manifests = ManifestDir::new(&sandbox);
    a.nodes(&manifests);
    // (Service, its endpoint, port, NodePort): each reached through its NodePort, the
    // LoadBalancer IP and the externalIP.
    let services = [
        ("local", a.pod1_endpoint(), 53, 30061),
        ("remote", a.pod2_endpoint(), 54, 30062),
    ];
    for (i, (name, endpoint, port, node_port)) in services.iter().enumerate() {
        manifests.write(
            &format!("{name}.yaml"),
            &format!(
                "{}---\n{}",
                a.service(
                    name,
                    130 + i as u8,
                    &format!(
                        "[{{name: dns, port: {port}, targetPort: 5353, nodePort: {node_port}, protocol: UDP}}]"
                    ),
                    &format!("  type: LoadBalancer\n  externalIPs: [\"{}\"]", a.external_ip),
                    true
                ),
                a.slice(
                    &format!("{name}-1"),
                    name,
                    ("dns", 5353, "UDP"),
                    std::slice::from_ref(endpoint)
                )
            ),
        );
    }
    let agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);

    let frontends = services.iter().flat_map(|(name, _, port, node_port)| {
        [
            (name, Addresses::at(a.node1, *node_port)),
            (name, Addresses::at(a.lb_ip, *port)),
            (name, Addresses::at(a.external_ip, *port)),
        ]
    });
    let client: IpAddr = a.client.parse().expect("address");
    for (name, frontend) in frontends {
        let socket = lan.client.enter(|| {
            let socket = UdpSocket::bind((client, 0)).expect("bind the client");
            socket
                .set_read_timeout(Some(Duration::from_secs(3)))
                .expect("timeout");
            socket
        });
        let datagram: Vec<u8> = (0..DATAGRAM).map(|i| (i % 251) as u8).collect();
        socket
            .send_to(&datagram, frontend.as_str())
            .expect("send the datagram");
        let mut buffer = vec![0u8; 65_536];
        let (len, from) = socket.recv_from(&mut buffer).unwrap_or_else(|e| {
            panic!(
                "{name} backend through {frontend}: no answer to a {DATAGRAM}-byte datagram: \
                 {e}; {:?}\n{}",
                counters(&sandbox),
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
    assert_eq!(counters(&sandbox).errors, 0);
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
struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEcho {
    fn start(netns: &Netns, addr: SocketAddr) -> Self {
        let socket = netns.enter(|| {
            UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {}: {e}", netns.name))
        });
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buffer = vec![0u8; 65_536];
            while !stopping.load(Ordering::Relaxed) {
                if let Ok((len, from)) = socket.recv_from(&mut buffer) {
                    let _ = socket.send_to(&buffer[..len], from);
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
