//! Ethernet frames for the kernel's test harness ([`crate::test_run`]): built as a node
//! would receive them, and read back with their checksums checked.
use std::net::{IpAddr, SocketAddr};

use etherparse::{
    Icmpv4Type, Icmpv6Type, NetSlice, PacketBuilder, PacketBuilderStep, SlicedPacket,
    TransportSlice, icmpv4::DestUnreachableHeader,
};

/// An Ethernet frame of a TCP segment from `from` to `to`: a SYN, or the SYN-ACK that
/// answers one (`answer`), with a few bytes of data (as TCP Fast Open sends) for the
/// checksum to cover.
pub fn tcp(from: SocketAddr, to: SocketAddr, answer: bool) -> Vec<u8> {
    let ethernet = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let ip = match (from.ip(), to.ip()) {
        (IpAddr::V4(from), IpAddr::V4(to)) => ethernet.ipv4(from.octets(), to.octets(), 64),
        (IpAddr::V6(from), IpAddr::V6(to)) => ethernet.ipv6(from.octets(), to.octets(), 64),
        _ => panic!("{from} and {to} are of two families"),
    };
    let tcp = ip.tcp(from.port(), to.port(), 1_000, 64_240).syn();
    let tcp = if answer { tcp.ack(1_001) } else { tcp };
    let payload = b"abcd";
    let mut frame = Vec::with_capacity(tcp.size(payload.len()));
    tcp.write(&mut frame, payload).expect("build a frame");
    frame
}

/// An Ethernet frame of a UDP datagram from `from` to `to` (a DNS-sized query).
pub fn udp(from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let ethernet = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let ip = match (from.ip(), to.ip()) {
        (IpAddr::V4(from), IpAddr::V4(to)) => ethernet.ipv4(from.octets(), to.octets(), 64),
        (IpAddr::V6(from), IpAddr::V6(to)) => ethernet.ipv6(from.octets(), to.octets(), 64),
        _ => panic!("{from} and {to} are of two families"),
    };
    let udp = ip.udp(from.port(), to.port());
    let payload = [7u8; 33];
    let mut frame = Vec::with_capacity(udp.size(payload.len()));
    udp.write(&mut frame, &payload).expect("build a frame");
    frame
}

/// A router's "too big" error (IPv4's "fragmentation needed", IPv6's Packet Too Big) from
/// `router` to `from`'s address, quoting the header of a TCP segment `from` → `to`.
pub fn too_big(router: &str, from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let ethernet = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let quote = |ip: PacketBuilderStep<_>| {
        let mut quoted = Vec::new();
        ip.tcp(from.port(), to.port(), 5_000, 64_240)
            .ack(1_001)
            .write(&mut quoted, &[])
            .expect("build the quoted header");
        quoted
    };
    let mut frame = Vec::new();
    match (router.parse().expect("address"), from.ip(), to.ip()) {
        (IpAddr::V4(router), IpAddr::V4(from), IpAddr::V4(to)) => {
            let quoted = quote(PacketBuilder::ipv4(from.octets(), to.octets(), 64));
            let too_big = DestUnreachableHeader::FragmentationNeeded {
                next_hop_mtu: 1_280,
            };
            ethernet
                .ipv4(router.octets(), from.octets(), 64)
                .icmpv4(Icmpv4Type::DestinationUnreachable(too_big))
                .write(&mut frame, &quoted)
        }
        (IpAddr::V6(router), IpAddr::V6(from), IpAddr::V6(to)) => {
            let quoted = quote(PacketBuilder::ipv6(from.octets(), to.octets(), 64));
            ethernet
                .ipv6(router.octets(), from.octets(), 64)
                .icmpv6(Icmpv6Type::PacketTooBig { mtu: 1_280 })
                .write(&mut frame, &quoted)
        }
        _ => panic!("{router}, {from} and {to} are not of one family"),
    }
    .expect("build an ICMP error");
    frame
}

/// An ICMP error frame whose checksum is right: its destination, and the source and
/// destination of the segment it quotes.
pub fn checked_icmp(frame: &[u8]) -> (IpAddr, (SocketAddr, SocketAddr)) {
    let packet = SlicedPacket::from_ethernet(frame).expect("an ICMP error");
    let (destination, quoted) = match (packet.net, packet.transport) {
        (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Icmpv4(icmp))) => {
            let sum = icmp.icmp_type().calc_checksum(icmp.payload());
            assert_eq!(icmp.checksum(), sum, "the ICMP checksum");
            (IpAddr::from(ip.header().destination_addr()), icmp.payload())
        }
        (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Icmpv6(icmp))) => {
            let header = ip.header();
            let (source, destination) = (header.source_addr(), header.destination_addr());
            assert!(
                icmp.is_checksum_valid(source.octets(), destination.octets()),
                "the ICMPv6 checksum"
            );
            (IpAddr::from(destination), icmp.payload())
        }
        _ => panic!("not an ICMP error of IPv4 or IPv6"),
    };
    let quoted = SlicedPacket::from_ip(quoted).expect("the quoted segment");
    let source = quoted.net.as_ref().map(|net| match net {
        NetSlice::Ipv4(ip) => IpAddr::from(ip.header().source_addr()),
        NetSlice::Ipv6(ip) => IpAddr::from(ip.header().source_addr()),
        NetSlice::Arp(_) => panic!("ARP quoted"),
    });
    let quoted_destination = quoted.net.as_ref().map(|net| match net {
        NetSlice::Ipv4(ip) => IpAddr::from(ip.header().destination_addr()),
        NetSlice::Ipv6(ip) => IpAddr::from(ip.header().destination_addr()),
        NetSlice::Arp(_) => panic!("ARP quoted"),
    });
    let Some(TransportSlice::Tcp(tcp)) = quoted.transport else {
        panic!("the quoted segment is not TCP");
    };
    (
        destination,
        (
            SocketAddr::new(source.expect("quoted source"), tcp.source_port()),
            SocketAddr::new(
                quoted_destination.expect("quoted destination"),
                tcp.destination_port(),
            ),
        ),
    )
}

/// The source and destination of a TCP or UDP frame whose checksums (IPv4's header, the
/// L4 one) are right.
pub fn checked_addresses(frame: &[u8], what: &str) -> (SocketAddr, SocketAddr) {
    let packet = SlicedPacket::from_ethernet(frame).unwrap_or_else(|e| panic!("{what}: {e}"));
    let (source, destination) = match &packet.net {
        Some(NetSlice::Ipv4(ip)) => {
            let header = ip.header();
            assert_eq!(
                header.header_checksum(),
                header.to_header().calc_header_checksum(),
                "{what}: the IPv4 header checksum"
            );
            (
                IpAddr::from(header.source_addr()),
                IpAddr::from(header.destination_addr()),
            )
        }
        Some(NetSlice::Ipv6(ip)) => {
            let header = ip.header();
            (
                IpAddr::from(header.source_addr()),
                IpAddr::from(header.destination_addr()),
            )
        }
        _ => panic!("{what}: not IP any more"),
    };
    let (ports, check, sum) = match (&packet.transport, source, destination) {
        (Some(TransportSlice::Tcp(tcp)), IpAddr::V4(from), IpAddr::V4(to)) => (
            (tcp.source_port(), tcp.destination_port()),
            tcp.checksum(),
            tcp.calc_checksum_ipv4(from.octets(), to.octets()),
        ),
        (Some(TransportSlice::Tcp(tcp)), IpAddr::V6(from), IpAddr::V6(to)) => (
            (tcp.source_port(), tcp.destination_port()),
            tcp.checksum(),
            tcp.calc_checksum_ipv6(from.octets(), to.octets()),
        ),
        (Some(TransportSlice::Udp(udp)), IpAddr::V4(from), IpAddr::V4(to)) => (
            (udp.source_port(), udp.destination_port()),
            udp.checksum(),
            udp.to_header()
                .calc_checksum_ipv4_raw(from.octets(), to.octets(), udp.payload()),
        ),
        (Some(TransportSlice::Udp(udp)), IpAddr::V6(from), IpAddr::V6(to)) => (
            (udp.source_port(), udp.destination_port()),
            udp.checksum(),
            udp.to_header()
                .calc_checksum_ipv6_raw(from.octets(), to.octets(), udp.payload()),
        ),
        _ => panic!("{what}: not TCP or UDP any more"),
    };
    assert_eq!(
        Ok(check),
        sum.map_err(|e| e.to_string()),
        "{what}: the L4 checksum"
    );
    (
        SocketAddr::new(source, ports.0),
        SocketAddr::new(destination, ports.1),
    )
}
