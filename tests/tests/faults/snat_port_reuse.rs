//! A SNAT port goes to a new flow only once the flow holding it is over, and then it is the
//! new flow's alone: the old flow's client coming back must not take it over.
//!
//! The SNAT range is a single port, so that every flow draws the same one, and the UDP
//! timeout is 3 s instead of 60 s, to keep the tests short.
use std::{
    net::{SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use socklb_agent::inspect;
use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox,
    family::Family,
    lan::{Addresses, addresses, counters, lan},
    netns::Netns,
};

const NODE_PORT: u16 = 30054;
const SNAT_PORT: u16 = 61000;
const UDP_TIMEOUT_S: u32 = 3;

#[test]
fn a_client_back_after_its_flow_expired_leaves_the_port_to_the_flow_that_took_it_over_ipv4() {
    a_client_back_after_its_flow_expired_leaves_the_port_to_the_flow_that_took_it(Family::V4);
}

#[test]
fn a_client_back_after_its_flow_expired_leaves_the_port_to_the_flow_that_took_it_over_ipv6() {
    a_client_back_after_its_flow_expired_leaves_the_port_to_the_flow_that_took_it(Family::V6);
}

fn a_client_back_after_its_flow_expired_leaves_the_port_to_the_flow_that_took_it(family: Family) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("port-reuse{}", family.tag()));
    let lan = lan(&format!("p{}", family.tag()));
    let _server = NamedServer::udp_in(&lan.pod2, "pod2", SocketAddr::new(a.pod2, 5353));
    let (agent, _manifests) = start(&sandbox, &a);
    let (old, new) = lan.client.enter(|| (client(&a, 40300), client(&a, 40301)));
    let answer = format!("pod2 {}", Addresses::at(a.node1, SNAT_PORT));

    assert_eq!(
        ask(&a, &old).as_deref(),
        Some(answer.as_str()),
        "the first flow"
    );
    wait_until_idle(&sandbox, &a, 40300);
    // The old flow's entries expired: a new flow takes its port.
    assert_eq!(
        ask(&a, &new).as_deref(),
        Some(answer.as_str()),
        "the new flow"
    );

    // The old client comes back: the port is the new flow's, so it is refused.
    let before = counters(&sandbox);
    old.send_to(b"ping", node_port(&a)).expect("send");
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters(&sandbox).snat_exhausted == before.snat_exhausted
        && flows_of(&sandbox, &a, 40300).is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the old client's datagram did not reach socklb: {:?}",
            counters(&sandbox)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        ask(&a, &new).as_deref(),
        Some(answer.as_str()),
        "the flow that took the port must keep it when the old client comes back: {:?}\n{}",
        flows_of(&sandbox, &a, 40301),
        agent.log()
    );
    assert!(
        counters(&sandbox).snat_exhausted > before.snat_exhausted,
        "the old client found the only port taken: {:?}",
        counters(&sandbox)
    );
    assert!(flows_of(&sandbox, &a, 40300).is_empty());
    assert_eq!(counters(&sandbox).errors, 0);
}

#[test]
fn a_server_streaming_to_a_silent_client_keeps_the_flow_s_snat_port_over_ipv4() {
    a_server_streaming_to_a_silent_client_keeps_the_flow_s_snat_port(Family::V4);
}

#[test]
fn a_server_streaming_to_a_silent_client_keeps_the_flow_s_snat_port_over_ipv6() {
    a_server_streaming_to_a_silent_client_keeps_the_flow_s_snat_port(Family::V6);
}

/// A UDP flow whose client sent once and whose server streams to it stays unconfirmed; its
/// port is held while the server sends, however long the client is silent.
fn a_server_streaming_to_a_silent_client_keeps_the_flow_s_snat_port(family: Family) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("port-stream{}", family.tag()));
    let lan = lan(&format!("q{}", family.tag()));
    let _streamer = Streamer::start(&lan.pod2, SocketAddr::new(a.pod2, 5353));
    let (agent, _manifests) = start(&sandbox, &a);
    let (subscriber, other) = lan.client.enter(|| (client(&a, 40310), client(&a, 40311)));

    subscriber
        .send_to(b"subscribe", node_port(&a))
        .expect("send");
    let tick = |socket: &UdpSocket| {
        let mut buffer = [0u8; 64];
        socket
            .recv_from(&mut buffer)
            .map(|(len, from)| (String::from_utf8_lossy(&buffer[..len]).into_owned(), from))
    };
    let (text, from) = tick(&subscriber).expect("the stream starts");
    assert_eq!((text.as_str(), from.to_string()), ("tick", node_port(&a)));
    // The client is silent past the UDP timeout while the stream goes on.
    wait_until_forward_idle(&sandbox, &a, 40310);

    // Another flow draws the only port: it is refused, the stream stays with its client.
    let before = counters(&sandbox);
    other.send_to(b"subscribe", node_port(&a)).expect("send");
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters(&sandbox).snat_exhausted == before.snat_exhausted {
        assert!(
            Instant::now() < deadline,
            "the port of a flow whose server still streams went to another flow: {:?} {:?}\n{}",
            counters(&sandbox),
            flows_of(&sandbox, &a, 40311),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // What arrived before the refusal aside, the stream still reaches its client.
    subscriber.set_nonblocking(true).expect("nonblocking");
    while tick(&subscriber).is_ok() {}
    subscriber.set_nonblocking(false).expect("blocking");
    let (text, _) = tick(&subscriber).expect("the stream still reaches its client");
    assert_eq!(text, "tick");
    assert!(flows_of(&sandbox, &a, 40311).is_empty());
    assert_eq!(counters(&sandbox).errors, 0);
}

/// The agent on node1 with a NodePort whose only backend is pod2 (on node2: SNAT), and its
/// manifests.
fn start(sandbox: &Sandbox, a: &Addresses) -> (Agent, ManifestDir) {
    let manifests = ManifestDir::new(sandbox);
    a.nodes(&manifests);
    manifests.write(
        "dns.yaml",
        &format!(
            "{}---\n{}",
            a.service(
                "dns",
                96,
                &format!(
                    "[{{name: dns, port: 53, targetPort: 5353, nodePort: {NODE_PORT}, protocol: UDP}}]"
                ),
                "  type: NodePort",
                false
            ),
            a.slice("dns-1", "dns", ("dns", 5353, "UDP"), &[a.pod2_endpoint()])
        ),
    );
    let range = format!("{SNAT_PORT}-{SNAT_PORT}");
    let timeout = format!("{UDP_TIMEOUT_S}s");
    let agent = Agent::start(
        sandbox,
        &manifests.path,
        "node1",
        &[
            "--snat-port-range",
            &range,
            "--conntrack-udp-timeout",
            &timeout,
        ],
    );
    (agent, manifests)
}

/// The NodePort on node1.
fn node_port(a: &Addresses) -> String {
    Addresses::at(a.node1, NODE_PORT)
}

/// A client socket on `port`, in the calling thread's namespace.
fn client(a: &Addresses, port: u16) -> UdpSocket {
    let socket = UdpSocket::bind(Addresses::at(a.client, port)).expect("bind the client");
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    socket
}

/// The answer to a datagram through the NodePort, which must come from the NodePort;
/// `None` if none came.
fn ask(a: &Addresses, socket: &UdpSocket) -> Option<String> {
    socket.send_to(b"ping", node_port(a)).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = socket.recv_from(&mut buffer).ok()?;
    assert_eq!(from.to_string(), node_port(a));
    Some(String::from_utf8_lossy(&buffer[..len]).into_owned())
}

/// The conntrack entries of the client on `port`, both directions.
fn flows_of(sandbox: &Sandbox, a: &Addresses, port: u16) -> Vec<inspect::ConntrackState> {
    let client = Addresses::at(a.client, port);
    inspect::inspect(&sandbox.pin_dir, None)
        .expect("inspect")
        .conntrack
        .into_iter()
        .filter(|c| c.from.to_string() == client || c.rewritten_to.to_string() == client)
        .collect()
}

/// Until every entry of the client on `port` has been idle past the UDP timeout (with a
/// second to spare: the programs count whole seconds of a coarser clock).
fn wait_until_idle(sandbox: &Sandbox, a: &Addresses, port: u16) {
    wait_until(sandbox, a, port, |_| true);
}

/// Until the forward entry of the client on `port` has been idle past the UDP timeout.
fn wait_until_forward_idle(sandbox: &Sandbox, a: &Addresses, port: u16) {
    wait_until(sandbox, a, port, |c| c.direction == "forward");
}

/// Until the entries of the client on `port` that `which` picks (one at least) have been
/// idle past the UDP timeout.
fn wait_until(
    sandbox: &Sandbox,
    a: &Addresses,
    port: u16,
    which: impl Fn(&inspect::ConntrackState) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let flows = flows_of(sandbox, a, port);
        let picked: Vec<_> = flows.iter().filter(|c| which(c)).collect();
        assert!(
            !picked.is_empty(),
            "no such entry of the client on {port}: {flows:?}"
        );
        if picked.iter().all(|c| c.idle_seconds > UDP_TIMEOUT_S + 1) {
            return;
        }
        assert!(Instant::now() < deadline, "still not idle: {flows:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A UDP server in `netns` that sends "tick" every 100 ms to every peer that sent it a
/// datagram (a subscription), until dropped.
struct Streamer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Streamer {
    fn start(netns: &Netns, addr: SocketAddr) -> Self {
        let socket = netns.enter(|| {
            UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {}: {e}", netns.name))
        });
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peers = Vec::new();
            let mut buffer = [0u8; 64];
            while !stopping.load(Ordering::Relaxed) {
                if let Ok((_, from)) = socket.recv_from(&mut buffer)
                    && !peers.contains(&from)
                {
                    peers.push(from);
                }
                for peer in &peers {
                    let _ = socket.send_to(b"tick", peer);
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
