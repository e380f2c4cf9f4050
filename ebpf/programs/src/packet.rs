//! An IPv4 TCP or UDP packet in a TC program: its addresses and ports, and rewrites of them
//! that keep the IP and L4 checksums right.
//!
//! Reads and writes go through `bpf_skb_load_bytes`/`bpf_skb_store_bytes`, so no packet
//! pointer needs bounds proofs, and the checksum helpers handle every `ip_summed` state
//! (a packet from a local veth often carries only a partial checksum).
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use socklb_abi::{FragmentKey, FragmentPorts, PROTO_TCP, PROTO_UDP};

use crate::maps::FRAGMENTS;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const IP_TTL_OFFSET: usize = ETH_HLEN + 8;
const IP_CHECK_OFFSET: usize = ETH_HLEN + 10;
const IP_SOURCE_OFFSET: usize = ETH_HLEN + 12;
const IP_DESTINATION_OFFSET: usize = ETH_HLEN + 16;
/// More-fragments flag and fragment offset, in the host-order `frag_off`.
const IP_FRAGMENT_MASK: u16 = 0x3fff;
/// Fragment offset alone.
const IP_OFFSET_MASK: u16 = 0x1fff;
const TCP_CHECK_OFFSET: usize = 16;
const TCP_FLAGS_OFFSET: usize = 13;
const UDP_CHECK_OFFSET: usize = 6;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

#[repr(C)]
#[derive(Clone, Copy)]
struct Ipv4Header {
    version_ihl: u8,
    tos: u8,
    total_length: u16,
    id: u16,
    fragment: u16,
    ttl: u8,
    protocol: u8,
    check: u16,
    source: u32,
    destination: u32,
}

/// A packet's flow identity as it arrives; addresses and ports in network byte order.
#[derive(Clone, Copy)]
pub struct Tuple {
    pub source: u32,
    pub destination: u32,
    pub source_port: u16,
    pub destination_port: u16,
    pub protocol: u8,
}

/// A parsed IPv4 TCP/UDP packet on an Ethernet device.
pub struct Packet<'a> {
    ctx: &'a TcContext,
    pub tuple: Tuple,
    /// TCP flags; 0 for UDP.
    tcp_flags: u8,
    pub ttl: u8,
    l4_offset: usize,
    l4_check_offset: usize,
    /// A store into the packet was attempted: from then on, a failure must drop the packet
    /// rather than let a half-rewritten one through.
    mangled: bool,
    /// The packet carries the L4 header (not a fragment after the first): ports and the L4
    /// checksum are in it.
    has_l4: bool,
}

/// Packet access failed (truncated packet, helper error): let it pass untranslated.
pub struct PacketError;

impl<'a> Packet<'a> {
    /// `None` for anything socklb does not translate: not IPv4, not TCP/UDP, or a fragment
    /// after the first whose first fragment was not seen. A first fragment records its
    /// ports for the later ones, keyed by (source, destination, IP id, protocol) as they
    /// arrive; a later fragment takes them from there, so that it follows its datagram's
    /// flow (its addresses are rewritten, it has no ports or L4 checksum to rewrite).
    #[inline(always)]
    pub fn parse(ctx: &'a TcContext) -> Option<Self> {
        let ether_type: u16 = ctx.load(12).ok()?;
        if u16::from_be(ether_type) != ETH_P_IP {
            return None;
        }
        let ip: Ipv4Header = ctx.load(ETH_HLEN).ok()?;
        if ip.version_ihl >> 4 != 4 || ip.version_ihl & 0x0f < 5 {
            return None;
        }
        let l4_check = match ip.protocol {
            PROTO_TCP => TCP_CHECK_OFFSET,
            PROTO_UDP => UDP_CHECK_OFFSET,
            _ => return None,
        };
        let fragment = u16::from_be(ip.fragment) & IP_FRAGMENT_MASK;
        let l4_offset = ETH_HLEN + usize::from(ip.version_ihl & 0x0f) * 4;
        let fragment_key = FragmentKey {
            source: ip.source,
            destination: ip.destination,
            id: ip.id,
            protocol: ip.protocol,
            pad: 0,
        };
        let has_l4 = fragment & IP_OFFSET_MASK == 0;
        let (ports, tcp_flags) = if has_l4 {
            let ports: [u16; 2] = ctx.load(l4_offset).ok()?;
            let tcp_flags: u8 = if ip.protocol == PROTO_TCP {
                ctx.load(l4_offset + TCP_FLAGS_OFFSET).ok()?
            } else {
                0
            };
            if fragment != 0 {
                let first = FragmentPorts {
                    source_port: ports[0],
                    destination_port: ports[1],
                };
                let _ = FRAGMENTS.insert(&fragment_key, &first, 0);
            }
            (ports, tcp_flags)
        } else {
            // SAFETY: pointer from a successful lookup; copied out at once.
            let first = unsafe { *FRAGMENTS.get_ptr(&fragment_key)? };
            ([first.source_port, first.destination_port], 0)
        };
        Some(Self {
            ctx,
            tuple: Tuple {
                source: ip.source,
                destination: ip.destination,
                source_port: ports[0],
                destination_port: ports[1],
                protocol: ip.protocol,
            },
            tcp_flags,
            ttl: ip.ttl,
            l4_offset,
            l4_check_offset: l4_offset + l4_check,
            mangled: false,
            has_l4,
        })
    }

    /// Whether any byte of the packet may have been rewritten.
    pub fn mangled(&self) -> bool {
        self.mangled
    }

    /// A TCP SYN without ACK: the first packet of a new connection.
    pub fn opens_connection(&self) -> bool {
        self.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN
    }

    /// A TCP FIN or RST: the connection is ending.
    pub fn closes_connection(&self) -> bool {
        self.tcp_flags & (TCP_FIN | TCP_RST) != 0
    }

    /// Rewrites addresses and ports (network byte order), fixing the checksums. Fields
    /// already equal are left alone.
    #[inline(always)]
    pub fn rewrite(
        &mut self,
        source: u32,
        source_port: u16,
        destination: u32,
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
        if source != self.tuple.source {
            self.set_address(IP_SOURCE_OFFSET, self.tuple.source, source)?;
            self.tuple.source = source;
        }
        if destination != self.tuple.destination {
            self.set_address(IP_DESTINATION_OFFSET, self.tuple.destination, destination)?;
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

    /// Lowers the TTL by one, as forwarding does; the programs forward by redirect, which
    /// skips the kernel's own forwarding path.
    #[inline(always)]
    pub fn decrement_ttl(&mut self) -> Result<(), PacketError> {
        let new_ttl = self.ttl.wrapping_sub(1);
        // The checksum covers TTL as the high byte of a 16-bit word with the protocol.
        let old_word = u16::from_be_bytes([self.ttl, self.tuple.protocol]);
        let new_word = u16::from_be_bytes([new_ttl, self.tuple.protocol]);
        self.mangled = true;
        self.ctx
            .store(IP_TTL_OFFSET, &new_ttl, 0)
            .map_err(|_| PacketError)?;
        self.ctx
            .l3_csum_replace(
                IP_CHECK_OFFSET,
                u64::from(old_word.to_be()),
                u64::from(new_word.to_be()),
                2,
            )
            .map_err(|_| PacketError)?;
        self.ttl = new_ttl;
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
    fn set_address(&self, offset: usize, old: u32, new: u32) -> Result<(), PacketError> {
        self.ctx.store(offset, &new, 0).map_err(|_| PacketError)?;
        self.ctx
            .l3_csum_replace(IP_CHECK_OFFSET, u64::from(old), u64::from(new), 4)
            .map_err(|_| PacketError)?;
        if !self.has_l4 {
            return Ok(());
        }
        // Addresses are part of the L4 pseudo-header (its checksum is in the first
        // fragment, which covers the whole datagram).
        self.ctx
            .l4_csum_replace(
                self.l4_check_offset,
                u64::from(old),
                u64::from(new),
                u64::from(BPF_F_PSEUDO_HDR) | self.l4_flags() | 4,
            )
            .map_err(|_| PacketError)
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
