//! The per-packet path: a packet to a frontend gets a backend, and every packet of its flow
//! follows the flow's conntrack entries both ways. One path for both sides of the node
//! ([`Side`]): packets from outside to NodePorts, LoadBalancer IPs and externalIPs (their
//! External selection), and packets from pod devices to internal frontends (their Cluster
//! or Local selection, as the socket path gives them).
//!
//! A SNATed flow is forwarded by redirect, past netfilter, and so is a pod's flow to a pod
//! of this node delivered directly (`--pod-delivery direct`), both ways; any other keeps
//! its client address and takes the kernel's own path (docs/architecture.md says why). A
//! packet with a TTL of 1 or less takes no conntrack or affinity entry, and one whose
//! rewrite fails half-way is dropped rather than sent on half-translated.
use aya_ebpf::programs::TcContext;
use socklb_abi::{
    BACKEND_FLAG_REMOTE, CT_FLAG_CLOSING, CT_FLAG_DIRECT, CT_FLAG_SEEN_REPLY, CT_FLAG_SEQUENCE,
    CT_FLAG_SNAT, CT_FORWARD, CT_REPLY, CtEntry, CtTimeouts, PROTO_TCP, SERVICE_FLAG_REJECT,
    TRACE_FAMILY_V4, TRACE_REASON_CONNTRACK, TRACE_REASON_NO_BACKEND, TRACE_REASON_SNAT_EXHAUSTED,
    TRACE_REASON_SOURCE_DENIED,
};

use crate::{
    backend,
    conntrack::{self, Found, TakeOver},
    counters::bump,
    deliver::{self, TC_ACT_OK, TC_ACT_SHOT},
    family::Family,
    flow_filter, frontend_filter,
    icmp::{self, Quoting},
    log,
    maps::NODE,
    nat,
    packet::{Address, Ending, Packet, PacketError, Segment, Tuple},
    side::{self, Side},
    trace::{self, Decision, TracedValue},
};

/// A map or packet operation that should have worked did not: pass untranslated, count it
/// (or drop the packet, counted, if part of it was already rewritten).
pub struct Error;

impl From<PacketError> for Error {
    fn from(_: PacketError) -> Self {
        Self
    }
}

/// What becomes of a packet from outside; the entry it is rewritten to is written where
/// the caller said.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    /// Not addressed to an external frontend: untouched.
    NotOurs,
    /// A frontend without a usable backend on this node's external selection.
    NoBackend,
    /// A remote backend, but every SNAT port tried belongs to a live flow.
    SnatExhausted,
    /// The client is outside the LoadBalancer frontend's loadBalancerSourceRanges.
    Denied,
    /// A new flow to a remote backend whose first packet cannot be forwarded: TTL 1 or
    /// less.
    TtlExceeded,
    /// Rewrite the packet to the entry.
    To,
    /// A new flow to a remote backend ([`Family::SPLIT_FRAMES`]): the caller takes its SNAT
    /// port, then rewrites the packet to the entry.
    NeedsSnat,
    /// Another CPU made this new flow's entries first (a retransmit, a second datagram):
    /// the packet is dropped, for its sender to send again into that CPU's flow.
    Raced,
    /// A frontend whose Service has no endpoint at all: the client is refused.
    Refused,
}

impl Flow {
    /// Across an out-of-line call: the flow's number, or -1 for an error (a plain integer;
    /// see [`next_hop_here`]).
    #[inline(always)]
    fn code(result: Result<Self, Error>) -> i32 {
        match result {
            Ok(flow) => flow as i32,
            Err(Error) => -1,
        }
    }

    /// The flow of a [`Self::code`]. A match, not an index into a table: a table in
    /// read-only data is indexed by pointer arithmetic the verifier refuses without
    /// CAP_PERFMON.
    #[inline(always)]
    fn decode(code: i32) -> Result<Self, Error> {
        const NOT_OURS: i32 = Flow::NotOurs as i32;
        const NO_BACKEND: i32 = Flow::NoBackend as i32;
        const SNAT_EXHAUSTED: i32 = Flow::SnatExhausted as i32;
        const DENIED: i32 = Flow::Denied as i32;
        const TTL_EXCEEDED: i32 = Flow::TtlExceeded as i32;
        const TO: i32 = Flow::To as i32;
        const NEEDS_SNAT: i32 = Flow::NeedsSnat as i32;
        const RACED: i32 = Flow::Raced as i32;
        const REFUSED: i32 = Flow::Refused as i32;
        Ok(match code {
            NOT_OURS => Self::NotOurs,
            NO_BACKEND => Self::NoBackend,
            SNAT_EXHAUSTED => Self::SnatExhausted,
            DENIED => Self::Denied,
            TTL_EXCEEDED => Self::TtlExceeded,
            TO => Self::To,
            NEEDS_SNAT => Self::NeedsSnat,
            RACED => Self::Raced,
            REFUSED => Self::Refused,
            _ => return Err(Error),
        })
    }
}

/// A conntrack entry for an out-of-line step to fill: every field written, with a zero the
/// compiler cannot see (zero stores in a row become a memset loop, which the verifier
/// refuses without CAP_PERFMON).
#[inline(always)]
fn blank_entry<F: Family>() -> CtEntry<F::Addr> {
    // SAFETY: a read of a valid constant.
    let zero = unsafe { core::ptr::read_volatile(&0u32) };
    CtEntry {
        source: F::addr_from(zero),
        destination: F::addr_from(zero),
        source_port: zero as u16,
        destination_port: zero as u16,
        backend_id: zero,
        service_id: zero,
        last_seen_s: zero,
        flags: zero as u16,
        sequence_high: zero as u16,
    }
}

/// What the TCP and UDP path returns for any other packet: an ICMP error is looked at in a
/// call of its own from the entry, so that neither path's stack adds to the other's.
pub const NOT_TCP_OR_UDP: i32 = -1;
/// What the TCP and UDP path returns for a packet to refuse (see `reject`), answered in a
/// call of its own from the entry for the same reason.
pub const REFUSE: i32 = -3;
/// What the TCP and UDP path returns for a packet whose TTL ran out before socklb could
/// forward it, answered with "time exceeded" from the entry (see `reject`).
pub const EXPIRED: i32 = -4;

/// An ICMP error about a flow from outside, arriving (`ingress`) or leaving the node,
/// translated back (see `icmp`) and sent on as the flow's packets are: forwarded here if
/// the flow is SNATed or delivered directly, else through the kernel's path. Anything else
/// passes untouched. Out of line: not a TCP or UDP packet, so it needs none of their path's
/// stack.
#[inline(never)]
pub fn icmp_error<F: Family>(ctx: &TcContext, ingress: bool) -> i32 {
    let Some(quote) = <F::Addr as Quoting>::quote(ctx) else {
        return TC_ACT_OK;
    };
    let Some(entry) = icmp::flow_of::<F>(&quote, ingress, NODE.get(0), conntrack::now_s()) else {
        return TC_ACT_OK;
    };
    let mut packet = Packet::icmp_error(
        ctx,
        quote.source,
        quote.destination,
        quote.protocol,
        quote.ttl,
        quote.icmp_check(),
    );
    let result = icmp::translate(&mut packet, &quote, &entry)
        .map_err(Error::from)
        .and_then(|()| {
            bump(|c| &mut c.icmp_errors_translated);
            let to_pod = delivered_directly(&entry);
            if !ingress || (entry.flags & CT_FLAG_SNAT == 0 && !to_pod) {
                Ok(TC_ACT_OK)
            } else if ttl_exceeded(&packet) {
                Ok(TC_ACT_SHOT)
            } else {
                deliver::forward::<F>(ctx, &mut packet, None, to_pod).map_err(Error::from)
            }
        });
    verdict(result, &packet)
}

/// An error before the packet changed lets it pass untranslated; after, it is dropped.
#[inline(always)]
pub fn verdict<A: Address>(result: Result<i32, Error>, packet: &Packet<A>) -> i32 {
    match result {
        Ok(verdict) => verdict,
        Err(Error) if packet.mangled() => {
            packet.tuple.source.log_rewrite_failed();
            bump(|c| &mut c.rewrite_failed);
            TC_ACT_SHOT
        }
        Err(Error) => {
            bump(|c| &mut c.errors);
            TC_ACT_OK
        }
    }
}

/// Whether a packet of ours cannot be forwarded (counted): it is dropped, or answered, before
/// anything in it changes.
#[inline(always)]
fn ttl_exceeded<A>(packet: &Packet<A>) -> bool {
    if packet.ttl <= 1 {
        bump(|c| &mut c.ttl_exceeded);
        return true;
    }
    false
}

#[inline(always)]
pub fn try_ingress<F: Family, S: Side>(
    ctx: &TcContext,
    packet: &mut Packet<F::Addr>,
) -> Result<i32, Error> {
    let now = conntrack::now_s();
    let segment = packet.segment();
    let may_be_reply = conntrack::may_be_snat_reply(&packet.tuple, NODE.get(0))
        || (S::DIRECT && may_be_direct_reply(&packet.tuple));
    if segment.ending == Ending::Fin
        && !(may_be_reply
            && conntrack::record_fin::<F>(&packet.tuple, CT_REPLY, segment.sequence_high, now))
    {
        conntrack::record_fin::<F>(&packet.tuple, CT_FORWARD, segment.sequence_high, now);
    }
    // A remote backend answering a SNATed flow, addressed to this node; a pod answering a
    // flow delivered directly, on its own device.
    if may_be_reply && let Some(verdict) = reply::<F>(ctx, packet, segment, now)? {
        return Ok(verdict);
    }
    let mut local = blank_entry::<F>();
    let Some(entry) = F::flow_room(&mut local) else {
        return Err(Error);
    };
    let mut choice = Choice::default();
    // Most packets are of no translated flow: the flow filter spares them the lookups.
    let may_have_forward = if F::SPLIT_FRAMES {
        flow_filter::may_have_forward(&packet.tuple)
    } else {
        flow_filter::forward_marked(&packet.tuple)
    };
    let known = if may_have_forward {
        known_flow::<F, S>(packet, segment, now, entry)?
    } else {
        Known::None
    };
    // Only whether a flow is made here goes on past the choice: the verifier walks the
    // rest of the path once for each value a variable it decides on can hold there, and
    // three (`Known`) made it walk it twice (about a third more of socklb_tc_pod's
    // verification, the agent's start).
    let made = known != Known::Flow;
    let mut outcome = if made {
        new_flow::<F, S>(packet, now, entry, known == Known::Closed, &mut choice)?
    } else {
        Flow::To
    };
    if outcome == Flow::NeedsSnat {
        outcome = snat::<F, S>(packet, entry, choice)?;
    }
    match outcome {
        Flow::NotOurs => return Ok(TC_ACT_OK),
        Flow::NoBackend => {
            bump(S::no_backend);
            return Ok(TC_ACT_SHOT);
        }
        Flow::SnatExhausted => {
            bump(|c| &mut c.snat_exhausted);
            return Ok(TC_ACT_SHOT);
        }
        Flow::Denied => {
            bump(|c| &mut c.external_denied);
            return Ok(TC_ACT_SHOT);
        }
        Flow::TtlExceeded => return Ok(EXPIRED),
        Flow::Raced => {
            bump(|c| &mut c.flow_races);
            return Ok(TC_ACT_SHOT);
        }
        Flow::Refused => return Ok(REFUSE),
        Flow::To | Flow::NeedsSnat => {}
    }
    if made {
        // Before this packet goes on, so before any reply. A packet of the same flow on
        // another CPU in between misses the slot, makes the flow again and is dropped as
        // raced (`flow_races`), as two first packets at once are.
        if F::SPLIT_FRAMES {
            flow_filter::mark(&packet.tuple, entry);
        } else {
            flow_filter::mark_here(&packet.tuple, entry);
        }
    }
    deliver::<F>(ctx, packet, entry)
}

/// Rewrites the packet to its flow's entry and sends it on: a backend on this node through
/// the kernel's path, seen by its conntrack, which also decides about a TTL of 1 or less;
/// a SNATed flow, or one delivered directly, forwarded here.
#[inline(always)]
fn deliver<F: Family>(
    ctx: &TcContext,
    packet: &mut Packet<F::Addr>,
    entry: &CtEntry<F::Addr>,
) -> Result<i32, Error> {
    if F::SPLIT_FRAMES {
        match deliver_apart::<F>(ctx, packet, entry) {
            -1 => Err(Error),
            verdict => Ok(verdict),
        }
    } else {
        deliver_here::<F>(ctx, packet, entry)
    }
}

/// [`deliver`] in a stack frame of its own: the verdict or -1.
#[inline(never)]
pub fn deliver_apart<F: Family>(
    ctx: &TcContext,
    packet: &mut Packet<F::Addr>,
    entry: &CtEntry<F::Addr>,
) -> i32 {
    deliver_here::<F>(ctx, packet, entry).unwrap_or(-1)
}

#[inline(always)]
fn deliver_here<F: Family>(
    ctx: &TcContext,
    packet: &mut Packet<F::Addr>,
    entry: &CtEntry<F::Addr>,
) -> Result<i32, Error> {
    let to_pod = delivered_directly(entry);
    if entry.flags & CT_FLAG_SNAT == 0 && !to_pod {
        nat::rewrite(packet, entry)?;
        return Ok(TC_ACT_OK);
    }
    if ttl_exceeded(packet) {
        return Ok(EXPIRED);
    }
    Ok(deliver::forward::<F>(ctx, packet, Some(entry), to_pod)?)
}

/// The reply of a SNATed flow from its remote backend, or of a flow delivered directly
/// from its backend, rewritten and forwarded (its verdict); `None`: not one. A flow the
/// kernel's path delivers (from outside to a pod of this node) is left to the egress
/// program of the client's device, which records again what the lookup recorded (the
/// answer, a RST), to no effect.
#[inline(always)]
fn reply<F: Family>(
    ctx: &TcContext,
    packet: &mut Packet<F::Addr>,
    segment: Segment,
    now: u32,
) -> Result<Option<i32>, Error> {
    if F::SPLIT_FRAMES {
        match reply_apart::<F>(ctx, packet, segment, now) {
            NOT_A_REPLY => Ok(None),
            -1 => Err(Error),
            verdict => Ok(Some(verdict)),
        }
    } else {
        reply_here::<F>(ctx, packet, segment, now)
    }
}

/// [`reply_apart`]'s "not a reply".
const NOT_A_REPLY: i32 = -2;

/// [`reply`] in a stack frame of its own: the verdict, [`NOT_A_REPLY`] or -1.
#[inline(never)]
fn reply_apart<F: Family>(
    ctx: &TcContext,
    packet: &mut Packet<F::Addr>,
    segment: Segment,
    now: u32,
) -> i32 {
    match reply_here::<F>(ctx, packet, segment, now) {
        Ok(Some(verdict)) => verdict,
        Ok(None) => NOT_A_REPLY,
        Err(Error) => -1,
    }
}

#[inline(always)]
fn reply_here<F: Family>(
    ctx: &TcContext,
    packet: &mut Packet<F::Addr>,
    segment: Segment,
    now: u32,
) -> Result<Option<i32>, Error> {
    let Some(reply) = conntrack::lookup_reply::<F>(&packet.tuple, segment, now) else {
        return Ok(None);
    };
    let to_pod = delivered_directly(&reply);
    if reply.flags & CT_FLAG_SNAT == 0 && !to_pod {
        return Ok(None);
    }
    if ttl_exceeded(packet) {
        return Ok(Some(TC_ACT_SHOT));
    }
    nat::rewrite(packet, &reply)?;
    Ok(Some(deliver::forward::<F>(ctx, packet, None, to_pod)?))
}

/// Whether a flow's packets are delivered directly: made so, and the agent still asks for
/// it. After a change to `kernel` both directions of such a flow take the kernel's path,
/// whose conntrack picks the flow up (as after its own restart), since the answers are no
/// longer looked for on the backend's device.
#[inline(always)]
pub fn delivered_directly<A>(entry: &CtEntry<A>) -> bool {
    entry.flags & CT_FLAG_DIRECT != 0 && conntrack::delivers_direct(NODE.get(0))
}

/// Whether a packet on a pod's device may answer a flow delivered directly (sent by a
/// backend a flow was sent to, where the agent asks for direct delivery). Out of line: its
/// callers' frames have no room to spare.
#[inline(never)]
fn may_be_direct_reply<A: Address>(tuple: &Tuple<A>) -> bool {
    conntrack::delivers_direct(NODE.get(0)) && flow_filter::reply_marked(tuple)
}

/// Takes the SNAT port of a new flow to a remote backend ([`Flow::NeedsSnat`]), and traces
/// the flow's `choice` once its SNAT source is known.
#[inline(always)]
fn snat<F: Family, S: Side>(
    packet: &Packet<F::Addr>,
    entry: &mut CtEntry<F::Addr>,
    choice: Choice,
) -> Result<Flow, Error> {
    let (Some(node), Some(snat_address)) = (NODE.get(0), F::snat_address()) else {
        log::no_snat_address();
        return Err(Error);
    };
    match nat::insert_snat::<F>(&packet.tuple, entry, snat_address, node) {
        Ok(Some(_)) => {
            bump(S::flows);
            if F::SPLIT_FRAMES {
                trace_snat::<_, S>(packet, entry, choice, true);
            }
            Ok(Flow::To)
        }
        Ok(None) => {
            if F::SPLIT_FRAMES {
                trace_snat::<_, S>(packet, entry, choice, false);
            }
            Ok(Flow::SnatExhausted)
        }
        Err(conntrack::EEXIST) => Ok(Flow::Raced),
        Err(error) => {
            log::conntrack_not_written(error);
            Err(Error)
        }
    }
}

/// How a new flow's backend was chosen, kept for its trace event until its SNAT port is
/// taken in a frame of its own ([`Family::SPLIT_FRAMES`]).
#[derive(Clone, Copy, Default)]
struct Choice {
    /// `TRACE_REASON_*`.
    reason: u8,
    slot: u16,
    count: u16,
}

/// The trace event of a new flow that took its SNAT port (`taken`: from the entry's source)
/// or found none, in a stack frame of its own: the caller's frame and the port search's are
/// both near the limit of their chain.
#[inline(never)]
fn trace_snat<A: TracedValue + Address, S: Side>(
    packet: &Packet<A>,
    entry: &CtEntry<A>,
    choice: Choice,
    taken: bool,
) {
    let choice = if taken {
        choice
    } else {
        Choice {
            reason: TRACE_REASON_SNAT_EXHAUSTED,
            ..choice
        }
    };
    trace_entry::<A, S>(choice, packet, entry, taken, false);
}

/// Replies of backends on their way to a client (not SNATed: those come in at ingress):
/// shown as coming from the frontend. `screened`: the entry's screen found the packet's
/// slot in the flow filter marked already.
#[inline(always)]
pub fn try_egress<F: Family>(packet: &mut Packet<F::Addr>, screened: bool) -> Result<i32, Error> {
    if !screened && !flow_filter::may_have_reply(&packet.tuple) {
        return Ok(TC_ACT_OK);
    }
    let now = conntrack::now_s();
    let segment = packet.segment();
    if segment.ending == Ending::Fin {
        conntrack::record_fin::<F>(&packet.tuple, CT_REPLY, segment.sequence_high, now);
    }
    if let Some(reply) = conntrack::lookup_reply::<F>(&packet.tuple, segment, now) {
        nat::rewrite(packet, &reply)?;
    }
    Ok(TC_ACT_OK)
}

/// What conntrack holds for a packet's forward key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Nothing that keeps its backend: a new flow is chosen.
    None = 0,
    /// The packet's flow, which keeps its backend (written to the entry).
    Flow = 1,
    /// A closing flow of the same client port, left for the new flow to take over
    /// ([`conntrack::take_over`]).
    Closed = 2,
}

/// The packet's flow if conntrack holds one that keeps its backend; else whether a closing
/// flow of the client's port is left for the new flow to take over, or nothing is
/// ([`Known`]). An unconfirmed flow whose backend answered is confirmed by the client's
/// next packet that is neither a SYN nor a FIN or RST.
#[inline(always)]
fn known_flow<F: Family, S: Side>(
    packet: &Packet<F::Addr>,
    segment: Segment,
    now: u32,
    entry: &mut CtEntry<F::Addr>,
) -> Result<Known, Error> {
    if F::SPLIT_FRAMES {
        match known_flow_apart::<F, S>(packet, segment, now, entry) {
            0 => Ok(Known::None),
            1 => Ok(Known::Flow),
            2 => Ok(Known::Closed),
            _ => Err(Error),
        }
    } else {
        known_flow_here::<F, S>(packet, segment, now, entry)
    }
}

/// [`known_flow`] in a stack frame of its own: [`Known`] as a number, or -1.
#[inline(never)]
fn known_flow_apart<F: Family, S: Side>(
    packet: &Packet<F::Addr>,
    segment: Segment,
    now: u32,
    entry: &mut CtEntry<F::Addr>,
) -> i32 {
    match known_flow_here::<F, S>(packet, segment, now, entry) {
        Ok(known) => known as i32,
        Err(Error) => -1,
    }
}

#[inline(always)]
fn known_flow_here<F: Family, S: Side>(
    packet: &Packet<F::Addr>,
    segment: Segment,
    now: u32,
    entry: &mut CtEntry<F::Addr>,
) -> Result<Known, Error> {
    if let Some(mut found) = conntrack::lookup_forward::<F>(&packet.tuple, segment, now) {
        conntrack::reset_by_client::<F>(&packet.tuple, &found, segment);
        if !found.confirmed && found.entry.flags & CT_FLAG_CLOSING != 0 && packet.opens_connection()
        {
            conntrack::reopen::<F>(&packet.tuple, &mut found.entry);
        }
        if !keeps_backend::<F>(&found, packet) {
            if may_be_taken_over::<F, S>(&found, packet) {
                return Ok(Known::Closed);
            }
            // Chosen afresh below; the old entries must neither shadow the new ones nor
            // hold their SNAT port.
            conntrack::forget::<F>(&packet.tuple, &found);
        } else {
            // The client's ACK to the SYN-ACK (a RST or FIN confirms nothing). A failed move
            // leaves the flow unconfirmed (a later packet tries again); this packet is
            // translated all the same, or the ACK would reach the node's own port and be
            // reset.
            if !found.confirmed
                && found.entry.flags & CT_FLAG_SEEN_REPLY != 0
                && !packet.opens_connection()
                && segment.ending == Ending::None
                && let Err(error) = conntrack::confirm::<F>(&packet.tuple, &found.entry, now)
            {
                log::conntrack_not_confirmed(error);
                bump(|c| &mut c.errors);
            }
            trace_known::<_, S>(packet, &found.entry);
            *entry = found.entry;
            return Ok(Known::Flow);
        }
    }
    Ok(Known::None)
}

/// Whether a flow that does not keep its backend is a closing pod's IPv4 TCP flow in the
/// main table without SNAT, met by a SYN from its client's port: left for the new flow to
/// take over ([`conntrack::take_over`]).
#[inline(always)]
fn may_be_taken_over<F: Family, S: Side>(found: &Found<F::Addr>, packet: &Packet<F::Addr>) -> bool {
    !F::SPLIT_FRAMES
        && S::CONFIRMED_AT_ONCE
        && found.confirmed
        && packet.tuple.protocol == PROTO_TCP
        && packet.opens_connection()
        && found.entry.flags & (CT_FLAG_CLOSING | CT_FLAG_SNAT) == CT_FLAG_CLOSING
}

/// The trace event of a packet of a known flow, with its SNAT source if it has one.
#[inline(always)]
pub fn trace_known<A: TracedValue + Address, S: Side>(packet: &Packet<A>, entry: &CtEntry<A>) {
    let choice = Choice {
        reason: TRACE_REASON_CONNTRACK,
        ..Choice::default()
    };
    // IPv6's SNAT source is on its choice's event only: one more value here, on every
    // known flow's path, takes its frames past the verifier's 512 bytes of stack.
    let snat = A::FAMILY == TRACE_FAMILY_V4 && entry.flags & CT_FLAG_SNAT != 0;
    trace_entry::<A, S>(choice, packet, entry, snat, true);
}

/// The trace event of a flow's packet (`per_packet`) or choice to the backend of `entry`;
/// from the entry's source (its SNAT address and port) if `snat`.
#[inline(always)]
fn trace_entry<A: TracedValue + Address, S: Side>(
    choice: Choice,
    packet: &Packet<A>,
    entry: &CtEntry<A>,
    snat: bool,
    per_packet: bool,
) {
    let tuple = &packet.tuple;
    let decision = Decision {
        reason: choice.reason,
        service_id: entry.service_id,
        backend: (&entry.destination, entry.destination_port),
        // IPv4's known flows pass the entry's source either way, with port 0 (no SNAT
        // source) unless `snat`: a choice of addresses in their one frame would send two
        // kinds of pointer on through the event's writes, which the verifier walks apart.
        snat: if A::FAMILY == TRACE_FAMILY_V4 {
            (&entry.source, if snat { entry.source_port } else { 0 })
        } else if snat {
            (&entry.source, entry.source_port)
        } else {
            (A::none_ref(), 0)
        },
        slot: choice.slot,
        count: choice.count,
        ..Decision::new(
            S::TRACE_SOURCE,
            tuple.protocol,
            (&tuple.destination, tuple.destination_port),
        )
    };
    trace_flow(&decision, packet, per_packet);
}

/// A trace event of a packet from outside or from a pod device (`per_packet`: one of a
/// known flow). The addresses are read where they are (the packet's tuple, the flow's
/// entry): IPv6's stack has no room for copies.
#[inline(always)]
fn trace_flow<A: TracedValue + Address>(
    decision: &Decision<&A>,
    packet: &Packet<A>,
    per_packet: bool,
) {
    let tuple = &packet.tuple;
    trace::external(
        decision,
        (&tuple.source, tuple.source_port),
        per_packet,
        || packet.ifindex(),
    );
}

/// Whether a known flow stays with its backend (conntrack never returns one idle past its
/// timeout). A TCP SYN on a closed connection starts afresh (the client reuses its port;
/// a flow from outside reset during its handshake, still unconfirmed, was reopened
/// instead, see [`conntrack::reopen`]); on a live one it is passed on to its backend. An open TCP
/// connection keeps a backend that left; a new one or a UDP datagram chooses again (README,
/// "Traffic from outside the node (TC)").
#[inline(always)]
pub fn keeps_backend<F: Family>(found: &Found<F::Addr>, packet: &Packet<F::Addr>) -> bool {
    let entry = &found.entry;
    if packet.tuple.protocol == PROTO_TCP && !packet.opens_connection() {
        return true;
    }
    if entry.flags & CT_FLAG_CLOSING != 0 {
        return false;
    }
    F::backend(entry.backend_id).is_some_and(|(address, port)| {
        address == entry.destination && port == entry.destination_port
    })
}

/// A new flow: its backend chosen, its conntrack entries made (written to `out`).
#[inline(always)]
fn new_flow<F: Family, S: Side>(
    packet: &Packet<F::Addr>,
    now: u32,
    out: &mut CtEntry<F::Addr>,
    closed: bool,
    choice: &mut Choice,
) -> Result<Flow, Error> {
    if F::SPLIT_FRAMES {
        Flow::decode(new_flow_apart::<F, S>(packet, now, out, closed, choice))
    } else {
        new_flow_here::<F, S>(packet, now, out, closed, choice)
    }
}

/// [`new_flow`] in a stack frame of its own ([`Family::SPLIT_FRAMES`]): [`Flow::code`].
#[inline(never)]
fn new_flow_apart<F: Family, S: Side>(
    packet: &Packet<F::Addr>,
    now: u32,
    out: &mut CtEntry<F::Addr>,
    closed: bool,
    choice: &mut Choice,
) -> i32 {
    Flow::code(new_flow_here::<F, S>(packet, now, out, closed, choice))
}

#[inline(always)]
fn new_flow_here<F: Family, S: Side>(
    packet: &Packet<F::Addr>,
    now: u32,
    out: &mut CtEntry<F::Addr>,
    closed: bool,
    choice: &mut Choice,
) -> Result<Flow, Error> {
    let tuple = &packet.tuple;
    // Most packets of no flow go to no frontend either: the filter spares them the lookups.
    if !frontend_filter::may_be_frontend(tuple) {
        return Ok(Flow::NotOurs);
    }
    let master = match F::master(tuple, S::SCOPE) {
        Some(master) => master,
        None => {
            let Some(scope) = side::fallback_scope::<S>() else {
                return Ok(Flow::NotOurs);
            };
            let Some(master) = F::master(tuple, scope) else {
                return Ok(Flow::NotOurs);
            };
            master
        }
    };
    let mut decision = Decision {
        service_id: master.service_id,
        count: master.count,
        ..Decision::new(
            S::TRACE_SOURCE,
            tuple.protocol,
            (&tuple.destination, tuple.destination_port),
        )
    };
    if !F::source_allowed(tuple) {
        decision.reason = TRACE_REASON_SOURCE_DENIED;
        trace_flow(&decision, packet, false);
        return Ok(Flow::Denied);
    }
    let count = u32::from(master.count);
    if count == 0 {
        decision.reason = TRACE_REASON_NO_BACKEND;
        trace_flow(&decision, packet, false);
        if master.flags & SERVICE_FLAG_REJECT != 0 {
            return Ok(Flow::Refused);
        }
        return Ok(Flow::NoBackend);
    }
    // A packet that cannot be forwarded (TTL 1 or less) makes no affinity or conntrack
    // entry, whatever becomes of it.
    let forwardable = packet.ttl > 1;
    let (backend, slot, reason) =
        backend::for_flow::<F>(&master, tuple, count, forwardable).ok_or(Error)?;
    decision.reason = reason;
    decision.backend = (&backend.backend_address, backend.backend_port);
    decision.slot = slot;
    let mut entry = CtEntry {
        source: tuple.source,
        destination: backend.backend_address,
        source_port: tuple.source_port,
        destination_port: backend.backend_port,
        backend_id: backend.backend_id,
        service_id: master.service_id,
        last_seen_s: now,
        flags: 0,
        sequence_high: 0,
    };
    let segment = packet.segment();
    if segment.tcp {
        entry.flags = CT_FLAG_SEQUENCE;
        entry.sequence_high = segment.sequence_high;
    }
    let snat = S::snat(&backend, tuple.source);
    if !snat
        && S::DIRECT
        && backend.flags & BACKEND_FLAG_REMOTE == 0
        && conntrack::delivers_direct(NODE.get(0))
    {
        entry.flags |= CT_FLAG_DIRECT;
    }
    // The closing flow of the client's port (`Known::Closed`): taken over, or removed
    // before this flow is made.
    if !F::SPLIT_FRAMES && closed {
        match conntrack::take_over::<F>(tuple, &entry, !snat && forwardable) {
            TakeOver::Taken => {
                bump(S::flows);
                trace_flow(&decision, packet, false);
                *out = entry;
                return Ok(Flow::To);
            }
            TakeOver::Raced => return Ok(Flow::Raced),
            TakeOver::Removed => {}
        }
    }
    if snat {
        // Before the SNAT port is taken.
        if ttl_exceeded(packet) {
            return Ok(Flow::TtlExceeded);
        }
        if F::SPLIT_FRAMES {
            // The port is taken by the caller, in a frame of its own, which traces the
            // choice once the flow's SNAT source is known.
            *choice = Choice {
                reason: decision.reason,
                slot,
                count: master.count,
            };
            entry.flags |= CT_FLAG_SNAT;
            *out = entry;
            return Ok(Flow::NeedsSnat);
        }
        let (Some(node), Some(snat_address)) = (NODE.get(0), F::snat_address()) else {
            log::no_snat_address();
            return Err(Error);
        };
        entry.flags |= CT_FLAG_SNAT;
        match nat::insert_snat::<F>(tuple, &mut entry, snat_address, node) {
            Ok(Some(_)) => decision.snat = (&entry.source, entry.source_port),
            Ok(None) => {
                decision.reason = TRACE_REASON_SNAT_EXHAUSTED;
                trace_flow(&decision, packet, false);
                return Ok(Flow::SnatExhausted);
            }
            Err(conntrack::EEXIST) => return Ok(Flow::Raced),
            Err(error) => {
                log::conntrack_not_written(error);
                return Err(Error);
            }
        }
    } else if !forwardable {
        // A backend on this node: translated, and the kernel's path decides.
        *out = entry;
        return Ok(Flow::To);
    } else {
        let timeouts = CtTimeouts::of(NODE.get(0));
        match conntrack::insert::<F>(tuple, &entry, timeouts, now, S::CONFIRMED_AT_ONCE) {
            Ok(()) => {}
            Err(conntrack::EEXIST) => return Ok(Flow::Raced),
            Err(error) => {
                log::conntrack_not_written(error);
                return Err(Error);
            }
        }
    }
    bump(S::flows);
    trace_flow(&decision, packet, false);
    *out = entry;
    Ok(Flow::To)
}
