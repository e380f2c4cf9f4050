//! EndpointSlices (upstream `endpointslice.go`): a Service whose ports, or whose endpoints,
//! are spread over several EndpointSlices is served from all of them.
use socklb_tests::{
    NamedServer,
    cluster::service,
    testbed::{At, Pod, PodPath, Testbed},
};

use crate::scenario::{ONE, at, vip, wait_for};

socklb_tests::for_each_pod_path!(
    should_support_a_service_with_multiple_ports_specified_in_multiple_endpointslices,
    should_support_a_service_with_multiple_endpoint_ips_specified_in_multiple_endpointslices,
);

/// Service example-custom-endpoints on 10.96.0.`host`, ports 80 and 81, and a slice of its
/// own for each: `slices` are each one's (target port, endpoint). node1's pod `client`
/// checks that port 80 is answered by `answers[0]` and port 81 by `answers[1]`.
fn custom_slices(
    tb: &Testbed,
    host: u8,
    slices: [(u16, &Pod); 2],
    client: &Pod,
    answers: [&str; 2],
) {
    let svc = service("example-custom-endpoints", vip(host))
        .port("port80", 80, "TCP")
        .port("port81", 81, "TCP");
    tb.api.apply(&svc.build());
    for (i, (target, pod)) in slices.into_iter().enumerate() {
        let (name, port_name) = (format!("e2e-custom-slice{}", i + 1), format!("port8{i}"));
        tb.set_slice(
            &name,
            "example-custom-endpoints",
            (&port_name, target, "TCP"),
            &[pod],
        );
    }
    for (port, answer) in [80, 81].into_iter().zip(answers) {
        wait_for(tb, At::Pod(client), "tcp", at(vip(host), port), &[answer]);
    }
}

fn should_support_a_service_with_multiple_ports_specified_in_multiple_endpointslices(
    path: PodPath,
) {
    let tb = Testbed::new("slicesports", path, [2, 0], &[ONE]);
    let (server, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1));
    let _servers = [8090, 9090].map(|port| {
        let name = format!("pod11:{port}");
        NamedServer::tcp_in(&server.netns, &name, at(server.ip, port))
    });
    let slices = [(8090, server), (9090, server)];
    custom_slices(&tb, 110, slices, exec, ["pod11:8090", "pod11:9090"]);
}

fn should_support_a_service_with_multiple_endpoint_ips_specified_in_multiple_endpointslices(
    path: PodPath,
) {
    let tb = Testbed::new("slicesips", path, [3, 0], &[ONE]);
    let (pod1, pod2, exec) = (tb.pod(ONE, 0), tb.pod(ONE, 1), tb.pod(ONE, 2));
    let _servers = [tb.tcp_server(pod1, 8090), tb.tcp_server(pod2, 8090)];
    custom_slices(
        &tb,
        111,
        [(8090, pod1), (8090, pod2)],
        exec,
        ["pod11", "pod12"],
    );
}
