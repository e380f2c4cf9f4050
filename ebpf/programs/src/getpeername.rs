//! getpeername() of a translated socket returns the frontend, as with kube-proxy's DNAT.
use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};

use crate::{
    context::{Inet6, SockAddr},
    socket,
    socket_family::{V4, V6},
};

#[cgroup_sock_addr(getpeername4)]
pub fn socklb_getpeername4(ctx: SockAddrContext) -> i32 {
    socket::reverse_verdict::<V4>(&SockAddr::v4(&ctx))
}

#[cgroup_sock_addr(getpeername6)]
pub fn socklb_getpeername6(ctx: SockAddrContext) -> i32 {
    match SockAddr::v6(&ctx) {
        Inet6::V4Mapped(sock) => socket::reverse_verdict::<V4>(&sock),
        Inet6::Native(sock) => socket::reverse_verdict::<V6>(&sock),
    }
}
