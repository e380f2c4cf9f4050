//! connect() of TCP and UDP sockets: the destination frontend becomes a backend before the
//! kernel routes, so the packets on the wire carry the backend's address.
use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};

use crate::{
    PROCEED,
    context::{Inet6, SockAddr},
    socket::{self, Call, Forward},
    socket_family::{Family, V4, V6},
};

#[cgroup_sock_addr(connect4)]
pub fn socklb_connect4(ctx: SockAddrContext) -> i32 {
    on_connect::<V4>(&SockAddr::v4(&ctx))
}

#[cgroup_sock_addr(connect6)]
pub fn socklb_connect6(ctx: SockAddrContext) -> i32 {
    match SockAddr::v6(&ctx) {
        Inet6::V4Mapped(sock) => on_connect::<V4>(&sock),
        Inet6::Native(sock) => on_connect::<V6>(&sock),
    }
}

#[inline(always)]
fn on_connect<F: Family>(sock: &SockAddr) -> i32 {
    let Some(protocol) = socket::served_protocol(sock) else {
        return PROCEED;
    };
    socket::forward_verdict(try_connect::<F>(sock, protocol))
}

#[inline(always)]
fn try_connect<F: Family>(sock: &SockAddr, protocol: u8) -> Result<Forward, socket::Error> {
    socket::translate::<F>(sock, protocol, Call::Connect)
}
