//! The Maglev map: per Maglev frontend, its lookup table (`desired::maglev` computes it),
//! kept in line with the frontends' programmed backends with as few writes as possible.
use std::collections::{BTreeMap, HashMap};

use aya::maps::{HashMap as BpfHashMap, MapData, MapError};
use socklb_abi::MaglevKey;

use super::{ignore_missing, not_named};
use crate::desired::{BackendAddr, Frontend, FrontendSpec, Scope, maglev::slots};

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

/// The tables `map` holds, by service id.
fn tables(map: &BpfHashMap<MapData, MaglevKey, u32>) -> Result<HashMap<u32, Vec<u32>>, MapError> {
    let mut tables: HashMap<u32, Vec<u32>> = HashMap::new();
    for (key, slot) in super::batch::entries(map)? {
        let slots = tables.entry(key.service_id).or_default();
        let index = key.index as usize;
        if slots.len() <= index {
            slots.resize(index + 1, 0);
        }
        slots[index] = slot;
    }
    Ok(tables)
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
        let adopted = tables(&map)?;
        Ok(Self {
            map,
            size,
            held: BTreeMap::new(),
            adopted,
        })
    }

    /// Forgets the mirror and reads the map again; tables are matched to frontends by
    /// service id at the next apply.
    pub fn readopt(&mut self) -> Result<(), MapError> {
        self.held.clear();
        self.adopted = tables(&self.map)?;
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
                        slots: slots(&by_slot, self.size),
                    });
            self.update(*frontend, wanted)?;
        }
        if full {
            for frontend in not_named(&self.held, |f| named.contains(f)) {
                self.update(frontend, None)?;
            }
            // Tables no frontend claimed: left by a removed frontend.
            for (service_id, slots) in std::mem::take(&mut self.adopted) {
                self.remove_entries(service_id, 0, slots.len())?;
            }
        }
        Ok(())
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
