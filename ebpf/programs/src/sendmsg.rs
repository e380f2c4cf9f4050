//! sendmsg()/sendto() of unconnected UDP sockets (DNS clients): each datagram to a
//! frontend is sent to a backend.
use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};
use socklb_abi::PROTO_UDP;

use crate::{
    PROCEED,
    context::SockAddr,
    lb::{self, Call, Forward},
};

#[cgroup_sock_addr(sendmsg4)]
pub fn socklb_sendmsg4(ctx: SockAddrContext) -> i32 {
    on_sendmsg(&SockAddr::v4(&ctx))
}

#[cgroup_sock_addr(sendmsg6)]
pub fn socklb_sendmsg6(ctx: SockAddrContext) -> i32 {
    match SockAddr::v4_mapped(&ctx) {
        Some(sock) => on_sendmsg(&sock),
        None => PROCEED,
    }
}

#[inline(always)]
fn on_sendmsg(sock: &SockAddr) -> i32 {
    if lb::served_protocol(sock) != Some(PROTO_UDP) {
        return PROCEED;
    }
    lb::forward_verdict(try_sendmsg(sock))
}

#[inline(always)]
fn try_sendmsg(sock: &SockAddr) -> Result<Forward, lb::Error> {
    lb::translate(sock, PROTO_UDP, Call::SendMsg)
}
