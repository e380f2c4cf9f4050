//! What selection reads: Services, EndpointSlices and Nodes reduced to the fields that
//! decide which backends a node uses. The state module builds these from the API objects,
//! so selection never deals with optional-everything API types.
use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
};

use serde::Serialize;

use crate::desired::Protocol;

/// namespace/name of a Service.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ServiceName {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// An address family. A dual-stack Service is served as two sets of frontends, one per
/// family, each with the endpoints of its own family only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Family {
    #[serde(rename = "IPv4")]
    V4,
    #[serde(rename = "IPv6")]
    V6,
}

impl Family {
    pub const ALL: [Self; 2] = [Self::V4, Self::V6];

    pub fn of(address: IpAddr) -> Self {
        match address {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    pub fn of_net(range: &ipnet::IpNet) -> Self {
        Self::of(range.addr())
    }

    /// The name Kubernetes uses (`ipFamilies`, `addressType`).
    pub fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }

    /// Parses a Kubernetes family name (`IPv4`, `IPv6`).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|family| family.name() == text)
    }

    /// Stable lowercase label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::V4 => "ipv4",
            Self::V6 => "ipv6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a whole Service, or one of its ports or addresses, is not served. In JSON:
/// `{"reason": "<label>", "message": "<text>"}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SkipReason {
    /// type ExternalName: DNS only, nothing to proxy.
    ExternalName,
    /// clusterIP None: clients resolve the endpoints directly.
    Headless,
    /// Labelled service.kubernetes.io/service-proxy-name: another proxy owns it.
    OtherProxy,
    /// SCTP is not built into this kernel.
    Sctp,
    /// An address, range or EndpointSlice of a family the Service does not serve (not in
    /// its ipFamilies, or of no clusterIP of it): an IPv6 EndpointSlice for an IPv4-only
    /// Service, an IPv6 externalIP of an IPv4 Service. Never mixed into the other family.
    FamilyNotServed(Family),
    /// A LoadBalancer ingress IP with `ipMode: Proxy`: the load balancer delivers its traffic
    /// to the nodes' addresses or the pods, so the IP is not bound on the nodes (KEP-1860),
    /// and connections from the cluster to it go through the load balancer.
    IpModeProxy,
    /// An EndpointSlice of addressType FQDN: not proxied (as by kube-proxy).
    Fqdn,
    /// A field that does not parse, or holds what no Service may have (an address or a port
    /// out of range); the text says which.
    Invalid(String),
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ExternalName => write!(f, "type ExternalName (DNS only)"),
            Self::Headless => write!(f, "headless (clusterIP None)"),
            Self::OtherProxy => write!(f, "labelled service.kubernetes.io/service-proxy-name"),
            Self::Sctp => write!(f, "SCTP is not supported by this kernel"),
            Self::FamilyNotServed(family) => write!(
                f,
                "{family}, and the Service does not serve {family} (not in its ipFamilies)"
            ),
            Self::IpModeProxy => write!(
                f,
                "ipMode Proxy: the load balancer proxies this IP, so its traffic goes through it"
            ),
            Self::Fqdn => write!(f, "addressType FQDN is not proxied (nor by kube-proxy)"),
            Self::Invalid(why) => write!(f, "invalid: {why}"),
        }
    }
}

impl Serialize for SkipReason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut reason = serializer.serialize_struct("SkipReason", 2)?;
        reason.serialize_field("reason", self.label())?;
        reason.serialize_field("message", &self.to_string())?;
        reason.end()
    }
}

/// A part of a Service (a port, an address, an annotation) that is not served.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedPart {
    pub part: String,
    #[serde(flatten)]
    pub reason: SkipReason,
}

impl SkipReason {
    /// Stable label for metrics and JSON.
    pub fn label(&self) -> &'static str {
        match self {
            Self::ExternalName => "external-name",
            Self::Headless => "headless",
            Self::OtherProxy => "other-proxy",
            Self::Sctp => "sctp",
            Self::FamilyNotServed(_) => "family-not-served",
            Self::IpModeProxy => "ip-mode-proxy",
            Self::Fqdn => "fqdn",
            Self::Invalid(_) => "invalid",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    /// Port name; matches the EndpointSlice port of the same name ("" when unnamed).
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
    pub node_port: Option<u16>,
}

/// A Service, as selection needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    pub name: ServiceName,
    /// The families served, primary first: spec.ipFamilies, else the clusterIPs' families,
    /// else IPv4. Every address below is of one of them.
    pub families: Vec<Family>,
    pub cluster_ips: Vec<IpAddr>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    /// Ports or addresses not served, with the reason (the rest of the Service is).
    pub partial_skips: Vec<(String, SkipReason)>,
    pub internal_traffic_local: bool,
    pub external_traffic_local: bool,
    /// sessionAffinity ClientIP timeout in seconds.
    pub affinity_timeout_seconds: Option<u32>,
    /// Not-ready endpoints are used as if ready (kube-proxy's behaviour).
    pub publish_not_ready_addresses: bool,
    /// The topology-keys annotation: node label keys in order of preference, `*` = any.
    pub topology_keys: Option<Vec<String>>,
    /// loadBalancerSourceRanges (or the older annotation): the clients allowed to reach the
    /// LoadBalancer IPs from outside, each range guarding the LoadBalancer IPs of its own
    /// family. `None`: no restriction.
    pub load_balancer_source_ranges: Option<Vec<ipnet::IpNet>>,
    /// The `socklb.io/lb-algorithm: maglev` annotation: traffic from outside is spread by
    /// Maglev hashing, consistently across nodes.
    pub maglev: bool,
    /// spec.healthCheckNodePort of a LoadBalancer with externalTrafficPolicy Local: the port
    /// on which this node tells load balancers whether it has local endpoints.
    pub health_check_node_port: Option<u16>,
}

/// A port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlicePort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// A node or zone name, shared by every endpoint that names it: a million endpoints name
/// a few thousand nodes.
pub type Name = Arc<str>;

/// One endpoint (its first address, as kube-proxy uses) with its conditions and topology.
/// Kept small: 100,000 Services of 10 endpoints hold a million of them.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Endpoint {
    /// `None`: missing, unreadable or not of the slice's family (reported in `skipped`).
    pub address: Option<IpAddr>,
    /// conditions.ready: nil counts as true.
    pub ready: bool,
    /// conditions.serving: nil counts as true.
    pub serving: bool,
    /// conditions.terminating: only an explicit true.
    pub terminating: bool,
    pub node_name: Option<Name>,
    pub zone: Option<Name>,
    /// `None`: no hints (most endpoints).
    pub hints: Option<Box<Hints>>,
}

/// An endpoint's topology hints: the nodes and zones it should serve.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Hints {
    pub for_nodes: Vec<Name>,
    pub for_zones: Vec<Name>,
}

impl Endpoint {
    pub fn hints_for_nodes(&self) -> &[Name] {
        self.hints.as_deref().map_or(&[], |hints| &hints.for_nodes)
    }

    pub fn hints_for_zones(&self) -> &[Name] {
        self.hints.as_deref().map_or(&[], |hints| &hints.for_zones)
    }
}

/// An EndpointSlice of a Service: its endpoints, and what of it is not used, with why (an
/// FQDN slice, an endpoint address not of the slice's family), for explain and the log.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SliceInfo {
    pub name: String,
    /// Its addressType; `None` for a slice without IP endpoints (FQDN, unknown).
    pub family: Option<Family>,
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<Endpoint>,
    pub skipped: Vec<SkippedPart>,
}

/// The node the agent runs on.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ThisNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Addresses NodePorts are served on, of both families: the Node's InternalIPs, then its
    /// ExternalIPs. A Service's NodePorts are served on those of the families it serves.
    pub addresses: Vec<IpAddr>,
}

/// The zone label kube-proxy reads for zone hints.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

impl ThisNode {
    pub fn zone(&self) -> Option<&str> {
        self.labels.get(ZONE_LABEL).map(String::as_str)
    }

    /// The source address of flows SNATed to a backend on another node: an address the
    /// backend's node routes back to this one, and that this node holds (an ExternalIP is
    /// often a cloud NAT's, held by no device). The first InternalIP held locally, else the
    /// first ExternalIP held locally; one per family.
    pub fn snat_address(&self, family: Family, local: &[IpAddr]) -> Option<IpAddr> {
        self.addresses_of(family).find(|a| local.contains(a))
    }

    /// [`Self::snat_address`] of IPv4 flows.
    pub fn snat_address4(&self, local: &[IpAddr]) -> Option<Ipv4Addr> {
        match self.snat_address(Family::V4, local)? {
            IpAddr::V4(address) => Some(address),
            IpAddr::V6(_) => None,
        }
    }

    /// [`Self::snat_address`] of IPv6 flows.
    pub fn snat_address6(&self, local: &[IpAddr]) -> Option<Ipv6Addr> {
        match self.snat_address(Family::V6, local)? {
            IpAddr::V6(address) => Some(address),
            IpAddr::V4(_) => None,
        }
    }

    /// This node's addresses of `family`, in order.
    pub fn addresses_of(&self, family: Family) -> impl Iterator<Item = IpAddr> + '_ {
        self.addresses
            .iter()
            .copied()
            .filter(move |a| Family::of(*a) == family)
    }
}

/// Labels of every node, by name, for the topology-keys annotation.
pub type NodeLabels = BTreeMap<String, BTreeMap<String, String>>;
