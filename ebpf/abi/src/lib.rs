//! The contract between socklb's kernel programs and its agent: map names, keys, values
//! and constants.
//!
//! Every type is `#[repr(C)]` with fixed-width integers, explicit zeroed padding and a
//! compile-time size check, so both sides (and `bpftool`, through BTF) agree on every byte.
//! Addresses and ports are stored in network byte order; only the agent converts them.
//! A change to any layout must bump [`LAYOUT_VERSION`] and the `_vN` suffix of the map
//! names, so that a new agent never reuses a pinned map of the old layout.
#![no_std]

use core::mem::size_of;

/// Version of every map layout below; also the suffix of the map names.
pub const LAYOUT_VERSION: u32 = 1;

/// Map names as the kernel and bpffs see them (at most 15 bytes).
pub mod map_names {
    /// [`super::ServiceKey`] -> [`super::ServiceEntry`]: frontends and their backend slots.
    pub const SERVICES: &str = "socklb_svc_v1";
    /// backend id (`u32`) -> [`super::Backend`].
    pub const BACKENDS: &str = "socklb_be_v1";
    /// [`super::ReverseKey`] -> [`super::ReverseEntry`]: which VIP a socket really talks to.
    pub const REVERSE: &str = "socklb_rev_v1";
    /// [`super::AffinityKey`] -> [`super::AffinityEntry`]: ClientIP session affinity.
    pub const AFFINITY: &str = "socklb_aff_v1";
    /// Per-CPU [`super::Counters`], a single entry at index 0.
    pub const COUNTERS: &str = "socklb_cnt_v1";

    /// Every map socklb pins, in the order the agent reports them.
    pub const ALL: [&str; 5] = [SERVICES, BACKENDS, REVERSE, AFFINITY, COUNTERS];
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

    pub const ALL: [&str; 8] = [
        CONNECT4,
        SENDMSG4,
        RECVMSG4,
        GETPEERNAME4,
        CONNECT6,
        SENDMSG6,
        RECVMSG6,
        GETPEERNAME6,
    ];
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

/// Highest backend slot a service may have (slots are `1..=count`).
pub const MAX_BACKENDS_PER_SERVICE: u16 = u16::MAX;

/// Key of the service map. Slot 0 is the frontend's master entry, slots `1..=count` hold
/// its backends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// Frontend IPv4 address, network byte order.
    pub address: u32,
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
pub struct ServiceEntry {
    /// Slot: the backend's id (key of the backend map).
    pub backend_id: u32,
    /// Slot: the backend's IPv4 address, network byte order.
    pub backend_address: u32,
    /// Slot: the backend's port, network byte order.
    pub backend_port: u16,
    /// Master: number of backend slots; 0 means "known frontend, no usable backend".
    pub count: u16,
    /// Master: `SERVICE_FLAG_*` bits.
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
pub struct Backend {
    /// Backend IPv4 address, network byte order.
    pub address: u32,
    /// Backend port, network byte order.
    pub port: u16,
    pub protocol: u8,
    pub flags: u8,
}

/// Key of the reverse map: a socket (by cookie) and the backend it was sent to. Keyed by
/// cookie so that a socket that connected to the backend directly is never shown the VIP.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReverseKey {
    pub cookie: u64,
    /// Backend address, network byte order.
    pub address: u32,
    /// Backend port, network byte order.
    pub port: u16,
    pub pad: u16,
}

/// Value of the reverse map: the frontend the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReverseEntry {
    /// Frontend address, network byte order.
    pub address: u32,
    /// Frontend port, network byte order.
    pub port: u16,
    pub pad: u16,
    pub service_id: u32,
}

/// Key of the affinity map: a client (its network namespace, i.e. its pod or the host)
/// and a service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKey {
    pub netns_cookie: u64,
    pub service_id: u32,
    pub pad: u32,
}

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

/// Per-CPU event counters (one entry, index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Counters {
    /// connect/sendmsg rewritten from a frontend to a backend.
    pub translated: u64,
    /// connect/sendmsg to a frontend with no usable backend, refused with ECONNREFUSED.
    pub no_backend: u64,
    /// Translations that reused a session-affinity entry.
    pub affinity_hits: u64,
    /// recvmsg/getpeername answers rewritten from a backend back to the frontend.
    pub reverse_translated: u64,
    /// Failures that let the operation proceed untranslated (e.g. a slot missing, a full
    /// reverse map).
    pub errors: u64,
}

impl Counters {
    /// Sums the per-CPU copies.
    #[must_use]
    pub fn sum<'a>(values: impl IntoIterator<Item = &'a Self>) -> Self {
        values.into_iter().fold(Self::default(), |acc, c| Self {
            translated: acc.translated.wrapping_add(c.translated),
            no_backend: acc.no_backend.wrapping_add(c.no_backend),
            affinity_hits: acc.affinity_hits.wrapping_add(c.affinity_hits),
            reverse_translated: acc.reverse_translated.wrapping_add(c.reverse_translated),
            errors: acc.errors.wrapping_add(c.errors),
        })
    }
}

const _: () = assert!(size_of::<ServiceKey>() == 12);
const _: () = assert!(size_of::<ServiceEntry>() == 24);
const _: () = assert!(size_of::<Backend>() == 8);
const _: () = assert!(size_of::<ReverseKey>() == 16);
const _: () = assert!(size_of::<ReverseEntry>() == 12);
const _: () = assert!(size_of::<AffinityKey>() == 16);
const _: () = assert!(size_of::<AffinityEntry>() == 16);
const _: () = assert!(size_of::<Counters>() == 40);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are repr(C), made only of integers, with every padding byte an explicit
    // field, so any bit pattern is valid and there is no uninitialised byte.
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::ServiceEntry {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::ReverseKey {}
    unsafe impl aya::Pod for super::ReverseEntry {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::AffinityEntry {}
    unsafe impl aya::Pod for super::Counters {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_names_fit_the_kernel_limit_and_carry_the_version() {
        for name in map_names::ALL {
            assert!(name.len() <= 15, "{name} is longer than 15 bytes");
            assert!(name.ends_with("_v1"), "{name} lacks the layout version");
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
        let one = Counters {
            translated: 1,
            no_backend: 2,
            affinity_hits: 3,
            reverse_translated: 4,
            errors: 5,
        };
        let total = Counters::sum([&one, &one]);
        assert_eq!(
            total,
            Counters {
                translated: 2,
                no_backend: 4,
                affinity_hits: 6,
                reverse_translated: 8,
                errors: 10,
            }
        );
    }
}
