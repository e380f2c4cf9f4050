//! Labels (upstream `service.go`): a Service labelled `service.kubernetes.io/service-proxy-name`
//! (another proxy's) or `service.kubernetes.io/headless` is served by no proxy of ours, from
//! the start or once it gains the label, and again once it loses it.
use socklb_tests::{
    NamedServer,
    cluster::{endpoint, service, slice},
    testbed::{At, PodPath, Testbed},
};

use crate::scenario::{ONE, at, not_served, vip, wait_for};

socklb_tests::for_each_pod_path!(
    should_implement_service_kubernetes_io_service_proxy_name,
    should_implement_service_kubernetes_io_headless,
);

/// `label` on a Service turns it off for every proxy: one Service has it from the start and
/// is never served; another gains it (off), then loses it (served again).
fn label_turns_proxying_off((tag, path): (&str, PodPath), label: &str, value: &str) {
    let tb = Testbed::new(tag, path, [5, 0], &[ONE]);
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
    wait_for(&tb, exec, "tcp", disabled, &[&not_served(&tb, exec)]);

    tb.api.apply(&svc("service-toggled", vip(71), true));
    tb.api.apply(&slice_of("service-toggled", 2, true));
    wait_for(&tb, exec, "tcp", toggled, &[&not_served(&tb, exec)]);

    tb.api.apply(&svc("service-toggled", vip(71), false));
    tb.api.apply(&slice_of("service-toggled", 2, false));
    wait_for(&tb, exec, "tcp", toggled, &["pod13", "pod14"]);
    wait_for(&tb, exec, "tcp", disabled, &[&not_served(&tb, exec)]);
    assert!(
        tb.inspect(ONE, Some(vip(70))).frontends.is_empty(),
        "the labelled Service was never programmed"
    );
}

fn should_implement_service_kubernetes_io_service_proxy_name(path: PodPath) {
    label_turns_proxying_off(
        ("proxyname", path),
        "service.kubernetes.io/service-proxy-name",
        "foo-bar",
    );
}

fn should_implement_service_kubernetes_io_headless(path: PodPath) {
    label_turns_proxying_off(("headless", path), "service.kubernetes.io/headless", "");
}
