//! A SNAT port goes to a new flow only once the flow holding it is over, and then it is the
//! new flow's alone: the old flow's client coming back must not take it over.
//!
//! The SNAT range is a single port, so that every flow draws the same one, and the UDP
//! timeout is 3 s instead of 60 s, to keep the tests short. A flow that streams one way
//! keeps its port with the agent's conntrack GC on (every 3 s here): the GC removes an
//! entry only once both directions of its flow are past the timeout.
use std::{
    net::{SocketAddr, UdpSocket},
    time::Duration,
};

use socklb_agent::inspect;
use socklb_tests::{
    Agent, ServerThread, eventually,
    family::Family,
    interrupted::uninterrupted,
    lan::{Addresses, LanNode},
    netns::Netns,
};

const NODE_PORT: u16 = 30054;
const SNAT_PORT: u16 = 61000;
const UDP_TIMEOUT_S: u32 = 3;

socklb_tests::for_each_family!(
    a_client_back_after_its_flow_expired_leaves_the_port_to_the_flow_that_took_it,
    a_server_streaming_to_a_silent_client_keeps_the_flow_s_snat_port,
    a_client_streaming_to_a_silent_server_keeps_the_flow_s_snat_port,
);

fn a_client_back_after_its_flow_expired_leaves_the_port_to_the_flow_that_took_it(family: Family) {
    let node = LanNode::new(family, "port-reuse", "p");
    let a = &node.a;
    let _server = node.udp_server(2, 5353);
    // What is tested is the programs' own expiry: the conntrack GC would remove the old
    // flow's entries first.
    let agent = start(&node, &["--conntrack-gc-interval", "off"]);
    let (old, new) = (node.udp_client(40300), node.udp_client(40301));
    let answer = format!("pod2 {}", Addresses::at(a.node1, SNAT_PORT));

    assert_eq!(
        ask(a, &old).as_deref(),
        Some(answer.as_str()),
        "the first flow"
    );
    wait_until_idle(&node, 40300);
    // The old flow's entries expired: a new flow takes its port.
    assert_eq!(
        ask(a, &new).as_deref(),
        Some(answer.as_str()),
        "the new flow"
    );

    // The old client comes back: the port is the new flow's, so it is refused.
    let before = node.counters();
    old.send_to(b"ping", node_port(a)).expect("send");
    eventually(
        "the old client's datagram reaches socklb",
        Duration::from_secs(10),
        || {
            let now = node.counters();
            if now.snat_exhausted > before.snat_exhausted || !node.client_flows(40300).is_empty() {
                Ok(())
            } else {
                Err(format!("{now:?}"))
            }
        },
    );
    assert_eq!(
        ask(a, &new).as_deref(),
        Some(answer.as_str()),
        "the flow that took the port must keep it when the old client comes back: {:?}\n{}",
        node.client_flows(40301),
        agent.log()
    );
    assert!(
        node.counters().snat_exhausted > before.snat_exhausted,
        "the old client found the only port taken: {:?}",
        node.counters()
    );
    assert!(node.client_flows(40300).is_empty());
    assert_eq!(node.counters().errors, 0);
}

/// A UDP flow whose client sent once and whose server streams to it stays unconfirmed; its
/// port is held while the server sends, however long the client is silent.
fn a_server_streaming_to_a_silent_client_keeps_the_flow_s_snat_port(family: Family) {
    let node = LanNode::new(family, "port-stream", "q");
    let LanNode { a, lan, .. } = &node;
    let _streamer = Streamer::start(&lan.pod2, SocketAddr::new(a.pod2, 5353));
    let agent = start(&node, &[]);
    let (subscriber, other) = (node.udp_client(40310), node.udp_client(40311));

    subscriber
        .send_to(b"subscribe", node_port(a))
        .expect("send");
    let tick = |socket: &UdpSocket| {
        let mut buffer = [0u8; 64];
        uninterrupted(|| socket.recv_from(&mut buffer))
            .map(|(len, from)| (String::from_utf8_lossy(&buffer[..len]).into_owned(), from))
    };
    let (text, from) = tick(&subscriber).expect("the stream starts");
    assert_eq!((text.as_str(), from.to_string()), ("tick", node_port(a)));
    // The client is silent past the UDP timeout and a GC pass while the stream goes on.
    wait_until(&node, 40310, |c| c.direction == "forward", GC_PASSED_S);

    // Another flow draws the only port: it is refused, the stream stays with its client.
    assert_refused(
        &node,
        &agent,
        (&other, 40311),
        "the other flow is refused the port of a flow whose server still streams",
    );
    // What arrived before the refusal aside, the stream still reaches its client.
    subscriber.set_nonblocking(true).expect("nonblocking");
    while tick(&subscriber).is_ok() {}
    subscriber.set_nonblocking(false).expect("blocking");
    let (text, _) = tick(&subscriber).expect("the stream still reaches its client");
    assert_eq!(text, "tick");
    assert!(node.client_flows(40311).is_empty());
    assert_eq!(node.counters().errors, 0);
}

/// A client streaming to a server that never answers: the flow's reply entry is as old as
/// the flow, and it holds the SNAT port. The flow lives by its forward entry, so the port
/// stays its own past the UDP timeout and the GC passes after it.
fn a_client_streaming_to_a_silent_server_keeps_the_flow_s_snat_port(family: Family) {
    let node = LanNode::new(family, "port-upload", "r");
    let LanNode { a, lan, .. } = &node;
    let sink = lan
        .pod2
        .udp_socket(SocketAddr::new(a.pod2, 5353), Duration::from_millis(100));
    let _sink = ServerThread::run(move || {
        let _ = sink.recv_from(&mut [0u8; 64]);
    });
    let agent = start(&node, &[]);
    let (uploader, other) = (node.udp_client(40320), node.udp_client(40321));
    let target = node_port(a);
    let _upload = ServerThread::run(move || {
        let _ = uploader.send_to(b"data", &target);
        std::thread::sleep(Duration::from_millis(100));
    });
    eventually(
        "the upload's flow is made",
        Duration::from_secs(10),
        || match node.client_flows(40320) {
            flows if flows.len() == 2 => Ok(()),
            flows => Err(format!("{flows:?}")),
        },
    );
    wait_until(&node, 40320, |c| c.direction == "reply", GC_PASSED_S);

    // Another flow draws the only port: it is refused, the upload keeps it.
    assert_refused(
        &node,
        &agent,
        (&other, 40321),
        "the other flow is refused the port of a flow whose client still sends",
    );
    assert_eq!(
        node.client_flows(40320).len(),
        2,
        "the upload's two entries stay: {:?}",
        node.client_flows(40320)
    );
    assert!(node.client_flows(40321).is_empty());
    assert_eq!(node.counters().errors, 0);
}

/// Sends a datagram from `client` (bound to `port`) through the NodePort, whose only SNAT
/// port another flow holds: it must be refused (`snat_exhausted`).
fn assert_refused(node: &LanNode, agent: &Agent, (client, port): (&UdpSocket, u16), what: &str) {
    let before = node.counters();
    client.send_to(b"data", node_port(&node.a)).expect("send");
    eventually(what, Duration::from_secs(10), || match node.counters() {
        now if now.snat_exhausted > before.snat_exhausted => Ok(()),
        now => Err(format!(
            "{now:?} {:?}\n{}",
            node.client_flows(port),
            agent.log()
        )),
    });
}

/// How long an entry waits idle, in seconds, before the tests above look: past the UDP
/// timeout by more than the GC's margin of a second, and then one GC pass (the UDP
/// timeout apart, the shortest one here).
const GC_PASSED_S: u32 = 2 * UDP_TIMEOUT_S + 2;

/// The agent on node1 with a NodePort whose only backend is pod2 (on node2: SNAT), with
/// `extra` flags.
fn start(node: &LanNode, extra: &[&str]) -> Agent {
    node.expose_pod2("dns", 96, ("dns", 53, 5353, NODE_PORT, "UDP"));
    let range = format!("{SNAT_PORT}-{SNAT_PORT}");
    let timeout = format!("{UDP_TIMEOUT_S}s");
    let mut flags = vec![
        "--snat-port-range",
        &range,
        "--conntrack-udp-timeout",
        &timeout,
    ];
    flags.extend(extra);
    node.agent(&flags)
}

/// The NodePort on node1.
fn node_port(a: &Addresses) -> String {
    Addresses::at(a.node1, NODE_PORT)
}

/// The answer to a datagram through the NodePort, which must come from the NodePort;
/// `None` if none came.
fn ask(a: &Addresses, socket: &UdpSocket) -> Option<String> {
    socket.send_to(b"ping", node_port(a)).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = uninterrupted(|| socket.recv_from(&mut buffer)).ok()?;
    assert_eq!(from.to_string(), node_port(a));
    Some(String::from_utf8_lossy(&buffer[..len]).into_owned())
}

/// Until every entry of the client on `port` has been idle past the UDP timeout (with a
/// second to spare: the programs count whole seconds of a coarser clock).
fn wait_until_idle(node: &LanNode, port: u16) {
    wait_until(node, port, |_| true, UDP_TIMEOUT_S + 1);
}

/// Until the entries of the client on `port` that `which` picks (one at least) have been
/// idle for more than `idle_s` seconds; each must be there all along.
fn wait_until(
    node: &LanNode,
    port: u16,
    which: impl Fn(&inspect::ConntrackState) -> bool,
    idle_s: u32,
) {
    eventually("idle long enough", Duration::from_secs(30), || {
        let flows = node.client_flows(port);
        let picked: Vec<_> = flows.iter().filter(|c| which(c)).collect();
        assert!(
            !picked.is_empty(),
            "no such entry of the client on {port}: {flows:?}"
        );
        if picked.iter().all(|c| c.idle_seconds > idle_s) {
            Ok(())
        } else {
            Err(format!("{flows:?}"))
        }
    });
}

/// A UDP server in `netns` that sends "tick" every 100 ms to every peer that sent it a
/// datagram (a subscription), until dropped.
struct Streamer;

impl Streamer {
    fn start(netns: &Netns, addr: SocketAddr) -> ServerThread {
        let socket = netns.udp_socket(addr, Duration::from_millis(100));
        let mut peers = Vec::new();
        let mut buffer = [0u8; 64];
        ServerThread::run(move || {
            if let Ok((_, from)) = socket.recv_from(&mut buffer)
                && !peers.contains(&from)
            {
                peers.push(from);
            }
            for peer in &peers {
                let _ = socket.send_to(b"tick", peer);
            }
        })
    }
}
