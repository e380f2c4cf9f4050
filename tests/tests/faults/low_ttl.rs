//! A packet from outside with a TTL of 1 cannot be forwarded to a backend: it is dropped
//! (counted as `ttl_exceeded`) before it takes a conntrack entry or a SNAT port, so that
//! such packets cannot use up the SNAT range.
use std::{
    net::{SocketAddrV4, UdpSocket},
    time::{Duration, Instant},
};

use socklb_agent::inspect;
use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox,
    lan::{CLIENT, NODE1, POD2, POD2_ENDPOINT, counters, lan, nodes, service, slice},
};

#[test]
fn a_packet_with_ttl_1_takes_no_conntrack_entry_and_is_counted() {
    let sandbox = Sandbox::new("low-ttl");
    let lan = lan("t");
    let _server = NamedServer::udp_in(&lan.pod2, "pod2", SocketAddrV4::new(POD2, 5353));
    let manifests = ManifestDir::new(&sandbox);
    nodes(&manifests);
    manifests.write(
        "dns.yaml",
        &format!(
            "{}---\n{}",
            service(
                "dns",
                "10.96.0.95",
                "[{name: dns, port: 53, targetPort: 5353, nodePort: 30053, protocol: UDP}]",
                "  type: NodePort",
                None
            ),
            slice("dns-1", "dns", ("dns", 5353, "UDP"), &[POD2_ENDPOINT])
        ),
    );
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);

    let socket = lan.client.enter(|| {
        let socket = UdpSocket::bind((CLIENT, 40200)).expect("bind the client");
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        socket
    });
    let client_flows = || {
        inspect::inspect(&sandbox.pin_dir, None)
            .expect("inspect")
            .conntrack
            .into_iter()
            .filter(|c| c.from.to_string() == format!("{CLIENT}:40200"))
            .collect::<Vec<_>>()
    };

    let before = counters(&sandbox);
    socket.set_ttl(1).expect("IP_TTL");
    socket.send_to(b"ping", (NODE1, 30053)).expect("send");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let flows = client_flows();
        assert!(
            flows.is_empty(),
            "the TTL-1 datagram made a conntrack entry: {flows:?}"
        );
        if counters(&sandbox).ttl_exceeded > before.ttl_exceeded {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the TTL-1 datagram was not counted: {:?}",
            counters(&sandbox)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Counted, and still no entry.
    assert!(client_flows().is_empty());

    // The same flow with a usable TTL is translated, both ways.
    socket.set_ttl(64).expect("IP_TTL");
    socket.send_to(b"ping", (NODE1, 30053)).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = socket.recv_from(&mut buffer).expect("an answer");
    assert_eq!(from.to_string(), format!("{NODE1}:30053"));
    assert!(buffer[..len].starts_with(b"pod2 "));
    assert_eq!(client_flows().len(), 1, "the flow's forward entry");
    assert_eq!(counters(&sandbox).errors, 0);
}
