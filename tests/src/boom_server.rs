//! A TCP server that, on every connection, sends the client a segment far outside its
//! receive window and watches how the client reacts, as upstream's regression image for
//! kubernetes#74839 does. Conntrack finds such a segment INVALID; a proxy whose NAT relies on
//! conntrack lets it through untranslated, the client cannot match it to its connection and
//! answers with a RST. A client that knows the segment's connection answers with an ACK
//! (RFC 5961's challenge ACK) and keeps the connection.
//!
//! The segment is written with a raw socket in the server's network namespace, which also
//! sees every TCP packet arriving there: the client's reaction is the first packet from it
//! after the injection.
use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, Shutdown, SocketAddrV4},
    os::fd::OwnedFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{netns::Netns, raw_socket};

const TCP_FLAG_RST: u8 = 0x04;
const TCP_FLAG_PSH_ACK: u8 = 0x18;
const PAYLOAD: &[u8] = b"boom";

/// What the client did after an injected segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reaction {
    /// It acknowledged (its connection owns the segment's addresses): what must happen.
    Ack,
    /// It reset the connection.
    Reset,
    /// Nothing arrived from it in time.
    Nothing,
}

pub struct BoomServer {
    stop: Arc<AtomicBool>,
    reactions: Arc<Mutex<Vec<(SocketAddrV4, Reaction)>>>,
    thread: Option<JoinHandle<()>>,
}

impl BoomServer {
    /// Serves `addr` inside `netns`; each connection gets the injected segment, then the
    /// reply `boom-server <reaction>` once the client has reacted.
    pub fn start(netns: &Netns, addr: SocketAddrV4) -> Self {
        let listener = netns.tcp_listener(addr.into());
        let raw = netns.enter(|| raw_socket::open(libc::AF_INET, libc::IPPROTO_TCP));
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let reactions = Arc::new(Mutex::new(Vec::new()));
        let (stopping, recorded) = (stop.clone(), reactions.clone());
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                let Ok((mut stream, peer)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                };
                let std::net::SocketAddr::V4(peer) = peer else {
                    continue;
                };
                let reaction = boom(&raw, addr, peer);
                let _ = stream.set_nonblocking(false);
                let _ = stream.write_all(format!("boom-server {reaction:?}").as_bytes());
                let _ = stream.shutdown(Shutdown::Write);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                let mut sink = [0u8; 512];
                while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
                if let Ok(mut reactions) = recorded.lock() {
                    reactions.push((peer, reaction));
                }
            }
        });
        Self {
            stop,
            reactions,
            thread: Some(thread),
        }
    }

    /// The client address (as the server saw it) and reaction of every connection so far.
    pub fn reactions(&self) -> Vec<(SocketAddrV4, Reaction)> {
        self.reactions
            .lock()
            .map(|reactions| reactions.clone())
            .unwrap_or_default()
    }
}

impl Drop for BoomServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One TCP segment as the raw socket saw it.
struct Seen {
    from: SocketAddrV4,
    to_port: u16,
    seq: u32,
    ack: u32,
    flags: u8,
}

/// Injects the segment into the connection `local` <- `peer` and returns the client's
/// reaction, waiting at most 2 s for it.
fn boom(raw: &OwnedFd, local: SocketAddrV4, peer: SocketAddrV4) -> Reaction {
    // The client's last packet (the handshake's ACK) tells what it expects next.
    let mut last = None;
    while let Some(seen) = receive(raw, Duration::ZERO) {
        if seen.from == peer && seen.to_port == local.port() {
            last = Some((seen.seq, seen.ack));
        }
    }
    let Some((client_seq, client_expects)) = last else {
        return Reaction::Nothing;
    };
    // Half the sequence space away from what the client expects: outside any window.
    let segment = tcp_segment(
        local,
        peer,
        client_expects.wrapping_add(0x8000_0000),
        client_seq,
    );
    if let Err(e) = raw_socket::send_to(raw, &segment, (*peer.ip()).into()) {
        panic!("inject a segment: {e}");
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Some(seen) = receive(raw, left) else {
            break;
        };
        if seen.from == peer && seen.to_port == local.port() {
            return if seen.flags & TCP_FLAG_RST != 0 {
                Reaction::Reset
            } else {
                Reaction::Ack
            };
        }
    }
    Reaction::Nothing
}

/// The next TCP packet arriving in the namespace, waiting at most `wait` (zero: only one
/// already queued).
fn receive(raw: &OwnedFd, wait: Duration) -> Option<Seen> {
    let flags = if wait.is_zero() {
        libc::MSG_DONTWAIT
    } else {
        let _ = raw_socket::set_receive_timeout(raw, wait);
        0
    };
    let mut buffer = [0u8; 1500];
    let len = raw_socket::receive(raw, &mut buffer, flags).ok()?;
    let packet = buffer.get(..len)?;
    let header = usize::from(packet.first()? & 0x0f) * 4;
    let source = Ipv4Addr::new(
        *packet.get(12)?,
        *packet.get(13)?,
        *packet.get(14)?,
        *packet.get(15)?,
    );
    let tcp = packet.get(header..)?;
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(tcp.get(at..at + 4)?.try_into().ok()?))
    };
    Some(Seen {
        from: SocketAddrV4::new(source, u16::from_be_bytes([*tcp.first()?, *tcp.get(1)?])),
        to_port: u16::from_be_bytes([*tcp.get(2)?, *tcp.get(3)?]),
        seq: word(4)?,
        ack: word(8)?,
        flags: *tcp.get(13)?,
    })
}

/// A TCP segment (header and payload, checksum filled in) from `from` to `to`.
fn tcp_segment(from: SocketAddrV4, to: SocketAddrV4, seq: u32, ack: u32) -> Vec<u8> {
    let mut segment = Vec::with_capacity(20 + PAYLOAD.len());
    segment.extend_from_slice(&from.port().to_be_bytes());
    segment.extend_from_slice(&to.port().to_be_bytes());
    segment.extend_from_slice(&seq.to_be_bytes());
    segment.extend_from_slice(&ack.to_be_bytes());
    segment.extend_from_slice(&[5 << 4, TCP_FLAG_PSH_ACK]);
    segment.extend_from_slice(&512u16.to_be_bytes());
    segment.extend_from_slice(&[0, 0, 0, 0]);
    segment.extend_from_slice(PAYLOAD);
    let checksum = tcp_checksum(*from.ip(), *to.ip(), &segment);
    segment[16..18].copy_from_slice(&checksum.to_be_bytes());
    segment
}

/// The Internet checksum over the IPv4 pseudo-header and the segment.
fn tcp_checksum(source: Ipv4Addr, destination: Ipv4Addr, segment: &[u8]) -> u16 {
    let length = u16::try_from(segment.len()).unwrap_or(u16::MAX);
    let mut pseudo = Vec::with_capacity(12 + segment.len() + 1);
    pseudo.extend_from_slice(&source.octets());
    pseudo.extend_from_slice(&destination.octets());
    pseudo.extend_from_slice(&[0, 6]);
    pseudo.extend_from_slice(&length.to_be_bytes());
    pseudo.extend_from_slice(segment);
    if pseudo.len() % 2 == 1 {
        pseudo.push(0);
    }
    let mut sum: u32 = pseudo
        .as_chunks::<2>()
        .0
        .iter()
        .map(|pair| u32::from(u16::from_be_bytes(*pair)))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071's example, and a checksum that verifies to zero.
    #[test]
    fn checksums_verify() {
        let from = SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 10), 9000);
        let to = SocketAddrV4::new(Ipv4Addr::new(10, 244, 2, 10), 40000);
        let segment = tcp_segment(from, to, 1, 2);
        assert_eq!(tcp_checksum(*from.ip(), *to.ip(), &segment), 0);
    }
}
