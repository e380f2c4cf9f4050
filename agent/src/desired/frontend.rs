//! What the control plane asks the datapath to do: every frontend with its ordered backends.
//! Plain data, no kernel types; the maps' writer turns it into map entries. Selection and
//! the frontend table produce it, so it sits below both and below the maps.
use std::{
    borrow::Cow,
    collections::BTreeMap,
    fmt,
    net::{IpAddr, SocketAddr},
};

use serde::{Deserialize, Serialize};
use socklb_abi::{PROTO_TCP, PROTO_UDP, SCOPE_EXTERNAL, SCOPE_INTERNAL};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => PROTO_TCP,
            Self::Udp => PROTO_UDP,
        }
    }

    /// As Kubernetes spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        }
    }

    pub fn from_number(number: u8) -> Option<Self> {
        match number {
            PROTO_TCP => Some(Self::Tcp),
            PROTO_UDP => Some(Self::Udp),
            _ => None,
        }
    }
}

/// Which traffic a frontend entry serves: local sockets (cgroup hooks) or packets arriving
/// from outside the node (TC).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    #[default]
    Internal,
    External,
}

impl Scope {
    pub fn number(self) -> u8 {
        match self {
            Self::Internal => SCOPE_INTERNAL,
            Self::External => SCOPE_EXTERNAL,
        }
    }

    /// As the JSON of `explain` and `inspect` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Internal => "internal",
            Self::External => "external",
        }
    }

    pub fn from_number(number: u8) -> Option<Self> {
        match number {
            SCOPE_INTERNAL => Some(Self::Internal),
            SCOPE_EXTERNAL => Some(Self::External),
            _ => None,
        }
    }
}

/// A service frontend: an address (of either family) and port a client may connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frontend {
    pub address: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    #[serde(default)]
    pub scope: Scope,
}

#[cfg(test)]
impl Frontend {
    /// A ClusterIP-like frontend: how tests name one by its address, port and protocol.
    pub fn internal(address: impl Into<IpAddr>, port: u16, protocol: Protocol) -> Self {
        Self {
            address: address.into(),
            port,
            protocol,
            scope: Scope::Internal,
        }
    }
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} ({})",
            SocketAddr::new(self.address, self.port),
            self.protocol.name(),
            self.scope.name()
        )
    }
}

/// A backend endpoint; its protocol and its address family are its frontend's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BackendAddr {
    pub address: IpAddr,
    pub port: u16,
    /// The endpoint runs on another node: traffic from outside reaching it through this
    /// node is SNATed, so that its replies come back through this node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remote: bool,
}

impl BackendAddr {
    /// A backend on this node (or one whose node does not matter, as for local sockets).
    pub fn local(address: impl Into<IpAddr>, port: u16) -> Self {
        Self {
            address: address.into(),
            port,
            remote: false,
        }
    }
}

#[cfg(test)]
impl BackendAddr {
    /// The last octet of the address: how table tests name their backends.
    pub fn last_octet(&self) -> u8 {
        match self.address {
            IpAddr::V4(address) => address.octets()[3],
            IpAddr::V6(address) => address.octets()[15],
        }
    }
}

impl fmt::Display for BackendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", SocketAddr::new(self.address, self.port))
    }
}

/// What one frontend should do.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontendSpec {
    /// Usable backends; empty means the frontend refuses connections (ECONNREFUSED).
    pub backends: Vec<BackendAddr>,
    /// sessionAffinity ClientIP timeout in seconds; `None` when affinity is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_seconds: Option<u32>,
    /// loadBalancerSourceRanges of a LoadBalancer IP for traffic from outside: only these
    /// clients may open flows (an empty list: none may). `None`: unrestricted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<Vec<ipnet::IpNet>>,
    /// Traffic from outside chooses by Maglev hashing (the same backend on every node)
    /// instead of at random.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub maglev: bool,
    /// The Service has no endpoint for this port anywhere: with no backends, traffic from
    /// outside is refused (a TCP reset, ICMP port unreachable for UDP), as kube-proxy's
    /// REJECT does. An empty frontend of a Service that has endpoints elsewhere
    /// (externalTrafficPolicy Local) drops it instead, as kube-proxy's DROP.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_endpoints: bool,
}

/// The whole desired datapath. A full sync borrows the specs from the frontend table
/// rather than copying them (36 MB at 100,000 Services, at the first sync's peak).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired<'a> {
    pub frontends: BTreeMap<Frontend, Cow<'a, FrontendSpec>>,
}

impl<'a> Desired<'a> {
    pub fn insert(&mut self, frontend: Frontend, spec: FrontendSpec) {
        self.frontends.insert(frontend, Cow::Owned(spec));
    }

    pub fn borrow(&mut self, frontend: Frontend, spec: &'a FrontendSpec) {
        self.frontends.insert(frontend, Cow::Borrowed(spec));
    }

    /// A copy that borrows nothing, to keep past the table it came from.
    pub fn into_owned(self) -> Desired<'static> {
        Desired {
            frontends: self
                .frontends
                .into_iter()
                .map(|(frontend, spec)| (frontend, Cow::Owned(spec.into_owned())))
                .collect(),
        }
    }

    /// Every frontend and its spec.
    pub fn iter(&self) -> impl Iterator<Item = (&Frontend, &FrontendSpec)> {
        self.frontends
            .iter()
            .map(|(frontend, spec)| (frontend, &**spec))
    }
}
