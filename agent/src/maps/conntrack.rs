//! The conntrack tables' expired entries, removed by the agent. The programs remove an
//! entry past its idle timeout only when a packet of its flow comes: without a sweep, a
//! table fills with flows long over, and from then on every new flow makes the LRU evict,
//! in the order of last use, so that a live flow idle for a while (a pooled connection)
//! goes before the dead flows that ended after its last packet. Each eviction also costs
//! the new flow's first packet a walk through a cold bucket. netfilter and Cilium sweep
//! their tables for the same reasons.
use aya::{
    Pod,
    maps::{HashMap, MapData, MapError},
};
use socklb_abi::{CtEntry, CtKey, CtTimeouts};

use super::batch;

/// Which entries a sweep removes: those the programs would no longer follow.
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

/// Removes the expired entries of `map` (a main table if `confirmed`): read a chunk at a
/// time, each one looked up again just before its removal, so that an entry a packet
/// refreshed, or a new flow of the same key wrote, since the chunk was read stays. Returns
/// how many were removed.
pub fn remove_expired<A>(
    map: &mut HashMap<MapData, CtKey<A>, CtEntry<A>>,
    confirmed: bool,
    expiry: Expiry,
) -> Result<usize, MapError>
where
    CtKey<A>: Pod + Default,
    CtEntry<A>: Pod + Default,
{
    let mut removed = 0;
    let mut from = None;
    loop {
        let (entries, next) = batch::chunk(map, from)?;
        for (key, entry) in entries {
            if !expiry.expired(&key, &entry, confirmed) {
                continue;
            }
            match map.get(&key, 0) {
                Ok(entry) if expiry.expired(&key, &entry, confirmed) => {}
                // Refreshed, written anew, or gone (a packet removed it, or the LRU did).
                Ok(_) | Err(MapError::KeyNotFound) => continue,
                Err(error) => return Err(error),
            }
            match map.remove(&key) {
                Ok(()) => removed += 1,
                Err(MapError::KeyNotFound) => {}
                Err(error) => return Err(error),
            }
        }
        match next {
            Some(next) => from = Some(next),
            None => return Ok(removed),
        }
    }
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
