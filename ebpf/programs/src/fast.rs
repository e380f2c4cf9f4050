//! The fast path of the ingress programs: the packets most traffic is, handled in a small
//! subprogram of their own, so that they run through a few cache lines of code. The full
//! path (`flow`) holds both families, new flows, SNAT, ICMP errors and refusals in over 80
//! KB of JIT code; a node runs its whole network stack between two packets of a connection,
//! so the lines a packet needs there are rarely still in cache.
//!
//! Here, for an IPv4 packet without options or fragments:
//! - no translated flow and no frontend (the filters say so; a server's answers on its own
//!   device): passed;
//! - a TCP segment other than a SYN, or a UDP datagram, of a flow in the main conntrack
//!   table that keeps its backend: translated, as the full path would (a FIN recorded, a
//!   RST marking the flow closing).
//!
//! Anything else ([`FULL`]) goes on to the full path, which looks at it afresh: the lookup
//! here changed nothing that the full path's would not.
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
    packet::{Ending, Packet},
    side::Side,
};

/// The packet is not one of the fast path's: the full path takes it.
pub const FULL: i32 = i32::MIN;

/// An IPv4 packet arriving on a device of side `S`: its verdict (a code of the full path's,
/// such as `TOO_BIG`, when a SNATed flow's packet is forwarded), or [`FULL`].
#[inline(never)]
pub fn ingress4<S: Side>(ctx: &TcContext) -> i32 {
    let Some(mut packet) = Packet::<u32>::parse_plain(ctx) else {
        return FULL;
    };
    if packet.opens_connection() || conntrack::may_be_snat_reply(&packet.tuple, NODE.get(0)) {
        return FULL;
    }
    if !flow_filter::may_have_forward(&packet.tuple) {
        if frontend_filter::may_be_frontend(&packet.tuple) {
            return FULL;
        }
        return TC_ACT_OK;
    }
    let segment = packet.segment();
    if segment.ending == Ending::Fin {
        conntrack::record_fin::<V4>(&packet.tuple, CT_FORWARD, segment.sequence_high);
    }
    let now = conntrack::now_s();
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
    flow::trace_known::<_, S>(&packet.tuple, &entry);
    let result = if entry.flags & CT_FLAG_SNAT != 0 {
        // Forwarded by the full path's delivery, out of line: its FIB lookup is not needed
        // on a pod's usual packets.
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
