//! The slots of the bit filters the TC programs ask before a map lookup (the flow filter,
//! the frontend filter): an endpoint (address, port, protocol) hashed to one bit of an
//! array of 64-bit words, so that an unmarked bit proves the lookup would miss.

/// A slot: the index of its word in the map, and its bit there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilterSlot {
    pub word: u32,
    pub bit: u64,
}

/// The slot of an endpoint among `slots` (a power of two) from word `first`: its address
/// (IPv6 folded by [`crate::fold_ipv6`]), port and protocol as the maps' keys hold them
/// (network byte order). A multiplicative hash, whose high bits mix every input bit.
#[must_use]
#[inline(always)]
pub fn filter_slot(first: u32, slots: u32, address: u32, port: u16, protocol: u8) -> FilterSlot {
    let mixed = (address ^ (u32::from(port) << 16) ^ u32::from(protocol)).wrapping_mul(0x9e37_79b1);
    let slot = (mixed >> (32 - slots.trailing_zeros())) & (slots - 1);
    FilterSlot {
        word: first + slot / 64,
        bit: 1 << (slot % 64),
    }
}
