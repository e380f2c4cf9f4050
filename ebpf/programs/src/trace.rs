//! Trace events for `socklb trace`: written to the ring buffer only while a session holds
//! the lease in the control map. With no session the cost is one array lookup and one
//! compare per translation.
//!
//! Events are submitted without waking the reader, which polls: a wakeup per event costs
//! an interrupt of its own (5.6 µs per connect4 in a VM, measured), twenty times the
//! translation.
use core::ptr::addr_of_mut;

use aya_ebpf::{bindings::BPF_RB_NO_WAKEUP, helpers};
use socklb_abi::{
    Ipv6Words, TRACE_FAMILY_V4, TRACE_FAMILY_V6, TRACE_FLAG_PACKETS, TRACE_FLAG_REVERSE,
    TRACE_SOURCE_REVERSE, TraceEvent,
};

use crate::{
    context::SockAddr,
    counters::bump,
    maps::{TRACE, TRACE_CONTROL},
};

/// An address as a decision holds it: by value (socket programs), or by reference to where
/// it already is (TC: IPv6's stack has no room for copies). Events and filters hold 16
/// bytes, IPv4 in the last word.
pub trait Traced: Copy {
    /// `TRACE_FAMILY_*`.
    const FAMILY: u8;
    /// The address of a decision that has none (no backend).
    fn none() -> Self;
    /// Whether a filter address of this family (all zero: any) lets the address through.
    /// The session sets the filter's family with its addresses, so an IPv4 filter's first
    /// three words are zero.
    fn passes(&self, filter: &Ipv6Words) -> bool;
    /// Writes the address word by word (a 16-byte copy may become a wide access).
    ///
    /// # Safety
    /// `to` must be valid for writes.
    unsafe fn write(&self, to: *mut Ipv6Words);
}

/// An address type whose references are [`Traced`] too.
pub trait TracedValue: Traced + 'static {
    fn none_ref() -> &'static Self;
}

impl Traced for u32 {
    const FAMILY: u8 = TRACE_FAMILY_V4;

    #[inline(always)]
    fn none() -> Self {
        0
    }

    #[inline(always)]
    fn passes(&self, filter: &Ipv6Words) -> bool {
        filter[3] == 0 || filter[3] == *self
    }

    #[inline(always)]
    unsafe fn write(&self, to: *mut Ipv6Words) {
        let word = to.cast::<u32>();
        // SAFETY: the caller's pointer; the words stay inside the array.
        unsafe {
            word.write_volatile(0);
            word.add(1).write_volatile(0);
            word.add(2).write_volatile(0);
            word.add(3).write_volatile(*self);
        }
    }
}

impl TracedValue for u32 {
    #[inline(always)]
    fn none_ref() -> &'static Self {
        &0
    }
}

impl Traced for Ipv6Words {
    const FAMILY: u8 = TRACE_FAMILY_V6;

    #[inline(always)]
    fn none() -> Self {
        [0; 4]
    }

    #[inline(always)]
    fn passes(&self, filter: &Ipv6Words) -> bool {
        (filter[0] | filter[1] | filter[2] | filter[3]) == 0
            || (filter[0] == self[0]
                && filter[1] == self[1]
                && filter[2] == self[2]
                && filter[3] == self[3])
    }

    #[inline(always)]
    unsafe fn write(&self, to: *mut Ipv6Words) {
        let word = to.cast::<u32>();
        // SAFETY: as for IPv4.
        unsafe {
            word.write_volatile(self[0]);
            word.add(1).write_volatile(self[1]);
            word.add(2).write_volatile(self[2]);
            word.add(3).write_volatile(self[3]);
        }
    }
}

impl TracedValue for Ipv6Words {
    #[inline(always)]
    fn none_ref() -> &'static Self {
        &[0; 4]
    }
}

impl<T: TracedValue> Traced for &T {
    const FAMILY: u8 = T::FAMILY;

    #[inline(always)]
    fn none() -> Self {
        T::none_ref()
    }

    #[inline(always)]
    fn passes(&self, filter: &Ipv6Words) -> bool {
        (**self).passes(filter)
    }

    #[inline(always)]
    unsafe fn write(&self, to: *mut Ipv6Words) {
        // SAFETY: the caller's pointer.
        unsafe { (**self).write(to) }
    }
}

/// What was decided, as the event records it; the caller's context adds the rest.
#[derive(Clone, Copy)]
pub struct Decision<A> {
    pub source: u8,
    pub reason: u8,
    pub protocol: u8,
    pub service_id: u32,
    pub frontend: (A, u16),
    pub backend: (A, u16),
    /// The source the backend sees of a SNATed flow; none when the flow keeps its client's.
    pub snat: (A, u16),
    pub slot: u16,
    pub count: u16,
}

impl<A: Traced> Decision<A> {
    /// A decision about `frontend`, its backend and reason still to come.
    #[inline(always)]
    pub fn new(source: u8, protocol: u8, frontend: (A, u16)) -> Self {
        Self {
            source,
            reason: 0,
            protocol,
            service_id: 0,
            frontend,
            backend: (A::none(), 0),
            snat: (A::none(), 0),
            slot: 0,
            count: 0,
        }
    }
}

/// Whether a session wants `decision`: the lease is running and the kernel-side filters
/// let it through. `packet`: a packet of a known flow from outside, wanted only on request.
#[inline(always)]
fn wanted<A: Traced>(decision: &Decision<A>, packet: bool) -> bool {
    let Some(control) = TRACE_CONTROL.get(0) else {
        return false;
    };
    if control.until_ns == 0 {
        return false;
    }
    let flag = |flag: u16| control.flags & flag != 0;
    if (decision.source == TRACE_SOURCE_REVERSE && !flag(TRACE_FLAG_REVERSE))
        || (packet && !flag(TRACE_FLAG_PACKETS))
        || (control.family != 0 && control.family != A::FAMILY)
        || !decision.frontend.0.passes(&control.frontend_address)
        || (control.frontend_port != 0 && control.frontend_port != decision.frontend.1)
        || !decision.backend.0.passes(&control.backend_address)
    {
        return false;
    }
    // SAFETY: helper without arguments.
    let now = unsafe { helpers::bpf_ktime_get_ns() };
    now < control.until_ns
}

/// A socket translation (connect, sendmsg) or reverse translation, from the calling task.
#[inline(always)]
pub fn socket<A: Traced>(decision: &Decision<A>, sock: &SockAddr, socket_cookie: u64) {
    if !wanted(decision, false) {
        return;
    }
    let Some(mut entry) = TRACE.reserve(0) else {
        bump(|c| &mut c.trace_lost);
        return;
    };
    // SAFETY: the pointer is the reserved entry, which `fill` writes whole.
    unsafe {
        fill::<A, fn() -> u32>(
            entry.as_mut_ptr(),
            decision,
            Origin::Socket(sock, socket_cookie),
        )
    };
    entry.submit(u64::from(BPF_RB_NO_WAKEUP));
}

/// A packet from outside or from a pod device: `client` is its source, `device` reads the
/// index of the device it arrived on. Called only for an event, as the ring buffer entry is
/// written: the packet path pays nothing for it, and nothing is kept across the helpers
/// but the packet's pointer, which is kept anyway (IPv6's stack has no room for more).
#[inline(always)]
pub fn external<A: Traced>(
    decision: &Decision<A>,
    client: (A, u16),
    packet: bool,
    device: impl FnOnce() -> u32,
) {
    if !wanted(decision, packet) {
        return;
    }
    let Some(mut entry) = TRACE.reserve(0) else {
        bump(|c| &mut c.trace_lost);
        return;
    };
    // SAFETY: the pointer is the reserved entry, which `fill` writes whole.
    unsafe { fill(entry.as_mut_ptr(), decision, Origin::Packet(client, device)) };
    entry.submit(u64::from(BPF_RB_NO_WAKEUP));
}

enum Origin<'a, A, D> {
    Socket(&'a SockAddr<'a>, u64),
    /// The client, and how to read the device's index.
    Packet((A, u16), D),
}

/// Writes every field of the entry, one volatile store each: a struct built on the stack
/// and copied, or zeroed in bulk, becomes a memset or memcpy loop, whose pointer arithmetic
/// the verifier refuses to loaders without CAP_PERFMON.
///
/// # Safety
/// `event` must point to a reserved ring buffer entry of a `TraceEvent`.
#[inline(always)]
unsafe fn fill<A: Traced, D: FnOnce() -> u32>(
    event: *mut TraceEvent,
    decision: &Decision<A>,
    origin: Origin<A, D>,
) {
    let (socket_cookie, netns_cookie, pid, cgroup_id, client, device) = match origin {
        // SAFETY: helpers that read the calling task (cgroup sock_addr programs run in its
        // context).
        Origin::Socket(sock, cookie) => unsafe {
            (
                cookie,
                sock.netns_cookie(),
                (helpers::bpf_get_current_pid_tgid() >> 32) as u32,
                helpers::bpf_get_current_cgroup_id(),
                (A::none(), 0),
                None,
            )
        },
        Origin::Packet(client, device) => (0, 0, 0, 0, client, Some(device)),
    };
    // SAFETY: the caller's pointer; every field pointer stays inside the entry.
    unsafe {
        addr_of_mut!((*event).time_ns).write_volatile(helpers::bpf_ktime_get_ns());
        addr_of_mut!((*event).socket_cookie).write_volatile(socket_cookie);
        addr_of_mut!((*event).netns_cookie).write_volatile(netns_cookie);
        addr_of_mut!((*event).cgroup_id).write_volatile(cgroup_id);
        addr_of_mut!((*event).pid).write_volatile(pid);
        addr_of_mut!((*event).service_id).write_volatile(decision.service_id);
        client.0.write(addr_of_mut!((*event).client_address));
        decision
            .frontend
            .0
            .write(addr_of_mut!((*event).frontend_address));
        decision
            .backend
            .0
            .write(addr_of_mut!((*event).backend_address));
        decision.snat.0.write(addr_of_mut!((*event).snat_address));
        addr_of_mut!((*event).client_port).write_volatile(client.1);
        addr_of_mut!((*event).frontend_port).write_volatile(decision.frontend.1);
        addr_of_mut!((*event).backend_port).write_volatile(decision.backend.1);
        addr_of_mut!((*event).snat_port).write_volatile(decision.snat.1);
        addr_of_mut!((*event).slot).write_volatile(decision.slot);
        addr_of_mut!((*event).count).write_volatile(decision.count);
        addr_of_mut!((*event).protocol).write_volatile(decision.protocol);
        addr_of_mut!((*event).source).write_volatile(decision.source);
        addr_of_mut!((*event).reason).write_volatile(decision.reason);
        addr_of_mut!((*event).family).write_volatile(A::FAMILY);
        // Read last, after the helpers: see `external`.
        addr_of_mut!((*event).ifindex).write_volatile(device.map_or(0, |device| device()));
        addr_of_mut!((*event).pad).write_volatile(0);
    }
}
