//! How the datapath is set up: where its pins go, which cgroup it serves, how large its maps
//! may grow (`Config`), and what the TC programs need to know about this node
//! (`NodeSettings`).
use std::{
    net::{Ipv4Addr, Ipv6Addr},
    ops::RangeInclusive,
    path::PathBuf,
    time::Duration,
};

use crate::{
    desired::sizing::Capacities,
    kernel::{
        load::{ProgramLoad, ProgramSettings},
        pins::DEFAULT_PIN_DIR,
        program_logs::ProgramLogLevel,
    },
};

#[derive(Clone, Debug)]
pub struct Config {
    /// Directory on bpffs for socklb's pinned maps and links.
    pub pin_dir: PathBuf,
    /// cgroup v2 directory to attach to; `None` means the root of the cgroup v2 mount, so
    /// that every process on the node is served.
    pub cgroup: Option<PathBuf>,
    pub capacities: Capacities,
    /// Positions of every Maglev table: one of [`MAGLEV_TABLE_SIZES`](super::MAGLEV_TABLE_SIZES).
    pub maglev_table_size: u32,
    /// The kernel programs' own log lines forwarded (off: compiled out by the verifier).
    pub program_log_level: ProgramLogLevel,
    /// connect() records TCP sockets too, so that they can be closed when their backend
    /// leaves (`--destroy-tcp-on-backend-removal`); connected UDP sockets always are.
    pub record_tcp: bool,
    /// The network namespace (by cookie) whose sockets the socket hooks translate (the
    /// agent's own, the host's), with those of the namespaces map if `socket_lb_listed`
    /// (`--socket-lb-scope pods`), or alone (`host`); `None`: every namespace (`all`).
    pub socket_lb_netns: Option<u64>,
    pub socket_lb_listed: bool,
    /// Packets from outside the node to a ClusterIP are translated on the external devices
    /// (`--cluster-ips-from-outside`).
    pub cluster_ips_from_outside: bool,
    /// How the per-packet path delivers a pod's flows to backends on this node
    /// (`--pod-delivery`).
    pub pod_delivery: PodDelivery,
    /// When the kernel verifies the programs: the agent waits, on a fresh node, for
    /// [`Dataplane::apply_first`](super::Dataplane::apply_first) to size the maps.
    pub program_load: ProgramLoad,
}

impl Config {
    pub(super) fn program_settings(&self) -> ProgramSettings {
        ProgramSettings {
            log_level: self.program_log_level,
            record_tcp: self.record_tcp,
            socket_lb_netns: self.socket_lb_netns,
            socket_lb_listed: self.socket_lb_listed,
            cluster_ips_from_outside: self.cluster_ips_from_outside,
        }
    }
}

/// How the per-packet path delivers a pod's flows to a backend on this node, both ways.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PodDelivery {
    /// Handed back to the kernel once translated: the node's routing and netfilter see
    /// the flow as from the client to the backend (its conntrack, a CNI's NetworkPolicy
    /// rules), as they see kube-proxy's DNATed flows.
    #[default]
    Kernel,
    /// Redirected by socklb to the backend's device, and its replies to the client's,
    /// past the node's routing and netfilter: faster, but netfilter rules (an iptables
    /// NetworkPolicy) never see these flows.
    Direct,
}

impl PodDelivery {
    /// Its `POD_DELIVERY_*` code in the node map.
    pub fn code(self) -> u32 {
        match self {
            Self::Kernel => socklb_abi::POD_DELIVERY_KERNEL,
            Self::Direct => socklb_abi::POD_DELIVERY_DIRECT,
        }
    }
}

impl std::fmt::Display for PodDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kernel => "kernel",
            Self::Direct => "direct",
        })
    }
}

/// Cilium's default: about 1% imbalance with 100 backends, 64 KiB per frontend of value.
pub const DEFAULT_MAGLEV_TABLE_SIZE: u32 = 16_381;

impl Default for Config {
    fn default() -> Self {
        Self {
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            cgroup: None,
            capacities: Capacities::default(),
            maglev_table_size: DEFAULT_MAGLEV_TABLE_SIZE,
            program_log_level: ProgramLogLevel::Off,
            record_tcp: false,
            socket_lb_netns: None,
            socket_lb_listed: false,
            cluster_ips_from_outside: false,
            pod_delivery: PodDelivery::Kernel,
            program_load: ProgramLoad::Now,
        }
    }
}

/// What the TC programs need to know about this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSettings {
    /// Flows to backends on other nodes are SNATed to this address; `None` drops them
    /// (counted as errors) until the node has an address.
    pub snat_address: Option<Ipv4Addr>,
    /// The same for IPv6 flows: the node's first IPv6 InternalIP it holds.
    pub snat_address6: Option<Ipv6Addr>,
    /// Source ports for SNAT (both families).
    pub snat_ports: RangeInclusive<u16>,
    pub conntrack_timeouts: ConntrackTimeouts,
}

impl std::fmt::Display for ConntrackTimeouts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let human = humantime::format_duration;
        write!(
            f,
            "tcp syn {}, tcp established {}, tcp close {}, udp {}",
            human(self.tcp_syn),
            human(self.tcp_established),
            human(self.tcp_close),
            human(self.udp)
        )
    }
}

/// Idle time after which a flow from outside is forgotten (its SNAT port reused, its
/// backend chosen afresh), per state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConntrackTimeouts {
    /// TCP before the handshake completed (SYN only, or SYN and SYN-ACK).
    pub tcp_syn: Duration,
    /// TCP once the handshake completed.
    pub tcp_established: Duration,
    /// TCP after a FIN or RST.
    pub tcp_close: Duration,
    /// UDP.
    pub udp: Duration,
}

impl Default for ConntrackTimeouts {
    fn default() -> Self {
        let seconds = |s: u32| Duration::from_secs(u64::from(s));
        Self {
            tcp_syn: seconds(socklb_abi::CT_TIMEOUT_SYN_S),
            tcp_established: seconds(socklb_abi::CT_TIMEOUT_TCP_S),
            tcp_close: seconds(socklb_abi::CT_TIMEOUT_CLOSING_S),
            udp: seconds(socklb_abi::CT_TIMEOUT_OTHER_S),
        }
    }
}
