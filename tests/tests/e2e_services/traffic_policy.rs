//! Traffic policy (upstream `service.go`): internalTrafficPolicy Local sends a node's
//! clients, pods and host processes alike, only to endpoints on that node; clients of a
//! node without one are refused there.
use std::net::{Ipv4Addr, SocketAddrV4};

use socklb_tests::{
    NamedServer,
    cluster::{ServiceBuilder, endpoint, service, slice},
    testbed::{At, Testbed},
};

use crate::scenario::{ONE, REFUSED, TWO, at, curl_answer, no_backend, vip, wait_for};

/// Clients on the endpoint's node reach it; clients on the other node are refused by their
/// own node's socklb (kube-proxy drops instead).
pub fn check_local_only(tb: &Testbed, target: SocketAddrV4, near: At, far: At, server: &str) {
    wait_for(tb, near, "tcp", target, &[server]);
    let before = no_backend(tb, TWO);
    wait_for(tb, far, "tcp", target, &[REFUSED]);
    assert!(no_backend(tb, TWO) > before, "refused by node2's socklb");
    // Five times each, as upstream.
    for _ in 0..5 {
        assert_eq!(curl_answer(tb, near, target), server);
        assert!(tb.curl(far, target).is_err());
    }
}

/// Service `name` on `ip`:`port` (named http) with internalTrafficPolicy Local.
pub fn local_policy_service(name: &str, ip: Ipv4Addr, port: u16) -> ServiceBuilder {
    service(name, ip)
        .port("http", port, "TCP")
        .internal_traffic_policy("Local")
}

#[test]
fn should_respect_internaltrafficpolicy_local_pod_to_pod() {
    let tb = Testbed::new("itppod", [2, 1], &[ONE, TWO]);
    let (server, near, far) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(TWO, 0));
    let _server = tb.tcp_server(server, 80);
    let svc = local_policy_service("svc-itp", vip(80), 80);
    tb.serve(svc, ("http", 80, "TCP"), &[server]);
    check_local_only(&tb, at(vip(80), 80), At::Pod(near), At::Pod(far), "pod11");
}

#[test]
fn should_respect_internaltrafficpolicy_local_pod_hostnetwork_true_to_pod() {
    let tb = Testbed::new("itphost", [1, 0], &[ONE, TWO]);
    let server = tb.pod(ONE, 0);
    let _server = tb.tcp_server(server, 8000);
    let svc = local_policy_service("svc-itp", vip(81), 8000);
    tb.serve(svc, ("http", 8000, "TCP"), &[server]);
    let target = at(vip(81), 8000);
    check_local_only(&tb, target, At::Host(ONE), At::Host(TWO), "pod11");
}

#[test]
fn should_respect_internaltrafficpolicy_local_pod_and_node_to_pod_hostnetwork_true() {
    let tb = Testbed::new("itphostep", [1, 1], &[ONE, TWO]);
    // The endpoint is a hostNetwork pod on node1: the node's address.
    let _server = NamedServer::tcp_replying("node1", at(ONE.address(), 10180), "node1 {peer}");
    tb.api
        .apply(&local_policy_service("svc-itp", vip(82), 80).build());
    tb.api.apply(
        &slice("svc-itp-1", "svc-itp")
            .port("http", 10180, "TCP")
            .endpoint(endpoint(ONE.address(), "node1"))
            .build(),
    );
    let target = at(vip(82), 80);
    let (pod1, pod2) = (At::Pod(tb.pod(ONE, 0)), At::Pod(tb.pod(TWO, 0)));
    check_local_only(&tb, target, pod1, pod2, "node1");
    check_local_only(&tb, target, At::Host(ONE), At::Host(TWO), "node1");
}
