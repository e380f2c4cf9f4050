//! The `netlink` mode, for kernels without the `bpf_sock_destroy` kfunc or agents without
//! CAP_PERFMON to load the iterators: sock_diag dumps the connected sockets of the calling
//! thread's namespace whose peer is a gone backend, the agent checks each one's socket-map
//! entry (by cookie) as the iterators do, and SOCK_DESTROY closes the matches by their exact
//! id, cookie included (CONFIG_INET_DIAG_DESTROY; CAP_NET_ADMIN). It copies every candidate
//! socket out of the kernel, so it costs more than the iterators, but only sockets whose
//! peer is a gone backend are candidates.
use std::{
    collections::{HashMap, HashSet},
    io,
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use aya::maps::{Array, MapData, MapError};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_sock_diag::{
    SockDiagMessage,
    constants::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, SOCK_DESTROY},
    inet::{ExtensionFlags, InetRequest, SocketId, StateFlags},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};
use socklb_abi::{SocketFrontend, map_names};

use crate::dataplane::{Gone, Protocol};

/// The socket map, read to tell sockets socklb translated from all others.
pub struct Netlink {
    ring: Array<MapData, SocketFrontend>,
    mask: u32,
}

/// A backend (address, port), host order.
type Backend = (Ipv4Addr, u16);

impl Netlink {
    pub fn new(pin_dir: &Path) -> Result<Self, MapError> {
        let data = MapData::from_pin(pin_dir.join(map_names::SOCKETS))?;
        let ring: Array<MapData, SocketFrontend> = Array::try_from(aya::maps::Map::Array(data))?;
        // A power of two (see Capacities::socket_slots).
        let mask = ring.len().saturating_sub(1);
        Ok(Self { ring, mask })
    }

    /// Closes the `protocol` sockets of the gone pairs in the calling thread's namespace;
    /// returns how many.
    pub fn sweep(&self, protocol: Protocol, pairs: &[Gone]) -> io::Result<u64> {
        // Backend -> the frontends it left (network order, as in the socket map).
        let mut gone: HashMap<Backend, HashSet<(u32, u16)>> = HashMap::new();
        for pair in pairs.iter().filter(|p| p.protocol() == protocol) {
            // IPv6 pairs are not swept yet.
            let (IpAddr::V4(frontend), IpAddr::V4(backend)) =
                (pair.frontend.address, pair.backend.address)
            else {
                continue;
            };
            gone.entry((backend, pair.backend.port))
                .or_default()
                .insert((u32::from(frontend).to_be(), pair.frontend.port.to_be()));
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
        // IPv6 sockets talk to IPv4 frontends through IPv4-mapped addresses.
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
                backend_of(&id.destination_address)
                    .is_some_and(|address| gone.contains_key(&(address, id.destination_port)))
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

    /// Whether the socket's map entry holds its cookie and names a gone pair.
    fn translated_to_gone(
        &self,
        id: &SocketId,
        gone: &HashMap<Backend, HashSet<(u32, u16)>>,
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
        let Ok(slot) = self.ring.get(&((cookie as u32) & self.mask), 0) else {
            return false;
        };
        let Some(address) = backend_of(&id.destination_address) else {
            return false;
        };
        slot.cookie == cookie
            && slot.backend_address == u32::from(address).to_be()
            && slot.backend_port == id.destination_port.to_be()
            && gone
                .get(&(address, id.destination_port))
                .is_some_and(|frontends| {
                    frontends.contains(&(slot.frontend_address, slot.frontend_port))
                })
    }
}

/// The IPv4 address of a peer (IPv4-mapped for an IPv6 socket).
fn backend_of(address: &IpAddr) -> Option<Ipv4Addr> {
    match address {
        IpAddr::V4(v4) => Some(*v4),
        IpAddr::V6(v6) => v6.to_ipv4_mapped(),
    }
}

fn send(
    socket: &mut Socket,
    flags: u16,
    message_type: Option<u16>,
    request: InetRequest,
) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
    packet.finalize();
    if let Some(message_type) = message_type {
        packet.header.message_type = message_type;
    }
    let mut buffer = vec![0; packet.buffer_len()];
    packet.serialize(&mut buffer);
    socket.send(&buffer, 0)?;
    Ok(())
}

/// The sockets of a dump that `keep` selects, with their family.
fn dump(
    socket: &mut Socket,
    request: InetRequest,
    keep: impl Fn(&SocketId) -> bool,
) -> io::Result<Vec<(u8, SocketId)>> {
    send(socket, NLM_F_REQUEST | NLM_F_DUMP, None, request)?;
    let mut kept = Vec::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let size = socket.recv(&mut &mut buffer[..], 0)?;
        let mut offset = 0;
        while offset < size {
            let message = NetlinkMessage::<SockDiagMessage>::deserialize(&buffer[offset..size])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(response)) => {
                    if keep(&response.header.socket_id) {
                        kept.push((response.header.family, response.header.socket_id));
                    }
                }
                NetlinkPayload::Done(_) => return Ok(kept),
                NetlinkPayload::Error(error) => {
                    return Err(error.code.map_or_else(
                        || io::Error::other("sock_diag dump failed"),
                        |code| io::Error::from_raw_os_error(-code.get()),
                    ));
                }
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
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
