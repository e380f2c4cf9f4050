//! The writer's mirror of the backend map: each backend by id, found by address too, with
//! how many slots name it. At 100,000 Services of 10 endpoints it holds a million backends,
//! so each is stored once: the index by address keeps ids only, and the reference count
//! lives beside the backend rather than in a map of its own.
use std::{collections::BTreeSet, hash::BuildHasher};

use hashbrown::{DefaultHashBuilder, HashMap, HashTable};

use crate::desired::{BackendAddr, Protocol};

#[derive(Clone, Copy, Debug)]
struct Entry {
    addr: BackendAddr,
    protocol: Protocol,
    /// Slots naming it.
    refs: u32,
}

#[derive(Debug, Default)]
pub(super) struct Backends {
    by_id: HashMap<u32, Entry>,
    /// Ids of the backends that can be found by address, hashed by what they name.
    index: HashTable<u32>,
    /// foldhash, seeded per process as std's SipHash is: SipHash made a fifth of a full
    /// resync of 100,000 Services.
    hasher: DefaultHashBuilder,
    /// Backends no slot names: deleted at the end of the next apply.
    unreferenced: BTreeSet<u32>,
    /// No id held is above it (removals leave it as it is).
    last_id: u32,
    /// How many of them are IPv6 (their own map, sized apart).
    ipv6: usize,
}

impl Backends {
    pub(super) fn clear(&mut self) {
        self.by_id.clear();
        self.index.clear();
        self.unreferenced.clear();
        self.last_id = 0;
        self.ipv6 = 0;
    }

    /// Room for `additional` more backends, in the table and in the index.
    pub(super) fn reserve(&mut self, additional: usize) {
        self.by_id.reserve(additional);
        let (by_id, hasher) = (&self.by_id, &self.hasher);
        self.index.reserve(additional, |id| {
            let entry = &by_id[id];
            hasher.hash_one((&entry.addr, entry.protocol))
        });
    }

    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// How many backends of one family it holds: IPv6 if `ipv6`, else IPv4.
    pub(super) fn count(&self, ipv6: bool) -> usize {
        if ipv6 {
            self.ipv6
        } else {
            self.by_id.len() - self.ipv6
        }
    }

    pub(super) fn contains(&self, id: u32) -> bool {
        self.by_id.contains_key(&id)
    }

    pub(super) fn get(&self, id: u32) -> Option<(BackendAddr, Protocol)> {
        self.by_id
            .get(&id)
            .map(|entry| (entry.addr, entry.protocol))
    }

    /// No id held is above it (0: none was ever held since the last clear).
    pub(super) fn last_id(&self) -> u32 {
        self.last_id
    }

    /// The id of the backend at `addr` for `protocol`, if one can be found by address.
    pub(super) fn id_of(&self, addr: &BackendAddr, protocol: Protocol) -> Option<u32> {
        let hash = self.hasher.hash_one((addr, protocol));
        let by_id = &self.by_id;
        self.index
            .find(hash, |id| {
                by_id
                    .get(id)
                    .is_some_and(|e| (e.addr, e.protocol) == (*addr, protocol))
            })
            .copied()
    }

    /// Adds a backend no slot names yet; `indexed`: it can be found by address (the first
    /// id of an address wins, as when the maps hold two).
    pub(super) fn insert(&mut self, id: u32, addr: BackendAddr, protocol: Protocol, indexed: bool) {
        let indexed = indexed && self.id_of(&addr, protocol).is_none();
        self.add(id, addr, protocol, indexed);
    }

    /// Adds a backend no slot names yet, whose address the caller found no backend of.
    pub(super) fn insert_new(&mut self, id: u32, addr: BackendAddr, protocol: Protocol) {
        self.add(id, addr, protocol, true);
    }

    fn add(&mut self, id: u32, addr: BackendAddr, protocol: Protocol, indexed: bool) {
        self.last_id = self.last_id.max(id);
        let replaced = self.by_id.insert(
            id,
            Entry {
                addr,
                protocol,
                refs: 0,
            },
        );
        if replaced.is_some_and(|old| old.addr.address.is_ipv6()) {
            self.ipv6 -= 1;
        }
        if addr.address.is_ipv6() {
            self.ipv6 += 1;
        }
        self.unreferenced.insert(id);
        if indexed {
            let (by_id, hasher) = (&self.by_id, &self.hasher);
            let hash = hasher.hash_one((&addr, protocol));
            self.index.insert_unique(hash, id, |id| {
                let entry = &by_id[id];
                hasher.hash_one((&entry.addr, entry.protocol))
            });
        }
    }

    /// Counts slots as naming (`added`) or no longer naming their backends. Ids of no
    /// backend (0: a slot that could not be read) are not counted.
    pub(super) fn reference(&mut self, ids: &[u32], added: bool) {
        for id in ids {
            let Some(entry) = self.by_id.get_mut(id) else {
                continue;
            };
            if added {
                entry.refs += 1;
                self.unreferenced.remove(id);
            } else {
                entry.refs = entry.refs.saturating_sub(1);
                if entry.refs == 0 {
                    self.unreferenced.insert(*id);
                }
            }
        }
    }

    /// The backends no slot names, handed over for deletion.
    pub(super) fn take_unreferenced(&mut self) -> BTreeSet<u32> {
        std::mem::take(&mut self.unreferenced)
    }

    pub(super) fn remove(&mut self, id: u32) {
        let Some(entry) = self.by_id.remove(&id) else {
            return;
        };
        if entry.addr.address.is_ipv6() {
            self.ipv6 -= 1;
        }
        let hash = self.hasher.hash_one((&entry.addr, entry.protocol));
        if let Ok(found) = self.index.find_entry(hash, |indexed| *indexed == id) {
            found.remove();
        }
        self.unreferenced.remove(&id);
    }
}
