//! The conntrack tables' expired entries, removed by the agent (its conntrack GC). The
//! programs remove an entry past its idle timeout only when a packet of its flow comes:
//! left alone, a table fills with flows long over, and from then on every new flow makes
//! the LRU evict, in the order of last use, so that a live flow idle for a while (a pooled
//! connection) goes before the dead flows that ended after its last packet. Each eviction
//! also costs the new flow's first packet a walk through a cold bucket. netfilter and
//! Cilium collect their tables' expired entries for the same reasons.
use std::os::fd::{AsFd as _, BorrowedFd};

use aya::{
    Pod,
    maps::{HashMap, IterableMap, MapData, MapError},
};
use socklb_abi::{CtEntry, CtKey, CtTimeouts};

use super::batch::{self, Taken};

/// `BPF_NOEXIST`: put an entry back only where no other was written meanwhile.
const BPF_NOEXIST: u64 = 1;

/// Which entries a GC pass removes: those the programs would no longer follow.
#[derive(Clone, Copy, Debug)]
pub struct Expiry {
    /// The timeouts the programs apply (the node map's).
    pub timeouts: CtTimeouts,
    /// CLOCK_MONOTONIC in seconds, read before the walk: the clock of `last_seen_s`.
    pub now_s: u32,
}

impl Expiry {
    /// Whether `entry` (in a main table if `confirmed`) is past its timeout by more than a
    /// second: the programs read the coarse clock, which lags this one by up to a tick,
    /// so a second's margin keeps every entry a program would still follow. An entry seen
    /// after `now_s` was read (during the walk) is live.
    pub fn expired<A>(&self, key: &CtKey<A>, entry: &CtEntry<A>, confirmed: bool) -> bool {
        let timeout = self
            .timeouts
            .timeout_s(key.protocol, entry.flags, confirmed);
        self.now_s
            .checked_sub(entry.last_seen_s)
            .is_some_and(|idle| idle > timeout.saturating_add(1))
    }
}

/// Removes the expired entries of `map` (a main table if `confirmed`), read a chunk at a
/// time, and returns how many went. An entry whose flow lives by its other direction stays:
/// the programs count a flow live while either direction is (`conntrack::held`: a client
/// streaming to a silent server keeps its SNAT port by its forward entry alone, so its
/// reply entry must stay too). Each entry is taken out in one step and put back if it
/// turns out live: a packet refreshed it, or a new flow wrote its key, since the chunk
/// was read.
pub fn remove_expired<A>(
    map: &mut HashMap<MapData, CtKey<A>, CtEntry<A>>,
    confirmed: bool,
    expiry: Expiry,
) -> Result<usize, MapError>
where
    A: Copy + PartialEq,
    CtKey<A>: Pod + Default,
    CtEntry<A>: Pod + Default,
{
    let mut removed = 0;
    let mut from = None;
    loop {
        let (entries, next) = batch::chunk(map, from)?;
        for (key, entry) in entries {
            if expiry.expired(&key, &entry, confirmed)
                && !other_direction_lives(map, &key, &entry, confirmed, expiry)?
                && remove_if_expired(map, &key, confirmed, expiry)?
            {
                removed += 1;
            }
        }
        match next {
            Some(next) => from = Some(next),
            None => return Ok(removed),
        }
    }
}

/// Whether the other direction of the flow whose entry under `key` is `entry` has a live
/// entry in `map`.
fn other_direction_lives<A>(
    map: &HashMap<MapData, CtKey<A>, CtEntry<A>>,
    key: &CtKey<A>,
    entry: &CtEntry<A>,
    confirmed: bool,
    expiry: Expiry,
) -> Result<bool, MapError>
where
    A: Copy + PartialEq,
    CtKey<A>: Pod,
    CtEntry<A>: Pod,
{
    let other = key.other_direction(entry);
    match map.get(&other, 0) {
        Ok(held) => Ok(held.points_to(key) && !expiry.expired(&other, &held, confirmed)),
        Err(MapError::KeyNotFound) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Removes the entry under `key` if it is (still) expired; whether it did.
fn remove_if_expired<A>(
    map: &mut HashMap<MapData, CtKey<A>, CtEntry<A>>,
    key: &CtKey<A>,
    confirmed: bool,
    expiry: Expiry,
) -> Result<bool, MapError>
where
    CtKey<A>: Pod,
    CtEntry<A>: Pod + Default,
{
    let taken = batch::take::<CtKey<A>, CtEntry<A>>(map_fd(map), key).map_err(|io_error| {
        MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_lookup_and_delete_elem",
            io_error,
        })
    })?;
    match taken {
        Taken::Was(entry) if expiry.expired(key, &entry, confirmed) => Ok(true),
        // Live after all: back, unless a new flow wrote the key meanwhile.
        Taken::Was(entry) => match map.insert(key, &entry, BPF_NOEXIST) {
            Ok(()) => Ok(false),
            Err(MapError::SyscallError(error))
                if error.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                Ok(false)
            }
            Err(error) => Err(error),
        },
        Taken::Absent => Ok(false),
        // Read, then deleted: a packet may refresh the entry in between.
        Taken::Unsupported => match map.get(key, 0) {
            Ok(entry) if expiry.expired(key, &entry, confirmed) => match map.remove(key) {
                Ok(()) => Ok(true),
                Err(MapError::KeyNotFound) => Ok(false),
                Err(error) => Err(error),
            },
            Ok(_) | Err(MapError::KeyNotFound) => Ok(false),
            Err(error) => Err(error),
        },
    }
}

fn map_fd<K: Pod, V: Pod>(map: &HashMap<MapData, K, V>) -> BorrowedFd<'_> {
    IterableMap::map(map).fd().as_fd()
}

#[cfg(test)]
mod tests {
    use socklb_abi::{CT_FLAG_CLOSING, CT_FLAG_SEEN_REPLY, PROTO_TCP, PROTO_UDP};

    use super::*;

    const TIMEOUTS: CtTimeouts = CtTimeouts {
        syn_s: 60,
        established_s: 21_600,
        closing_s: 10,
        udp_s: 30,
    };

    #[test]
    fn an_entry_is_removed_a_second_after_the_programs_stop_following_it() {
        let now_s = 100_000;
        // (protocol, flags, confirmed, idle seconds, removed)
        let rows = [
            (PROTO_TCP, CT_FLAG_CLOSING, true, 11, false),
            (PROTO_TCP, CT_FLAG_CLOSING, true, 12, true),
            (
                PROTO_TCP,
                CT_FLAG_CLOSING | CT_FLAG_SEEN_REPLY,
                false,
                12,
                true,
            ),
            (PROTO_TCP, CT_FLAG_SEEN_REPLY, true, 12, false),
            (PROTO_TCP, CT_FLAG_SEEN_REPLY, true, 21_602, true),
            // Answered but not confirmed: still a handshake.
            (PROTO_TCP, CT_FLAG_SEEN_REPLY, false, 62, true),
            (PROTO_TCP, 0, true, 61, false),
            (PROTO_TCP, 0, true, 62, true),
            (PROTO_UDP, CT_FLAG_SEEN_REPLY, true, 31, false),
            (PROTO_UDP, 0, false, 32, true),
            (PROTO_TCP, CT_FLAG_CLOSING, true, 0, false),
        ];
        let expiry = Expiry {
            timeouts: TIMEOUTS,
            now_s,
        };
        for (protocol, flags, confirmed, idle, removed) in rows {
            let key = CtKey::<u32> {
                protocol,
                ..CtKey::default()
            };
            let entry = CtEntry::<u32> {
                flags,
                last_seen_s: now_s - idle,
                ..CtEntry::default()
            };
            assert_eq!(
                expiry.expired(&key, &entry, confirmed),
                removed,
                "protocol {protocol} flags {flags:#x} confirmed {confirmed} idle {idle}s"
            );
        }
    }

    #[test]
    fn an_entry_seen_during_the_walk_is_live() {
        let expiry = Expiry {
            timeouts: TIMEOUTS,
            now_s: 100,
        };
        let key = CtKey::<u32> {
            protocol: PROTO_TCP,
            ..CtKey::default()
        };
        let entry = CtEntry::<u32> {
            flags: CT_FLAG_CLOSING,
            last_seen_s: 101,
            ..CtEntry::default()
        };
        assert!(!expiry.expired(&key, &entry, true));
    }
}
