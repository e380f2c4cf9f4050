//! The `netlink` mode, where the iterators cannot load: sock_diag dumps the sockets whose
//! peer is a gone backend, the agent checks each one's socket-ring entry by cookie, and
//! SOCK_DESTROY closes the matches by their exact id (docs/operations.md, "Sockets of
//! removed backends", Modes). Only those sockets are copied out of the kernel.
use std::{
    collections::{HashMap, HashSet},
    io,
    net::IpAddr,
    path::Path,
};

use aya::maps::{Array, MapData, MapError};
use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, SOCK_DESTROY},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};
use socklb_abi::{SocketFrontend, SocketFrontend6, ipv6_words, map_names};

use crate::{
    desired::{Gone, Protocol},
    kernel::pins,
    netlink,
};

/// The socket maps of both families, read to tell sockets socklb translated from all
/// others.
pub struct Netlink {
    ring: Array<MapData, SocketFrontend>,
    ring6: Array<MapData, SocketFrontend6>,
    mask: u32,
}

/// A backend or frontend (address, port), host order; an IPv4-mapped peer as IPv4.
type Endpoint = (IpAddr, u16);

impl Netlink {
    pub fn new(pin_dir: &Path) -> Result<Self, MapError> {
        let data = MapData::from_pin(pins::map_pin(pin_dir, map_names::SOCKETS))?;
        let ring: Array<MapData, SocketFrontend> = Array::try_from(aya::maps::Map::Array(data))?;
        let data = MapData::from_pin(pins::map_pin(pin_dir, map_names::SOCKETS6))?;
        let ring6: Array<MapData, SocketFrontend6> = Array::try_from(aya::maps::Map::Array(data))?;
        // A power of two (see Capacities::socket_slots), the same for both.
        let mask = ring.len().saturating_sub(1);
        Ok(Self { ring, ring6, mask })
    }

    /// Closes the `protocol` sockets of the gone pairs in the calling thread's namespace;
    /// returns how many.
    pub fn sweep(&self, protocol: Protocol, pairs: &[Gone]) -> io::Result<u64> {
        // Backend -> the frontends it left.
        let mut gone: HashMap<Endpoint, HashSet<Endpoint>> = HashMap::new();
        for pair in pairs.iter().filter(|p| p.protocol() == protocol) {
            gone.entry((pair.backend.address, pair.backend.port))
                .or_default()
                .insert((pair.frontend.address, pair.frontend.port));
        }
        if gone.is_empty() {
            return Ok(0);
        }
        // A netlink socket talks to the namespace it was created in.
        let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        let (number, states) = match protocol {
            // A connected UDP socket is in TCP_ESTABLISHED.
            Protocol::Udp => (IPPROTO_UDP, StateFlags::ESTABLISHED),
            // Full sockets only: TIME_WAIT and request sockets cannot be destroyed, and a
            // listener was never translated.
            Protocol::Tcp => (
                IPPROTO_TCP,
                StateFlags::all()
                    - StateFlags::TIME_WAIT
                    - StateFlags::LISTEN
                    - StateFlags::SYN_RECV
                    - StateFlags::CLOSE,
            ),
        };
        let mut closed = 0;
        // IPv6 sockets talk to IPv6 frontends, or to IPv4 ones through IPv4-mapped
        // addresses.
        for family in [AF_INET, AF_INET6] {
            let request = InetRequest {
                family,
                protocol: number,
                extensions: ExtensionFlags::empty(),
                states: states.clone(),
                socket_id: if family == AF_INET {
                    SocketId::new_v4()
                } else {
                    SocketId::new_v6()
                },
            };
            let candidates = dump(&mut socket, request, |id| {
                gone.contains_key(&(peer_of(id.destination_address), id.destination_port))
            })?;
            for (family, id) in candidates {
                if self.translated_to_gone(&id, &gone) && destroy(&mut socket, family, number, id)?
                {
                    closed += 1;
                }
            }
        }
        Ok(closed)
    }

    /// Whether the socket's map entry (in its peer's family's ring) holds its cookie and
    /// names a gone pair.
    fn translated_to_gone(
        &self,
        id: &SocketId,
        gone: &HashMap<Endpoint, HashSet<Endpoint>>,
    ) -> bool {
        let cookie = u64::from(u32::from_ne_bytes([
            id.cookie[0],
            id.cookie[1],
            id.cookie[2],
            id.cookie[3],
        ])) | (u64::from(u32::from_ne_bytes([
            id.cookie[4],
            id.cookie[5],
            id.cookie[6],
            id.cookie[7],
        ])) << 32);
        // Truncating is the point, as in the programs' socket_slot.
        let index = (cookie as u32) & self.mask;
        let peer = peer_of(id.destination_address);
        let port = id.destination_port.to_be();
        let frontend = match peer {
            IpAddr::V4(address) => self.ring.get(&index, 0).ok().and_then(|slot| {
                (slot.cookie == cookie
                    && slot.backend_address == u32::from(address).to_be()
                    && slot.backend_port == port)
                    .then(|| {
                        let octets = u32::from_be(slot.frontend_address);
                        (IpAddr::from(octets.to_be_bytes()), slot.frontend_port)
                    })
            }),
            IpAddr::V6(address) => self.ring6.get(&index, 0).ok().and_then(|slot| {
                (slot.cookie == cookie
                    && slot.backend_address == ipv6_words(address.octets())
                    && slot.backend_port == port)
                    .then(|| {
                        let octets = socklb_abi::ipv6_octets(slot.frontend_address);
                        (IpAddr::from(octets), slot.frontend_port)
                    })
            }),
        };
        frontend.is_some_and(|(address, port)| {
            gone.get(&(peer, id.destination_port))
                .is_some_and(|frontends| frontends.contains(&(address, u16::from_be(port))))
        })
    }
}

/// A socket's peer as socklb's maps name it: an IPv4-mapped address as IPv4.
fn peer_of(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn send(
    socket: &mut Socket,
    flags: u16,
    message_type: Option<u16>,
    request: InetRequest,
) -> io::Result<()> {
    netlink::send(
        socket,
        flags,
        message_type,
        SockDiagMessage::InetRequest(request),
    )
}

/// The sockets of a dump that `keep` selects, with their family.
fn dump(
    socket: &mut Socket,
    request: InetRequest,
    keep: impl Fn(&SocketId) -> bool,
) -> io::Result<Vec<(u8, SocketId)>> {
    send(socket, NLM_F_REQUEST | NLM_F_DUMP, None, request)?;
    let mut kept = Vec::new();
    netlink::receive_dump(socket, "sock_diag dump", |message| {
        if let SockDiagMessage::InetResponse(response) = message
            && keep(&response.header.socket_id)
        {
            kept.push((response.header.family, response.header.socket_id));
        }
    })?;
    Ok(kept)
}

/// SOCK_DESTROY of exactly this socket; false if it went away meanwhile.
fn destroy(socket: &mut Socket, family: u8, protocol: u8, id: SocketId) -> io::Result<bool> {
    let request = InetRequest {
        family,
        protocol,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id: id,
    };
    send(
        socket,
        NLM_F_REQUEST | NLM_F_ACK,
        Some(SOCK_DESTROY),
        request,
    )?;
    let mut buffer = vec![0u8; 4096];
    let size = socket.recv(&mut &mut buffer[..], 0)?;
    let message = NetlinkMessage::<SockDiagMessage>::deserialize(&buffer[..size])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    match message.payload {
        NetlinkPayload::Error(error) => match error.code {
            None => Ok(true),
            Some(code) if -code.get() == libc::ENOENT => Ok(false),
            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
        },
        _ => Ok(true),
    }
}
