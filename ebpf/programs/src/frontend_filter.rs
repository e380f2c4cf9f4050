//! The frontend filter (socklb-abi `frontend_filter_slot`): before its service map lookup,
//! a packet of no translated flow asks whether its destination can be a frontend at all.
//! A packet to anything else (most of a pod's traffic) then costs two reads of a small
//! array instead of a lookup in a map that grows with the cluster. The agent marks the
//! slots; the programs only read them.
use socklb_abi::{FRONTEND_FILTER_READY, frontend_filter_slot};

use crate::{
    maps::FRONTEND_FILTER,
    packet::{Address, Tuple},
};

/// Whether the packet may be addressed to a frontend of any scope. Also while the filter
/// is not ready: the agent has not yet marked every frontend it programmed.
///
/// Out of line, reading through its argument's pointer, as the flow filter's functions
/// are: its slot arithmetic lives in a frame of its own, walked once per call.
#[inline(never)]
pub fn may_be_frontend<A: Address>(tuple: &Tuple<A>) -> bool {
    frontend_marked(tuple)
}

/// [`may_be_frontend`] in line, for a caller whose stack and paths allow it.
#[inline(always)]
pub fn frontend_marked<A: Address>(tuple: &Tuple<A>) -> bool {
    let slot = frontend_filter_slot(
        tuple.destination.folded(),
        tuple.destination_port,
        tuple.protocol,
    );
    let ready = FRONTEND_FILTER
        .get(FRONTEND_FILTER_READY)
        .is_some_and(|ready| *ready != 0);
    !ready
        || FRONTEND_FILTER
            .get(slot.word)
            .is_none_or(|word| *word & slot.bit != 0)
}
