//! Addressing (upstream `service.go`): the source address a server sees through a cluster
//! IP, a pod reaching itself through its Service, an externalIP no node holds, and a
//! NodePort that one port number serves over both protocols.
use std::{collections::BTreeSet, net::Ipv4Addr};

use socklb_tests::{
    cluster::{endpoint, service, slice},
    testbed::{At, PodPath, Testbed},
};

use crate::scenario::{
    ONE, TWO, assert_pods_path, at, curl_answer, seen_by_servers, vip, wait_for,
};

socklb_tests::for_each_pod_path!(
    should_preserve_source_pod_ip_for_traffic_thru_service_cluster_ip,
    should_allow_pods_to_hairpin_back_to_themselves_through_services,
    should_be_possible_to_connect_to_a_service_via_externalip_when_the_external_ip_is_not_assigned_to_a_node,
    should_be_able_to_update_service_type_to_nodeport_listening_on_same_port_number_but_different_protocols,
);

fn should_preserve_source_pod_ip_for_traffic_thru_service_cluster_ip(path: PodPath) {
    let tb = Testbed::new("sourceip", path, [2, 1], &[ONE, TWO]);
    let (server, near, far) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(TWO, 0));
    let _server = tb.tcp_server(server, 8080);
    let svc = service("sourceip-test", vip(50)).port("http", 8080, "TCP");
    tb.serve(svc, ("http", 8080, "TCP"), &[server]);
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
    assert_pods_path(&tb, ONE);
    assert_pods_path(&tb, TWO);
}

fn should_allow_pods_to_hairpin_back_to_themselves_through_services(path: PodPath) {
    let tb = Testbed::new("hairpin", path, [1, 0], &[ONE]);
    let pod = tb.pod(ONE, 0);
    let _server = tb.tcp_server(pod, 8080);
    let svc = service("hairpin-test", vip(51)).port("http", 8080, "TCP");
    tb.serve(svc, ("http", 8080, "TCP"), &[pod]);
    let target = at(vip(51), 8080);
    wait_for(&tb, At::Pod(pod), "tcp", target, &["pod11"]);
    assert_eq!(curl_answer(&tb, At::Pod(pod), target), "pod11");
    let attempts = tb.probe(At::Pod(pod), "tcp", target, 3);
    // Its socket connects to itself; the per-packet path SNATs the flow to the node, as
    // kube-proxy masquerades it (the pod would drop a packet from its own address).
    let source = match path {
        PodPath::SocketLb => pod.ip,
        PodPath::PerPacket => ONE.address(),
    };
    assert_eq!(seen_by_servers(&attempts), BTreeSet::from([source.into()]));
    for attempt in &attempts {
        assert_eq!(
            attempt.peer.as_deref(),
            Some("10.96.0.51:8080"),
            "{attempt:?}"
        );
    }
}

fn should_be_possible_to_connect_to_a_service_via_externalip_when_the_external_ip_is_not_assigned_to_a_node(
    path: PodPath,
) {
    let tb = Testbed::new("extip", path, [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [tb.tcp_server(pod1, 9376), tb.tcp_server(pod2, 9376)];
    let external_ip = Ipv4Addr::new(203, 0, 113, 250);
    let svc = service("externalip-test", vip(52))
        .port("http", 80, "TCP")
        .external_ip(external_ip);
    tb.serve(svc, ("http", 9376, "TCP"), &[pod1, pod2]);
    let both = ["pod11", "pod12"];
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(52), 80), &both);
    wait_for(&tb, At::Pod(exec), "tcp", at(external_ip, 80), &both);
    let name = curl_answer(&tb, At::Pod(exec), at(external_ip, 80));
    assert!(both.contains(&name.as_str()), "curl got {name}");
}

fn should_be_able_to_update_service_type_to_nodeport_listening_on_same_port_number_but_different_protocols(
    path: PodPath,
) {
    let tb = Testbed::new("npproto", path, [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [
        tb.tcp_server(pod1, 9376),
        tb.tcp_server(pod2, 9376),
        tb.udp_server(pod1, 9376),
        tb.udp_server(pod2, 9376),
    ];
    let both = ["pod11", "pod12"];
    let svc = || service("nodeport-update-service", vip(53));
    tb.serve(
        svc().port("tcp-port", 80, "TCP"),
        ("tcp-port", 9376, "TCP"),
        &[pod1, pod2],
    );
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(53), 80), &both);

    let tcp = || svc().node_port("tcp-port", 80, "TCP", 30100);
    tb.api.apply(&tcp().build());
    wait_for(&tb, At::Pod(exec), "tcp", at(ONE.address(), 30100), &both);
    wait_for(&tb, At::Outside, "tcp", at(ONE.address(), 30100), &both);

    tb.api
        .apply(&tcp().node_port("udp-port", 80, "UDP", 30101).build());
    tb.api.apply(
        &slice("nodeport-update-service-1", "nodeport-update-service")
            .port("tcp-port", 9376, "TCP")
            .port("udp-port", 9376, "UDP")
            .endpoints([endpoint(pod1.ip, "node1"), endpoint(pod2.ip, "node1")])
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
