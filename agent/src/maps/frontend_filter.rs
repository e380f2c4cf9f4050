//! The frontend filter (socklb-abi `frontend_filter_slot`): one bit per hash of a
//! frontend's (address, port, protocol), which the TC programs read before they look up a
//! packet of no flow in the service map. The service store marks a frontend's slot before
//! it writes the frontend's master entry, so the programs never skip a frontend they could
//! find; a full sync rebuilds the filter from the frontends programmed, which clears the
//! slots of those removed since, and then lets the programs trust it.
//!
//! The map is mmapped: a mark is an atomic OR into its word, no syscall.
use std::{net::IpAddr, path::Path, sync::atomic::Ordering};

use socklb_abi::{
    FRONTEND_FILTER_ENTRIES, FRONTEND_FILTER_READY, FRONTEND_FILTER_SLOTS, FRONTEND_FILTER_WORDS,
    FilterSlot, fold_ipv6, frontend_filter_slot, ipv6_words, map_names,
};

use crate::{
    desired::Frontend,
    kernel::{
        mapped_words::{MappedWords, MappedWordsError},
        pins,
    },
};

pub struct FrontendFilter {
    words: MappedWords,
}

impl FrontendFilter {
    /// The filter pinned in `pin_dir` (the map the loaded programs read).
    pub fn open(pin_dir: &Path) -> Result<Self, MappedWordsError> {
        let name = map_names::FRONTEND_FILTER;
        let words = MappedWords::open_pin(pin_dir, name, FRONTEND_FILTER_ENTRIES)?;
        Ok(Self { words })
    }

    /// Marks `frontend`'s slot: called before its master entry is written.
    pub fn mark(&self, frontend: &Frontend) {
        let slot = slot_of(frontend);
        let word = self.words.word(slot.word);
        // Read first: most frontends of a sync are marked already.
        if word.load(Ordering::Relaxed) & slot.bit == 0 {
            word.fetch_or(slot.bit, Ordering::SeqCst);
        }
    }

    /// Makes the filter hold exactly the slots of `frontends` (every frontend whose master
    /// entry the service map holds), then lets the programs trust it. Each word is written
    /// at once with its new bits, and only if they differ: a bit still needed is never
    /// cleared, even for a moment. Returns how many slots are marked.
    pub fn rebuild<'a>(&self, frontends: impl IntoIterator<Item = &'a Frontend>) -> u32 {
        let words = words_of(frontends);
        for (index, &wanted) in FRONTEND_FILTER_WORDS.zip(&words) {
            let word = self.words.word(index);
            if word.load(Ordering::Relaxed) != wanted {
                word.store(wanted, Ordering::SeqCst);
            }
        }
        self.words
            .word(FRONTEND_FILTER_READY)
            .store(1, Ordering::SeqCst);
        words.iter().map(|word| word.count_ones()).sum()
    }
}

/// How full the filter is, for `socklb inspect`: the more slots are marked, the more
/// packets to no frontend are looked up all the same.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Fill {
    /// Whether the programs trust it (else they look up every packet of no flow).
    pub ready: bool,
    pub slots: u32,
    pub marked: u32,
}

/// The pinned filter's [`Fill`]; `None` when it is not pinned (an agent from before it).
pub fn fill(pin_dir: &Path) -> Result<Option<Fill>, MappedWordsError> {
    if !pins::map_pin(pin_dir, map_names::FRONTEND_FILTER).exists() {
        return Ok(None);
    }
    let filter = FrontendFilter::open(pin_dir)?;
    let word = |index| filter.words.word(index).load(Ordering::Relaxed);
    Ok(Some(Fill {
        ready: word(FRONTEND_FILTER_READY) != 0,
        slots: FRONTEND_FILTER_SLOTS,
        marked: FRONTEND_FILTER_WORDS
            .map(|index| word(index).count_ones())
            .sum(),
    }))
}

/// The slot words of the filter (from [`FRONTEND_FILTER_WORDS`]`.start` on) that mark
/// `frontends`.
fn words_of<'a>(frontends: impl IntoIterator<Item = &'a Frontend>) -> Vec<u64> {
    let first = FRONTEND_FILTER_WORDS.start;
    let mut words = vec![0; FRONTEND_FILTER_WORDS.len()];
    for frontend in frontends {
        let slot = slot_of(frontend);
        if let Some(word) = words.get_mut((slot.word - first) as usize) {
            *word |= slot.bit;
        }
    }
    words
}

/// A frontend's slot, from its address, port and protocol as the service map's key encodes
/// them (network byte order; IPv6 folded), as the programs compute it from a packet.
fn slot_of(frontend: &Frontend) -> FilterSlot {
    let address = match frontend.address {
        IpAddr::V4(address) => u32::from(address).to_be(),
        IpAddr::V6(address) => fold_ipv6(&ipv6_words(address.octets())),
    };
    frontend_filter_slot(address, frontend.port.to_be(), frontend.protocol.number())
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::desired::{Protocol, Scope};

    /// The slot the programs compute from a packet's destination: the address and port as
    /// the packet carries them (network order, read as a native word).
    fn packet_slot(address: [u8; 4], port: u16, protocol: u8) -> FilterSlot {
        frontend_filter_slot(
            u32::from_ne_bytes(address),
            u16::from_ne_bytes(port.to_be_bytes()),
            protocol,
        )
    }

    #[test]
    fn a_frontend_marks_the_slot_its_packets_ask() {
        let frontend = Frontend::internal(Ipv4Addr::new(10, 96, 0, 10), 80, Protocol::Tcp);
        assert_eq!(slot_of(&frontend), packet_slot([10, 96, 0, 10], 80, 6));
        let udp = Frontend::internal(Ipv4Addr::new(10, 96, 0, 10), 80, Protocol::Udp);
        assert_ne!(
            slot_of(&udp),
            slot_of(&frontend),
            "the protocol is part of the slot"
        );
    }

    #[test]
    fn every_scope_and_family_has_a_slot_and_the_words_hold_them_all() {
        let frontends = [
            Frontend::internal(Ipv4Addr::new(10, 96, 0, 10), 80, Protocol::Tcp),
            Frontend {
                scope: Scope::External,
                ..Frontend::internal(Ipv4Addr::new(192, 168, 0, 1), 30080, Protocol::Tcp)
            },
            Frontend::internal(
                Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x10),
                53,
                Protocol::Udp,
            ),
        ];
        let words = words_of(&frontends);
        for frontend in &frontends {
            let slot = slot_of(frontend);
            assert!(FRONTEND_FILTER_WORDS.contains(&slot.word));
            let word = words[(slot.word - FRONTEND_FILTER_WORDS.start) as usize];
            assert_ne!(word & slot.bit, 0, "{frontend:?}");
        }
        let marked: u32 = words.iter().map(|word| word.count_ones()).sum();
        assert_eq!(marked, 3);
    }
}
