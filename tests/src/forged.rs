//! Forged TCP segments, as a blind attacker sends them (a segment with a live flow's
//! addresses and ports, and a sequence number of its choosing), and the capture that
//! learns where a flow's real sequence numbers are, so that a test can forge one far from
//! them for certain.
use std::{
    mem::MaybeUninit,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// What a forged segment carries.
#[derive(Clone, Copy, Debug)]
pub enum Flags {
    Rst,
    Syn,
    Fin,
}

/// Sends one TCP segment from `from` to `to` with `sequence`, through a raw socket of the
/// network namespace it is called in.
pub fn send(from: SocketAddr, to: SocketAddr, sequence: u32, flags: Flags) {
    let builder = match (from.ip(), to.ip()) {
        (IpAddr::V4(source), IpAddr::V4(destination)) => {
            PacketBuilder::ipv4(source.octets(), destination.octets(), 64)
        }
        (IpAddr::V6(source), IpAddr::V6(destination)) => {
            PacketBuilder::ipv6(source.octets(), destination.octets(), 64)
        }
        _ => panic!("a segment from {from} to {to} mixes address families"),
    };
    let builder = builder.tcp(from.port(), to.port(), sequence, 64_240);
    let builder = match flags {
        Flags::Rst => builder.rst(),
        Flags::Syn => builder.syn(),
        Flags::Fin => builder.fin(),
    };
    let mut packet = Vec::with_capacity(builder.size(0));
    builder
        .write(&mut packet, &[])
        .expect("build the forged segment");
    // IPPROTO_RAW: the packet carries its own IP header, source address included.
    let socket = Socket::new(
        Domain::for_address(to),
        Type::RAW,
        Some(Protocol::from(libc::IPPROTO_RAW)),
    )
    .expect("a raw socket (needs CAP_NET_RAW)");
    socket
        .send_to(&packet, &SockAddr::from(SocketAddr::new(to.ip(), 0)))
        .unwrap_or_else(|e| panic!("send the forged {flags:?} from {from} to {to}: {e}"));
}

/// A capture of every packet of the network namespace it was started in (both ways, all
/// interfaces), closed when dropped.
pub struct Capture(Socket);

impl Capture {
    pub fn start() -> Self {
        let all = (libc::ETH_P_ALL as u16).to_be();
        let socket = Socket::new(
            Domain::PACKET,
            Type::DGRAM,
            Some(Protocol::from(i32::from(all))),
        )
        .expect("a packet socket (needs CAP_NET_RAW)");
        socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("read timeout");
        Self(socket)
    }

    /// The sequence number of the first TCP segment with a payload from `from` to `to`
    /// seen since the capture started (panics after 5 s without one).
    pub fn data_sequence(&self, from: SocketAddr, to: SocketAddr) -> u32 {
        self.first("TCP segment with data", from, to, |segment| {
            (segment.payload_len != 0).then_some(segment.sequence)
        })
    }

    /// The first TCP segment from `from` to `to` seen since the capture started (panics
    /// after 5 s without one).
    pub fn segment(&self, from: SocketAddr, to: SocketAddr) -> Segment {
        self.first("TCP segment", from, to, Some)
    }

    fn first<T>(
        &self,
        what: &str,
        from: SocketAddr,
        to: SocketAddr,
        wanted: impl Fn(Segment) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buffer = [MaybeUninit::<u8>::uninit(); 2048];
        while Instant::now() < deadline {
            let Ok(len) = self.0.recv(&mut buffer) else {
                continue;
            };
            // SAFETY: recv initialised the first `len` bytes.
            let packet: &[u8] = unsafe { std::slice::from_raw_parts(buffer.as_ptr().cast(), len) };
            if let Some(found) = segment_of(packet, from, to).and_then(&wanted) {
                return found;
            }
        }
        panic!("no {what} from {from} to {to} was captured within 5 s");
    }
}

/// What a test checks of a captured TCP segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub sequence: u32,
    pub acknowledgment: u32,
    pub syn: bool,
    pub ack: bool,
    pub rst: bool,
    pub fin: bool,
    /// The TCP header's length, options included.
    pub header_len: usize,
    pub payload_len: usize,
    /// Whether its TCP checksum is the one computed afresh over the captured bytes.
    pub checksum_valid: bool,
}

/// `packet` (an IP packet) if it is a TCP segment from `from` to `to`.
fn segment_of(packet: &[u8], from: SocketAddr, to: SocketAddr) -> Option<Segment> {
    let sliced = SlicedPacket::from_ip(packet).ok()?;
    let TransportSlice::Tcp(tcp) = sliced.transport? else {
        return None;
    };
    let (source, destination, checksum): (IpAddr, IpAddr, _) = match sliced.net? {
        NetSlice::Ipv4(ip) => {
            let (source, destination) = (ip.header().source(), ip.header().destination());
            let checksum = tcp.calc_checksum_ipv4(source, destination).ok();
            (source.into(), destination.into(), checksum)
        }
        NetSlice::Ipv6(ip) => {
            let (source, destination) = (ip.header().source(), ip.header().destination());
            let checksum = tcp.calc_checksum_ipv6(source, destination).ok();
            (source.into(), destination.into(), checksum)
        }
        _ => return None,
    };
    let segment_from = SocketAddr::new(source, tcp.source_port());
    let segment_to = SocketAddr::new(destination, tcp.destination_port());
    (segment_from == from && segment_to == to).then(|| Segment {
        sequence: tcp.sequence_number(),
        acknowledgment: tcp.acknowledgment_number(),
        syn: tcp.syn(),
        ack: tcp.ack(),
        rst: tcp.rst(),
        fin: tcp.fin(),
        header_len: 20 + tcp.options().len(),
        payload_len: tcp.payload().len(),
        checksum_valid: checksum == Some(tcp.checksum()),
    })
}
