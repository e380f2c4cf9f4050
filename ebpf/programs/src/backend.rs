//! Backend choice, for the socket hooks (a connect or a datagram) and for flows from
//! outside (TC): the client's session-affinity slot while it is fresh (one implementation
//! for both), else the flow's Maglev position (TC, Services that ask for it), else a draw:
//! random per connection, or per socket for UDP so that one socket stays with one server.
use aya_ebpf::helpers;
use socklb_abi::{
    AffinityEntry, AffinityKey, MaglevKey, SERVICE_FLAG_AFFINITY, SERVICE_FLAG_MAGLEV,
    TRACE_REASON_AFFINITY, TRACE_REASON_MAGLEV, TRACE_REASON_RANDOM,
};

use crate::{
    context::SockAddr,
    counters::bump,
    family, log,
    maps::{AFFINITY, MAGLEV, NODE, SLOTS},
    packet::Tuple,
    socket_family::{self, Master},
};

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// How a socket's slot is drawn when session affinity does not decide.
#[derive(Clone, Copy)]
pub enum Pick {
    /// Every connection draws a new backend (TCP).
    Random,
    /// A socket keeps its backend for as long as the backend set is unchanged (UDP), so
    /// that replies and later datagrams of one socket stay with one server.
    PerSocket,
}

/// Chooses a socket's backend slot: the affinity entry's if it is fresh and its backend
/// still holds that slot, else a new draw (recorded for affinity when the service asks for
/// it). Gives the backend, its slot and whether affinity chose it; `None` when the slot
/// drawn does not exist (any more).
#[inline(always)]
pub fn for_socket<F: socket_family::Family>(
    sock: &SockAddr,
    master: &Master,
    cookie: u64,
    pick: Pick,
) -> Option<(socket_family::Slot<F::Address>, u16, bool)> {
    let count = master.count;
    if master.flags & SERVICE_FLAG_AFFINITY == 0 {
        let slot = pick_slot(pick, count, cookie);
        return Some((backend_in_slot::<F>(master, slot)?, slot, false));
    }

    // SAFETY: helper without arguments.
    let now = unsafe { helpers::bpf_ktime_get_ns() };
    // One affinity map for both families: service ids are one space.
    let affinity_key = AffinityKey {
        netns_cookie: sock.netns_cookie(),
        service_id: master.service_id,
        pad: 0,
    };
    if let Some(entry) = AFFINITY.get_ptr_mut(&affinity_key)
        && let Some((backend, slot)) =
            remembered(entry, master.affinity_timeout_s, count, now, true, |slot| {
                backend_in_slot::<F>(master, slot).map(|backend| (backend, backend.backend_id))
            })
    {
        return Some((backend, slot, true));
    }

    let slot = pick_slot(pick, count, cookie);
    let backend = backend_in_slot::<F>(master, slot)?;
    // A full LRU that cannot take the entry costs the affinity of this one connection,
    // never the connection: counted, and the draw stands.
    let entry = affinity_entry(now, backend.backend_id, slot);
    if let Err(error) = AFFINITY.insert(&affinity_key, &entry, 0) {
        log::affinity_not_written(error);
        bump(|c| &mut c.errors);
    }
    Some((backend, slot, false))
}

/// The backend in `slot` (`1..=count`) of a socket's frontend: id, address and port;
/// `None` if the slot array has no such index or its id names no backend of this family.
#[inline(always)]
fn backend_in_slot<F: socket_family::Family>(
    master: &Master,
    slot: u16,
) -> Option<socket_family::Slot<F::Address>> {
    F::backend(slot_id(master.first_slot, slot)?)
}

/// The backend id in `slot` (`1..=count`) of the frontend whose slots start at
/// `first_slot`; `None` past the slot array's end.
#[inline(always)]
pub fn slot_id(first_slot: u32, slot: u16) -> Option<u32> {
    let index = first_slot.checked_add(u32::from(slot))?.checked_sub(1)?;
    let pair = SLOTS.get_ptr(index >> 1)?;
    // SAFETY: pointer from a successful lookup, to 8 aligned bytes: read in one load, whose
    // halves are the slots (little-endian: the even one low).
    let both = unsafe { *pair.cast::<u64>() };
    Some((both >> ((index & 1) * 32)) as u32)
}

/// The backend slot of a new flow of the per-packet path, and its number: the client's
/// session-affinity choice if fresh, else its Maglev position, else a random slot (with the
/// `TRACE_REASON_*` saying which); the affinity entry is recorded or refreshed only if
/// `record`. `None` (logged): the slot is missing, or the affinity entry was not written.
#[inline(always)]
pub fn for_flow<F: family::Family>(
    master: &family::Master,
    tuple: &Tuple<F::Addr>,
    count: u32,
    record: bool,
) -> Option<(family::Slot<F::Addr>, u16, u8)> {
    let affinity = (master.flags & SERVICE_FLAG_AFFINITY != 0)
        .then(|| F::affinity_key(tuple.source, master.service_id));
    // SAFETY: helper without arguments.
    let now_ns = unsafe { helpers::bpf_ktime_get_ns() };
    let remembered = affinity.as_ref().and_then(|affinity| {
        let entry = F::affinity().get_ptr_mut(affinity)?;
        remembered(
            entry,
            master.affinity_timeout_s,
            master.count,
            now_ns,
            record,
            |slot| family::backend_slot::<F>(master, slot).map(|backend| ((), backend.backend_id)),
        )
        .map(|((), slot)| slot)
    });
    let maglev = remembered
        .is_none()
        .then(|| maglev_slot::<F>(master, tuple, count))
        .flatten();
    let (slot, reason) = match (remembered, maglev) {
        (Some(slot), _) => (slot, TRACE_REASON_AFFINITY),
        (None, Some(slot)) => (slot, TRACE_REASON_MAGLEV),
        (None, None) => {
            // SAFETY: helper without arguments.
            let draw = unsafe { helpers::bpf_get_prandom_u32() };
            // count is at most u16::MAX, so the slot fits.
            ((draw % count + 1) as u16, TRACE_REASON_RANDOM)
        }
    };
    let Some(backend) = family::backend_slot::<F>(master, slot) else {
        F::log_missing_slot(tuple.destination, tuple.destination_port, count, slot);
        return None;
    };
    match (&affinity, remembered) {
        (Some(_), Some(_)) => bump(|c| &mut c.affinity_hits),
        (Some(affinity), None) if record => {
            let entry = affinity_entry(now_ns, backend.backend_id, slot);
            if let Err(error) = F::affinity().insert(affinity, &entry, 0) {
                log::external_affinity_not_written(error);
                return None;
            }
        }
        _ => {}
    }
    Some((backend, slot, reason))
}

/// The slot a client's affinity `entry` remembers, with what `backend` reads there (and its
/// id): if the entry was used within `timeout_s`, names one of the `count` slots, and that
/// slot still holds the entry's backend. Its last use becomes `now_ns` if `refresh`.
#[inline(always)]
fn remembered<B>(
    entry: *mut AffinityEntry,
    timeout_s: u32,
    count: u16,
    now_ns: u64,
    refresh: bool,
    backend: impl FnOnce(u16) -> Option<(B, u32)>,
) -> Option<(B, u16)> {
    // SAFETY: a pointer from a successful map lookup, valid for this run.
    let entry = unsafe { &mut *entry };
    let timeout_ns = u64::from(timeout_s) * NANOS_PER_SECOND;
    if now_ns.wrapping_sub(entry.last_used_ns) > timeout_ns || entry.slot == 0 || entry.slot > count
    {
        return None;
    }
    let (found, id) = backend(entry.slot)?;
    if id != entry.backend_id {
        return None;
    }
    if refresh {
        entry.last_used_ns = now_ns;
    }
    Some((found, entry.slot))
}

/// A client's new affinity entry: `backend_id` in `slot`, used at `now_ns`.
#[inline(always)]
fn affinity_entry(now_ns: u64, backend_id: u32, slot: u16) -> AffinityEntry {
    AffinityEntry {
        last_used_ns: now_ns,
        backend_id,
        slot,
        pad: 0,
    }
}

/// The slot at the flow's position in the frontend's Maglev table, if it has one (the
/// hash: [`family::Family::flow_hash`]). A missing entry or a slot beyond the current
/// count (a table being rewritten) falls back to a random slot.
#[inline(always)]
fn maglev_slot<F: family::Family>(
    master: &family::Master,
    tuple: &Tuple<F::Addr>,
    count: u32,
) -> Option<u16> {
    if master.flags & SERVICE_FLAG_MAGLEV == 0 {
        return None;
    }
    let size = NODE.get(0)?.maglev_table_size;
    if size == 0 {
        return None;
    }
    let key = MaglevKey {
        service_id: master.service_id,
        index: F::flow_hash(tuple) % size,
    };
    // SAFETY: pointer from a successful lookup; copied out at once.
    let slot = unsafe { *MAGLEV.get_ptr(&key)? };
    (slot >= 1 && slot <= count).then_some(slot as u16)
}

/// A slot in `1..=count`; `count` is never 0 here, and the guard keeps the modulo free of
/// a panic path the verifier would reject.
#[inline(always)]
fn pick_slot(pick: Pick, count: u16, cookie: u64) -> u16 {
    let count = u32::from(count);
    if count == 0 {
        return 1;
    }
    let draw = match pick {
        // SAFETY: helper without arguments.
        Pick::Random => unsafe { helpers::bpf_get_prandom_u32() },
        Pick::PerSocket => mix(cookie),
    };
    // count <= u16::MAX, so the slot fits.
    ((draw % count) + 1) as u16
}

/// Spreads consecutive socket cookies (and flow hashes) over the slots (splitmix64's
/// finaliser).
#[inline(always)]
pub fn mix(cookie: u64) -> u32 {
    let mut x = cookie;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x as u32
}
