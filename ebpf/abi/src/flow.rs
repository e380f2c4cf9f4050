//! What the TC programs keep per flow from outside: conntrack keys, entries, flags and
//! timeouts, IP fragments' ports, loadBalancerSourceRanges, and the node's settings.

use crate::{Ipv6Words, PROTO_TCP};

/// [`CtKey::direction`]: a packet from the client towards the frontend.
pub const CT_FORWARD: u8 = 0;
/// [`CtKey::direction`]: a packet from the backend back towards the client.
pub const CT_REPLY: u8 = 1;

/// Key of the conntrack map: a packet's addresses and ports as they arrive (network byte
/// order) and which way it goes. A flow has one entry per direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey<A = u32> {
    pub source: A,
    pub destination: A,
    pub source_port: u16,
    pub destination_port: u16,
    pub protocol: u8,
    /// [`CT_FORWARD`] or [`CT_REPLY`].
    pub direction: u8,
    pub pad: u16,
}

/// [`CtEntry::flags`]: the flow's source was rewritten to this node's address.
pub const CT_FLAG_SNAT: u16 = 1 << 0;
/// [`CtEntry::flags`]: the connection is over (a RST, or a FIN both ways); the entry
/// expires soon.
pub const CT_FLAG_CLOSING: u16 = 1 << 1;
/// [`CtEntry::flags`]: the backend has answered. On a flow not yet confirmed, the client's
/// next packet that is neither a SYN nor a FIN or RST confirms it (moves it to the main
/// table); a flow made confirmed (a pod's) is established from then on.
pub const CT_FLAG_SEEN_REPLY: u16 = 1 << 2;
/// [`CtEntry::flags`]: a FIN was seen in this direction. The other direction may go on
/// sending (a half-close, `shutdown(SHUT_WR)`), so the flow keeps its timeout; once both
/// directions sent a FIN, both entries are marked [`CT_FLAG_CLOSING`].
pub const CT_FLAG_FIN: u16 = 1 << 3;
/// [`CtEntry::flags`]: [`CtEntry::sequence_high`] holds where this direction's TCP
/// sequence numbers are. Entries written before it existed lack it and trust any segment.
pub const CT_FLAG_SEQUENCE: u16 = 1 << 4;
/// [`CtEntry::flags`]: a pod's flow to a backend on this node whose packets socklb
/// delivers itself, both ways, past the node's routing and netfilter
/// ([`NodeConfig::pod_delivery`] [`POD_DELIVERY_DIRECT`] when it was made).
pub const CT_FLAG_DIRECT: u16 = 1 << 5;

/// How far (in units of 65,536 sequence numbers, either way) a TCP segment's sequence
/// number may be from the last one its direction sent for the segment to count on a
/// confirmed flow: 1 MiB, about as wide as the receive window netfilter checks against. A
/// segment outside (a blind RST, a SYN on a live flow) is passed on, for its receiver to
/// check again (RFC 5961), but neither ends the flow nor moves where it is, so that a
/// blind RST and a following SYN cannot tear down a live flow.
pub const SEQUENCE_WINDOW_HIGH: u16 = 16;

/// Whether a segment whose sequence number has `high` as its high 16 bits is within
/// [`SEQUENCE_WINDOW_HIGH`] of `sent_high`, its direction's last one.
#[must_use]
#[inline(always)]
pub fn in_sequence_window(sent_high: u16, high: u16) -> bool {
    let distance = sent_high.wrapping_sub(high);
    distance <= SEQUENCE_WINDOW_HIGH || distance >= SEQUENCE_WINDOW_HIGH.wrapping_neg()
}

/// Default idle time after which a flow's entries may be reused (its SNAT port given to a
/// new flow, its backend chosen afresh), per state; [`NodeConfig`] may set others. The maps
/// are LRUs, so idle entries also go when room is needed. Values as in Cilium's defaults.
/// Established TCP flows: confirmed, and answered by their backend.
pub const CT_TIMEOUT_TCP_S: u32 = 21_600;
/// TCP flows not established (SYN seen, not yet answered or not yet confirmed).
pub const CT_TIMEOUT_SYN_S: u32 = 60;
/// UDP flows.
pub const CT_TIMEOUT_OTHER_S: u32 = 60;
/// Flows that saw a FIN or RST.
pub const CT_TIMEOUT_CLOSING_S: u32 = 10;

/// Value of the conntrack map: what a packet of the flow is rewritten to (network byte
/// order), and which service and backend the flow belongs to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtEntry<A = u32> {
    pub source: A,
    pub destination: A,
    pub source_port: u16,
    pub destination_port: u16,
    pub backend_id: u32,
    pub service_id: u32,
    /// Seconds of CLOCK_MONOTONIC (`bpf_ktime_get_coarse_ns`) at the last packet in this
    /// direction.
    pub last_seen_s: u32,
    /// `CT_FLAG_*` bits.
    pub flags: u16,
    /// With [`CT_FLAG_SEQUENCE`]: the high 16 bits of the TCP sequence number last sent in
    /// this direction, which a segment must be near to count (see [`in_sequence_window`]).
    pub sequence_high: u16,
}

impl<A> CtEntry<A> {
    /// Whether the flow has been idle for longer than `timeout_s` (see
    /// [`CtTimeouts::timeout_s`]).
    #[must_use]
    pub fn expired(&self, now_s: u32, timeout_s: u32) -> bool {
        now_s.wrapping_sub(self.last_seen_s) > timeout_s
    }
}

impl<A: PartialEq> CtEntry<A> {
    /// Whether this entry, one direction of a flow, names `other` as the flow's other
    /// direction. A flow that took over an expired flow's SNAT port overwrote its reply
    /// entry, so the old flow's forward entry (left in place, or still read by a packet)
    /// must not act on it.
    #[must_use]
    #[inline(always)]
    pub fn points_to(&self, other: &CtKey<A>) -> bool {
        self.source == other.destination
            && self.destination == other.source
            && self.source_port == other.destination_port
            && self.destination_port == other.source_port
    }
}

impl<A: Copy> CtKey<A> {
    /// The key of the other direction of the flow whose entry under this key is `entry`:
    /// an entry says what its packets become, which is what the other direction's packets
    /// are with source and destination swapped.
    #[must_use]
    #[inline(always)]
    pub fn other_direction(&self, entry: &CtEntry<A>) -> Self {
        Self {
            source: entry.destination,
            destination: entry.source,
            source_port: entry.destination_port,
            destination_port: entry.source_port,
            protocol: self.protocol,
            direction: if self.direction == CT_FORWARD {
                CT_REPLY
            } else {
                CT_FORWARD
            },
            pad: 0,
        }
    }
}

/// Key of the fragment map: what identifies the fragments of one IP datagram as they
/// arrive (network byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragmentKey {
    pub source: u32,
    pub destination: u32,
    /// The IP header's identification.
    pub id: u16,
    pub protocol: u8,
    pub pad: u8,
}

/// Value of the fragment map: the ports the datagram's first fragment carried, network
/// byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragmentPorts {
    pub source_port: u16,
    pub destination_port: u16,
}

/// Data of a source-range key (the LPM trie's prefix length comes first, in
/// `Key<SourceRange>`): a LoadBalancer frontend and a client address. A frontend with
/// loadBalancerSourceRanges has one entry of prefix [`SOURCE_RANGE_FRONTEND_BITS`] (the
/// frontend alone, [`SOURCE_DENY`]) and one per allowed CIDR (prefix
/// `SOURCE_RANGE_FRONTEND_BITS + cidr length`, [`SOURCE_ALLOW`]); the longest match for
/// `(frontend, client)` decides. No match at all: the frontend is not restricted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceRange<A = u32> {
    /// Frontend address, network byte order.
    pub frontend: A,
    /// Frontend port, network byte order.
    pub port: u16,
    pub protocol: u8,
    pub pad: u8,
    /// Client address, network byte order.
    pub client: A,
}

/// Bits of [`SourceRange`] that name the frontend (address, port, protocol, pad).
pub const SOURCE_RANGE_FRONTEND_BITS: u32 = 64;

/// Value of the source-range trie.
pub type SourceVerdict = u32;
pub const SOURCE_DENY: SourceVerdict = 0;
pub const SOURCE_ALLOW: SourceVerdict = 1;

/// Value of the node map (index 0): written by the agent before the TC programs attach.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeConfig {
    /// Address flows to remote backends are SNATed to, network byte order; 0 = none known,
    /// such flows are dropped and counted as errors.
    pub snat_address: u32,
    /// Inclusive source-port range for SNAT, host byte order: outside the kernel's
    /// ephemeral range, so that it never collides with the node's own connections.
    pub snat_port_min: u16,
    pub snat_port_max: u16,
    /// Positions of every Maglev table (a prime); 0: Maglev off, random choice.
    pub maglev_table_size: u32,
    /// Conntrack idle timeouts in seconds; 0 means the `CT_TIMEOUT_*` default. TCP flows
    /// not confirmed (SYN only, or SYN and SYN-ACK).
    pub ct_timeout_syn_s: u32,
    /// Confirmed TCP flows.
    pub ct_timeout_established_s: u32,
    /// Flows that saw a FIN or RST.
    pub ct_timeout_closing_s: u32,
    /// UDP flows.
    pub ct_timeout_udp_s: u32,
    /// The socket hooks' scope the agent runs with (`SOCKET_LB_SCOPE_*`), for `socklb
    /// inspect`: the hooks themselves read it from their load-time globals.
    pub socket_lb_scope: u32,
    /// The cookie of the agent's network namespace, for `socklb inspect` and `socklb
    /// trace` to tell whether they see the devices the agent serves.
    pub agent_netns_cookie: u64,
    /// How a pod's flows to a backend on this node are delivered (`POD_DELIVERY_*`), read
    /// when a flow is made: the flow keeps its way for its life.
    pub pod_delivery: u32,
    pub pad: u32,
}

/// Flag of a served pod device (`map_names::POD_DEVICES`): a veth whose peer is in a pod's
/// network namespace, into which a redirected packet goes at once (`bpf_redirect_peer`).
pub const POD_DEVICE_VETH: u8 = 1 << 0;

/// [`NodeConfig::pod_delivery`]: through the node's routing and netfilter (the kernel's
/// path), which see the flow as from the client to the backend.
pub const POD_DELIVERY_KERNEL: u32 = 0;
/// [`NodeConfig::pod_delivery`]: redirected straight to the backend's device, and its
/// replies to the client's, past the node's routing and netfilter ([`CT_FLAG_DIRECT`]).
pub const POD_DELIVERY_DIRECT: u32 = 1;

/// [`NodeConfig::socket_lb_scope`]: every network namespace's sockets are translated.
pub const SOCKET_LB_SCOPE_ALL: u32 = 1;
/// [`NodeConfig::socket_lb_scope`]: only the agent's (the host's) network namespace.
pub const SOCKET_LB_SCOPE_HOST: u32 = 2;
/// [`NodeConfig::socket_lb_scope`]: the host's and the listed pods' namespaces.
pub const SOCKET_LB_SCOPE_PODS: u32 = 3;

/// Conntrack idle timeouts in seconds, as the programs apply them: what [`NodeConfig`]
/// sets, else the `CT_TIMEOUT_*` defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtTimeouts {
    pub syn_s: u32,
    pub established_s: u32,
    pub closing_s: u32,
    pub udp_s: u32,
}

impl CtTimeouts {
    pub const DEFAULT: Self = Self {
        syn_s: CT_TIMEOUT_SYN_S,
        established_s: CT_TIMEOUT_TCP_S,
        closing_s: CT_TIMEOUT_CLOSING_S,
        udp_s: CT_TIMEOUT_OTHER_S,
    };

    /// The timeouts `node` sets (`None`: the agent has not written it yet). Each field is
    /// read on its own (volatile): a program must not pick a field by a computed offset
    /// into the map value, which the verifier refuses without CAP_PERFMON.
    #[must_use]
    #[inline(always)]
    pub fn of(node: Option<&NodeConfig>) -> Self {
        let Some(node) = node else {
            return Self::DEFAULT;
        };
        let read = |field: &u32, default: u32| {
            // SAFETY: a read through a valid reference.
            match unsafe { core::ptr::read_volatile(field) } {
                0 => default,
                seconds => seconds,
            }
        };
        Self {
            syn_s: read(&node.ct_timeout_syn_s, CT_TIMEOUT_SYN_S),
            established_s: read(&node.ct_timeout_established_s, CT_TIMEOUT_TCP_S),
            closing_s: read(&node.ct_timeout_closing_s, CT_TIMEOUT_CLOSING_S),
            udp_s: read(&node.ct_timeout_udp_s, CT_TIMEOUT_OTHER_S),
        }
    }

    /// The shortest of the timeouts: how often the agent removes expired entries (unless
    /// `--conntrack-gc-interval` says otherwise).
    #[must_use]
    pub fn shortest(self) -> u32 {
        self.syn_s
            .min(self.established_s)
            .min(self.closing_s)
            .min(self.udp_s)
    }

    /// Idle timeout of a conntrack entry with `flags` of a `protocol` flow, in the main
    /// table (`confirmed`) or not. A TCP flow is established once it is confirmed and its
    /// backend answered: a flow made in the main table (a pod's) keeps the SYN timeout
    /// until then.
    #[must_use]
    #[inline(always)]
    pub fn timeout_s(self, protocol: u8, flags: u16, confirmed: bool) -> u32 {
        if flags & CT_FLAG_CLOSING != 0 {
            self.closing_s
        } else if protocol != PROTO_TCP {
            self.udp_s
        } else if confirmed && flags & CT_FLAG_SEEN_REPLY != 0 {
            self.established_s
        } else {
            self.syn_s
        }
    }
}

/// [`CtKey`] of an IPv6 packet.
pub type CtKey6 = CtKey<Ipv6Words>;

/// [`CtEntry`] of an IPv6 flow.
pub type CtEntry6 = CtEntry<Ipv6Words>;

/// [`FragmentKey`] of an IPv6 datagram (its Fragment header's 32-bit identification).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragmentKey6 {
    pub source: Ipv6Words,
    pub destination: Ipv6Words,
    pub id: u32,
    pub protocol: u8,
    pub pad: u8,
    pub pad2: u16,
}

/// [`SourceRange`] of an IPv6 LoadBalancer frontend and client.
pub type SourceRange6 = SourceRange<Ipv6Words>;

/// Bits of [`SourceRange6`] that name the frontend (address, port, protocol, pad).
pub const SOURCE_RANGE6_FRONTEND_BITS: u32 = 160;

/// Value of the IPv6 node map (index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeConfig6 {
    /// Address IPv6 flows to remote backends are SNATed to (the node's IPv6 InternalIP);
    /// all zero = none known, such flows are dropped and counted as errors. The SNAT port
    /// range is [`NodeConfig`]'s.
    pub snat_address: Ipv6Words,
}
