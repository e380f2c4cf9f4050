//! The loadBalancerSourceRanges tries of both families: a mirror of each per frontend, and
//! the writes (planned by `desired::source_ranges`, in fail-closed order) that follow a
//! change of the desired ranges.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use aya::{
    Pod,
    maps::{
        MapData, MapError,
        lpm_trie::{Key, LpmTrie},
    },
};
use ipnet::IpNet;
use socklb_abi::{SourceRange, SourceRange6, SourceVerdict};

use super::ignore_missing;
use crate::desired::{
    Frontend, FrontendSpec, Protocol, Scope,
    source_ranges::{RangeData, RangeKey, RangeOp, entries, plan},
};

#[derive(Debug, thiserror::Error)]
pub enum SourceRangeError {
    #[error(
        "the loadBalancerSourceRanges of {frontend} need {needed} more entries in map \
         {map} but only {free} of its {capacity} are free: raise --max-source-ranges (the \
         frontend keeps its previous ranges)"
    )]
    Full {
        frontend: Frontend,
        map: &'static str,
        needed: usize,
        free: usize,
        capacity: u32,
    },
    #[error("writing {op} to {map} failed")]
    Write {
        map: &'static str,
        op: String,
        #[source]
        source: MapError,
    },
}

/// One family's trie: a mirror of it per frontend, and the writes that follow a change of
/// the desired ranges.
struct Trie<D> {
    trie: LpmTrie<MapData, D, SourceVerdict>,
    held: BTreeMap<Frontend, BTreeSet<RangeKey<D>>>,
    capacity: u32,
}

impl<D: RangeData + Pod> Trie<D> {
    fn adopt(trie: LpmTrie<MapData, D, SourceVerdict>, capacity: u32) -> Result<Self, MapError> {
        let mut trie = Self {
            trie,
            held: BTreeMap::new(),
            capacity,
        };
        trie.readopt()?;
        Ok(trie)
    }

    fn readopt(&mut self) -> Result<(), MapError> {
        self.held.clear();
        for key in self.trie.keys() {
            let key = key?;
            let key = RangeKey {
                prefix_len: key.prefix_len(),
                data: key.data(),
            };
            // An entry of an unknown protocol is kept under a placeholder frontend so that
            // a full apply removes it.
            let frontend = key.data.frontend().unwrap_or(Frontend {
                address: Ipv4Addr::UNSPECIFIED.into(),
                port: 0,
                protocol: Protocol::Tcp,
                scope: Scope::External,
            });
            self.held.entry(frontend).or_default().insert(key);
        }
        Ok(())
    }

    fn entries(&self) -> usize {
        self.held.values().map(BTreeSet::len).sum()
    }

    /// Applies one frontend's ranges (`None`: frontend gone, or unrestricted). `Ok(Some)`:
    /// they did not fit.
    fn apply(
        &mut self,
        frontend: &Frontend,
        ranges: Option<&[IpNet]>,
    ) -> Result<Option<SourceRangeError>, SourceRangeError> {
        let wanted = match ranges {
            Some(ranges) if frontend.scope == Scope::External => entries(frontend, ranges),
            _ => BTreeSet::new(),
        };
        let old = self.held.get(frontend).cloned().unwrap_or_default();
        if old == wanted {
            return Ok(None);
        }
        let needed = wanted.difference(&old).count();
        let free = (self.capacity as usize).saturating_sub(self.entries());
        if needed > free {
            return Ok(Some(SourceRangeError::Full {
                frontend: *frontend,
                map: D::MAP,
                needed,
                free,
                capacity: self.capacity,
            }));
        }
        for op in plan(&old, &wanted) {
            self.write(op)?;
        }
        if wanted.is_empty() {
            self.held.remove(frontend);
        } else {
            self.held.insert(*frontend, wanted);
        }
        Ok(None)
    }

    fn write(&mut self, op: RangeOp<D>) -> Result<(), SourceRangeError> {
        let result = match op {
            RangeOp::Put(key) => {
                self.trie
                    .insert(&Key::new(key.prefix_len, key.data), &key.verdict(), 0)
            }
            RangeOp::Delete(key) => {
                ignore_missing(self.trie.remove(&Key::new(key.prefix_len, key.data)))
            }
        };
        result.map_err(|source| SourceRangeError::Write {
            map: D::MAP,
            op: format!("{op:?}"),
            source,
        })
    }
}

/// Owns the source-range tries of both families; each frontend's ranges go to the trie of
/// its family.
pub struct SourceRangeWriter {
    v4: Trie<SourceRange>,
    v6: Trie<SourceRange6>,
}

impl SourceRangeWriter {
    /// Adopts what the tries hold (entries it cannot attribute are removed at the first
    /// full apply, as they belong to no frontend). Each trie has `capacity` entries.
    pub fn adopt(
        v4: LpmTrie<MapData, SourceRange, SourceVerdict>,
        v6: LpmTrie<MapData, SourceRange6, SourceVerdict>,
        capacity: u32,
    ) -> Result<Self, MapError> {
        Ok(Self {
            v4: Trie::adopt(v4, capacity)?,
            v6: Trie::adopt(v6, capacity)?,
        })
    }

    pub fn readopt(&mut self) -> Result<(), MapError> {
        self.v4.readopt()?;
        self.v6.readopt()
    }

    /// Entries of the IPv4 and of the IPv6 trie.
    pub fn entries(&self) -> (u32, u32) {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        (count(self.v4.entries()), count(self.v6.entries()))
    }

    /// Makes the tries hold the ranges of every frontend in `desired`, and nothing else.
    pub fn apply_all<'a>(
        &mut self,
        desired: impl IntoIterator<Item = (&'a Frontend, &'a FrontendSpec)>,
    ) -> Result<Vec<SourceRangeError>, SourceRangeError> {
        let desired: BTreeMap<&Frontend, &FrontendSpec> = desired.into_iter().collect();
        let mut changes: BTreeMap<Frontend, Option<&FrontendSpec>> = self
            .v4
            .held
            .keys()
            .chain(self.v6.held.keys())
            .filter(|f| !desired.contains_key(f))
            .map(|f| (*f, None))
            .collect();
        changes.extend(desired.into_iter().map(|(f, spec)| (*f, Some(spec))));
        self.apply(&changes)
    }

    /// Applies the given frontends' ranges (`None`: frontend gone). Returns the frontends
    /// whose ranges did not fit; a failed write is the error.
    pub fn apply(
        &mut self,
        changes: &BTreeMap<Frontend, Option<&FrontendSpec>>,
    ) -> Result<Vec<SourceRangeError>, SourceRangeError> {
        let mut rejected = Vec::new();
        for (frontend, spec) in changes {
            let ranges = spec.and_then(|s| s.source_ranges.as_deref());
            // A frontend leaves whichever trie holds it (the placeholder of an unknown
            // entry may sit in either), and enters its family's.
            let outcome = match frontend.address {
                IpAddr::V4(_) => {
                    if self.v6.held.contains_key(frontend) {
                        self.v6.apply(frontend, None)?;
                    }
                    self.v4.apply(frontend, ranges)?
                }
                IpAddr::V6(_) => {
                    if self.v4.held.contains_key(frontend) {
                        self.v4.apply(frontend, None)?;
                    }
                    self.v6.apply(frontend, ranges)?
                }
            };
            rejected.extend(outcome);
        }
        Ok(rejected)
    }
}
