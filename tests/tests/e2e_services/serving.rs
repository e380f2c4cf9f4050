//! Serving (upstream `service.go`): a Service's endpoints answer through its cluster IP as
//! pods come and go, with several ports, with one port number for TCP and UDP, and through
//! every node's NodePort.
use socklb_tests::{
    NamedServer,
    cluster::{ServiceBuilder, endpoint, service, slice},
    testbed::{At, Pod, PodPath, Testbed},
};

use crate::scenario::{ONE, REFUSED, TWO, assert_pods_path, at, curl_answer, vip, wait_for};

socklb_tests::for_each_pod_path!(
    should_serve_a_basic_endpoint_from_pods,
    should_serve_multiport_endpoints_from_pods,
    should_serve_endpoints_on_same_port_and_different_protocols,
    should_serve_endpoints_on_same_port_and_different_protocol_for_internal_traffic_on_type_loadbalancer,
    should_be_able_to_create_a_functioning_nodeport_service,
);

fn should_serve_a_basic_endpoint_from_pods(path: PodPath) {
    let tb = Testbed::new("basic", path, [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [tb.tcp_server(pod1, 80), tb.tcp_server(pod2, 80)];
    let target = at(vip(10), 80);
    let client = At::Pod(exec);
    let name = "endpoint-test2";
    tb.serve(
        service(name, vip(10)).port("http", 80, "TCP"),
        ("http", 80, "TCP"),
        &[],
    );
    wait_for(&tb, client, "tcp", target, &[REFUSED]);

    // Pods come and go; the answers follow them.
    for pods in [&[pod1][..], &[pod1, pod2], &[pod2], &[]] {
        tb.set_endpoints(name, ("http", 80, "TCP"), pods);
        let names: Vec<&str> = pods.iter().map(|pod| pod.name.as_str()).collect();
        let expected = if names.is_empty() {
            vec![REFUSED]
        } else {
            names
        };
        wait_for(&tb, client, "tcp", target, &expected);
        if let [pod] = pods {
            assert_eq!(curl_answer(&tb, client, target), pod.name);
        }
    }
    assert_pods_path(&tb, ONE);
}

fn should_serve_multiport_endpoints_from_pods(path: PodPath) {
    let tb = Testbed::new("multiport", path, [3, 0], &[ONE]);
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
    let endpoints = |number: u8, port: u16, pods: &[&Pod]| {
        let (name, port_name) = (
            format!("multi-endpoint-test-{number}"),
            format!("portname{number}"),
        );
        tb.set_slice(
            &name,
            "multi-endpoint-test",
            (&port_name, port, "TCP"),
            pods,
        );
    };
    let (client, svc1, svc2) = (At::Pod(exec), at(vip(11), 80), at(vip(11), 81));
    endpoints(1, 100, &[pod1]);
    endpoints(2, 101, &[pod2]);
    wait_for(&tb, client, "tcp", svc1, &["pod11"]);
    wait_for(&tb, client, "tcp", svc2, &["pod12"]);
    assert_eq!(curl_answer(&tb, client, svc2), "pod12");

    endpoints(1, 100, &[]);
    wait_for(&tb, client, "tcp", svc1, &[REFUSED]);
    wait_for(&tb, client, "tcp", svc2, &["pod12"]);

    endpoints(2, 101, &[]);
    wait_for(&tb, client, "tcp", svc2, &[REFUSED]);
}

/// A TCP and a UDP server on port 80 of node1's first pod, the Service of `ports` (port 80
/// named tcp-port and udp-port) on cluster IP `vip(host)` with that pod as its endpoint,
/// and a client in node1's second pod that reaches it over TCP, UDP and connected UDP; the
/// cluster and the servers.
fn serves_tcp_and_udp_on_one_port(
    (tag, path): (&str, PodPath),
    ports: ServiceBuilder,
    host: u8,
) -> (Testbed, [NamedServer; 2]) {
    let tb = Testbed::new(tag, path, [2, 0], &[ONE]);
    let (server, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let servers = [tb.tcp_server(server, 80), tb.udp_server(server, 80)];
    let svc = ports.build();
    let name = svc.metadata.name.clone().unwrap_or_default();
    tb.api.apply(&svc);
    tb.api.apply(
        &slice(&format!("{name}-1"), &name)
            .port("tcp-port", 80, "TCP")
            .port("udp-port", 80, "UDP")
            .endpoint(endpoint(server.ip, "node1"))
            .build(),
    );
    let target = at(vip(host), 80);
    for mode in ["tcp", "udp", "udp-connected"] {
        wait_for(&tb, At::Pod(exec), mode, target, &["pod11"]);
    }
    (tb, servers)
}

fn should_serve_endpoints_on_same_port_and_different_protocols(path: PodPath) {
    let ports = service("same-port-protocols", vip(12))
        .port("tcp-port", 80, "TCP")
        .port("udp-port", 80, "UDP");
    let (tb, _servers) = serves_tcp_and_udp_on_one_port(("sameport", path), ports, 12);
    let (exec, target) = (At::Pod(tb.pod(ONE, 1)), at(vip(12), 80));
    assert_eq!(curl_answer(&tb, exec, target), "pod11");
    // Replies come back from the VIP, which is what UDP clients check.
    for attempt in tb.probe(exec, "udp", target, 3) {
        assert_eq!(
            attempt.peer.as_deref(),
            Some("10.96.0.12:80"),
            "{attempt:?}"
        );
    }
}

fn should_serve_endpoints_on_same_port_and_different_protocol_for_internal_traffic_on_type_loadbalancer(
    path: PodPath,
) {
    let ports = service("lb-same-port-protocols", vip(17))
        .node_port("tcp-port", 80, "TCP", 30140)
        .node_port("udp-port", 80, "UDP", 30141)
        .load_balancer(None);
    serves_tcp_and_udp_on_one_port(("lbproto", path), ports, 17);
}

fn should_be_able_to_create_a_functioning_nodeport_service(path: PodPath) {
    let tb = Testbed::new("nodeport", path, [2, 1], &[ONE, TWO]);
    let (pod11, exec, pod21) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(TWO, 0));
    let _servers = [tb.tcp_server(pod11, 9376), tb.tcp_server(pod21, 9376)];
    let svc = service("nodeport-test", vip(13)).node_port("http", 80, "TCP", 30080);
    tb.serve(svc, ("http", 9376, "TCP"), &[pod11, pod21]);
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
