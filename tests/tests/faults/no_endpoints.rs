//! A frontend whose Service has no endpoint refuses clients from outside at once, as
//! kube-proxy's REJECT does: a TCP client (curl) sees "connection refused", from the TCP
//! reset socklb answers with, a connected UDP socket ECONNREFUSED, from its ICMP port
//! unreachable.
//! (A Service with endpoints on other nodes only and externalTrafficPolicy Local drops
//! instead, as kube-proxy does: `external.rs` checks that.)
use std::{io::ErrorKind, time::Duration};

use socklb_tests::{
    family::Family,
    lan::{Addresses, LanNode},
};

/// curl's exit status for "failed to connect" (refused, not timed out: that is 28).
const CURL_COULDNT_CONNECT: i32 = 7;

socklb_tests::for_each_family!(a_service_without_endpoints_refuses_clients_from_outside);

fn a_service_without_endpoints_refuses_clients_from_outside(family: Family) {
    let node = LanNode::new(family, "noendpoints", "nr");
    let LanNode { a, lan, .. } = &node;
    node.write(
        "empty.yaml",
        &a.exposed("empty", 91)
            .port("web", 80, 8080, 30091, "TCP")
            .port("dns", 53, 53, 30091, "UDP")
            .service_yaml(),
    );
    let _agent = node.agent(&[]);
    let before = node.counters();
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
        node.counters()
    );

    let udp = node.udp_query(&frontend, Duration::from_secs(20));
    assert_eq!(
        udp,
        Err(ErrorKind::ConnectionRefused),
        "a UDP client of a Service without endpoints is refused; {:?}",
        node.counters()
    );
    let after = node.counters();
    assert!(
        after.rejected >= before.rejected + 2,
        "both refusals were socklb's answers: {after:?}"
    );
}
