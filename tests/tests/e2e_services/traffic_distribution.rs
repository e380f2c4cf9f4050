//! Traffic distribution (upstream `traffic_distribution.go`, through the hints the
//! EndpointSlice controller writes for it): PreferSameZone keeps a client in its zone,
//! PreferSameNode on its node, falling back to its zone, then to every endpoint.
use std::net::{Ipv4Addr, SocketAddrV4};

use socklb_tests::{
    cluster::{endpoint, hinted, node, service, slice},
    testbed::{At, Pod, PodPath, Testbed},
};

use crate::scenario::{ONE, TWO, at, pod_names, vip, wait_for};

socklb_tests::for_each_pod_path!(
    should_route_traffic_to_an_endpoint_in_the_same_zone_when_using_prefersamezone,
    should_route_traffic_to_an_endpoint_on_the_same_node_or_fall_back_to_same_zone_when_using_prefersamenode,
);

/// Waits until `client`'s connections to `target` reach exactly `servers`.
fn reaches(tb: &Testbed, client: &Pod, target: SocketAddrV4, servers: &[&Pod]) {
    wait_for(tb, At::Pod(client), "tcp", target, &pod_names(servers));
}

fn should_route_traffic_to_an_endpoint_in_the_same_zone_when_using_prefersamezone(path: PodPath) {
    // node1 in zone-a and node2 in zone-b each have an endpoint and a client.
    let tb = Testbed::new("samezone", path, [2, 2], &[ONE, TWO]);
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
    reaches(&tb, client1, target, &[server1]);
    reaches(&tb, client2, target, &[server2]);

    // node2 moves to zone-c, where no endpoint is: its clients use every endpoint.
    tb.api.apply(&node("node2", "zone-c", TWO.address()));
    reaches(&tb, client2, target, &[server1, server2]);
    reaches(&tb, client1, target, &[server1]);
}

fn should_route_traffic_to_an_endpoint_on_the_same_node_or_fall_back_to_same_zone_when_using_prefersamenode(
    path: PodPath,
) {
    // node1 and node2 in zone-a, each with an endpoint and a client; a third endpoint on
    // node3 in zone-b (a Node without an agent; its pod's namespace hangs off node2's
    // bridge, which only the network sees).
    let tb = Testbed::new("samenode", path, [2, 3], &[ONE, TWO]);
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
    reaches(&tb, client1, target, &[server1]);
    reaches(&tb, client2, target, &[server2]);

    // node2's endpoint goes: its clients fall back to the same zone (node1's), not node3's.
    tb.api.apply(&endpoints(false));
    reaches(&tb, client2, target, &[server1]);
    reaches(&tb, client1, target, &[server1]);

    // node2 moves to a zone without endpoints: every endpoint.
    tb.api.apply(&node("node2", "zone-c", TWO.address()));
    reaches(&tb, client2, target, &[server1, server3]);
}
