//! The writer's mirror of the backend maps: each backend by id, found by address too, with
//! how many slots name it, and the ids handed out. At 100,000 Services of 10 endpoints it
//! holds a million backends, so each is stored once: the index by address keeps ids only,
//! and the reference count lives beside the backend rather than in a map of its own.
//!
//! Ids are dense within each family: the lowest free one is handed out, so that the IPv4
//! backend map, an array indexed by id, is about as large as the backends it holds. IPv6
//! ids carry [`IPV6_ID`], so that an id alone says which map holds it. An id freed by a
//! removal is deleted last in its apply and handed out again at a later one: a lookup that
//! read it from a slot just before the slot changed finds its backend or nothing (and
//! draws again), never another. The programs compare a flow's backend address with the
//! id's, and an affinity follows its slot, so a reused id never leads a flow to a backend
//! it was not given.
use std::{collections::BTreeSet, hash::BuildHasher};

use hashbrown::{DefaultHashBuilder, HashTable};

use crate::desired::{BackendAddr, Protocol};

/// The bit that marks an IPv6 backend's id (the programs read it too); the bits below are
/// its index in its family.
pub const IPV6_ID: u32 = socklb_abi::BACKEND_ID_IPV6;

#[derive(Clone, Copy, Debug)]
struct Entry {
    addr: BackendAddr,
    protocol: Protocol,
    /// Slots naming it.
    refs: u32,
}

/// One family's backends, by index (0 is never one).
#[derive(Debug, Default)]
struct Family {
    /// No `None` at the end.
    by_index: Vec<Option<Entry>>,
    /// The indexes below `by_index.len()` no backend holds (0 aside), lowest first.
    vacant: BTreeSet<u32>,
    held: usize,
}

impl Family {
    fn get(&self, index: u32) -> Option<&Entry> {
        self.by_index.get(index as usize)?.as_ref()
    }

    fn get_mut(&mut self, index: u32) -> Option<&mut Entry> {
        self.by_index.get_mut(index as usize)?.as_mut()
    }

    /// The indexes the next backends get, lowest first.
    fn vacant(&self) -> impl Iterator<Item = u32> + '_ {
        let past_the_end = u32::try_from(self.by_index.len().max(1)).unwrap_or(u32::MAX);
        self.vacant.iter().copied().chain(past_the_end..)
    }

    /// Puts `entry` at `index`; the entry it replaces, if any.
    fn put(&mut self, index: u32, entry: Entry) -> Option<Entry> {
        let at = index as usize;
        if at >= self.by_index.len() {
            let first_new = u32::try_from(self.by_index.len().max(1)).unwrap_or(u32::MAX);
            self.vacant.extend(first_new..index);
            self.by_index.resize(at + 1, None);
        }
        self.vacant.remove(&index);
        let replaced = self.by_index[at].replace(entry);
        self.held += usize::from(replaced.is_none());
        replaced
    }

    fn take(&mut self, index: u32) -> Option<Entry> {
        let entry = self.by_index.get_mut(index as usize)?.take()?;
        self.held -= 1;
        self.vacant.insert(index);
        // No free index past the last held one: the span shrinks back.
        while self.by_index.last().is_some_and(Option::is_none) {
            self.by_index.pop();
            let past = u32::try_from(self.by_index.len()).unwrap_or(u32::MAX);
            self.vacant.remove(&past);
        }
        Some(entry)
    }

    /// Held indexes from `from` on, in order.
    fn held_from(&self, from: u32) -> impl Iterator<Item = u32> + '_ {
        let held = self.by_index.iter().enumerate().skip(from as usize);
        held.filter(|(_, entry)| entry.is_some())
            .map(|(index, _)| u32::try_from(index).unwrap_or(u32::MAX))
    }
}

#[derive(Debug, Default)]
pub(super) struct Backends {
    /// IPv4, then IPv6.
    families: [Family; 2],
    /// Ids of the backends that can be found by address, hashed by what they name.
    index: HashTable<u32>,
    /// foldhash, seeded per process as std's SipHash is: SipHash made a fifth of a full
    /// resync of 100,000 Services.
    hasher: DefaultHashBuilder,
    /// Backends no slot names: deleted at the end of the next apply.
    unreferenced: BTreeSet<u32>,
}

/// The family (0: IPv4, 1: IPv6) and index of `id`.
fn split(id: u32) -> (usize, u32) {
    (usize::from(id & IPV6_ID != 0), id & !IPV6_ID)
}

fn id_of(ipv6: bool, index: u32) -> u32 {
    if ipv6 { index | IPV6_ID } else { index }
}

/// Whether `id` is one this mirror may hold for a backend at `addr`: an index in the
/// family's own range, tagged as the family is.
pub fn fits_family(id: u32, addr: &BackendAddr) -> bool {
    id != 0 && (id & IPV6_ID != 0) == addr.address.is_ipv6() && id != IPV6_ID
}

impl Backends {
    pub(super) fn clear(&mut self) {
        self.families = Default::default();
        self.index.clear();
        self.unreferenced.clear();
    }

    /// Room for `additional` more backends, in the table and in the index.
    pub(super) fn reserve(&mut self, additional: usize) {
        let (families, hasher) = (&self.families, &self.hasher);
        self.index.reserve(additional, |id| {
            let entry = held_entry(families, *id).expect("indexed ids are held");
            hasher.hash_one((&entry.addr, entry.protocol))
        });
    }

    pub(super) fn len(&self) -> usize {
        self.families.iter().map(|family| family.held).sum()
    }

    /// How many backends of one family it holds: IPv6 if `ipv6`, else IPv4.
    pub(super) fn count(&self, ipv6: bool) -> usize {
        self.families[usize::from(ipv6)].held
    }

    /// The ids the next backends of a family get, lowest first (none is taken until
    /// inserted).
    pub(super) fn vacant_ids(&self, ipv6: bool) -> impl Iterator<Item = u32> + '_ {
        let family = &self.families[usize::from(ipv6)];
        family.vacant().map(move |index| id_of(ipv6, index))
    }

    /// Entries an array indexed by a family's ids needs (index 0 included) to hold every
    /// id given to the backends held now and `new` more: the n-th lowest free index is at
    /// most `held + n`.
    pub(super) fn id_span(&self, ipv6: bool, new: usize) -> usize {
        self.count(ipv6) + new + 1
    }

    pub(super) fn contains(&self, id: u32) -> bool {
        held_entry(&self.families, id).is_some()
    }

    pub(super) fn get(&self, id: u32) -> Option<(BackendAddr, Protocol)> {
        held_entry(&self.families, id).map(|entry| (entry.addr, entry.protocol))
    }

    /// The ids held from `from` on, in order (IPv4's, then IPv6's).
    pub(super) fn held_from(&self, from: u32) -> impl Iterator<Item = u32> + '_ {
        let (family, index) = split(from);
        let ipv4 = (family == 0).then(|| self.families[0].held_from(index));
        let ipv6_from = if family == 0 { 0 } else { index };
        let ipv6 = self.families[1]
            .held_from(ipv6_from)
            .map(|i| id_of(true, i));
        ipv4.into_iter().flatten().chain(ipv6)
    }

    /// The id of the backend at `addr` for `protocol`, if one can be found by address.
    pub(super) fn id_of(&self, addr: &BackendAddr, protocol: Protocol) -> Option<u32> {
        let hash = self.hasher.hash_one((addr, protocol));
        let families = &self.families;
        self.index
            .find(hash, |id| {
                held_entry(families, *id).is_some_and(|e| (e.addr, e.protocol) == (*addr, protocol))
            })
            .copied()
    }

    /// Adds a backend no slot names yet; `indexed`: it can be found by address (the first
    /// id of an address wins, as when the maps hold two). `id` must fit its family
    /// ([`fits_family`]).
    pub(super) fn insert(&mut self, id: u32, addr: BackendAddr, protocol: Protocol, indexed: bool) {
        let indexed = indexed && self.id_of(&addr, protocol).is_none();
        self.add(id, addr, protocol, indexed);
    }

    /// Adds a backend no slot names yet, whose address the caller found no backend of.
    pub(super) fn insert_new(&mut self, id: u32, addr: BackendAddr, protocol: Protocol) {
        self.add(id, addr, protocol, true);
    }

    fn add(&mut self, id: u32, addr: BackendAddr, protocol: Protocol, indexed: bool) {
        let (family, index) = split(id);
        let entry = Entry {
            addr,
            protocol,
            refs: 0,
        };
        self.families[family].put(index, entry);
        self.unreferenced.insert(id);
        if indexed {
            let (families, hasher) = (&self.families, &self.hasher);
            let hash = hasher.hash_one((&addr, protocol));
            self.index.insert_unique(hash, id, |id| {
                let entry = held_entry(families, *id).expect("indexed ids are held");
                hasher.hash_one((&entry.addr, entry.protocol))
            });
        }
    }

    /// Counts slots as naming (`added`) or no longer naming their backends. Ids of no
    /// backend (0: a slot that could not be read) are not counted.
    pub(super) fn reference(&mut self, ids: &[u32], added: bool) {
        for id in ids {
            let (family, index) = split(*id);
            let Some(entry) = self.families[family].get_mut(index) else {
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
        let (family, index) = split(id);
        let Some(entry) = self.families[family].take(index) else {
            return;
        };
        let hash = self.hasher.hash_one((&entry.addr, entry.protocol));
        if let Ok(found) = self.index.find_entry(hash, |indexed| *indexed == id) {
            found.remove();
        }
        self.unreferenced.remove(&id);
    }
}

/// The backend holding `id`, if one does.
fn held_entry(families: &[Family; 2], id: u32) -> Option<&Entry> {
    let (family, index) = split(id);
    families[family].get(index)
}
