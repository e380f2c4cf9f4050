//! Asking the kernel over netlink: one request, then the messages of its answer (a dump
//! ends with `NLMSG_DONE`, an error with its errno; another request has one message). The
//! sock_diag sweep, the listing of links and the namespace ids share it.
use std::{fmt::Debug, io};

use netlink_packet_core::{
    ErrorMessage, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable,
};
use netlink_sys::Socket;

/// Sends `payload` with `flags` (and `message_type` instead of the payload's own, if
/// given).
pub fn send<T: NetlinkSerializable + Debug>(
    socket: &mut Socket,
    flags: u16,
    message_type: Option<u16>,
    payload: T,
) -> io::Result<()> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload));
    packet.finalize();
    if let Some(message_type) = message_type {
        packet.header.message_type = message_type;
    }
    let mut buffer = vec![0; packet.buffer_len()];
    packet.serialize(&mut buffer);
    socket.send(&buffer, 0)?;
    Ok(())
}

/// Hands every message of a dump's answer to `each`, until `NLMSG_DONE`; an error message
/// ends it with its errno (`what` names the dump when there is none).
pub fn receive_dump<T: NetlinkDeserializable + Debug>(
    socket: &mut Socket,
    what: &str,
    mut each: impl FnMut(T),
) -> io::Result<()> {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let size = socket.recv(&mut &mut buffer[..], 0)?;
        let mut offset = 0;
        while offset < size {
            let message = NetlinkMessage::<T>::deserialize(&buffer[offset..size])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::InnerMessage(inner) => each(inner),
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(error) => return Err(failed(&error, what)),
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
}

/// The one message answering a request that is not a dump, or its error.
pub fn receive_one<T: NetlinkDeserializable + Debug>(
    socket: &mut Socket,
    what: &str,
) -> io::Result<T> {
    let mut buffer = vec![0u8; 64 * 1024];
    let size = socket.recv(&mut &mut buffer[..], 0)?;
    let message = NetlinkMessage::<T>::deserialize(&buffer[..size])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    match message.payload {
        NetlinkPayload::InnerMessage(inner) => Ok(inner),
        NetlinkPayload::Error(error) => Err(failed(&error, what)),
        _ => Err(io::Error::other(format!("{what}: no answer"))),
    }
}

/// An error message's errno, or `what` failed.
fn failed(error: &ErrorMessage, what: &str) -> io::Error {
    error.code.map_or_else(
        || io::Error::other(format!("{what} failed")),
        |code| io::Error::from_raw_os_error(-code.get()),
    )
}
