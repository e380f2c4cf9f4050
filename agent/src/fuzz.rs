//! Property tests of the whole pure pipeline: random and malformed Services, EndpointSlices
//! and Nodes go through conversion, cluster state, selection, the frontend table, explain and
//! the map writer. None of it may panic, what the writer leaves in the maps stays consistent
//! for a concurrent reader (also one that read a count just before it changed), and a bad
//! object never changes another Service's frontends.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use k8s_openapi::{
    api::{
        core::v1::{
            ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, NodeSpec,
            NodeStatus, Service, ServicePort, ServiceSpec, ServiceStatus, SessionAffinityConfig,
        },
        discovery::v1::{
            Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode,
            ForZone,
        },
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use proptest::{collection::vec, option, prelude::*};

use crate::{
    desired::{BackendAddr, Desired, Frontend, FrontendSpec, Protocol},
    explain,
    frontends::FrontendTable,
    maps::writer::{Capacity, MapContents, Room, Writer, recorder::Recorder},
    source::{Event, Object, file::parse},
    state::{
        ClusterState,
        convert::{SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL, TOPOLOGY_KEYS_ANNOTATION},
    },
};

const THIS_NODE: &str = "node-a";

/// Strings a field may hold: well-formed values, near misses and garbage.
fn text(good: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(good).prop_map(str::to_owned),
        1 => proptest::sample::select(&[
            "", " ", "-1", "0", "65536", "4294967296", "::", "fd00::1", "10.96.0.300",
            "10.96.0.1/33", "256.1.1.1", "1.2.3", "0.0.0.0", "255.255.255.255", "127.0.0.1",
            "None", "null", "TCP ", "tcp", "Ünïcödé", "10.96.0.1\0",
        ][..])
        .prop_map(str::to_owned),
        1 => ".{0,40}",
    ]
}

fn opt_text(good: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
    option::of(text(good))
}

fn port_number() -> impl Strategy<Value = i32> {
    prop_oneof![4 => 1..100i32, 1 => any::<i32>(), 1 => Just(0), 1 => Just(65_535), 1 => Just(70_000)]
}

const ADDRESSES: &[&str] = &[
    "10.96.0.10",
    "10.96.0.11",
    "10.0.0.1",
    "10.0.0.2",
    "192.0.2.1",
    "fd00:96::10",
    "fd00::1",
    "fd00:192::1",
    "::ffff:10.0.0.1",
];
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP"];
const NAMES: &[&str] = &["web", "dns", "db", "a", "b"];
const PORT_NAMES: &[&str] = &["http", "dns", ""];
const ZONES: &[&str] = &["zone-a", "zone-b"];
const NODES: &[&str] = &["node-a", "node-b", "node-c"];

/// Which namespaces generated objects are in.
#[derive(Clone, Copy)]
enum Namespaces {
    /// Any, the baseline's `default` and none (which means `default`) included.
    Any,
    /// Only one the baseline does not use.
    Other,
}

impl Namespaces {
    fn strategy(self) -> BoxedStrategy<Option<String>> {
        match self {
            Self::Any => opt_text(&["default", "kube-system"]).boxed(),
            Self::Other => Just(Some("zz-fuzz".to_owned())).boxed(),
        }
    }
}

fn meta(namespace: Namespaces) -> BoxedStrategy<ObjectMeta> {
    (
        namespace.strategy(),
        opt_text(NAMES),
        option::of(vec(
            (
                text(&[SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL]),
                text(NAMES),
            ),
            0..3,
        )),
        option::of(vec(
            (
                text(&[
                    TOPOLOGY_KEYS_ANNOTATION,
                    "socklb.io/lb-algorithm",
                    "service.beta.kubernetes.io/load-balancer-source-ranges",
                ]),
                text(&[
                    "[\"*\"]",
                    "[\"topology.kubernetes.io/zone\"]",
                    "maglev",
                    "random",
                    "10.0.0.0/8",
                    "[",
                    "[1]",
                ]),
            ),
            0..3,
        )),
    )
        .prop_map(|(namespace, name, labels, annotations)| ObjectMeta {
            namespace,
            name,
            labels: labels.map(|l| l.into_iter().collect()),
            annotations: annotations.map(|a| a.into_iter().collect()),
            ..ObjectMeta::default()
        })
        .boxed()
}

fn service_port() -> BoxedStrategy<ServicePort> {
    (
        opt_text(PORT_NAMES),
        port_number(),
        option::of(prop_oneof![
            port_number().prop_map(IntOrString::Int),
            text(PORT_NAMES).prop_map(IntOrString::String),
        ]),
        option::of(prop_oneof![3 => 30_000..30_010i32, 1 => any::<i32>()]),
        opt_text(PROTOCOLS),
    )
        .prop_map(
            |(name, port, target_port, node_port, protocol)| ServicePort {
                name,
                port,
                target_port,
                node_port,
                protocol,
                ..ServicePort::default()
            },
        )
        .boxed()
}

prop_compose! {
    /// A spec with each field selection reads, named next to what it may hold.
    fn service_spec()(
        type_ in opt_text(&["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]),
        cluster_ip in opt_text(ADDRESSES),
        cluster_ips in option::of(vec(text(ADDRESSES), 0..3)),
        ports in option::of(vec(service_port(), 0..4)),
        external_ips in option::of(vec(text(ADDRESSES), 0..3)),
        external_traffic_policy in opt_text(&["Cluster", "Local"]),
        internal_traffic_policy in opt_text(&["Cluster", "Local"]),
        session_affinity in opt_text(&["ClientIP", "None"]),
        timeout in option::of(any::<i32>()),
        load_balancer_source_ranges in option::of(vec(
            text(&["10.0.0.0/8", "192.0.2.0/24", "fd00::/8", "::ffff:0:0/96"]),
            0..3,
        )),
        health_check_node_port in option::of(any::<i32>()),
        ip_families in option::of(vec(text(&["IPv4", "IPv6"]), 0..3)),
    ) -> ServiceSpec {
        ServiceSpec {
            type_,
            cluster_ip,
            cluster_ips,
            ports,
            external_ips,
            external_traffic_policy,
            internal_traffic_policy,
            session_affinity,
            session_affinity_config: timeout.map(|timeout_seconds| SessionAffinityConfig {
                client_ip: Some(ClientIPConfig {
                    timeout_seconds: Some(timeout_seconds),
                }),
            }),
            load_balancer_source_ranges,
            health_check_node_port,
            ip_families,
            ..ServiceSpec::default()
        }
    }
}

fn service(namespace: Namespaces) -> BoxedStrategy<Service> {
    let status = option::of(vec(
        (opt_text(ADDRESSES), opt_text(&["VIP", "Proxy"])),
        0..3,
    ));
    (meta(namespace), service_spec(), status)
        .prop_map(|(metadata, spec, status)| Service {
            metadata,
            spec: Some(spec),
            status: status.map(|ingress| ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(
                        ingress
                            .into_iter()
                            .map(|(ip, ip_mode)| LoadBalancerIngress {
                                ip,
                                ip_mode,
                                ..LoadBalancerIngress::default()
                            })
                            .collect(),
                    ),
                }),
                ..ServiceStatus::default()
            }),
        })
        .boxed()
}

fn endpoint() -> BoxedStrategy<Endpoint> {
    (
        vec(
            text(&["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1", "fd00::2"]),
            0..3,
        ),
        option::of((
            option::of(any::<bool>()),
            option::of(any::<bool>()),
            option::of(any::<bool>()),
        )),
        opt_text(NODES),
        opt_text(ZONES),
        option::of((
            option::of(vec(text(ZONES), 0..3)),
            option::of(vec(text(NODES), 0..3)),
        )),
    )
        .prop_map(|(addresses, conditions, node_name, zone, hints)| Endpoint {
            addresses,
            conditions: conditions.map(|(ready, serving, terminating)| EndpointConditions {
                ready,
                serving,
                terminating,
            }),
            node_name,
            zone,
            hints: hints.map(|(zones, nodes)| EndpointHints {
                for_zones: zones.map(|z| z.into_iter().map(|name| ForZone { name }).collect()),
                for_nodes: nodes.map(|n| n.into_iter().map(|name| ForNode { name }).collect()),
            }),
            ..Endpoint::default()
        })
        .boxed()
}

fn slice(namespace: Namespaces) -> BoxedStrategy<EndpointSlice> {
    (
        meta(namespace),
        text(&["IPv4", "IPv6", "FQDN"]),
        vec(endpoint(), 0..4),
        option::of(vec(
            (
                opt_text(PORT_NAMES),
                option::of(port_number()),
                opt_text(PROTOCOLS),
            ),
            0..3,
        )),
    )
        .prop_map(|(metadata, address_type, endpoints, ports)| EndpointSlice {
            metadata,
            address_type,
            endpoints,
            ports: ports.map(|ports| {
                ports
                    .into_iter()
                    .map(|(name, port, protocol)| EndpointPort {
                        name,
                        port,
                        protocol,
                        ..EndpointPort::default()
                    })
                    .collect()
            }),
        })
        .boxed()
}

fn node(names: &'static [&'static str]) -> BoxedStrategy<Node> {
    (
        opt_text(names),
        option::of(vec(
            (text(&["topology.kubernetes.io/zone"]), text(ZONES)),
            0..2,
        )),
        option::of(vec(
            (
                text(&["InternalIP", "ExternalIP", "Hostname"]),
                text(ADDRESSES),
            ),
            0..3,
        )),
    )
        .prop_map(|(name, labels, addresses)| Node {
            metadata: ObjectMeta {
                name,
                labels: labels.map(|l| l.into_iter().collect()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec::default()),
            status: addresses.map(|addresses| NodeStatus {
                addresses: Some(
                    addresses
                        .into_iter()
                        .map(|(type_, address)| NodeAddress { address, type_ })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
        })
        .boxed()
}

fn object(namespaces: Namespaces, nodes: &'static [&'static str]) -> BoxedStrategy<Object> {
    prop_oneof![
        service(namespaces).prop_map(|s| Object::Service(Box::new(s))),
        slice(namespaces).prop_map(|s| Object::EndpointSlice(Box::new(s))),
        node(nodes).prop_map(|n| Object::Node(Box::new(n))),
    ]
    .boxed()
}

fn event(namespaces: Namespaces, nodes: &'static [&'static str]) -> BoxedStrategy<Event> {
    prop_oneof![
        4 => object(namespaces, nodes).prop_map(Event::Applied),
        1 => object(namespaces, nodes).prop_map(Event::Deleted),
    ]
    .boxed()
}

/// Small maps, so that full maps are exercised too.
const CAPACITY: Capacity = Capacity::both(Room {
    service_entries: 64,
    backends: 32,
});

/// Applies `events` and programs the result, as the runner's sync does.
fn sync(
    state: &mut ClusterState,
    table: &mut FrontendTable,
    writer: &mut Writer<Recorder>,
    events: Vec<Event>,
) -> Desired<'static> {
    for event in events {
        state.apply(event);
    }
    for name in state.take_changes().services {
        let selection = state.select(&name);
        table.update(&name, selection);
    }
    let desired = table.desired().into_owned();
    writer
        .apply(&desired)
        .expect("the in-memory maps never fail a write");
    let _ = explain::table(&explain::explain(
        state,
        crate::select::socket_path::Scope::Pods,
        &explain::Only::default(),
    ));
    desired
}

/// Two well-formed Services of namespace `default` on this node, one of them dual-stack.
const BASELINE: &str = "
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
status: {addresses: [{type: InternalIP, address: 192.0.2.1}, {type: InternalIP, address: 'fd00:192::1'}]}
---
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}]
---
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints:
- {addresses: [10.0.0.1], conditions: {ready: true}, nodeName: node-a, zone: zone-a}
- {addresses: [10.0.0.2], conditions: {ready: true}, nodeName: node-b, zone: zone-b}
ports: [{name: http, port: 8080, protocol: TCP}]
---
kind: Service
metadata: {name: dns, namespace: default}
spec:
  type: NodePort
  ipFamilies: [IPv4, IPv6]
  clusterIP: 10.96.0.11
  clusterIPs: [10.96.0.11, 'fd00:96::11']
  ports: [{name: dns, port: 53, nodePort: 30053, protocol: UDP}]
---
kind: EndpointSlice
metadata: {name: dns-1, namespace: default, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
endpoints:
- {addresses: [10.0.0.3], nodeName: node-c}
ports: [{name: dns, port: 53, protocol: UDP}]
---
kind: EndpointSlice
metadata: {name: dns-2, namespace: default, labels: {kubernetes.io/service-name: dns}}
addressType: IPv6
endpoints:
- {addresses: ['fd00::3'], nodeName: node-a}
ports: [{name: dns, port: 53, protocol: UDP}]
";

/// The baseline's events, parsed once: YAML parsing would otherwise dominate every case.
fn baseline() -> Vec<Event> {
    static OBJECTS: std::sync::LazyLock<Vec<Object>> = std::sync::LazyLock::new(|| {
        parse(std::path::Path::new("baseline.yaml"), BASELINE).expect("the baseline parses")
    });
    OBJECTS.iter().cloned().map(Event::Applied).collect()
}

/// A property's configuration: `cases` cases, no failure files. The properties
/// together run over 100,000 cases.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn fresh() -> (ClusterState, FrontendTable, Writer<Recorder>) {
    (
        ClusterState::new(THIS_NODE),
        FrontendTable::default(),
        Writer::adopt(Recorder::default(), CAPACITY, MapContents::default()),
    )
}

/// What the writer programmed for each of `frontends`.
fn programmed(writer: &Writer<Recorder>, frontends: &[Frontend]) -> BTreeMap<Frontend, String> {
    frontends
        .iter()
        .map(|f| (*f, format!("{:?}", writer.programmed(f))))
        .collect()
}

proptest! {
    #![proptest_config(config(70_000))]

    /// Any sequence of objects, this node's included: no panic, consistent maps.
    #[test]
    fn any_objects_never_panic_and_leave_consistent_maps(
        events in vec(event(Namespaces::Any, NODES), 1..6),
    ) {
        let (mut state, mut table, mut writer) = fresh();
        sync(&mut state, &mut table, &mut writer, events);
    }
}

proptest! {
    #![proptest_config(config(20_000))]

    /// Objects of another namespace and other nodes, however malformed, leave the
    /// baseline Services' frontends exactly as they were, in the selection and in the maps.
    #[test]
    fn bad_objects_never_change_another_services_frontends(
        events in vec(event(Namespaces::Other, &["node-b", "node-c", "node-x"]), 1..6),
    ) {
        let (mut state, mut table, mut writer) = fresh();
        let before = sync(&mut state, &mut table, &mut writer, baseline());
        let frontends: Vec<Frontend> = before.frontends.keys().copied().collect();
        prop_assert!(
            frontends.iter().filter(|f| f.address.is_ipv6()).count() >= 3,
            "the baseline has its frontends of both families: {frontends:?}"
        );
        let programmed_before = programmed(&writer, &frontends);
        let after = sync(&mut state, &mut table, &mut writer, events);
        for frontend in &frontends {
            prop_assert_eq!(before.frontends.get(frontend), after.frontends.get(frontend));
        }
        prop_assert_eq!(programmed_before, programmed(&writer, &frontends));
    }
}

/// The address `last` of a test network of either family (10.<net>.0.<last> or
/// fd00:<net>::<last>).
fn address(v6: bool, net: u8, last: u8) -> IpAddr {
    if v6 {
        Ipv6Addr::new(0xfd00, net.into(), 0, 0, 0, 0, 0, last.into()).into()
    } else {
        Ipv4Addr::new(10, net, 0, last).into()
    }
}

/// Backend sets of a few frontends of both families, as successive syncs give them to the
/// writer: sets grow, shrink, empty and vanish; each frontend's backends are of its family.
fn desired_states() -> impl Strategy<Value = Vec<Desired<'static>>> {
    let frontend = (any::<bool>(), 0..4u8)
        .prop_map(|(v6, last)| Frontend::internal(address(v6, 96, last), 80, Protocol::Tcp));
    let backends = vec(1..12u8, 0..8);
    let state = vec((frontend, backends), 0..4).prop_map(|frontends| {
        let mut desired = Desired::default();
        for (frontend, lasts) in frontends {
            let v6 = frontend.address.is_ipv6();
            let backends = lasts
                .into_iter()
                .map(|last| BackendAddr::local(address(v6, 0, last), 8080))
                .collect();
            desired.insert(
                frontend,
                FrontendSpec {
                    backends,
                    affinity_timeout_seconds: None,
                    source_ranges: None,
                    maglev: false,
                    no_endpoints: false,
                },
            );
        }
        desired
    });
    vec(state, 1..8)
}

proptest! {
    #![proptest_config(config(10_000))]

    /// Successive backend sets through the writer: after every write the maps are
    /// consistent, and no apply deletes a slot that a count read just before it covered.
    #[test]
    fn the_writer_never_leaves_a_hole_for_a_lookup_in_flight(states in desired_states()) {
        let (_, _, mut writer) = fresh();
        for desired in states {
            let covered_before = writer.store().covered();
            writer.apply(&desired).expect("the in-memory maps never fail a write");
            for key in covered_before {
                prop_assert!(
                    writer.store().services.contains_key(&key),
                    "{:?} was covered before the apply and was deleted by it", key
                );
            }
        }
    }

    /// What the writer says an apply needs (the maps grow to it before the apply) is never
    /// less than what the maps hold at any moment of the apply.
    #[test]
    fn an_apply_never_holds_more_than_its_demand(states in desired_states()) {
        let (_, _, mut writer) = fresh();
        for desired in states {
            let demand = writer.demand(desired.iter().map(|(f, spec)| (f, Some(spec))));
            writer.store_mut().reset_peaks();
            writer.apply(&desired).expect("the in-memory maps never fail a write");
            let store = writer.store();
            for (family, room) in [demand.maps.v4, demand.maps.v6].into_iter().enumerate() {
                prop_assert!(
                    store.peak_services[family] <= room.service_entries as usize,
                    "family {family}: {} service entries at once, demand {}",
                    store.peak_services[family], room.service_entries
                );
                prop_assert!(
                    store.peak_backends[family] <= room.backends as usize,
                    "family {family}: {} backends at once, demand {}",
                    store.peak_backends[family], room.backends
                );
            }
            let held = writer.frontends().count();
            prop_assert!(
                held <= demand.frontends as usize,
                "{held} frontends programmed, demand {}", demand.frontends
            );
        }
    }

    /// Manifest text, mangled: the file source's parser gives objects or an error.
    #[test]
    fn mangled_manifests_parse_or_fail_cleanly(
        cut in 0..2_000usize,
        noise in ".{0,20}",
    ) {
        let text = BASELINE;
        let cut = cut.min(text.len());
        let cut = (0..=cut).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        let mangled = format!("{}{noise}{}", &text[..cut], &text[cut..]);
        if let Ok(objects) = parse(std::path::Path::new("mangled.yaml"), &mangled) {
            let (mut state, mut table, mut writer) = fresh();
            sync(&mut state, &mut table, &mut writer, objects.into_iter().map(Event::Applied).collect());
        }
    }
}
