//! Session affinity (upstream `service.go`): ClientIP affinity of a ClusterIP and of a
//! NodePort Service holds, expires after its timeout, and follows the Service when it is
//! switched off and on again.
use std::{collections::BTreeSet, net::SocketAddrV4, time::Duration};

use socklb_tests::{
    NamedServer,
    cluster::{ServiceBuilder, service},
    testbed::{At, PodPath, Testbed},
};

use crate::scenario::{ONE, answered, at, vip};

socklb_tests::for_each_pod_path!(
    should_have_session_affinity_work_for_service_with_type_clusterip,
    should_have_session_affinity_timeout_work_for_service_with_type_clusterip,
    should_be_able_to_switch_session_affinity_for_service_with_type_clusterip,
    should_have_session_affinity_work_for_nodeport_service,
    should_have_session_affinity_timeout_work_for_nodeport_service,
    should_be_able_to_switch_session_affinity_for_nodeport_service,
);

/// The default ClientIP affinity timeout (3 hours).
const DEFAULT_TIMEOUT: i32 = 10_800;

/// Three server pods on node1 behind a Service (port 80 -> 9376), and the client pod.
struct AffinityCase {
    tb: Testbed,
    _servers: Vec<NamedServer>,
}

impl AffinityCase {
    /// Creates `svc`, whose ClientIP affinity has `timeout`, and waits until node1 has
    /// programmed it for `target`.
    fn new(
        (tag, path): (&str, PodPath),
        svc: ServiceBuilder,
        timeout: i32,
        target: SocketAddrV4,
    ) -> Self {
        let tb = Testbed::new(tag, path, [4, 0], &[ONE]);
        let pods = [tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2)];
        let servers = pods.iter().map(|pod| tb.tcp_server(pod, 9376)).collect();
        tb.serve(
            svc.client_ip_affinity(timeout),
            ("http", 9376, "TCP"),
            &pods,
        );
        let case = Self {
            tb,
            _servers: servers,
        };
        case.wait_programmed(target, u32::try_from(timeout).ok());
        case
    }

    fn exec(&self) -> At<'_> {
        At::Pod(self.tb.pod(ONE, 3))
    }

    /// Waits until node1 has programmed `target` (both scopes of a NodePort) with the three
    /// backends and `affinity` (a timeout, or none).
    fn wait_programmed(&self, target: SocketAddrV4, affinity: Option<u32>) {
        self.tb.eventually(
            &format!("{target} programmed, affinity {affinity:?}"),
            || {
                let shown = self.tb.inspect(ONE, Some(*target.ip()));
                let states: Vec<(usize, Option<u32>)> = shown
                    .frontends
                    .iter()
                    .filter(|f| f.frontend.port == target.port())
                    .map(|f| {
                        (
                            f.backends.iter().flatten().count(),
                            f.affinity_timeout_seconds,
                        )
                    })
                    .collect();
                if !states.is_empty() && states.iter().all(|state| *state == (3, affinity)) {
                    Ok(())
                } else {
                    Err(format!("(backends, affinity) per scope: {states:?}"))
                }
            },
        );
    }

    /// 15 connections from `at`: answered by one server when affinity `holds` (by chance
    /// otherwise with p = 3^-14), by several when it does not; returns the servers.
    fn check_affinity(&self, at: At, target: SocketAddrV4, holds: bool) -> BTreeSet<String> {
        let attempts = self.tb.probe(at, "tcp", target, 15);
        let got = answered(&attempts);
        assert!(
            got.iter().all(|name| name.starts_with("pod")),
            "{target}: {attempts:?}"
        );
        assert_eq!(
            got.len() == 1,
            holds,
            "affinity holds={holds}: answered by {got:?}"
        );
        got
    }

    /// With a 1 s timeout: every burst sticks to one server, and after the client has been
    /// idle past the timeout a new server may be drawn. Rounds go on until one differs
    /// from the round before (3 servers: a new draw repeats the old one with p = 1/3, so
    /// 12 rounds fail a working timeout with p = 3^-11).
    fn check_timeout(&self, at: At, target: SocketAddrV4) {
        let mut previous = self.check_affinity(at, target, true);
        for _ in 0..12 {
            // The affinity timeout is what is being tested: wait it out.
            std::thread::sleep(Duration::from_millis(1500));
            let now = answered(&self.tb.probe(at, "tcp", target, 8));
            assert_eq!(now.len(), 1, "not sticky within the timeout: {now:?}");
            if now != previous {
                return;
            }
            previous = now;
        }
        panic!("the same server after 12 expiries of the affinity timeout: {previous:?}");
    }

    /// Affinity holds for clients at `at`; the Service (`svc` with its affinity) switched to
    /// no affinity, it does not; switched back, it holds again.
    fn check_switching(&self, svc: impl Fn() -> ServiceBuilder, at: At, target: SocketAddrV4) {
        self.check_affinity(at, target, true);
        self.tb.api.apply(&svc().build());
        self.wait_programmed(target, None);
        self.check_affinity(at, target, false);
        self.tb
            .api
            .apply(&svc().client_ip_affinity(DEFAULT_TIMEOUT).build());
        self.wait_programmed(target, u32::try_from(DEFAULT_TIMEOUT).ok());
        self.check_affinity(at, target, true);
    }
}

fn should_have_session_affinity_work_for_service_with_type_clusterip(path: PodPath) {
    let (svc, target) = (service("affinity-clusterip", vip(20)), at(vip(20), 80));
    let svc = svc.port("http", 80, "TCP");
    let case = AffinityCase::new(("affcip", path), svc, DEFAULT_TIMEOUT, target);
    let first = case.check_affinity(case.exec(), target, true);
    // Later connections, by other processes of the same pod, keep the server.
    assert_eq!(case.check_affinity(case.exec(), target, true), first);
}

fn should_have_session_affinity_timeout_work_for_service_with_type_clusterip(path: PodPath) {
    let svc = service("affinity-clusterip-timeout", vip(21)).port("http", 80, "TCP");
    let target = at(vip(21), 80);
    let case = AffinityCase::new(("affcipto", path), svc, 1, target);
    case.check_timeout(case.exec(), target);
}

fn should_be_able_to_switch_session_affinity_for_service_with_type_clusterip(path: PodPath) {
    let svc = || service("affinity-clusterip-transition", vip(22)).port("http", 80, "TCP");
    let target = at(vip(22), 80);
    let case = AffinityCase::new(("affcipsw", path), svc(), DEFAULT_TIMEOUT, target);
    case.check_switching(svc, case.exec(), target);
}

fn should_have_session_affinity_work_for_nodeport_service(path: PodPath) {
    let svc = service("affinity-nodeport", vip(23)).node_port("http", 80, "TCP", 30090);
    let target = at(ONE.address(), 30090);
    let case = AffinityCase::new(("affnp", path), svc, DEFAULT_TIMEOUT, target);
    // A pod connecting to its node's NodePort (its path: the socket hooks key affinity by
    // its namespace, the per-packet path by its address)...
    case.check_affinity(case.exec(), target, true);
    // ...and a client outside the cluster (TC, keyed by the client's address).
    case.check_affinity(At::Outside, target, true);
}

fn should_have_session_affinity_timeout_work_for_nodeport_service(path: PodPath) {
    let svc = service("affinity-nodeport-timeout", vip(24)).node_port("http", 80, "TCP", 30091);
    let target = at(ONE.address(), 30091);
    let case = AffinityCase::new(("affnpto", path), svc, 1, target);
    // A pod on the node (its path), as upstream, and a client outside the cluster (TC).
    case.check_timeout(case.exec(), target);
    case.check_timeout(At::Outside, target);
}

fn should_be_able_to_switch_session_affinity_for_nodeport_service(path: PodPath) {
    let svc =
        || service("affinity-nodeport-transition", vip(25)).node_port("http", 80, "TCP", 30092);
    let target = at(ONE.address(), 30092);
    let case = AffinityCase::new(("affnpsw", path), svc(), DEFAULT_TIMEOUT, target);
    // A pod on the node (its path), as upstream, and a client outside the cluster (TC).
    case.check_switching(svc, case.exec(), target);
    case.check_switching(svc, At::Outside, target);
}
