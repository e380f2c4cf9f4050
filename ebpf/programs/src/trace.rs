//! Trace events for `socklb trace`: written to the ring buffer only while a session holds
//! the lease in the control map. With no session the cost is one array lookup and one
//! compare per translation.
//!
//! Events are submitted without waking the reader, which polls: a wakeup per event costs
//! an interrupt of its own (5.6 µs per connect4 in a VM, measured), twenty times the
//! translation.
use core::ptr::addr_of_mut;

use aya_ebpf::{bindings::BPF_RB_NO_WAKEUP, helpers};
use socklb_abi::{TRACE_FLAG_PACKETS, TRACE_FLAG_REVERSE, TRACE_SOURCE_REVERSE, TraceEvent};

use crate::{
    context::SockAddr,
    counters::bump,
    maps::{TRACE, TRACE_CONTROL},
};

/// What was decided, as the event records it; the caller's context adds the rest. Events
/// hold IPv4 addresses (`A = u32`); `lb` builds the same decision for IPv6, which its
/// family does not send.
#[derive(Clone, Copy, Default)]
pub struct Decision<A = u32> {
    pub source: u8,
    pub reason: u8,
    pub protocol: u8,
    pub service_id: u32,
    pub frontend: (A, u16),
    pub backend: (A, u16),
    pub slot: u16,
    pub count: u16,
}

/// Whether a session wants `decision`: the lease is running and the kernel-side filters
/// let it through. `packet`: a packet of a known flow from outside, wanted only on request.
#[inline(always)]
fn wanted(decision: &Decision, packet: bool) -> bool {
    let Some(control) = TRACE_CONTROL.get(0) else {
        return false;
    };
    if control.until_ns == 0 {
        return false;
    }
    let flag = |flag: u16| control.flags & flag != 0;
    if (decision.source == TRACE_SOURCE_REVERSE && !flag(TRACE_FLAG_REVERSE))
        || (packet && !flag(TRACE_FLAG_PACKETS))
        || (control.frontend_address != 0 && control.frontend_address != decision.frontend.0)
        || (control.frontend_port != 0 && control.frontend_port != decision.frontend.1)
        || (control.backend_address != 0 && control.backend_address != decision.backend.0)
    {
        return false;
    }
    // SAFETY: helper without arguments.
    let now = unsafe { helpers::bpf_ktime_get_ns() };
    now < control.until_ns
}

/// A socket translation (connect, sendmsg) or reverse translation, from the calling task.
#[inline(always)]
pub fn socket(decision: &Decision, sock: &SockAddr, socket_cookie: u64) {
    if !wanted(decision, false) {
        return;
    }
    let Some(mut entry) = TRACE.reserve(0) else {
        bump(|c| &mut c.trace_lost);
        return;
    };
    // SAFETY: the pointer is the reserved entry, which `fill` writes whole.
    unsafe {
        fill(
            entry.as_mut_ptr(),
            decision,
            Origin::Socket(sock, socket_cookie),
        )
    };
    entry.submit(u64::from(BPF_RB_NO_WAKEUP));
}

/// A packet from outside: `client` is its source.
#[inline(always)]
pub fn external(decision: &Decision, client: (u32, u16), packet: bool) {
    if !wanted(decision, packet) {
        return;
    }
    let Some(mut entry) = TRACE.reserve(0) else {
        bump(|c| &mut c.trace_lost);
        return;
    };
    // SAFETY: the pointer is the reserved entry, which `fill` writes whole.
    unsafe { fill(entry.as_mut_ptr(), decision, Origin::External(client)) };
    entry.submit(u64::from(BPF_RB_NO_WAKEUP));
}

enum Origin<'a> {
    Socket(&'a SockAddr<'a>, u64),
    External((u32, u16)),
}

/// Writes every field of the entry, one volatile store each: a struct built on the stack
/// and copied, or zeroed in bulk, becomes a memset or memcpy loop, whose pointer arithmetic
/// the verifier refuses to loaders without CAP_PERFMON.
///
/// # Safety
/// `event` must point to a reserved ring buffer entry of a `TraceEvent`.
#[inline(always)]
unsafe fn fill(event: *mut TraceEvent, decision: &Decision, origin: Origin) {
    let (socket_cookie, netns_cookie, pid, cgroup_id, client) = match origin {
        // SAFETY: helpers that read the calling task (cgroup sock_addr programs run in its
        // context).
        Origin::Socket(sock, cookie) => unsafe {
            (
                cookie,
                sock.netns_cookie(),
                (helpers::bpf_get_current_pid_tgid() >> 32) as u32,
                helpers::bpf_get_current_cgroup_id(),
                (0, 0),
            )
        },
        Origin::External(client) => (0, 0, 0, 0, client),
    };
    // SAFETY: the caller's pointer; every field pointer stays inside the entry.
    unsafe {
        addr_of_mut!((*event).time_ns).write_volatile(helpers::bpf_ktime_get_ns());
        addr_of_mut!((*event).socket_cookie).write_volatile(socket_cookie);
        addr_of_mut!((*event).netns_cookie).write_volatile(netns_cookie);
        addr_of_mut!((*event).cgroup_id).write_volatile(cgroup_id);
        addr_of_mut!((*event).pid).write_volatile(pid);
        addr_of_mut!((*event).service_id).write_volatile(decision.service_id);
        addr_of_mut!((*event).client_address).write_volatile(client.0);
        addr_of_mut!((*event).frontend_address).write_volatile(decision.frontend.0);
        addr_of_mut!((*event).backend_address).write_volatile(decision.backend.0);
        addr_of_mut!((*event).client_port).write_volatile(client.1);
        addr_of_mut!((*event).frontend_port).write_volatile(decision.frontend.1);
        addr_of_mut!((*event).backend_port).write_volatile(decision.backend.1);
        addr_of_mut!((*event).slot).write_volatile(decision.slot);
        addr_of_mut!((*event).count).write_volatile(decision.count);
        addr_of_mut!((*event).protocol).write_volatile(decision.protocol);
        addr_of_mut!((*event).source).write_volatile(decision.source);
        addr_of_mut!((*event).reason).write_volatile(decision.reason);
        addr_of_mut!((*event).pad).write_volatile(0);
        addr_of_mut!((*event).pad2).write_volatile(0);
        addr_of_mut!((*event).pad3).write_volatile(0);
    }
}
