//! State: conversion of API objects and change tracking.
use std::{net::IpAddr, path::Path};

use super::*;
use crate::{
    desired::{Protocol, Scope},
    select::{Family, FrontendKind, ServiceName, SkipReason, SkippedPart},
    source::file::parse,
};

fn objects(yaml: &str) -> Vec<Object> {
    parse(Path::new("test.yaml"), yaml).expect("test manifests parse")
}

fn applied(yaml: &str) -> Vec<Event> {
    objects(yaml).into_iter().map(Event::Applied).collect()
}

fn name(name: &str) -> ServiceName {
    ServiceName {
        namespace: "default".to_owned(),
        name: name.to_owned(),
    }
}

/// A selection's skipped parts, each as `part: reason`.
fn skipped(selection: &ServiceSelection) -> Vec<String> {
    selection
        .skipped
        .iter()
        .map(|s| format!("{}: {}", s.part, s.reason))
        .collect()
}

fn state_with(yaml: &str) -> ClusterState {
    let mut state = ClusterState::new("node-a");
    for event in applied(yaml) {
        state.apply(event);
    }
    state
}

const WEB: &str = "
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: http, port: 80, protocol: TCP}]
---
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.0.0.1]
  nodeName: node-a
- addresses: [10.0.0.2]
  conditions: {ready: false}
  nodeName: node-b
";

/// A Service's new version that cannot be served for a malformed field (a typo in a
/// manifest) leaves its last good version served; a version that can be served replaces it.
#[test]
fn an_invalid_update_keeps_the_last_good_service() {
    let service = |ip: &str| {
        format!(
            "kind: Service\nmetadata: {{name: a}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n"
        )
    };
    let cluster_ips = |state: &ClusterState| match state.services.get(&name("a")) {
        Some(Ok(info)) => info.cluster_ips.clone(),
        other => panic!("not served: {other:?}"),
    };
    let mut state = state_with(&service("10.96.0.10"));
    for event in applied(&service("10.96.0.300")) {
        state.apply(event);
    }
    assert_eq!(
        cluster_ips(&state),
        ["10.96.0.10".parse::<IpAddr>().expect("an address")]
    );
    for event in applied(&service("10.96.0.11")) {
        state.apply(event);
    }
    assert_eq!(
        cluster_ips(&state),
        ["10.96.0.11".parse::<IpAddr>().expect("an address")]
    );
    // Never served: the reason is kept, naming the field and its value.
    let state = state_with(&service("10.96.0.300").replace("name: a", "name: b"));
    let skipped: Vec<String> = state.skipped().map(|(_, r)| r.to_string()).collect();
    assert_eq!(
        skipped,
        ["invalid: clusterIPs 10.96.0.300: not an IP address"]
    );
}

/// A new version with an invalid port or protocol (a typo) leaves the last good version
/// served too; one whose invalid part was there before is taken (the rest of it serves).
#[test]
fn an_update_with_a_newly_invalid_port_keeps_the_last_good_service() {
    let service = |ports: &str| {
        format!(
            "kind: Service\nmetadata: {{name: a}}\nspec: {{clusterIP: 10.96.0.10, ports: [{ports}]}}\n"
        )
    };
    let ports = |state: &ClusterState| match state.services.get(&name("a")) {
        Some(Ok(info)) => info.ports.iter().map(|p| p.port).collect::<Vec<_>>(),
        other => panic!("not served: {other:?}"),
    };
    let apply = |state: &mut ClusterState, yaml: &str| {
        for event in applied(yaml) {
            state.apply(event);
        }
    };
    let mut state = state_with(&service("{name: a, port: 80}, {name: b, port: 70000}"));
    assert_eq!(ports(&state), [80], "first read: served in part");
    apply(
        &mut state,
        &service("{name: a, port: 81}, {name: b, port: 70000}"),
    );
    assert_eq!(
        ports(&state),
        [81],
        "the same invalid part as before: taken"
    );
    for typo in [
        "{name: a, port: 70001}, {name: b, port: 70000}",
        "{name: a, port: 81, protocol: TPC}, {name: b, port: 70000}",
    ] {
        apply(&mut state, &service(typo));
        assert_eq!(ports(&state), [81], "{typo}: the last good version stays");
    }
    apply(&mut state, &service("{name: a, port: 82}"));
    assert_eq!(ports(&state), [82]);
}

#[test]
fn services_that_are_not_served_say_why() {
    let rows = [
        (
            "kind: Service\nmetadata: {name: a}\nspec: {type: ExternalName, externalName: x.example}\n",
            SkipReason::ExternalName,
        ),
        (
            "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: None}\n",
            SkipReason::Headless,
        ),
        (
            "kind: Service\nmetadata: {name: a, labels: {service.kubernetes.io/service-proxy-name: other}}\nspec: {clusterIP: 10.96.0.1}\n",
            SkipReason::OtherProxy,
        ),
        (
            "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: 'fd00::1', clusterIPs: ['fd00::1'], ipFamilies: [IPv4]}\n",
            SkipReason::FamilyNotServed(Family::V6),
        ),
        (
            "kind: Service\nmetadata: {name: a}\nspec: {clusterIP: 10.96.0.999}\n",
            SkipReason::Invalid("clusterIPs 10.96.0.999: not an IP address".to_owned()),
        ),
    ];
    for (yaml, reason) in rows {
        let state = state_with(yaml);
        let skipped: Vec<_> = state.skipped().map(|(_, r)| r.clone()).collect();
        assert_eq!(skipped, std::slice::from_ref(&reason), "{yaml}");
        let mut state = state;
        state.apply(Event::Reset(Kind::Service, Vec::new()));
        assert_eq!(state.skipped().count(), 0, "{yaml}");
        assert!(state.select(&name("a")).is_none());
    }
}

#[test]
fn parts_that_are_not_served_are_skipped_and_the_rest_is_served() {
    let state = state_with(
        "
kind: Service
metadata: {name: mixed, annotations: {socklb.io/topology-keys: 'not json'}}
spec:
  ipFamilies: [IPv4]
  clusterIPs: [10.96.0.20, 'fd00::20']
  externalIPs: [203.0.113.9, not-an-ip]
  ports:
  - {name: sctp, port: 9, protocol: SCTP}
  - {name: zero, port: 0, protocol: TCP}
  - {name: big, port: 70000, protocol: TCP}
  - {name: dns, port: 53, protocol: UDP}
  sessionAffinity: ClientIP
",
    );
    let selection = state.select(&name("mixed")).expect("served");
    let reasons: Vec<String> = selection.skipped.iter().map(|s| s.part.clone()).collect();
    assert_eq!(
        reasons,
        [
            "clusterIPs fd00::20",
            "externalIPs not-an-ip",
            "port sctp",
            "port zero",
            "port big",
            "annotation socklb.io/topology-keys",
        ]
    );
    let frontends: Vec<(FrontendKind, Protocol, u16)> = selection
        .frontends
        .iter()
        .map(|f| (f.kind, f.frontend.protocol, f.frontend.port))
        .collect();
    assert!(frontends.contains(&(FrontendKind::ClusterIp, Protocol::Udp, 53)));
    assert!(frontends.contains(&(FrontendKind::ExternalIp, Protocol::Udp, 53)));
    // sessionAffinity ClientIP without a config: kube-proxy's default of 3 hours.
    assert_eq!(
        selection.frontends[0].spec.affinity_timeout_seconds,
        Some(10_800)
    );
}

#[test]
fn load_balancer_ips_with_ip_mode_proxy_are_left_to_the_load_balancer() {
    let state = state_with(
        "
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.31
  ports: [{name: http, port: 80, nodePort: 30081, protocol: TCP}]
status:
  loadBalancer:
    ingress:
    - {ip: 192.0.2.1, ipMode: Proxy}
    - {ip: 192.0.2.2, ipMode: VIP}
    - {ip: 192.0.2.3}
",
    );
    let selection = state.select(&name("lb")).expect("served");
    let lb_ips: Vec<String> = selection
        .frontends
        .iter()
        .filter(|f| f.kind == FrontendKind::LoadBalancer)
        .map(|f| f.frontend.address.to_string())
        .collect();
    assert!(
        lb_ips.iter().all(|ip| ip != "192.0.2.1")
            && lb_ips.iter().any(|ip| ip == "192.0.2.2")
            && lb_ips.iter().any(|ip| ip == "192.0.2.3"),
        "VIP-mode and unset ipMode are programmed, Proxy is not: {lb_ips:?}"
    );
    assert_eq!(
        selection.skipped,
        [SkippedPart {
            part: "loadBalancer.ingress 192.0.2.1".to_owned(),
            reason: SkipReason::IpModeProxy,
        }]
    );
}

#[test]
fn slices_are_grouped_by_service_and_follow_relabels_and_deletes() {
    let mut state = state_with(WEB);
    let backends = |state: &ClusterState| {
        state.select(&name("web")).expect("web").frontends[0]
            .spec
            .backends
            .len()
    };
    assert_eq!(backends(&state), 1, "the not-ready endpoint is not used");

    // A second slice adds an endpoint.
    for event in applied(
        "kind: EndpointSlice
metadata: {name: web-2, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.0.0.3]}]
",
    ) {
        state.apply(event);
    }
    assert_eq!(backends(&state), 2);

    // Relabelled to another service: leaves web.
    for event in applied(
        "kind: EndpointSlice
metadata: {name: web-2, namespace: default, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
endpoints: [{addresses: [10.0.0.3]}]
",
    ) {
        state.apply(event);
    }
    assert_eq!(backends(&state), 1);

    // Deleted.
    let web1 = objects(WEB).into_iter().nth(1).expect("slice");
    state.apply(Event::Deleted(web1));
    assert_eq!(backends(&state), 0);
}

#[test]
fn a_reset_removes_what_it_does_not_list() {
    let mut state = state_with(WEB);
    state.take_changes();
    state.apply(Event::Reset(Kind::EndpointSlice, Vec::new()));
    assert_eq!(state.take_changes().services, BTreeSet::from([name("web")]));
    assert!(
        state.select(&name("web")).expect("web").frontends[0]
            .spec
            .backends
            .is_empty()
    );
    state.apply(Event::Reset(Kind::Service, Vec::new()));
    assert!(state.select(&name("web")).is_none());
}

#[test]
fn a_list_sent_object_by_object_removes_what_it_did_not_apply_when_it_ends() {
    let mut state = state_with(WEB);
    state.take_changes();
    let [_, slice] = <[Object; 2]>::try_from(objects(WEB)).expect("a Service and its slice");
    // A relist of the slices that brings the same slice again: nothing changes, nothing goes.
    state.apply(Event::Listing(Kind::EndpointSlice));
    state.apply(Event::Applied(slice));
    state.apply(Event::Listed(Kind::EndpointSlice));
    assert!(state.take_changes().services.is_empty());
    // A relist of the Services without web: web stays until the list ends, then goes.
    state.apply(Event::Listing(Kind::Service));
    assert!(state.select(&name("web")).is_some());
    state.apply(Event::Listed(Kind::Service));
    assert_eq!(state.take_changes().services, BTreeSet::from([name("web")]));
    assert!(state.select(&name("web")).is_none());
}

#[test]
fn only_real_changes_are_tracked() {
    let mut state = state_with(WEB);
    assert_eq!(state.take_changes().services, BTreeSet::from([name("web")]));
    // The same objects again (a relist): nothing to recompute.
    for event in applied(WEB) {
        state.apply(event);
    }
    assert!(state.take_changes().services.is_empty());
}

#[test]
fn node_label_changes_mark_the_services_that_depend_on_them() {
    let mut state = state_with(&format!(
        "{WEB}---
kind: Service
metadata: {{name: keyed, namespace: default, annotations: {{socklb.io/topology-keys: '[\"rack\"]'}}}}
spec: {{clusterIP: 10.96.0.11, ports: [{{name: http, port: 80}}]}}
"
    ));
    state.take_changes();

    // Another node's labels: only the Service using topology keys.
    for event in applied("kind: Node\nmetadata: {name: node-b, labels: {rack: r1}}\n") {
        state.apply(event);
    }
    assert_eq!(
        state.take_changes().services,
        BTreeSet::from([name("keyed")])
    );

    // This node's labels (zone) or addresses: every Service.
    for event in applied(
        "kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: z1}}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}, {type: Hostname, address: node-a}]}
",
    ) {
        state.apply(event);
    }
    assert_eq!(
        state.take_changes().services,
        BTreeSet::from([name("keyed"), name("web")])
    );
    assert_eq!(
        state.this_node().addresses,
        [IpAddr::from(std::net::Ipv4Addr::new(192, 168, 0, 1))]
    );
    assert_eq!(state.this_node().zone(), Some("z1"));
}

#[test]
fn source_ranges_guard_only_load_balancer_ips_from_outside_and_fail_closed() {
    let lb = |ranges: &str| {
        format!(
            "
kind: Service
metadata: {{name: lb, namespace: default{ranges}}}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.30
  clusterIPs: [10.96.0.30]
  ports: [{{name: http, port: 80, nodePort: 30080, protocol: TCP}}]
status: {{loadBalancer: {{ingress: [{{ip: 192.0.2.1}}]}}}}
"
        )
    };
    let ranges_of = |yaml: &str| -> Vec<(FrontendKind, Scope, Option<Vec<String>>)> {
        let selection = state_with(yaml).select(&name("lb")).expect("served");
        selection
            .frontends
            .iter()
            .filter(|f| f.kind != FrontendKind::NodePort)
            .map(|f| {
                let ranges = f
                    .spec
                    .source_ranges
                    .as_ref()
                    .map(|r| r.iter().map(ToString::to_string).collect());
                (f.kind, f.frontend.scope, ranges)
            })
            .collect()
    };
    let spec_field = lb("").replace(
        "  type: LoadBalancer",
        "  type: LoadBalancer\n  loadBalancerSourceRanges: [10.0.0.0/8, 'fd00::/8', bogus]",
    );
    assert_eq!(
        ranges_of(&spec_field),
        [
            (FrontendKind::ClusterIp, Scope::Internal, None),
            (FrontendKind::LoadBalancer, Scope::Internal, None),
            (
                FrontendKind::LoadBalancer,
                Scope::External,
                Some(vec!["10.0.0.0/8".to_owned()])
            ),
        ]
    );
    // The annotation kube-proxy falls back to.
    let annotated = lb(
        ", annotations: {service.beta.kubernetes.io/load-balancer-source-ranges: '203.0.113.0/24, 198.51.100.7/32'}",
    );
    assert_eq!(
        ranges_of(&annotated)[2].2,
        Some(vec![
            "203.0.113.0/24".to_owned(),
            "198.51.100.7/32".to_owned()
        ])
    );
    // Ranges given, none usable: nobody is let in rather than everybody.
    let unusable = lb("").replace(
        "  type: LoadBalancer",
        "  type: LoadBalancer\n  loadBalancerSourceRanges: [bogus]",
    );
    assert_eq!(ranges_of(&unusable)[2].2, Some(Vec::new()));
    assert_eq!(ranges_of(&lb(""))[2].2, None);
}

#[test]
fn a_health_check_node_port_is_read_only_where_kube_proxy_serves_one() {
    // (rule, spec lines, health check port, whether the missing port is reported)
    let rows: [(&str, &str, Option<u16>, bool); 6] = [
        (
            "LoadBalancer with externalTrafficPolicy Local",
            "type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32000",
            Some(32000),
            false,
        ),
        (
            "externalTrafficPolicy Cluster: no health check",
            "type: LoadBalancer\n  externalTrafficPolicy: Cluster\n  healthCheckNodePort: 32000",
            None,
            false,
        ),
        (
            "NodePort with externalTrafficPolicy Local: no health check",
            "type: NodePort\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32000",
            None,
            false,
        ),
        (
            "ClusterIP: no health check",
            "healthCheckNodePort: 32000",
            None,
            false,
        ),
        (
            "a missing port is reported",
            "type: LoadBalancer\n  externalTrafficPolicy: Local",
            None,
            true,
        ),
        (
            "a port out of range is reported",
            "type: LoadBalancer\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 70000",
            None,
            true,
        ),
    ];
    for (rule, spec, port, reported) in rows {
        let state = state_with(&format!(
            "
kind: Service
metadata: {{name: lb, namespace: default}}
spec:
  clusterIP: 10.96.0.40
  ports: [{{name: http, port: 80, nodePort: 30080}}]
  {spec}
"
        ));
        let selection = state.select(&name("lb")).expect("served");
        assert_eq!(
            selection.health_check.map(|h| h.node_port),
            port,
            "rule: {rule}"
        );
        assert_eq!(
            selection
                .skipped
                .iter()
                .any(|s| s.part == "healthCheckNodePort"),
            reported,
            "rule: {rule}: {:?}",
            selection.skipped
        );
    }
}

/// A typo in one of this node's addresses keeps its last good addresses, which its
/// NodePorts are served on; a version of valid addresses replaces them.
#[test]
fn a_node_address_that_is_not_an_ip_keeps_the_last_good_addresses() {
    let node = |addresses: &str| {
        format!("kind: Node\nmetadata: {{name: node-a}}\nstatus: {{addresses: [{addresses}]}}\n")
    };
    let ip = |text: &str| -> IpAddr { text.parse().expect("address") };
    let mut state = state_with(&node("{type: InternalIP, address: 192.168.50.10}"));
    for event in applied(&node(
        "{type: InternalIP, address: 192.168.50.999}, {type: ExternalIP, address: 203.0.113.5}",
    )) {
        state.apply(event);
    }
    assert_eq!(state.this_node().addresses, [ip("192.168.50.10")]);
    for event in applied(&node("{type: InternalIP, address: 192.168.50.11}")) {
        state.apply(event);
    }
    assert_eq!(state.this_node().addresses, [ip("192.168.50.11")]);
}

#[test]
fn the_snat_address_is_the_first_internal_ip_this_node_holds_per_family() {
    let state = state_with(
        "
kind: Node
metadata: {name: node-a}
status:
  addresses:
  - {type: ExternalIP, address: 203.0.113.5}
  - {type: ExternalIP, address: 'fd00:203::5'}
  - {type: Hostname, address: node-a}
  - {type: InternalIP, address: 10.0.0.5}
  - {type: InternalIP, address: 'fd00:10::5'}
  - {type: InternalIP, address: 10.0.0.6}
  - {type: InternalIP, address: not-an-ip}
",
    );
    let ip = |text: &str| -> IpAddr { text.parse().expect("address") };
    let node = state.this_node();
    assert_eq!(
        node.addresses,
        [
            ip("10.0.0.5"),
            ip("fd00:10::5"),
            ip("10.0.0.6"),
            ip("203.0.113.5"),
            ip("fd00:203::5")
        ],
        "NodePort addresses: InternalIPs first, then ExternalIPs, both families"
    );
    // (held locally, IPv4 SNAT address, IPv6 SNAT address)
    let rows: [(&[&str], Option<&str>, Option<&str>); 5] = [
        // The first InternalIP of each family held locally, in the Node's order.
        (
            &["203.0.113.5", "10.0.0.6", "10.0.0.5", "fd00:10::5"],
            Some("10.0.0.5"),
            Some("fd00:10::5"),
        ),
        (&["203.0.113.5", "10.0.0.6"], Some("10.0.0.6"), None),
        // No InternalIP held: an ExternalIP held locally.
        (
            &["203.0.113.5", "127.0.0.1", "fd00:203::5"],
            Some("203.0.113.5"),
            Some("fd00:203::5"),
        ),
        // An IPv6-only node.
        (&["fd00:10::5", "::1"], None, Some("fd00:10::5")),
        // None held (a cloud NAT's ExternalIP, an address not configured yet).
        (&["127.0.0.1", "::1"], None, None),
    ];
    for (local, v4, v6) in rows {
        let local: Vec<IpAddr> = local.iter().map(|a| ip(a)).collect();
        assert_eq!(
            node.snat_address4(&local).map(IpAddr::from),
            v4.map(ip),
            "held: {local:?}"
        );
        assert_eq!(
            node.snat_address6(&local).map(IpAddr::from),
            v6.map(ip),
            "held: {local:?}"
        );
    }
}

#[test]
fn two_ports_of_one_number_serve_the_first_and_say_so() {
    let state = state_with(
        "
kind: Service
metadata: {name: dup, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.50
  ports:
  - {name: http, port: 80, protocol: TCP, nodePort: 30080}
  - {name: web, port: 80, protocol: TCP, nodePort: 30081}
  - {name: dns, port: 80, protocol: UDP}
  - {name: admin, port: 81, protocol: TCP, nodePort: 30080}
---
kind: Node
metadata: {name: node-a}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
",
    );
    let selection = state.select(&name("dup")).expect("served");
    let programmed: Vec<(&str, Protocol, u16, FrontendKind)> = selection
        .frontends
        .iter()
        .filter(|f| f.frontend.scope == Scope::Internal)
        .map(|f| {
            let frontend = &f.frontend;
            (
                f.port_name.as_str(),
                frontend.protocol,
                frontend.port,
                f.kind,
            )
        })
        .collect();
    // What explain shows is what is programmed: port web nowhere, admin without its nodePort.
    assert_eq!(
        programmed,
        [
            ("http", Protocol::Tcp, 80, FrontendKind::ClusterIp),
            ("http", Protocol::Tcp, 30080, FrontendKind::NodePort),
            ("dns", Protocol::Udp, 80, FrontendKind::ClusterIp),
            ("admin", Protocol::Tcp, 81, FrontendKind::ClusterIp),
        ]
    );
    // The reasons name both ports (the runner logs them once, as a warning).
    assert_eq!(
        skipped(&selection),
        [
            "port web: invalid: 80/TCP is also port http's: only port http is served",
            "port admin nodePort: invalid: nodePort 30080/TCP is also port http's: only port \
             http's is served",
        ]
    );
}

#[test]
fn a_node_port_out_of_range_is_said_and_its_port_still_served() {
    let state = state_with(
        "
kind: Service
metadata: {name: np, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.60
  ports:
  - {name: big, port: 80, protocol: TCP, nodePort: 99999}
  - {name: bigger, port: 81, protocol: TCP, nodePort: 300800}
  - {name: negative, port: 82, protocol: TCP, nodePort: -30000}
  - {name: unset, port: 83, protocol: TCP, nodePort: 0}
  - {name: good, port: 84, protocol: TCP, nodePort: 30084}
---
kind: Node
metadata: {name: node-a}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
",
    );
    let selection = state.select(&name("np")).expect("served");
    assert_eq!(
        skipped(&selection),
        [
            "port big nodePort: invalid: nodePort 99999",
            "port bigger nodePort: invalid: nodePort 300800",
            "port negative nodePort: invalid: nodePort -30000",
        ]
    );
    let internal: Vec<(&str, u16, FrontendKind)> = selection
        .frontends
        .iter()
        .filter(|f| f.frontend.scope == Scope::Internal)
        .map(|f| (f.port_name.as_str(), f.frontend.port, f.kind))
        .collect();
    // Every port keeps its ClusterIP; only the valid nodePort gets a NodePort frontend.
    assert_eq!(
        internal,
        [
            ("big", 80, FrontendKind::ClusterIp),
            ("bigger", 81, FrontendKind::ClusterIp),
            ("negative", 82, FrontendKind::ClusterIp),
            ("unset", 83, FrontendKind::ClusterIp),
            ("good", 84, FrontendKind::ClusterIp),
            ("good", 30084, FrontendKind::NodePort),
        ]
    );
}

#[test]
fn slices_and_endpoints_that_are_not_used_say_why() {
    let state = state_with(&format!(
        "{WEB}---
kind: EndpointSlice
metadata: {{name: web-v6, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv6
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints: [{{addresses: ['fd00::1']}}]
---
kind: EndpointSlice
metadata: {{name: web-dns, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: FQDN
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints: [{{addresses: [db.example.com]}}]
---
kind: EndpointSlice
metadata: {{name: web-2, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints: [{{addresses: [10.0.0.3]}}, {{addresses: [10.0.0.999]}}]
"
    ));
    let selection = state.select(&name("web")).expect("served");
    let skipped: Vec<(String, String)> = selection
        .skipped
        .iter()
        .map(|s| (s.part.clone(), s.reason.label().to_owned()))
        .collect();
    // In slice name order; explain shows these, and the runner logs them once per change.
    assert_eq!(
        skipped,
        [
            (
                "EndpointSlice web-2 endpoint 10.0.0.999".to_owned(),
                "invalid".to_owned()
            ),
            ("EndpointSlice web-dns".to_owned(), "fqdn".to_owned()),
            (
                "EndpointSlice web-v6".to_owned(),
                "family-not-served".to_owned()
            ),
        ]
    );
    // The usable endpoints are served as before.
    let backends: Vec<String> = selection.frontends[0]
        .spec
        .backends
        .iter()
        .map(|b| b.address.to_string())
        .collect();
    assert_eq!(backends, ["10.0.0.1", "10.0.0.3"]);
}

#[test]
fn the_families_a_service_serves_and_what_it_skips_for_them() {
    /// Skipped parts with their reason label.
    type Skips = &'static [(&'static str, &'static str)];
    // (rule, spec lines, families served, skipped parts)
    let rows: [(&str, &str, &[Family], Skips); 9] = [
        (
            "ipFamilies IPv6",
            "ipFamilies: [IPv6]\n  clusterIPs: ['fd00:96::10']",
            &[Family::V6],
            &[],
        ),
        (
            "dual-stack, IPv6 primary",
            "ipFamilies: [IPv6, IPv4]\n  clusterIPs: ['fd00:96::10', 10.96.0.10]",
            &[Family::V6, Family::V4],
            &[],
        ),
        (
            "no ipFamilies: the clusterIPs' families",
            "clusterIPs: [10.96.0.10, 'fd00:96::10']",
            &[Family::V4, Family::V6],
            &[],
        ),
        (
            "no ipFamilies and no clusterIP: IPv4, the clusterIP said missing",
            "externalIPs: [203.0.113.9]",
            &[Family::V4],
            &[("clusterIP", "invalid")],
        ),
        (
            "a clusterIP whose family is not in ipFamilies",
            "ipFamilies: [IPv4]\n  clusterIPs: [10.96.0.10, 'fd00:96::10']",
            &[Family::V4],
            &[("clusterIPs fd00:96::10", "family-not-served")],
        ),
        (
            "an externalIP and a LoadBalancer IP of a family not served",
            "ipFamilies: [IPv4]\n  clusterIPs: [10.96.0.10]\n  externalIPs: [203.0.113.9, 'fd00:203::9']\nstatus: {loadBalancer: {ingress: [{ip: 'fd00:198::7'}]}}",
            &[Family::V4],
            &[
                ("externalIPs fd00:203::9", "family-not-served"),
                ("loadBalancer.ingress fd00:198::7", "family-not-served"),
            ],
        ),
        (
            "an unknown family name",
            "ipFamilies: [IPv4, IPv7]\n  clusterIPs: [10.96.0.10]",
            &[Family::V4],
            &[("ipFamilies IPv7", "invalid")],
        ),
        (
            "an IPv4-mapped IPv6 address is refused",
            "clusterIPs: [10.96.0.10]\n  externalIPs: ['::ffff:203.0.113.9']",
            &[Family::V4],
            &[("externalIPs ::ffff:203.0.113.9", "invalid")],
        ),
        (
            "an IPv6 source range is not skipped (it guards IPv6 LoadBalancer IPs)",
            "clusterIPs: [10.96.0.10]\n  loadBalancerSourceRanges: ['fd00::/8', bogus]",
            &[Family::V4],
            &[("loadBalancerSourceRanges bogus", "invalid")],
        ),
    ];
    for (rule, spec, families, skipped) in rows {
        let yaml = format!(
            "kind: Service\nmetadata: {{name: s, namespace: default}}\nspec:\n  ports: [{{name: http, port: 80}}]\n  {spec}\n"
        );
        let object = objects(&yaml).remove(0);
        let Object::Service(service) = object else {
            panic!("a Service")
        };
        let info = convert::service(&service).unwrap_or_else(|r| panic!("{rule}: skipped: {r}"));
        assert_eq!(info.families, families, "rule: {rule}");
        let parts: Vec<(&str, &str)> = info
            .partial_skips
            .iter()
            .map(|(part, reason)| (part.as_str(), reason.label()))
            .collect();
        assert_eq!(parts, skipped, "rule: {rule}");
    }
}

const DUAL_STACK: &str = "
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, 'fd00:96::10']
  ports: [{name: http, port: 80, nodePort: 30080, protocol: TCP}]
---
kind: EndpointSlice
metadata: {name: web-v4, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.0.0.1], nodeName: node-a}, {addresses: [10.0.0.2], nodeName: node-b}]
---
kind: EndpointSlice
metadata: {name: web-v6, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- {addresses: ['fd00::1'], nodeName: node-a}
- {addresses: [10.0.0.3], nodeName: node-a}
- {addresses: ['fd00::zz'], nodeName: node-a}
---
kind: Node
metadata: {name: node-a}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}, {type: InternalIP, address: 'fd00:168::1'}]}
";

#[test]
fn a_dual_stack_service_is_two_frontend_sets_that_never_cross() {
    let state = state_with(DUAL_STACK);
    let selection = state.select(&name("web")).expect("served");
    let frontends: Vec<String> = selection
        .frontends
        .iter()
        .filter(|f| f.frontend.scope == Scope::Internal)
        .map(|f| {
            let backends: Vec<String> = f.spec.backends.iter().map(ToString::to_string).collect();
            format!("{} {} -> {}", f.family, f.frontend, backends.join(" "))
        })
        .collect();
    assert_eq!(
        frontends,
        [
            "IPv4 10.96.0.10:80/TCP (internal) -> 10.0.0.1:8080 10.0.0.2:8080",
            "IPv4 192.168.0.1:30080/TCP (internal) -> 10.0.0.1:8080 10.0.0.2:8080",
            "IPv6 [fd00:96::10]:80/TCP (internal) -> [fd00::1]:8080",
            "IPv6 [fd00:168::1]:30080/TCP (internal) -> [fd00::1]:8080",
        ]
    );
    assert_eq!(
        skipped(&selection),
        [
            "EndpointSlice web-v6 endpoint 10.0.0.3: invalid: not an IPv6 address, in a slice of \
             addressType IPv6",
            "EndpointSlice web-v6 endpoint fd00::zz: invalid: not an IP address",
        ]
    );
}

/// Addresses no Service or pod may have (the API server refuses them) are skipped with the
/// reason: a special frontend (unspecified, loopback, link-local, multicast), an
/// unspecified or multicast endpoint. A loopback endpoint is served (one machine's demo).
/// So are a slice's ports that cannot be served.
#[test]
fn special_addresses_and_unusable_ports_are_skipped_with_a_reason() {
    let yaml = "
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  externalIPs: [0.0.0.0, 127.0.0.1, 169.254.1.1, 224.0.0.1, 192.0.2.1]
  ports: [{name: http, port: 80}]
---
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: big, port: 99999, protocol: TCP}
- {name: odd, port: 81, protocol: FOO}
endpoints: [{addresses: [0.0.0.0]}, {addresses: [239.1.1.1]}, {addresses: [127.0.1.1]}]
---
kind: Node
metadata: {name: node-a}
";
    let state = state_with(yaml);
    let selection = state.select(&name("web")).expect("served");
    let frontends: Vec<String> = selection
        .frontends
        .iter()
        .map(|f| {
            let backends: Vec<String> = f.spec.backends.iter().map(ToString::to_string).collect();
            format!("{} -> {}", f.frontend, backends.join(" "))
        })
        .collect();
    assert_eq!(
        frontends,
        [
            "10.96.0.10:80/TCP (internal) -> 127.0.1.1:8080",
            "192.0.2.1:80/TCP (internal) -> 127.0.1.1:8080",
            "192.0.2.1:80/TCP (external) -> 127.0.1.1:8080",
        ]
    );
    let refused = "which no Service may have";
    assert_eq!(
        skipped(&selection),
        [
            format!("externalIPs 0.0.0.0: invalid: the unspecified address, {refused}"),
            format!("externalIPs 127.0.0.1: invalid: a loopback address, {refused}"),
            format!("externalIPs 169.254.1.1: invalid: a link-local address, {refused}"),
            format!("externalIPs 224.0.0.1: invalid: a multicast address, {refused}"),
            "EndpointSlice web-1 port big: invalid: port 99999".to_owned(),
            "EndpointSlice web-1 port odd: invalid: protocol FOO".to_owned(),
            "EndpointSlice web-1 endpoint 0.0.0.0: invalid: the unspecified address, which no \
             pod has"
                .to_owned(),
            "EndpointSlice web-1 endpoint 239.1.1.1: invalid: a multicast address, which no pod \
             has"
            .to_owned(),
        ]
    );
    let loopback = state_with(&yaml.replace("clusterIP: 10.96.0.10", "clusterIP: 127.0.0.1"));
    let skipped: Vec<String> = loopback.skipped().map(|(_, r)| r.to_string()).collect();
    assert_eq!(
        skipped,
        [format!(
            "invalid: clusterIPs 127.0.0.1: a loopback address, {refused}"
        )]
    );
}

#[test]
fn an_ipv6_slice_for_an_ipv4_service_is_skipped_and_nothing_else_changes() {
    let v4_only = DUAL_STACK
        .replace("ipFamilies: [IPv4, IPv6]", "ipFamilies: [IPv4]")
        .replace(
            "ipFamilyPolicy: RequireDualStack",
            "ipFamilyPolicy: SingleStack",
        )
        .replace(
            "clusterIPs: [10.96.0.10, 'fd00:96::10']",
            "clusterIPs: [10.96.0.10]",
        );
    let with_v6_slice = state_with(&v4_only);
    // The same objects without the IPv6 slice.
    let without: String = v4_only
        .split("---")
        .filter(|doc| !doc.contains("web-v6"))
        .collect::<Vec<_>>()
        .join("---");
    let without_v6_slice = state_with(&without);
    let mut selection = with_v6_slice.select(&name("web")).expect("served");
    assert_eq!(
        selection.skipped,
        [SkippedPart {
            part: "EndpointSlice web-v6".to_owned(),
            reason: SkipReason::FamilyNotServed(Family::V6),
        }]
    );
    selection.skipped.clear();
    assert_eq!(
        Some(selection),
        without_v6_slice.select(&name("web")),
        "the IPv4 frontends are as without the slice"
    );
    assert_eq!(with_v6_slice.skipped().count(), 0, "the Service is served");
}

/// Shared out between threads or not, the selections are those of one at a time, in order.
#[test]
fn many_services_are_selected_as_one_at_a_time_would() {
    let count = SELECT_APART_FROM * 3 + 7;
    let yaml: Vec<String> = (0..count)
        .map(|n| {
            WEB.replace("name: web,", &format!("name: web{n},"))
                .replace("name: web-1,", &format!("name: web{n}-1,"))
                .replace("service-name: web}", &format!("service-name: web{n}}}"))
                .replace("10.96.0.10", &format!("10.96.{}.{}", n / 250, n % 250 + 1))
        })
        .collect();
    let state = state_with(&yaml.join("---\n"));
    let mut names: Vec<ServiceName> = (0..count).map(|n| name(&format!("web{n}"))).collect();
    names.push(name("missing"));
    let names: Vec<&ServiceName> = names.iter().collect();
    for names in [&names[..], &names[..SELECT_APART_FROM - 1]] {
        let each = state.select_each(names);
        let one_at_a_time: Vec<_> = names.iter().map(|name| state.select(name)).collect();
        assert_eq!(each.len(), names.len());
        assert_eq!(format!("{each:?}"), format!("{one_at_a_time:?}"));
    }
    // Each has its own slice: the last one's endpoint is chosen.
    let last = state.select_each(&names)[count - 1]
        .clone()
        .expect("selected");
    assert!(format!("{last:?}").contains("10.0.0.1"), "{last:?}");
}
