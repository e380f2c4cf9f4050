//! Terminating endpoints (upstream `service.go`): when a Service's only pod is deleted and
//! terminates, still serving in its grace period, the proxies fall back to it under either
//! traffic policy, locally where the policy is Local; its node's health check fails
//! meanwhile.
use k8s_openapi::api::discovery::v1::Endpoint;
use socklb_tests::{
    NamedServer,
    cluster::{ServiceBuilder, endpoint, service, slice, terminating},
    testbed::{At, NodeId, PodPath, Testbed},
};

use crate::{
    scenario::{ONE, TWO, at, curl_answer, vip, wait_for},
    traffic_policy::{check_local_only, local_policy_service},
};

socklb_tests::for_each_pod_path!(
    should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_internaltrafficpolicy_cluster,
    should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_internaltrafficpolicy_local,
    should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_externaltrafficpolicy_cluster,
    should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_externaltrafficpolicy_local,
    should_fail_health_check_node_port_if_there_are_only_terminating_endpoints,
);

/// A server pod, pod11, the only endpoint of a Service, which serves a client pod and then
/// changes (it terminates, or fails its readiness probe as well); the cluster has client
/// pods besides.
pub struct TerminatingCase {
    pub tb: Testbed,
    _server: NamedServer,
}

impl TerminatingCase {
    /// The cluster of `tag` with `pods` on each node, pod11 serving `svc` (port http 80) to
    /// the `client`th pod of its node, then the endpoint as `then` makes it. The agents
    /// have programmed the change when this returns (the backend is the same before and
    /// after it, so no answer would tell).
    pub fn new(
        (tag, path): (&str, PodPath),
        pods: [usize; 2],
        svc: ServiceBuilder,
        client: (NodeId, usize),
        then: fn(Endpoint) -> Endpoint,
    ) -> Self {
        let tb = Testbed::new(tag, path, pods, &[ONE, TWO]);
        let server = tb.tcp_server(tb.pod(ONE, 0), 80);
        let svc = svc.build();
        let name = svc.metadata.name.clone().unwrap_or_default();
        let ip = svc
            .spec
            .as_ref()
            .and_then(|spec| spec.cluster_ip.as_deref())
            .and_then(|ip| ip.parse().ok())
            .expect("a Service with a cluster IP");
        tb.api.apply(&svc);
        let endpoints = |e| {
            slice(&format!("{name}-1"), &name)
                .port("http", 80, "TCP")
                .endpoint(e)
                .build()
        };
        let ready = endpoint(tb.pod(ONE, 0).ip, "node1");
        tb.api.apply(&endpoints(ready.clone()));
        // Ready first, as upstream waits for the pod to be ready before deleting it.
        let client = At::Pod(tb.pod(client.0, client.1));
        wait_for(&tb, client, "tcp", at(ip, 80), &["pod11"]);
        tb.synced(|| {
            tb.api.apply(&endpoints(then(ready)));
        });
        Self {
            tb,
            _server: server,
        }
    }

    /// One server pod on node1, a client pod on each node, and `svc` whose only endpoint
    /// is the server; the server then starts terminating (it keeps serving in its grace
    /// period).
    fn of(tag: (&str, PodPath), svc: ServiceBuilder) -> Self {
        Self::new(tag, [2, 1], svc, (ONE, 1), terminating)
    }

    fn near(&self) -> At<'_> {
        At::Pod(self.tb.pod(ONE, 1))
    }

    fn far(&self) -> At<'_> {
        At::Pod(self.tb.pod(TWO, 0))
    }

    /// Both clients reach the terminating pod at `target`, five times each, as upstream.
    fn served_to_both(&self, target: std::net::SocketAddrV4) {
        for client in [self.near(), self.far()] {
            wait_for(&self.tb, client, "tcp", target, &["pod11"]);
        }
        for _ in 0..5 {
            for client in [self.near(), self.far()] {
                assert_eq!(curl_answer(&self.tb, client, target), "pod11");
            }
        }
    }
}

fn should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_internaltrafficpolicy_cluster(
    path: PodPath,
) {
    let svc = service("svc-proxy-terminating", vip(90)).port("http", 80, "TCP");
    let case = TerminatingCase::of(("termitpc", path), svc);
    case.served_to_both(at(vip(90), 80));
    let shown = case.tb.inspect(TWO, Some(vip(90)));
    assert_eq!(shown.frontends.len(), 1, "{shown:?}");
}

fn should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_internaltrafficpolicy_local(
    path: PodPath,
) {
    let svc = local_policy_service("svc-proxy-terminating", vip(91), 80);
    let case = TerminatingCase::of(("termitpl", path), svc);
    check_local_only(&case.tb, at(vip(91), 80), case.near(), case.far(), "pod11");
}

fn should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_externaltrafficpolicy_cluster(
    path: PodPath,
) {
    let svc = service("svc-proxy-terminating", vip(92)).node_port("http", 80, "TCP", 30110);
    let case = TerminatingCase::of(("termetpc", path), svc);
    // The node's own pod (its pod path) and a pod on the other node, whose traffic arrives
    // at node1 from outside (TC, externalTrafficPolicy Cluster).
    case.served_to_both(at(ONE.address(), 30110));
}

fn should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_externaltrafficpolicy_local(
    path: PodPath,
) {
    let svc = service("svc-proxy-terminating", vip(93))
        .node_port("http", 80, "TCP", 30111)
        .external_traffic_policy("Local");
    let case = TerminatingCase::of(("termetpl", path), svc);
    let (node_port1, node_port2) = (at(ONE.address(), 30111), at(TWO.address(), 30111));
    // Traffic from a pod to its own node's NodePort is neither internal nor external: the
    // Cluster policy (terminating fallback); from outside (the other node's pod) to node1:
    // node1's local terminating endpoint.
    wait_for(&case.tb, case.near(), "tcp", node_port1, &["pod11"]);
    wait_for(&case.tb, case.far(), "tcp", node_port1, &["pod11"]);
    wait_for(&case.tb, case.far(), "tcp", node_port2, &["pod11"]);
    // node1's pod to node2's NodePort arrives at node2 from outside: no local endpoint there,
    // so node2 drops it (as kube-proxy does).
    let before = case.tb.inspect(TWO, None).counters.external_no_backend;
    let failed = case.tb.curl(case.near(), node_port2);
    assert!(failed.is_err(), "node2 has no local endpoint: {failed:?}");
    assert!(
        case.tb.inspect(TWO, None).counters.external_no_backend > before,
        "dropped by node2's socklb"
    );
    for _ in 0..5 {
        assert_eq!(curl_answer(&case.tb, case.near(), node_port1), "pod11");
        assert_eq!(curl_answer(&case.tb, case.far(), node_port1), "pod11");
        assert_eq!(curl_answer(&case.tb, case.far(), node_port2), "pod11");
    }
}

fn should_fail_health_check_node_port_if_there_are_only_terminating_endpoints(path: PodPath) {
    // A LoadBalancer Service with externalTrafficPolicy Local: its nodes answer a health
    // check on healthCheckNodePort 30212, with 200 while they have a local endpoint.
    let svc = service("svc-proxy-terminating", vip(94))
        .node_port("http", 80, "TCP", 30112)
        .external_traffic_policy("Local")
        .load_balancer(Some(30212));
    let tb = Testbed::new("termhc", path, [2, 0], &[ONE]);
    let (server, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _server = tb.tcp_server(server, 80);
    tb.serve(svc, ("http", 80, "TCP"), &[server]);
    // curl in the client pod, to the node's healthCheckNodePort (the agent answers it).
    let health = |expected: &str| {
        let output = tb
            .command(At::Pod(exec), "curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "2"])
            .arg(format!("http://{}:30212/healthz", ONE.address()))
            .output()
            .expect("prerequisite missing: curl");
        match String::from_utf8_lossy(&output.stdout) {
            code if code == expected => Ok(()),
            code => Err(code.into_owned()),
        }
    };
    tb.eventually("the health check passes with a ready endpoint", || {
        health("200")
    });
    tb.api.apply(
        &slice("svc-proxy-terminating-1", "svc-proxy-terminating")
            .port("http", 80, "TCP")
            .endpoint(terminating(endpoint(server.ip, "node1")))
            .build(),
    );
    tb.eventually("the health check fails with only a terminating one", || {
        health("503")
    });
    // ...while the terminating endpoint still serves the NodePort.
    assert_eq!(
        curl_answer(&tb, At::Pod(exec), at(ONE.address(), 30112)),
        "pod11"
    );
}
