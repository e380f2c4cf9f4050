//! Type changes (upstream `service.go`): an ExternalName Service, which no proxy serves,
//! becomes a ClusterIP or NodePort Service and is served; a served one becomes ExternalName
//! and is served no more.
use socklb_tests::{
    NamedServer,
    cluster::{ServiceBuilder, external_name_service, service},
    testbed::{At, PodPath, Testbed},
};

use crate::scenario::{ONE, at, not_served, vip, wait_for};

socklb_tests::for_each_pod_path!(
    should_be_able_to_change_the_type_from_externalname_to_clusterip,
    should_be_able_to_change_the_type_from_externalname_to_nodeport,
    should_be_able_to_change_the_type_from_clusterip_to_externalname,
    should_be_able_to_change_the_type_from_nodeport_to_externalname,
);

/// An ExternalName Service (not proxied: nothing in the maps) becomes `served` with two
/// pods of node1 as its endpoints; the client pod is node1's third. The cluster, once the
/// cluster IP answers with both pods, and the servers.
fn external_name_then(
    (tag, path): (&str, PodPath),
    served: ServiceBuilder,
    host: u8,
) -> (Testbed, [NamedServer; 2]) {
    let tb = Testbed::new(tag, path, [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let servers = [tb.tcp_server(pod1, 9376), tb.tcp_server(pod2, 9376)];
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

    tb.serve(served, ("http", 9376, "TCP"), &[pod1, pod2]);
    let both = ["pod11", "pod12"];
    wait_for(&tb, At::Pod(exec), "tcp", at(vip(host), 80), &both);
    (tb, servers)
}

fn should_be_able_to_change_the_type_from_externalname_to_clusterip(path: PodPath) {
    let cluster_ip = service("externalname-service", vip(14)).port("http", 80, "TCP");
    external_name_then(("en2cip", path), cluster_ip, 14);
}

fn should_be_able_to_change_the_type_from_externalname_to_nodeport(path: PodPath) {
    let node_port = service("externalname-service", vip(15)).node_port("http", 80, "TCP", 30081);
    let (tb, _servers) = external_name_then(("en2np", path), node_port, 15);
    let both = ["pod11", "pod12"];
    let exec = At::Pod(tb.pod(ONE, 2));
    wait_for(&tb, exec, "tcp", at(ONE.address(), 30081), &both);
    wait_for(&tb, At::Outside, "tcp", at(ONE.address(), 30081), &both);
}

/// A Service that was served becomes ExternalName: its cluster IP and NodePort are no longer
/// translated. A host process listening on the node's address and the former NodePort shows
/// it: connections from a pod and from outside reach that process instead of a pod.
fn served_then_external_name((tag, path): (&str, PodPath), node_port: Option<u16>) {
    let tb = Testbed::new(tag, path, [2, 0], &[ONE]);
    let (pod1, exec) = (tb.pod(ONE, 0), At::Pod(tb.pod(ONE, 1)));
    let _server = tb.tcp_server(pod1, 9376);
    let port = node_port.unwrap_or(30082);
    let _host = NamedServer::tcp_replying("host", at(ONE.address(), port), "host-process {peer}");
    let svc = service("clusterip-service", vip(16));
    let svc = match node_port {
        Some(node_port) => svc.node_port("http", 80, "TCP", node_port),
        None => svc.port("http", 80, "TCP"),
    };
    tb.serve(svc, ("http", 9376, "TCP"), &[pod1]);
    let (cluster_ip, host_port) = (at(vip(16), 80), at(ONE.address(), port));
    wait_for(&tb, exec, "tcp", cluster_ip, &["pod11"]);
    if node_port.is_some() {
        wait_for(&tb, exec, "tcp", host_port, &["pod11"]);
        wait_for(&tb, At::Outside, "tcp", host_port, &["pod11"]);
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
    wait_for(&tb, exec, "tcp", cluster_ip, &[&not_served(&tb, exec)]);
    wait_for(&tb, exec, "tcp", host_port, &["host-process"]);
    wait_for(&tb, At::Outside, "tcp", host_port, &["host-process"]);
    assert!(
        tb.inspect(ONE, None).frontends.is_empty(),
        "nothing left in the maps"
    );
}

fn should_be_able_to_change_the_type_from_clusterip_to_externalname(path: PodPath) {
    served_then_external_name(("cip2en", path), None);
}

fn should_be_able_to_change_the_type_from_nodeport_to_externalname(path: PodPath) {
    served_then_external_name(("np2en", path), Some(30083));
}
