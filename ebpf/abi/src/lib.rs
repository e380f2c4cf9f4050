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
//! A change to any layout must bump the `_vN` suffix of the map's name (the old name goes
//! to [`map_names::RETIRED`]), so that a new agent never reuses a pinned map of the old
//! layout.
#![no_std]

mod address;
mod checksum;
mod counters;
mod filter_slot;
mod flow;
mod flow_filter;
mod frontend_filter;
mod names;
mod reset;
mod service;
mod socket;
mod trace;

use core::mem::size_of;

pub use self::{
    address::*, checksum::*, counters::*, filter_slot::*, flow::*, flow_filter::*,
    frontend_filter::*, names::*, reset::*, service::*, socket::*, trace::*,
};

const _: () = assert!(size_of::<ServiceKey>() == 12);
const _: () = assert!(size_of::<ServiceEntry>() == 20);
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
const _: () = assert!(size_of::<NodeConfig>() == 48);
const _: () = assert!(size_of::<FragmentKey>() == 12);
const _: () = assert!(size_of::<TraceEvent>() == 128);
const _: () = assert!(size_of::<TraceControl>() == 56);
const _: () = assert!(size_of::<FragmentPorts>() == 4);
const _: () = assert!(size_of::<MaglevKey>() == 8);
const _: () = assert!(size_of::<FrontendName>() == 152);
const _: () = assert!(size_of::<ServiceKey6>() == 24);
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
            (
                CtTimeouts::of(None),
                PROTO_TCP,
                CT_FLAG_SEEN_REPLY,
                true,
                CT_TIMEOUT_TCP_S,
            ),
            // Made confirmed (a pod's flow), not answered yet.
            (CtTimeouts::of(None), PROTO_TCP, 0, true, CT_TIMEOUT_SYN_S),
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
            (
                set,
                PROTO_TCP,
                CT_FLAG_SNAT | CT_FLAG_SEEN_REPLY,
                true,
                CT_TIMEOUT_TCP_S,
            ),
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
