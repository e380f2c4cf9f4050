//! The programs' per-CPU event counters: one table, from which every name is derived.

/// Defines [`Counters`] from one table: each counter's one name is its field, which bpftool,
/// `socklb inspect` and the `socklb_datapath_events_total{event}` metric all show.
/// Everything else that names the counters (sums, differences, inspect, metrics, docs
/// checks) iterates [`Counters::NAMES`].
macro_rules! counters {
    ($($(#[doc = $doc:literal])* $field:ident,)*) => {
        /// Per-CPU event counters (one entry, index 0).
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
        pub struct Counters {
            $($(#[doc = $doc])* pub $field: u64,)*
        }

        impl Counters {
            /// Every counter's name, in layout order.
            pub const NAMES: [&'static str; [$(stringify!($field)),*].len()] =
                [$(stringify!($field)),*];

            /// The values, in the order of [`Self::NAMES`].
            #[must_use]
            pub fn values(&self) -> [u64; Counters::NAMES.len()] {
                [$(self.$field),*]
            }

            /// Applies `f` to each pair of fields.
            #[must_use]
            fn zip(&self, other: &Self, f: impl Fn(u64, u64) -> u64) -> Self {
                Self { $($field: f(self.$field, other.$field),)* }
            }
        }
    };
}

counters! {
    /// connect/sendmsg rewritten from a frontend to a backend.
    translated,
    /// connect/sendmsg to a frontend with no usable backend, refused with ECONNREFUSED.
    no_backend,
    /// Translations that reused a session-affinity entry.
    affinity_hits,
    /// recvmsg/getpeername answers rewritten from a backend back to the frontend.
    reverse_translated,
    /// Failures inside a program: a lookup that let the operation or packet proceed
    /// untranslated, or an affinity or reverse entry a full LRU refused (the translation
    /// stands).
    errors,
    /// Flows from outside the node given a backend (new conntrack entries).
    external_flows,
    /// Packets from outside to a frontend without a usable backend here, dropped.
    external_no_backend,
    /// Packets from outside dropped because no SNAT port was free.
    snat_exhausted,
    /// New flows to a LoadBalancer IP dropped by its loadBalancerSourceRanges.
    external_denied,
    /// Packets from outside that socklb forwards itself (to a backend on another node, or
    /// a SNATed flow's reply) dropped because their TTL was 1 or less (they could not be
    /// forwarded), before any conntrack entry was made for them; those from a client are
    /// answered with "time exceeded", as a router answers them (rate limited with the
    /// other answers). To a backend on this node the kernel decides.
    ttl_exceeded,
    /// Packets from outside dropped because a helper failed after part of the packet was
    /// already rewritten (a half-translated packet never leaves).
    rewrite_failed,
    /// Trace events lost because the trace ring buffer was full (a `socklb trace` session
    /// reading too slowly); the translations themselves are unaffected.
    trace_lost,
    /// IPv6 packets whose extension headers go on beyond the few the TC programs walk:
    /// passed untranslated.
    ipv6_headers_unwalked,
    /// ICMP errors about a flow from outside ("fragmentation needed", Packet Too Big,
    /// unreachable, time exceeded) translated back to the flow's frontend or backend.
    icmp_errors_translated,
    /// Packets from outside that started a flow another CPU started at the same moment
    /// (a retransmit, a second datagram): dropped, for their sender to send again, and
    /// the first CPU's backend stands.
    flow_races,
    /// Packets from outside to a frontend whose Service has no endpoint, answered with
    /// ICMP port unreachable (as kube-proxy rejects them). Past the rate limit they are
    /// dropped and counted as `external_no_backend`.
    rejected,
    /// Packets from outside too big for the path to their remote backend (its MTU below
    /// theirs) with "don't fragment" (always, over IPv6), answered with "fragmentation
    /// needed" (Packet Too Big) and that MTU.
    too_big_answered,
    /// Such packets that could not be answered (past the rate limit, IPv4 options, IPv6
    /// extension headers): dropped.
    too_big_dropped,
    /// Translated sockets left without a record because `--max-socket-records` sockets
    /// held one: still translated; the sweep finds them through the socket ring only.
    socket_records_full,
    /// Flows from pod devices to an internal frontend given a backend by the per-packet
    /// path (new conntrack entries).
    pod_flows,
    /// Packets from pod devices to an internal frontend without a usable backend: refused
    /// with ICMP port unreachable if its Service has no endpoint at all (past the rate
    /// limit, dropped), else (internalTrafficPolicy Local without a local endpoint) dropped.
    pod_no_backend,
}

impl Counters {
    /// Sums the per-CPU copies.
    #[must_use]
    pub fn sum<'a>(values: impl IntoIterator<Item = &'a Self>) -> Self {
        values
            .into_iter()
            .fold(Self::default(), |acc, c| acc.zip(c, u64::wrapping_add))
    }

    /// What happened between two readings (`self` the later one).
    #[must_use]
    pub fn since(&self, before: &Self) -> Self {
        self.zip(before, u64::wrapping_sub)
    }
}
