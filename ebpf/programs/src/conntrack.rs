//! Flows from outside the node: their two conntrack entries (forward and reply), how long
//! they live, and the SNAT source port a flow to a remote backend gets.
use aya_ebpf::{bindings::BPF_NOEXIST, helpers};
use socklb_abi::{CT_FLAG_CLOSING, CT_FORWARD, CT_REPLY, CtEntry, CtKey, NodeConfig};

use crate::{maps::CONNTRACK, packet::Tuple};

/// Random ports tried before a flow is refused for lack of a free SNAT port.
const SNAT_ATTEMPTS: u32 = 16;
const NANOS_PER_SECOND: u64 = 1_000_000_000;

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
pub fn may_be_snat_reply(tuple: &Tuple, node: Option<&NodeConfig>) -> bool {
    let port = u16::from_be(tuple.destination_port);
    node.is_some_and(|node| port >= node.snat_port_min && port <= node.snat_port_max)
}

#[inline(always)]
pub fn key(tuple: &Tuple, direction: u8) -> CtKey {
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

/// The entry of a packet's flow in `direction` as it was before this packet, which
/// refreshes it: its last-seen time moves on (written at most once a second) and a FIN or
/// RST marks it closing.
#[inline(always)]
pub fn lookup(tuple: &Tuple, direction: u8, closes: bool, now: u32) -> Option<CtEntry> {
    let entry = CONNTRACK.get_ptr_mut(&key(tuple, direction))?;
    // SAFETY: pointer from a successful lookup, valid for this run; racing writers only
    // move the timestamp or set the closing bit, both idempotent.
    let entry = unsafe { &mut *entry };
    let before = *entry;
    if entry.last_seen_s != now {
        entry.last_seen_s = now;
    }
    if closes && entry.flags & CT_FLAG_CLOSING == 0 {
        entry.flags |= CT_FLAG_CLOSING;
    }
    Some(before)
}

/// The reply direction of a forward entry: the key a backend's answer arrives with, and
/// what it is rewritten to (the frontend the client asked for, back to the client).
#[inline(always)]
pub fn reply_of(arrived: &Tuple, forward: &CtEntry) -> (CtKey, CtEntry) {
    (
        CtKey {
            source: forward.destination,
            destination: forward.source,
            source_port: forward.destination_port,
            destination_port: forward.source_port,
            protocol: arrived.protocol,
            direction: CT_REPLY,
            pad: 0,
        },
        CtEntry {
            source: arrived.destination,
            destination: arrived.source,
            source_port: arrived.destination_port,
            destination_port: arrived.source_port,
            ..*forward
        },
    )
}

/// Records both directions of a flow whose source this node keeps (no SNAT).
#[inline(always)]
pub fn insert(arrived: &Tuple, forward: &CtEntry) -> Result<(), i32> {
    let (reply_key, reply) = reply_of(arrived, forward);
    CONNTRACK.insert(&reply_key, &reply, 0)?;
    CONNTRACK.insert(&key(arrived, CT_FORWARD), forward, 0)
}

/// Records both directions of a flow SNATed to `node.snat_address` and returns the source
/// port it got: a random port of the configured range whose reply key is free, or held by
/// a flow that has expired. `None` when every attempt found a live flow.
#[inline(always)]
pub fn insert_snat(
    arrived: &Tuple,
    forward: &mut CtEntry,
    node: &NodeConfig,
    now: u32,
) -> Result<Option<u16>, i32> {
    let (min, max) = (node.snat_port_min, node.snat_port_max);
    if min == 0 || max < min {
        return Ok(None);
    }
    let span = u32::from(max - min) + 1;
    forward.source = node.snat_address;
    for _ in 0..SNAT_ATTEMPTS {
        // SAFETY: helper without arguments.
        let draw = unsafe { helpers::bpf_get_prandom_u32() };
        // span >= 1 and the sum stays within min..=max, a u16.
        let port = (u32::from(min) + draw % span) as u16;
        forward.source_port = port.to_be();
        let (reply_key, reply) = reply_of(arrived, forward);
        let taken = match CONNTRACK.insert(&reply_key, &reply, u64::from(BPF_NOEXIST)) {
            Ok(()) => false,
            Err(_) => !reclaim(&reply_key, &reply, now)?,
        };
        if !taken {
            CONNTRACK.insert(&key(arrived, CT_FORWARD), forward, 0)?;
            return Ok(Some(port));
        }
    }
    Ok(None)
}

/// Takes over a reply key whose flow expired in both directions; false if it is live.
#[inline(always)]
fn reclaim(reply_key: &CtKey, reply: &CtEntry, now: u32) -> Result<bool, i32> {
    if let Some(held) = CONNTRACK.get_ptr(reply_key) {
        // SAFETY: pointer from a successful lookup; copied out at once.
        let held = unsafe { *held };
        if !held.expired(reply_key.protocol, now) {
            return Ok(false);
        }
        // The held flow's forward entry: its client tuple is what the reply rewrites to.
        let forward_key = CtKey {
            source: held.destination,
            destination: held.source,
            source_port: held.destination_port,
            destination_port: held.source_port,
            protocol: reply_key.protocol,
            direction: CT_FORWARD,
            pad: 0,
        };
        if let Some(forward) = CONNTRACK.get_ptr(&forward_key) {
            // SAFETY: as above.
            if !unsafe { *forward }.expired(reply_key.protocol, now) {
                return Ok(false);
            }
        }
    }
    CONNTRACK.insert(reply_key, reply, 0)?;
    Ok(true)
}
