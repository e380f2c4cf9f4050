//! getpeername() of a translated socket returns the frontend, as with kube-proxy's DNAT.
use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};

use crate::{PROCEED, context::SockAddr, lb};

#[cgroup_sock_addr(getpeername4)]
pub fn socklb_getpeername4(ctx: SockAddrContext) -> i32 {
    lb::reverse_verdict(&SockAddr::v4(&ctx))
}

#[cgroup_sock_addr(getpeername6)]
pub fn socklb_getpeername6(ctx: SockAddrContext) -> i32 {
    match SockAddr::v4_mapped(&ctx) {
        Some(sock) => lb::reverse_verdict(&sock),
        None => PROCEED,
    }
}
