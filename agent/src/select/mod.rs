//! Endpoint selection: which backends this node uses for every frontend of a Service.
//!
//! A pure function of (service, its endpoint slices, this node, node labels): no I/O, no
//! clock. The rules are kube-proxy's (`pkg/proxy/topology.go` CategorizeEndpoints and
//! `endpointslicecache.go`), plus the topology-keys annotation; README, "The control
//! plane", lists them.
mod endpoint;
pub mod model;
pub mod socket_path;
mod topology;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use serde::Serialize;

use self::{endpoint::PortEndpoint, topology::cluster_topology};
pub use self::{model::*, topology::Topology};
use crate::desired::{BackendAddr, Frontend, FrontendSpec, Protocol, Scope};

/// Where a frontend's address comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FrontendKind {
    ClusterIp,
    NodePort,
    ExternalIp,
    LoadBalancer,
}

impl FrontendKind {
    /// Which claim of one frontend (address, port, protocol, scope) by several Services
    /// wins, lowest first; the first by namespace/name among equals. The API server
    /// allocates ClusterIPs and NodePorts uniquely, and a LoadBalancer's IPs come from its
    /// controller, while any user who may create a Service may list an externalIP: one
    /// equal to another Service's ClusterIP (cluster DNS's, say) must not take its traffic
    /// (CVE-2020-8554).
    pub fn claim_rank(self) -> u8 {
        match self {
            Self::ClusterIp | Self::NodePort => 0,
            Self::LoadBalancer => 1,
            Self::ExternalIp => 2,
        }
    }
}

/// Which endpoint set a frontend uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Ready endpoints anywhere, filtered by topology.
    Cluster,
    /// Endpoints on this node only.
    Local,
}

/// Why a frontend has the backends it has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Why {
    pub policy: Policy,
    /// Topology filter applied to the cluster selection.
    pub topology: Topology,
    /// No ready endpoint was usable, so serving-and-terminating ones are used instead.
    pub terminating_fallback: bool,
}

/// One frontend of a Service with the backends this node uses for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FrontendChoice {
    pub frontend: Frontend,
    /// The frontend's address family (its backends are of the same).
    pub family: Family,
    pub kind: FrontendKind,
    pub port_name: String,
    pub spec: FrontendSpec,
    pub why: Why,
    /// Set when this choice is not programmed: the frontend cannot be programmed at all
    /// (the agent refuses its change whole and the frontend keeps what it had programmed),
    /// or another Service's choice for it is (said by `explain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<Refusal>,
}

/// Why a frontend's selection is not programmed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Refusal {
    /// More distinct endpoints than a frontend's slots (a slot number is 16 bits).
    TooManyEndpoints { endpoints: usize, limit: u16 },
    /// Another Service claims the same address, port and protocol and comes first
    /// ([`FrontendKind::claim_rank`], then namespace/name): its choice is programmed.
    TakenBy { service: ServiceName },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooManyEndpoints { endpoints, limit } => write!(
                f,
                "{endpoints} endpoints, more than the {limit} a frontend holds: refused \
                 whole, the frontend keeps what it had programmed (split the Service)"
            ),
            Self::TakenBy { service } => write!(
                f,
                "taken by {service}, whose claim comes first (a ClusterIP or NodePort, then a \
                 LoadBalancer IP, then an externalIP; the first by namespace/name among equals)"
            ),
        }
    }
}

/// The refusal of a frontend with `backends`, if any.
pub fn refusal(backends: &[BackendAddr]) -> Option<Refusal> {
    let limit = socklb_abi::MAX_BACKENDS_PER_SERVICE;
    // At most `limit` listed: at most `limit` distinct (no set built for a common Service).
    if backends.len() <= usize::from(limit) {
        return None;
    }
    let endpoints = backends
        .iter()
        .collect::<std::collections::HashSet<_>>()
        .len();
    (endpoints > usize::from(limit)).then_some(Refusal::TooManyEndpoints { endpoints, limit })
}

/// The outcome of selection for one Service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServiceSelection {
    pub service: ServiceName,
    pub frontends: Vec<FrontendChoice>,
    /// Parts of the Service not served (ports, addresses), with the reason.
    pub skipped: Vec<SkippedPart>,
    /// The health check this node serves for the Service's load balancer, if it needs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
}

/// kube-proxy's healthCheckNodePort for a LoadBalancer with externalTrafficPolicy Local:
/// the load balancer sends traffic to this node only while it has local ready endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HealthCheck {
    pub node_port: u16,
    /// Ready endpoints on this node, as kube-proxy counts them (distinct addresses).
    pub local_endpoints: usize,
}

/// Selects the backends of every frontend of `service` for `node`: per port, per family
/// the Service serves, each family's frontends with that family's endpoints only.
pub fn select(
    service: &ServiceInfo,
    slices: &[SliceInfo],
    node: &ThisNode,
    node_labels: &NodeLabels,
) -> ServiceSelection {
    let mut frontends = Vec::new();
    for port in &service.ports {
        for &family in &service.families {
            select_port(
                service,
                port,
                family,
                slices,
                node,
                node_labels,
                &mut frontends,
            );
        }
    }
    // Kept for the Service's life: a growth's spare room would be most of it (a Service
    // usually has one frontend).
    frontends.shrink_to_fit();
    ServiceSelection {
        service: service.name.clone(),
        frontends,
        skipped: service
            .partial_skips
            .iter()
            .map(|(part, reason)| SkippedPart {
                part: part.clone(),
                reason: reason.clone(),
            })
            .chain(slices.iter().flat_map(|slice| slice_skips(service, slice)))
            .collect(),
        health_check: service.health_check_node_port.map(|node_port| HealthCheck {
            node_port,
            local_endpoints: local_ready_endpoints(service, slices, node),
        }),
    }
}

/// What of a slice is not used: all of it when the Service does not serve its family,
/// else the parts its conversion could not read.
fn slice_skips(service: &ServiceInfo, slice: &SliceInfo) -> Vec<SkippedPart> {
    match slice.family {
        Some(family) if !service.families.contains(&family) => vec![SkippedPart {
            part: format!("EndpointSlice {}", slice.name),
            reason: SkipReason::FamilyNotServed(family),
        }],
        _ => slice.skipped.clone(),
    }
}

/// The frontends of one port of one family, appended to `frontends`.
fn select_port(
    service: &ServiceInfo,
    port: &ServicePort,
    family: Family,
    slices: &[SliceInfo],
    node: &ThisNode,
    node_labels: &NodeLabels,
    frontends: &mut Vec<FrontendChoice>,
) {
    let of_family = |ip: &&IpAddr| Family::of(**ip) == family;
    let endpoints = endpoints_for_port(slices, family, &port.name, port.protocol, node);
    let cluster = cluster_selection(service, &endpoints, node, node_labels);
    let local = local_selection(service, &endpoints, node);
    // kube-proxy rejects (rather than drops) for a Service with no endpoint it could reach.
    let no_endpoints = cluster.backends.is_empty() && local.backends.is_empty();
    let choose = |policy: Policy| match policy {
        Policy::Cluster => &cluster,
        Policy::Local => &local,
    };
    let mut add = |address: IpAddr, port_number: u16, kind, scope, policy| {
        let selection = choose(policy);
        // Source ranges guard LoadBalancer IPs against traffic from outside; each family's
        // IPs admit that family's ranges (none of it: nobody, failing closed).
        let source_ranges = (kind == FrontendKind::LoadBalancer && scope == Scope::External)
            .then_some(service.load_balancer_source_ranges.as_ref())
            .flatten()
            .map(|ranges| {
                ranges
                    .iter()
                    .copied()
                    .filter(|range| Family::of_net(range) == family)
                    .collect()
            });
        frontends.push(FrontendChoice {
            frontend: Frontend {
                address,
                port: port_number,
                protocol: port.protocol,
                scope,
            },
            family,
            kind,
            port_name: port.name.clone(),
            spec: FrontendSpec {
                backends: selection.backends.clone(),
                affinity_timeout_seconds: service.affinity_timeout_seconds,
                source_ranges,
                maglev: service.maglev && scope == Scope::External,
                no_endpoints,
            },
            why: Why {
                policy,
                topology: selection.topology.clone(),
                terminating_fallback: selection.terminating_fallback,
            },
            refused: refusal(&selection.backends),
        });
    };

    // ClusterIP: local sockets only; internalTrafficPolicy decides.
    let internal = if service.internal_traffic_local {
        Policy::Local
    } else {
        Policy::Cluster
    };
    for ip in service.cluster_ips.iter().filter(of_family) {
        add(
            *ip,
            port.port,
            FrontendKind::ClusterIp,
            Scope::Internal,
            internal,
        );
    }

    // Externally reachable frontends: local sockets use the cluster selection (like
    // kube-proxy, which sends pod and host traffic to them through the cluster chain);
    // traffic from outside follows externalTrafficPolicy.
    let external = if service.external_traffic_local {
        Policy::Local
    } else {
        Policy::Cluster
    };
    let mut external_frontends: Vec<(IpAddr, u16, FrontendKind)> = Vec::new();
    if let Some(node_port) = port.node_port {
        for ip in node.addresses_of(family) {
            external_frontends.push((ip, node_port, FrontendKind::NodePort));
        }
    }
    for ip in service.external_ips.iter().filter(of_family) {
        external_frontends.push((*ip, port.port, FrontendKind::ExternalIp));
    }
    for ip in service.load_balancer_ips.iter().filter(of_family) {
        external_frontends.push((*ip, port.port, FrontendKind::LoadBalancer));
    }
    for (ip, port_number, kind) in external_frontends {
        add(ip, port_number, kind, Scope::Internal, Policy::Cluster);
        add(ip, port_number, kind, Scope::External, external);
    }
}

/// kube-proxy's count for health checks (`LocalReadyEndpoints`): the distinct addresses of
/// this node's ready endpoints over every port of the slices (an endpoint serving two ports
/// counts once). Serving-and-terminating endpoints do not count: a node left with only
/// those must fail its health check so that load balancers drain it. Counted per family
/// served, the larger count wins: a dual-stack pod (one address of each family) counts
/// once, as it does for each of kube-proxy's per-family proxiers.
pub fn local_ready_endpoints(
    service: &ServiceInfo,
    slices: &[SliceInfo],
    node: &ThisNode,
) -> usize {
    let ports: BTreeSet<(&str, Protocol)> = slices
        .iter()
        .flat_map(|slice| slice.ports.iter())
        .map(|port| (port.name.as_str(), port.protocol))
        .collect();
    service
        .families
        .iter()
        .map(|&family| {
            let addresses: BTreeSet<IpAddr> = ports
                .iter()
                .flat_map(|(name, protocol)| {
                    endpoints_for_port(slices, family, name, *protocol, node)
                })
                .filter(|e| e.is_local(node) && e.ready(service))
                .map(|e| e.backend.address)
                .collect();
            addresses.len()
        })
        .max()
        .unwrap_or(0)
}

/// The endpoints of `family` of the service port `name`/`protocol`, merged across the
/// slices of that family: the slice port of the same name and protocol gives the target
/// port; an address:port in several slices counts once, the non-terminating copy winning
/// (else the first, slices being in name order). A backend not on `node` (or of no known
/// node) is marked remote.
fn endpoints_for_port<'a>(
    slices: &'a [SliceInfo],
    family: Family,
    name: &str,
    protocol: Protocol,
    node: &ThisNode,
) -> Vec<PortEndpoint<'a>> {
    let mut merged: BTreeMap<BackendAddr, &'a Endpoint> = BTreeMap::new();
    for slice in slices.iter().filter(|s| s.family == Some(family)) {
        let Some(slice_port) = slice
            .ports
            .iter()
            .find(|p| p.name == name && p.protocol == protocol)
        else {
            continue;
        };
        for endpoint in &slice.endpoints {
            // An address of the other family never crosses (conversion drops them too).
            let Some(address) = endpoint.address.filter(|a| Family::of(*a) == family) else {
                continue;
            };
            let backend = BackendAddr {
                address,
                port: slice_port.port,
                remote: endpoint.node_name.as_deref() != Some(node.name.as_str()),
            };
            match merged.get(&backend) {
                Some(existing) if !(existing.terminating && !endpoint.terminating) => {}
                _ => {
                    merged.insert(backend, endpoint);
                }
            }
        }
    }
    merged
        .into_iter()
        .map(|(backend, endpoint)| PortEndpoint { backend, endpoint })
        .collect()
}

/// Backends chosen for one policy, and how.
#[derive(Clone, Debug, Default)]
struct Selection {
    backends: Vec<BackendAddr>,
    topology: Topology,
    terminating_fallback: bool,
}

/// kube-proxy's cluster endpoints: ready endpoints filtered by topology; if there is none,
/// serving-and-terminating endpoints, ignoring topology.
fn cluster_selection(
    service: &ServiceInfo,
    endpoints: &[PortEndpoint],
    node: &ThisNode,
    node_labels: &NodeLabels,
) -> Selection {
    let ready: Vec<&PortEndpoint> = endpoints.iter().filter(|e| e.ready(service)).collect();
    let (topology, chosen) = cluster_topology(service, &ready, node, node_labels);
    if !chosen.is_empty() || !ready.is_empty() {
        // Ready endpoints exist: the topology's choice stands, even when it is empty
        // (topology keys that match nothing mean no endpoints, as they did in Kubernetes).
        return Selection {
            backends: chosen.iter().map(|e| e.backend).collect(),
            topology,
            terminating_fallback: false,
        };
    }
    terminating_fallback(endpoints.iter())
}

/// The fallback when no endpoint is ready: the serving-and-terminating ones, no topology.
fn terminating_fallback<'e, 'a: 'e>(
    endpoints: impl Iterator<Item = &'e PortEndpoint<'a>>,
) -> Selection {
    let terminating: Vec<BackendAddr> = endpoints
        .filter(|e| e.serving_terminating())
        .map(|e| e.backend)
        .collect();
    Selection {
        terminating_fallback: !terminating.is_empty(),
        backends: terminating,
        topology: Topology::None,
    }
}

/// kube-proxy's local endpoints: ready endpoints on this node; if there is none, serving
/// and terminating endpoints on this node.
fn local_selection(
    service: &ServiceInfo,
    endpoints: &[PortEndpoint],
    node: &ThisNode,
) -> Selection {
    let local: Vec<&PortEndpoint> = endpoints.iter().filter(|e| e.is_local(node)).collect();
    let ready: Vec<BackendAddr> = local
        .iter()
        .filter(|e| e.ready(service))
        .map(|e| e.backend)
        .collect();
    if !ready.is_empty() {
        return Selection {
            backends: ready,
            ..Selection::default()
        };
    }
    terminating_fallback(local.into_iter())
}

#[cfg(test)]
mod tests;
