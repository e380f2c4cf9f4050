//! A frontend whose Service has no endpoint refuses clients from outside at once, as
//! kube-proxy's REJECT does: a TCP client (curl) sees "connection refused", a connected
//! UDP socket ECONNREFUSED, both from the ICMP port unreachable socklb answers with.
//! (A Service with endpoints on other nodes only and externalTrafficPolicy Local drops
//! instead, as kube-proxy does: `external.rs` checks that.)
use std::{
    io::ErrorKind,
    net::{SocketAddr, UdpSocket},
    time::Duration,
};

use socklb_tests::{
    Agent, ManifestDir, Sandbox,
    family::Family,
    lan::{Addresses, addresses, counters, lan},
};

/// curl's exit status for "failed to connect" (refused, not timed out: that is 28).
const CURL_COULDNT_CONNECT: i32 = 7;

#[test]
fn a_service_without_endpoints_refuses_clients_from_outside_over_ipv4() {
    a_service_without_endpoints_refuses(Family::V4);
}

#[test]
fn a_service_without_endpoints_refuses_clients_from_outside_over_ipv6() {
    a_service_without_endpoints_refuses(Family::V6);
}

fn a_service_without_endpoints_refuses(family: Family) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("noendpoints{}", family.tag()));
    let lan = lan(&format!("nr{}", family.tag()));
    let manifests = ManifestDir::new(&sandbox);
    a.nodes(&manifests);
    let ports = "[{name: web, port: 80, targetPort: 8080, nodePort: 30091, protocol: TCP}, \
                 {name: dns, port: 53, targetPort: 53, nodePort: 30091, protocol: UDP}]";
    manifests.write(
        "empty.yaml",
        &a.service("empty", 91, ports, "  type: NodePort", false),
    );
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);
    let before = counters(&sandbox);
    let frontend = Addresses::at(a.node1, 30091);

    let curl = lan.client.output(
        "curl",
        &[
            "--silent",
            "--show-error",
            "--max-time",
            "20",
            &format!("http://{frontend}/"),
        ],
    );
    assert_eq!(
        curl.status.code(),
        Some(CURL_COULDNT_CONNECT),
        "curl through the NodePort of a Service without endpoints is refused: {}; {:?}",
        String::from_utf8_lossy(&curl.stderr),
        counters(&sandbox)
    );

    let frontend: SocketAddr = frontend.parse().expect("address");
    let udp = lan.client.enter(|| {
        let any: SocketAddr = match family {
            Family::V4 => "0.0.0.0:0",
            Family::V6 => "[::]:0",
        }
        .parse()
        .expect("address");
        let socket = UdpSocket::bind(any).expect("bind");
        socket.connect(frontend).expect("connect");
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        socket.send(b"query").expect("send");
        let mut buffer = [0u8; 16];
        socket.recv(&mut buffer).map_err(|e| e.kind())
    });
    assert_eq!(
        udp,
        Err(ErrorKind::ConnectionRefused),
        "a UDP client of a Service without endpoints is refused; {:?}",
        counters(&sandbox)
    );
    let after = counters(&sandbox);
    assert!(
        after.rejected >= before.rejected + 2,
        "both refusals were socklb's answers: {after:?}"
    );
}
