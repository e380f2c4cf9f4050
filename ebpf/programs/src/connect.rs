//! connect() of TCP and UDP sockets: the destination frontend becomes a backend before the
//! kernel routes, so the packets on the wire carry the backend's address.
use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};

use crate::{
    PROCEED,
    context::SockAddr,
    lb::{self, Call, Forward},
};

#[cgroup_sock_addr(connect4)]
pub fn socklb_connect4(ctx: SockAddrContext) -> i32 {
    on_connect(&SockAddr::v4(&ctx))
}

#[cgroup_sock_addr(connect6)]
pub fn socklb_connect6(ctx: SockAddrContext) -> i32 {
    match SockAddr::v4_mapped(&ctx) {
        Some(sock) => on_connect(&sock),
        None => PROCEED,
    }
}

#[inline(always)]
fn on_connect(sock: &SockAddr) -> i32 {
    let Some(protocol) = lb::served_protocol(sock) else {
        return PROCEED;
    };
    lb::forward_verdict(try_connect(sock, protocol))
}

#[inline(always)]
fn try_connect(sock: &SockAddr, protocol: u8) -> Result<Forward, lb::Error> {
    lb::translate(sock, protocol, Call::Connect)
}
