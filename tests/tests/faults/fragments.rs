//! A UDP datagram larger than the MTU reaches a NodePort, a LoadBalancer IP or an
//! externalIP as IP fragments: the first carries the ports, the later ones follow it
//! through the fragment map. It arrives whole at a backend on this node and at one on
//! another node (SNAT), and the backend's answer, as large and fragmented too, returns
//! whole.
use std::{
    net::{SocketAddrV4, UdpSocket},
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
    lan::{
        CLIENT, EXTERNAL_IP, LB_IP, NODE1, POD1, POD1_ENDPOINT, POD2, POD2_ENDPOINT,
        cni_netfilter_rules, counters, lan, nodes, service, slice,
    },
    netns::Netns,
};

/// Larger than the 1,500-byte MTU of every link: three fragments.
const DATAGRAM: usize = 4_000;

#[test]
fn a_fragmented_datagram_reaches_local_and_remote_backends_whole_and_its_answer_returns() {
    fragmented_datagrams("fragments", "g", false);
}

/// With a CNI's rules, netfilter conntrack reassembles the datagram to a local backend after
/// the TC program (which rewrote every fragment alike) and fragments it again on its way
/// to the pod; the pod's answer is reassembled and fragmented again on its way out, where
/// the egress program meets its fragments.
#[test]
fn with_a_cni_s_netfilter_rules_a_fragmented_datagram_still_gets_through_both_ways() {
    fragmented_datagrams("fragments-cni", "h", true);
}

fn fragmented_datagrams(test: &str, tag: &str, cni: bool) {
    let sandbox = Sandbox::new(test);
    let lan = lan(tag);
    if cni {
        cni_netfilter_rules(socklb_tests::family::Family::V4);
    }
    let _echoes = [
        UdpEcho::start(&lan.pod1, SocketAddrV4::new(POD1, 5353)),
        UdpEcho::start(&lan.pod2, SocketAddrV4::new(POD2, 5353)),
    ];
    let manifests = ManifestDir::new(&sandbox);
    nodes(&manifests);
    // (Service, its endpoint, port, NodePort): each reached through its NodePort, the
    // LoadBalancer IP and the externalIP.
    let services = [
        ("local", POD1_ENDPOINT, 53, 30061),
        ("remote", POD2_ENDPOINT, 54, 30062),
    ];
    for (i, (name, endpoint, port, node_port)) in services.iter().enumerate() {
        manifests.write(
            &format!("{name}.yaml"),
            &format!(
                "{}---\n{}",
                service(
                    name,
                    &format!("10.96.0.{}", 130 + i),
                    &format!(
                        "[{{name: dns, port: {port}, targetPort: 5353, nodePort: {node_port}, protocol: UDP}}]"
                    ),
                    &format!("  type: LoadBalancer\n  externalIPs: [{EXTERNAL_IP}]"),
                    Some(LB_IP)
                ),
                slice(&format!("{name}-1"), name, ("dns", 5353, "UDP"), &[*endpoint])
            ),
        );
    }
    let agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);

    let frontends = services.iter().flat_map(|(name, _, port, node_port)| {
        [
            (name, format!("{NODE1}:{node_port}")),
            (name, format!("{LB_IP}:{port}")),
            (name, format!("{EXTERNAL_IP}:{port}")),
        ]
    });
    for (name, frontend) in frontends {
        let socket = lan.client.enter(|| {
            let socket = UdpSocket::bind((CLIENT, 0)).expect("bind the client");
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
    let shown = inspect::inspect(&sandbox.pin_dir, None).expect("inspect");
    assert!(
        shown.fragments > 0,
        "inspect counts the datagrams whose fragments were followed"
    );
}

/// A UDP server in `netns` that sends every datagram back as it came; stops when dropped.
struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEcho {
    fn start(netns: &Netns, addr: SocketAddrV4) -> Self {
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
