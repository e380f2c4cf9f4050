//! The flow filter (socklb-abi `flow_filter_destination`): before its conntrack lookups, a
//! packet asks whether its flow can have an entry at all. A packet of no translated flow
//! (most of a pod's traffic) then costs two reads of a small array instead of two lookups
//! in tables whose buckets are rarely in cache. Slots are marked before a new flow's packet
//! goes on; the programs never clear one (the agent rebuilds the filter at each start).
//!
//! The `may_*` functions and [`mark`] are out of line and read what they need through their
//! arguments' pointers: their slot arithmetic and lookup keys then live in a frame of their
//! own (IPv6's path has no stack to spare), and the verifier walks their few paths once per
//! call, not the caller's path after each. The `*_marked` ones and [`mark_here`] are in
//! line, for IPv4's paths: each subprogram's JIT code is an image of its own, rarely in
//! cache when a packet calls it. [`mark_unconfirmed`] stays out of line: few of a pod's
//! flows need it.
use socklb_abi::{
    CtEntry, FLOW_FILTER_READY, FilterSlot, flow_filter_destination, flow_filter_source,
    flow_filter_unconfirmed,
};

use crate::{
    maps::FLOW_FILTER,
    packet::{Address, Tuple},
};

/// Whether conntrack may hold a forward entry for this packet (addressed to a frontend a
/// flow was made for). Also while the filter is not ready: the agent has not yet marked the
/// entries that predate it.
#[inline(never)]
pub fn may_have_forward<A: Address>(tuple: &Tuple<A>) -> bool {
    forward_marked(tuple)
}

/// [`may_have_forward`] in line, for a caller whose stack and paths allow it.
#[inline(always)]
pub fn forward_marked<A: Address>(tuple: &Tuple<A>) -> bool {
    marked(flow_filter_destination(
        tuple.destination.folded(),
        tuple.destination_port,
        tuple.protocol,
    ))
}

/// Whether conntrack may hold a reply entry for this packet (sent by a backend a flow was
/// sent to).
#[inline(never)]
pub fn may_have_reply<A: Address>(tuple: &Tuple<A>) -> bool {
    reply_marked(tuple)
}

/// [`may_have_reply`] in line, for a caller whose stack and paths allow it.
#[inline(always)]
pub fn reply_marked<A: Address>(tuple: &Tuple<A>) -> bool {
    marked(flow_filter_source(
        tuple.source.folded(),
        tuple.source_port,
        tuple.protocol,
    ))
}

/// Whether the unconfirmed table may hold a forward entry for this packet (addressed to a
/// frontend a flow was made there for). A pod's flows are made in the main table unless
/// SNATed or another flow holds their reply key, so its first packet mostly skips the
/// lookup there.
#[inline(never)]
pub fn may_be_unconfirmed<A: Address>(tuple: &Tuple<A>) -> bool {
    unconfirmed_marked(tuple)
}

/// [`may_be_unconfirmed`] in line.
#[inline(always)]
pub fn unconfirmed_marked<A: Address>(tuple: &Tuple<A>) -> bool {
    marked(flow_filter_unconfirmed(
        tuple.destination.folded(),
        tuple.destination_port,
        tuple.protocol,
    ))
}

/// Marks the frontend of a flow made in the unconfirmed table (`arrived` is the packet that
/// makes it): before its entries are written, so that no packet of the flow can miss them
/// there, and again once they are, as the agent's rebuild (`seed`) may have cleared the
/// slot in between and walked the table before they were in it. Out of line: a pod's flow
/// rarely comes here.
#[inline(never)]
pub fn mark_unconfirmed<A: Address>(arrived: &Tuple<A>) {
    set(flow_filter_unconfirmed(
        arrived.destination.folded(),
        arrived.destination_port,
        arrived.protocol,
    ));
}

/// Marks the slots of a new flow: its frontend (what the packet that made it was addressed
/// to) and its backend (`forward`'s destination), whose answers the reply entry translates.
#[inline(never)]
pub fn mark<A: Address>(arrived: &Tuple<A>, forward: &CtEntry<A>) {
    mark_here(arrived, forward);
}

/// [`mark`] in line.
#[inline(always)]
pub fn mark_here<A: Address>(arrived: &Tuple<A>, forward: &CtEntry<A>) {
    set(flow_filter_destination(
        arrived.destination.folded(),
        arrived.destination_port,
        arrived.protocol,
    ));
    set(flow_filter_source(
        forward.destination.folded(),
        forward.destination_port,
        arrived.protocol,
    ));
}

/// Written only when unmarked (a store to a word every CPU reads would bounce its cache
/// line), and by an atomic OR: other CPUs, and the agent, mark other bits of the word
/// meanwhile.
#[inline(always)]
fn set(slot: FilterSlot) {
    let Some(word) = FLOW_FILTER.get_ptr_mut(slot.word) else {
        return;
    };
    // SAFETY: pointer from a successful lookup, valid for this run, 8-byte aligned (an
    // array's entries are). The target has no atomic OR in Rust's `core` (it lacks
    // compare-and-swap), so the instruction is written out: BPF_ATOMIC | BPF_OR, which
    // every kernel since 5.12 runs.
    unsafe {
        if core::ptr::read_volatile(word) & slot.bit == 0 {
            core::arch::asm!(
                "lock *(u64 *)({word} + 0) |= {bit}",
                word = in(reg) word,
                bit = in(reg) slot.bit,
            );
        }
    }
}

#[inline(always)]
fn marked(slot: FilterSlot) -> bool {
    let ready = FLOW_FILTER
        .get(FLOW_FILTER_READY)
        .is_some_and(|ready| *ready != 0);
    !ready
        || FLOW_FILTER
            .get(slot.word)
            .is_none_or(|word| *word & slot.bit != 0)
}
