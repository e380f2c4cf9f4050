//! Which packets may belong to a flow the conntrack tables hold. Most packets a TC program
//! sees on a pod's or the node's device are of no translated flow (a pod talking to another
//! pod, a backend's own traffic); each would miss two conntrack lookups per direction, in
//! tables of a quarter of a million buckets, where the cache misses cost more than the rest
//! of the program. The filter answers first, from one bit:
//!
//! - a forward entry exists only for a packet to a frontend a flow was made for (its key
//!   holds the destination before translation), so [`flow_filter_destination`] marks the
//!   slot of each such (frontend, port, protocol);
//! - a reply entry exists only for a packet from a backend a flow was sent to, so
//!   [`flow_filter_source`] marks the slot of each such (backend, port, protocol);
//! - a forward entry waits in the unconfirmed table only for a frontend a flow was made
//!   there for, so [`flow_filter_unconfirmed`] marks the slot of each such frontend. A
//!   flow from outside always starts there, a pod's flow only when SNATed (a pod that is
//!   its own backend) or when another flow holds its reply key: a pod's first packet is
//!   then looked for in the main table alone.
//!
//! Slots are marked before a new flow's packet goes on and never cleared while the programs
//! trust the filter, so an unmarked slot proves that no entry exists (a marked one only
//! says "look"). A frontend deleted since keeps its mark: its open flows go on. The
//! programs trust the filter only while the word at [`FLOW_FILTER_READY`] is nonzero: the
//! agent clears it at each load, rebuilds the slots from the entries in the tables (made by
//! programs that predate the filter, or carried over from resized tables, among others)
//! and sets it again.
//!
//! The map is an mmapable array of 64-bit words, a slot a bit, marked by an atomic OR (the
//! programs' and the agent's alike), read and written through map lookups of a word: a bit
//! or byte index used as an offset into one large value would have the verifier track the
//! packet's fields precisely and walk the conntrack path once per protocol and port range.

use core::ops::Range;

use crate::{FilterSlot, Ipv6Words, filter_slot};

/// Slots per direction (32 KiB of bits each): 10,000 frontends (or backends) with flows
/// mark 4% of them.
pub const FLOW_FILTER_SLOTS: u32 = 1 << 18;
/// Words per direction.
const WORDS: u32 = FLOW_FILTER_SLOTS / 64;
/// The index of the word that says whether the programs may trust the slots.
pub const FLOW_FILTER_READY: u32 = 0;
/// The words of the frontends' slots (destinations of forward entries).
pub const FLOW_FILTER_DESTINATIONS: Range<u32> = 1..1 + WORDS;
/// The words of the backends' slots (sources of reply entries).
pub const FLOW_FILTER_SOURCES: Range<u32> = 1 + WORDS..1 + 2 * WORDS;
/// The words of the slots of frontends with flows in the unconfirmed table (destinations
/// of its forward entries).
pub const FLOW_FILTER_UNCONFIRMED: Range<u32> = 1 + 2 * WORDS..1 + 3 * WORDS;
/// Words of the map: the ready flag, then the destination, source and unconfirmed slots.
pub const FLOW_FILTER_ENTRIES: u32 = FLOW_FILTER_UNCONFIRMED.end;

/// A frontend's slot (the destination of forward entries).
#[must_use]
#[inline(always)]
pub fn flow_filter_destination(address: u32, port: u16, protocol: u8) -> FilterSlot {
    filter_slot(
        FLOW_FILTER_DESTINATIONS.start,
        FLOW_FILTER_SLOTS,
        address,
        port,
        protocol,
    )
}

/// A backend's slot (the source of reply entries).
#[must_use]
#[inline(always)]
pub fn flow_filter_source(address: u32, port: u16, protocol: u8) -> FilterSlot {
    filter_slot(
        FLOW_FILTER_SOURCES.start,
        FLOW_FILTER_SLOTS,
        address,
        port,
        protocol,
    )
}

/// A frontend's slot among those with flows in the unconfirmed table.
#[must_use]
#[inline(always)]
pub fn flow_filter_unconfirmed(address: u32, port: u16, protocol: u8) -> FilterSlot {
    filter_slot(
        FLOW_FILTER_UNCONFIRMED.start,
        FLOW_FILTER_SLOTS,
        address,
        port,
        protocol,
    )
}

/// An IPv6 address in one word, for the slot functions.
#[must_use]
#[inline(always)]
pub fn fold_ipv6(address: &Ipv6Words) -> u32 {
    address[0] ^ address[1] ^ address[2] ^ address[3]
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::collections::HashSet;

    use super::*;

    #[test]
    fn slots_stay_within_their_direction() {
        for (address, port) in [(0, 0), (u32::MAX, u16::MAX), (0x0a00_0001, 80), (7, 53)] {
            let destination = flow_filter_destination(address, port, 6);
            let source = flow_filter_source(address, port, 6);
            let unconfirmed = flow_filter_unconfirmed(address, port, 6);
            assert!((1..=WORDS).contains(&destination.word), "{destination:?}");
            assert!(FLOW_FILTER_SOURCES.contains(&source.word), "{source:?}");
            assert!(
                FLOW_FILTER_UNCONFIRMED.contains(&unconfirmed.word),
                "{unconfirmed:?}"
            );
            assert_eq!(unconfirmed.word - 2 * WORDS, destination.word);
            assert_eq!(destination.bit.count_ones(), 1);
            assert_eq!(source.word - WORDS, destination.word);
            assert_eq!(unconfirmed.bit, destination.bit);
        }
    }

    #[test]
    fn endpoints_that_differ_in_one_field_spread() {
        // A pod CIDR's addresses (network order: the last octet is the high byte) and a
        // range of ports each cover nearly as many slots as there are endpoints.
        let of = |slot: FilterSlot| (slot.word, slot.bit);
        let addresses: HashSet<_> = (0..1000u32)
            .map(|host| {
                of(flow_filter_destination(
                    u32::from_be(0x0af4_0000 + host),
                    80u16.to_be(),
                    6,
                ))
            })
            .collect();
        let ports: HashSet<_> = (0..1000u16)
            .map(|port| of(flow_filter_source(0x0a01_f40a, (30_000 + port).to_be(), 17)))
            .collect();
        assert!(addresses.len() > 990, "{}", addresses.len());
        assert!(ports.len() > 990, "{}", ports.len());
    }
}
