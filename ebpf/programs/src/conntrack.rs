//! Flows from outside the node: their two conntrack entries (forward and reply), and how
//! long they live. The SNAT source port a flow to a remote backend gets is `nat`'s.
//!
//! A new flow from outside waits in the smaller unconfirmed table (`CONNTRACK_NEW`) until
//! it is confirmed ([`CT_FLAG_SEEN_REPLY`], then the client's ACK; UDP: the reply), so a
//! SYN flood only evicts other unconfirmed flows; a pod's is made in the main table at once
//! (`Side::CONFIRMED_AT_ONCE`), unless it is SNATed or another flow holds its reply key.
//! Each frontend of a flow made unconfirmed is marked in the flow filter, so that a pod's
//! first packet is looked for in the unconfirmed table only if it may be there. TCP's end
//! follows netfilter (see [`touch`]). The states and timeouts: README, "Traffic from
//! outside the node (TC)"; what was tested: docs/operations.md, "Traffic from outside the
//! node". Written once for both families ([`Family`]), each with its own two tables.
use aya_ebpf::{bindings::BPF_NOEXIST, helpers};
use socklb_abi::{
    CT_FLAG_CLOSING, CT_FLAG_FIN, CT_FLAG_SEEN_REPLY, CT_FLAG_SEQUENCE, CT_FLAG_SNAT, CT_FORWARD,
    CT_REPLY, CtEntry, CtKey, CtTimeouts, NodeConfig, POD_DELIVERY_DIRECT, PROTO_TCP,
    in_sequence_window,
};

use crate::{
    family::{CtTable, Family},
    flow_filter,
    maps::NODE,
    packet::{Ending, Segment, Tuple},
};

const NANOS_PER_SECOND: u64 = 1_000_000_000;

type Addr<F> = <F as Family>::Addr;
type Entry<F> = CtEntry<Addr<F>>;
type Key<F> = CtKey<Addr<F>>;

/// A flow's entry in one direction, and whether it is in the main table.
#[derive(Clone, Copy)]
pub struct Found<A> {
    pub entry: CtEntry<A>,
    pub confirmed: bool,
}

/// Seconds since boot, as [`CtEntry::last_seen_s`] counts. The coarse clock (a tick's
/// resolution) is plenty for second-granular timeouts and cheaper than reading the
/// clocksource on every packet.
#[inline(always)]
pub fn now_s() -> u32 {
    // SAFETY: helper without arguments.
    (unsafe { helpers::bpf_ktime_get_coarse_ns() } / NANOS_PER_SECOND) as u32
}

/// Whether a packet may be the reply of a SNATed flow: only those are addressed to a port
/// of the SNAT range, so every other packet skips the reply lookup.
#[inline(always)]
pub fn may_be_snat_reply<A>(tuple: &Tuple<A>, node: Option<&NodeConfig>) -> bool {
    let port = u16::from_be(tuple.destination_port);
    node.is_some_and(|node| port >= node.snat_port_min && port <= node.snat_port_max)
}

/// Whether the agent asks for a pod's new flows to backends on this node to be delivered
/// directly (`CT_FLAG_DIRECT`), and so whether a pod's device may see their answers.
#[inline(always)]
pub fn delivers_direct(node: Option<&NodeConfig>) -> bool {
    node.is_some_and(|node| node.pod_delivery == POD_DELIVERY_DIRECT)
}

#[inline(always)]
pub fn key<A: Copy>(tuple: &Tuple<A>, direction: u8) -> CtKey<A> {
    CtKey {
        source: tuple.source,
        destination: tuple.destination,
        source_port: tuple.source_port,
        destination_port: tuple.destination_port,
        protocol: tuple.protocol,
        direction,
        pad: 0,
    }
}

/// Whether the entry under `reply_key` in `table` is the other direction of the flow whose
/// forward entry is under `forward_key` (and not another flow's, holding the port now).
#[inline(always)]
fn reply_is_ours<F: Family>(table: &CtTable<F>, reply_key: &Key<F>, forward_key: &Key<F>) -> bool {
    let Some(reply) = table.get_ptr(F::ct_key(reply_key)) else {
        return false;
    };
    // SAFETY: pointer from a successful lookup; read at once.
    (unsafe { &*reply }).points_to(forward_key)
}

/// Whether a TCP segment with `sequence_high` counts for the entry `before` (in the main
/// table if `confirmed`): on an established flow (confirmed and answered) only near the
/// sequence numbers its direction sent, as netfilter checks segments against the window. A
/// blind RST must not end a live flow (whose next SYN would then start it afresh), nor a
/// blind segment move the window for one; a handshake may start again with a new sequence.
#[inline(always)]
fn counts<A>(before: &CtEntry<A>, confirmed: bool, sequence_high: u16) -> bool {
    !(confirmed && before.flags & CT_FLAG_SEEN_REPLY != 0)
        || before.flags & CT_FLAG_SEQUENCE == 0
        || in_sequence_window(before.sequence_high, sequence_high)
}

/// The entry under `key` in `table` (the main table if `confirmed`) as it was before this
/// packet, which refreshes it: its last-seen time moves on (written at most once a second),
/// `set` flags are added, a TCP segment's sequence number is recorded, and a RST marks it
/// closing (a FIN is for [`record_fin`]), if the segment [`counts`]. An
/// entry idle past its timeout is removed instead and not returned: it must never
/// translate a packet (a new flow may reuse its tuple, such as a client's direct
/// connection to the pod from the same port) and must not be kept alive by one.
#[inline(always)]
fn touch<F: Family>(
    table: &CtTable<F>,
    confirmed: bool,
    key: &Key<F>,
    segment: Segment,
    now: u32,
    set: u16,
) -> Option<Entry<F>> {
    let entry = table.get_ptr_mut(F::ct_key(key))?;
    // SAFETY: pointer from a successful lookup, valid for this run; racing writers only
    // move the timestamp or add flags, both idempotent.
    let entry = unsafe { &mut *entry };
    let timeout = CtTimeouts::of(NODE.get(0)).timeout_s(key.protocol, entry.flags, confirmed);
    if entry.expired(now, timeout) {
        let _ = table.remove(F::ct_key(key));
        return None;
    }
    let before = *entry;
    if entry.last_seen_s != now {
        entry.last_seen_s = now;
    }
    let mut flags = before.flags | set;
    if segment.tcp && counts(&before, confirmed, segment.sequence_high) {
        if segment.ending == Ending::Reset {
            flags |= CT_FLAG_CLOSING;
        } else {
            flags |= CT_FLAG_SEQUENCE;
            if before.sequence_high != segment.sequence_high {
                entry.sequence_high = segment.sequence_high;
            }
        }
    }
    if flags != before.flags {
        entry.flags = flags;
    }
    Some(before)
}

/// The entry a packet with `tuple` going `direction` would follow, main table first, as it
/// is: not refreshed (what reads it, an ICMP error about the flow, is no sign of its life),
/// and none if idle past its timeout.
#[inline(always)]
pub fn peek<F: Family>(tuple: &Tuple<F::Addr>, direction: u8, now: u32) -> Option<Entry<F>> {
    let key = key(tuple, direction);
    let timeouts = CtTimeouts::of(NODE.get(0));
    let live = |table: &CtTable<F>, confirmed: bool| {
        let entry = table.get_ptr(F::ct_key(&key))?;
        // SAFETY: pointer from a successful lookup; copied out at once.
        let entry = *(unsafe { &*entry });
        let timeout = timeouts.timeout_s(key.protocol, entry.flags, confirmed);
        (!entry.expired(now, timeout)).then_some(entry)
    };
    live(F::conntrack(), true).or_else(|| live(F::conntrack_new(), false))
}

/// Records a FIN of the packet whose flow's entry is under `key(tuple, direction)`: its
/// direction is done sending, and once both are, both entries are marked closing. On a
/// confirmed flow only a FIN near the sequence numbers its direction sent counts (see
/// [`touch`]): blind FINs both ways must not end a live flow. Whether the flow has an
/// entry there. Called before the packet's lookups (`now` is theirs). In line for IPv4,
/// whose flows end with a FIN each way; out of line for IPv6 ([`Family::SPLIT_FRAMES`]),
/// whose lookup path has no stack to spare for the other direction's key.
#[inline(always)]
pub fn record_fin<F: Family>(
    tuple: &Tuple<F::Addr>,
    direction: u8,
    sequence_high: u16,
    now: u32,
) -> bool {
    if F::SPLIT_FRAMES {
        record_fin_apart::<F>(tuple, direction, sequence_high, now)
    } else {
        record_fin_here::<F>(tuple, direction, sequence_high, now)
    }
}

/// [`record_fin`] in a stack frame of its own.
#[inline(never)]
fn record_fin_apart<F: Family>(
    tuple: &Tuple<F::Addr>,
    direction: u8,
    sequence_high: u16,
    now: u32,
) -> bool {
    record_fin_here::<F>(tuple, direction, sequence_high, now)
}

#[inline(always)]
fn record_fin_here<F: Family>(
    tuple: &Tuple<F::Addr>,
    direction: u8,
    sequence_high: u16,
    now: u32,
) -> bool {
    let may_have_entry = if direction == CT_FORWARD {
        flow_filter::forward_marked(tuple)
    } else {
        flow_filter::reply_marked(tuple)
    };
    if !may_have_entry {
        return false;
    }
    let key = key(tuple, direction);
    fin_in::<F>(F::conntrack(), true, &key, sequence_high, now)
        || ((direction != CT_FORWARD || flow_filter::unconfirmed_marked(tuple))
            && fin_in::<F>(F::conntrack_new(), false, &key, sequence_high, now))
}

/// The closing timeout of a flow starts at the FIN that closes it, as netfilter's does: an
/// entry idle longer than that (a connection closed after a quiet spell) must still
/// translate that FIN, which answers the peer's with the ACK of it. An entry already idle
/// past the timeout it had is left expired, for the lookup to remove.
#[inline(always)]
fn fin_in<F: Family>(
    table: &CtTable<F>,
    confirmed: bool,
    key: &Key<F>,
    sequence_high: u16,
    now: u32,
) -> bool {
    let Some(entry) = table.get_ptr_mut(F::ct_key(key)) else {
        return false;
    };
    // SAFETY: pointer from a successful lookup, valid for this run; racing writers only add
    // flags or move the timestamp.
    let entry = unsafe { &mut *entry };
    let timeouts = CtTimeouts::of(NODE.get(0));
    let expired = |entry: &Entry<F>| {
        entry.expired(
            now,
            timeouts.timeout_s(key.protocol, entry.flags, confirmed),
        )
    };
    if expired(entry) || entry.flags & CT_FLAG_FIN != 0 || !counts(entry, confirmed, sequence_high)
    {
        return true;
    }
    entry.flags |= CT_FLAG_FIN;
    let other = key.other_direction(entry);
    if let Some(held) = table.get_ptr_mut(F::ct_key(&other)) {
        // SAFETY: as above.
        let held = unsafe { &mut *held };
        if held.points_to(key) && held.flags & CT_FLAG_FIN != 0 {
            if !expired(held) {
                held.last_seen_s = now;
            }
            held.flags |= CT_FLAG_CLOSING;
            // The time first: another CPU that reads the entry in between must not find
            // it closing and idle since long before.
            entry.last_seen_s = now;
            entry.flags |= CT_FLAG_CLOSING;
        }
    }
    true
}

/// Adds `flags` to the entry under `key` in `table`, if there is one. Whichever flow holds
/// the key, its packets carry this flow's addresses and ports where they are seen (a
/// RST there ends both), so it is not checked.
#[inline(always)]
fn add_flags<F: Family>(table: &CtTable<F>, key: &Key<F>, flags: u16) {
    if let Some(held) = table.get_ptr_mut(F::ct_key(key)) {
        // SAFETY: pointer from a successful lookup, valid for this run.
        (unsafe { &mut *held }).flags |= flags;
    }
}

/// The forward entry of a packet from the client in the main table alone (refreshed as
/// [`touch`] says).
#[inline(always)]
pub fn lookup_confirmed_forward<F: Family>(
    tuple: &Tuple<F::Addr>,
    segment: Segment,
    now: u32,
) -> Option<Entry<F>> {
    touch::<F>(
        F::conntrack(),
        true,
        &key(tuple, CT_FORWARD),
        segment,
        now,
        0,
    )
}

/// The forward entry of a packet from the client, main table first, then the unconfirmed
/// one if a flow to its frontend may wait there (the flow filter: a pod's mostly do not)
/// (refreshed as [`touch`] says).
#[inline(always)]
pub fn lookup_forward<F: Family>(
    tuple: &Tuple<F::Addr>,
    segment: Segment,
    now: u32,
) -> Option<Found<F::Addr>> {
    if let Some(entry) = lookup_confirmed_forward::<F>(tuple, segment, now) {
        return Some(Found {
            entry,
            confirmed: true,
        });
    }
    let may_wait = if F::SPLIT_FRAMES {
        flow_filter::may_be_unconfirmed(tuple)
    } else {
        flow_filter::unconfirmed_marked(tuple)
    };
    if !may_wait {
        return None;
    }
    let key = key(tuple, CT_FORWARD);
    touch::<F>(F::conntrack_new(), false, &key, segment, now, 0).map(|entry| Found {
        entry,
        confirmed: false,
    })
}

/// The reply entry of a packet from a backend, main table first. A flow's entries are
/// marked at its backend's first answer, and both marked closing by its RST, as netfilter
/// closes the whole connection: a forward entry left open would keep the backend for the
/// client's next connection from that port, whose answers no reply entry translates.
#[inline(always)]
pub fn lookup_reply<F: Family>(
    tuple: &Tuple<F::Addr>,
    segment: Segment,
    now: u32,
) -> Option<Entry<F>> {
    let key = key(tuple, CT_REPLY);
    let main = F::conntrack();
    let (table, confirmed, entry) =
        match touch::<F>(main, true, &key, segment, now, CT_FLAG_SEEN_REPLY) {
            Some(entry) => (main, true, entry),
            None => {
                let table = F::conntrack_new();
                let entry = touch::<F>(table, false, &key, segment, now, CT_FLAG_SEEN_REPLY)?;
                (table, false, entry)
            }
        };
    let answers = entry.flags & CT_FLAG_SEEN_REPLY == 0;
    let resets = segment.tcp
        && segment.ending == Ending::Reset
        && entry.flags & CT_FLAG_CLOSING == 0
        && counts(&entry, confirmed, segment.sequence_high);
    if answers || resets {
        let forward_key = key.other_direction(&entry);
        let mut set = CT_FLAG_SEEN_REPLY;
        if resets {
            set |= CT_FLAG_CLOSING;
        }
        add_flags::<F>(table, &forward_key, set);
        if answers && !confirmed && key.protocol != PROTO_TCP {
            confirm_on_reply::<F>(&key, &forward_key);
        }
    }
    Some(entry)
}

/// A UDP flow is confirmed by its backend's first answer: a request and its response (DNS)
/// is all most UDP flows are, and they would otherwise come and go in the unconfirmed
/// table, evicting the TCP handshakes that wait there. A move that fails leaves the flow
/// unconfirmed (the client's next datagram confirms it).
#[inline(always)]
fn confirm_on_reply<F: Family>(reply_key: &Key<F>, forward_key: &Key<F>) {
    if F::SPLIT_FRAMES {
        confirm_on_reply_apart::<F>(reply_key, forward_key);
    } else {
        confirm_on_reply_here::<F>(reply_key, forward_key);
    }
}

/// [`confirm_on_reply`] in a stack frame of its own ([`Family::SPLIT_FRAMES`]), which
/// holds no key: egress's chain has no room for one.
#[inline(never)]
fn confirm_on_reply_apart<F: Family>(reply_key: &Key<F>, forward_key: &Key<F>) {
    confirm_on_reply_here::<F>(reply_key, forward_key);
}

#[inline(always)]
fn confirm_on_reply_here<F: Family>(reply_key: &Key<F>, forward_key: &Key<F>) {
    let table = F::conntrack_new();
    // Both entries are copied from where they are (with the marks this packet added).
    let Some(forward) = table.get_ptr(F::ct_key(forward_key)) else {
        return;
    };
    // SAFETY: pointer from a successful lookup, valid for this run.
    let forward = unsafe { &*forward };
    if !forward.points_to(reply_key) {
        return;
    }
    let Some(held) = table.get_ptr(F::ct_key(reply_key)) else {
        return;
    };
    // SAFETY: as above.
    let held = unsafe { &*held };
    if F::conntrack()
        .insert(F::ct_key(reply_key), held, 0)
        .is_err()
    {
        return;
    }
    if F::conntrack()
        .insert(F::ct_key(forward_key), forward, 0)
        .is_err()
    {
        let _ = F::conntrack().remove(F::ct_key(reply_key));
        return;
    }
    let _ = table.remove(F::ct_key(forward_key));
    let _ = table.remove(F::ct_key(reply_key));
}

/// Moves a flow that is now confirmed to the main table: both entries written there
/// first (lookups try it first), then removed from the unconfirmed table. The packet that
/// confirms is neither a FIN nor a RST.
#[inline(always)]
pub fn confirm<F: Family>(
    arrived: &Tuple<F::Addr>,
    forward: &Entry<F>,
    now: u32,
) -> Result<(), i32> {
    if F::SPLIT_FRAMES {
        match confirm_apart::<F>(arrived, forward, now) {
            0 => Ok(()),
            error => Err(error),
        }
    } else {
        confirm_here::<F>(arrived, forward, now)
    }
}

/// [`confirm`] in a stack frame of its own ([`Family::SPLIT_FRAMES`]): 0 or a negative
/// error (a plain integer, as [`insert_snat_apart`] says why).
#[inline(never)]
fn confirm_apart<F: Family>(arrived: &Tuple<F::Addr>, forward: &Entry<F>, now: u32) -> i32 {
    match confirm_here::<F>(arrived, forward, now) {
        Ok(()) => 0,
        Err(error) => error.min(-1),
    }
}

#[inline(always)]
fn confirm_here<F: Family>(
    arrived: &Tuple<F::Addr>,
    forward: &Entry<F>,
    now: u32,
) -> Result<(), i32> {
    // Keys and entries go to the maps through `F::ct_key`/`F::ct_entry` at each call: for
    // IPv6 they are per-CPU scratch room, overwritten by the next call.
    let forward_key = key(arrived, CT_FORWARD);
    let (reply_key, built) = reply_of(arrived, forward);
    // The unconfirmed reply entry carries what the backend's answers marked, unless another
    // flow took the key since: then this flow's own reply entry is written.
    let reply = match F::conntrack_new().get_ptr(F::ct_key(&reply_key)) {
        // SAFETY: pointer from a successful lookup, valid for this run (the insert below
        // copies it).
        Some(held) if (unsafe { &*held }).points_to(&forward_key) => unsafe { &*held },
        _ => F::ct_entry(&built),
    };
    let mut forward = *forward;
    forward.last_seen_s = now;
    F::conntrack().insert(F::ct_key(&reply_key), reply, 0)?;
    F::conntrack().insert(F::ct_key(&forward_key), F::ct_entry(&forward), 0)?;
    let _ = F::conntrack_new().remove(F::ct_key(&forward_key));
    let _ = F::conntrack_new().remove(F::ct_key(&reply_key));
    Ok(())
}

/// A SYN again on an unconfirmed flow that was reset (a backend still holding state for a
/// SNAT port's previous flow answers a new SYN with an ACK, the client resets, and its SYN
/// retransmit follows): the flow starts over on the same port instead of hopping to
/// another, so that the retransmit finds the backend's state cleared. Only for a flow not
/// past its timeout (its port may have gone to another flow since); the reply entry is
/// reopened only if it is still this flow's.
#[inline(always)]
pub fn reopen<F: Family>(arrived: &Tuple<F::Addr>, entry: &mut Entry<F>) {
    if F::SPLIT_FRAMES {
        reopen_apart::<F>(arrived, entry);
    } else {
        reopen_here::<F>(arrived, entry);
    }
}

/// [`reopen`] in a stack frame of its own ([`Family::SPLIT_FRAMES`]).
#[inline(never)]
fn reopen_apart<F: Family>(arrived: &Tuple<F::Addr>, entry: &mut Entry<F>) {
    reopen_here::<F>(arrived, entry);
}

#[inline(always)]
fn reopen_here<F: Family>(arrived: &Tuple<F::Addr>, entry: &mut Entry<F>) {
    let forward_key = key(arrived, CT_FORWARD);
    let reply_key = forward_key.other_direction(entry);
    const STATE: u16 = CT_FLAG_CLOSING | CT_FLAG_FIN | CT_FLAG_SEEN_REPLY;
    entry.flags &= !STATE;
    let clear = |key: &Key<F>| {
        if let Some(held) = F::conntrack_new().get_ptr_mut(F::ct_key(key)) {
            // SAFETY: pointer from a successful lookup, valid for this run.
            (unsafe { &mut *held }).flags &= !STATE;
        }
    };
    if reply_is_ours::<F>(F::conntrack_new(), &reply_key, &forward_key) {
        clear(&reply_key);
    }
    clear(&forward_key);
}

/// Marks the reply entry of a flow closing when its client's RST counted on the forward
/// entry (`found`, as [`lookup_forward`] found it before this packet), as netfilter closes
/// the whole connection: a reply entry left open would hold its key for 6 hours.
#[inline(always)]
pub fn reset_by_client<F: Family>(
    arrived: &Tuple<F::Addr>,
    found: &Found<F::Addr>,
    segment: Segment,
) {
    if !(segment.tcp
        && segment.ending == Ending::Reset
        && found.entry.flags & CT_FLAG_CLOSING == 0
        && counts(&found.entry, found.confirmed, segment.sequence_high))
    {
        return;
    }
    if F::SPLIT_FRAMES {
        close_reply_apart::<F>(arrived, found);
    } else {
        close_reply_here::<F>(arrived, found);
    }
}

/// The reply entry's mark of [`reset_by_client`] in a stack frame of its own
/// ([`Family::SPLIT_FRAMES`]).
#[inline(never)]
fn close_reply_apart<F: Family>(arrived: &Tuple<F::Addr>, found: &Found<F::Addr>) {
    close_reply_here::<F>(arrived, found);
}

#[inline(always)]
fn close_reply_here<F: Family>(arrived: &Tuple<F::Addr>, found: &Found<F::Addr>) {
    let (table, _, reply_key) = entries_of::<F>(arrived, found);
    add_flags::<F>(table, &reply_key, CT_FLAG_CLOSING);
}

/// The table a found flow is in, and the keys of its forward and reply entries.
#[inline(always)]
fn entries_of<F: Family>(
    arrived: &Tuple<F::Addr>,
    found: &Found<F::Addr>,
) -> (&'static CtTable<F>, Key<F>, Key<F>) {
    let table = if found.confirmed {
        F::conntrack()
    } else {
        F::conntrack_new()
    };
    let forward_key = key(arrived, CT_FORWARD);
    let reply_key = forward_key.other_direction(&found.entry);
    (table, forward_key, reply_key)
}

/// Removes a flow's entries that are not to be used again (expired, or their backend
/// left), so that they can neither shadow a new flow's nor hold a SNAT port. The reply
/// entry goes only if it is still this flow's: another flow may hold the port now.
#[inline(always)]
pub fn forget<F: Family>(arrived: &Tuple<F::Addr>, found: &Found<F::Addr>) {
    if F::SPLIT_FRAMES {
        forget_apart::<F>(arrived, found);
    } else {
        forget_here::<F>(arrived, found);
    }
}

/// [`forget`] in a stack frame of its own ([`Family::SPLIT_FRAMES`]).
#[inline(never)]
fn forget_apart<F: Family>(arrived: &Tuple<F::Addr>, found: &Found<F::Addr>) {
    forget_here::<F>(arrived, found);
}

#[inline(always)]
fn forget_here<F: Family>(arrived: &Tuple<F::Addr>, found: &Found<F::Addr>) {
    let (table, forward_key, reply_key) = entries_of::<F>(arrived, found);
    if reply_is_ours::<F>(table, &reply_key, &forward_key) {
        let _ = table.remove(F::ct_key(&reply_key));
    }
    let _ = table.remove(F::ct_key(&forward_key));
}

/// What became of the closing flow a new flow found on its client's port.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TakeOver {
    /// The new flow was written over its entries.
    Taken,
    /// Its entries were removed (or had gone): the new flow is made as any other.
    Removed,
    /// Another CPU made a new flow there first (a SYN's retransmit): this packet's is not
    /// made, as with two first packets at once.
    Raced,
}

/// A new flow from the port of a closing flow that [`lookup_forward`] found in the main
/// table and left in place (a pod's TCP flow without SNAT: a client that opens connections
/// fast uses its ports again within the closing timeout). With `may_take_over` (the new
/// flow is made in the main table without SNAT) and the old flow's backend, whose keys are
/// then the new flow's, the old entries are written over in place: a fresh flow costs two
/// deletes and two inserts, each a walk of cold buckets and of the LRU's lists. Otherwise
/// the old entries are removed. (A SYN that makes no flow, refused or not ours, does not
/// get here: the entries stay, and its retransmits keep them until the client gives up.)
///
/// The addresses and ports of either version of an entry are the same, so a packet read
/// on another CPU meanwhile is translated alike. A late packet of the old flow that
/// refreshes an entry while it is written may put the old flow's flags back (closing: the
/// new flow then has the closing timeout until its next packets), as it may between a
/// remove and an insert.
///
/// IPv4 only ([`Family::SPLIT_FRAMES`] is false): IPv6's keys do not fit the stack its new
/// flows are chosen in, so its closing flows are removed, then the new one inserted.
#[inline(always)]
pub fn take_over<F: Family>(
    arrived: &Tuple<F::Addr>,
    forward: &Entry<F>,
    may_take_over: bool,
) -> TakeOver {
    let table = F::conntrack();
    let forward_key = key(arrived, CT_FORWARD);
    let Some(old) = table.get_ptr_mut(F::ct_key(&forward_key)) else {
        return TakeOver::Removed;
    };
    // SAFETY: pointers from successful lookups, valid for this run.
    let old = unsafe { &mut *old };
    // Closing when the lookup found it: only another CPU's new flow changed that.
    if old.flags & (CT_FLAG_CLOSING | CT_FLAG_SNAT) != CT_FLAG_CLOSING {
        return TakeOver::Raced;
    }
    let reply_key = forward_key.other_direction(old);
    let reply = table
        .get_ptr_mut(F::ct_key(&reply_key))
        .map(|entry| unsafe { &mut *entry })
        .filter(|entry| entry.points_to(&forward_key));
    let same_backend =
        old.destination == forward.destination && old.destination_port == forward.destination_port;
    match reply {
        Some(reply) if may_take_over && same_backend => {
            *reply = reply_entry(arrived, forward);
            *old = *forward;
            TakeOver::Taken
        }
        reply => {
            if reply.is_some() {
                let _ = table.remove(F::ct_key(&reply_key));
            }
            let _ = table.remove(F::ct_key(&forward_key));
            TakeOver::Removed
        }
    }
}

/// The reply direction of a forward entry: the key a backend's answer arrives with, and
/// what it is rewritten to ([`reply_entry`]).
#[inline(always)]
pub fn reply_of<A: Copy>(arrived: &Tuple<A>, forward: &CtEntry<A>) -> (CtKey<A>, CtEntry<A>) {
    (
        key(arrived, CT_FORWARD).other_direction(forward),
        reply_entry(arrived, forward),
    )
}

/// The reply entry of a forward entry: the frontend the client asked for, back to the
/// client. The backend's sequence numbers are not known until it answers.
#[inline(always)]
fn reply_entry<A: Copy>(arrived: &Tuple<A>, forward: &CtEntry<A>) -> CtEntry<A> {
    CtEntry {
        source: arrived.destination,
        destination: arrived.source,
        source_port: arrived.destination_port,
        destination_port: arrived.source_port,
        flags: forward.flags & !CT_FLAG_SEQUENCE,
        sequence_high: 0,
        ..*forward
    }
}

/// What a new flow's forward entry is written with: a flow that another CPU made at the
/// same time (a SYN's retransmit, two datagrams) keeps that CPU's backend, and the insert
/// fails with [`EEXIST`].
pub const NOEXIST: u64 = BPF_NOEXIST as u64;
/// The error of an insert with [`NOEXIST`] that found the key taken.
pub const EEXIST: i32 = -17;

/// Records both directions of a new flow whose source this node keeps (no SNAT), in the
/// main table if `confirmed_at_once` (see `Side`), else as not confirmed. [`EEXIST`]:
/// another CPU made the flow first.
///
/// A flow of the same client port to the same backend through another frontend has the
/// same reply key: one that is over gives the key up (its reply entry would send this
/// flow's answers back as the other frontend's), a live one keeps it, as netfilter does.
/// The new flow then waits in the unconfirmed table, where it cannot overwrite it.
#[inline(always)]
pub fn insert<F: Family>(
    arrived: &Tuple<F::Addr>,
    forward: &Entry<F>,
    timeouts: CtTimeouts,
    now: u32,
    confirmed_at_once: bool,
) -> Result<(), i32> {
    let (reply_key, reply) = reply_of(arrived, forward);
    let holder = held::<F>(
        F::conntrack(),
        true,
        &reply_key,
        timeouts,
        now,
        Closing::Ends,
    );
    let unconfirmed = !confirmed_at_once || holder == Holder::Live;
    let table = if unconfirmed {
        flow_filter::mark_unconfirmed(arrived);
        F::conntrack_new()
    } else {
        F::conntrack()
    };
    let forward_key = key(arrived, CT_FORWARD);
    table.insert(F::ct_key(&forward_key), F::ct_entry(forward), NOEXIST)?;
    table
        .insert(F::ct_key(&reply_key), F::ct_entry(&reply), 0)
        .inspect_err(|_| {
            let _ = table.remove(F::ct_key(&forward_key));
        })?;
    if unconfirmed {
        flow_filter::mark_unconfirmed(arrived);
    }
    Ok(())
}

#[derive(PartialEq, Eq)]
pub enum Holder {
    None,
    /// A flow whose entries both expired. Both are removed: the forward entry would act on
    /// the reply entry of the flow that takes the port, and the reply entry would shadow
    /// the new one (or, unconfirmed, keep the port from being claimed).
    Expired,
    Live,
}

/// Whether a flow whose entries are marked closing still holds its reply key until they
/// time out (a SNAT port is not handed out again at once), or gives it up (the key of a
/// flow without SNAT, which the client's own port makes, is wanted again by that client).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    Lives,
    Ends,
}

/// Who holds the reply key (a SNAT port) in `table`. An unconfirmed TCP flow lives as
/// long as its client sends (SYN retransmits): a backend that retransmits its SYN-ACK to a
/// spoofed client does not keep the port, even once a flood evicted the forward entry.
/// Any other flow lives while either direction does: an unconfirmed UDP flow may be a
/// server streaming to a client that sent once.
#[inline(always)]
pub fn held<F: Family>(
    table: &CtTable<F>,
    confirmed: bool,
    reply_key: &Key<F>,
    timeouts: CtTimeouts,
    now: u32,
    closing: Closing,
) -> Holder {
    let Some(reply) = table.get_ptr(F::ct_key(reply_key)) else {
        return Holder::None;
    };
    // Entries are read in place, field by field (no copy: IPv6's would not fit the stack
    // frame); a racing writer only moves a timestamp or adds flags.
    let live = |entry: &Entry<F>| {
        if closing == Closing::Ends && entry.flags & CT_FLAG_CLOSING != 0 {
            return false;
        }
        let timeout = timeouts.timeout_s(reply_key.protocol, entry.flags, confirmed);
        !entry.expired(now, timeout)
    };
    // SAFETY: pointer from a successful lookup, valid for this run.
    let reply = unsafe { &*reply };
    let reply_live = live(reply);
    // The held flow's forward entry: its client tuple is what the reply rewrites to. An
    // entry there that names another reply key is another flow's.
    let forward_key = reply_key.other_direction(reply);
    // SAFETY: as above.
    let forward = table
        .get_ptr(F::ct_key(&forward_key))
        .map(|entry| unsafe { &*entry })
        .filter(|entry| entry.points_to(reply_key));
    let forward_found = forward.is_some();
    let forward_live = forward.is_some_and(live);
    let is_live = if !confirmed && reply_key.protocol == PROTO_TCP {
        forward_live
    } else {
        forward_live || reply_live
    };
    if is_live {
        return Holder::Live;
    }
    if forward_found {
        let _ = table.remove(F::ct_key(&forward_key));
    }
    let _ = table.remove(F::ct_key(reply_key));
    Holder::Expired
}
