//! What the socket path keeps per socket: the reverse records getpeername() and
//! recvmsg() read, the socket ring, each socket's own record and their count, the pairs a
//! sweep closes, and session affinity (local sockets and clients outside the node).

use crate::Ipv6Words;

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

/// A socket's record in [`crate::map_names::SOCKET_RECORDS`]: the frontend it asked for and the
/// backend it got, written by connect() for connected UDP sockets always and for TCP
/// sockets when the agent closes those too ([`crate::globals::RECORD_TCP`]). Addresses in network
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
    /// [`crate::PROTO_TCP`] or [`crate::PROTO_UDP`].
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

/// [`ReverseKey`] of an IPv6 socket.
pub type ReverseKey6 = ReverseKey<Ipv6Words, u32>;

/// [`ReverseEntry`] of an IPv6 socket.
pub type ReverseEntry6 = ReverseEntry<Ipv6Words>;

/// [`SocketFrontend`] of an IPv6 socket.
pub type SocketFrontend6 = SocketFrontend<Ipv6Words>;

/// [`GoneKey`] of an IPv6 frontend.
pub type GoneKey6 = GoneKey<Ipv6Words>;

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

/// Key of the IPv6 affinity map: a client outside the node (local sockets are keyed by
/// netns cookie in the shared [`AffinityKey`] map) and a service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey6 {
    pub client: Ipv6Words,
    pub service_id: u32,
    pub pad: u32,
}
