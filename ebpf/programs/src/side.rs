//! The side of the node a packet of the per-packet path arrives from, and what that changes
//! in its flow: which frontends it reaches (the service map's scope), when its flow is
//! SNATed, what it counts and how it is traced. Everything else (conntrack, NAT, backend
//! choice, delivery) is one path for both sides.
use socklb_abi::{
    BACKEND_FLAG_REMOTE, Counters, SCOPE_EXTERNAL, SCOPE_INTERNAL, TRACE_SOURCE_EXTERNAL,
    TRACE_SOURCE_POD,
};

use crate::{family::Slot, packet::Address};

/// 1: packets from outside the node to a ClusterIP are translated (socklb-abi
/// `globals::CLUSTER_IPS_FROM_OUTSIDE`). A read-only global: with 0, the verifier removes
/// the second lookup.
#[unsafe(no_mangle)]
static CLUSTER_IPS_FROM_OUTSIDE: u32 = 0;

/// The scope a packet of side `S` that no frontend of `S::SCOPE` took may try next.
#[inline(always)]
pub fn fallback_scope<S: Side>() -> Option<u8> {
    // SAFETY: a read of an initialised static; volatile so the agent's value is used.
    let allowed = unsafe { core::ptr::read_volatile(&CLUSTER_IPS_FROM_OUTSIDE) } != 0;
    (S::INTERNAL_TOO && allowed).then_some(SCOPE_INTERNAL)
}

pub trait Side {
    /// The service map scope whose frontends and selection serve the packet.
    const SCOPE: u8;
    /// Whether a packet that no frontend of [`Self::SCOPE`] takes may reach the internal
    /// ones (a ClusterIP), when the agent allows it (`cluster_ips_from_outside`).
    const INTERNAL_TOO: bool;
    /// `TRACE_SOURCE_*` of its trace events.
    const TRACE_SOURCE: u8;
    /// Whether a new flow not SNATed is made in the main conntrack table at once, rather
    /// than waiting in the unconfirmed one for the client's answer to its backend (unless
    /// a live flow holds its reply key: see `conntrack::insert`).
    const CONFIRMED_AT_ONCE: bool;
    /// Whether its flows to a backend on this node may be delivered by socklb both ways
    /// (`CT_FLAG_DIRECT`), when the agent asks for it (`NodeConfig::pod_delivery`).
    const DIRECT: bool;

    /// Whether a new flow to `backend` from `client` is SNATed to this node's address (and
    /// forwarded by socklb) so that its replies come back through this node.
    fn snat<A: Address>(backend: &Slot<A>, client: A) -> bool;

    /// The counter of new flows, and of packets dropped for want of a usable backend here.
    fn flows(counters: &mut Counters) -> &mut u64;
    fn no_backend(counters: &mut Counters) -> &mut u64;
    /// The counter of packets refused (answered with a TCP reset or ICMP port unreachable:
    /// `reject`) because their Service has no endpoint at all; those past the rate limit
    /// count as [`no_backend`](Self::no_backend).
    fn refused(counters: &mut Counters) -> &mut u64;
}

/// Traffic from outside the node, on its external devices: NodePorts, LoadBalancer IPs and
/// externalIPs with their External selection.
pub struct External;

impl Side for External {
    const SCOPE: u8 = SCOPE_EXTERNAL;
    /// A client routed to the Service CIDR (advertised by BGP, or a static route), as
    /// kube-proxy serves it; its flow is SNATed as a NodePort's is.
    const INTERNAL_TOO: bool = true;
    const TRACE_SOURCE: u8 = TRACE_SOURCE_EXTERNAL;
    /// A flood of SYNs from spoofed clients, who never answer, must evict only other
    /// handshakes, not established flows.
    const CONFIRMED_AT_ONCE: bool = false;
    /// The node's netfilter sees flows from outside as kube-proxy's DNAT leaves them.
    const DIRECT: bool = false;

    /// A backend on another node would answer the client directly, past this node.
    #[inline(always)]
    fn snat<A: Address>(backend: &Slot<A>, _client: A) -> bool {
        backend.flags & BACKEND_FLAG_REMOTE != 0
    }

    #[inline(always)]
    fn flows(counters: &mut Counters) -> &mut u64 {
        &mut counters.external_flows
    }

    #[inline(always)]
    fn no_backend(counters: &mut Counters) -> &mut u64 {
        &mut counters.external_no_backend
    }

    #[inline(always)]
    fn refused(counters: &mut Counters) -> &mut u64 {
        &mut counters.rejected
    }
}

/// Traffic from a workload on this node whose sockets the socket hooks leave alone (a
/// meshed pod, a VM, a netstack), on its host-side device: internal frontends with their
/// Cluster or Local selection, as the socket path gives them.
pub struct Pod;

impl Side for Pod {
    const SCOPE: u8 = SCOPE_INTERNAL;
    const INTERNAL_TOO: bool = false;
    const TRACE_SOURCE: u8 = TRACE_SOURCE_POD;
    /// A workload of this node can complete as many handshakes as it sends SYNs, so the
    /// wait would protect nothing, and it would cost every connection a move between the
    /// tables (two inserts and two deletes at its first ACK).
    const CONFIRMED_AT_ONCE: bool = true;
    const DIRECT: bool = true;

    /// Pod addresses route across the cluster, so a backend anywhere answers the pod
    /// straight, through this node, and its reply is rewritten on the pod device's egress.
    /// Only a pod that is its own backend (hairpin) would see its own address as the source,
    /// which its kernel drops: that flow is SNATed to the node, as kube-proxy masquerades it.
    #[inline(always)]
    fn snat<A: Address>(backend: &Slot<A>, client: A) -> bool {
        backend.backend_address == client
    }

    #[inline(always)]
    fn flows(counters: &mut Counters) -> &mut u64 {
        &mut counters.pod_flows
    }

    #[inline(always)]
    fn no_backend(counters: &mut Counters) -> &mut u64 {
        &mut counters.pod_no_backend
    }

    /// One counter for both, as the socket path's `no_backend` counts every connection it
    /// turns away.
    #[inline(always)]
    fn refused(counters: &mut Counters) -> &mut u64 {
        &mut counters.pod_no_backend
    }
}
