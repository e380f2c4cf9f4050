//! The contract between socklb's kernel programs and its agent: map names, keys, values
//! and constants.
//!
//! Every type is `#[repr(C)]` with fixed-width integers, explicit zeroed padding and a
//! compile-time size check, so both sides (and `bpftool`, through BTF) agree on every byte.
//! Addresses and ports are stored in network byte order; only the agent converts them.
//!
//! A key or value that both address families use is declared once, generic over its
//! address: `A = u32` (IPv4, the default) or [`Ipv6Words`] (the `*6` aliases), so that the
//! programs treat both families alike with no view, cast or layout check of their own.
//! A change to any layout must bump [`LAYOUT_VERSION`] and the `_vN` suffix of the map
//! names, so that a new agent never reuses a pinned map of the old layout.
#![no_std]

use core::mem::size_of;

/// Version of the map layouts below when none changed since the first release; a map whose
/// layout changed carries its own higher `_vN` suffix (and its old name is in
/// [`map_names::RETIRED`]).
pub const LAYOUT_VERSION: u32 = 1;

/// Map names as the kernel and bpffs see them (at most 15 bytes).
pub mod map_names {
    /// [`super::ServiceKey`] -> [`super::ServiceEntry`]: frontends and their backend slots.
    /// Not preallocated (`_v1` was).
    pub const SERVICES: &str = "socklb_svc_v2";
    /// backend id (`u32`) -> [`super::Backend`]. Not preallocated (`_v1` was).
    pub const BACKENDS: &str = "socklb_be_v2";
    /// [`super::ReverseKey`] -> [`super::ReverseEntry`] (LRU): which VIP an unconnected UDP
    /// socket sent each datagram to, so that the replies come from it.
    pub const REVERSE: &str = "socklb_rev_v1";
    /// Array of [`super::SocketFrontend`] indexed by socket cookie modulo its (power of two)
    /// size: which VIP a connect()ed socket asked for.
    pub const SOCKETS: &str = "socklb_sock_v1";
    /// [`super::AffinityKey`] -> [`super::AffinityEntry`]: ClientIP session affinity.
    pub const AFFINITY: &str = "socklb_aff_v1";
    /// Per-CPU [`super::Counters`], a single entry at index 0.
    pub const COUNTERS: &str = "socklb_cnt_v7";
    /// [`super::CtKey`] -> [`super::CtEntry`] (LRU): confirmed flows from outside the node
    /// (TCP past its handshake, UDP answered and continued) and their NAT.
    pub const CONNTRACK: &str = "socklb_ct_v1";
    /// [`super::CtKey`] -> [`super::CtEntry`] (LRU, smaller): flows from outside not yet
    /// confirmed. A SYN flood fills this table and never evicts a confirmed flow.
    pub const CONNTRACK_NEW: &str = "socklb_ctn_v1";
    /// [`super::NodeConfig`], a single entry at index 0: what the TC programs need to
    /// know about this node.
    pub const NODE: &str = "socklb_node_v2";
    /// [`super::FragmentKey`] -> [`super::FragmentPorts`] (LRU): the ports of an IP
    /// datagram's first fragment, for its later fragments (which carry none).
    pub const FRAGMENTS: &str = "socklb_frag_v1";
    /// LPM trie of [`super::SourceRange`] -> [`super::SourceVerdict`]:
    /// loadBalancerSourceRanges.
    pub const SOURCE_RANGES: &str = "socklb_src_v1";
    /// [`super::MaglevKey`] -> slot (`u32`): Maglev tables of external frontends.
    pub const MAGLEV: &str = "socklb_mglv_v1";
    /// service id (`u32`) -> [`super::FrontendName`]: which Service a frontend belongs to,
    /// for `socklb inspect` and bpftool. The programs never read it.
    pub const NAMES: &str = "socklb_names_v1";
    /// Ring buffer of [`super::TraceEvent`]s: translations as they happen, written only
    /// while a `socklb trace` session holds the lease in [`TRACE_CONTROL`].
    pub const TRACE: &str = "socklb_trace_v2";
    /// [`super::TraceControl`], a single entry at index 0: whether, and for what, the
    /// programs write trace events.
    pub const TRACE_CONTROL: &str = "socklb_trctl_v2";
    /// aya-log's ring buffer of the programs' diagnostics (`AYA_LOGS` in the object),
    /// pinned so that programs loaded again over grown maps keep writing where the agent
    /// reads. Written only with `--bpf-log-level`.
    pub const PROGRAM_LOGS: &str = "socklb_logs_v1";
    /// Socket-local storage of [`super::SocketRecord`]: what each connect()ed socket that
    /// may have to be closed was translated for. Unlike the socket ring it forgets no live
    /// socket (the kernel frees a record with its socket), so a sweep finds every one.
    pub const SOCKET_RECORDS: &str = "socklb_skrec_v1";
    /// [`super::SocketRecordCount`], a single entry at index 0: how many sockets hold a
    /// record. The kernel charges records to the agent's memory cgroup, and any pod can
    /// create them, so connect() stops creating them at [`super::globals::MAX_SOCKET_RECORDS`].
    pub const SOCKET_RECORD_COUNT: &str = "socklb_skcnt_v1";
    /// [`super::GoneKey`] -> `u8` (hash, small): the (frontend, backend) pairs of one sync
    /// whose backend left, read by the socket iterators that close their sockets. Not
    /// pinned: it belongs to the running agent and is empty between sweeps.
    pub const GONE: &str = "socklb_gone_v1";

    /// [`super::ServiceKey6`] -> [`super::ServiceEntry6`]: IPv6 frontends and their backend
    /// slots. Service and backend ids are one space across both families, so the affinity,
    /// Maglev and names maps serve both.
    pub const SERVICES6: &str = "socklb_svc6_v1";
    /// backend id (`u32`) -> [`super::Backend6`].
    pub const BACKENDS6: &str = "socklb_be6_v1";
    /// [`super::ReverseKey6`] -> [`super::ReverseEntry6`] (LRU): [`REVERSE`] for IPv6.
    pub const REVERSE6: &str = "socklb_rev6_v1";
    /// Array of [`super::SocketFrontend6`]: [`SOCKETS`] for IPv6 sockets.
    pub const SOCKETS6: &str = "socklb_sock6_v1";
    /// [`super::AffinityKey6`] -> [`super::AffinityEntry`] (LRU): ClientIP affinity of IPv6
    /// clients outside the node (local sockets use [`AFFINITY`], keyed by netns cookie).
    pub const AFFINITY6: &str = "socklb_aff6_v1";
    /// [`super::CtKey6`] -> [`super::CtEntry6`] (LRU): [`CONNTRACK`] for IPv6.
    pub const CONNTRACK6: &str = "socklb_ct6_v1";
    /// [`super::CtKey6`] -> [`super::CtEntry6`] (LRU): [`CONNTRACK_NEW`] for IPv6.
    pub const CONNTRACK_NEW6: &str = "socklb_ctn6_v1";
    /// [`super::FragmentKey6`] -> [`super::FragmentPorts`] (LRU): [`FRAGMENTS`] for IPv6.
    pub const FRAGMENTS6: &str = "socklb_frag6_v1";
    /// LPM trie of [`super::SourceRange6`] -> [`super::SourceVerdict`]: IPv6
    /// loadBalancerSourceRanges.
    pub const SOURCE_RANGES6: &str = "socklb_src6_v1";
    /// [`super::NodeConfig6`], a single entry at index 0: this node's IPv6 settings (the
    /// family-independent ones stay in [`NODE`]).
    pub const NODE6: &str = "socklb_node6_v1";
    /// [`super::GoneKey6`] -> `u8`: [`GONE`] for IPv6 sockets. Not pinned.
    pub const GONE6: &str = "socklb_gone6_v1";
    /// Per-CPU scratch room of the TC programs for IPv6 keys and entries (their type is the
    /// programs' own). Not pinned: it holds nothing between two packets, and each load of
    /// the programs has its own.
    pub const SCRATCH6: &str = "socklb_scr6_v1";
    /// Per-CPU count of the ICMP answers the TC programs sent in the current second
    /// (refusals of frontends without endpoints are rate limited). Not pinned: each load
    /// starts afresh.
    pub const REJECT_BUDGET: &str = "socklb_rej_v1";
    /// The TC programs' own maps, never pinned: they hold nothing that outlives a load.
    pub const PROGRAM_LOCAL: [&str; 2] = [SCRATCH6, REJECT_BUDGET];

    /// Every map socklb pins, in the order the agent reports them.
    pub const ALL: [&str; 28] = [
        SERVICES,
        BACKENDS,
        SERVICES6,
        BACKENDS6,
        REVERSE,
        REVERSE6,
        SOCKETS,
        SOCKETS6,
        AFFINITY,
        COUNTERS,
        CONNTRACK,
        CONNTRACK_NEW,
        NODE,
        FRAGMENTS,
        SOURCE_RANGES,
        MAGLEV,
        NAMES,
        TRACE,
        TRACE_CONTROL,
        PROGRAM_LOGS,
        SOCKET_RECORDS,
        SOCKET_RECORD_COUNT,
        AFFINITY6,
        CONNTRACK6,
        CONNTRACK_NEW6,
        NODE6,
        FRAGMENTS6,
        SOURCE_RANGES6,
    ];

    /// Names of maps an older agent pinned and this one no longer uses: removed at load and
    /// by `socklb cleanup`.
    pub const RETIRED: [&str; 13] = [
        "socklb_cnt_v1",
        "socklb_cnt_v2",
        "socklb_cnt_v3",
        "socklb_cnt_v4",
        "socklb_cnt_v5",
        "socklb_cnt_v6",
        "socklb_node_v1",
        RETIRED_SERVICES,
        "socklb_be_v1",
        // IPv4-only trace events and filters.
        "socklb_trace_v1",
        "socklb_trctl_v1",
        // Renamed to match their IPv6 twins ([`RENAMED`]).
        "socklb_ctnew_v1",
        "socklb_lbsrc_v1",
    ];

    /// Maps an older agent pinned under another name, with the same layout, whose entries
    /// the programs wrote and a new agent carries over into the map of the new name (flows
    /// in progress live on); (old name, new name). Other renamed maps are written by the
    /// agent and are simply [`RETIRED`].
    pub const RENAMED: [(&str, &str); 1] = [("socklb_ctnew_v1", CONNTRACK_NEW)];

    /// The service map of the previous layout (preallocated; same key and value as
    /// [`SERVICES`]): the frontends it holds were serving, so the agent reads them before
    /// removing its pin and gives them the room first in the new map.
    pub const RETIRED_SERVICES: &str = "socklb_svc_v1";
}

/// Names of the kernel programs (the functions in socklb-ebpf), one per hook.
/// The `*6` programs serve IPv6 sockets that talk to IPv4-mapped addresses.
pub mod program_names {
    pub const CONNECT4: &str = "socklb_connect4";
    pub const SENDMSG4: &str = "socklb_sendmsg4";
    pub const RECVMSG4: &str = "socklb_recvmsg4";
    pub const GETPEERNAME4: &str = "socklb_getpeername4";
    pub const CONNECT6: &str = "socklb_connect6";
    pub const SENDMSG6: &str = "socklb_sendmsg6";
    pub const RECVMSG6: &str = "socklb_recvmsg6";
    pub const GETPEERNAME6: &str = "socklb_getpeername6";

    /// TC ingress on the node's external devices: NodePort, LoadBalancer and externalIP
    /// traffic from outside, and the replies of SNATed flows.
    pub const TC_INGRESS: &str = "socklb_tc_in";
    /// TC egress on the node's external devices: replies of local backends to outside
    /// clients.
    pub const TC_EGRESS: &str = "socklb_tc_out";

    /// The cgroup sock_addr programs.
    pub const SOCK_ADDR: [&str; 8] = [
        CONNECT4,
        SENDMSG4,
        RECVMSG4,
        GETPEERNAME4,
        CONNECT6,
        SENDMSG6,
        RECVMSG6,
        GETPEERNAME6,
    ];

    /// The TC programs.
    pub const TC: [&str; 2] = [TC_INGRESS, TC_EGRESS];

    /// cgroup sock_release: a socket with a record leaves the count of records.
    pub const SOCK_RELEASE: &str = "socklb_sock_release";

    /// Socket iterators (`iter/udp`, `iter/tcp`) that close the sockets translated to a
    /// backend that left. Loaded by the agent for itself only, never pinned.
    pub const DESTROY_UDP: &str = "socklb_destroy_udp";
    pub const DESTROY_TCP: &str = "socklb_destroy_tcp";
}

/// IP protocol numbers as found in `bpf_sock_addr.protocol`.
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// Traffic from local sockets (cgroup hooks): uses the service's Cluster or Local selection.
pub const SCOPE_INTERNAL: u8 = 0;
/// Traffic arriving from outside the node (TC): uses the External selection.
pub const SCOPE_EXTERNAL: u8 = 1;

/// [`ServiceEntry::flags`]: sessionAffinity ClientIP is on for this frontend.
pub const SERVICE_FLAG_AFFINITY: u16 = 1 << 0;
/// [`ServiceEntry::flags`] of an external frontend: new flows take the backend of their
/// Maglev table position instead of a random one.
pub const SERVICE_FLAG_MAGLEV: u16 = 1 << 1;
/// [`ServiceEntry::flags`] of an external frontend without backends: its Service has no
/// endpoint for the port anywhere, so a packet from outside is refused (ICMP port
/// unreachable), as kube-proxy's REJECT does. Without it an empty frontend drops
/// (externalTrafficPolicy Local with endpoints on other nodes only, as kube-proxy's DROP).
pub const SERVICE_FLAG_REJECT: u16 = 1 << 2;

/// Key of the Maglev map: a frontend (by service id) and a table position.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MaglevKey {
    pub service_id: u32,
    pub index: u32,
}

/// [`ServiceEntry::flags`] of a backend slot, and [`Backend::flags`]: the backend runs on
/// another node, so traffic from outside reaching it through this node is SNATed to this
/// node's address (else the replies would bypass this node).
pub const BACKEND_FLAG_REMOTE: u8 = 1 << 0;

/// Highest backend slot a service may have (slots are `1..=count`).
pub const MAX_BACKENDS_PER_SERVICE: u16 = u16::MAX;

/// Key of the service map. Slot 0 is the frontend's master entry, slots `1..=count` hold
/// its backends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey<A = u32> {
    /// Frontend address, network byte order.
    pub address: A,
    /// Frontend port, network byte order.
    pub port: u16,
    /// [`PROTO_TCP`] or [`PROTO_UDP`].
    pub protocol: u8,
    /// [`SCOPE_INTERNAL`] or [`SCOPE_EXTERNAL`].
    pub scope: u8,
    pub slot: u16,
    pub pad: u16,
}

/// Value of the service map. The master entry (slot 0) uses `count`, `flags`, `service_id`
/// and `affinity_timeout_s`; a backend slot uses `backend_id` and carries the backend's
/// address and port too, so that translating a connection needs no backend-map lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceEntry<A = u32> {
    /// Slot: the backend's id (key of the backend map).
    pub backend_id: u32,
    /// Slot: the backend's address, network byte order.
    pub backend_address: A,
    /// Slot: the backend's port, network byte order.
    pub backend_port: u16,
    /// Master: number of backend slots; 0 means "known frontend, no usable backend".
    pub count: u16,
    /// Master: `SERVICE_FLAG_*` bits. Slot: the backend's `BACKEND_FLAG_*` bits.
    pub flags: u16,
    pub pad: u16,
    /// Master: stable id of the frontend, for the reverse and affinity maps.
    pub service_id: u32,
    /// Master: sessionAffinityConfig.clientIP.timeoutSeconds, when
    /// [`SERVICE_FLAG_AFFINITY`] is set.
    pub affinity_timeout_s: u32,
}

/// Value of the backend map (key: backend id, `u32`, never 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Backend<A = u32> {
    /// Backend address, network byte order.
    pub address: A,
    /// Backend port, network byte order.
    pub port: u16,
    pub protocol: u8,
    /// `BACKEND_FLAG_*` bits.
    pub flags: u8,
}

/// Key of the reverse map: a socket (by cookie) and the backend it was sent to. Keyed by
/// cookie so that a socket that connected to the backend directly is never shown the VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReverseKey<A = u32, P = [u32; 0]> {
    pub cookie: u64,
    /// Backend address, network byte order.
    pub address: A,
    /// Backend port, network byte order.
    pub port: u16,
    pub pad: u16,
    /// Zeroed room to the key's 8-byte alignment: none for IPv4, a word for IPv6.
    pub pad2: P,
}

/// Value of the reverse map: the frontend the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReverseEntry<A = u32> {
    /// Frontend address, network byte order.
    pub address: A,
    /// Frontend port, network byte order.
    pub port: u16,
    pub pad: u16,
    pub service_id: u32,
}

/// An entry of the socket map: the frontend a connect()ed socket asked for and the backend
/// it got. The map is a ring indexed by the socket's cookie (cookies only grow), so writing
/// one costs a single store, with neither lock nor allocation on connect(); a socket's entry
/// is overwritten once a socket whose cookie is larger by the map's size is translated.
/// The cookie and the backend are checked on every read, so a socket never sees another
/// socket's frontend, and a direct connection to a backend is never shown the VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SocketFrontend<A = u32> {
    /// The socket's cookie; 0 in a slot never written.
    pub cookie: u64,
    /// Backend address, network byte order.
    pub backend_address: A,
    /// Backend port, network byte order.
    pub backend_port: u16,
    pub pad: u16,
    /// Frontend address, network byte order.
    pub frontend_address: A,
    /// Frontend port, network byte order.
    pub frontend_port: u16,
    pub pad2: u16,
    pub service_id: u32,
    pub pad3: u32,
}

/// A socket's record in [`map_names::SOCKET_RECORDS`]: the frontend it asked for and the
/// backend it got, written by connect() for connected UDP sockets always and for TCP
/// sockets when the agent closes those too ([`globals::RECORD_TCP`]). Addresses in network
/// byte order, an IPv4 one in the last word (the others zero).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SocketRecord {
    pub frontend_address: Ipv6Words,
    pub backend_address: Ipv6Words,
    pub frontend_port: u16,
    pub backend_port: u16,
    /// 4 or 6.
    pub family: u8,
    pub protocol: u8,
    pub pad: u16,
}

/// The number of sockets holding a [`SocketRecord`], changed atomically by connect()
/// (one more) and sock_release (one less). Signed: a release racing another on the last
/// record may take it below zero for a moment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SocketRecordCount {
    pub live: i64,
}

impl GoneKey {
    /// The key that says a sweep is closing sockets whose peer is this backend (the frontend
    /// zeroed: no frontend is 0.0.0.0:0). The iterators check it first, so that only the
    /// sockets of a gone backend pay for reading their record.
    #[must_use]
    pub const fn peer(protocol: u8, backend_address: u32, backend_port: u16) -> Self {
        Self {
            frontend_address: 0,
            frontend_port: 0,
            protocol,
            pad: 0,
            backend_address,
            backend_port,
            pad2: 0,
        }
    }
}

/// Key of the gone map: a frontend and one of its backends that left it. A socket whose
/// socket map entry names this pair (and whose peer is still that backend) is closed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GoneKey<A = u32> {
    /// Frontend address, network byte order.
    pub frontend_address: A,
    /// Frontend port, network byte order.
    pub frontend_port: u16,
    /// [`PROTO_TCP`] or [`PROTO_UDP`].
    pub protocol: u8,
    pub pad: u8,
    /// Backend address, network byte order.
    pub backend_address: A,
    /// Backend port, network byte order.
    pub backend_port: u16,
    pub pad2: u16,
}

/// Pairs of one sweep pass: removals of one sync beyond it are swept in several passes.
pub const GONE_PAIRS_PER_PASS: u32 = 4096;
/// Capacity of each gone map: a pass's pairs and, in the IPv4 map, as many peer keys
/// ([`GoneKey::peer`]).
pub const GONE_CAPACITY: u32 = 2 * GONE_PAIRS_PER_PASS;

/// The raw `bpf_sock_destroy` kfunc call in the destroy iterators, as one little-endian
/// instruction word: opcode `BPF_JMP | BPF_CALL` (0x85), source register
/// `BPF_PSEUDO_KFUNC_CALL` (2), offset 0 (vmlinux), and in the immediate (high 32 bits) a
/// placeholder that the agent replaces with the kfunc's BTF id in the running kernel.
pub const SOCK_DESTROY_CALL: u64 = ((SOCK_DESTROY_PLACEHOLDER as u64) << 32) | 0x2085;
/// The immediate of [`SOCK_DESTROY_CALL`] before the agent patches it; no BTF id is this
/// large.
pub const SOCK_DESTROY_PLACEHOLDER: u32 = 0x5eed_de57;

/// Names of the programs' read-only globals that the agent sets at load time.
pub mod globals {
    /// `u32`: the socket map's size minus one (the size is a power of two).
    pub const SOCKET_SLOT_MASK: &str = "SOCKET_SLOT_MASK";
    /// `u32`: 1 when connect() records TCP sockets too (the agent closes them when their
    /// backend leaves, `--destroy-tcp-on-backend-removal`); 0: UDP only, and a TCP connect
    /// pays nothing for it.
    pub const RECORD_TCP: &str = "RECORD_TCP";
    /// `u32`: the byte offset of `skc_cookie` in the running kernel's `struct sock_common`
    /// (from its BTF), so that the destroy iterators read a socket's cookie without handing
    /// one out to every socket they visit; 0: unknown, the programs ask the helper.
    pub const SKC_COOKIE_OFFSET: &str = "SKC_COOKIE_OFFSET";

    // Added for IPv6 sockets (sock6).
    /// `u32`: the byte offset of `skc_v6_daddr` in the running kernel's `struct
    /// sock_common` (from its BTF), where the destroy iterators read an IPv6 socket's peer;
    /// 0: unknown, IPv6 sockets are not swept.
    pub const SKC_V6_DADDR_OFFSET: &str = "SKC_V6_DADDR_OFFSET";

    /// `u32`: how many sockets may hold a record at once (`--max-socket-records`); past
    /// it connect() still translates, and the sweep finds the socket through the socket
    /// ring only.
    pub const MAX_SOCKET_RECORDS: &str = "MAX_SOCKET_RECORDS";
}

/// Key of the affinity map: a client (its network namespace, i.e. its pod or the host)
/// and a service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    /// The client's network namespace cookie; for traffic from outside the node (TC), the
    /// client's IPv4 address (network byte order) with [`AFFINITY_EXTERNAL_CLIENT`] set.
    pub netns_cookie: u64,
    pub service_id: u32,
    pub pad: u32,
}

/// Marks an [`AffinityKey`] of a client outside the node: netns cookies never reach bit 63.
pub const AFFINITY_EXTERNAL_CLIENT: u64 = 1 << 63;

/// Value of the affinity map: the backend last chosen and when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityEntry {
    /// `bpf_ktime_get_ns()` of the last connection that used this entry.
    pub last_used_ns: u64,
    pub backend_id: u32,
    /// Slot the backend held; checked against the service map so that an entry whose
    /// backend left the service is never used.
    pub slot: u16,
    pub pad: u16,
}

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
/// [`CtEntry::flags`] of a flow not yet confirmed: the backend has answered. The client's
/// next packet that is neither a SYN nor a FIN or RST confirms the flow (moves it to the
/// main table).
pub const CT_FLAG_SEEN_REPLY: u16 = 1 << 2;
/// [`CtEntry::flags`]: a FIN was seen in this direction. The other direction may go on
/// sending (a half-close, `shutdown(SHUT_WR)`), so the flow keeps its timeout; once both
/// directions sent a FIN, both entries are marked [`CT_FLAG_CLOSING`].
pub const CT_FLAG_FIN: u16 = 1 << 3;
/// [`CtEntry::flags`]: [`CtEntry::sequence_high`] holds where this direction's TCP
/// sequence numbers are. Entries written before it existed lack it and trust any segment.
pub const CT_FLAG_SEQUENCE: u16 = 1 << 4;

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
/// Confirmed TCP flows.
pub const CT_TIMEOUT_TCP_S: u32 = 21_600;
/// TCP flows not confirmed (SYN seen, handshake not completed).
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
    /// Seconds since boot (`bpf_ktime_get_ns`) of the last packet in this direction.
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
}

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

    /// Idle timeout of a conntrack entry with `flags` of a `protocol` flow, in the main
    /// table (`confirmed`) or not.
    #[must_use]
    #[inline(always)]
    pub fn timeout_s(self, protocol: u8, flags: u16, confirmed: bool) -> u32 {
        if flags & CT_FLAG_CLOSING != 0 {
            self.closing_s
        } else if protocol != PROTO_TCP {
            self.udp_s
        } else if confirmed {
            self.established_s
        } else {
            self.syn_s
        }
    }
}

/// An IPv6 address as the programs hold it: the 16 bytes in network order, as four words
/// (the shape of `bpf_sock_addr.user_ip6`, so a socket address is copied, never converted).
/// The agent converts with [`ipv6_words`] and [`ipv6_octets`].
pub type Ipv6Words = [u32; 4];

/// The words of an IPv6 address given as its 16 octets (network order).
#[must_use]
pub const fn ipv6_words(octets: [u8; 16]) -> Ipv6Words {
    let mut words = [0u32; 4];
    let mut i = 0;
    while i < 4 {
        words[i] = u32::from_ne_bytes([
            octets[4 * i],
            octets[4 * i + 1],
            octets[4 * i + 2],
            octets[4 * i + 3],
        ]);
        i += 1;
    }
    words
}

/// The 16 octets (network order) of an IPv6 address held as [`Ipv6Words`].
#[must_use]
pub const fn ipv6_octets(words: Ipv6Words) -> [u8; 16] {
    let mut octets = [0u8; 16];
    let mut i = 0;
    while i < 4 {
        let bytes = words[i].to_ne_bytes();
        octets[4 * i] = bytes[0];
        octets[4 * i + 1] = bytes[1];
        octets[4 * i + 2] = bytes[2];
        octets[4 * i + 3] = bytes[3];
        i += 1;
    }
    octets
}

/// [`ServiceKey`] of an IPv6 frontend.
pub type ServiceKey6 = ServiceKey<Ipv6Words>;

/// [`ServiceEntry`] of an IPv6 frontend: the same fields, with the backend's address
/// 16 bytes wide.
pub type ServiceEntry6 = ServiceEntry<Ipv6Words>;

/// [`Backend`] of an IPv6 endpoint (key: backend id, from the same space as IPv4's).
pub type Backend6 = Backend<Ipv6Words>;

/// [`ReverseKey`] of an IPv6 socket.
pub type ReverseKey6 = ReverseKey<Ipv6Words, u32>;

/// [`ReverseEntry`] of an IPv6 socket.
pub type ReverseEntry6 = ReverseEntry<Ipv6Words>;

/// [`SocketFrontend`] of an IPv6 socket.
pub type SocketFrontend6 = SocketFrontend<Ipv6Words>;

/// [`GoneKey`] of an IPv6 frontend.
pub type GoneKey6 = GoneKey<Ipv6Words>;

/// Key of the IPv6 affinity map: a client outside the node (local sockets are keyed by
/// netns cookie in the shared [`AffinityKey`] map) and a service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey6 {
    pub client: Ipv6Words,
    pub service_id: u32,
    pub pad: u32,
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

/// Value of the names map: the Service a frontend belongs to, NUL-padded UTF-8.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrontendName {
    pub namespace: [u8; 64],
    pub name: [u8; 64],
    /// The Service port's name ("" when unnamed).
    pub port: [u8; 16],
    /// `FRONTEND_KIND_*`.
    pub kind: u8,
    pub pad: [u8; 7],
}

/// What a trace event describes: a socket translation, a reverse translation, or a flow
/// from outside (TC).
pub const TRACE_SOURCE_CONNECT: u8 = 1;
pub const TRACE_SOURCE_SENDMSG: u8 = 2;
/// recvmsg/getpeername showing the frontend instead of the backend.
pub const TRACE_SOURCE_REVERSE: u8 = 3;
/// A packet from outside the node (NodePort, LoadBalancer IP, externalIP).
pub const TRACE_SOURCE_EXTERNAL: u8 = 4;

// Why the backend was chosen (or none).

/// A random slot (TCP connect; a new flow from outside without Maglev).
pub const TRACE_REASON_RANDOM: u8 = 1;
/// The socket's hash (UDP: a socket keeps its backend).
pub const TRACE_REASON_PER_SOCKET: u8 = 2;
/// The client's session-affinity entry.
pub const TRACE_REASON_AFFINITY: u8 = 3;
/// No usable backend: refused (socket) or dropped (outside).
pub const TRACE_REASON_NO_BACKEND: u8 = 4;
/// The Maglev table's position for the flow.
pub const TRACE_REASON_MAGLEV: u8 = 5;
/// loadBalancerSourceRanges do not allow the client: dropped.
pub const TRACE_REASON_SOURCE_DENIED: u8 = 6;
/// No SNAT port was free for a flow to another node: dropped.
pub const TRACE_REASON_SNAT_EXHAUSTED: u8 = 7;
/// The flow's conntrack entry (a packet of a known flow from outside).
pub const TRACE_REASON_CONNTRACK: u8 = 8;
/// The socket's record of the frontend it asked for (reverse translation).
pub const TRACE_REASON_REVERSE: u8 = 9;

/// [`TraceControl::flags`]: also emit reverse translations (recvmsg, getpeername).
pub const TRACE_FLAG_REVERSE: u16 = 1 << 0;
/// [`TraceControl::flags`]: also emit every packet of known flows from outside.
pub const TRACE_FLAG_PACKETS: u16 = 1 << 1;

/// One translation, as `socklb trace` shows it. Socket events carry the process, network
/// namespace and cgroup of the caller (the agent adds the process name: the kernel gives
/// socket-address programs no helper for it); events from outside carry the client's
/// address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// CLOCK_MONOTONIC, ns.
    pub time_ns: u64,
    pub socket_cookie: u64,
    pub netns_cookie: u64,
    pub cgroup_id: u64,
    /// The calling process (thread group id); 0 for packets from outside.
    pub pid: u32,
    pub service_id: u32,
    /// Addresses of [`Self::family`] and ports, in network byte order (IPv4 in the last
    /// word, as elsewhere in the ABI); 0 where not known.
    pub client_address: Ipv6Words,
    pub frontend_address: Ipv6Words,
    pub backend_address: Ipv6Words,
    pub client_port: u16,
    pub frontend_port: u16,
    pub backend_port: u16,
    /// The slot chosen (1-based) and how many the frontend had; 0 when none.
    pub slot: u16,
    pub count: u16,
    pub protocol: u8,
    /// `TRACE_SOURCE_*`.
    pub source: u8,
    /// `TRACE_REASON_*`.
    pub reason: u8,
    /// [`TRACE_FAMILY_V4`] or [`TRACE_FAMILY_V6`].
    pub family: u8,
    pub pad: u16,
}

/// [`TraceEvent::family`] and [`TraceControl::family`]: IPv4 (also IPv6 sockets talking to
/// IPv4-mapped addresses, translated in the IPv4 maps).
pub const TRACE_FAMILY_V4: u8 = 4;
/// Native IPv6.
pub const TRACE_FAMILY_V6: u8 = 6;

/// Whether the programs emit trace events, and which. A session renews `until_ns` every
/// second; a session that dies without turning emission off stops it by not renewing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceControl {
    /// Emit while CLOCK_MONOTONIC is below this, in ns; 0: off (the one check every
    /// translation pays).
    pub until_ns: u64,
    /// The session holding the lease (its pid), so that a second one can name it.
    pub session_pid: u32,
    pub frontend_port: u16,
    /// `TRACE_FLAG_*`.
    pub flags: u16,
    /// Kernel-side filters, 0 meaning any: frontend address and port, backend address, of
    /// [`Self::family`] (set with either address; IPv4 in the last word).
    pub frontend_address: Ipv6Words,
    pub backend_address: Ipv6Words,
    /// `TRACE_FAMILY_*`, or 0: any.
    pub family: u8,
    pub pad: u8,
    pub pad2: u16,
    pub pad3: u32,
}

impl Default for FrontendName {
    fn default() -> Self {
        Self {
            namespace: [0; 64],
            name: [0; 64],
            port: [0; 16],
            kind: 0,
            pad: [0; 7],
        }
    }
}

pub const FRONTEND_KIND_CLUSTER_IP: u8 = 1;
pub const FRONTEND_KIND_NODE_PORT: u8 = 2;
pub const FRONTEND_KIND_EXTERNAL_IP: u8 = 3;
pub const FRONTEND_KIND_LOAD_BALANCER: u8 = 4;

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

const _: () = assert!(size_of::<ServiceKey>() == 12);
const _: () = assert!(size_of::<ServiceEntry>() == 24);
const _: () = assert!(size_of::<Backend>() == 8);
const _: () = assert!(size_of::<ReverseKey>() == 16);
const _: () = assert!(size_of::<ReverseEntry>() == 12);
const _: () = assert!(size_of::<SocketFrontend>() == 32);
const _: () = assert!(size_of::<GoneKey>() == 16);
const _: () = assert!(size_of::<SocketRecord>() == 40);
const _: () = assert!(size_of::<SocketRecordCount>() == 8);
const _: () = assert!(size_of::<AffinityKey>() == 16);
const _: () = assert!(size_of::<AffinityEntry>() == 16);
const _: () = assert!(size_of::<Counters>() == Counters::NAMES.len() * 8);
const _: () = assert!(size_of::<SourceRange>() == 12);
const _: () = assert!(size_of::<CtKey>() == 16);
const _: () = assert!(size_of::<CtEntry>() == 28);
const _: () = assert!(size_of::<NodeConfig>() == 28);
const _: () = assert!(size_of::<FragmentKey>() == 12);
const _: () = assert!(size_of::<TraceEvent>() == 104);
const _: () = assert!(size_of::<TraceControl>() == 56);
const _: () = assert!(size_of::<FragmentPorts>() == 4);
const _: () = assert!(size_of::<MaglevKey>() == 8);
const _: () = assert!(size_of::<FrontendName>() == 152);
const _: () = assert!(size_of::<ServiceKey6>() == 24);
const _: () = assert!(size_of::<ServiceEntry6>() == 36);
const _: () = assert!(size_of::<Backend6>() == 20);
const _: () = assert!(size_of::<ReverseKey6>() == 32);
const _: () = assert!(size_of::<ReverseEntry6>() == 24);
const _: () = assert!(size_of::<SocketFrontend6>() == 56);
const _: () = assert!(size_of::<GoneKey6>() == 40);
const _: () = assert!(size_of::<AffinityKey6>() == 24);
const _: () = assert!(size_of::<CtKey6>() == 40);
const _: () = assert!(size_of::<CtEntry6>() == 52);
const _: () = assert!(size_of::<FragmentKey6>() == 40);
const _: () = assert!(size_of::<SourceRange6>() == 36);
const _: () = assert!(size_of::<NodeConfig6>() == 16);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are repr(C), made only of integers, with every padding byte an explicit
    // field, so any bit pattern is valid and there is no uninitialised byte.
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::ServiceEntry {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::ReverseKey {}
    unsafe impl aya::Pod for super::ReverseEntry {}
    unsafe impl aya::Pod for super::SocketFrontend {}
    unsafe impl aya::Pod for super::GoneKey {}
    unsafe impl aya::Pod for super::SocketRecord {}
    unsafe impl aya::Pod for super::SocketRecordCount {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::AffinityEntry {}
    unsafe impl aya::Pod for super::Counters {}
    unsafe impl aya::Pod for super::CtKey {}
    unsafe impl aya::Pod for super::CtEntry {}
    unsafe impl aya::Pod for super::NodeConfig {}
    unsafe impl aya::Pod for super::FragmentKey {}
    unsafe impl aya::Pod for super::FragmentPorts {}
    unsafe impl aya::Pod for super::SourceRange {}
    unsafe impl aya::Pod for super::MaglevKey {}
    unsafe impl aya::Pod for super::FrontendName {}
    unsafe impl aya::Pod for super::TraceEvent {}
    unsafe impl aya::Pod for super::TraceControl {}
    unsafe impl aya::Pod for super::ServiceKey6 {}
    unsafe impl aya::Pod for super::ServiceEntry6 {}
    unsafe impl aya::Pod for super::Backend6 {}
    unsafe impl aya::Pod for super::ReverseKey6 {}
    unsafe impl aya::Pod for super::ReverseEntry6 {}
    unsafe impl aya::Pod for super::SocketFrontend6 {}
    unsafe impl aya::Pod for super::GoneKey6 {}
    unsafe impl aya::Pod for super::AffinityKey6 {}
    unsafe impl aya::Pod for super::CtKey6 {}
    unsafe impl aya::Pod for super::CtEntry6 {}
    unsafe impl aya::Pod for super::FragmentKey6 {}
    unsafe impl aya::Pod for super::SourceRange6 {}
    unsafe impl aya::Pod for super::NodeConfig6 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_names_fit_the_kernel_limit_and_carry_the_version() {
        for name in map_names::ALL {
            assert!(name.len() <= 15, "{name} is longer than 15 bytes");
            let version = name.rsplit_once("_v").map(|(_, v)| v);
            assert!(
                version.is_some_and(|v| v.parse::<u32>().is_ok()),
                "{name} lacks the layout version"
            );
            assert!(!map_names::RETIRED.contains(&name), "{name} is retired");
        }
    }

    #[test]
    fn service_key_bytes_are_network_order_and_padding_is_explicit() {
        let key = ServiceKey {
            address: u32::from_be_bytes([10, 96, 0, 1]).to_be(),
            port: 80u16.to_be(),
            protocol: PROTO_TCP,
            scope: SCOPE_EXTERNAL,
            slot: 2,
            pad: 0,
        };
        // SAFETY: ServiceKey is repr(C) plain integers without implicit padding.
        let bytes: [u8; 12] = unsafe { core::mem::transmute(key) };
        assert_eq!(&bytes[0..4], &[10, 96, 0, 1]);
        assert_eq!(&bytes[4..6], &[0, 80]);
        assert_eq!(bytes[6], 6);
        assert_eq!(bytes[7], 1);
        assert_eq!(&bytes[8..10], &2u16.to_ne_bytes());
        assert_eq!(&bytes[10..12], &[0, 0]);
    }

    #[test]
    fn counters_sum_adds_every_field() {
        let mut one = Counters::default();
        let names = Counters::NAMES.len();
        // Through the in-memory layout: every field, whatever the table holds.
        // SAFETY: Counters is repr(C) made only of u64 fields, NAMES.len() of them.
        let fields = unsafe {
            core::slice::from_raw_parts_mut(core::ptr::from_mut(&mut one).cast::<u64>(), names)
        };
        for (i, field) in fields.iter_mut().enumerate() {
            *field = i as u64 + 1;
        }
        let total = Counters::sum([&one, &one]);
        assert_eq!(total.since(&one), one);
        for (i, value) in total.values().into_iter().enumerate() {
            assert_eq!(value, 2 * (i as u64 + 1), "{:?}", Counters::NAMES[i]);
        }
    }

    #[test]
    fn conntrack_timeouts_by_state() {
        let node = NodeConfig {
            ct_timeout_syn_s: 3,
            ct_timeout_established_s: 0,
            ..NodeConfig::default()
        };
        let set = CtTimeouts::of(Some(&node));
        // (timeouts, protocol, flags, confirmed, expected)
        let rows = [
            (CtTimeouts::of(None), PROTO_TCP, 0, false, CT_TIMEOUT_SYN_S),
            (CtTimeouts::of(None), PROTO_TCP, 0, true, CT_TIMEOUT_TCP_S),
            (
                CtTimeouts::of(None),
                PROTO_TCP,
                CT_FLAG_CLOSING,
                true,
                CT_TIMEOUT_CLOSING_S,
            ),
            (CtTimeouts::of(None), PROTO_UDP, 0, true, CT_TIMEOUT_OTHER_S),
            (
                CtTimeouts::of(None),
                PROTO_UDP,
                0,
                false,
                CT_TIMEOUT_OTHER_S,
            ),
            // Set by the node map; 0 keeps the default.
            (set, PROTO_TCP, CT_FLAG_SEEN_REPLY, false, 3),
            (set, PROTO_TCP, CT_FLAG_SNAT, true, CT_TIMEOUT_TCP_S),
        ];
        for (timeouts, protocol, flags, confirmed, expected) in rows {
            assert_eq!(
                timeouts.timeout_s(protocol, flags, confirmed),
                expected,
                "{protocol} {flags} {confirmed}"
            );
        }
        let entry: CtEntry = CtEntry {
            last_seen_s: 100,
            ..CtEntry::default()
        };
        assert!(!entry.expired(103, 3));
        assert!(entry.expired(104, 3));
    }

    #[test]
    fn a_segment_counts_only_near_the_sequence_its_direction_sent() {
        let rows = [
            (100, 100, true),
            (100, 116, true),
            (100, 84, true),
            (100, 117, false),
            (100, 83, false),
            (100, 0x8000, false),
            // Across the wrap of the sequence space.
            (0xfffa, 5, true),
            (5, 0xfffa, true),
        ];
        for (sent, rst, counts) in rows {
            assert_eq!(in_sequence_window(sent, rst), counts, "{sent} {rst}");
        }
    }

    #[test]
    fn ipv6_words_keep_network_order_in_memory() {
        let octets = core::array::from_fn(|i| i as u8 + 1);
        let words = ipv6_words(octets);
        // SAFETY: [u32; 4] and [u8; 16] have the same size and no padding.
        let bytes: [u8; 16] = unsafe { core::mem::transmute(words) };
        assert_eq!(bytes, octets);
        assert_eq!(ipv6_octets(words), octets);
    }

    #[test]
    fn ipv6_map_names_fit_the_kernel_limit_and_carry_the_version() {
        for name in [
            map_names::SERVICES6,
            map_names::BACKENDS6,
            map_names::REVERSE6,
            map_names::SOCKETS6,
            map_names::AFFINITY6,
            map_names::CONNTRACK6,
            map_names::CONNTRACK_NEW6,
            map_names::FRAGMENTS6,
            map_names::SOURCE_RANGES6,
            map_names::NODE6,
            map_names::GONE6,
            map_names::SCRATCH6,
        ] {
            assert!(name.len() <= 15, "{name} is longer than 15 bytes");
            assert!(
                name.rsplit_once("_v").is_some(),
                "{name} lacks the layout version"
            );
        }
    }

    #[test]
    fn counter_names_are_unique() {
        for (i, name) in Counters::NAMES.iter().enumerate() {
            for other in &Counters::NAMES[i + 1..] {
                assert_ne!(name, other);
            }
        }
    }
}
