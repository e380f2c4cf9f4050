//! Raw sockets and the socket options std does not offer, for tests that forge packets,
//! watch what arrives, or send what std's sockets cannot (no UDP checksum, extension
//! headers, a hop limit): each libc call wrapped once, here.
use std::{
    io,
    net::IpAddr,
    os::fd::{AsRawFd, FromRawFd as _, OwnedFd},
    time::Duration,
};

use crate::interrupted::uninterrupted;

/// A raw socket of `domain` (`AF_INET`, `AF_INET6`) for `protocol` in the calling thread's
/// network namespace; `IPPROTO_RAW` sends packets that carry their own IP header.
pub fn open(domain: libc::c_int, protocol: libc::c_int) -> OwnedFd {
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(domain, libc::SOCK_RAW, protocol) };
    assert!(
        fd >= 0,
        "raw socket: {} (needs CAP_NET_RAW)",
        io::Error::last_os_error()
    );
    // SAFETY: a descriptor we just opened and nobody else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Sets option `name` of `level` on `socket` to `value`, passed by its size.
pub fn set_option<T>(
    socket: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    let size = libc::socklen_t::try_from(size_of::<T>()).expect("an option's size");
    // SAFETY: a pointer to `value` and its size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(value).cast(),
            size,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Makes receives on `socket` give up after `wait` (`SO_RCVTIMEO`).
pub fn set_receive_timeout(socket: &impl AsRawFd, wait: Duration) -> io::Result<()> {
    let timeout = libc::timeval {
        tv_sec: libc::time_t::try_from(wait.as_secs()).unwrap_or(1),
        tv_usec: libc::suseconds_t::from(wait.subsec_micros()),
    };
    set_option(socket, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &timeout)
}

/// Sends `packet` on raw `socket` to `to` (raw IP sockets take no port); the bytes sent.
pub fn send_to(socket: &impl AsRawFd, packet: &[u8], to: IpAddr) -> io::Result<usize> {
    let sent = match to {
        IpAddr::V4(address) => {
            let to = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from(address).to_be(),
                },
                sin_zero: [0; 8],
            };
            send_to_address(socket, packet, &to)
        }
        IpAddr::V6(address) => {
            let to = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: 0,
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: address.octets(),
                },
                sin6_scope_id: 0,
            };
            send_to_address(socket, packet, &to)
        }
    };
    usize::try_from(sent).map_err(|_| io::Error::last_os_error())
}

/// sendto(2) with a socket address of type `A` (sockaddr_in or sockaddr_in6).
fn send_to_address<A>(socket: &impl AsRawFd, packet: &[u8], to: &A) -> isize {
    let size = libc::socklen_t::try_from(size_of::<A>()).expect("an address's size");
    // SAFETY: a buffer and a socket address of the sizes passed.
    unsafe {
        libc::sendto(
            socket.as_raw_fd(),
            packet.as_ptr().cast(),
            packet.len(),
            0,
            std::ptr::from_ref(to).cast(),
            size,
        )
    }
}

/// Receives the next packet on `socket` into `buffer` (with recv(2)'s `flags`, e.g.
/// `MSG_DONTWAIT`): its length. A receive a signal interrupted is made again
/// ([`uninterrupted`]).
pub fn receive(socket: &impl AsRawFd, buffer: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    uninterrupted(|| {
        // SAFETY: a buffer we own, of the length passed.
        let len = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                flags,
            )
        };
        usize::try_from(len).map_err(|_| io::Error::last_os_error())
    })
}
