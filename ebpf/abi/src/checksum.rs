//! Internet checksum arithmetic (RFC 1624), as the kernel's `csum_*` functions do it, for
//! the programs' rewrites: the change of a rewrite is summed once and handed to the
//! checksum helpers as a difference, and an IPv4 header checksum is fixed in the same
//! store as the addresses. Values are as they sit in the packet (read in the machine's
//! order): a ones' complement sum does not depend on the order of the bytes, as long as
//! every word is read the same way.

/// A ones' complement sum of 32-bit words (the kernel's `__wsum`).
pub type PartialSum = u32;

/// `a + b` with the carry added back in (`csum_add`).
#[must_use]
#[inline(always)]
pub fn sum_add(a: PartialSum, b: PartialSum) -> PartialSum {
    let (sum, carry) = a.overflowing_add(b);
    sum.wrapping_add(u32::from(carry))
}

/// What a sum changes by when the word `old` becomes `new` (`csum_sub(new, old)`): a 16-bit
/// field (a port) is a word with its upper half zero, as the kernel widens it.
#[must_use]
#[inline(always)]
pub fn sum_change(old: u32, new: u32) -> PartialSum {
    sum_add(!old, new)
}

/// A 16-bit checksum field after the summed words change by `change`
/// (`csum_replace_by_diff`).
#[must_use]
#[inline(always)]
pub fn checksum_after(check: u16, change: PartialSum) -> u16 {
    let sum = sum_add(change, !u32::from(check));
    let folded = (sum & 0xffff) + (sum >> 16);
    !(((folded & 0xffff) + (folded >> 16)) as u16)
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::vec::Vec;

    use super::*;

    /// The checksum of `words` computed afresh (RFC 1071).
    fn checksum(words: &[u16]) -> u16 {
        let mut sum: u32 = words.iter().map(|&word| u32::from(word)).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// An IPv4 header's words, its checksum (word 5) zero.
    fn header(source: u32, destination: u32) -> Vec<u16> {
        let mut words = std::vec![0x4500, 0x003c, 0x1c46, 0x4000, 0x4006, 0];
        words.extend([(source >> 16) as u16, source as u16]);
        words.extend([(destination >> 16) as u16, destination as u16]);
        words
    }

    #[test]
    fn an_incremental_change_gives_the_checksum_computed_afresh() {
        let rows = [
            // (source, destination) before and after
            ((0x0af4_020a, 0x0a60_0001), (0x0af4_020a, 0x0af4_010a)),
            ((0x0af4_010a, 0x0af4_020a), (0x0a60_0001, 0x0af4_020a)),
            ((0xc0a8_0001, 0xffff_ffff), (0x0000_0000, 0x0a00_0001)),
            ((0xffff_0000, 0x0000_ffff), (0x0000_ffff, 0xffff_0000)),
            ((0x0102_0304, 0x0506_0708), (0x0102_0304, 0x0506_0708)),
        ];
        for ((source, destination), (new_source, new_destination)) in rows {
            let before = checksum(&header(source, destination));
            let change = sum_add(
                sum_change(swap(source), swap(new_source)),
                sum_change(swap(destination), swap(new_destination)),
            );
            let after = checksum(&header(new_source, new_destination));
            // The words as the programs read them: in memory order, on a little-endian
            // machine.
            assert_eq!(
                checksum_after(before.swap_bytes(), change).swap_bytes(),
                after,
                "{source:x} {destination:x} -> {new_source:x} {new_destination:x}"
            );
        }
    }

    #[test]
    fn a_port_change_is_a_widened_word() {
        let (old_port, new_port) = (80u16, 8080u16);
        let words = |port: u16| std::vec![0x1234, port, 0xabcd];
        let before = checksum(&words(old_port));
        let change = sum_change(
            u32::from(old_port.swap_bytes()),
            u32::from(new_port.swap_bytes()),
        );
        assert_eq!(
            checksum_after(before.swap_bytes(), change).swap_bytes(),
            checksum(&words(new_port))
        );
    }

    /// A host-order address as a little-endian machine reads it from the packet.
    fn swap(address: u32) -> u32 {
        address.swap_bytes()
    }
}
