//! sock_release of every socket in the served cgroup: a socket that holds a record leaves
//! the count of records, so that the bound counts live sockets only.
use aya_ebpf::{macros::cgroup_sock, programs::SockContext};

use crate::record;

/// Verdict of a cgroup sock program (the release goes on either way).
const ALLOW: i32 = 1;

#[cgroup_sock(sock_release)]
pub fn socklb_sock_release(ctx: SockContext) -> i32 {
    record::forget(ctx.sock.cast());
    ALLOW
}
