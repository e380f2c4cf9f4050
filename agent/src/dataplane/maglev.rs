//! Maglev consistent hashing (Eisenbud et al., NSDI 2016) for traffic from outside the node,
//! and the writer of its lookup tables.
//!
//! Every node computes the same table from the same backends (named `address:port`, order
//! irrelevant), and the TC program hashes only what every node sees alike (client address
//! and port, frontend port, protocol), so a flow lands on the same backend whichever node
//! it enters. A backend change moves about 1/N of the flows. The table holds backend *slots*
//! of the frontend, never ids, so that a stale entry can only name a slot of the same
//! frontend (the program falls back to a random slot if it is out of range).
use std::collections::{BTreeMap, HashMap};

use aya::maps::{HashMap as BpfHashMap, MapData, MapError};
use socklb_abi::MaglevKey;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{
    desired::{BackendAddr, Frontend, FrontendSpec, Scope},
    maps::ignore_missing,
};

/// Table sizes offered: primes, so that every skip visits every position.
pub const TABLE_SIZES: [u32; 8] = [251, 509, 1021, 2039, 4093, 8191, 16381, 32749];

/// The Maglev table of `names`: for each of `size` positions, the index of its backend in
/// `names`. Empty when there is no backend. Pure; `size` must be prime (see TABLE_SIZES).
pub fn table(names: &[String], size: u32) -> Vec<usize> {
    let size = size as usize;
    if names.is_empty() || size == 0 {
        return Vec::new();
    }
    let permutation: Vec<(usize, usize)> = names
        .iter()
        .map(|name| {
            let offset = xxh3_64_with_seed(name.as_bytes(), 0) as usize % size;
            let skip = xxh3_64_with_seed(name.as_bytes(), 1) as usize % (size - 1).max(1) + 1;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0usize; names.len()];
    let mut entries: Vec<Option<usize>> = vec![None; size];
    let mut filled = 0;
    // Each backend in turn takes its next preferred free position, until all are taken.
    'fill: loop {
        for (backend, (offset, skip)) in permutation.iter().enumerate() {
            let mut position = (offset + next[backend] * skip) % size;
            while entries[position].is_some() {
                next[backend] += 1;
                position = (offset + next[backend] * skip) % size;
            }
            entries[position] = Some(backend);
            next[backend] += 1;
            filled += 1;
            if filled == size {
                break 'fill;
            }
        }
    }
    entries.into_iter().map(|e| e.unwrap_or(0)).collect()
}

/// What one frontend's table holds: its service id and the slot at every position.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Held {
    service_id: u32,
    slots: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
#[error("writing the Maglev table of service id {service_id} to socklb_mglv_v1 failed")]
pub struct MaglevError {
    service_id: u32,
    #[source]
    source: MapError,
}

/// Owns the Maglev map: per Maglev frontend, `size` entries naming a slot.
pub struct MaglevWriter {
    map: BpfHashMap<MapData, MaglevKey, u32>,
    size: u32,
    held: BTreeMap<Frontend, Held>,
    /// Tables read from the map, by service id, not yet matched to a frontend.
    adopted: HashMap<u32, Vec<u32>>,
}

impl MaglevWriter {
    pub fn adopt(map: BpfHashMap<MapData, MaglevKey, u32>, size: u32) -> Result<Self, MapError> {
        let mut writer = Self {
            map,
            size,
            held: BTreeMap::new(),
            adopted: HashMap::new(),
        };
        writer.readopt()?;
        Ok(writer)
    }

    /// Forgets the mirror and reads the map again; tables are matched to frontends by
    /// service id at the next apply.
    pub fn readopt(&mut self) -> Result<(), MapError> {
        self.held.clear();
        self.adopted.clear();
        for entry in self.map.iter() {
            let (key, slot) = entry?;
            let slots = self.adopted.entry(key.service_id).or_default();
            let index = key.index as usize;
            if slots.len() <= index {
                slots.resize(index + 1, 0);
            }
            slots[index] = slot;
        }
        Ok(())
    }

    pub fn entries(&self) -> u32 {
        let held: usize = self.held.values().map(|h| h.slots.len()).sum();
        let adopted: usize = self.adopted.values().map(Vec::len).sum();
        u32::try_from(held + adopted).unwrap_or(u32::MAX)
    }

    /// At most how many entries the map holds while `changes` are applied: a table more
    /// for every Maglev frontend that has none yet.
    pub fn demand<'a>(
        &self,
        changes: impl IntoIterator<Item = (&'a Frontend, Option<&'a FrontendSpec>)>,
    ) -> u32 {
        let new_tables = changes
            .into_iter()
            .filter(|(frontend, spec)| {
                spec.is_some_and(|spec| spec.maglev)
                    && frontend.scope == Scope::External
                    && !self.held.contains_key(frontend)
            })
            .count();
        let added = u64::try_from(new_tables)
            .unwrap_or(u64::MAX)
            .saturating_mul(u64::from(self.size));
        u32::try_from(u64::from(self.entries()).saturating_add(added)).unwrap_or(u32::MAX)
    }

    pub fn map(&self) -> &BpfHashMap<MapData, MaglevKey, u32> {
        &self.map
    }

    /// Writes go to `map` from now on; it must hold what the old one held.
    pub fn replace_map(
        &mut self,
        map: BpfHashMap<MapData, MaglevKey, u32>,
    ) -> BpfHashMap<MapData, MaglevKey, u32> {
        std::mem::replace(&mut self.map, map)
    }

    /// Brings the tables of the given frontends up to date. `programmed` says, for a
    /// frontend, its service id and its backends by slot (1-based) as the service map now
    /// holds them. With `full`, tables of frontends not named are removed.
    pub fn apply<'a>(
        &mut self,
        changes: impl IntoIterator<Item = (&'a Frontend, Option<&'a FrontendSpec>)>,
        programmed: impl Fn(&Frontend) -> Option<(u32, Vec<BackendAddr>)>,
        full: bool,
    ) -> Result<(), MaglevError> {
        let mut named = Vec::new();
        for (frontend, spec) in changes {
            named.push(*frontend);
            // Only Maglev frontends need their programmed backends (a large Service's other
            // frontends would pay for a copy of every slot).
            let maglev = spec.is_some_and(|spec| spec.maglev) && frontend.scope == Scope::External;
            let wanted =
                maglev
                    .then(|| programmed(frontend))
                    .flatten()
                    .map(|(service_id, by_slot)| Held {
                        service_id,
                        slots: self.slots(&by_slot),
                    });
            self.update(*frontend, wanted)?;
        }
        if full {
            let stale: Vec<Frontend> = self
                .held
                .keys()
                .filter(|f| !named.contains(f))
                .copied()
                .collect();
            for frontend in stale {
                self.update(frontend, None)?;
            }
            // Tables no frontend claimed: left by a removed frontend.
            for (service_id, slots) in std::mem::take(&mut self.adopted) {
                self.remove_entries(service_id, 0, slots.len())?;
            }
        }
        Ok(())
    }

    /// The slot at each position: backends sorted by name, so that every node agrees.
    fn slots(&self, by_slot: &[BackendAddr]) -> Vec<u32> {
        let mut named: Vec<(String, u32)> = by_slot
            .iter()
            .enumerate()
            .map(|(index, b)| (format!("{}:{}", b.address, b.port), index as u32 + 1))
            .collect();
        named.sort();
        let names: Vec<String> = named.iter().map(|(name, _)| name.clone()).collect();
        table(&names, self.size)
            .into_iter()
            .map(|backend| named[backend].1)
            .collect()
    }

    fn update(&mut self, frontend: Frontend, wanted: Option<Held>) -> Result<(), MaglevError> {
        let old = match self.held.remove(&frontend) {
            Some(held) => Some(held),
            None => wanted.as_ref().and_then(|w| {
                self.adopted.remove(&w.service_id).map(|slots| Held {
                    service_id: w.service_id,
                    slots,
                })
            }),
        };
        match (old, wanted) {
            (Some(old), Some(new)) if old.service_id == new.service_id => {
                for (index, slot) in new.slots.iter().enumerate() {
                    if old.slots.get(index) != Some(slot) {
                        self.put(new.service_id, index, *slot)?;
                    }
                }
                self.remove_entries(old.service_id, new.slots.len(), old.slots.len())?;
                self.held.insert(frontend, new);
            }
            (old, new) => {
                if let Some(old) = old {
                    self.remove_entries(old.service_id, 0, old.slots.len())?;
                }
                if let Some(new) = new {
                    for (index, slot) in new.slots.iter().enumerate() {
                        self.put(new.service_id, index, *slot)?;
                    }
                    self.held.insert(frontend, new);
                }
            }
        }
        Ok(())
    }

    fn put(&mut self, service_id: u32, index: usize, slot: u32) -> Result<(), MaglevError> {
        let key = MaglevKey {
            service_id,
            index: index as u32,
        };
        self.map
            .insert(&key, &slot, 0)
            .map_err(|source| MaglevError { service_id, source })
    }

    fn remove_entries(
        &mut self,
        service_id: u32,
        from: usize,
        to: usize,
    ) -> Result<(), MaglevError> {
        for index in from..to {
            let key = MaglevKey {
                service_id,
                index: index as u32,
            };
            ignore_missing(self.map.remove(&key))
                .map_err(|source| MaglevError { service_id, source })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(count: usize) -> Vec<String> {
        (0..count)
            .map(|i| format!("10.0.{}.{}:8080", i / 250, i % 250 + 1))
            .collect()
    }

    #[test]
    fn every_backend_gets_a_near_equal_share() {
        let names = names(7);
        let table = table(&names, 4093);
        assert_eq!(table.len(), 4093);
        let mut shares = vec![0usize; names.len()];
        for backend in &table {
            shares[*backend] += 1;
        }
        let (least, most) = (shares.iter().min(), shares.iter().max());
        assert!(
            most.zip(least).is_some_and(|(m, l)| m - l <= 1),
            "round-robin filling keeps shares within one: {shares:?}"
        );
    }

    #[test]
    fn removing_one_backend_of_ten_moves_few_positions() {
        let before = names(10);
        let after: Vec<String> = before
            .iter()
            .filter(|n| *n != &before[3])
            .cloned()
            .collect();
        let old = table(&before, 16381);
        let new = table(&after, 16381);
        let moved = old
            .iter()
            .zip(&new)
            .filter(|(o, n)| before[**o] != after[**n])
            .count();
        // The removed backend's tenth must move; Maglev moves little else.
        let share = 16381 / 10;
        assert!(moved >= share, "{moved}");
        assert!(
            moved < share * 2,
            "{moved} positions moved, expected about {share}"
        );
    }

    #[test]
    fn the_table_depends_on_the_backends_only() {
        assert_eq!(table(&names(3), 251), table(&names(3), 251));
        assert!(table(&[], 251).is_empty());
        assert_eq!(table(&names(1), 251), vec![0; 251]);
    }
}
