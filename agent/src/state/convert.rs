//! API objects -> what selection reads. Malformed fields never fail a whole object: the
//! part that cannot be read is skipped with a reason that names it, the rest is served.
use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};

use crate::{
    desired::Protocol,
    select::{
        Endpoint, Family, Hints, Name, ServiceInfo, ServiceName, ServicePort, SkipReason,
        SkippedPart, SliceInfo, SlicePort,
    },
};

/// Label that hands a Service to another proxy (kube-proxy skips those too).
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Annotation with the node label keys of the (removed) Service.spec.topologyKeys, as a
/// JSON list, honoured for clusters that predate topology hints.
pub const TOPOLOGY_KEYS_ANNOTATION: &str = "socklb.io/topology-keys";
/// kube-proxy's default sessionAffinityConfig.clientIP.timeoutSeconds.
const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

pub fn service_name(namespace: Option<&String>, name: Option<&String>) -> Option<ServiceName> {
    Some(ServiceName {
        namespace: namespace.cloned().unwrap_or_else(|| "default".to_owned()),
        name: name?.clone(),
    })
}

/// A Service as selection reads it, or the reason it is not served at all.
pub fn service(service: &Service) -> Result<ServiceInfo, SkipReason> {
    let meta = &service.metadata;
    let name = service_name(meta.namespace.as_ref(), meta.name.as_ref())
        .ok_or_else(|| SkipReason::Invalid("metadata.name is missing".to_owned()))?;
    if meta
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(SERVICE_PROXY_NAME_LABEL))
    {
        return Err(SkipReason::OtherProxy);
    }
    let spec = service.spec.clone().unwrap_or_default();
    if spec.type_.as_deref() == Some("ExternalName") {
        return Err(SkipReason::ExternalName);
    }
    if spec.cluster_ip.as_deref() == Some("None") {
        return Err(SkipReason::Headless);
    }

    let mut partial_skips = Vec::new();
    let cluster_ip_texts: Vec<String> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips.clone(),
        (_, Some(ip)) if !ip.is_empty() => vec![ip.clone()],
        _ => Vec::new(),
    };
    if cluster_ip_texts.is_empty() {
        // The API server allocates one to every Service but a headless one: only a manifest
        // can lack it. Its NodePorts and external addresses are served all the same.
        partial_skips.push((
            "clusterIP".to_owned(),
            SkipReason::Invalid("none given (a manifest must hold the allocated one)".to_owned()),
        ));
    }
    let parsed_cluster_ips = addresses("clusterIPs", &cluster_ip_texts, &mut partial_skips);
    let families = families(
        spec.ip_families.as_deref().unwrap_or_default(),
        &parsed_cluster_ips,
        &mut partial_skips,
    );
    let cluster_ips = served(
        "clusterIPs",
        parsed_cluster_ips,
        &families,
        &mut partial_skips,
    );
    if cluster_ips.is_empty() && !cluster_ip_texts.is_empty() {
        // No clusterIP is usable (unreadable, or of no family served): not served at all.
        // An unreadable one is named with its field and value.
        return Err(partial_skips
            .into_iter()
            .map(|(part, reason)| match reason {
                SkipReason::Invalid(why) => SkipReason::Invalid(format!("{part}: {why}")),
                reason => reason,
            })
            .next()
            .unwrap_or_else(|| SkipReason::Invalid("clusterIPs".to_owned())));
    }
    let external_ips = addresses(
        "externalIPs",
        spec.external_ips.as_deref().unwrap_or_default(),
        &mut partial_skips,
    );
    let external_ips = served("externalIPs", external_ips, &families, &mut partial_skips);
    let mut ingress_ips: Vec<String> = Vec::new();
    let ingress = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default();
    for entry in ingress {
        let Some(ip) = &entry.ip else { continue };
        // As kube-proxy: only VIP-mode IPs (the default) are short-circuited on the node.
        if entry.ip_mode.as_deref() == Some("Proxy") {
            partial_skips.push((
                format!("loadBalancer.ingress {ip}"),
                SkipReason::IpModeProxy,
            ));
        } else {
            ingress_ips.push(ip.clone());
        }
    }
    let load_balancer_ips = addresses("loadBalancer.ingress", &ingress_ips, &mut partial_skips);
    let load_balancer_ips = served(
        "loadBalancer.ingress",
        load_balancer_ips,
        &families,
        &mut partial_skips,
    );

    // Sized to fit: kept for the Service's life (100,000 of them).
    let mut ports = Vec::with_capacity(spec.ports.as_ref().map_or(0, Vec::len));
    for port in spec.ports.as_deref().unwrap_or_default() {
        let port_name = port.name.clone().unwrap_or_default();
        let label = || {
            format!(
                "port {}",
                if port_name.is_empty() {
                    port.port.to_string()
                } else {
                    port_name.clone()
                }
            )
        };
        let protocol = match port.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => {
                partial_skips.push((label(), SkipReason::Sctp));
                continue;
            }
            other => {
                partial_skips.push((label(), SkipReason::Invalid(format!("protocol {other}"))));
                continue;
            }
        };
        let Some(number) = u16::try_from(port.port).ok().filter(|p| *p != 0) else {
            partial_skips.push((label(), SkipReason::Invalid(format!("port {}", port.port))));
            continue;
        };
        // The API server refuses a Service with two ports of one number and protocol (or
        // one nodePort twice); a manifest may still have them. Only the first is served.
        let protocol_text = port.protocol.as_deref().unwrap_or("TCP");
        let first = |taken: &dyn Fn(&ServicePort) -> bool| {
            ports.iter().find(|p| taken(p)).map(|p: &ServicePort| {
                if p.name.is_empty() {
                    p.port.to_string()
                } else {
                    p.name.clone()
                }
            })
        };
        if let Some(first) = first(&|p| p.port == number && p.protocol == protocol) {
            partial_skips.push((
                label(),
                SkipReason::Invalid(format!(
                    "{number}/{protocol_text} is also port {first}'s: only port {first} is served"
                )),
            ));
            continue;
        }
        // 0 (or none) is a port without a nodePort; a number no port can have is said, as
        // its NodePort frontends are then missing.
        let mut node_port = match port.node_port.filter(|p| *p != 0) {
            None => None,
            Some(given) => match u16::try_from(given) {
                Ok(number) => Some(number),
                Err(_) => {
                    partial_skips.push((
                        format!("{} nodePort", label()),
                        SkipReason::Invalid(format!("nodePort {given}")),
                    ));
                    None
                }
            },
        };
        if let Some(taken) = node_port
            && let Some(first) = first(&|p| p.node_port == Some(taken) && p.protocol == protocol)
        {
            partial_skips.push((
                format!("{} nodePort", label()),
                SkipReason::Invalid(format!(
                    "nodePort {taken}/{protocol_text} is also port {first}'s: only port {first}'s \
                     is served"
                )),
            ));
            node_port = None;
        }
        ports.push(ServicePort {
            name: port_name,
            protocol,
            port: number,
            node_port,
        });
    }

    let affinity_timeout_seconds =
        (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .and_then(|t| u32::try_from(t).ok())
                .unwrap_or(DEFAULT_AFFINITY_TIMEOUT_SECONDS)
        });

    let topology_keys = match meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(TOPOLOGY_KEYS_ANNOTATION))
    {
        None => None,
        Some(text) => match serde_json::from_str::<Vec<String>>(text) {
            Ok(keys) => Some(keys),
            Err(error) => {
                partial_skips.push((
                    format!("annotation {TOPOLOGY_KEYS_ANNOTATION}"),
                    SkipReason::Invalid(format!(
                        "not a JSON list of label keys ({error}); ignored"
                    )),
                ));
                None
            }
        },
    };

    let load_balancer_source_ranges =
        source_ranges(&spec, meta.annotations.as_ref(), &mut partial_skips);
    let maglev = match meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(LB_ALGORITHM_ANNOTATION))
        .map(String::as_str)
    {
        None | Some("random") => false,
        Some("maglev") => true,
        Some(other) => {
            partial_skips.push((
                format!("annotation {LB_ALGORITHM_ANNOTATION}"),
                SkipReason::Invalid(format!("{other:?} is not random or maglev; random is used")),
            ));
            false
        }
    };
    let health_check_node_port = health_check_node_port(&spec, &mut partial_skips);

    Ok(ServiceInfo {
        name,
        families,
        cluster_ips,
        external_ips,
        load_balancer_ips,
        ports,
        partial_skips,
        internal_traffic_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        external_traffic_local: spec.external_traffic_policy.as_deref() == Some("Local"),
        affinity_timeout_seconds,
        publish_not_ready_addresses: spec.publish_not_ready_addresses.unwrap_or(false),
        topology_keys,
        load_balancer_source_ranges,
        maglev,
        health_check_node_port,
    })
}

/// kube-proxy serves a health check for a Service of type LoadBalancer with
/// externalTrafficPolicy Local (`NeedsHealthCheck`), on spec.healthCheckNodePort. Such a
/// Service without a usable port (the API server always allocates one; a hand-written
/// manifest may lack it) is served without a health check, with a reason.
fn health_check_node_port(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    skips: &mut Vec<(String, SkipReason)>,
) -> Option<u16> {
    if spec.type_.as_deref() != Some("LoadBalancer")
        || spec.external_traffic_policy.as_deref() != Some("Local")
    {
        return None;
    }
    let port = spec
        .health_check_node_port
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0);
    if port.is_none() {
        skips.push((
            "healthCheckNodePort".to_owned(),
            SkipReason::Invalid(format!(
                "{} for a LoadBalancer with externalTrafficPolicy Local: no health check is \
                 served; set spec.healthCheckNodePort",
                spec.health_check_node_port
                    .map_or_else(|| "missing".to_owned(), |p| format!("{p} is not a port"))
            )),
        ));
    }
    port
}

/// The annotation kube-proxy reads when `spec.loadBalancerSourceRanges` is empty.
const SOURCE_RANGES_ANNOTATION: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// loadBalancerSourceRanges as CIDRs of either family (each guards the LoadBalancer IPs of
/// its family). A range that does not parse is skipped with a reason; if ranges were given
/// but none is usable, the result is an empty list, which admits nobody (failing closed)
/// rather than everybody.
fn source_ranges(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    annotations: Option<&std::collections::BTreeMap<String, String>>,
    skips: &mut Vec<(String, SkipReason)>,
) -> Option<Vec<ipnet::IpNet>> {
    let texts: Vec<String> = match spec.load_balancer_source_ranges.as_deref() {
        Some(ranges) if !ranges.is_empty() => ranges.to_vec(),
        _ => annotations
            .and_then(|a| a.get(SOURCE_RANGES_ANNOTATION))
            .map(|text| {
                text.split(',')
                    .map(|r| r.trim().to_owned())
                    .filter(|r| !r.is_empty())
                    .collect()
            })
            .unwrap_or_default(),
    };
    if texts.is_empty() {
        return None;
    }
    let mut ranges = Vec::new();
    for text in texts {
        match text.parse::<ipnet::IpNet>() {
            Ok(ipnet::IpNet::V6(range)) if range.addr().to_ipv4_mapped().is_some() => skips.push((
                format!("loadBalancerSourceRanges {text}"),
                SkipReason::Invalid("an IPv4-mapped IPv6 range: write it as IPv4".to_owned()),
            )),
            Ok(range) => ranges.push(range),
            Err(_) => skips.push((
                format!("loadBalancerSourceRanges {text}"),
                SkipReason::Invalid("not a CIDR".to_owned()),
            )),
        }
    }
    Some(ranges)
}

/// An IP address of either family. IPv4-mapped IPv6 addresses are refused: sockets reach
/// IPv4 frontends through them already, and an IPv6 frontend or backend with one would
/// never be matched.
fn address(text: &str) -> Result<IpAddr, SkipReason> {
    match text.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) if ip.to_ipv4_mapped().is_some() => Err(SkipReason::Invalid(
            "an IPv4-mapped IPv6 address: write it as IPv4".to_owned(),
        )),
        Ok(ip) => Ok(ip),
        Err(_) => Err(SkipReason::Invalid("not an IP address".to_owned())),
    }
}

/// Why `ip` can be no endpoint's address: the unspecified address (which means any) and
/// multicast ones. Loopback ones are served: the API server refuses them, but a manifests
/// directory on one machine (the demo, tests) serves local servers through them.
fn not_an_endpoint(ip: IpAddr) -> Option<&'static str> {
    if ip.is_unspecified() {
        Some("the unspecified address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else {
        None
    }
}

/// Why `ip` can be no frontend's address (clusterIP, externalIP or LoadBalancer IP): the
/// special addresses the API server refuses as clusterIPs and externalIPs. Besides what is
/// no endpoint's, loopback and link-local ones, which every process of the node (loopback)
/// or of its link uses on its own; a loopback clusterIP would take the node's own
/// connections to that port.
fn not_a_frontend(ip: IpAddr) -> Option<&'static str> {
    let link_local = match ip {
        IpAddr::V4(ip) => ip.is_link_local(),
        IpAddr::V6(ip) => ip.is_unicast_link_local(),
    };
    not_an_endpoint(ip).or(if ip.is_loopback() {
        Some("a loopback address")
    } else if link_local {
        Some("a link-local address")
    } else {
        None
    })
}

/// The frontend addresses among `texts`; the others are recorded as skipped.
fn addresses(field: &str, texts: &[String], skips: &mut Vec<(String, SkipReason)>) -> Vec<IpAddr> {
    let mut ips = Vec::with_capacity(texts.len());
    for text in texts {
        let ip = address(text).and_then(|ip| match not_a_frontend(ip) {
            Some(what) => Err(SkipReason::Invalid(format!(
                "{what}, which no Service may have"
            ))),
            None => Ok(ip),
        });
        match ip {
            Ok(ip) => ips.push(ip),
            Err(reason) => skips.push((format!("{field} {text}"), reason)),
        }
    }
    ips
}

/// The addresses of the `families` served; the others are recorded as skipped.
fn served(
    field: &str,
    ips: Vec<IpAddr>,
    families: &[Family],
    skips: &mut Vec<(String, SkipReason)>,
) -> Vec<IpAddr> {
    ips.into_iter()
        .filter(|ip| {
            let family = Family::of(*ip);
            let served = families.contains(&family);
            if !served {
                skips.push((format!("{field} {ip}"), SkipReason::FamilyNotServed(family)));
            }
            served
        })
        .collect()
}

/// The families a Service serves, primary first: spec.ipFamilies (set by the API server on
/// every Service), else the families of its clusterIPs (a hand-written manifest), else
/// IPv4. An unknown family name is skipped with a reason.
fn families(
    ip_families: &[String],
    cluster_ips: &[IpAddr],
    skips: &mut Vec<(String, SkipReason)>,
) -> Vec<Family> {
    let mut families = Vec::new();
    for text in ip_families {
        match Family::parse(text) {
            Some(family) if !families.contains(&family) => families.push(family),
            Some(_) => {}
            None => skips.push((
                format!("ipFamilies {text}"),
                SkipReason::Invalid("not IPv4 or IPv6".to_owned()),
            )),
        }
    }
    if families.is_empty() {
        for ip in cluster_ips {
            let family = Family::of(*ip);
            if !families.contains(&family) {
                families.push(family);
            }
        }
    }
    if families.is_empty() {
        families.push(Family::V4);
    }
    families
}

/// The Service an EndpointSlice belongs to, from its label.
pub fn slice_owner(slice: &EndpointSlice) -> Option<ServiceName> {
    let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    service_name(slice.metadata.namespace.as_ref(), Some(service))
}

/// An EndpointSlice as selection reads it. IPv4 and IPv6 slices have endpoints; the
/// others, and endpoints whose address is not of the slice's family, are recorded as
/// skipped parts with the reason. Whether the Service serves the slice's family is
/// selection's to say.
pub fn slice(slice: &EndpointSlice, names: &mut Names) -> SliceInfo {
    let name = slice.metadata.name.clone().unwrap_or_default();
    // Only for what is skipped: most slices skip nothing.
    let label = || {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        format!("EndpointSlice {name}")
    };
    let family = match slice.address_type.as_str() {
        // kube-proxy does not proxy FQDN slices either.
        "FQDN" => Err(SkipReason::Fqdn),
        other => {
            Family::parse(other).ok_or_else(|| SkipReason::Invalid(format!("addressType {other}")))
        }
    };
    let family = match family {
        Ok(family) => family,
        Err(reason) => {
            return SliceInfo {
                name,
                skipped: vec![SkippedPart {
                    part: label(),
                    reason,
                }],
                ..SliceInfo::default()
            };
        }
    };
    let mut skipped = Vec::new();
    let mut ports: Vec<SlicePort> = slice
        .ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|port| {
            let name = port.name.clone().unwrap_or_default();
            let protocol = match port.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => Ok(Protocol::Tcp),
                "UDP" => Ok(Protocol::Udp),
                // Not proxied by kube-proxy either, and not built into this kernel.
                "SCTP" => Err(SkipReason::Sctp),
                other => Err(SkipReason::Invalid(format!("protocol {other}"))),
            };
            // A port without a number (the API's "all ports") serves no Service port:
            // skipped without a word, as kube-proxy does.
            let number = port.port?;
            let number = u16::try_from(number)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| SkipReason::Invalid(format!("port {number}")));
            match protocol.and_then(|protocol| number.map(|number| (protocol, number))) {
                Ok((protocol, port)) => Some(SlicePort {
                    name,
                    protocol,
                    port,
                }),
                Err(reason) => {
                    let shown = if name.is_empty() { "(unnamed)" } else { &name };
                    skipped.push(SkippedPart {
                        part: format!("{} port {shown}", label()),
                        reason,
                    });
                    None
                }
            }
        })
        .collect();
    ports.shrink_to_fit();
    let endpoints = slice
        .endpoints
        .iter()
        .map(|endpoint| {
            let conditions = endpoint.conditions.clone().unwrap_or_default();
            // Consumers use the first address only (API contract).
            let first = endpoint.addresses.first();
            let address = first
                .ok_or_else(|| SkipReason::Invalid("no address".to_owned()))
                .and_then(|text| address(text))
                .and_then(|ip| match not_an_endpoint(ip) {
                    Some(what) => Err(SkipReason::Invalid(format!("{what}, which no pod has"))),
                    None => Ok(ip),
                })
                .and_then(|ip| {
                    if Family::of(ip) == family {
                        Ok(ip)
                    } else {
                        Err(SkipReason::Invalid(format!(
                            "not an {family} address, in a slice of addressType {family}"
                        )))
                    }
                });
            let address = match address {
                Ok(ip) => Some(ip),
                Err(reason) => {
                    skipped.push(SkippedPart {
                        part: format!(
                            "{} endpoint {}",
                            label(),
                            first.map_or("(none)", String::as_str)
                        ),
                        reason,
                    });
                    None
                }
            };
            Endpoint {
                address,
                ready: conditions.ready.unwrap_or(true),
                serving: conditions.serving.unwrap_or(true),
                terminating: conditions.terminating.unwrap_or(false),
                node_name: endpoint.node_name.as_deref().map(|name| names.get(name)),
                zone: endpoint.zone.as_deref().map(|zone| names.get(zone)),
                hints: endpoint.hints.as_ref().and_then(|hints| {
                    let for_nodes: Vec<Name> = hints
                        .for_nodes
                        .iter()
                        .flatten()
                        .map(|node| names.get(&node.name))
                        .collect();
                    let for_zones: Vec<Name> = hints
                        .for_zones
                        .iter()
                        .flatten()
                        .map(|zone| names.get(&zone.name))
                        .collect();
                    (!for_nodes.is_empty() || !for_zones.is_empty()).then(|| {
                        Box::new(Hints {
                            for_nodes,
                            for_zones,
                        })
                    })
                }),
            }
        })
        .collect();
    SliceInfo {
        name,
        family: Some(family),
        ports,
        endpoints,
        skipped,
    }
}

/// A Node's labels and the addresses (of both families) NodePorts are served on.
/// A Node's labels, its addresses (InternalIPs first: the first one of a family this node
/// holds is its SNAT address), and those of its addresses that are not IPs.
pub fn node(node: &Node) -> (BTreeMap<String, String>, Vec<IpAddr>, Vec<String>) {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let listed = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let mut addresses = Vec::new();
    let mut invalid = Vec::new();
    for listed in ["InternalIP", "ExternalIP"]
        .iter()
        .flat_map(|kind| listed.iter().filter(move |a| a.type_ == *kind))
    {
        match address(&listed.address) {
            Ok(address) => addresses.push(address),
            Err(_) => invalid.push(listed.address.clone()),
        }
    }
    (labels, addresses, invalid)
}

/// How traffic from outside picks a backend: `random` (the default) or `maglev`.
pub const LB_ALGORITHM_ANNOTATION: &str = "socklb.io/lb-algorithm";

/// The node and zone names endpoints hold, each kept once and shared.
#[derive(Debug, Default)]
pub struct Names(hashbrown::HashSet<Name>);

impl Names {
    /// The shared copy of `name`.
    pub fn get(&mut self, name: &str) -> Name {
        if let Some(known) = self.0.get(name) {
            return known.clone();
        }
        let name: Name = Arc::from(name);
        self.0.insert(name.clone());
        name
    }

    /// Forgets the names no endpoint holds any more (nodes gone from the cluster).
    pub fn forget_unused(&mut self) {
        self.0.retain(|name| Arc::strong_count(name) > 1);
    }
}
