//! sendmsg()/sendto() of unconnected UDP sockets (DNS clients): each datagram to a
//! frontend is sent to a backend.
use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};
use socklb_abi::PROTO_UDP;

use crate::{
    PROCEED,
    context::{Inet6, SockAddr},
    socket::{self, Call, Forward},
    socket_family::{Family, V4, V6},
};

#[cgroup_sock_addr(sendmsg4)]
pub fn socklb_sendmsg4(ctx: SockAddrContext) -> i32 {
    on_sendmsg::<V4>(&SockAddr::v4(&ctx))
}

#[cgroup_sock_addr(sendmsg6)]
pub fn socklb_sendmsg6(ctx: SockAddrContext) -> i32 {
    match SockAddr::v6(&ctx) {
        Inet6::V4Mapped(sock) => on_sendmsg::<V4>(&sock),
        Inet6::Native(sock) => on_sendmsg::<V6>(&sock),
    }
}

#[inline(always)]
fn on_sendmsg<F: Family>(sock: &SockAddr) -> i32 {
    if socket::served_protocol(sock) != Some(PROTO_UDP) {
        return PROCEED;
    }
    socket::forward_verdict(try_sendmsg::<F>(sock))
}

#[inline(always)]
fn try_sendmsg<F: Family>(sock: &SockAddr) -> Result<Forward, socket::Error> {
    socket::translate::<F>(sock, PROTO_UDP, Call::SendMsg)
}
