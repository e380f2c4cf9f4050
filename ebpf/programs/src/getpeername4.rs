//! getpeername() of a translated socket returns the frontend, as with kube-proxy's DNAT.
use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};

use crate::{PROCEED, context::SockAddr, counters::bump, lb};

#[cgroup_sock_addr(getpeername4)]
pub fn socklb_getpeername4(ctx: SockAddrContext) -> i32 {
    if lb::reverse(&SockAddr::new(&ctx)) {
        bump(|c| &mut c.reverse_translated);
    }
    PROCEED
}
