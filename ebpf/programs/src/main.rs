//! socklb's kernel programs: socket-level service translation at the cgroup hooks, for
//! IPv4 and IPv6 sockets (an IPv4-mapped address takes the IPv4 maps), and packet-level
//! translation at TC for traffic from outside the node and from pods the socket hooks
//! leave alone.
//!
//! Every hook is a thin entry that calls a `try_*` function; an error lets the operation
//! proceed untranslated (the safe verdict for a socket hook) and is counted. One concern
//! per module: docs/architecture.md has the table of them.
#![no_std]
#![no_main]
// The raw kfunc call of `destroy` (see there).
#![feature(asm_experimental_arch)]

mod backend;
mod connect;
mod conntrack;
mod context;
mod counters;
mod deliver;
mod destroy;
mod family;
mod fast;
mod flow;
mod flow_filter;
mod frontend_filter;
mod getpeername;
mod icmp;
mod log;
mod maps;
mod nat;
mod packet;
mod record;
mod recvmsg;
mod reject;
mod release;
mod sendmsg;
mod side;
mod socket;
mod socket_family;
mod tc;
mod trace;

/// Verdicts of cgroup sock_addr programs.
const PROCEED: i32 = 1;
const REJECT: i32 = 0;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // No reachable panic is left in the programs; the verifier rejects any that is.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
