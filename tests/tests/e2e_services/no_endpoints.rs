//! No endpoints (upstream `service.go`): a Service without endpoints, or whose only pod was
//! evicted, refuses connections at once (ECONNREFUSED, counted by socklb as `no_backend` on
//! the socket path, `pod_no_backend` on the per-packet path) instead of leaving them to time
//! out.
use socklb_tests::{
    cluster::service,
    testbed::{At, PodPath, Testbed},
};

use crate::scenario::{ONE, REFUSED, at, no_backend, vip, wait_for};

socklb_tests::for_each_pod_path!(
    should_be_rejected_when_no_endpoints_exist,
    should_be_rejected_for_evicted_pods_no_endpoints_exist,
);

fn should_be_rejected_when_no_endpoints_exist(path: PodPath) {
    let tb = Testbed::new("noeps", path, [1, 0], &[ONE]);
    let exec = tb.pod(ONE, 0);
    tb.api
        .apply(&service("no-pods", vip(60)).port("http", 80, "TCP").build());
    let before = no_backend(&tb, ONE, At::Pod(exec));
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(60), 80), &[REFUSED]);
    let refused = tb
        .curl(At::Pod(exec), at(vip(60), 80))
        .expect_err("curl must fail");
    assert!(refused.contains("Couldn't connect"), "curl: {refused}");
    assert!(
        no_backend(&tb, ONE, At::Pod(exec)) > before,
        "the refusals were socklb's (the no_backend counter of the pod's path): {:?}",
        tb.inspect(ONE, None).counters
    );
}

fn should_be_rejected_for_evicted_pods_no_endpoints_exist(path: PodPath) {
    let tb = Testbed::new("evicted", path, [2, 0], &[ONE]);
    let (evicted, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _server = tb.tcp_server(evicted, 80);
    // publishNotReadyAddresses, to cover that edge too.
    let svc = service("evicted-pods", vip(61))
        .port("http", 80, "TCP")
        .publish_not_ready_addresses();
    tb.serve(svc, ("http", 80, "TCP"), &[evicted]);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(61), 80), &["pod11"]);
    // Evicted (phase Failed): the EndpointSlice controller removes the pod's endpoint, and
    // the slice stays, empty. The pod's address still answers (its server runs on).
    tb.set_endpoints("evicted-pods", ("http", 80, "TCP"), &[]);
    let before = no_backend(&tb, ONE, At::Pod(exec));
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(61), 80), &[REFUSED]);
    assert!(
        no_backend(&tb, ONE, At::Pod(exec)) > before,
        "{:?}",
        tb.inspect(ONE, None).counters
    );
}
