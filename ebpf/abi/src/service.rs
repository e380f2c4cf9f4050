//! The service map (frontends), the slot array (their backends, by id), the backend map,
//! the Maglev table and the frontends' names, with the constants their fields hold.

use crate::Ipv6Words;

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

/// [`Backend::flags`]: the backend runs on another node, so traffic from outside reaching
/// it through this node is SNATed to this node's address (else the replies would bypass
/// this node).
pub const BACKEND_FLAG_REMOTE: u8 = 1 << 0;

/// Highest backend slot a service may have (slots are `1..=count`).
pub const MAX_BACKENDS_PER_SERVICE: u16 = u16::MAX;

/// Key of the service map: a frontend. `slot` is always 0 (the map holds master entries
/// only; older layouts kept the backend slots here too, and the field keeps their keys
/// readable).
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

/// Value of the service map of both families: a frontend's master entry. Its backends are
/// the backend ids of the slot array at `first_slot .. first_slot + count` (slot `n` is
/// index `first_slot + n - 1`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceEntry {
    /// Number of backend slots; 0 means "known frontend, no usable backend".
    pub count: u16,
    /// `SERVICE_FLAG_*` bits.
    pub flags: u16,
    /// Stable id of the frontend, for the reverse and affinity maps.
    pub service_id: u32,
    /// sessionAffinityConfig.clientIP.timeoutSeconds, when [`SERVICE_FLAG_AFFINITY`] is set.
    pub affinity_timeout_s: u32,
    /// Index of slot 1 in the slot array.
    pub first_slot: u32,
    /// Slots the agent reserved from `first_slot` on (a power of two, at least `count`; 0
    /// without slots): only the agent reads it, to find its reservations again.
    pub slot_room: u32,
}

/// Value of the backend map (index or key: backend id, `u32`, never 0). All zeros in the
/// IPv4 array: no backend holds the id.
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

/// Value of the slot array: two backend slots. An array's entries are 8-byte aligned, so a
/// map of single `u32`s would spend as much on padding, and would not map into memory as one
/// run of ids; slot `i` is half `i % 2` of entry `i / 2`.
pub type SlotPair = [u32; 2];

/// Bit 31 of a backend id: the backend is IPv6 (its entry is in the IPv6 backend map).
pub const BACKEND_ID_IPV6: u32 = 1 << 31;

/// [`ServiceKey`] of an IPv6 frontend.
pub type ServiceKey6 = ServiceKey<Ipv6Words>;

/// [`Backend`] of an IPv6 endpoint (key: backend id, with [`BACKEND_ID_IPV6`]).
pub type Backend6 = Backend<Ipv6Words>;

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
