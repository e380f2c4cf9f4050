//! The programs' diagnostics (aya-log), off unless the agent runs with `--bpf-log-level`:
//! one out-of-line function per logged failure.
//!
//! Out of line because the log macro spills pointers to its arguments on the stack; inlined
//! into a hook, the compiler reuses those stack slots for smaller values afterwards, which
//! the verifier refuses from a loader without CAP_PERFMON ("attempt to corrupt spilled
//! pointer on stack"). Each function checks the level, a read-only global the verifier
//! knows: with logging off it removes the body at load, and what is left on a failure path
//! is a call that returns at once. Arguments are host-order numbers.
use aya_log_ebpf::{
    macro_support::{Argument, IpFormatter},
    warn,
};

/// The socket path's target (`socket`), under the name operators know it by.
const LB: &str = "socklb::lb";
const EXTERNAL: &str = "socklb::external";

#[inline(never)]
pub fn missing_slots(address: u32, port: u16, count: u16) {
    warn!(
        &(),
        target: LB,
        "frontend {:i}:{} lists {} backends but the slots drawn are missing: proceeding \
         untranslated",
        address,
        port,
        count
    );
}

/// [`missing_slots`] of an IPv6 frontend (its address is left out: one fewer argument
/// than the five a BPF call passes in registers).
#[inline(never)]
pub fn missing_slots6(port: u16, count: u16) {
    warn!(
        &(),
        target: LB,
        "IPv6 frontend on port {} lists {} backends but the slots drawn are missing: \
         proceeding untranslated",
        port,
        count
    );
}

#[inline(never)]
pub fn affinity_not_written(error: i32) {
    warn!(
        &(),
        target: LB,
        "session-affinity entry not written (error {}): the draw stands",
        error
    );
}

#[inline(never)]
pub fn reverse_not_written(error: i32) {
    warn!(
        &(),
        target: LB,
        "reverse entry of an unconnected UDP socket not written (error {}): its replies show \
         the backend's address",
        error
    );
}

#[inline(never)]
pub fn external_missing_slot(address: u32, port: u16, count: u32, slot: u16) {
    warn!(
        &(),
        target: EXTERNAL,
        "external frontend {:i}:{} lists {} backends but slot {} is missing: passed untranslated",
        address,
        port,
        count,
        slot
    );
}

#[inline(never)]
pub fn external_affinity_not_written(error: i32) {
    warn!(
        &(),
        target: EXTERNAL,
        "session-affinity entry of a flow from outside not written (error {}): passed \
         untranslated",
        error
    );
}

#[inline(never)]
pub fn conntrack_not_written(error: i32) {
    warn!(
        &(),
        target: EXTERNAL,
        "conntrack entry of a new flow not written (error {}): passed untranslated",
        error
    );
}

#[inline(never)]
pub fn conntrack_not_confirmed(error: i32) {
    warn!(
        &(),
        target: EXTERNAL,
        "conntrack: a confirmed flow not moved to the main table (error {}); retried by its \
         next packet",
        error
    );
}

#[inline(never)]
pub fn no_snat_address() {
    warn!(
        &(),
        target: EXTERNAL,
        "no SNAT address for a flow to a backend on another node: passed untranslated"
    );
}

/// `source`: an IPv4 address (`u32`) or an IPv6 one (`[u8; 16]`); one function of each.
#[inline(never)]
pub fn rewrite_failed<A: IpFormatter + Argument>(source: A) {
    warn!(
        &(),
        target: EXTERNAL,
        "packet from {:i} dropped: a helper failed after it was partly rewritten",
        source
    );
}

#[inline(never)]
pub fn external_missing_slot6(address: [u8; 16], port: u16, count: u32, slot: u16) {
    warn!(
        &(),
        target: EXTERNAL,
        "external frontend [{:i}]:{} lists {} backends but slot {} is missing: passed \
         untranslated",
        address,
        port,
        count,
        slot
    );
}
