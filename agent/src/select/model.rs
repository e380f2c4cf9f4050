//! What selection reads: Services, EndpointSlices and Nodes reduced to the fields that
//! decide which backends a node uses. The state module builds these from the API objects,
//! so selection never deals with optional-everything API types.
use std::{collections::BTreeMap, fmt, net::Ipv4Addr};

use serde::Serialize;

use crate::dataplane::Protocol;

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
    /// An IPv6 address: served once dual-stack lands.
    Ipv6,
    /// A LoadBalancer ingress IP with `ipMode: Proxy`: the load balancer delivers its traffic
    /// to the nodes' addresses or the pods, so the IP is not bound on the nodes (KEP-1860),
    /// and connections from the cluster to it go through the load balancer.
    IpModeProxy,
    /// An EndpointSlice of addressType FQDN: not proxied (as by kube-proxy).
    Fqdn,
    /// A field that does not parse; the text says which.
    Invalid(String),
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ExternalName => write!(f, "type ExternalName (DNS only)"),
            Self::Headless => write!(f, "headless (clusterIP None)"),
            Self::OtherProxy => write!(f, "labelled service.kubernetes.io/service-proxy-name"),
            Self::Sctp => write!(f, "SCTP is not supported by this kernel"),
            Self::Ipv6 => write!(f, "IPv6 is not served yet"),
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
            Self::Ipv6 => "ipv6",
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
    pub cluster_ips: Vec<Ipv4Addr>,
    pub external_ips: Vec<Ipv4Addr>,
    pub load_balancer_ips: Vec<Ipv4Addr>,
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
    /// loadBalancerSourceRanges (or the older annotation): the IPv4 clients allowed to
    /// reach the LoadBalancer IPs from outside. `None`: no restriction.
    pub load_balancer_source_ranges: Option<Vec<ipnet::Ipv4Net>>,
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

/// One endpoint (its first address, as kube-proxy uses) with its conditions and topology.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Endpoint {
    pub address: Option<Ipv4Addr>,
    /// conditions.ready: nil counts as true.
    pub ready: bool,
    /// conditions.serving: nil counts as true.
    pub serving: bool,
    /// conditions.terminating: only an explicit true.
    pub terminating: bool,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    pub hints_for_nodes: Vec<String>,
    pub hints_for_zones: Vec<String>,
}

/// An EndpointSlice of a Service: its IPv4 endpoints, and what of it is not used, with why
/// (an IPv6 or FQDN slice, an endpoint address that is not IPv4), for explain and the log.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SliceInfo {
    pub ports: Vec<SlicePort>,
    pub endpoints: Vec<Endpoint>,
    pub skipped: Vec<SkippedPart>,
}

/// The node the agent runs on.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ThisNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// IPv4 addresses NodePorts are served on: the Node's InternalIPs, then its ExternalIPs.
    pub addresses: Vec<Ipv4Addr>,
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
    /// first ExternalIP held locally.
    pub fn snat_address(&self, local: &[Ipv4Addr]) -> Option<Ipv4Addr> {
        self.addresses.iter().copied().find(|a| local.contains(a))
    }
}

/// Labels of every node, by name, for the topology-keys annotation.
pub type NodeLabels = BTreeMap<String, BTreeMap<String, String>>;
