//! The TCP reset that answers a segment to a port nothing listens on (RFC 9293, 3.10.7.1,
//! "If the connection does not exist"), as the kernel's `tcp_v4_send_reset` makes it: the
//! programs refuse a TCP client of a Service without endpoints with it. Pure, so that the
//! rule is tested here; the programs write the header it gives and fill in the checksum.

/// The length of a TCP header without options, the only one a reset carries.
pub const TCP_HEADER_LEN: usize = 20;
/// TCP flags (byte 13 of the header).
pub const TCP_FLAG_FIN: u8 = 0x01;
pub const TCP_FLAG_SYN: u8 = 0x02;
pub const TCP_FLAG_RST: u8 = 0x04;
pub const TCP_FLAG_ACK: u8 = 0x10;

/// The header of the reset that answers `segment` (its first [`TCP_HEADER_LEN`] bytes, as
/// five words in packet order read in the machine's order), whose IP payload (TCP header,
/// options and data) is `length` bytes; in the same form, checksum zero. Ports swapped; a
/// segment with ACK gets its acknowledgment number as the sequence number and RST alone,
/// any other sequence number 0 and RST|ACK acknowledging all it occupied (its data, a SYN,
/// a FIN), so the client takes it as the answer to what it sent. `None` for a reset (never
/// answered) or a header whose data offset does not fit `length`.
#[must_use]
#[inline(always)]
pub fn tcp_reset(segment: [u32; 5], length: u32) -> Option<[u32; 5]> {
    let control = u32::from_be(segment[3]);
    let flags = (control >> 16) as u8;
    let header = (control >> 28) * 4;
    if flags & TCP_FLAG_RST != 0 || header < TCP_HEADER_LEN as u32 || length < header {
        return None;
    }
    let (sequence, acknowledged, flags) = if flags & TCP_FLAG_ACK != 0 {
        (u32::from_be(segment[2]), 0, TCP_FLAG_RST)
    } else {
        let occupied = (length - header)
            + u32::from(flags & TCP_FLAG_SYN != 0)
            + u32::from(flags & TCP_FLAG_FIN != 0);
        let acknowledged = u32::from_be(segment[1]).wrapping_add(occupied);
        (0, acknowledged, TCP_FLAG_RST | TCP_FLAG_ACK)
    };
    let header_words = (TCP_HEADER_LEN / 4) as u32;
    Some([
        // Source and destination port swapped, in whichever order the machine reads them.
        segment[0].rotate_left(16),
        sequence.to_be(),
        acknowledged.to_be(),
        (header_words << 28 | u32::from(flags) << 16).to_be(),
        0,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP header's five words as the programs read them, from host-order fields.
    fn header(ports: (u16, u16), sequence: u32, ack: u32, offset: u32, flags: u8) -> [u32; 5] {
        let mut bytes = [0u8; 20];
        bytes[0..2].copy_from_slice(&ports.0.to_be_bytes());
        bytes[2..4].copy_from_slice(&ports.1.to_be_bytes());
        bytes[4..8].copy_from_slice(&sequence.to_be_bytes());
        bytes[8..12].copy_from_slice(&ack.to_be_bytes());
        bytes[12] = (offset / 4) as u8 * 16;
        bytes[13] = flags;
        bytes[14..16].copy_from_slice(&64240u16.to_be_bytes());
        bytes[16..18].copy_from_slice(&0xbeefu16.to_be_bytes());
        let word = |i: usize| {
            u32::from_ne_bytes([
                bytes[i * 4],
                bytes[i * 4 + 1],
                bytes[i * 4 + 2],
                bytes[i * 4 + 3],
            ])
        };
        [word(0), word(1), word(2), word(3), word(4)]
    }

    /// A case: its name, the segment's flags, sequence, ack and data offset, its IP payload
    /// length, and the reset's sequence, acknowledgment and flags, or None.
    type Row = (&'static str, u8, u32, u32, u32, u32, Option<(u32, u32, u8)>);

    #[test]
    fn a_reset_answers_what_the_segment_occupied() {
        const SYN: u8 = TCP_FLAG_SYN;
        const ACK: u8 = TCP_FLAG_ACK;
        const RST: u8 = TCP_FLAG_RST;
        const FIN: u8 = TCP_FLAG_FIN;
        const PSH: u8 = 0x08;
        let rows: [Row; 9] = [
            (
                "a SYN with options",
                SYN,
                1000,
                0,
                40,
                40,
                Some((0, 1001, RST | ACK)),
            ),
            (
                "a SYN without options",
                SYN,
                7,
                0,
                20,
                20,
                Some((0, 8, RST | ACK)),
            ),
            (
                "a SYN with data (fast open)",
                SYN,
                1000,
                0,
                40,
                140,
                Some((0, 1101, RST | ACK)),
            ),
            (
                "a SYN whose seq wraps",
                SYN,
                u32::MAX,
                0,
                20,
                20,
                Some((0, 0, RST | ACK)),
            ),
            ("a stray ACK", ACK, 5, 900, 32, 32, Some((900, 0, RST))),
            (
                "data with ACK",
                ACK | PSH,
                5,
                900,
                20,
                120,
                Some((900, 0, RST)),
            ),
            (
                "a FIN without ACK",
                FIN,
                50,
                0,
                20,
                30,
                Some((0, 61, RST | ACK)),
            ),
            ("a reset is never answered", RST | ACK, 5, 900, 20, 20, None),
            ("a data offset past the payload", SYN, 5, 0, 40, 20, None),
        ];
        for (case, flags, sequence, ack, offset, length, expected) in rows {
            let segment = header((40123, 80), sequence, ack, offset, flags);
            let reset = tcp_reset(segment, length);
            let expected = expected.map(|(sequence, ack, flags)| {
                let mut reset = header((80, 40123), sequence, ack, 20, flags);
                // Window, checksum and urgent pointer zero.
                reset[3] &= u32::from_be(0xffff_0000);
                reset[4] = 0;
                reset
            });
            assert_eq!(reset, expected, "{case}");
        }
        let short = header((1, 2), 3, 0, 16, SYN);
        assert_eq!(tcp_reset(short, 20), None, "a data offset under 5 words");
    }
}
