//! Selection rules, one table row per rule and per fallback.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use super::*;
use crate::desired::Protocol;

/// The address `last` of a test network of `family`: 10.0.<net>.<last> or fd00::<net>:<last>.
fn ip(family: Family, net: u8, last: u8) -> IpAddr {
    match family {
        Family::V4 => Ipv4Addr::new(10, 0, net, last).into(),
        Family::V6 => Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, net.into(), last.into()).into(),
    }
}

/// The ClusterIP of `family`: 10.96.0.1 or fd00:96::1.
fn vip(family: Family) -> IpAddr {
    match family {
        Family::V4 => Ipv4Addr::new(10, 96, 0, 1).into(),
        Family::V6 => "fd00:96::1".parse().expect("address"),
    }
}

const NODE: &str = "node-a";

fn this_node() -> ThisNode {
    ThisNode {
        name: NODE.to_owned(),
        labels: BTreeMap::from([
            (ZONE_LABEL.to_owned(), "zone-a".to_owned()),
            ("rack".to_owned(), "r1".to_owned()),
        ]),
        addresses: vec![
            Ipv4Addr::new(192, 168, 0, 1).into(),
            "fd00:168::1".parse().expect("address"),
        ],
    }
}

fn node_labels() -> NodeLabels {
    let node = |zone: &str, rack: &str| {
        BTreeMap::from([
            (ZONE_LABEL.to_owned(), zone.to_owned()),
            ("rack".to_owned(), rack.to_owned()),
        ])
    };
    BTreeMap::from([
        ("node-a".to_owned(), node("zone-a", "r1")),
        ("node-b".to_owned(), node("zone-a", "r2")),
        ("node-c".to_owned(), node("zone-b", "r3")),
    ])
}

fn service() -> ServiceInfo {
    ServiceInfo {
        name: ServiceName {
            namespace: "default".to_owned(),
            name: "web".to_owned(),
        },
        families: vec![Family::V4],
        cluster_ips: vec![vip(Family::V4)],
        external_ips: Vec::new(),
        load_balancer_ips: Vec::new(),
        ports: vec![ServicePort {
            name: "http".to_owned(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port: None,
        }],
        partial_skips: Vec::new(),
        internal_traffic_local: false,
        external_traffic_local: false,
        affinity_timeout_seconds: None,
        load_balancer_source_ranges: None,
        maglev: false,
        health_check_node_port: None,
        publish_not_ready_addresses: false,
        topology_keys: None,
    }
}

/// An endpoint 10.0.0.<last> on `node`, ready.
fn ep(last: u8, node: &str) -> Endpoint {
    ep_of(Family::V4, last, node)
}

/// An endpoint 10.0.0.<last> or fd00::<last> on `node`, ready.
fn ep_of(family: Family, last: u8, node: &str) -> Endpoint {
    Endpoint {
        address: Some(ip(family, 0, last)),
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some(node.into()),
        zone: None,
        hints: None,
    }
}

fn not_ready(mut e: Endpoint) -> Endpoint {
    e.ready = false;
    e.serving = false;
    e
}

/// Terminating but still serving (graceful shutdown).
fn terminating(mut e: Endpoint) -> Endpoint {
    e.ready = false;
    e.serving = true;
    e.terminating = true;
    e
}

fn terminating_not_serving(mut e: Endpoint) -> Endpoint {
    e.ready = false;
    e.serving = false;
    e.terminating = true;
    e
}

fn zones(mut e: Endpoint, zones: &[&str]) -> Endpoint {
    e.hints.get_or_insert_default().for_zones = zones.iter().map(|z| (*z).into()).collect();
    e
}

fn nodes(mut e: Endpoint, nodes: &[&str]) -> Endpoint {
    e.hints.get_or_insert_default().for_nodes = nodes.iter().map(|n| (*n).into()).collect();
    e
}

/// A slice of the family of its first endpoint (IPv4 if none).
fn slice(endpoints: Vec<Endpoint>) -> SliceInfo {
    let family = endpoints
        .iter()
        .find_map(|e| e.address)
        .map_or(Family::V4, Family::of);
    SliceInfo {
        name: format!("web-{}", family.label()),
        family: Some(family),
        ports: vec![SlicePort {
            name: "http".to_owned(),
            protocol: Protocol::Tcp,
            port: 8080,
        }],
        endpoints,
        skipped: Vec::new(),
    }
}

/// Last octets of the backends of the first frontend of `kind` and `scope`.
fn backends_of(selection: &ServiceSelection, kind: FrontendKind, scope: Scope) -> Vec<u8> {
    let choice = selection
        .frontends
        .iter()
        .find(|f| f.kind == kind && f.frontend.scope == scope)
        .unwrap_or_else(|| panic!("no {kind:?} {scope:?} frontend in {selection:#?}"));
    let mut lasts: Vec<u8> = choice
        .spec
        .backends
        .iter()
        .map(|b| b.last_octet())
        .collect();
    lasts.sort_unstable();
    lasts
}

fn cluster_ip(selection: &ServiceSelection) -> &FrontendChoice {
    selection
        .frontends
        .iter()
        .find(|f| f.kind == FrontendKind::ClusterIp)
        .expect("a ClusterIP frontend")
}

struct Row {
    rule: &'static str,
    service: fn(&mut ServiceInfo),
    endpoints: Vec<Endpoint>,
    /// Backends (last octets) of the ClusterIP frontend.
    expected: &'static [u8],
    topology: Topology,
    terminating_fallback: bool,
}

fn unchanged(_: &mut ServiceInfo) {}

#[test]
fn cluster_ip_selection_table() {
    let zone_a = || Topology::ZoneHints {
        zone: "zone-a".to_owned(),
    };
    let rows = vec![
        Row {
            rule: "ready endpoints anywhere, no topology",
            service: unchanged,
            endpoints: vec![ep(1, "node-a"), ep(2, "node-b"), ep(3, "node-c")],
            expected: &[1, 2, 3],
            topology: Topology::None,
            terminating_fallback: false,
        },
        Row {
            rule: "not-ready endpoints are not used",
            service: unchanged,
            endpoints: vec![ep(1, "node-a"), not_ready(ep(2, "node-b"))],
            expected: &[1],
            topology: Topology::None,
            terminating_fallback: false,
        },
        Row {
            rule: "terminating endpoints are not used while a ready one exists",
            service: unchanged,
            endpoints: vec![ep(1, "node-c"), terminating(ep(2, "node-b"))],
            expected: &[1],
            topology: Topology::None,
            terminating_fallback: false,
        },
        Row {
            rule: "no ready endpoint: serving and terminating ones are used",
            service: unchanged,
            endpoints: vec![
                not_ready(ep(1, "node-a")),
                terminating(ep(2, "node-b")),
                terminating(ep(3, "node-c")),
                terminating_not_serving(ep(4, "node-a")),
            ],
            expected: &[2, 3],
            topology: Topology::None,
            terminating_fallback: true,
        },
        Row {
            rule: "nothing ready or serving: no backend (connections refused)",
            service: unchanged,
            endpoints: vec![
                not_ready(ep(1, "node-a")),
                terminating_not_serving(ep(2, "node-b")),
            ],
            expected: &[],
            topology: Topology::None,
            terminating_fallback: false,
        },
        Row {
            rule: "publishNotReadyAddresses: not-ready endpoints count as ready",
            service: |s| s.publish_not_ready_addresses = true,
            endpoints: vec![not_ready(ep(1, "node-a")), ep(2, "node-b")],
            expected: &[1, 2],
            topology: Topology::None,
            terminating_fallback: false,
        },
        Row {
            rule: "zone hints: every ready endpoint hinted, one for this zone",
            service: unchanged,
            endpoints: vec![
                zones(ep(1, "node-a"), &["zone-a"]),
                zones(ep(2, "node-b"), &["zone-a"]),
                zones(ep(3, "node-c"), &["zone-b"]),
            ],
            expected: &[1, 2],
            topology: zone_a(),
            terminating_fallback: false,
        },
        Row {
            rule: "zone hints ignored when one ready endpoint has none",
            service: unchanged,
            endpoints: vec![zones(ep(1, "node-a"), &["zone-a"]), ep(3, "node-c")],
            expected: &[1, 3],
            topology: Topology::HintsIgnored {
                reason: "some ready endpoints have no zone hint".to_owned(),
            },
            terminating_fallback: false,
        },
        Row {
            rule: "zone hints ignored when none names this zone",
            service: unchanged,
            endpoints: vec![
                zones(ep(3, "node-c"), &["zone-b"]),
                zones(ep(4, "node-c"), &["zone-c"]),
            ],
            expected: &[3, 4],
            topology: Topology::HintsIgnored {
                reason: "no endpoint is hinted for zone zone-a".to_owned(),
            },
            terminating_fallback: false,
        },
        Row {
            rule: "zone hints: not-ready endpoints without hints do not disable them",
            service: unchanged,
            endpoints: vec![
                zones(ep(1, "node-a"), &["zone-a"]),
                zones(ep(3, "node-c"), &["zone-b"]),
                not_ready(ep(4, "node-c")),
            ],
            expected: &[1],
            topology: zone_a(),
            terminating_fallback: false,
        },
        Row {
            rule: "node hints win over zone hints when every endpoint has them and one names this node",
            service: unchanged,
            endpoints: vec![
                nodes(zones(ep(1, "node-a"), &["zone-a"]), &["node-a"]),
                nodes(zones(ep(2, "node-b"), &["zone-a"]), &["node-b"]),
            ],
            expected: &[1],
            topology: Topology::NodeHints,
            terminating_fallback: false,
        },
        Row {
            rule: "node hints not naming this node fall back to zone hints",
            service: unchanged,
            endpoints: vec![
                nodes(zones(ep(2, "node-b"), &["zone-a"]), &["node-b"]),
                nodes(zones(ep(3, "node-c"), &["zone-b"]), &["node-c"]),
            ],
            expected: &[2],
            topology: zone_a(),
            terminating_fallback: false,
        },
        Row {
            rule: "no ready endpoint with hints: terminating fallback ignores topology",
            service: unchanged,
            endpoints: vec![
                terminating(zones(ep(3, "node-c"), &["zone-b"])),
                terminating(zones(ep(1, "node-a"), &["zone-a"])),
            ],
            expected: &[1, 3],
            topology: Topology::None,
            terminating_fallback: true,
        },
        Row {
            rule: "topology keys: the first key shared with some endpoint's node wins",
            service: |s| {
                s.topology_keys = Some(vec![
                    "kubernetes.io/hostname".into(),
                    ZONE_LABEL.into(),
                    "*".into(),
                ])
            },
            endpoints: vec![ep(1, "node-b"), ep(2, "node-b"), ep(3, "node-c")],
            expected: &[1, 2],
            topology: Topology::Key {
                key: ZONE_LABEL.to_owned(),
            },
            terminating_fallback: false,
        },
        Row {
            rule: "topology keys: * takes any endpoint",
            service: |s| s.topology_keys = Some(vec!["rack".into(), "*".into()]),
            endpoints: vec![ep(2, "node-b"), ep(3, "node-c")],
            expected: &[2, 3],
            topology: Topology::Key {
                key: "*".to_owned(),
            },
            terminating_fallback: false,
        },
        Row {
            rule: "topology keys: no match and no * means no endpoints",
            service: |s| s.topology_keys = Some(vec!["rack".into()]),
            endpoints: vec![ep(2, "node-b"), ep(3, "node-c")],
            expected: &[],
            topology: Topology::KeysUnmatched,
            terminating_fallback: false,
        },
        Row {
            rule: "topology keys take precedence over hints",
            service: |s| s.topology_keys = Some(vec!["rack".into()]),
            endpoints: vec![
                zones(ep(1, "node-a"), &["zone-b"]),
                zones(ep(3, "node-c"), &["zone-a"]),
            ],
            expected: &[1],
            topology: Topology::Key {
                key: "rack".to_owned(),
            },
            terminating_fallback: false,
        },
        Row {
            rule: "internalTrafficPolicy Local: local ready endpoints only",
            service: |s| s.internal_traffic_local = true,
            endpoints: vec![ep(1, "node-a"), ep(2, "node-b"), ep(5, "node-a")],
            expected: &[1, 5],
            topology: Topology::None,
            terminating_fallback: false,
        },
        Row {
            rule: "internalTrafficPolicy Local: local serving-terminating when no local ready one",
            service: |s| s.internal_traffic_local = true,
            endpoints: vec![terminating(ep(1, "node-a")), ep(2, "node-b")],
            expected: &[1],
            topology: Topology::None,
            terminating_fallback: true,
        },
        Row {
            rule: "internalTrafficPolicy Local: no local endpoint means no backend",
            service: |s| s.internal_traffic_local = true,
            endpoints: vec![ep(2, "node-b")],
            expected: &[],
            topology: Topology::None,
            terminating_fallback: false,
        },
    ];
    // Every rule holds for either family: the same row over an IPv4-only and an
    // IPv6-only Service.
    for row in rows {
        for family in Family::ALL {
            let rule = format!("{} ({family})", row.rule);
            let mut svc = service();
            svc.families = vec![family];
            svc.cluster_ips = vec![vip(family)];
            (row.service)(&mut svc);
            let endpoints = row
                .endpoints
                .iter()
                .cloned()
                .map(|e| in_family(e, family))
                .collect();
            let selection = select(&svc, &[slice(endpoints)], &this_node(), &node_labels());
            assert_eq!(
                backends_of(&selection, FrontendKind::ClusterIp, Scope::Internal),
                row.expected,
                "rule: {rule}"
            );
            let choice = cluster_ip(&selection);
            assert_eq!(choice.family, family, "rule: {rule}");
            assert_eq!(choice.why.topology, row.topology, "rule: {rule}");
            assert_eq!(
                choice.why.terminating_fallback, row.terminating_fallback,
                "rule: {rule}"
            );
        }
    }
}

/// The endpoint moved to `family`'s test network (same last octet).
fn in_family(mut e: Endpoint, family: Family) -> Endpoint {
    e.address = e.address.map(|a| {
        let last = BackendAddr::local(a, 0).last_octet();
        ip(family, 0, last)
    });
    e
}

#[test]
fn externally_reachable_frontends_use_cluster_inside_and_external_policy_outside() {
    let mut svc = service();
    svc.ports[0].node_port = Some(30080);
    svc.external_ips = vec![Ipv4Addr::new(203, 0, 113, 5).into()];
    svc.load_balancer_ips = vec![Ipv4Addr::new(198, 51, 100, 7).into()];
    svc.external_traffic_local = true;
    // internalTrafficPolicy applies to the ClusterIP only.
    svc.internal_traffic_local = true;
    let selection = select(
        &svc,
        &[slice(vec![ep(1, "node-a"), ep(2, "node-b")])],
        &this_node(),
        &node_labels(),
    );
    for kind in [
        FrontendKind::NodePort,
        FrontendKind::ExternalIp,
        FrontendKind::LoadBalancer,
    ] {
        assert_eq!(
            backends_of(&selection, kind, Scope::Internal),
            [1, 2],
            "{kind:?} inside"
        );
        assert_eq!(
            backends_of(&selection, kind, Scope::External),
            [1],
            "{kind:?} outside"
        );
    }
    assert_eq!(
        backends_of(&selection, FrontendKind::ClusterIp, Scope::Internal),
        [1]
    );
    let node_port = selection
        .frontends
        .iter()
        .find(|f| f.kind == FrontendKind::NodePort)
        .expect("node port");
    assert_eq!(
        node_port.frontend.address,
        IpAddr::from(Ipv4Addr::new(192, 168, 0, 1)),
        "an IPv4 Service's NodePort is served on the node's IPv4 addresses only"
    );
    assert_eq!(node_port.frontend.port, 30080);
    assert!(
        !selection
            .frontends
            .iter()
            .any(|f| f.kind == FrontendKind::ClusterIp && f.frontend.scope == Scope::External),
        "a ClusterIP is never an external frontend"
    );
}

#[test]
fn target_ports_come_from_the_slice_port_of_the_same_name_and_protocol() {
    let mut svc = service();
    svc.ports.push(ServicePort {
        name: "dns".to_owned(),
        protocol: Protocol::Udp,
        port: 53,
        node_port: None,
    });
    let mut s = slice(vec![ep(1, "node-a")]);
    s.ports.push(SlicePort {
        name: "dns".to_owned(),
        protocol: Protocol::Udp,
        port: 5353,
    });
    // Same name, other protocol: not a match for "http".
    s.ports.push(SlicePort {
        name: "http".to_owned(),
        protocol: Protocol::Udp,
        port: 9999,
    });
    let selection = select(&svc, &[s], &this_node(), &node_labels());
    let ports: Vec<(u16, Protocol, u16)> = selection
        .frontends
        .iter()
        .map(|f| {
            (
                f.frontend.port,
                f.frontend.protocol,
                f.spec.backends[0].port,
            )
        })
        .collect();
    assert_eq!(
        ports,
        [(80, Protocol::Tcp, 8080), (53, Protocol::Udp, 5353)]
    );
}

#[test]
fn a_duplicate_address_across_slices_counts_once_and_the_non_terminating_copy_wins() {
    let svc = service();
    let first = slice(vec![terminating(ep(1, "node-a"))]);
    let second = slice(vec![ep(1, "node-a"), ep(2, "node-b")]);
    let selection = select(&svc, &[first, second], &this_node(), &node_labels());
    let choice = cluster_ip(&selection);
    assert_eq!(choice.spec.backends.len(), 2);
    assert!(!choice.why.terminating_fallback);
}

#[test]
fn a_port_without_endpoints_refuses_and_affinity_is_carried() {
    let mut svc = service();
    svc.affinity_timeout_seconds = Some(10800);
    let selection = select(&svc, &[], &this_node(), &node_labels());
    let choice = cluster_ip(&selection);
    assert!(choice.spec.backends.is_empty());
    assert_eq!(choice.spec.affinity_timeout_seconds, Some(10800));
}

#[test]
fn endpoints_without_an_address_are_ignored() {
    let svc = service();
    let mut missing = ep(9, "node-a");
    missing.address = None;
    let selection = select(
        &svc,
        &[slice(vec![missing, ep(1, "node-a")])],
        &this_node(),
        &node_labels(),
    );
    assert_eq!(
        backends_of(&selection, FrontendKind::ClusterIp, Scope::Internal),
        [1]
    );
}

#[test]
fn backends_on_other_nodes_or_no_node_are_remote() {
    let svc = service();
    let mut nameless = ep(3, "node-a");
    nameless.node_name = None;
    let selection = select(
        &svc,
        &[slice(vec![ep(1, "node-a"), ep(2, "node-b"), nameless])],
        &this_node(),
        &node_labels(),
    );
    let remote: Vec<(u8, bool)> = cluster_ip(&selection)
        .spec
        .backends
        .iter()
        .map(|b| (b.last_octet(), b.remote))
        .collect();
    assert_eq!(remote, [(1, false), (2, true), (3, true)]);
}

/// A slice whose ports are `names` (TCP, 8080 and up).
fn slice_with_ports(names: &[&str], endpoints: Vec<Endpoint>) -> SliceInfo {
    SliceInfo {
        ports: names
            .iter()
            .zip(8080..)
            .map(|(name, port)| SlicePort {
                name: (*name).to_owned(),
                protocol: Protocol::Tcp,
                port,
            })
            .collect(),
        name: "web-ports".to_owned(),
        family: Some(Family::V4),
        endpoints,
        skipped: Vec::new(),
    }
}

#[test]
fn local_ready_endpoints_table() {
    struct CountRow {
        rule: &'static str,
        service: fn(&mut ServiceInfo),
        slices: Vec<SliceInfo>,
        expected: usize,
    }
    fn publish_not_ready(s: &mut ServiceInfo) {
        s.publish_not_ready_addresses = true;
    }
    let nameless = {
        let mut e = ep(3, "node-a");
        e.node_name = None;
        e
    };
    let rows = [
        CountRow {
            rule: "a ready endpoint on this node counts",
            service: unchanged,
            slices: vec![slice(vec![ep(1, "node-a"), ep(2, "node-b")])],
            expected: 1,
        },
        CountRow {
            rule: "every ready endpoint on this node counts",
            service: unchanged,
            slices: vec![slice(vec![ep(1, "node-a"), ep(2, "node-a")])],
            expected: 2,
        },
        CountRow {
            rule: "endpoints on other nodes or on no node do not count",
            service: unchanged,
            slices: vec![slice(vec![ep(2, "node-b"), nameless])],
            expected: 0,
        },
        CountRow {
            rule: "a not-ready endpoint on this node does not count",
            service: unchanged,
            slices: vec![slice(vec![not_ready(ep(1, "node-a"))])],
            expected: 0,
        },
        CountRow {
            rule: "serving-and-terminating endpoints do not count (no fallback)",
            service: unchanged,
            slices: vec![slice(vec![terminating(ep(1, "node-a"))])],
            expected: 0,
        },
        CountRow {
            rule: "publishNotReadyAddresses counts not-ready endpoints as ready",
            service: publish_not_ready,
            slices: vec![slice(vec![not_ready(ep(1, "node-a"))])],
            expected: 1,
        },
        CountRow {
            rule: "an address serving two ports counts once",
            service: unchanged,
            slices: vec![slice_with_ports(&["http", "https"], vec![ep(1, "node-a")])],
            expected: 1,
        },
        CountRow {
            rule: "a slice port the Service does not have still counts (kube-proxy counts slice ports)",
            service: unchanged,
            slices: vec![slice_with_ports(&["metrics"], vec![ep(1, "node-a")])],
            expected: 1,
        },
        CountRow {
            rule: "a slice without ports gives no endpoints",
            service: unchanged,
            slices: vec![slice_with_ports(&[], vec![ep(1, "node-a")])],
            expected: 0,
        },
        CountRow {
            rule: "an address in two slices counts once, the non-terminating copy winning",
            service: unchanged,
            slices: vec![
                slice(vec![terminating(ep(1, "node-a"))]),
                slice(vec![ep(1, "node-a")]),
            ],
            expected: 1,
        },
        CountRow {
            rule: "an endpoint without an address does not count",
            service: unchanged,
            slices: vec![slice(vec![Endpoint {
                address: None,
                ..ep(1, "node-a")
            }])],
            expected: 0,
        },
    ];
    for row in rows {
        let mut svc = service();
        (row.service)(&mut svc);
        assert_eq!(
            local_ready_endpoints(&svc, &row.slices, &this_node()),
            row.expected,
            "rule: {}",
            row.rule
        );
    }
}

#[test]
fn the_health_check_carries_its_port_and_the_local_count() {
    let mut svc = service();
    let slices = [slice(vec![ep(1, "node-a"), ep(2, "node-b")])];
    let selection = select(&svc, &slices, &this_node(), &node_labels());
    assert_eq!(selection.health_check, None, "no healthCheckNodePort");

    svc.health_check_node_port = Some(32000);
    let selection = select(&svc, &slices, &this_node(), &node_labels());
    assert_eq!(
        selection.health_check,
        Some(HealthCheck {
            node_port: 32000,
            local_endpoints: 1
        })
    );
}

/// Every frontend of a selection as one line: `address kind/scope: backends`.
fn render(selection: &ServiceSelection) -> Vec<String> {
    selection
        .frontends
        .iter()
        .map(|f| {
            let backends: Vec<String> = f.spec.backends.iter().map(ToString::to_string).collect();
            let ranges = f.spec.source_ranges.as_ref().map_or(String::new(), |r| {
                let r: Vec<String> = r.iter().map(ToString::to_string).collect();
                format!(" ranges [{}]", r.join(" "))
            });
            format!(
                "{} {:?}/{:?}: {}{ranges}",
                f.frontend.address,
                f.kind,
                f.frontend.scope,
                backends.join(" ")
            )
        })
        .collect()
}

fn dual_stack(s: &mut ServiceInfo) {
    s.families = vec![Family::V4, Family::V6];
    s.cluster_ips = vec![vip(Family::V4), vip(Family::V6)];
}

fn ipv6_only(s: &mut ServiceInfo) {
    s.families = vec![Family::V6];
    s.cluster_ips = vec![vip(Family::V6)];
}

#[test]
fn families_table() {
    struct FamilyRow {
        rule: &'static str,
        service: fn(&mut ServiceInfo),
        slices: Vec<SliceInfo>,
        frontends: &'static [&'static str],
        skipped: Vec<(&'static str, SkipReason)>,
    }
    let v4 = |last, node| ep_of(Family::V4, last, node);
    let v6 = |last, node| ep_of(Family::V6, last, node);
    let rows = vec![
        FamilyRow {
            rule: "dual-stack: each family's ClusterIP gets its own family's endpoints",
            service: dual_stack,
            slices: vec![
                slice(vec![v4(1, "node-a"), v4(2, "node-b")]),
                slice(vec![v6(1, "node-a"), v6(3, "node-c")]),
            ],
            frontends: &[
                "10.96.0.1 ClusterIp/Internal: 10.0.0.1:8080 10.0.0.2:8080",
                "fd00:96::1 ClusterIp/Internal: [fd00::1]:8080 [fd00::3]:8080",
            ],
            skipped: vec![],
        },
        FamilyRow {
            rule: "dual-stack without IPv6 endpoints: the IPv6 ClusterIP refuses, never crosses",
            service: dual_stack,
            slices: vec![slice(vec![v4(1, "node-a")])],
            frontends: &[
                "10.96.0.1 ClusterIp/Internal: 10.0.0.1:8080",
                "fd00:96::1 ClusterIp/Internal: ",
            ],
            skipped: vec![],
        },
        FamilyRow {
            rule: "an IPv6 slice for an IPv4-only Service is skipped, the rest unchanged",
            service: unchanged,
            slices: vec![slice(vec![v4(1, "node-a")]), slice(vec![v6(1, "node-a")])],
            frontends: &["10.96.0.1 ClusterIp/Internal: 10.0.0.1:8080"],
            skipped: vec![(
                "EndpointSlice web-ipv6",
                SkipReason::FamilyNotServed(Family::V6),
            )],
        },
        FamilyRow {
            rule: "an IPv4 slice for an IPv6-only Service is skipped",
            service: ipv6_only,
            slices: vec![slice(vec![v4(1, "node-a")]), slice(vec![v6(1, "node-a")])],
            frontends: &["fd00:96::1 ClusterIp/Internal: [fd00::1]:8080"],
            skipped: vec![(
                "EndpointSlice web-ipv4",
                SkipReason::FamilyNotServed(Family::V4),
            )],
        },
        FamilyRow {
            rule: "an endpoint address of the other family in a slice is never used",
            service: dual_stack,
            slices: vec![slice(vec![v4(1, "node-a"), v6(2, "node-a")])],
            frontends: &[
                "10.96.0.1 ClusterIp/Internal: 10.0.0.1:8080",
                "fd00:96::1 ClusterIp/Internal: ",
            ],
            skipped: vec![],
        },
        FamilyRow {
            rule: "NodePorts: on the node's addresses of each family served",
            service: |s| {
                dual_stack(s);
                s.cluster_ips.clear();
                s.ports[0].node_port = Some(30080);
            },
            slices: vec![slice(vec![v4(1, "node-a")]), slice(vec![v6(1, "node-a")])],
            frontends: &[
                "192.168.0.1 NodePort/Internal: 10.0.0.1:8080",
                "192.168.0.1 NodePort/External: 10.0.0.1:8080",
                "fd00:168::1 NodePort/Internal: [fd00::1]:8080",
                "fd00:168::1 NodePort/External: [fd00::1]:8080",
            ],
            skipped: vec![],
        },
        FamilyRow {
            rule: "NodePorts of an IPv4-only Service: not on the node's IPv6 addresses",
            service: |s| {
                s.cluster_ips.clear();
                s.ports[0].node_port = Some(30080);
            },
            slices: vec![slice(vec![v4(1, "node-a")])],
            frontends: &[
                "192.168.0.1 NodePort/Internal: 10.0.0.1:8080",
                "192.168.0.1 NodePort/External: 10.0.0.1:8080",
            ],
            skipped: vec![],
        },
        FamilyRow {
            rule: "externalTrafficPolicy Local per family: IPv6 has no local endpoint",
            service: |s| {
                dual_stack(s);
                s.cluster_ips.clear();
                s.external_ips = vec![
                    Ipv4Addr::new(203, 0, 113, 5).into(),
                    "fd00:203::5".parse().expect("address"),
                ];
                s.external_traffic_local = true;
            },
            slices: vec![
                slice(vec![v4(1, "node-a"), v4(2, "node-b")]),
                slice(vec![v6(3, "node-b")]),
            ],
            frontends: &[
                "203.0.113.5 ExternalIp/Internal: 10.0.0.1:8080 10.0.0.2:8080",
                "203.0.113.5 ExternalIp/External: 10.0.0.1:8080",
                "fd00:203::5 ExternalIp/Internal: [fd00::3]:8080",
                "fd00:203::5 ExternalIp/External: ",
            ],
            skipped: vec![],
        },
        FamilyRow {
            rule: "terminating fallback per family: IPv6 has only terminating endpoints",
            service: dual_stack,
            slices: vec![
                slice(vec![v4(1, "node-a"), terminating(v4(2, "node-b"))]),
                slice(vec![terminating(v6(2, "node-b"))]),
            ],
            frontends: &[
                "10.96.0.1 ClusterIp/Internal: 10.0.0.1:8080",
                "fd00:96::1 ClusterIp/Internal: [fd00::2]:8080",
            ],
            skipped: vec![],
        },
        FamilyRow {
            rule: "zone hints per family: IPv4 hinted, IPv6 not",
            service: dual_stack,
            slices: vec![
                slice(vec![
                    zones(v4(1, "node-a"), &["zone-a"]),
                    zones(v4(3, "node-c"), &["zone-b"]),
                ]),
                slice(vec![v6(1, "node-a"), v6(3, "node-c")]),
            ],
            frontends: &[
                "10.96.0.1 ClusterIp/Internal: 10.0.0.1:8080",
                "fd00:96::1 ClusterIp/Internal: [fd00::1]:8080 [fd00::3]:8080",
            ],
            skipped: vec![],
        },
        FamilyRow {
            rule: "source ranges: each family's LoadBalancer IPs admit that family's ranges",
            service: |s| {
                dual_stack(s);
                s.cluster_ips.clear();
                s.load_balancer_ips = vec![
                    Ipv4Addr::new(198, 51, 100, 7).into(),
                    "fd00:198::7".parse().expect("address"),
                ];
                s.load_balancer_source_ranges = Some(vec![
                    "10.0.0.0/8".parse().expect("range"),
                    "fd00:1::/64".parse().expect("range"),
                ]);
            },
            slices: vec![slice(vec![v4(1, "node-a")]), slice(vec![v6(1, "node-a")])],
            frontends: &[
                "198.51.100.7 LoadBalancer/Internal: 10.0.0.1:8080",
                "198.51.100.7 LoadBalancer/External: 10.0.0.1:8080 ranges [10.0.0.0/8]",
                "fd00:198::7 LoadBalancer/Internal: [fd00::1]:8080",
                "fd00:198::7 LoadBalancer/External: [fd00::1]:8080 ranges [fd00:1::/64]",
            ],
            skipped: vec![],
        },
        FamilyRow {
            rule: "source ranges of one family only: the other family's LoadBalancer IPs admit nobody",
            service: |s| {
                dual_stack(s);
                s.cluster_ips.clear();
                s.load_balancer_ips = vec!["fd00:198::7".parse().expect("address")];
                s.load_balancer_source_ranges = Some(vec!["10.0.0.0/8".parse().expect("range")]);
            },
            slices: vec![slice(vec![v6(1, "node-a")])],
            frontends: &[
                "fd00:198::7 LoadBalancer/Internal: [fd00::1]:8080",
                "fd00:198::7 LoadBalancer/External: [fd00::1]:8080 ranges []",
            ],
            skipped: vec![],
        },
    ];
    for row in rows {
        let mut svc = service();
        (row.service)(&mut svc);
        let selection = select(&svc, &row.slices, &this_node(), &node_labels());
        assert_eq!(render(&selection), row.frontends, "rule: {}", row.rule);
        for choice in &selection.frontends {
            assert_eq!(choice.family, Family::of(choice.frontend.address));
            assert!(
                choice
                    .spec
                    .backends
                    .iter()
                    .all(|b| Family::of(b.address) == choice.family),
                "rule: {}: a backend crossed families: {choice:?}",
                row.rule
            );
        }
        let skipped: Vec<(&str, SkipReason)> = selection
            .skipped
            .iter()
            .map(|s| (s.part.as_str(), s.reason.clone()))
            .collect();
        assert_eq!(skipped, row.skipped, "rule: {}", row.rule);
    }
}

#[test]
fn a_slice_of_a_family_not_served_changes_nothing_else() {
    let svc = service();
    let v4 = slice(vec![ep(1, "node-a"), ep(2, "node-b")]);
    let v6 = slice(vec![ep_of(Family::V6, 1, "node-a")]);
    let without = select(
        &svc,
        std::slice::from_ref(&v4),
        &this_node(),
        &node_labels(),
    );
    let mut with = select(&svc, &[v4, v6], &this_node(), &node_labels());
    assert_eq!(with.skipped.len(), 1);
    assert_eq!(with.skipped[0].reason.label(), "family-not-served");
    with.skipped.clear();
    assert_eq!(with, without);
}

#[test]
fn a_dual_stack_pod_counts_once_for_the_health_check() {
    let mut svc = service();
    dual_stack(&mut svc);
    let slices = [
        slice(vec![ep_of(Family::V4, 1, "node-a")]),
        slice(vec![
            ep_of(Family::V6, 1, "node-a"),
            not_ready(ep_of(Family::V6, 2, "node-a")),
        ]),
    ];
    assert_eq!(local_ready_endpoints(&svc, &slices, &this_node()), 1);
    // An IPv4-only Service does not count its IPv6 slice's endpoints.
    let slices = [slice(vec![
        ep_of(Family::V6, 1, "node-a"),
        ep_of(Family::V6, 2, "node-a"),
    ])];
    assert_eq!(local_ready_endpoints(&service(), &slices, &this_node()), 0);
}

#[test]
fn affinity_and_maglev_apply_to_both_families_of_a_dual_stack_service() {
    let mut svc = service();
    dual_stack(&mut svc);
    svc.affinity_timeout_seconds = Some(600);
    svc.maglev = true;
    svc.ports[0].node_port = Some(30080);
    let selection = select(
        &svc,
        &[
            slice(vec![ep_of(Family::V4, 1, "node-a")]),
            slice(vec![ep_of(Family::V6, 1, "node-a")]),
        ],
        &this_node(),
        &node_labels(),
    );
    for family in Family::ALL {
        let of_family: Vec<&FrontendChoice> = selection
            .frontends
            .iter()
            .filter(|f| f.family == family)
            .collect();
        assert_eq!(
            of_family.len(),
            3,
            "{family}: ClusterIP, NodePort inside and outside"
        );
        for choice in of_family {
            assert_eq!(
                choice.spec.affinity_timeout_seconds,
                Some(600),
                "{choice:?}"
            );
            assert_eq!(
                choice.spec.maglev,
                choice.frontend.scope == Scope::External,
                "{choice:?}"
            );
        }
    }
}

#[test]
fn a_frontend_with_more_distinct_endpoints_than_slots_is_refused_with_their_count() {
    let backend = |i: u32| BackendAddr::local(Ipv4Addr::from(0x0a00_0000 + i), 8080);
    let distinct = |count: u32| (0..count).map(backend).collect::<Vec<_>>();
    let mut duplicated = distinct(65_535);
    duplicated.extend(distinct(10));
    // (backends, refusal)
    let rows = [
        (distinct(3), None),
        (distinct(65_535), None),
        (duplicated, None),
        (
            distinct(65_536),
            Some(Refusal::TooManyEndpoints {
                endpoints: 65_536,
                limit: 65_535,
            }),
        ),
        (
            distinct(69_999),
            Some(Refusal::TooManyEndpoints {
                endpoints: 69_999,
                limit: 65_535,
            }),
        ),
    ];
    for (backends, expected) in rows {
        assert_eq!(refusal(&backends), expected, "{} backends", backends.len());
    }
    let message = refusal(&distinct(69_999)).map(|r| r.to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.starts_with("69999 endpoints, more than the 65535")),
        "{message:?}"
    );
}
