//! A SNAT port goes to a new flow only once the flow holding it is over, and then it is the
//! new flow's alone: the old flow's client coming back must not take it over.
//!
//! The SNAT range is a single port, so that every flow draws the same one, and the UDP
//! timeout is 3 s instead of 60 s, to keep the tests short.
use std::{
    net::{SocketAddrV4, UdpSocket},
    time::{Duration, Instant},
};

use socklb_agent::inspect;
use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox,
    lan::{CLIENT, NODE1, POD2, POD2_ENDPOINT, counters, lan, nodes, service, slice},
};

const NODE_PORT: u16 = 30054;
const SNAT_PORT: u16 = 61000;
const UDP_TIMEOUT_S: u32 = 3;

#[test]
fn a_client_back_after_its_flow_expired_leaves_the_port_to_the_flow_that_took_it() {
    let sandbox = Sandbox::new("port-reuse");
    let lan = lan("p");
    let _server = NamedServer::udp_in(&lan.pod2, "pod2", SocketAddrV4::new(POD2, 5353));
    let (agent, _manifests) = start(&sandbox);
    let (old, new) = lan.client.enter(|| (client(40300), client(40301)));
    let answer = format!("pod2 {NODE1}:{SNAT_PORT}");

    assert_eq!(
        ask(&old).as_deref(),
        Some(answer.as_str()),
        "the first flow"
    );
    wait_until_idle(&sandbox, 40300);
    // The old flow's entries expired: a new flow takes its port.
    assert_eq!(ask(&new).as_deref(), Some(answer.as_str()), "the new flow");

    // The old client comes back: the port is the new flow's, so it is refused.
    let before = counters(&sandbox);
    old.send_to(b"ping", (NODE1, NODE_PORT)).expect("send");
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters(&sandbox).snat_exhausted == before.snat_exhausted
        && flows_of(&sandbox, 40300).is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the old client's datagram did not reach socklb: {:?}",
            counters(&sandbox)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        ask(&new).as_deref(),
        Some(answer.as_str()),
        "the flow that took the port must keep it when the old client comes back: {:?}\n{}",
        flows_of(&sandbox, 40301),
        agent.log()
    );
    assert!(
        counters(&sandbox).snat_exhausted > before.snat_exhausted,
        "the old client found the only port taken: {:?}",
        counters(&sandbox)
    );
    assert!(flows_of(&sandbox, 40300).is_empty());
    assert_eq!(counters(&sandbox).errors, 0);
}

/// The agent on node1 with a NodePort whose only backend is pod2 (on node2: SNAT), and its
/// manifests.
fn start(sandbox: &Sandbox) -> (Agent, ManifestDir) {
    let manifests = ManifestDir::new(sandbox);
    nodes(&manifests);
    manifests.write(
        "dns.yaml",
        &format!(
            "{}---\n{}",
            service(
                "dns",
                "10.96.0.96",
                &format!(
                    "[{{name: dns, port: 53, targetPort: 5353, nodePort: {NODE_PORT}, protocol: UDP}}]"
                ),
                "  type: NodePort",
                None
            ),
            slice("dns-1", "dns", ("dns", 5353, "UDP"), &[POD2_ENDPOINT])
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

/// A client socket on `port`, in the calling thread's namespace.
fn client(port: u16) -> UdpSocket {
    let socket = UdpSocket::bind((CLIENT, port)).expect("bind the client");
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    socket
}

/// The answer to a datagram through the NodePort, which must come from the NodePort;
/// `None` if none came.
fn ask(socket: &UdpSocket) -> Option<String> {
    socket.send_to(b"ping", (NODE1, NODE_PORT)).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = socket.recv_from(&mut buffer).ok()?;
    assert_eq!(from.to_string(), format!("{NODE1}:{NODE_PORT}"));
    Some(String::from_utf8_lossy(&buffer[..len]).into_owned())
}

/// The conntrack entries of the client on `port`, both directions.
fn flows_of(sandbox: &Sandbox, port: u16) -> Vec<inspect::ConntrackState> {
    let client = format!("{CLIENT}:{port}");
    inspect::inspect(&sandbox.pin_dir, None)
        .expect("inspect")
        .conntrack
        .into_iter()
        .filter(|c| c.from.to_string() == client || c.rewritten_to.to_string() == client)
        .collect()
}

/// Until every entry of the client on `port` has been idle past the UDP timeout (with a
/// second to spare: the programs count whole seconds of a coarser clock).
fn wait_until_idle(sandbox: &Sandbox, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let flows = flows_of(sandbox, port);
        assert!(!flows.is_empty(), "no entries for the client on {port}");
        if flows.iter().all(|c| c.idle_seconds > UDP_TIMEOUT_S + 1) {
            return;
        }
        assert!(Instant::now() < deadline, "still not idle: {flows:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
