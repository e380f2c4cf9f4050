//! ICMP errors about flows from outside the node: "fragmentation needed" and Packet Too Big
//! (path MTU discovery), destination unreachable, time exceeded, parameter problem.
//!
//! An error quotes the translated packet, which neither end could match to a socket. As
//! netfilter's NAT does for related ICMP, it is taken as a packet of the flow's other
//! direction and the quote gets back its addresses and ports (docs/operations.md, "Traffic
//! from outside the node", path MTU). Only a quote of TCP or UDP right after the IP header
//! is translated; its own L4 checksum is left as it is (receivers do not check it).
use aya_ebpf::programs::TcContext;
use socklb_abi::{
    CT_FLAG_DIRECT, CT_FORWARD, CT_REPLY, CtEntry, Ipv6Words, NodeConfig, PROTO_TCP, PROTO_UDP,
};

use crate::{
    conntrack,
    family::Family,
    packet::{
        Address, ETH_HLEN, IP_FRAGMENT_MASK, IP_OFFSET_MASK, IPV6_HEADER_LEN, Ipv4Header,
        Ipv6Header, PROTO_ICMP, PROTO_ICMPV6, Packet, PacketError, Tuple,
    },
};

/// ICMP types that quote the packet they are about.
const ICMP_DEST_UNREACHABLE: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETER_PROBLEM: u8 = 12;
const ICMPV6_DEST_UNREACHABLE: u8 = 1;
const ICMPV6_PACKET_TOO_BIG: u8 = 2;
const ICMPV6_TIME_EXCEEDED: u8 = 3;
const ICMPV6_PARAMETER_PROBLEM: u8 = 4;
/// The ICMP header before the quoted packet: type, code, checksum, and four bytes (the
/// next-hop MTU, a pointer, or unused).
const ICMP_HEADER_LEN: usize = 8;
const ICMP_CHECK: usize = 2;

/// An ICMP error that quotes a TCP or UDP packet: its own addresses, and where the quoted
/// packet's header and ports are.
#[derive(Clone, Copy)]
pub struct Quote<A> {
    pub source: A,
    pub destination: A,
    pub ttl: u8,
    /// ICMP or ICMPv6.
    pub protocol: u8,
    icmp: usize,
    quoted: usize,
    quoted_l4: usize,
    /// The quoted packet as it was on the wire.
    quoted_tuple: Tuple<A>,
}

impl<A: Copy> Quote<A> {
    /// Where the ICMP checksum is.
    pub fn icmp_check(&self) -> usize {
        self.icmp + ICMP_CHECK
    }

    /// The flow tuple of a packet going the other way than the quoted one: the error's own
    /// place in its flow.
    fn reversed(&self) -> Tuple<A> {
        let quoted = &self.quoted_tuple;
        Tuple {
            source: quoted.destination,
            destination: quoted.source,
            source_port: quoted.destination_port,
            destination_port: quoted.source_port,
            protocol: quoted.protocol,
            pad: 0,
            pad16: 0,
        }
    }
}

/// How an address family's ICMP errors are read.
pub trait Quoting: Address {
    /// The frame as an ICMP error that quotes a TCP or UDP packet, if it is one (the
    /// frame's EtherType already checked).
    fn quote(ctx: &TcContext) -> Option<Quote<Self>>;
}

impl Quoting for u32 {
    #[inline(always)]
    fn quote(ctx: &TcContext) -> Option<Quote<Self>> {
        let ip: Ipv4Header = ctx.load(ETH_HLEN).ok()?;
        if ip.version_ihl >> 4 != 4
            || ip.protocol != PROTO_ICMP
            || u16::from_be(ip.fragment) & IP_FRAGMENT_MASK != 0
        {
            return None;
        }
        let icmp = ETH_HLEN + usize::from(ip.version_ihl & 0x0f) * 4;
        let kind: u8 = ctx.load(icmp).ok()?;
        if !matches!(
            kind,
            ICMP_DEST_UNREACHABLE | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
        ) {
            return None;
        }
        let quoted = icmp + ICMP_HEADER_LEN;
        let inner: Ipv4Header = ctx.load(quoted).ok()?;
        // A later fragment quotes no ports.
        if inner.version_ihl >> 4 != 4
            || u16::from_be(inner.fragment) & IP_OFFSET_MASK != 0
            || (inner.protocol != PROTO_TCP && inner.protocol != PROTO_UDP)
        {
            return None;
        }
        let quoted_l4 = quoted + usize::from(inner.version_ihl & 0x0f) * 4;
        let ports: [u16; 2] = ctx.load(quoted_l4).ok()?;
        Some(Quote {
            source: ip.source,
            destination: ip.destination,
            ttl: ip.ttl,
            protocol: PROTO_ICMP,
            icmp,
            quoted,
            quoted_l4,
            quoted_tuple: Tuple {
                source: inner.source,
                destination: inner.destination,
                source_port: ports[0],
                destination_port: ports[1],
                protocol: inner.protocol,
                pad: 0,
                pad16: 0,
            },
        })
    }
}

impl Quoting for Ipv6Words {
    #[inline(always)]
    fn quote(ctx: &TcContext) -> Option<Quote<Self>> {
        let ip: Ipv6Header = ctx.load(ETH_HLEN).ok()?;
        if ip.version_class_flow.to_ne_bytes()[0] >> 4 != 6 || ip.next_header != PROTO_ICMPV6 {
            return None;
        }
        let icmp = ETH_HLEN + IPV6_HEADER_LEN;
        let kind: u8 = ctx.load(icmp).ok()?;
        if !matches!(
            kind,
            ICMPV6_DEST_UNREACHABLE
                | ICMPV6_PACKET_TOO_BIG
                | ICMPV6_TIME_EXCEEDED
                | ICMPV6_PARAMETER_PROBLEM
        ) {
            return None;
        }
        let quoted = icmp + ICMP_HEADER_LEN;
        let inner: Ipv6Header = ctx.load(quoted).ok()?;
        if inner.next_header != PROTO_TCP && inner.next_header != PROTO_UDP {
            return None;
        }
        let quoted_l4 = quoted + IPV6_HEADER_LEN;
        let ports: [u16; 2] = ctx.load(quoted_l4).ok()?;
        Some(Quote {
            source: ip.source,
            destination: ip.destination,
            ttl: ip.hop_limit,
            protocol: PROTO_ICMPV6,
            icmp,
            quoted,
            quoted_l4,
            quoted_tuple: Tuple {
                source: inner.source,
                destination: inner.destination,
                source_port: ports[0],
                destination_port: ports[1],
                protocol: inner.next_header,
                pad: 0,
                pad16: 0,
            },
        })
    }
}

/// The conntrack entry an error goes by: that of the flow's direction opposite to the
/// quoted packet's. Arriving (`ingress`), the error is about a packet socklb forwarded to
/// its backend (SNATed: the reply direction's entry, found only at a SNAT port; or
/// delivered directly to a pod, which answers on its own device) or about a reply sent to
/// a client (the forward direction's entry); leaving the node, it is about a packet
/// delivered to a backend here (the reply direction's).
#[inline(always)]
pub fn flow_of<F: Family>(
    quote: &Quote<F::Addr>,
    ingress: bool,
    node: Option<&NodeConfig>,
    now: u32,
) -> Option<CtEntry<F::Addr>> {
    let reversed = quote.reversed();
    let snat_port = conntrack::may_be_snat_reply(&reversed, node);
    if !ingress || snat_port || conntrack::delivers_direct(node) {
        let reply = conntrack::peek::<F>(&reversed, CT_REPLY, now);
        match reply {
            Some(entry) if !ingress || snat_port || entry.flags & CT_FLAG_DIRECT != 0 => {
                return reply;
            }
            _ if !ingress => return None,
            _ => {}
        }
    }
    conntrack::peek::<F>(&reversed, CT_FORWARD, now)
}

/// Rewrites the error (`packet`, made from `quote`) to what `entry` says: its own addresses
/// become the entry's, and the quoted packet, which went the other way, gets back the
/// addresses and ports it had before translation.
#[inline(always)]
pub fn translate<A: Address>(
    packet: &mut Packet<A>,
    quote: &Quote<A>,
    entry: &CtEntry<A>,
) -> Result<(), PacketError> {
    packet.rewrite(entry.source, 0, entry.destination, 0)?;
    let ctx = packet.context();
    let quoted = &quote.quoted_tuple;
    let check = quote.icmp_check();
    if quoted.source != entry.destination {
        A::store_quoted(
            ctx,
            quote.quoted + A::HEADER_SOURCE,
            quoted.source,
            entry.destination,
            quote.quoted,
            check,
        )?;
    }
    if quoted.destination != entry.source {
        A::store_quoted(
            ctx,
            quote.quoted + A::HEADER_DESTINATION,
            quoted.destination,
            entry.source,
            quote.quoted,
            check,
        )?;
    }
    let port = |offset: usize, old: u16, new: u16| {
        if old == new {
            return Ok(());
        }
        ctx.store(offset, &new, 0).map_err(|_| PacketError)?;
        ctx.l4_csum_replace(check, u64::from(old), u64::from(new), 2)
            .map_err(|_| PacketError)
    };
    port(quote.quoted_l4, quoted.source_port, entry.destination_port)?;
    port(
        quote.quoted_l4 + 2,
        quoted.destination_port,
        entry.source_port,
    )
}
