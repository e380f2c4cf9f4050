//! A TCP or UDP packet in a TC program, IPv4 or IPv6: its addresses and ports, and rewrites
//! of them that keep the checksums right (IPv4's header checksum; the L4 checksum, whose
//! pseudo-header holds the addresses of either family).
//!
//! Writes go through `bpf_skb_store_bytes` and the checksum helpers, which handle every
//! `ip_summed` state (a packet from a local veth often carries only a partial checksum) and
//! a cloned packet. Reads too, except for the usual IPv4 TCP/UDP packet (no IP options, not
//! a fragment, its headers in the linear part): its headers are read in place at constant
//! offsets, one bounds check instead of five helper calls (about 90 ns of a no-match run of
//! about 400 ns, measured with `bpftool prog run`), and anything else falls back to
//! `bpf_skb_load_bytes`.
use aya_ebpf::{
    EbpfContext,
    bindings::{__sk_buff, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, BPF_F_RECOMPUTE_CSUM},
    helpers,
    programs::TcContext,
};
use socklb_abi::{
    FragmentKey, FragmentKey6, FragmentPorts, Ipv6Words, PROTO_TCP, PROTO_UDP,
    TCP_FLAG_ACK as TCP_ACK, TCP_FLAG_FIN as TCP_FIN, TCP_FLAG_RST as TCP_RST,
    TCP_FLAG_SYN as TCP_SYN, checksum_after, ipv6_octets, sum_add, sum_change,
};

use crate::{
    counters::bump,
    log,
    maps::{FRAGMENTS, FRAGMENTS6},
};

pub const ETH_HLEN: usize = 14;
/// EtherTypes, host order.
pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
const IP_TTL_OFFSET: usize = ETH_HLEN + 8;
const IP_CHECK_OFFSET: usize = ETH_HLEN + 10;
/// The IPv4 flags and fragment offset, and its "don't fragment" bit.
const IP_FRAGMENT_OFFSET: usize = ETH_HLEN + 6;
const IP_DONT_FRAGMENT: u16 = 0x4000;
const IP_SOURCE_OFFSET: usize = ETH_HLEN + 12;
const IP_DESTINATION_OFFSET: usize = ETH_HLEN + 16;
/// More-fragments flag and fragment offset, in the host-order `frag_off`.
pub const IP_FRAGMENT_MASK: u16 = 0x3fff;
/// Fragment offset alone.
pub const IP_OFFSET_MASK: u16 = 0x1fff;
const IPV6_HOP_LIMIT_OFFSET: usize = ETH_HLEN + 7;
const IPV6_SOURCE_OFFSET: usize = ETH_HLEN + 8;
const IPV6_DESTINATION_OFFSET: usize = ETH_HLEN + 24;
pub const IPV6_HEADER_LEN: usize = 40;
/// IPv6 extension headers socklb walks (next-header values).
const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_DESTINATION_OPTIONS: u8 = 60;
/// Extension headers walked before a packet is given up (passed untranslated, counted):
/// a bounded loop, and more than real traffic to a Service carries.
const IPV6_MAX_EXTENSION_HEADERS: usize = 4;
/// Fragment offset (high 13 bits) and more-fragments flag (bit 0) of an IPv6 Fragment
/// header's host-order `offset_flags`.
const IPV6_OFFSET_MASK: u16 = 0xfff8;
const IPV6_MORE_FRAGMENTS: u16 = 0x0001;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_ICMPV6: u8 = 58;
const TCP_CHECK_OFFSET: usize = 16;
const TCP_FLAGS_OFFSET: usize = 13;
const TCP_SEQUENCE_OFFSET: usize = 4;
/// The TCP header's length in words, in the high four bits.
const TCP_DATA_OFFSET: usize = 12;
const UDP_HEADER_LEN: usize = 8;
const UDP_CHECK_OFFSET: usize = 6;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv4Header {
    pub version_ihl: u8,
    pub tos: u8,
    pub total_length: u16,
    pub id: u16,
    pub fragment: u16,
    pub ttl: u8,
    pub protocol: u8,
    pub check: u16,
    pub source: u32,
    pub destination: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Ipv6Header {
    pub version_class_flow: u32,
    pub payload_length: u16,
    pub next_header: u8,
    pub hop_limit: u8,
    pub source: Ipv6Words,
    pub destination: Ipv6Words,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Ipv6FragmentHeader {
    next_header: u8,
    reserved: u8,
    offset_flags: u16,
    id: u32,
}

/// Packet access failed (truncated packet, helper error): let it pass untranslated.
pub struct PacketError;

/// The L4 checksum an address rewrite must fix: its offset and checksum-helper flags, if the
/// packet carries it. Every field always written (not an `Option`, whose unused payload
/// LLVM may still load from stack never written, which the verifier refuses).
#[derive(Clone, Copy)]
pub struct L4Sum {
    pub present: bool,
    pub offset: usize,
    pub flags: u64,
}

/// An IP address as a packet carries it (network byte order): where it sits in the header
/// and how rewriting it keeps the checksums right.
pub trait Address: Copy + PartialEq {
    const SOURCE_OFFSET: usize;
    const DESTINATION_OFFSET: usize;
    /// The same offsets within the IP header (where an ICMP error quotes one).
    const HEADER_SOURCE: usize = Self::SOURCE_OFFSET - ETH_HLEN;
    const HEADER_DESTINATION: usize = Self::DESTINATION_OFFSET - ETH_HLEN;

    /// Writes `new` over `old` at `offset`, in the IP header an ICMP error quotes (at
    /// `quoted`): IPv4 fixes the quoted header's checksum, whose change cancels the
    /// address's in the ICMP checksum; IPv6 fixes the ICMPv6 checksum (at `icmp_check`).
    fn store_quoted(
        ctx: &TcContext,
        offset: usize,
        old: Self,
        new: Self,
        quoted: usize,
        icmp_check: usize,
    ) -> Result<(), PacketError>;

    /// Writes `new` over `old` at `offset`, fixing the IP header checksum (IPv4) and, with
    /// `l4` (the L4 checksum's offset and flags), the L4 pseudo-header sum.
    fn store(
        ctx: &TcContext,
        offset: usize,
        old: Self,
        new: Self,
        l4: L4Sum,
    ) -> Result<(), PacketError>;

    /// Rewrites `packet` to `to` in one store when its headers allow it (IPv4 without
    /// options: the header checksum, addresses and ports are contiguous), fixing the L4
    /// checksum by one difference for the addresses and one for the ports: three helper
    /// calls where field by field takes five. `false`: the caller rewrites field by field.
    fn rewrite_at_once(packet: &mut Packet<Self>, to: &Tuple<Self>) -> Result<bool, PacketError>;

    /// Writes the TTL (IPv4, with its checksum) or hop limit (IPv6) one lower than
    /// `current`.
    fn decrement_hop_limit(ctx: &TcContext, current: u8, protocol: u8) -> Result<(), PacketError>;

    /// Whether the packet in `ctx` must not be fragmented: IPv4 with "don't fragment", and
    /// every IPv6 packet (routers never fragment).
    fn may_not_fragment(ctx: &TcContext) -> bool;

    /// Logs a packet from `self` dropped after a partial rewrite.
    fn log_rewrite_failed(self);

    /// The address in one word, for the flow filter (socklb-abi `flow_filter_slot`).
    fn folded(&self) -> u32;
}

impl Address for u32 {
    #[inline(always)]
    fn folded(&self) -> u32 {
        *self
    }

    const SOURCE_OFFSET: usize = IP_SOURCE_OFFSET;
    const DESTINATION_OFFSET: usize = IP_DESTINATION_OFFSET;

    #[inline(always)]
    fn rewrite_at_once(packet: &mut Packet<Self>, to: &Tuple<Self>) -> Result<bool, PacketError> {
        if !packet.has_l4 || packet.l4_offset != IPV4_PLAIN_L4 {
            return Ok(false);
        }
        let from = &packet.tuple;
        if from.source == to.source
            && from.destination == to.destination
            && from.source_port == to.source_port
            && from.destination_port == to.destination_port
        {
            return Ok(true);
        }
        let ctx = packet.ctx;
        let Some(check) = read_direct::<u16, IP_CHECK_OFFSET>(ctx) else {
            return Ok(false);
        };
        let addresses = sum_add(
            sum_change(from.source, to.source),
            sum_change(from.destination, to.destination),
        );
        let ports = sum_add(
            sum_change(u32::from(from.source_port), u32::from(to.source_port)),
            sum_change(
                u32::from(from.destination_port),
                u32::from(to.destination_port),
            ),
        );
        // The words from the header checksum to the destination port, in packet order (an
        // address's first two bytes are its low half: the programs are built for bpfel).
        let words: [u16; 7] = [
            checksum_after(check, addresses),
            to.source as u16,
            (to.source >> 16) as u16,
            to.destination as u16,
            (to.destination >> 16) as u16,
            to.source_port,
            to.destination_port,
        ];
        // By the store helper, not by direct packet access: a program that writes the packet
        // directly is made to unclone every cloned packet at its start (a TCP sender's,
        // which it keeps for retransmission), passed ones included.
        ctx.store(IP_CHECK_OFFSET, &words, 0)
            .map_err(|_| PacketError)?;
        // Size 0: `to` is a difference. Only the addresses are in the pseudo-header,
        // which a partial checksum (a local veth's) holds alone.
        let flags = packet.l4_flags();
        if from.source != to.source || from.destination != to.destination {
            ctx.l4_csum_replace(
                packet.l4_check_offset,
                0,
                u64::from(addresses),
                u64::from(BPF_F_PSEUDO_HDR) | flags,
            )
            .map_err(|_| PacketError)?;
        }
        if from.source_port != to.source_port || from.destination_port != to.destination_port {
            ctx.l4_csum_replace(packet.l4_check_offset, 0, u64::from(ports), flags)
                .map_err(|_| PacketError)?;
        }
        packet.tuple.source = to.source;
        packet.tuple.destination = to.destination;
        packet.tuple.source_port = to.source_port;
        packet.tuple.destination_port = to.destination_port;
        Ok(true)
    }

    #[inline(always)]
    fn store(
        ctx: &TcContext,
        offset: usize,
        old: Self,
        new: Self,
        l4: L4Sum,
    ) -> Result<(), PacketError> {
        ctx.store(offset, &new, 0).map_err(|_| PacketError)?;
        ctx.l3_csum_replace(IP_CHECK_OFFSET, u64::from(old), u64::from(new), 4)
            .map_err(|_| PacketError)?;
        if !l4.present {
            return Ok(());
        }
        ctx.l4_csum_replace(
            l4.offset,
            u64::from(old),
            u64::from(new),
            u64::from(BPF_F_PSEUDO_HDR) | l4.flags | 4,
        )
        .map_err(|_| PacketError)
    }

    #[inline(always)]
    fn store_quoted(
        ctx: &TcContext,
        offset: usize,
        old: Self,
        new: Self,
        quoted: usize,
        _icmp_check: usize,
    ) -> Result<(), PacketError> {
        ctx.store(offset, &new, 0).map_err(|_| PacketError)?;
        ctx.l3_csum_replace(
            quoted + IP_CHECK_OFFSET - ETH_HLEN,
            u64::from(old),
            u64::from(new),
            4,
        )
        .map_err(|_| PacketError)
    }

    #[inline(always)]
    fn may_not_fragment(ctx: &TcContext) -> bool {
        ctx.load::<u16>(IP_FRAGMENT_OFFSET)
            .is_ok_and(|field| u16::from_be(field) & IP_DONT_FRAGMENT != 0)
    }

    #[inline(always)]
    fn decrement_hop_limit(ctx: &TcContext, current: u8, protocol: u8) -> Result<(), PacketError> {
        let new_ttl = current.wrapping_sub(1);
        // The checksum covers TTL as the high byte of a 16-bit word with the protocol.
        let old_word = u16::from_be_bytes([current, protocol]);
        let new_word = u16::from_be_bytes([new_ttl, protocol]);
        ctx.store(IP_TTL_OFFSET, &new_ttl, 0)
            .map_err(|_| PacketError)?;
        ctx.l3_csum_replace(
            IP_CHECK_OFFSET,
            u64::from(old_word.to_be()),
            u64::from(new_word.to_be()),
            2,
        )
        .map_err(|_| PacketError)
    }

    #[inline(always)]
    fn log_rewrite_failed(self) {
        log::rewrite_failed(u32::from_be(self));
    }
}

impl Address for Ipv6Words {
    #[inline(always)]
    fn folded(&self) -> u32 {
        socklb_abi::fold_ipv6(self)
    }

    const SOURCE_OFFSET: usize = IPV6_SOURCE_OFFSET;
    const DESTINATION_OFFSET: usize = IPV6_DESTINATION_OFFSET;

    /// Field by field: the addresses take most of the header, and IPv6 has no header
    /// checksum to fold into the store.
    #[inline(always)]
    fn rewrite_at_once(_packet: &mut Packet<Self>, _to: &Tuple<Self>) -> Result<bool, PacketError> {
        Ok(false)
    }

    /// IPv6 has no header checksum; the pseudo-header sum changes by the four words'
    /// difference, in one helper call.
    ///
    /// A full sum a NIC gave (`skb->csum` under `CHECKSUM_COMPLETE`) stays right. The new
    /// address moves the packet's sum by the difference and the L4 checksum takes it back,
    /// but the pseudo-header helper takes it off `skb->csum` all the same (right for IPv4,
    /// whose header checksum cancels the address; `BPF_F_IPV6` skips that from kernel 6.16
    /// only), so it is added back; without an L4 header nothing takes it back, and adding
    /// it is right too. Left wrong, every such packet is checksummed again in software and
    /// the kernel logs "hw csum failure".
    #[inline(always)]
    fn store(
        ctx: &TcContext,
        offset: usize,
        old: Self,
        new: Self,
        l4: L4Sum,
    ) -> Result<(), PacketError> {
        ctx.store(offset, &new, 0).map_err(|_| PacketError)?;
        let mut change = 0;
        for i in 0..4 {
            change = sum_add(change, sum_change(old[i], new[i]));
        }
        if l4.present {
            // Size 0: `change` is a difference.
            ctx.l4_csum_replace(
                l4.offset,
                0,
                u64::from(change),
                u64::from(BPF_F_PSEUDO_HDR) | l4.flags,
            )
            .map_err(|_| PacketError)?;
        }
        // SAFETY: the program's own packet; the helper changes only a full sum.
        unsafe { helpers::bpf_csum_update(ctx.as_ptr().cast(), change) };
        Ok(())
    }

    #[inline(always)]
    fn store_quoted(
        ctx: &TcContext,
        offset: usize,
        old: Self,
        new: Self,
        _quoted: usize,
        icmp_check: usize,
    ) -> Result<(), PacketError> {
        ctx.store(offset, &new, 0).map_err(|_| PacketError)?;
        for i in 0..4 {
            if old[i] != new[i] {
                ctx.l4_csum_replace(icmp_check, u64::from(old[i]), u64::from(new[i]), 4)
                    .map_err(|_| PacketError)?;
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn may_not_fragment(_ctx: &TcContext) -> bool {
        true
    }

    #[inline(always)]
    fn decrement_hop_limit(ctx: &TcContext, current: u8, _protocol: u8) -> Result<(), PacketError> {
        // No header checksum to cancel the change: a full sum (`CHECKSUM_COMPLETE`) follows it.
        ctx.store(
            IPV6_HOP_LIMIT_OFFSET,
            &current.wrapping_sub(1),
            u64::from(BPF_F_RECOMPUTE_CSUM),
        )
        .map_err(|_| PacketError)
    }

    #[inline(always)]
    fn log_rewrite_failed(self) {
        log::rewrite_failed(ipv6_octets(self));
    }
}

/// What a TCP packet says about the end of its connection (`None` for UDP).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Ending {
    None,
    /// FIN: this direction is done sending; the other may go on (a half-close).
    Fin,
    /// RST: the connection is over.
    Reset,
}

/// What a packet tells its flow's conntrack entry: whether it ends a TCP connection, and
/// where its TCP sequence number is (so that a RST far from it can be told from a real
/// one).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub ending: Ending,
    /// A TCP segment (with its header): `sequence_high` is meaningful.
    pub tcp: bool,
    /// The high 16 bits of the sequence number: a RST is checked at that grain.
    pub sequence_high: u16,
}

/// A packet's flow identity as it arrives; addresses and ports in network byte order.
#[derive(Clone, Copy)]
pub struct Tuple<A> {
    pub source: A,
    pub destination: A,
    pub source_port: u16,
    pub destination_port: u16,
    pub protocol: u8,
    /// Zeroed, so that every byte of a tuple is written: the SNAT port search, a global
    /// function (`nat`), reads the tuple whole, and without CAP_PERFMON the verifier
    /// refuses a read of stack bytes never written.
    #[expect(
        dead_code,
        reason = "written for the verifier's sake, read as part of the whole"
    )]
    pub pad: u8,
    #[expect(
        dead_code,
        reason = "written for the verifier's sake, read as part of the whole"
    )]
    pub pad16: u16,
}

const _: () = assert!(size_of::<Tuple<u32>>() == 16);
const _: () = assert!(size_of::<Tuple<Ipv6Words>>() == 40);

/// A parsed TCP/UDP packet on an Ethernet device, of the family whose addresses are `A`.
pub struct Packet<'a, A> {
    ctx: &'a TcContext,
    pub tuple: Tuple<A>,
    /// TCP flags; 0 for UDP.
    tcp_flags: u8,
    /// The IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    l4_offset: usize,
    l4_check_offset: usize,
    /// A store into the packet was attempted: from then on, a failure must drop the packet
    /// rather than let a half-rewritten one through.
    mangled: bool,
    /// The packet carries the L4 header (not a fragment after the first): ports and the L4
    /// checksum are in it.
    has_l4: bool,
    /// The L4 checksum covers the addresses (a pseudo-header): TCP, UDP and ICMPv6, not
    /// ICMPv4, and not a fragment after the first.
    pseudo_sum: bool,
}

/// The EtherType of the frame (host order).
#[inline(always)]
pub fn ether_type(ctx: &TcContext) -> Option<u16> {
    if let Some(ether_type) = read_direct::<u16, 12>(ctx) {
        return Some(u16::from_be(ether_type));
    }
    ctx.load::<u16>(12).ok().map(u16::from_be)
}

/// A value at the constant `OFFSET` of the packet, read in place if the linear part of the
/// packet holds it (the usual case: headers a local stack or a veth wrote), without a
/// helper call; `None` sends the caller to `bpf_skb_load_bytes`, which reads any part. The
/// offset is a constant, so the bounds proof needs no pointer arithmetic with a variable,
/// which the verifier refuses without CAP_PERFMON.
#[inline(always)]
fn read_direct<T: Copy, const OFFSET: usize>(ctx: &TcContext) -> Option<T> {
    let start = ctx.data();
    if start + OFFSET + size_of::<T>() > ctx.data_end() {
        return None;
    }
    // SAFETY: the bytes are within the packet's linear data, checked just above.
    Some(unsafe { core::ptr::read_unaligned((start + OFFSET) as *const T) })
}

/// The first bytes of an IPv4 packet with a 20-byte header (no options) and a TCP or UDP
/// header after it: the IP header, the ports, and for TCP its sequence number and flags
/// (for UDP, its length, checksum and first payload bytes, unused).
#[repr(C)]
#[derive(Clone, Copy)]
struct Ipv4Head {
    ip: Ipv4Header,
    ports: [u16; 2],
    sequence: [u16; 2],
    acknowledgement: u32,
    offset: u8,
    flags: u8,
}

/// The TCP sequence number's high 16 bits (host order) of an IPv4 packet whose TCP header
/// is at [`IPV4_PLAIN_L4`], read in place; `None`: not in the linear part.
#[inline(always)]
fn sequence_high_direct(ctx: &TcContext) -> Option<u16> {
    read_direct::<u16, { IPV4_PLAIN_L4 + TCP_SEQUENCE_OFFSET }>(ctx).map(u16::from_be)
}

/// Where the L4 header of an IPv4 packet without options starts.
const IPV4_PLAIN_L4: usize = ETH_HLEN + 20;

/// Where a packet's L4 header is, and what its IP header said.
struct Layer3<A> {
    source: A,
    destination: A,
    protocol: u8,
    ttl: u8,
    l4_offset: usize,
    /// Part of a fragmented datagram.
    fragmented: bool,
    /// Carries the L4 header (not a fragment after the first).
    has_l4: bool,
}

/// `None` for anything socklb does not translate: not TCP/UDP, or a fragment after the
/// first whose first fragment was not seen. A first fragment records its ports for the
/// later ones (`remember`); a later fragment takes them from there (`recall`), so that it
/// follows its datagram's flow (its addresses are rewritten, it has no ports or L4
/// checksum to rewrite).
#[inline(always)]
fn finish<'a, A: Address>(
    ctx: &'a TcContext,
    l3: Layer3<A>,
    remember: impl FnOnce(&FragmentPorts),
    recall: impl FnOnce() -> Option<FragmentPorts>,
) -> Option<Packet<'a, A>> {
    let l4_check = match l3.protocol {
        PROTO_TCP => TCP_CHECK_OFFSET,
        PROTO_UDP => UDP_CHECK_OFFSET,
        _ => return None,
    };
    let (ports, tcp_flags) = if l3.has_l4 {
        let ports: [u16; 2] = ctx.load(l3.l4_offset).ok()?;
        let tcp_flags: u8 = if l3.protocol == PROTO_TCP {
            ctx.load(l3.l4_offset + TCP_FLAGS_OFFSET).ok()?
        } else {
            0
        };
        if l3.fragmented {
            remember(&FragmentPorts {
                source_port: ports[0],
                destination_port: ports[1],
            });
        }
        (ports, tcp_flags)
    } else {
        let first = recall()?;
        ([first.source_port, first.destination_port], 0)
    };
    Some(Packet {
        ctx,
        tuple: Tuple {
            source: l3.source,
            destination: l3.destination,
            source_port: ports[0],
            destination_port: ports[1],
            protocol: l3.protocol,
            pad: 0,
            pad16: 0,
        },
        tcp_flags,
        ttl: l3.ttl,
        l4_offset: l3.l4_offset,
        l4_check_offset: l3.l4_offset + l4_check,
        mangled: false,
        has_l4: l3.has_l4,
        pseudo_sum: l3.has_l4,
    })
}

impl<'a> Packet<'a, u32> {
    /// The usual IPv4 TCP/UDP packet, read in place: no options, not a fragment, its L4
    /// header in the linear part. `None` for anything else, which [`Self::parse`] reads
    /// by helper calls.
    #[inline(always)]
    pub fn parse_plain(ctx: &'a TcContext) -> Option<Self> {
        let head = read_direct::<Ipv4Head, ETH_HLEN>(ctx)?;
        let ip = head.ip;
        if ip.version_ihl != 0x45
            || u16::from_be(ip.fragment) & IP_FRAGMENT_MASK != 0
            || (ip.protocol != PROTO_TCP && ip.protocol != PROTO_UDP)
        {
            return None;
        }
        let l4_check = if ip.protocol == PROTO_TCP {
            TCP_CHECK_OFFSET
        } else {
            UDP_CHECK_OFFSET
        };
        Some(Packet {
            ctx,
            tuple: Tuple {
                source: ip.source,
                destination: ip.destination,
                source_port: head.ports[0],
                destination_port: head.ports[1],
                protocol: ip.protocol,
                pad: 0,
                pad16: 0,
            },
            tcp_flags: if ip.protocol == PROTO_TCP {
                head.flags
            } else {
                0
            },
            ttl: ip.ttl,
            l4_offset: IPV4_PLAIN_L4,
            l4_check_offset: IPV4_PLAIN_L4 + l4_check,
            mangled: false,
            has_l4: true,
            pseudo_sum: true,
        })
    }

    /// An IPv4 TCP/UDP packet (the frame's EtherType already checked); fragments are keyed
    /// by (source, destination, IP id, protocol) as they arrive.
    #[inline(always)]
    pub fn parse(ctx: &'a TcContext) -> Option<Self> {
        Self::parse_plain(ctx).or_else(|| Self::parse_unusual(ctx))
    }

    /// [`Self::parse`] of a packet [`Self::parse_plain`] left: read by helper calls.
    #[inline(always)]
    pub fn parse_unusual(ctx: &'a TcContext) -> Option<Self> {
        let ip: Ipv4Header = ctx.load(ETH_HLEN).ok()?;
        if ip.version_ihl >> 4 != 4 || ip.version_ihl & 0x0f < 5 {
            return None;
        }
        if ip.protocol != PROTO_TCP && ip.protocol != PROTO_UDP {
            return None;
        }
        let fragment = u16::from_be(ip.fragment) & IP_FRAGMENT_MASK;
        let fragment_key = FragmentKey {
            source: ip.source,
            destination: ip.destination,
            id: ip.id,
            protocol: ip.protocol,
            pad: 0,
        };
        let l3 = Layer3 {
            source: ip.source,
            destination: ip.destination,
            protocol: ip.protocol,
            ttl: ip.ttl,
            l4_offset: ETH_HLEN + usize::from(ip.version_ihl & 0x0f) * 4,
            fragmented: fragment != 0,
            has_l4: fragment & IP_OFFSET_MASK == 0,
        };
        finish(
            ctx,
            l3,
            |first| {
                let _ = FRAGMENTS.insert(&fragment_key, first, 0);
            },
            // SAFETY: pointer from a successful lookup; copied out at once.
            || Some(unsafe { *FRAGMENTS.get_ptr(&fragment_key)? }),
        )
    }
}

impl<'a> Packet<'a, Ipv6Words> {
    /// An IPv6 TCP/UDP packet (the frame's EtherType already checked), after up to
    /// [`IPV6_MAX_EXTENSION_HEADERS`] extension headers (hop-by-hop, routing, destination
    /// options, fragment). Anything else (ICMPv6 with neighbour discovery, ESP, AH, no next
    /// header) is not ours; a packet whose headers go on beyond the bound passes
    /// untranslated and is counted. A routing header with segments left means this node is
    /// not the final destination (and the L4 checksum covers another address): not ours.
    /// Fragments are keyed by (source, destination, Fragment header id, protocol).
    ///
    /// Fills `packet` (made by [`Self::empty`]) field by field and says whether it is one
    /// of ours. Out of line: the headers take a stack frame of their own, not the flow's
    /// (IPv6's whole path does not fit one 512-byte frame); no `Option<Packet>` crosses the
    /// call, whose BTF the kernel refuses, and no padding byte is copied (a read of stack
    /// never written, which the verifier refuses).
    #[inline(never)]
    pub fn parse_into(ctx: &'a TcContext, packet: &mut Self) -> bool {
        let Some(parsed) = Self::parse(ctx) else {
            return false;
        };
        packet.tuple.source = parsed.tuple.source;
        packet.tuple.destination = parsed.tuple.destination;
        packet.tuple.source_port = parsed.tuple.source_port;
        packet.tuple.destination_port = parsed.tuple.destination_port;
        packet.tuple.protocol = parsed.tuple.protocol;
        packet.tcp_flags = parsed.tcp_flags;
        packet.ttl = parsed.ttl;
        packet.l4_offset = parsed.l4_offset;
        packet.l4_check_offset = parsed.l4_check_offset;
        packet.mangled = false;
        packet.has_l4 = parsed.has_l4;
        packet.pseudo_sum = parsed.pseudo_sum;
        true
    }

    /// A packet for [`Self::parse_into`] to fill.
    #[inline(always)]
    pub fn empty(ctx: &'a TcContext) -> Self {
        // A zero the compiler cannot see: zero stores in a row become a memset loop, whose
        // pointer arithmetic the verifier refuses without CAP_PERFMON.
        // SAFETY: a read of a valid constant.
        let zero = unsafe { core::ptr::read_volatile(&0u32) };
        Self {
            ctx,
            tuple: Tuple {
                source: [zero; 4],
                destination: [zero; 4],
                source_port: zero as u16,
                destination_port: zero as u16,
                protocol: zero as u8,
                pad: 0,
                pad16: 0,
            },
            tcp_flags: zero as u8,
            ttl: zero as u8,
            l4_offset: zero as usize,
            l4_check_offset: zero as usize,
            mangled: false,
            has_l4: false,
            pseudo_sum: false,
        }
    }

    #[inline(always)]
    fn parse(ctx: &'a TcContext) -> Option<Self> {
        let ip: Ipv6Header = ctx.load(ETH_HLEN).ok()?;
        if ip.version_class_flow.to_ne_bytes()[0] >> 4 != 6 {
            return None;
        }
        let mut next = ip.next_header;
        let mut offset = ETH_HLEN + IPV6_HEADER_LEN;
        // The Fragment header's id and offset-and-flags (all zero: none). Plain integers,
        // not an Option: LLVM may read the payload of a `None` it knows unused, and the
        // verifier refuses a read of stack never written.
        let mut fragment_id: u32 = 0;
        let mut fragment_flags: u16 = 0;
        for _ in 0..IPV6_MAX_EXTENSION_HEADERS {
            match next {
                IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DESTINATION_OPTIONS => {
                    // Next header, length in 8-octet units beyond the first 8, and for a
                    // routing header its type and segments left.
                    let header: [u8; 4] = ctx.load(offset).ok()?;
                    if next == IPV6_ROUTING && header[3] != 0 {
                        return None;
                    }
                    next = header[0];
                    offset += (usize::from(header[1]) + 1) * 8;
                }
                IPV6_FRAGMENT => {
                    let header: Ipv6FragmentHeader = ctx.load(offset).ok()?;
                    next = header.next_header;
                    offset += size_of::<Ipv6FragmentHeader>();
                    fragment_id = header.id;
                    fragment_flags = u16::from_be(header.offset_flags);
                    if fragment_flags & IPV6_OFFSET_MASK != 0 {
                        // A later fragment: what follows is the datagram's data.
                        break;
                    }
                }
                _ => break,
            }
        }
        let later_fragment = fragment_flags & IPV6_OFFSET_MASK != 0;
        if !later_fragment
            && matches!(
                next,
                IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DESTINATION_OPTIONS | IPV6_FRAGMENT
            )
        {
            bump(|c| &mut c.ipv6_headers_unwalked);
            return None;
        }
        if next != PROTO_TCP && next != PROTO_UDP {
            return None;
        }
        let fragment_key = FragmentKey6 {
            source: ip.source,
            destination: ip.destination,
            id: fragment_id,
            protocol: next,
            pad: 0,
            pad2: 0,
        };
        let fragmented = fragment_flags & (IPV6_OFFSET_MASK | IPV6_MORE_FRAGMENTS) != 0;
        let l3 = Layer3 {
            source: ip.source,
            destination: ip.destination,
            protocol: next,
            ttl: ip.hop_limit,
            l4_offset: offset,
            fragmented,
            has_l4: !later_fragment,
        };
        finish(
            ctx,
            l3,
            |first| {
                let _ = FRAGMENTS6.insert(&fragment_key, first, 0);
            },
            // SAFETY: pointer from a successful lookup; copied out at once.
            || Some(unsafe { *FRAGMENTS6.get_ptr(&fragment_key)? }),
        )
    }
}

impl<'a, A: Address> Packet<'a, A> {
    /// An ICMP error (protocol `protocol`: ICMP or ICMPv6) as a packet of its own, for its
    /// addresses to be rewritten and the packet forwarded like any other: it has no ports,
    /// and its checksum, at `icmp_check`, covers the addresses only for ICMPv6.
    #[inline(always)]
    pub fn icmp_error(
        ctx: &'a TcContext,
        source: A,
        destination: A,
        protocol: u8,
        ttl: u8,
        icmp_check: usize,
    ) -> Self {
        Self {
            ctx,
            tuple: Tuple {
                source,
                destination,
                source_port: 0,
                destination_port: 0,
                protocol,
                pad: 0,
                pad16: 0,
            },
            tcp_flags: 0,
            ttl,
            l4_offset: icmp_check,
            l4_check_offset: icmp_check,
            mangled: false,
            has_l4: false,
            pseudo_sum: protocol == PROTO_ICMPV6,
        }
    }

    /// The program context the packet is read from.
    pub fn context(&self) -> &'a TcContext {
        self.ctx
    }

    /// Whether any byte of the packet may have been rewritten.
    pub fn mangled(&self) -> bool {
        self.mangled
    }

    /// A TCP SYN without ACK: the first packet of a new connection.
    pub fn opens_connection(&self) -> bool {
        self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    /// What the packet says about the end of its TCP connection.
    pub fn ending(&self) -> Ending {
        if self.tcp_flags & TCP_RST != 0 {
            Ending::Reset
        } else if self.tcp_flags & TCP_FIN != 0 {
            Ending::Fin
        } else {
            Ending::None
        }
    }

    /// The length from the IP header on of the largest packet this one leaves the node as:
    /// itself, or for a batch the sender's device is to segment (GSO) one segment of it.
    pub fn wire_length(&self) -> usize {
        // SAFETY: the context is the valid __sk_buff of this run.
        let skb = unsafe { &*self.ctx.as_ptr().cast::<__sk_buff>() };
        if skb.gso_segs <= 1 || !self.has_l4 {
            return (skb.len as usize).saturating_sub(ETH_HLEN);
        }
        let l4_header = if self.tuple.protocol == PROTO_TCP {
            self.ctx
                .load::<u8>(self.l4_offset + TCP_DATA_OFFSET)
                .map_or(0, |offset| usize::from(offset >> 4) * 4)
        } else {
            UDP_HEADER_LEN
        };
        self.l4_offset - ETH_HLEN + l4_header + skb.gso_size as usize
    }

    /// The index of the device the program runs on: at ingress, where packets are traced,
    /// the one the packet arrived on. A load from the context, no helper.
    #[inline(always)]
    pub fn ifindex(&self) -> u32 {
        // SAFETY: the context is the valid __sk_buff of this run.
        unsafe { (*self.ctx.as_ptr().cast::<__sk_buff>()).ifindex }
    }

    /// Whether the packet must not be fragmented on its way: IPv6 (routers never
    /// fragment), or IPv4 with "don't fragment".
    pub fn may_not_fragment(&self) -> bool {
        A::may_not_fragment(self.ctx)
    }

    /// What the packet tells its conntrack entry. The sequence number is read from the
    /// packet here, not kept in `Packet`: IPv6's stack has no room to spare.
    pub fn segment(&self) -> Segment {
        let tcp = self.tuple.protocol == PROTO_TCP && self.has_l4;
        let direct =
            if tcp && self.l4_offset == IPV4_PLAIN_L4 && A::SOURCE_OFFSET == IP_SOURCE_OFFSET {
                sequence_high_direct(self.ctx)
            } else {
                None
            };
        let sequence_high = if let Some(sequence_high) = direct {
            sequence_high
        } else if tcp {
            self.ctx
                .load::<u16>(self.l4_offset + TCP_SEQUENCE_OFFSET)
                .map_or(0, u16::from_be)
        } else {
            0
        };
        Segment {
            ending: self.ending(),
            tcp,
            sequence_high,
        }
    }

    /// Rewrites addresses and ports (network byte order), fixing the checksums. Fields
    /// already equal are left alone.
    #[inline(always)]
    pub fn rewrite(
        &mut self,
        source: A,
        source_port: u16,
        destination: A,
        destination_port: u16,
    ) -> Result<(), PacketError> {
        if source != self.tuple.source
            || destination != self.tuple.destination
            || (self.has_l4
                && (source_port != self.tuple.source_port
                    || destination_port != self.tuple.destination_port))
        {
            self.mangled = true;
        }
        let to = Tuple {
            source,
            destination,
            source_port,
            destination_port,
            protocol: self.tuple.protocol,
            pad: 0,
            pad16: 0,
        };
        if A::rewrite_at_once(self, &to)? {
            return Ok(());
        }
        // Addresses are part of the L4 pseudo-header (its checksum is in the first
        // fragment, which covers the whole datagram).
        let l4 = L4Sum {
            present: self.pseudo_sum,
            offset: self.l4_check_offset,
            flags: self.l4_flags(),
        };
        if source != self.tuple.source {
            A::store(self.ctx, A::SOURCE_OFFSET, self.tuple.source, source, l4)?;
            self.tuple.source = source;
        }
        if destination != self.tuple.destination {
            A::store(
                self.ctx,
                A::DESTINATION_OFFSET,
                self.tuple.destination,
                destination,
                l4,
            )?;
            self.tuple.destination = destination;
        }
        if !self.has_l4 {
            // A later fragment: its ports are in the first one.
            self.tuple.source_port = source_port;
            self.tuple.destination_port = destination_port;
            return Ok(());
        }
        if source_port != self.tuple.source_port {
            self.set_port(self.l4_offset, self.tuple.source_port, source_port)?;
            self.tuple.source_port = source_port;
        }
        if destination_port != self.tuple.destination_port {
            self.set_port(
                self.l4_offset + 2,
                self.tuple.destination_port,
                destination_port,
            )?;
            self.tuple.destination_port = destination_port;
        }
        Ok(())
    }

    /// Lowers the TTL or hop limit by one, as forwarding does; the programs forward by
    /// redirect, which skips the kernel's own forwarding path.
    #[inline(always)]
    pub fn decrement_ttl(&mut self) -> Result<(), PacketError> {
        self.mangled = true;
        A::decrement_hop_limit(self.ctx, self.ttl, self.tuple.protocol)?;
        self.ttl = self.ttl.wrapping_sub(1);
        Ok(())
    }

    #[inline(always)]
    fn l4_flags(&self) -> u64 {
        // A UDP checksum of 0 means "none" and must stay 0; a computed 0 becomes 0xffff.
        if self.tuple.protocol == PROTO_UDP {
            u64::from(BPF_F_MARK_MANGLED_0)
        } else {
            0
        }
    }

    #[inline(always)]
    fn set_port(&self, offset: usize, old: u16, new: u16) -> Result<(), PacketError> {
        self.ctx.store(offset, &new, 0).map_err(|_| PacketError)?;
        self.ctx
            .l4_csum_replace(
                self.l4_check_offset,
                u64::from(old),
                u64::from(new),
                self.l4_flags() | 2,
            )
            .map_err(|_| PacketError)
    }
}
