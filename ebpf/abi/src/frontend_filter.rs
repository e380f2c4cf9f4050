//! Which packets may be addressed to a frontend. The TC programs look up the service map
//! for every packet that belongs to no translated flow, and most do not go to a Service
//! (a pod talking to another pod, a backend's replies): each would miss a lookup in a map
//! that grows with the cluster (two million entries at 100,000 Services), whose buckets
//! are rarely in cache. The filter answers first, from one bit: the agent marks the slot
//! of every frontend (address, port, protocol, whatever its scope) before it writes the
//! frontend's master entry, so an unmarked slot proves that the lookup would miss.
//!
//! Marks of frontends since removed stay until the agent rebuilds the filter from the
//! frontends it programmed (after each full sync); a stale mark only costs the lookup.
//! The programs trust the filter only while the word at [`FRONTEND_FILTER_READY`] is
//! nonzero, which the agent sets once every programmed frontend is marked: a fresh map
//! (a new node, or a version of socklb before the filter) filters nothing.
//!
//! The map is an mmapable array of 64-bit words, a slot a bit, written only by the agent.

use core::ops::Range;

use crate::{FilterSlot, filter_slot};

/// Slots (128 KiB of bits): 100,000 Services with a ClusterIP and a NodePort on two node
/// addresses mark about a quarter of them, 10,000 Services 3%.
pub const FRONTEND_FILTER_SLOTS: u32 = 1 << 20;
/// The index of the word that says whether the programs may trust the slots.
pub const FRONTEND_FILTER_READY: u32 = 0;
/// The words of the slots.
pub const FRONTEND_FILTER_WORDS: Range<u32> = 1..1 + FRONTEND_FILTER_SLOTS / 64;
/// Words of the map: the ready flag, then the slots.
pub const FRONTEND_FILTER_ENTRIES: u32 = FRONTEND_FILTER_WORDS.end;

/// A frontend's slot: its address (IPv6 folded by [`crate::fold_ipv6`]), port and protocol,
/// as the service map's key holds them (network byte order).
#[must_use]
#[inline(always)]
pub fn frontend_filter_slot(address: u32, port: u16, protocol: u8) -> FilterSlot {
    filter_slot(
        FRONTEND_FILTER_WORDS.start,
        FRONTEND_FILTER_SLOTS,
        address,
        port,
        protocol,
    )
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::collections::HashSet;

    use super::*;

    #[test]
    fn slots_stay_within_the_map() {
        for (address, port) in [(0, 0), (u32::MAX, u16::MAX), (0x0a00_0001, 80), (7, 53)] {
            let slot = frontend_filter_slot(address, port, 6);
            assert!(FRONTEND_FILTER_WORDS.contains(&slot.word), "{slot:?}");
            assert_eq!(slot.bit.count_ones(), 1);
        }
    }

    #[test]
    fn a_service_cidr_spreads_over_the_slots() {
        // 100,000 ClusterIPs in a row (network order: the last octet is the high byte).
        let slots: HashSet<_> = (0..100_000u32)
            .map(|host| {
                let slot = frontend_filter_slot(u32::from_be(0x0a60_0000 + host), 80u16.to_be(), 6);
                (slot.word, slot.bit)
            })
            .collect();
        assert!(slots.len() > 95_000, "{}", slots.len());
    }
}
