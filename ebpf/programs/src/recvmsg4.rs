//! recvmsg()/recvfrom() of UDP sockets: a reply from a backend appears to come from the
//! frontend the socket sent to.
use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};

use crate::{PROCEED, context::SockAddr, counters::bump, lb};

#[cgroup_sock_addr(recvmsg4)]
pub fn socklb_recvmsg4(ctx: SockAddrContext) -> i32 {
    if lb::reverse(&SockAddr::new(&ctx)) {
        bump(|c| &mut c.reverse_translated);
    }
    // recvmsg4 programs must always allow.
    PROCEED
}
