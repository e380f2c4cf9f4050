//! loadBalancerSourceRanges in the LPM trie the TC ingress program consults for a new flow
//! to an external frontend: per restricted frontend, a deny entry for the frontend alone
//! and an allow entry per CIDR; the longest match decides.
//!
//! Write order: a frontend that becomes restricted gets its deny entry before its allowed
//! ranges, so it is never open on the way (nor after a failed write); changed ranges are
//! added before the old ones go, so no client allowed before and after is dropped.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use aya::maps::{
    MapData, MapError,
    lpm_trie::{Key, LpmTrie},
};
use ipnet::{IpNet, Ipv4Net};
use socklb_abi::{
    SOURCE_ALLOW, SOURCE_DENY, SOURCE_RANGE_FRONTEND_BITS, SourceRange, SourceVerdict,
};

use super::{
    desired::{Frontend, FrontendSpec, Protocol, Scope},
    maps::ignore_missing,
};

/// One trie entry: prefix length over [`SourceRange`] and its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RangeKey {
    pub prefix_len: u32,
    pub data: SourceRange,
}

impl RangeKey {
    fn verdict(self) -> SourceVerdict {
        if self.prefix_len == SOURCE_RANGE_FRONTEND_BITS {
            SOURCE_DENY
        } else {
            SOURCE_ALLOW
        }
    }

    fn frontend(self) -> Option<Frontend> {
        Some(Frontend {
            address: std::net::Ipv4Addr::from(u32::from_be(self.data.frontend)).into(),
            port: u16::from_be(self.data.port),
            protocol: Protocol::from_number(self.data.protocol)?,
            scope: Scope::External,
        })
    }
}

/// The entries that restrict `frontend` to `ranges`.
pub fn entries(frontend: &Frontend, ranges: &[IpNet]) -> BTreeSet<RangeKey> {
    // IPv6 frontends are not restricted yet.
    let IpAddr::V4(address) = frontend.address else {
        return BTreeSet::new();
    };
    let ranges: Vec<Ipv4Net> = ranges
        .iter()
        .filter_map(|range| match range {
            IpNet::V4(range) => Some(*range),
            IpNet::V6(_) => None,
        })
        .collect();
    let data = |client: u32| SourceRange {
        frontend: u32::from(address).to_be(),
        port: frontend.port.to_be(),
        protocol: frontend.protocol.number(),
        pad: 0,
        client,
    };
    let deny = RangeKey {
        prefix_len: SOURCE_RANGE_FRONTEND_BITS,
        data: data(0),
    };
    let allows = ranges.iter().map(|range| {
        let range = range.trunc();
        RangeKey {
            prefix_len: SOURCE_RANGE_FRONTEND_BITS + u32::from(range.prefix_len()),
            data: data(u32::from(range.network()).to_be()),
        }
    });
    std::iter::once(deny).chain(allows).collect()
}

/// A trie write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeOp {
    Put(RangeKey),
    Delete(RangeKey),
}

/// The writes from `old` to `new` for one frontend, in fail-closed order: deny entries go
/// in before allows and come out first; new allows go in before old ones come out. Pure.
pub fn plan(old: &BTreeSet<RangeKey>, new: &BTreeSet<RangeKey>) -> Vec<RangeOp> {
    // Deny entries sort before allows of the same frontend: their prefix is the shortest.
    let by_denies_first = |keys: Vec<RangeKey>| {
        let (denies, allows): (Vec<RangeKey>, Vec<RangeKey>) = keys
            .into_iter()
            .partition(|key| key.verdict() == SOURCE_DENY);
        denies.into_iter().chain(allows)
    };
    let puts = by_denies_first(new.difference(old).copied().collect()).map(RangeOp::Put);
    let deletes = by_denies_first(old.difference(new).copied().collect()).map(RangeOp::Delete);
    puts.chain(deletes).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum SourceRangeError {
    #[error(
        "the loadBalancerSourceRanges of {frontend} need {needed} more entries in map \
         socklb_lbsrc_v1 but only {free} of its {capacity} are free: raise \
         --max-source-ranges (the frontend keeps its previous ranges)"
    )]
    Full {
        frontend: Frontend,
        needed: usize,
        free: usize,
        capacity: u32,
    },
    #[error("writing {op:?} to socklb_lbsrc_v1 failed")]
    Write {
        op: RangeOp,
        #[source]
        source: MapError,
    },
}

/// Owns the source-range trie: a mirror of it per frontend, and the writes that follow a
/// change of the desired ranges.
pub struct SourceRangeWriter {
    trie: LpmTrie<MapData, SourceRange, SourceVerdict>,
    held: BTreeMap<Frontend, BTreeSet<RangeKey>>,
    capacity: u32,
}

impl SourceRangeWriter {
    /// Adopts what the trie holds (entries it cannot attribute are removed at the first
    /// full apply, as they belong to no frontend).
    pub fn adopt(
        trie: LpmTrie<MapData, SourceRange, SourceVerdict>,
        capacity: u32,
    ) -> Result<Self, MapError> {
        let mut writer = Self {
            trie,
            held: BTreeMap::new(),
            capacity,
        };
        writer.readopt()?;
        Ok(writer)
    }

    pub fn readopt(&mut self) -> Result<(), MapError> {
        self.held.clear();
        for key in self.trie.keys() {
            let key = key?;
            let key = RangeKey {
                prefix_len: key.prefix_len(),
                data: key.data(),
            };
            // An entry of an unknown protocol is kept under a placeholder frontend so that
            // a full apply removes it.
            let frontend = key.frontend().unwrap_or(Frontend {
                address: std::net::Ipv4Addr::UNSPECIFIED.into(),
                port: 0,
                protocol: Protocol::Tcp,
                scope: Scope::External,
            });
            self.held.entry(frontend).or_default().insert(key);
        }
        Ok(())
    }

    pub fn entries(&self) -> u32 {
        u32::try_from(self.held.values().map(BTreeSet::len).sum::<usize>()).unwrap_or(u32::MAX)
    }

    /// Makes the trie hold the ranges of every frontend in `desired`, and nothing else.
    pub fn apply_all<'a>(
        &mut self,
        desired: impl IntoIterator<Item = (&'a Frontend, &'a FrontendSpec)>,
    ) -> Result<Vec<SourceRangeError>, SourceRangeError> {
        let desired: BTreeMap<&Frontend, &FrontendSpec> = desired.into_iter().collect();
        let mut changes: BTreeMap<Frontend, Option<&FrontendSpec>> = self
            .held
            .keys()
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
            let wanted = match spec.and_then(|s| s.source_ranges.as_deref()) {
                Some(ranges) if frontend.scope == Scope::External => entries(frontend, ranges),
                _ => BTreeSet::new(),
            };
            let old = self.held.get(frontend).cloned().unwrap_or_default();
            if old == wanted {
                continue;
            }
            let used = self.held.values().map(BTreeSet::len).sum::<usize>();
            let needed = wanted.difference(&old).count();
            let free = (self.capacity as usize).saturating_sub(used);
            if needed > free {
                rejected.push(SourceRangeError::Full {
                    frontend: *frontend,
                    needed,
                    free,
                    capacity: self.capacity,
                });
                continue;
            }
            for op in plan(&old, &wanted) {
                self.write(op)?;
            }
            if wanted.is_empty() {
                self.held.remove(frontend);
            } else {
                self.held.insert(*frontend, wanted);
            }
        }
        Ok(rejected)
    }

    fn write(&mut self, op: RangeOp) -> Result<(), SourceRangeError> {
        let result = match op {
            RangeOp::Put(key) => {
                self.trie
                    .insert(&Key::new(key.prefix_len, key.data), &key.verdict(), 0)
            }
            RangeOp::Delete(key) => {
                ignore_missing(self.trie.remove(&Key::new(key.prefix_len, key.data)))
            }
        };
        result.map_err(|source| SourceRangeError::Write { op, source })
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn frontend() -> Frontend {
        Frontend {
            address: Ipv4Addr::new(192, 0, 2, 100).into(),
            port: 80,
            protocol: Protocol::Tcp,
            scope: Scope::External,
        }
    }

    fn net(text: &str) -> IpNet {
        text.parse().expect("CIDR")
    }

    #[test]
    fn a_restricted_frontend_has_a_deny_entry_and_one_allow_per_range() {
        let keys = entries(&frontend(), &[net("10.0.0.0/8"), net("203.0.113.7/32")]);
        let summary: Vec<(u32, SourceVerdict, Ipv4Addr)> = keys
            .iter()
            .map(|k| {
                (
                    k.prefix_len,
                    k.verdict(),
                    u32::from_be(k.data.client).into(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (64, SOURCE_DENY, Ipv4Addr::UNSPECIFIED),
                (72, SOURCE_ALLOW, Ipv4Addr::new(10, 0, 0, 0)),
                (96, SOURCE_ALLOW, Ipv4Addr::new(203, 0, 113, 7)),
            ]
        );
        // Host bits of a range are cleared, as the trie matches on the prefix only.
        let sloppy = entries(&frontend(), &[net("10.1.2.3/8")]);
        assert_eq!(sloppy, entries(&frontend(), &[net("10.0.0.0/8")]));
    }

    #[test]
    fn writes_never_leave_a_restricted_frontend_open() {
        let none = BTreeSet::new();
        let first = entries(&frontend(), &[net("10.0.0.0/8")]);
        let kinds = |ops: Vec<RangeOp>| -> Vec<String> {
            ops.iter()
                .map(|op| match op {
                    RangeOp::Put(k) => format!("+{}", k.prefix_len),
                    RangeOp::Delete(k) => format!("-{}", k.prefix_len),
                })
                .collect()
        };
        // Restricting: deny first, then the allowed range.
        assert_eq!(kinds(plan(&none, &first)), ["+64", "+72"]);
        // Changing the ranges: the new one in before the old one out.
        let second = entries(&frontend(), &[net("198.51.100.0/24")]);
        assert_eq!(kinds(plan(&first, &second)), ["+88", "-72"]);
        // Lifting the restriction: deny out first.
        assert_eq!(kinds(plan(&second, &none)), ["-64", "-88"]);
    }
}
