//! The Kubernetes Service e2e scenarios that a proxy decides (upstream
//! `test/e2e/network/{service,conntrack,endpointslice,traffic_distribution}.go`), as our own
//! suite: one test per upstream scenario, named after it. docs/conformance.md maps each
//! upstream test to the test here, or says why it does not apply.
//!
//! Every test builds a small cluster ([`Testbed`]): two nodes, pods and an outside client as
//! network namespaces on one LAN, the fake API server, and the real agent on the `kube`
//! source on the nodes that need one. The test changes Services and EndpointSlices through
//! the API server as the control plane would (a "pod is created" when its endpoint appears in
//! a slice and its server runs in its namespace), and real clients (curl, dig, the probe)
//! check which pod answered and which address it saw. A destination socklb did not translate
//! hits a blackhole route: the client gets EINVAL, which is how "not served" is told apart
//! from "refused by socklb" (ECONNREFUSED, counted as `no_backend`).
use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use socklb_tests::{
    Attempt, Dnsmasq, NamedServer,
    boom_server::{BoomServer, Reaction},
    cluster::{
        endpoint, external_name_service, hinted, node, not_ready, service, slice, terminating,
        terminating_unready,
    },
    lan,
    testbed::{At, NodeId, Pod, Testbed},
};

const ONE: NodeId = NodeId::One;
const TWO: NodeId = NodeId::Two;
/// The answer of a probe attempt that socklb refused.
const REFUSED: &str = "error: ECONNREFUSED";
/// The answer of a probe attempt whose destination was not translated (blackhole route).
const NOT_SERVED: &str = "error: EINVAL";

fn vip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, 0, last)
}

fn at(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}

/// The server names that answered (the first word of each reply), and `error: X` for
/// attempts that failed.
fn answered(attempts: &[Attempt]) -> BTreeSet<String> {
    attempts
        .iter()
        .map(|attempt| match (&attempt.reply, &attempt.error) {
            (Some(reply), _) => reply.split(' ').next().unwrap_or_default().to_owned(),
            (None, Some(error)) => format!("error: {error}"),
            (None, None) => "nothing".to_owned(),
        })
        .collect()
}

/// The address each answering server saw as the client's.
fn seen_by_servers(attempts: &[Attempt]) -> BTreeSet<std::net::IpAddr> {
    lan::answers(attempts)
        .into_iter()
        .map(|(_, seen)| seen.ip())
        .collect()
}

fn names(expected: &[&str]) -> BTreeSet<String> {
    expected.iter().map(|s| (*s).to_owned()).collect()
}

/// Waits until 12 `mode` attempts from `at` to `target` are answered by exactly `expected`
/// (server names, [`REFUSED`] or [`NOT_SERVED`]): the agents follow API changes
/// asynchronously, and a random draw may miss a server once but not forever.
fn wait_for(tb: &Testbed, at: At, mode: &str, target: SocketAddrV4, expected: &[&str]) {
    let expected = names(expected);
    tb.eventually(
        &format!("{mode} to {target} answered by {expected:?}"),
        || {
            let got = answered(&tb.probe(at, mode, target, 12));
            if got == expected {
                Ok(())
            } else {
                Err(format!("answered by {got:?}"))
            }
        },
    );
}

/// One request with curl at `at`: the name of the server that answered.
fn curl_answer(tb: &Testbed, at: At, target: SocketAddrV4) -> String {
    let body = tb
        .curl(at, target)
        .unwrap_or_else(|e| panic!("curl http://{target}/: {e}"));
    body.split(' ').next().unwrap_or_default().to_owned()
}

/// Names of pods, for sets of expected answers.
fn pod_names<'a>(pods: &[&'a Pod]) -> Vec<&'a str> {
    pods.iter().map(|pod| pod.name.as_str()).collect()
}

fn no_backend(tb: &Testbed, node: NodeId) -> u64 {
    tb.inspect(node, None).counters.no_backend
}

// ----------------------------------------------------------------------------------------
// Serving

#[test]
fn should_serve_a_basic_endpoint_from_pods() {
    let tb = Testbed::new("basic", [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [tb.tcp_server(pod1, 80), tb.tcp_server(pod2, 80)];
    let target = at(vip(10), 80);
    tb.api.apply(
        &service("endpoint-test2", vip(10))
            .port("http", 80, "TCP")
            .build(),
    );
    let endpoints = |pods: &[&Pod]| {
        let mut s = slice("endpoint-test2-abc", "endpoint-test2").port("http", 80, "TCP");
        for pod in pods {
            s = s.endpoint(endpoint(pod.ip, "node1"));
        }
        tb.api.apply(&s.build());
    };
    endpoints(&[]);
    wait_for(&tb, At::Pod(exec), "tcp", target, &[REFUSED]);

    endpoints(&[pod1]);
    wait_for(&tb, At::Pod(exec), "tcp", target, &["pod11"]);
    assert_eq!(curl_answer(&tb, At::Pod(exec), target), "pod11");

    endpoints(&[pod1, pod2]);
    wait_for(&tb, At::Pod(exec), "tcp", target, &["pod11", "pod12"]);

    endpoints(&[pod2]);
    wait_for(&tb, At::Pod(exec), "tcp", target, &["pod12"]);
    assert_eq!(curl_answer(&tb, At::Pod(exec), target), "pod12");

    endpoints(&[]);
    wait_for(&tb, At::Pod(exec), "tcp", target, &[REFUSED]);
}

#[test]
fn should_serve_multiport_endpoints_from_pods() {
    let tb = Testbed::new("multiport", [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    // Named target ports: svc1 is port 100 of pod1, svc2 port 101 of pod2.
    let _servers = [tb.tcp_server(pod1, 100), tb.tcp_server(pod2, 101)];
    tb.api.apply(
        &service("multi-endpoint-test", vip(11))
            .port("portname1", 80, "TCP")
            .port("portname2", 81, "TCP")
            .build(),
    );
    // The EndpointSlice controller groups endpoints by their ports: one slice per pod here.
    let slice1 = |pods: &[&Pod]| {
        slice("multi-endpoint-test-1", "multi-endpoint-test")
            .port("portname1", 100, "TCP")
            .endpoints(pods.iter().map(|p| endpoint(p.ip, "node1")))
            .build()
    };
    let slice2 = |pods: &[&Pod]| {
        slice("multi-endpoint-test-2", "multi-endpoint-test")
            .port("portname2", 101, "TCP")
            .endpoints(pods.iter().map(|p| endpoint(p.ip, "node1")))
            .build()
    };
    tb.api.apply(&slice1(&[pod1]));
    tb.api.apply(&slice2(&[pod2]));
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(11), 80), &["pod11"]);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(11), 81), &["pod12"]);
    assert_eq!(curl_answer(&tb, At::Pod(exec), at(vip(11), 81)), "pod12");

    tb.api.apply(&slice1(&[]));
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(11), 80), &[REFUSED]);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(11), 81), &["pod12"]);

    tb.api.apply(&slice2(&[]));
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(11), 81), &[REFUSED]);
}

#[test]
fn should_serve_endpoints_on_same_port_and_different_protocols() {
    let tb = Testbed::new("sameport", [2, 0], &[ONE]);
    let (server, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _servers = [tb.tcp_server(server, 80), tb.udp_server(server, 80)];
    tb.api.apply(
        &service("same-port-protocols", vip(12))
            .port("tcp-port", 80, "TCP")
            .port("udp-port", 80, "UDP")
            .build(),
    );
    tb.api.apply(
        &slice("same-port-protocols-1", "same-port-protocols")
            .port("tcp-port", 80, "TCP")
            .port("udp-port", 80, "UDP")
            .endpoint(endpoint(server.ip, "node1"))
            .build(),
    );
    let target = at(vip(12), 80);
    wait_for(&tb, At::Pod(exec), "tcp", target, &["pod11"]);
    wait_for(&tb, At::Pod(exec), "udp", target, &["pod11"]);
    wait_for(&tb, At::Pod(exec), "udp-connected", target, &["pod11"]);
    assert_eq!(curl_answer(&tb, At::Pod(exec), target), "pod11");
    // Replies come back from the VIP, which is what UDP clients check.
    for attempt in tb.probe(At::Pod(exec), "udp", target, 3) {
        assert_eq!(
            attempt.peer.as_deref(),
            Some("10.96.0.12:80"),
            "{attempt:?}"
        );
    }
}

#[test]
fn should_serve_endpoints_on_same_port_and_different_protocol_for_internal_traffic_on_type_loadbalancer()
 {
    let tb = Testbed::new("lbproto", [2, 0], &[ONE]);
    let (server, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _servers = [tb.tcp_server(server, 80), tb.udp_server(server, 80)];
    tb.api.apply(
        &service("lb-same-port-protocols", vip(17))
            .node_port("tcp-port", 80, "TCP", 30140)
            .node_port("udp-port", 80, "UDP", 30141)
            .load_balancer(None)
            .build(),
    );
    tb.api.apply(
        &slice("lb-same-port-protocols-1", "lb-same-port-protocols")
            .port("tcp-port", 80, "TCP")
            .port("udp-port", 80, "UDP")
            .endpoint(endpoint(server.ip, "node1"))
            .build(),
    );
    let target = at(vip(17), 80);
    wait_for(&tb, At::Pod(exec), "tcp", target, &["pod11"]);
    wait_for(&tb, At::Pod(exec), "udp", target, &["pod11"]);
    wait_for(&tb, At::Pod(exec), "udp-connected", target, &["pod11"]);
}

#[test]
fn should_be_able_to_create_a_functioning_nodeport_service() {
    let tb = Testbed::new("nodeport", [2, 1], &[ONE, TWO]);
    let (pod11, exec, pod21) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(TWO, 0));
    let _servers = [tb.tcp_server(pod11, 9376), tb.tcp_server(pod21, 9376)];
    tb.api.apply(
        &service("nodeport-test", vip(13))
            .node_port("http", 80, "TCP", 30080)
            .build(),
    );
    tb.api.apply(
        &slice("nodeport-test-1", "nodeport-test")
            .port("http", 9376, "TCP")
            .endpoint(endpoint(pod11.ip, "node1"))
            .endpoint(endpoint(pod21.ip, "node2"))
            .build(),
    );
    let both = ["pod11", "pod21"];
    // From a pod: the cluster IP, and every node's InternalIP on the NodePort.
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(13), 80), &both);
    for node in [ONE, TWO] {
        wait_for(&tb, At::Pod(exec), "tcp", at(node.address(), 30080), &both);
        wait_for(&tb, At::Outside, "tcp", at(node.address(), 30080), &both);
        let name = curl_answer(&tb, At::Outside, at(node.address(), 30080));
        assert!(both.contains(&name.as_str()), "curl got {name}");
    }
}

// ----------------------------------------------------------------------------------------
// Type changes

#[test]
fn should_be_able_to_change_the_type_from_externalname_to_clusterip() {
    let tb = Testbed::new("en2cip", [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [tb.tcp_server(pod1, 9376), tb.tcp_server(pod2, 9376)];
    tb.synced(|| {
        tb.api.apply(&external_name_service(
            "externalname-service",
            "foo.example.com",
        ));
    });
    assert!(
        tb.inspect(ONE, None).frontends.is_empty(),
        "an ExternalName Service is not proxied"
    );

    tb.api.apply(
        &service("externalname-service", vip(14))
            .port("http", 80, "TCP")
            .build(),
    );
    tb.api.apply(
        &slice("externalname-service-1", "externalname-service")
            .port("http", 9376, "TCP")
            .endpoint(endpoint(pod1.ip, "node1"))
            .endpoint(endpoint(pod2.ip, "node1"))
            .build(),
    );
    wait_for(
        &tb,
        At::Pod(exec),
        "tcp",
        at(vip(14), 80),
        &["pod11", "pod12"],
    );
}

#[test]
fn should_be_able_to_change_the_type_from_externalname_to_nodeport() {
    let tb = Testbed::new("en2np", [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [tb.tcp_server(pod1, 9376), tb.tcp_server(pod2, 9376)];
    tb.synced(|| {
        tb.api.apply(&external_name_service(
            "externalname-service",
            "foo.example.com",
        ));
    });
    assert!(
        tb.inspect(ONE, None).frontends.is_empty(),
        "an ExternalName Service is not proxied"
    );

    tb.api.apply(
        &service("externalname-service", vip(15))
            .node_port("http", 80, "TCP", 30081)
            .build(),
    );
    tb.api.apply(
        &slice("externalname-service-1", "externalname-service")
            .port("http", 9376, "TCP")
            .endpoint(endpoint(pod1.ip, "node1"))
            .endpoint(endpoint(pod2.ip, "node1"))
            .build(),
    );
    let both = ["pod11", "pod12"];
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(15), 80), &both);
    wait_for(&tb, At::Pod(exec), "tcp", at(ONE.address(), 30081), &both);
    wait_for(&tb, At::Outside, "tcp", at(ONE.address(), 30081), &both);
}

/// A Service that was served becomes ExternalName: its cluster IP and NodePort are no longer
/// translated. A host process listening on the node's address and the former NodePort shows
/// it: connections from a pod and from outside reach that process instead of a pod.
fn served_then_external_name(tag: &str, node_port: Option<u16>) {
    let tb = Testbed::new(tag, [2, 0], &[ONE]);
    let (pod1, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _server = tb.tcp_server(pod1, 9376);
    let port = node_port.unwrap_or(30082);
    let _host = NamedServer::tcp_replying("host", at(ONE.address(), port), "host-process {peer}");
    let svc = service("clusterip-service", vip(16));
    let svc = match node_port {
        Some(node_port) => svc.node_port("http", 80, "TCP", node_port),
        None => svc.port("http", 80, "TCP"),
    };
    tb.api.apply(&svc.build());
    tb.api.apply(
        &slice("clusterip-service-1", "clusterip-service")
            .port("http", 9376, "TCP")
            .endpoint(endpoint(pod1.ip, "node1"))
            .build(),
    );
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(16), 80), &["pod11"]);
    if node_port.is_some() {
        wait_for(
            &tb,
            At::Pod(exec),
            "tcp",
            at(ONE.address(), port),
            &["pod11"],
        );
        wait_for(&tb, At::Outside, "tcp", at(ONE.address(), port), &["pod11"]);
    }

    // The API server clears clusterIP and the node ports; the controller keeps no slices.
    tb.api.apply(&external_name_service(
        "clusterip-service",
        "foo.example.com",
    ));
    tb.api
        .delete::<k8s_openapi::api::discovery::v1::EndpointSlice>(
            Some("default"),
            "clusterip-service-1",
        );
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(16), 80), &[NOT_SERVED]);
    wait_for(
        &tb,
        At::Pod(exec),
        "tcp",
        at(ONE.address(), port),
        &["host-process"],
    );
    wait_for(
        &tb,
        At::Outside,
        "tcp",
        at(ONE.address(), port),
        &["host-process"],
    );
    assert!(
        tb.inspect(ONE, None).frontends.is_empty(),
        "nothing left in the maps"
    );
}

#[test]
fn should_be_able_to_change_the_type_from_clusterip_to_externalname() {
    served_then_external_name("cip2en", None);
}

#[test]
fn should_be_able_to_change_the_type_from_nodeport_to_externalname() {
    served_then_external_name("np2en", Some(30083));
}

// ----------------------------------------------------------------------------------------
// Session affinity

/// Three server pods on node1 behind `svc` (port 80 -> 9376), and the client pod.
struct AffinityCase {
    tb: Testbed,
    _servers: Vec<NamedServer>,
}

fn affinity_case(tag: &str, svc: socklb_tests::cluster::ServiceBuilder) -> AffinityCase {
    let tb = Testbed::new(tag, [4, 0], &[ONE]);
    let servers = (0..3)
        .map(|i| tb.tcp_server(tb.pod(ONE, i), 9376))
        .collect();
    let svc = svc.build();
    let name = svc.metadata.name.clone().unwrap_or_default();
    tb.api.apply(&svc);
    tb.api.apply(
        &slice(&format!("{name}-1"), &name)
            .port("http", 9376, "TCP")
            .endpoints((0..3).map(|i| endpoint(tb.pod(ONE, i).ip, "node1")))
            .build(),
    );
    AffinityCase {
        tb,
        _servers: servers,
    }
}

impl AffinityCase {
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
}

#[test]
fn should_have_session_affinity_work_for_service_with_type_clusterip() {
    let case = affinity_case(
        "affcip",
        service("affinity-clusterip", vip(20))
            .port("http", 80, "TCP")
            .client_ip_affinity(10_800),
    );
    let target = at(vip(20), 80);
    case.wait_programmed(target, Some(10_800));
    let first = case.check_affinity(case.exec(), target, true);
    // Later connections, by other processes of the same pod, keep the server.
    assert_eq!(case.check_affinity(case.exec(), target, true), first);
}

#[test]
fn should_have_session_affinity_timeout_work_for_service_with_type_clusterip() {
    let case = affinity_case(
        "affcipto",
        service("affinity-clusterip-timeout", vip(21))
            .port("http", 80, "TCP")
            .client_ip_affinity(1),
    );
    let target = at(vip(21), 80);
    case.wait_programmed(target, Some(1));
    case.check_timeout(case.exec(), target);
}

#[test]
fn should_be_able_to_switch_session_affinity_for_service_with_type_clusterip() {
    let svc = || service("affinity-clusterip-transition", vip(22)).port("http", 80, "TCP");
    let case = affinity_case("affcipsw", svc().client_ip_affinity(10_800));
    let target = at(vip(22), 80);
    case.wait_programmed(target, Some(10_800));
    case.check_affinity(case.exec(), target, true);
    case.tb.api.apply(&svc().build());
    case.wait_programmed(target, None);
    case.check_affinity(case.exec(), target, false);
    case.tb.api.apply(&svc().client_ip_affinity(10_800).build());
    case.wait_programmed(target, Some(10_800));
    case.check_affinity(case.exec(), target, true);
}

#[test]
fn should_have_session_affinity_work_for_nodeport_service() {
    let case = affinity_case(
        "affnp",
        service("affinity-nodeport", vip(23))
            .node_port("http", 80, "TCP", 30090)
            .client_ip_affinity(10_800),
    );
    let target = at(ONE.address(), 30090);
    case.wait_programmed(target, Some(10_800));
    // A pod connecting to its node's NodePort (socket hooks, keyed by the pod)...
    case.check_affinity(case.exec(), target, true);
    // ...and a client outside the cluster (TC, keyed by the client's address).
    case.check_affinity(At::Outside, target, true);
}

#[test]
fn should_have_session_affinity_timeout_work_for_nodeport_service() {
    let case = affinity_case(
        "affnpto",
        service("affinity-nodeport-timeout", vip(24))
            .node_port("http", 80, "TCP", 30091)
            .client_ip_affinity(1),
    );
    let target = at(ONE.address(), 30091);
    case.wait_programmed(target, Some(1));
    case.check_timeout(At::Outside, target);
}

#[test]
fn should_be_able_to_switch_session_affinity_for_nodeport_service() {
    let svc =
        || service("affinity-nodeport-transition", vip(25)).node_port("http", 80, "TCP", 30092);
    let case = affinity_case("affnpsw", svc().client_ip_affinity(10_800));
    let target = at(ONE.address(), 30092);
    case.wait_programmed(target, Some(10_800));
    case.check_affinity(At::Outside, target, true);
    case.tb.api.apply(&svc().build());
    case.wait_programmed(target, None);
    case.check_affinity(At::Outside, target, false);
    case.tb.api.apply(&svc().client_ip_affinity(10_800).build());
    case.wait_programmed(target, Some(10_800));
    case.check_affinity(At::Outside, target, true);
}

// ----------------------------------------------------------------------------------------
// Updates

#[test]
fn should_be_updated_after_adding_or_deleting_ports() {
    let tb = Testbed::new("editport", [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [tb.tcp_server(pod1, 100), tb.tcp_server(pod2, 101)];
    let one_port = || service("edit-port-test", vip(30)).port("portname1", 80, "TCP");
    let slice1 = slice("edit-port-test-1", "edit-port-test")
        .port("portname1", 100, "TCP")
        .endpoint(endpoint(pod1.ip, "node1"))
        .build();
    tb.api.apply(&one_port().build());
    tb.api.apply(&slice1);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(30), 80), &["pod11"]);
    assert_eq!(
        tb.probe(At::Pod(exec), "tcp", at(vip(30), 81), 1)[0]
            .error
            .as_deref(),
        Some("EINVAL"),
        "port 81 is not a port of the Service yet"
    );

    tb.api
        .apply(&one_port().port("portname2", 81, "TCP").build());
    tb.api.apply(
        &slice("edit-port-test-2", "edit-port-test")
            .port("portname2", 101, "TCP")
            .endpoint(endpoint(pod2.ip, "node1"))
            .build(),
    );
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(30), 81), &["pod12"]);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(30), 80), &["pod11"]);

    tb.api.apply(&one_port().build());
    tb.api
        .delete::<k8s_openapi::api::discovery::v1::EndpointSlice>(
            Some("default"),
            "edit-port-test-2",
        );
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(30), 81), &[NOT_SERVED]);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(30), 80), &["pod11"]);
}

#[test]
fn should_be_able_to_up_and_down_services() {
    let tb = Testbed::new("updown", [7, 0], &[ONE]);
    let _servers: Vec<NamedServer> = (0..6)
        .map(|i| tb.tcp_server(tb.pod(ONE, i), 9376))
        .collect();
    let exec = tb.pod(ONE, 6);
    // up-down-N: cluster IP 10.96.0.3N, served by pods 2N-1 and 2N of node1.
    let start = |n: u8| {
        let name = format!("up-down-{n}");
        tb.api
            .apply(&service(&name, vip(30 + n)).port("http", 80, "TCP").build());
        let first = usize::from(n - 1) * 2;
        tb.api.apply(
            &slice(&format!("{name}-1"), &name)
                .port("http", 9376, "TCP")
                .endpoints((first..first + 2).map(|i| endpoint(tb.pod(ONE, i).ip, "node1")))
                .build(),
        );
    };
    let up = |n: u8, expected: [&str; 2]| {
        // From a pod and from the host network, as the upstream test checks.
        for client in [At::Pod(exec), At::Host(ONE)] {
            wait_for(&tb, client, "tcp", at(vip(30 + n), 80), &expected);
        }
    };
    start(1);
    start(2);
    up(1, ["pod11", "pod12"]);
    up(2, ["pod13", "pod14"]);

    tb.api
        .delete::<k8s_openapi::api::core::v1::Service>(Some("default"), "up-down-1");
    tb.api
        .delete::<k8s_openapi::api::discovery::v1::EndpointSlice>(Some("default"), "up-down-1-1");
    wait_for(&tb, At::Host(ONE), "tcp", at(vip(31), 80), &[NOT_SERVED]);
    up(2, ["pod13", "pod14"]);

    start(3);
    up(2, ["pod13", "pod14"]);
    up(3, ["pod15", "pod16"]);
}

#[test]
fn should_work_after_the_service_has_been_recreated() {
    let tb = Testbed::new("recreate", [2, 0], &[ONE]);
    let (pod1, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _server = tb.tcp_server(pod1, 9376);
    let svc = |ip| {
        service("service-deletion", ip)
            .port("http", 80, "TCP")
            .build()
    };
    tb.api.apply(&svc(vip(40)));
    tb.api.apply(
        &slice("service-deletion-1", "service-deletion")
            .port("http", 9376, "TCP")
            .endpoint(endpoint(pod1.ip, "node1"))
            .build(),
    );
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(40), 80), &["pod11"]);

    tb.api
        .delete::<k8s_openapi::api::core::v1::Service>(Some("default"), "service-deletion");
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(40), 80), &[NOT_SERVED]);

    // Recreated, the API server allocates another cluster IP; the slice stayed.
    tb.api.apply(&svc(vip(41)));
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(41), 80), &["pod11"]);
    assert_eq!(curl_answer(&tb, At::Pod(exec), at(vip(41), 80)), "pod11");
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(40), 80), &[NOT_SERVED]);
}

// ----------------------------------------------------------------------------------------
// Addressing

#[test]
fn should_preserve_source_pod_ip_for_traffic_thru_service_cluster_ip() {
    let tb = Testbed::new("sourceip", [2, 1], &[ONE, TWO]);
    let (server, near, far) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(TWO, 0));
    let _server = tb.tcp_server(server, 8080);
    tb.api.apply(
        &service("sourceip-test", vip(50))
            .port("http", 8080, "TCP")
            .build(),
    );
    tb.api.apply(
        &slice("sourceip-test-1", "sourceip-test")
            .port("http", 8080, "TCP")
            .endpoint(endpoint(server.ip, "node1"))
            .build(),
    );
    let target = at(vip(50), 8080);
    // A client pod on the server's node and one on the other node.
    for client in [near, far] {
        wait_for(&tb, At::Pod(client), "tcp", target, &["pod11"]);
        let attempts = tb.probe(At::Pod(client), "tcp", target, 5);
        assert_eq!(
            seen_by_servers(&attempts),
            BTreeSet::from([client.ip.into()]),
            "the server must see {}'s address",
            client.name
        );
    }
}

#[test]
fn should_allow_pods_to_hairpin_back_to_themselves_through_services() {
    let tb = Testbed::new("hairpin", [1, 0], &[ONE]);
    let pod = tb.pod(ONE, 0);
    let _server = tb.tcp_server(pod, 8080);
    tb.api.apply(
        &service("hairpin-test", vip(51))
            .port("http", 8080, "TCP")
            .build(),
    );
    tb.api.apply(
        &slice("hairpin-test-1", "hairpin-test")
            .port("http", 8080, "TCP")
            .endpoint(endpoint(pod.ip, "node1"))
            .build(),
    );
    let target = at(vip(51), 8080);
    wait_for(&tb, At::Pod(pod), "tcp", target, &["pod11"]);
    assert_eq!(curl_answer(&tb, At::Pod(pod), target), "pod11");
    let attempts = tb.probe(At::Pod(pod), "tcp", target, 3);
    assert_eq!(seen_by_servers(&attempts), BTreeSet::from([pod.ip.into()]));
    for attempt in &attempts {
        assert_eq!(
            attempt.peer.as_deref(),
            Some("10.96.0.51:8080"),
            "{attempt:?}"
        );
    }
}

#[test]
fn should_be_possible_to_connect_to_a_service_via_externalip_when_the_external_ip_is_not_assigned_to_a_node()
 {
    let tb = Testbed::new("extip", [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [tb.tcp_server(pod1, 9376), tb.tcp_server(pod2, 9376)];
    let external_ip = Ipv4Addr::new(203, 0, 113, 250);
    tb.api.apply(
        &service("externalip-test", vip(52))
            .port("http", 80, "TCP")
            .external_ip(external_ip)
            .build(),
    );
    tb.api.apply(
        &slice("externalip-test-1", "externalip-test")
            .port("http", 9376, "TCP")
            .endpoint(endpoint(pod1.ip, "node1"))
            .endpoint(endpoint(pod2.ip, "node1"))
            .build(),
    );
    let both = ["pod11", "pod12"];
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(52), 80), &both);
    wait_for(&tb, At::Pod(exec), "tcp", at(external_ip, 80), &both);
    let name = curl_answer(&tb, At::Pod(exec), at(external_ip, 80));
    assert!(both.contains(&name.as_str()), "curl got {name}");
}

#[test]
fn should_be_able_to_update_service_type_to_nodeport_listening_on_same_port_number_but_different_protocols()
 {
    let tb = Testbed::new("npproto", [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [
        tb.tcp_server(pod1, 9376),
        tb.tcp_server(pod2, 9376),
        tb.udp_server(pod1, 9376),
        tb.udp_server(pod2, 9376),
    ];
    let both = ["pod11", "pod12"];
    tb.api.apply(
        &service("nodeport-update-service", vip(53))
            .port("tcp-port", 80, "TCP")
            .build(),
    );
    let endpoints = [endpoint(pod1.ip, "node1"), endpoint(pod2.ip, "node1")];
    tb.api.apply(
        &slice("nodeport-update-service-1", "nodeport-update-service")
            .port("tcp-port", 9376, "TCP")
            .endpoints(endpoints.clone())
            .build(),
    );
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(53), 80), &both);

    tb.api.apply(
        &service("nodeport-update-service", vip(53))
            .node_port("tcp-port", 80, "TCP", 30100)
            .build(),
    );
    wait_for(&tb, At::Pod(exec), "tcp", at(ONE.address(), 30100), &both);
    wait_for(&tb, At::Outside, "tcp", at(ONE.address(), 30100), &both);

    tb.api.apply(
        &service("nodeport-update-service", vip(53))
            .node_port("tcp-port", 80, "TCP", 30100)
            .node_port("udp-port", 80, "UDP", 30101)
            .build(),
    );
    tb.api.apply(
        &slice("nodeport-update-service-1", "nodeport-update-service")
            .port("tcp-port", 9376, "TCP")
            .port("udp-port", 9376, "UDP")
            .endpoints(endpoints)
            .build(),
    );
    for (mode, target) in [
        ("udp", at(vip(53), 80)),
        ("udp", at(ONE.address(), 30101)),
        ("tcp", at(vip(53), 80)),
        ("tcp", at(ONE.address(), 30100)),
    ] {
        wait_for(&tb, At::Pod(exec), mode, target, &both);
    }
    wait_for(&tb, At::Outside, "udp", at(ONE.address(), 30101), &both);
    wait_for(&tb, At::Outside, "tcp", at(ONE.address(), 30100), &both);
}

// ----------------------------------------------------------------------------------------
// No endpoints

#[test]
fn should_be_rejected_when_no_endpoints_exist() {
    let tb = Testbed::new("noeps", [1, 0], &[ONE]);
    let exec = tb.pod(ONE, 0);
    tb.api
        .apply(&service("no-pods", vip(60)).port("http", 80, "TCP").build());
    let before = no_backend(&tb, ONE);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(60), 80), &[REFUSED]);
    let refused = tb
        .curl(At::Pod(exec), at(vip(60), 80))
        .expect_err("curl must fail");
    assert!(refused.contains("Couldn't connect"), "curl: {refused}");
    assert!(
        no_backend(&tb, ONE) > before,
        "the refusals were socklb's (no_backend counter)"
    );
}

#[test]
fn should_be_rejected_for_evicted_pods_no_endpoints_exist() {
    let tb = Testbed::new("evicted", [2, 0], &[ONE]);
    let (evicted, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _server = tb.tcp_server(evicted, 80);
    // publishNotReadyAddresses, to cover that edge too.
    tb.api.apply(
        &service("evicted-pods", vip(61))
            .port("http", 80, "TCP")
            .publish_not_ready_addresses()
            .build(),
    );
    let endpoints = |pods: &[&Pod]| {
        slice("evicted-pods-1", "evicted-pods")
            .port("http", 80, "TCP")
            .endpoints(pods.iter().map(|p| endpoint(p.ip, "node1")))
            .build()
    };
    tb.api.apply(&endpoints(&[evicted]));
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(61), 80), &["pod11"]);
    // Evicted (phase Failed): the EndpointSlice controller removes the pod's endpoint, and
    // the slice stays, empty. The pod's address still answers (its server runs on).
    tb.api.apply(&endpoints(&[]));
    let before = no_backend(&tb, ONE);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(61), 80), &[REFUSED]);
    assert!(no_backend(&tb, ONE) > before);
}

// ----------------------------------------------------------------------------------------
// Not ready endpoints

/// A NodePort Service whose only endpoint, pod11 on node1, is deleted and fails its
/// readiness probe (neither ready nor serving, terminating); the client pod is on node2.
fn terminating_unready_case(
    tag: &str,
    ip: Ipv4Addr,
    node_port: u16,
    publish: bool,
) -> TerminatingCase {
    let svc = service("svc-tolerate-unready", ip).node_port("http", 80, "TCP", node_port);
    let svc = if publish {
        svc.publish_not_ready_addresses()
    } else {
        svc
    };
    let tb = Testbed::new(tag, [1, 1], &[ONE, TWO]);
    let server = tb.tcp_server(tb.pod(ONE, 0), 80);
    tb.api.apply(&svc.build());
    let endpoints = |e| {
        slice("svc-tolerate-unready-1", "svc-tolerate-unready")
            .port("http", 80, "TCP")
            .endpoint(e)
            .build()
    };
    let ready = endpoint(tb.pod(ONE, 0).ip, "node1");
    tb.api.apply(&endpoints(ready.clone()));
    wait_for(&tb, At::Pod(tb.pod(TWO, 0)), "tcp", at(ip, 80), &["pod11"]);
    tb.synced(|| {
        tb.api.apply(&endpoints(terminating_unready(ready)));
    });
    TerminatingCase {
        tb,
        _server: server,
    }
}

#[test]
fn should_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_true()
 {
    let case = terminating_unready_case("pnratrue", vip(95), 30113, true);
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

#[test]
fn should_not_be_able_to_connect_to_terminating_and_unready_endpoints_if_publishnotreadyaddresses_is_false()
 {
    let case = terminating_unready_case("pnrafalse", vip(96), 30114, false);
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

#[test]
fn should_create_endpoints_for_unready_pods() {
    let tb = Testbed::new("unready", [2, 0], &[ONE]);
    let (server, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
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
    wait_for(&tb, At::Pod(exec), "tcp", target, &["pod11"]);
    // Scaled to zero: the pod terminates slowly (a long preStop hook).
    let gone = terminating_unready(endpoint(server.ip, "node1"));
    tb.api.apply(&endpoints(gone.clone()));
    tb.api.apply(&svc(false));
    wait_for(&tb, At::Pod(exec), "tcp", target, &[REFUSED]);
    tb.api.apply(&svc(true));
    wait_for(&tb, At::Pod(exec), "tcp", target, &["pod11"]);
}

// ----------------------------------------------------------------------------------------
// Labels

/// `label` on a Service turns it off for every proxy: one Service has it from the start and
/// is never served; another gains it (off), then loses it (served again).
fn label_turns_proxying_off(tag: &str, label: &str, value: &str) {
    let tb = Testbed::new(tag, [5, 0], &[ONE]);
    let _servers: Vec<NamedServer> = (0..4)
        .map(|i| tb.tcp_server(tb.pod(ONE, i), 9376))
        .collect();
    let exec = At::Pod(tb.pod(ONE, 4));
    let svc = |name: &str, ip, labelled: bool| {
        let svc = service(name, ip).port("http", 80, "TCP");
        if labelled {
            svc.label(label, value).build()
        } else {
            svc.build()
        }
    };
    // The EndpointSlice controller copies the Service's labels to its slices.
    let slice_of = |name: &str, first: usize, labelled: bool| {
        let mut s = slice(&format!("{name}-1"), name)
            .port("http", 9376, "TCP")
            .endpoints((first..first + 2).map(|i| endpoint(tb.pod(ONE, i).ip, "node1")))
            .build();
        if labelled {
            s.metadata
                .labels
                .get_or_insert_with(Default::default)
                .insert(label.to_owned(), value.to_owned());
        }
        s
    };
    tb.api.apply(&svc("service-disabled", vip(70), true));
    tb.api.apply(&slice_of("service-disabled", 0, true));
    tb.api.apply(&svc("service-toggled", vip(71), false));
    tb.api.apply(&slice_of("service-toggled", 2, false));
    let toggled = at(vip(71), 80);
    let disabled = at(vip(70), 80);
    wait_for(&tb, exec, "tcp", toggled, &["pod13", "pod14"]);
    wait_for(&tb, exec, "tcp", disabled, &[NOT_SERVED]);

    tb.api.apply(&svc("service-toggled", vip(71), true));
    tb.api.apply(&slice_of("service-toggled", 2, true));
    wait_for(&tb, exec, "tcp", toggled, &[NOT_SERVED]);

    tb.api.apply(&svc("service-toggled", vip(71), false));
    tb.api.apply(&slice_of("service-toggled", 2, false));
    wait_for(&tb, exec, "tcp", toggled, &["pod13", "pod14"]);
    wait_for(&tb, exec, "tcp", disabled, &[NOT_SERVED]);
    assert!(
        tb.inspect(ONE, Some(vip(70))).frontends.is_empty(),
        "the labelled Service was never programmed"
    );
}

#[test]
fn should_implement_service_kubernetes_io_service_proxy_name() {
    label_turns_proxying_off(
        "proxyname",
        "service.kubernetes.io/service-proxy-name",
        "foo-bar",
    );
}

#[test]
fn should_implement_service_kubernetes_io_headless() {
    label_turns_proxying_off("headless", "service.kubernetes.io/headless", "");
}

// ----------------------------------------------------------------------------------------
// Traffic policy

/// Clients on the endpoint's node reach it; clients on the other node are refused by their
/// own node's socklb (kube-proxy drops instead).
fn check_local_only(tb: &Testbed, target: SocketAddrV4, near: At, far: At, server: &str) {
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

fn local_policy_service(
    name: &str,
    ip: Ipv4Addr,
    port: u16,
) -> k8s_openapi::api::core::v1::Service {
    service(name, ip)
        .port("http", port, "TCP")
        .internal_traffic_policy("Local")
        .build()
}

#[test]
fn should_respect_internaltrafficpolicy_local_pod_to_pod() {
    let tb = Testbed::new("itppod", [2, 1], &[ONE, TWO]);
    let (server, near, far) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(TWO, 0));
    let _server = tb.tcp_server(server, 80);
    tb.api.apply(&local_policy_service("svc-itp", vip(80), 80));
    tb.api.apply(
        &slice("svc-itp-1", "svc-itp")
            .port("http", 80, "TCP")
            .endpoint(endpoint(server.ip, "node1"))
            .build(),
    );
    check_local_only(&tb, at(vip(80), 80), At::Pod(near), At::Pod(far), "pod11");
}

#[test]
fn should_respect_internaltrafficpolicy_local_pod_hostnetwork_true_to_pod() {
    let tb = Testbed::new("itphost", [1, 0], &[ONE, TWO]);
    let server = tb.pod(ONE, 0);
    let _server = tb.tcp_server(server, 8000);
    tb.api
        .apply(&local_policy_service("svc-itp", vip(81), 8000));
    tb.api.apply(
        &slice("svc-itp-1", "svc-itp")
            .port("http", 8000, "TCP")
            .endpoint(endpoint(server.ip, "node1"))
            .build(),
    );
    check_local_only(
        &tb,
        at(vip(81), 8000),
        At::Host(ONE),
        At::Host(TWO),
        "pod11",
    );
}

#[test]
fn should_respect_internaltrafficpolicy_local_pod_and_node_to_pod_hostnetwork_true() {
    let tb = Testbed::new("itphostep", [1, 1], &[ONE, TWO]);
    // The endpoint is a hostNetwork pod on node1: the node's address.
    let _server = NamedServer::tcp_replying("node1", at(ONE.address(), 10180), "node1 {peer}");
    tb.api.apply(&local_policy_service("svc-itp", vip(82), 80));
    tb.api.apply(
        &slice("svc-itp-1", "svc-itp")
            .port("http", 10180, "TCP")
            .endpoint(endpoint(ONE.address(), "node1"))
            .build(),
    );
    let target = at(vip(82), 80);
    check_local_only(
        &tb,
        target,
        At::Pod(tb.pod(ONE, 0)),
        At::Pod(tb.pod(TWO, 0)),
        "node1",
    );
    check_local_only(&tb, target, At::Host(ONE), At::Host(TWO), "node1");
}

// ----------------------------------------------------------------------------------------
// Terminating endpoints

/// One server pod on node1, a client pod on each node, and `svc` whose only endpoint is
/// the server; the server then starts terminating (it keeps serving in its grace period).
struct TerminatingCase {
    tb: Testbed,
    _server: NamedServer,
}

fn terminating_case(tag: &str, svc: k8s_openapi::api::core::v1::Service) -> TerminatingCase {
    let tb = Testbed::new(tag, [2, 1], &[ONE, TWO]);
    let server = tb.tcp_server(tb.pod(ONE, 0), 80);
    let name = svc.metadata.name.clone().unwrap_or_default();
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
    let ip = svc_cluster_ip(&svc);
    wait_for(&tb, At::Pod(tb.pod(ONE, 1)), "tcp", at(ip, 80), &["pod11"]);
    // Same backend before and after: wait for the agents to have programmed the change.
    tb.synced(|| {
        tb.api.apply(&endpoints(terminating(ready)));
    });
    TerminatingCase {
        tb,
        _server: server,
    }
}

fn svc_cluster_ip(svc: &k8s_openapi::api::core::v1::Service) -> Ipv4Addr {
    svc.spec
        .as_ref()
        .and_then(|spec| spec.cluster_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .expect("a Service with a cluster IP")
}

impl TerminatingCase {
    fn near(&self) -> At<'_> {
        At::Pod(self.tb.pod(ONE, 1))
    }

    fn far(&self) -> At<'_> {
        At::Pod(self.tb.pod(TWO, 0))
    }
}

#[test]
fn should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_internaltrafficpolicy_cluster()
 {
    let case = terminating_case(
        "termitpc",
        service("svc-proxy-terminating", vip(90))
            .port("http", 80, "TCP")
            .build(),
    );
    let target = at(vip(90), 80);
    for client in [case.near(), case.far()] {
        wait_for(&case.tb, client, "tcp", target, &["pod11"]);
    }
    for _ in 0..5 {
        for client in [case.near(), case.far()] {
            assert_eq!(curl_answer(&case.tb, client, target), "pod11");
        }
    }
    let shown = case.tb.inspect(TWO, Some(vip(90)));
    assert_eq!(shown.frontends.len(), 1, "{shown:?}");
}

#[test]
fn should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_internaltrafficpolicy_local()
 {
    let case = terminating_case(
        "termitpl",
        local_policy_service("svc-proxy-terminating", vip(91), 80),
    );
    check_local_only(&case.tb, at(vip(91), 80), case.near(), case.far(), "pod11");
}

#[test]
fn should_fallback_to_terminating_endpoints_when_there_are_no_ready_endpoints_with_externaltrafficpolicy_cluster()
 {
    let case = terminating_case(
        "termetpc",
        service("svc-proxy-terminating", vip(92))
            .node_port("http", 80, "TCP", 30110)
            .build(),
    );
    let node_port = at(ONE.address(), 30110);
    // The node's own pod (socket hooks) and a pod on the other node, whose traffic arrives
    // at node1 from outside (TC, externalTrafficPolicy Cluster).
    for client in [case.near(), case.far()] {
        wait_for(&case.tb, client, "tcp", node_port, &["pod11"]);
    }
    for _ in 0..5 {
        for client in [case.near(), case.far()] {
            assert_eq!(curl_answer(&case.tb, client, node_port), "pod11");
        }
    }
}

#[test]
fn should_fallback_to_local_terminating_endpoints_when_there_are_no_ready_endpoints_with_externaltrafficpolicy_local()
 {
    let case = terminating_case(
        "termetpl",
        service("svc-proxy-terminating", vip(93))
            .node_port("http", 80, "TCP", 30111)
            .external_traffic_policy("Local")
            .build(),
    );
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

#[test]
fn should_fail_health_check_node_port_if_there_are_only_terminating_endpoints() {
    let tb = Testbed::new("termhc", [2, 0], &[ONE]);
    let (server, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _server = tb.tcp_server(server, 80);
    tb.api.apply(
        &service("svc-proxy-terminating", vip(94))
            .node_port("http", 80, "TCP", 30112)
            .external_traffic_policy("Local")
            .load_balancer(Some(30212))
            .build(),
    );
    let endpoints = |e| {
        slice("svc-proxy-terminating-1", "svc-proxy-terminating")
            .port("http", 80, "TCP")
            .endpoint(e)
            .build()
    };
    let ready = endpoint(server.ip, "node1");
    tb.api.apply(&endpoints(ready.clone()));
    // curl in the client pod, to the node's healthCheckNodePort (the agent answers it).
    let health = || {
        let output = tb
            .command(At::Pod(exec), "curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "2"])
            .arg(format!("http://{}:30212/healthz", ONE.address()))
            .output()
            .expect("prerequisite missing: curl");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    tb.eventually(
        "the health check passes with a ready endpoint",
        || match health() {
            code if code == "200" => Ok(()),
            code => Err(code),
        },
    );
    tb.api.apply(&endpoints(terminating(ready)));
    tb.eventually(
        "the health check fails with only a terminating one",
        || match health() {
            code if code == "503" => Ok(()),
            code => Err(code),
        },
    );
    // ...while the terminating endpoint still serves the NodePort.
    assert_eq!(
        curl_answer(&tb, At::Pod(exec), at(ONE.address(), 30112)),
        "pod11"
    );
}

// ----------------------------------------------------------------------------------------
// Conntrack

/// dig from `at`, always from source port 12345 (one flow to conntrack, as upstream's
/// `nc -p 12345`): the address the DNS server answered, or dig's complaint.
fn dig_from_fixed_port(tb: &Testbed, at: At, source: Ipv4Addr, server: SocketAddrV4) -> String {
    let output = tb
        .command(at, "dig")
        .args([
            "-b",
            &format!("{source}#12345"),
            &format!("@{}", server.ip()),
            "-p",
            &server.port().to_string(),
            "who.test",
            "A",
            "+short",
            "+time=1",
            "+tries=1",
        ])
        .output()
        .expect("prerequisite missing: dig (apt-get install bind9-dnsutils; ./x setup does)");
    let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if text.is_empty() {
        format!(
            "no answer: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
    } else {
        text
    }
}

/// A DNS server (dnsmasq) in `pod` answering `who.test` with `answer`.
fn dns_server(pod: &Pod, answer: Ipv4Addr) -> Dnsmasq {
    pod.netns.enter(|| Dnsmasq::start(pod.ip, answer))
}

/// A client sends UDP from one source port to `target` the whole time; the server pod
/// behind it is replaced (a second one added, the first deleted); the client's datagrams
/// reach the new one.
fn udp_through_server_cycle(
    tb: &Testbed,
    client: &Pod,
    servers: [&Pod; 2],
    node: &str,
    target: SocketAddrV4,
    service_name: &str,
) {
    let answers = [Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2)];
    let endpoints = |pods: &[&Pod]| {
        slice(&format!("{service_name}-1"), service_name)
            .port("udp", 53, "UDP")
            .endpoints(pods.iter().map(|p| endpoint(p.ip, node)))
            .build()
    };
    let dig = || dig_from_fixed_port(tb, At::Pod(client), client.ip, target);
    let first = dns_server(servers[0], answers[0]);
    tb.api.apply(&endpoints(&[servers[0]]));
    tb.eventually("the client reaches server 1", || match dig() {
        answer if answer == answers[0].to_string() => Ok(()),
        other => Err(other),
    });

    let _second = dns_server(servers[1], answers[1]);
    tb.api.apply(&endpoints(&[servers[0], servers[1]]));
    tb.api.apply(&endpoints(&[servers[1]]));
    drop(first);
    tb.eventually("the same flow reaches server 2", || match dig() {
        answer if answer == answers[1].to_string() => Ok(()),
        other => Err(other),
    });
    for _ in 0..3 {
        assert_eq!(dig(), answers[1].to_string());
    }
}

#[test]
fn should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_nodeport_service() {
    // The client pod on node2 sends to node1's NodePort; the servers run on node1.
    let tb = Testbed::new("udpcyclenp", [2, 1], &[ONE, TWO]);
    tb.api.apply(
        &service("svc-udp", vip(100))
            .node_port("udp", 53, "UDP", 30053)
            .build(),
    );
    udp_through_server_cycle(
        &tb,
        tb.pod(TWO, 0),
        [tb.pod(ONE, 0), tb.pod(ONE, 1)],
        "node1",
        at(ONE.address(), 30053),
        "svc-udp",
    );
}

#[test]
fn should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service() {
    // The client pod on node1, the servers on node2.
    let tb = Testbed::new("udpcyclecip", [1, 2], &[ONE, TWO]);
    tb.api
        .apply(&service("svc-udp", vip(101)).port("udp", 53, "UDP").build());
    udp_through_server_cycle(
        &tb,
        tb.pod(ONE, 0),
        [tb.pod(TWO, 0), tb.pod(TWO, 1)],
        "node2",
        at(vip(101), 53),
        "svc-udp",
    );
}

#[test]
fn should_be_able_to_preserve_udp_traffic_when_initial_unready_endpoints_get_ready() {
    let tb = Testbed::new("udpunready", [1, 1], &[ONE, TWO]);
    let (client, server) = (tb.pod(ONE, 0), tb.pod(TWO, 0));
    let answer = Ipv4Addr::new(192, 0, 2, 3);
    let _dns = dns_server(server, answer);
    tb.api
        .apply(&service("svc-udp", vip(102)).port("udp", 53, "UDP").build());
    let endpoints = |e| {
        slice("svc-udp-1", "svc-udp")
            .port("udp", 53, "UDP")
            .endpoint(e)
            .build()
    };
    // The pod exists (its address is in the slice) but is not ready: its init container runs.
    tb.api
        .apply(&endpoints(not_ready(endpoint(server.ip, "node2"))));
    let target = at(vip(102), 53);
    let dig = || dig_from_fixed_port(&tb, At::Pod(client), client.ip, target);
    tb.eventually("not ready: refused", || match dig() {
        answer if answer.contains("refused") => Ok(()),
        other => Err(other),
    });
    tb.api.apply(&endpoints(endpoint(server.ip, "node2")));
    tb.eventually("ready: the same flow is answered", || match dig() {
        got if got == answer.to_string() => Ok(()),
        other => Err(other),
    });
    for _ in 0..3 {
        assert_eq!(dig(), answer.to_string());
    }
}

#[test]
fn should_drop_invalid_conntrack_entries() {
    let tb = Testbed::new("invalid", [1, 1], &[ONE, TWO]);
    let server = tb.pod(ONE, 0);
    let boom = BoomServer::start(&server.netns, at(server.ip, 9000));
    tb.api.apply(
        &service("boom-server", vip(103))
            .node_port("tcp", 9000, "TCP", 30900)
            .build(),
    );
    tb.api.apply(
        &slice("boom-server-1", "boom-server")
            .port("tcp", 9000, "TCP")
            .endpoint(endpoint(server.ip, "node1"))
            .build(),
    );
    // A client pod on the other node through the cluster IP (socket translation), and the
    // outside client through the NodePort (TC): every connection gets an out-of-window
    // segment from the server, and must answer it with an ACK, not a RST.
    let client = tb.pod(TWO, 0);
    for (from, target) in [
        (At::Pod(client), at(vip(103), 9000)),
        (At::Outside, at(ONE.address(), 30900)),
    ] {
        wait_for(&tb, from, "tcp", target, &["boom-server"]);
        for attempt in tb.probe(from, "tcp", target, 5) {
            assert_eq!(
                attempt.reply.as_deref(),
                Some("boom-server Ack"),
                "{target}: {attempt:?}"
            );
        }
    }
    let reactions = boom.reactions();
    let clients: BTreeSet<Ipv4Addr> = reactions.iter().map(|(peer, _)| *peer.ip()).collect();
    assert_eq!(
        clients,
        BTreeSet::from([client.ip, socklb_tests::testbed::CLIENT])
    );
    for (peer, reaction) in &reactions {
        assert_eq!(*reaction, Reaction::Ack, "the client at {peer}");
    }
}

// ----------------------------------------------------------------------------------------
// EndpointSlices

#[test]
fn should_support_a_service_with_multiple_ports_specified_in_multiple_endpointslices() {
    let tb = Testbed::new("slicesports", [2, 0], &[ONE]);
    let (server, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _servers = [
        NamedServer::tcp_in(&server.netns, "pod11:8090", at(server.ip, 8090)),
        NamedServer::tcp_in(&server.netns, "pod11:9090", at(server.ip, 9090)),
    ];
    tb.api.apply(
        &service("example-custom-endpoints", vip(110))
            .port("port80", 80, "TCP")
            .port("port81", 81, "TCP")
            .build(),
    );
    for (name, port_name, port) in [
        ("e2e-custom-slice1", "port80", 8090),
        ("e2e-custom-slice2", "port81", 9090),
    ] {
        tb.api.apply(
            &slice(name, "example-custom-endpoints")
                .port(port_name, port, "TCP")
                .endpoint(endpoint(server.ip, "node1"))
                .build(),
        );
    }
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(110), 80), &["pod11:8090"]);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(110), 81), &["pod11:9090"]);
}

#[test]
fn should_support_a_service_with_multiple_endpoint_ips_specified_in_multiple_endpointslices() {
    let tb = Testbed::new("slicesips", [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [tb.tcp_server(pod1, 8090), tb.tcp_server(pod2, 8090)];
    tb.api.apply(
        &service("example-custom-endpoints", vip(111))
            .port("port80", 80, "TCP")
            .port("port81", 81, "TCP")
            .build(),
    );
    for (name, port_name, pod) in [
        ("e2e-custom-slice1", "port80", pod1),
        ("e2e-custom-slice2", "port81", pod2),
    ] {
        tb.api.apply(
            &slice(name, "example-custom-endpoints")
                .port(port_name, 8090, "TCP")
                .endpoint(endpoint(pod.ip, "node1"))
                .build(),
        );
    }
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(111), 80), &["pod11"]);
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(111), 81), &["pod12"]);
}

// ----------------------------------------------------------------------------------------
// trafficDistribution (through the hints the EndpointSlice controller writes for it)

#[test]
fn should_route_traffic_to_an_endpoint_in_the_same_zone_when_using_prefersamezone() {
    // node1 in zone-a and node2 in zone-b each have an endpoint and a client.
    let tb = Testbed::new("samezone", [2, 2], &[ONE, TWO]);
    let (server1, client1) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let (server2, client2) = (tb.pod(TWO, 0), tb.pod(TWO, 1));
    let _servers = [tb.tcp_server(server1, 9376), tb.tcp_server(server2, 9376)];
    tb.api.apply(
        &service("traffic-dist-test-service", vip(120))
            .port("http", 80, "TCP")
            .traffic_distribution("PreferSameZone")
            .build(),
    );
    tb.api.apply(
        &slice("traffic-dist-test-service-1", "traffic-dist-test-service")
            .port("http", 9376, "TCP")
            .endpoint(hinted(endpoint(server1.ip, "node1"), "zone-a", false))
            .endpoint(hinted(endpoint(server2.ip, "node2"), "zone-b", false))
            .build(),
    );
    let target = at(vip(120), 80);
    wait_for(&tb, At::Pod(client1), "tcp", target, &pod_names(&[server1]));
    wait_for(&tb, At::Pod(client2), "tcp", target, &pod_names(&[server2]));

    // node2 moves to zone-c, where no endpoint is: its clients use every endpoint.
    tb.api.apply(&node("node2", "zone-c", TWO.address()));
    wait_for(
        &tb,
        At::Pod(client2),
        "tcp",
        target,
        &pod_names(&[server1, server2]),
    );
    wait_for(&tb, At::Pod(client1), "tcp", target, &pod_names(&[server1]));
}

#[test]
fn should_route_traffic_to_an_endpoint_on_the_same_node_or_fall_back_to_same_zone_when_using_prefersamenode()
 {
    // node1 and node2 in zone-a, each with an endpoint and a client; a third endpoint on
    // node3 in zone-b (a Node without an agent; its pod's namespace hangs off node2's
    // bridge, which only the network sees).
    let tb = Testbed::new("samenode", [2, 3], &[ONE, TWO]);
    let (server1, client1) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let (server2, server3, client2) = (tb.pod(TWO, 0), tb.pod(TWO, 1), tb.pod(TWO, 2));
    let _servers = [
        tb.tcp_server(server1, 9376),
        tb.tcp_server(server2, 9376),
        tb.tcp_server(server3, 9376),
    ];
    tb.api.apply(&node("node2", "zone-a", TWO.address()));
    tb.api
        .apply(&node("node3", "zone-b", Ipv4Addr::new(10, 77, 0, 3)));
    tb.api.apply(
        &service("traffic-dist-test-service", vip(121))
            .port("http", 80, "TCP")
            .traffic_distribution("PreferSameNode")
            .build(),
    );
    let endpoints = |with_server2: bool| {
        let mut s = slice("traffic-dist-test-service-1", "traffic-dist-test-service")
            .port("http", 9376, "TCP")
            .endpoint(hinted(endpoint(server1.ip, "node1"), "zone-a", true))
            .endpoint(hinted(endpoint(server3.ip, "node3"), "zone-b", true));
        if with_server2 {
            s = s.endpoint(hinted(endpoint(server2.ip, "node2"), "zone-a", true));
        }
        s.build()
    };
    let target = at(vip(121), 80);
    tb.api.apply(&endpoints(true));
    wait_for(&tb, At::Pod(client1), "tcp", target, &pod_names(&[server1]));
    wait_for(&tb, At::Pod(client2), "tcp", target, &pod_names(&[server2]));

    // node2's endpoint goes: its clients fall back to the same zone (node1's), not node3's.
    tb.api.apply(&endpoints(false));
    wait_for(&tb, At::Pod(client2), "tcp", target, &pod_names(&[server1]));
    wait_for(&tb, At::Pod(client1), "tcp", target, &pod_names(&[server1]));

    // node2 moves to a zone without endpoints: every endpoint.
    tb.api.apply(&node("node2", "zone-c", TWO.address()));
    wait_for(
        &tb,
        At::Pod(client2),
        "tcp",
        target,
        &pod_names(&[server1, server3]),
    );
}
