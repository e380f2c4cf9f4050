//! The fast path of the TC programs: the packets most traffic is, handled in a few cache
//! lines of code. The full path (`flow`) holds both families, new flows, SNAT, ICMP errors
//! and refusals in over 80 KB of JIT code; a node runs its whole network stack between two
//! packets of a connection, so the lines a packet needs there are rarely still in cache.
//!
//! For an IPv4 packet without options or fragments:
//! - the screens ([`screen_ingress4`], [`egress_passes4`]) run in line in the programs'
//!   entries, before any call: a packet of no translated flow, to no frontend, passes
//!   there. Each packet of a flow between two pods of the node also crosses the other
//!   pod's device, where it is such a packet (the server's answer at ingress, the client's
//!   packet on its way in at egress): about half the runs in `bench pod`. So does the first
//!   packet of a pod's connection to another pod's address, as each connection the socket
//!   path translated is. Such a run then makes no call: each subprogram's JIT code is an
//!   image of its own, elsewhere in memory, rarely in cache;
//! - [`ingress4`], the packets the ingress screen finds a flow may have: a TCP segment
//!   other than a SYN, or a UDP datagram, of a flow in the main conntrack table that keeps
//!   its backend, translated as the full path would (a FIN recorded, a RST marking the flow
//!   closing).
//!
//! Anything else goes on to the full path, which looks at it afresh: the lookup here
//! changed nothing that the full path's would not.
use aya_ebpf::programs::TcContext;
use socklb_abi::{CT_FLAG_SNAT, CT_FORWARD, PROTO_TCP};

use crate::{
    conntrack::{self, Found},
    deliver::TC_ACT_OK,
    family::V4,
    flow::{self, Error},
    flow_filter, frontend_filter,
    maps::NODE,
    nat,
    packet::{Ending, Packet, Tuple},
    side::Side,
};

/// The packet is not one of the fast path's: the full path takes it.
pub const FULL: i32 = i32::MIN;

/// Where an ingress program's entry sends an IPv4 packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    /// Of no translated flow, to no frontend: passed untouched.
    Pass,
    /// Maybe of a translated flow: [`ingress4`].
    Fast,
    /// Not plain, maybe the reply of a SNATed flow, to a frontend, or the first packet of
    /// a connection to where flows were made (a flow of its tuple to follow, reopen or take
    /// over): the full path.
    Full,
}

/// Where an IPv4 packet arriving on a device goes, screened in line by its headers and the
/// filters (reads of small arrays).
#[inline(always)]
pub fn screen_ingress4(ctx: &TcContext) -> Screen {
    let Some(packet) = Packet::<u32>::parse_plain(ctx) else {
        return Screen::Full;
    };
    let tuple = settled(&packet.tuple);
    if conntrack::may_be_snat_reply(&tuple, NODE.get(0)) {
        return Screen::Full;
    }
    // A first packet goes to the full path only where it has something to do there: a
    // flow of its tuple to follow, reopen or take over, or a frontend's backend to choose.
    if flow_filter::forward_marked(&tuple) {
        return if packet.opens_connection() {
            Screen::Full
        } else {
            Screen::Fast
        };
    }
    if frontend_filter::frontend_marked(&tuple) {
        return Screen::Full;
    }
    Screen::Pass
}

/// Whether an IPv4 packet the screen passed on a pod's device, where the agent asks for
/// direct delivery, may answer a flow delivered directly (sent by a backend a flow was
/// sent to): the full path takes it. Out of line, so that the entry's frame, which every
/// call chain of the program adds up, does not grow; called only in that mode, so that a
/// passed packet otherwise makes no call.
#[inline(never)]
pub fn may_be_direct_reply4(ctx: &TcContext) -> bool {
    Packet::<u32>::parse_plain(ctx)
        .is_some_and(|packet| flow_filter::reply_marked(&settled(&packet.tuple)))
}

/// Whether an IPv4 packet leaving a device passes untouched, screened in line: plain, and
/// from no backend a flow was sent to (the flow filter), so the reply of no flow.
#[inline(always)]
pub fn egress_passes4(ctx: &TcContext) -> bool {
    Packet::<u32>::parse_plain(ctx)
        .is_some_and(|packet| !flow_filter::reply_marked(&settled(&packet.tuple)))
}

/// The tuple with each field in one register from here on. A field read from the packet
/// is put together from byte loads (the packet's alignment is unknown), which the compiler
/// would keep apart until the field's use, in as many registers, spilled around the map
/// lookups in between: in an entry, whose frame every call chain of the program adds up,
/// those spills cost the IPv6 path the room its chain needs.
#[inline(always)]
fn settled(tuple: &Tuple<u32>) -> Tuple<u32> {
    Tuple {
        source: settle(tuple.source.into()) as u32,
        destination: settle(tuple.destination.into()) as u32,
        source_port: settle(tuple.source_port.into()) as u16,
        destination_port: settle(tuple.destination_port.into()) as u16,
        protocol: settle(tuple.protocol.into()) as u8,
        pad: 0,
        pad16: 0,
    }
}

/// `value`, computed here: opaque to the compiler, which then cannot split it up again.
#[inline(always)]
fn settle(mut value: u64) -> u64 {
    // SAFETY: a move of the register to itself (an instruction, so that the line info
    // the kernel checks has no two lines at one offset).
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) value, options(pure, nomem, nostack)) };
    value
}

/// An IPv4 packet arriving on a device of side `S` that [`screen_ingress4`] sent here: its
/// verdict (a code of the full path's, such as `TOO_BIG`, when a SNATed flow's packet is
/// forwarded), or [`FULL`].
#[inline(never)]
pub fn ingress4<S: Side>(ctx: &TcContext) -> i32 {
    let Some(mut packet) = Packet::<u32>::parse_plain(ctx) else {
        return FULL;
    };
    let segment = packet.segment();
    let now = conntrack::now_s();
    if segment.ending == Ending::Fin {
        conntrack::record_fin::<V4>(&packet.tuple, CT_FORWARD, segment.sequence_high, now);
    }
    let Some(entry) = conntrack::lookup_confirmed_forward::<V4>(&packet.tuple, segment, now) else {
        return FULL;
    };
    let found = Found {
        entry,
        confirmed: true,
    };
    conntrack::reset_by_client::<V4>(&packet.tuple, &found, segment);
    if packet.tuple.protocol != PROTO_TCP && !flow::keeps_backend::<V4>(&found, &packet) {
        return FULL;
    }
    flow::trace_known::<_, S>(&packet, &entry);
    let result = if entry.flags & CT_FLAG_SNAT != 0 || flow::delivered_directly(&entry) {
        // Forwarded by the full path's delivery (a SNATed flow, or one delivered
        // directly), out of line: its FIB lookup is not needed on a pod's usual packets.
        match flow::deliver_apart::<V4>(ctx, &mut packet, &entry) {
            -1 => Err(Error),
            verdict => Ok(verdict),
        }
    } else {
        nat::rewrite(&mut packet, &entry)
            .map(|()| TC_ACT_OK)
            .map_err(Error::from)
    };
    flow::verdict(result, &packet)
}
