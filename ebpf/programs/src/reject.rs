//! Refusals and ICMP errors socklb sends itself, as kube-proxy's REJECT, a closed port or
//! a router would: a refusal (no endpoint at all, from outside or from a workload, each
//! side counting its own) is a TCP reset for a TCP segment and ICMP port unreachable for a
//! UDP datagram; "fragmentation needed" (too big for the path to a remote backend) and
//! "time exceeded" (TTL out before socklb forwards) are ICMP errors. When each is sent:
//! docs/operations.md, "Traffic from outside the node".
//!
//! The packet itself becomes the answer. An ICMP error: cut to its IP header and the
//! transport header (the whole TCP header without options, or the UDP header: at least the
//! 8 bytes an ICMP error must quote, and never shorter than what a packet whose checksum
//! the sender's device was to fill must keep), given a new IP and ICMP header in front. A
//! reset: cut to its IP header and a TCP header without options, both written anew in
//! place ([`socklb_abi::tcp_reset`]). Either is sent back out of the device it came in on.
//! Only packets without IPv4 options or IPv6 extension headers are answered (the quote is
//! then of a known size); others, and answers past [`PER_SECOND`] on one CPU (the kernel
//! limits its own ICMP errors and resets too), are dropped.
//!
//! Why a reset and not kube-proxy's ICMP port unreachable for TCP: a client must see the
//! refusal at once. Linux drops an ICMP error that arrives while the socket is locked
//! (`TcpExtLockDroppedIcmps`), and a client whose SYN reaches socklb through a veth of the
//! same kernel (a pod, a VM's tap, a test's namespace) gets it just so: the answer is made
//! and delivered in the softirq its SYN's transmit runs, while a blocking connect() still
//! holds the lock, so only the SYN sent again a second later is refused. A reset is queued
//! to the socket's backlog instead. Clients elsewhere gain too: many stacks take ICMP errors
//! to a connection as soft (RFC 5461) and send the SYN again, and firewalls on the way
//! drop ICMP more often than resets.
use core::mem::MaybeUninit;

use aya_ebpf::{
    EbpfContext,
    bindings::{__sk_buff, BPF_F_PSEUDO_HDR, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC},
    helpers,
    programs::TcContext,
};
use socklb_abi::{PROTO_TCP, PROTO_UDP, TCP_HEADER_LEN, tcp_reset};

use crate::{
    conntrack,
    counters::bump,
    deliver::TC_ACT_SHOT,
    maps::REJECT_BUDGET,
    packet::{ETH_HLEN, IPV6_HEADER_LEN, PROTO_ICMP, PROTO_ICMPV6},
    side::Side,
};

/// Answers one CPU sends in a second at most.
pub const PER_SECOND: u32 = 1000;
/// What an answer's IP header carries as its TTL or hop limit.
const TTL: u32 = 64;
/// The quoted packet's transport bytes: a TCP header without options, a UDP header.
const QUOTED_TCP: usize = 20;
const QUOTED_UDP: usize = 8;

const IPV4_HEADER_LEN: usize = 20;
const ICMP_HEADER_LEN: usize = 8;
const TCP_CHECK_OFFSET: usize = 16;
/// IPv4 with its header length field: 20 bytes, no options.
const VERSION_IHL_PLAIN: u8 = 0x45;
const ICMP_DEST_UNREACH: u32 = 3;
const ICMP_PORT_UNREACH: u32 = 3;
const ICMPV6_DEST_UNREACH: u32 = 1;
const ICMPV6_PORT_UNREACH: u32 = 4;
const ICMP_FRAG_NEEDED: u32 = 4;
const ICMPV6_PACKET_TOO_BIG: u32 = 2;
/// Code 0 of both: the TTL (hop limit) ran out in transit.
const ICMP_TIME_EXCEEDED: u32 = 11;
const ICMPV6_TIME_EXCEEDED: u32 = 3;

/// An IPv4 answer as it is written after the Ethernet header: IP header and ICMP header
/// (7 words), then the quote. Word-aligned for the checksum helper.
#[repr(C, align(4))]
struct Answer4<const QUOTE: usize> {
    headers: [u32; (IPV4_HEADER_LEN + ICMP_HEADER_LEN) / 4],
    quote: [u8; QUOTE],
}

/// [`Answer4`] for IPv6: IPv6 header and ICMPv6 header (12 words), then the quote.
#[repr(C, align(4))]
struct Answer6<const QUOTE: usize> {
    headers: [u32; (IPV6_HEADER_LEN + ICMP_HEADER_LEN) / 4],
    quote: [u8; QUOTE],
}

/// A TCP reset as it is written after the Ethernet header: the IP header (`IP` words), then
/// a TCP header without options. Word-aligned for the checksum helper.
#[repr(C, align(4))]
struct Reset<const IP: usize> {
    ip: [u32; IP],
    tcp: [u32; TCP_HEADER_LEN / 4],
}

/// The ICMP error an answer carries: its first header word (type, code, checksum left 0)
/// and its second (unused, or the path's MTU).
#[derive(Clone, Copy)]
struct IcmpError {
    kind: u32,
    rest: u32,
}

impl IcmpError {
    const PORT_UNREACHABLE: Self = Self::new(ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0);
    const PORT_UNREACHABLE6: Self = Self::new(ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH, 0);
    const TIME_EXCEEDED: Self = Self::new(ICMP_TIME_EXCEEDED, 0, 0);
    const TIME_EXCEEDED6: Self = Self::new(ICMPV6_TIME_EXCEEDED, 0, 0);

    /// A type, a code and the second word, as the header holds them (network order).
    const fn new(kind: u32, code: u32, rest: u32) -> Self {
        Self {
            kind: (kind << 24 | code << 16).to_be(),
            rest: rest.to_be(),
        }
    }

    /// "Fragmentation needed" with the next hop's MTU (the low half of the second word).
    fn fragmentation_needed(mtu: u16) -> Self {
        Self::new(ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, u32::from(mtu))
    }

    /// Packet Too Big with the path's MTU (the whole second word).
    fn packet_too_big(mtu: u16) -> Self {
        Self::new(ICMPV6_PACKET_TOO_BIG, 0, u32::from(mtu))
    }
}

/// Refuses the IPv4 packet in `ctx`, from side `S`: a TCP segment with a reset, a UDP
/// datagram with ICMP port unreachable; its verdict. Out of line, called from the
/// program's entry: its stack is not added to the TCP/UDP path's.
#[inline(never)]
pub fn refuse4<S: Side>(ctx: &TcContext) -> i32 {
    let answered = match ctx.load::<u8>(ETH_HLEN + 9) {
        Ok(PROTO_TCP) => reset4(ctx),
        Ok(PROTO_UDP) => {
            answer4::<{ IPV4_HEADER_LEN + QUOTED_UDP }>(ctx, IcmpError::PORT_UNREACHABLE)
        }
        _ => None,
    };
    refused::<S>(answered)
}

/// [`refuse4`] for IPv6.
#[inline(never)]
pub fn refuse6<S: Side>(ctx: &TcContext) -> i32 {
    let answered = match ctx.load::<u8>(ETH_HLEN + 6) {
        Ok(PROTO_TCP) => reset6(ctx),
        Ok(PROTO_UDP) => {
            answer6::<{ IPV6_HEADER_LEN + QUOTED_UDP }>(ctx, IcmpError::PORT_UNREACHABLE6)
        }
        _ => None,
    };
    refused::<S>(answered)
}

/// The verdict of a refusal (or the drop of a packet not answered), counted by its side.
#[inline(always)]
fn refused<S: Side>(answered: Option<i32>) -> i32 {
    match answered {
        Some(verdict) => {
            bump(S::refused);
            verdict
        }
        None => {
            bump(S::no_backend);
            TC_ACT_SHOT
        }
    }
}

/// Answers the IPv4 packet in `ctx`, too big for the path to its backend, with
/// "fragmentation needed" and the path's `mtu`, so that the client lowers its path MTU,
/// as a router would; its verdict.
#[inline(never)]
pub fn too_big4(ctx: &TcContext, mtu: u16) -> i32 {
    counted(
        answer_ipv4(ctx, IcmpError::fragmentation_needed(mtu)),
        TooBig,
    )
}

/// [`too_big4`] for IPv6: Packet Too Big.
#[inline(never)]
pub fn too_big6(ctx: &TcContext, mtu: u16) -> i32 {
    counted(answer_ipv6(ctx, IcmpError::packet_too_big(mtu)), TooBig)
}

/// Answers the IPv4 packet in `ctx`, whose TTL ran out before socklb could forward it, with
/// "time exceeded"; its verdict (the packet is counted as `ttl_exceeded` already).
#[inline(never)]
pub fn expired4(ctx: &TcContext) -> i32 {
    counted(answer_ipv4(ctx, IcmpError::TIME_EXCEEDED), Expired)
}

/// [`expired4`] for IPv6.
#[inline(never)]
pub fn expired6(ctx: &TcContext) -> i32 {
    counted(answer_ipv6(ctx, IcmpError::TIME_EXCEEDED6), Expired)
}

/// Why a packet from outside is answered, for the counters.
#[derive(Clone, Copy)]
enum Why {
    TooBig,
    Expired,
}
use Why::{Expired, TooBig};

/// The verdict of an answer (or the drop of a packet not answered), counted.
#[inline(always)]
fn counted(answered: Option<i32>, why: Why) -> i32 {
    match (answered, why) {
        (Some(verdict), TooBig) => {
            bump(|c| &mut c.too_big_answered);
            verdict
        }
        (None, TooBig) => {
            bump(|c| &mut c.too_big_dropped);
            TC_ACT_SHOT
        }
        (Some(verdict), Expired) => verdict,
        (None, Expired) => TC_ACT_SHOT,
    }
}

#[inline(always)]
fn answer_ipv4(ctx: &TcContext, error: IcmpError) -> Option<i32> {
    match ctx.load::<u8>(ETH_HLEN + 9).ok()? {
        PROTO_TCP => answer4::<{ IPV4_HEADER_LEN + QUOTED_TCP }>(ctx, error),
        PROTO_UDP => answer4::<{ IPV4_HEADER_LEN + QUOTED_UDP }>(ctx, error),
        _ => None,
    }
}

/// Only a transport header right after the IPv6 header is answered.
#[inline(always)]
fn answer_ipv6(ctx: &TcContext, error: IcmpError) -> Option<i32> {
    match ctx.load::<u8>(ETH_HLEN + 6).ok()? {
        PROTO_TCP => answer6::<{ IPV6_HEADER_LEN + QUOTED_TCP }>(ctx, error),
        PROTO_UDP => answer6::<{ IPV6_HEADER_LEN + QUOTED_UDP }>(ctx, error),
        _ => None,
    }
}

#[inline(always)]
fn answer4<const QUOTE: usize>(ctx: &TcContext, error: IcmpError) -> Option<i32> {
    if ctx.load::<u8>(ETH_HLEN).ok()? != VERSION_IHL_PLAIN || !within_budget() {
        return None;
    }
    let source: u32 = ctx.load(ETH_HLEN + 12).ok()?;
    let destination: u32 = ctx.load(ETH_HLEN + 16).ok()?;
    let mut answer = MaybeUninit::<Answer4<QUOTE>>::uninit();
    let answer = answer.as_mut_ptr();
    // SAFETY: every field of the answer is written below before it is read: the quote by
    // the load, each header word by its own store.
    let answer = unsafe {
        load_quote(ctx, &mut (*answer).quote)?;
        let total = (IPV4_HEADER_LEN + ICMP_HEADER_LEN + QUOTE) as u32;
        let headers = &mut (*answer).headers;
        headers[0] = (u32::from(VERSION_IHL_PLAIN) << 24 | total).to_be();
        headers[1] = 0;
        headers[2] = (TTL << 24 | u32::from(PROTO_ICMP) << 16).to_be();
        headers[3] = destination;
        headers[4] = source;
        headers[5] = error.kind;
        headers[6] = error.rest;
        &mut *answer
    };
    let base = core::ptr::from_mut(answer).cast::<u32>();
    answer.headers[2] |= u32::from(fold(csum(base, IPV4_HEADER_LEN, 0)?)) << 16;
    // SAFETY: the ICMP header starts at word 5; it and the quote are contiguous in the
    // repr(C) struct.
    let icmp = unsafe { base.add(IPV4_HEADER_LEN / 4) };
    answer.headers[5] |= u32::from(fold(csum(icmp, ICMP_HEADER_LEN + QUOTE, 0)?)) << 16;
    become_answer(ctx, answer, QUOTE)?;
    Some(send_back(ctx))
}

#[inline(always)]
fn answer6<const QUOTE: usize>(ctx: &TcContext, error: IcmpError) -> Option<i32> {
    if !within_budget() {
        return None;
    }
    let source: [u32; 4] = ctx.load(ETH_HLEN + 8).ok()?;
    let destination: [u32; 4] = ctx.load(ETH_HLEN + 24).ok()?;
    let payload = (ICMP_HEADER_LEN + QUOTE) as u32;
    let mut answer = MaybeUninit::<Answer6<QUOTE>>::uninit();
    let answer = answer.as_mut_ptr();
    // SAFETY: as in answer4.
    let answer = unsafe {
        load_quote(ctx, &mut (*answer).quote)?;
        let headers = &mut (*answer).headers;
        headers[0] = (6u32 << 28).to_be();
        headers[1] = (payload << 16 | u32::from(PROTO_ICMPV6) << 8 | TTL).to_be();
        headers[2] = destination[0];
        headers[3] = destination[1];
        headers[4] = destination[2];
        headers[5] = destination[3];
        headers[6] = source[0];
        headers[7] = source[1];
        headers[8] = source[2];
        headers[9] = source[3];
        headers[10] = error.kind;
        headers[11] = error.rest;
        &mut *answer
    };
    // The ICMPv6 checksum covers a pseudo-header: both addresses, the length and the
    // next header, then the message.
    let base = core::ptr::from_mut(answer).cast::<u32>();
    let mut tail = [payload.to_be(), u32::from(PROTO_ICMPV6).to_be()];
    // SAFETY: the addresses are words 2 to 9 and the ICMPv6 message starts at word 10,
    // contiguous with the quote in the repr(C) struct.
    let (addresses, icmp) = unsafe { (base.add(2), base.add(IPV6_HEADER_LEN / 4)) };
    let sum = csum(addresses, 32, 0)?;
    let sum = csum(tail.as_mut_ptr(), 8, sum)?;
    let sum = csum(icmp, ICMP_HEADER_LEN + QUOTE, sum)?;
    answer.headers[10] |= u32::from(fold(sum)) << 16;
    become_answer(ctx, answer, QUOTE)?;
    Some(send_back(ctx))
}

/// The reset that answers the IPv4 TCP segment in `ctx`, sent.
#[inline(always)]
fn reset4(ctx: &TcContext) -> Option<i32> {
    if ctx.load::<u8>(ETH_HLEN).ok()? != VERSION_IHL_PLAIN {
        return None;
    }
    let total = u32::from(u16::from_be(ctx.load(ETH_HLEN + 2).ok()?));
    let segment: [u32; 5] = ctx.load(ETH_HLEN + IPV4_HEADER_LEN).ok()?;
    let tcp = tcp_reset(segment, total.checked_sub(IPV4_HEADER_LEN as u32)?)?;
    if !within_budget() {
        return None;
    }
    let source: u32 = ctx.load(ETH_HLEN + 12).ok()?;
    let destination: u32 = ctx.load(ETH_HLEN + 16).ok()?;
    let total = (IPV4_HEADER_LEN + TCP_HEADER_LEN) as u32;
    let mut reset = Reset {
        ip: [
            (u32::from(VERSION_IHL_PLAIN) << 24 | total).to_be(),
            0,
            (TTL << 24 | u32::from(PROTO_TCP) << 16).to_be(),
            destination,
            source,
        ],
        tcp,
    };
    reset.ip[2] |= u32::from(fold(csum(reset.ip.as_mut_ptr(), IPV4_HEADER_LEN, 0)?)) << 16;
    // The pseudo-header: both addresses, the protocol and the TCP length.
    let mut pseudo = [
        destination,
        source,
        (u32::from(PROTO_TCP) << 16 | TCP_HEADER_LEN as u32).to_be(),
    ];
    let pseudo = csum(pseudo.as_mut_ptr(), 12, 0)?;
    send_reset(ctx, &mut reset, pseudo)
}

/// [`reset4`] for IPv6: only a TCP header right after the IPv6 header is answered.
#[inline(always)]
fn reset6(ctx: &TcContext) -> Option<i32> {
    let payload = u32::from(u16::from_be(ctx.load(ETH_HLEN + 4).ok()?));
    let segment: [u32; 5] = ctx.load(ETH_HLEN + IPV6_HEADER_LEN).ok()?;
    let tcp = tcp_reset(segment, payload)?;
    if !within_budget() {
        return None;
    }
    let source: [u32; 4] = ctx.load(ETH_HLEN + 8).ok()?;
    let destination: [u32; 4] = ctx.load(ETH_HLEN + 24).ok()?;
    let length = TCP_HEADER_LEN as u32;
    let mut reset = Reset {
        ip: [
            (6u32 << 28).to_be(),
            (length << 16 | u32::from(PROTO_TCP) << 8 | TTL).to_be(),
            destination[0],
            destination[1],
            destination[2],
            destination[3],
            source[0],
            source[1],
            source[2],
            source[3],
        ],
        tcp,
    };
    // The pseudo-header: both addresses (words 2 to 9), the TCP length and the next header.
    let mut tail = [length.to_be(), u32::from(PROTO_TCP).to_be()];
    // SAFETY: words 2 to 9 of the 10-word IPv6 header.
    let addresses = unsafe { reset.ip.as_mut_ptr().add(2) };
    let pseudo = csum(addresses, 32, 0)?;
    let pseudo = csum(tail.as_mut_ptr(), 8, pseudo)?;
    send_reset(ctx, &mut reset, pseudo)
}

/// Turns the packet into `reset`, its TCP checksum filled in from `pseudo` (the sum of the
/// pseudo-header), and sends it back. The checksum helper fills it in as the packet's
/// `ip_summed` state wants: whole, or, for a packet whose sender's device was to fill it
/// (CHECKSUM_PARTIAL: a local socket's, behind a veth), the pseudo-header's sum alone, the
/// rest left to that device (or to the kernel) as for the SYN. The TCP header stays where
/// the SYN's was, where the packet's checksum start and offset still point.
#[inline(always)]
fn send_reset<const IP: usize>(ctx: &TcContext, reset: &mut Reset<IP>, pseudo: u32) -> Option<i32> {
    let header = csum(reset.tcp.as_mut_ptr(), TCP_HEADER_LEN, 0)?;
    become_answer(ctx, reset, core::mem::size_of::<Reset<IP>>())?;
    // Written as 0: the first call makes it the pseudo-header's checksum (or its sum, for a
    // partial checksum), the second adds the header's (or, partial, leaves it).
    let check = ETH_HLEN + IP * 4 + TCP_CHECK_OFFSET;
    ctx.l4_csum_replace(check, 0, u64::from(pseudo), u64::from(BPF_F_PSEUDO_HDR))
        .ok()?;
    ctx.l4_csum_replace(check, 0, u64::from(header), 0).ok()?;
    Some(send_back(ctx))
}

/// Turns the packet into `answer`: its headers, then the `quote` bytes it was read from
/// (all of it, for a reset), Ethernet addresses swapped.
#[inline(always)]
fn become_answer<T>(ctx: &TcContext, answer: &T, quote: usize) -> Option<()> {
    let macs: [u8; 12] = ctx.load(0).ok()?;
    // Cut to the quote, then make room for the new headers in front of it.
    ctx.change_tail((ETH_HLEN + quote) as u32, 0).ok()?;
    let room = core::mem::size_of::<T>() - quote;
    if room != 0 {
        ctx.adjust_room(room as i32, BPF_ADJ_ROOM_MAC, 0).ok()?;
    }
    ctx.store(ETH_HLEN, answer, 0).ok()?;
    let swapped = [
        macs[6], macs[7], macs[8], macs[9], macs[10], macs[11], macs[0], macs[1], macs[2], macs[3],
        macs[4], macs[5],
    ];
    ctx.store(0, &swapped, 0).ok()?;
    Some(())
}

/// Sends the packet back out of the device it came in on; the verdict.
#[inline(always)]
fn send_back(ctx: &TcContext) -> i32 {
    // SAFETY: the context is the valid __sk_buff of this run.
    let ifindex = unsafe { (*ctx.as_ptr().cast::<__sk_buff>()).ingress_ifindex };
    // SAFETY: plain helper call without pointers.
    unsafe { helpers::bpf_redirect(ifindex, 0) as i32 }
}

/// Reads the quote: the `N` bytes after the Ethernet header (a constant length: aya's
/// `load_bytes` clamps it to the packet, a length the verifier cannot bound away from 0).
#[inline(always)]
fn load_quote<const N: usize>(ctx: &TcContext, quote: &mut [u8; N]) -> Option<()> {
    // SAFETY: `quote` is N writable bytes.
    let rc = unsafe {
        helpers::bpf_skb_load_bytes(
            ctx.as_ptr(),
            ETH_HLEN as u32,
            quote.as_mut_ptr().cast(),
            N as u32,
        )
    };
    (rc == 0).then_some(())
}

/// The ones' complement sum of `len` bytes (a multiple of 4) at `words`, added to `seed`.
#[inline(always)]
fn csum(words: *mut u32, len: usize, seed: u32) -> Option<u32> {
    // SAFETY: `words` points to `len` readable bytes of this program's stack.
    let sum = unsafe { helpers::bpf_csum_diff(core::ptr::null_mut(), 0, words, len as u32, seed) };
    u32::try_from(sum).ok()
}

/// A 32-bit ones' complement sum folded to the 16-bit checksum, in the byte order of the
/// words it was summed from (so it is stored as it is).
#[inline(always)]
fn fold(sum: u32) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// Whether this CPU may send another answer in the current second (and counts it).
#[inline(always)]
fn within_budget() -> bool {
    let Some(budget) = REJECT_BUDGET.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's entry, valid for this run; no other program run on this CPU
    // interleaves with this one.
    let budget = unsafe { &mut *budget };
    let now = conntrack::now_s();
    if budget.second != now {
        budget.second = now;
        budget.sent = 0;
    }
    if budget.sent >= PER_SECOND {
        return false;
    }
    budget.sent += 1;
    true
}
