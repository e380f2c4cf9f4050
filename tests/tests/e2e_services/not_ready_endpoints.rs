//! Not ready endpoints (upstream `service.go`): publishNotReadyAddresses makes a proxy use
//! endpoints that are neither ready nor serving, even terminating ones; without it they are
//! refused.
use socklb_tests::{
    cluster::{endpoint, not_ready, service, slice, terminating_unready},
    testbed::{At, PodPath, Testbed},
};

use crate::{
    scenario::{ONE, REFUSED, TWO, at, curl_answer, vip, wait_for},
    terminating_endpoints::TerminatingCase,
};

socklb_tests::for_each_pod_path!(
    should_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_true,
    should_not_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_false,
    should_create_endpoints_for_unready_pods,
);

/// A NodePort Service whose only endpoint, pod11 on node1, is deleted and fails its
/// readiness probe (neither ready nor serving, terminating); the client pod is on node2.
fn terminating_unready_case(
    (tag, path): (&str, PodPath),
    host: u8,
    node_port: u16,
    publish: bool,
) -> TerminatingCase {
    let svc = service("svc-tolerate-unready", vip(host)).node_port("http", 80, "TCP", node_port);
    let svc = if publish {
        svc.publish_not_ready_addresses()
    } else {
        svc
    };
    TerminatingCase::new((tag, path), [1, 1], svc, (TWO, 0), terminating_unready)
}

fn should_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_true(
    path: PodPath,
) {
    let case = terminating_unready_case(("pnratrue", path), 95, 30113, true);
    let client = At::Pod(case.tb.pod(TWO, 0));
    // The cluster IP, node1's NodePort (from outside node1) and node2's (its own node).
    for target in [
        at(vip(95), 80),
        at(ONE.address(), 30113),
        at(TWO.address(), 30113),
    ] {
        for _ in 0..5 {
            assert_eq!(curl_answer(&case.tb, client, target), "pod11", "{target}");
        }
    }
}

fn should_not_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_false(
    path: PodPath,
) {
    let case = terminating_unready_case(("pnrafalse", path), 96, 30114, false);
    let tb = &case.tb;
    let client = At::Pod(tb.pod(TWO, 0));
    // node2's socklb refuses the cluster IP and its own NodePort...
    for target in [at(vip(96), 80), at(TWO.address(), 30114)] {
        wait_for(tb, client, "tcp", target, &[REFUSED]);
    }
    // ...and node1 refuses what arrives at its NodePort from outside (no endpoint it could
    // use: kube-proxy's REJECT).
    let before = tb.inspect(ONE, None).counters.rejected;
    let failed = tb.curl(client, at(ONE.address(), 30114));
    assert!(failed.is_err(), "{failed:?}");
    assert!(tb.inspect(ONE, None).counters.rejected > before);
}

fn should_create_endpoints_for_unready_pods(path: PodPath) {
    let tb = Testbed::new("unready", path, [2, 0], &[ONE]);
    let (server, exec) = (tb.pod(ONE, 0), At::Pod(tb.pod(ONE, 1)));
    let _server = tb.tcp_server(server, 80);
    let svc = |publish: bool| {
        let svc = service("tolerate-unready", vip(97)).port("http", 80, "TCP");
        if publish {
            svc.publish_not_ready_addresses().build()
        } else {
            svc.build()
        }
    };
    let endpoints = |e| {
        slice("tolerate-unready-1", "tolerate-unready")
            .port("http", 80, "TCP")
            .endpoint(e)
            .build()
    };
    let target = at(vip(97), 80);
    // The pod never passes its readiness probe; the Service publishes it anyway.
    tb.api.apply(&svc(true));
    tb.api
        .apply(&endpoints(not_ready(endpoint(server.ip, "node1"))));
    wait_for(&tb, exec, "tcp", target, &["pod11"]);
    // Scaled to zero: the pod terminates slowly (a long preStop hook).
    let gone = terminating_unready(endpoint(server.ip, "node1"));
    tb.api.apply(&endpoints(gone));
    tb.api.apply(&svc(false));
    wait_for(&tb, exec, "tcp", target, &[REFUSED]);
    tb.api.apply(&svc(true));
    wait_for(&tb, exec, "tcp", target, &["pod11"]);
}
