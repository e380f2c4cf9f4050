//! Traffic policy (upstream `service.go`): internalTrafficPolicy Local sends a node's
//! clients, pods and host processes alike, only to endpoints on that node; clients of a
//! node without one are refused there.
use std::net::{Ipv4Addr, SocketAddrV4};

use socklb_tests::{
    NamedServer,
    cluster::{ServiceBuilder, endpoint, service, slice},
    testbed::{At, PodPath, Testbed},
};

use crate::scenario::{ONE, REFUSED, TWO, at, curl_answer, no_backend, per_packet, vip, wait_for};

socklb_tests::for_each_pod_path!(
    should_respect_internaltrafficpolicy_local_pod_to_pod,
    should_respect_internaltrafficpolicy_local_pod_hostnetwork_true_to_pod,
    should_respect_internaltrafficpolicy_local_pod_and_node_to_pod_hostnetwork_true,
);

/// Clients on the endpoint's node reach it; clients on the other node are turned away by
/// their own node's socklb, five times each, as upstream: refused by the socket hooks
/// (kube-proxy drops instead), dropped by the per-packet path as kube-proxy drops (each
/// request times out: the five run at once).
pub fn check_local_only(tb: &Testbed, target: SocketAddrV4, near: At, far: At, server: &str) {
    wait_for(tb, near, "tcp", target, &[server]);
    for _ in 0..5 {
        assert_eq!(curl_answer(tb, near, target), server);
    }
    let before = no_backend(tb, TWO, far);
    if per_packet(tb, far) {
        tb.eventually("node2 drops the far client's packets", || {
            let failed = tb.curl_at_once(far, target, 5);
            if failed
                .iter()
                .all(|result| result.as_ref().is_err_and(|e| e.contains("timed out")))
            {
                Ok(())
            } else {
                Err(format!("{failed:?}"))
            }
        });
    } else {
        wait_for(tb, far, "tcp", target, &[REFUSED]);
        for failed in tb.curl_at_once(far, target, 5) {
            assert!(failed.is_err(), "{failed:?}");
        }
    }
    assert!(
        no_backend(tb, TWO, far) > before,
        "turned away by node2's socklb"
    );
}

/// Service `name` on `ip`:`port` (named http) with internalTrafficPolicy Local.
pub fn local_policy_service(name: &str, ip: Ipv4Addr, port: u16) -> ServiceBuilder {
    service(name, ip)
        .port("http", port, "TCP")
        .internal_traffic_policy("Local")
}

fn should_respect_internaltrafficpolicy_local_pod_to_pod(path: PodPath) {
    let tb = Testbed::new("itppod", path, [2, 1], &[ONE, TWO]);
    let (server, near, far) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(TWO, 0));
    let _server = tb.tcp_server(server, 80);
    let svc = local_policy_service("svc-itp", vip(80), 80);
    tb.serve(svc, ("http", 80, "TCP"), &[server]);
    check_local_only(&tb, at(vip(80), 80), At::Pod(near), At::Pod(far), "pod11");
}

fn should_respect_internaltrafficpolicy_local_pod_hostnetwork_true_to_pod(path: PodPath) {
    let tb = Testbed::new("itphost", path, [1, 0], &[ONE, TWO]);
    let server = tb.pod(ONE, 0);
    let _server = tb.tcp_server(server, 8000);
    let svc = local_policy_service("svc-itp", vip(81), 8000);
    tb.serve(svc, ("http", 8000, "TCP"), &[server]);
    let target = at(vip(81), 8000);
    // hostNetwork clients keep the socket hooks whichever path the pods take.
    check_local_only(&tb, target, At::Host(ONE), At::Host(TWO), "pod11");
}

fn should_respect_internaltrafficpolicy_local_pod_and_node_to_pod_hostnetwork_true(path: PodPath) {
    let tb = Testbed::new("itphostep", path, [1, 1], &[ONE, TWO]);
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
