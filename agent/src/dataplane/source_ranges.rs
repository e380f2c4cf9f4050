//! loadBalancerSourceRanges in the LPM tries the TC ingress program consults for a new flow
//! to an external frontend, one per address family: per restricted frontend, a deny entry
//! for the frontend alone and an allow entry per CIDR of its family; the longest match
//! decides.
//!
//! Write order: a frontend that becomes restricted gets its deny entry before its allowed
//! ranges, so it is never open on the way (nor after a failed write); changed ranges are
//! added before the old ones go, so no client allowed before and after is dropped.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Debug,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::{
    Pod,
    maps::{
        MapData, MapError,
        lpm_trie::{Key, LpmTrie},
    },
};
use ipnet::IpNet;
use socklb_abi::{
    SOURCE_ALLOW, SOURCE_DENY, SOURCE_RANGE_FRONTEND_BITS, SOURCE_RANGE6_FRONTEND_BITS,
    SourceRange, SourceRange6, SourceVerdict, ipv6_octets, ipv6_words, map_names,
};

use super::{
    desired::{Frontend, FrontendSpec, Protocol, Scope},
    maps::ignore_missing,
};

/// The data of one family's trie key: a frontend and a client address.
pub trait RangeData: Copy + Ord + Debug + Pod {
    /// Bits that name the frontend: the prefix length of its deny entry.
    const FRONTEND_BITS: u32;
    const MAP: &'static str;

    /// The data of `frontend` with `client` (`None`: the deny entry's), if both are of this
    /// family.
    fn new(frontend: &Frontend, client: Option<IpAddr>) -> Option<Self>;

    fn frontend(&self) -> Option<Frontend>;
}

impl RangeData for SourceRange {
    const FRONTEND_BITS: u32 = SOURCE_RANGE_FRONTEND_BITS;
    const MAP: &'static str = map_names::SOURCE_RANGES;

    fn new(frontend: &Frontend, client: Option<IpAddr>) -> Option<Self> {
        let IpAddr::V4(address) = frontend.address else {
            return None;
        };
        let client = match client {
            None => Ipv4Addr::UNSPECIFIED,
            Some(IpAddr::V4(client)) => client,
            Some(IpAddr::V6(_)) => return None,
        };
        Some(Self {
            frontend: u32::from(address).to_be(),
            port: frontend.port.to_be(),
            protocol: frontend.protocol.number(),
            pad: 0,
            client: u32::from(client).to_be(),
        })
    }

    fn frontend(&self) -> Option<Frontend> {
        Some(Frontend {
            address: Ipv4Addr::from(u32::from_be(self.frontend)).into(),
            port: u16::from_be(self.port),
            protocol: Protocol::from_number(self.protocol)?,
            scope: Scope::External,
        })
    }
}

impl RangeData for SourceRange6 {
    const FRONTEND_BITS: u32 = SOURCE_RANGE6_FRONTEND_BITS;
    const MAP: &'static str = map_names::SOURCE_RANGES6;

    fn new(frontend: &Frontend, client: Option<IpAddr>) -> Option<Self> {
        let IpAddr::V6(address) = frontend.address else {
            return None;
        };
        let client = match client {
            None => Ipv6Addr::UNSPECIFIED,
            Some(IpAddr::V6(client)) => client,
            Some(IpAddr::V4(_)) => return None,
        };
        Some(Self {
            frontend: ipv6_words(address.octets()),
            port: frontend.port.to_be(),
            protocol: frontend.protocol.number(),
            pad: 0,
            client: ipv6_words(client.octets()),
        })
    }

    fn frontend(&self) -> Option<Frontend> {
        Some(Frontend {
            address: Ipv6Addr::from(ipv6_octets(self.frontend)).into(),
            port: u16::from_be(self.port),
            protocol: Protocol::from_number(self.protocol)?,
            scope: Scope::External,
        })
    }
}

/// One trie entry: prefix length over the data (a [`RangeData`]) and the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RangeKey<D = SourceRange> {
    pub prefix_len: u32,
    pub data: D,
}

impl<D: RangeData> RangeKey<D> {
    fn verdict(self) -> SourceVerdict {
        if self.prefix_len == D::FRONTEND_BITS {
            SOURCE_DENY
        } else {
            SOURCE_ALLOW
        }
    }
}

/// The entries of family `D` that restrict `frontend` to `ranges`: none if the frontend is
/// of the other family. Only the ranges of the frontend's family can match its clients; a
/// restricted frontend none of whose ranges is of its family admits nobody (selection hands
/// each family's frontends that family's ranges, failing closed: README, "how it differs").
pub fn entries<D: RangeData>(frontend: &Frontend, ranges: &[IpNet]) -> BTreeSet<RangeKey<D>> {
    let allows: BTreeSet<RangeKey<D>> = ranges
        .iter()
        .filter_map(|range| {
            // Host bits of a range are cleared, as the trie matches on the prefix only.
            let range = range.trunc();
            Some(RangeKey {
                prefix_len: D::FRONTEND_BITS + u32::from(range.prefix_len()),
                data: D::new(frontend, Some(range.network()))?,
            })
        })
        .collect();
    let deny = D::new(frontend, None);
    deny.map(|data| RangeKey {
        prefix_len: D::FRONTEND_BITS,
        data,
    })
    .into_iter()
    .chain(allows)
    .collect()
}

/// A trie write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeOp<D = SourceRange> {
    Put(RangeKey<D>),
    Delete(RangeKey<D>),
}

/// The writes from `old` to `new` for one frontend, in fail-closed order: deny entries go
/// in before allows and come out first; new allows go in before old ones come out. Pure.
pub fn plan<D: RangeData>(
    old: &BTreeSet<RangeKey<D>>,
    new: &BTreeSet<RangeKey<D>>,
) -> Vec<RangeOp<D>> {
    // Deny entries sort before allows of the same frontend: their prefix is the shortest.
    let by_denies_first = |keys: Vec<RangeKey<D>>| {
        let (denies, allows): (Vec<RangeKey<D>>, Vec<RangeKey<D>>) = keys
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

impl<D: RangeData> Trie<D> {
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
        let keys = entries::<SourceRange>(&frontend(), &[net("10.0.0.0/8"), net("203.0.113.7/32")]);
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
        let sloppy = entries::<SourceRange>(&frontend(), &[net("10.1.2.3/8")]);
        assert_eq!(sloppy, entries(&frontend(), &[net("10.0.0.0/8")]));
    }

    #[test]
    fn writes_never_leave_a_restricted_frontend_open() {
        let none = BTreeSet::new();
        let first = entries::<SourceRange>(&frontend(), &[net("10.0.0.0/8")]);
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
        let second = entries::<SourceRange>(&frontend(), &[net("198.51.100.0/24")]);
        assert_eq!(kinds(plan(&first, &second)), ["+88", "-72"]);
        // Lifting the restriction: deny out first.
        assert_eq!(kinds(plan(&second, &none)), ["-64", "-88"]);
    }

    #[test]
    fn each_family_s_trie_holds_its_frontends_with_their_family_s_ranges() {
        let v6 = Frontend {
            address: "fd00:192::100".parse::<Ipv6Addr>().expect("address").into(),
            ..frontend()
        };
        let ranges = [
            net("fd00:77::/48"),
            net("10.0.0.0/8"),
            net("fd00:78::1/128"),
        ];
        let keys = entries::<SourceRange6>(&v6, &ranges);
        let summary: Vec<(u32, SourceVerdict, Ipv6Addr)> = keys
            .iter()
            .map(|k| (k.prefix_len, k.verdict(), ipv6_octets(k.data.client).into()))
            .collect();
        assert_eq!(
            summary,
            [
                (160, SOURCE_DENY, Ipv6Addr::UNSPECIFIED),
                (208, SOURCE_ALLOW, "fd00:77::".parse().expect("address")),
                (288, SOURCE_ALLOW, "fd00:78::1".parse().expect("address")),
            ],
            "the IPv4 range can match no IPv6 client and is left out"
        );
        assert!(keys.iter().all(|k| k.data.frontend() == Some(v6)));
        // A frontend has entries in its own family's trie only.
        assert!(entries::<SourceRange>(&v6, &ranges).is_empty());
        assert!(entries::<SourceRange6>(&frontend(), &ranges).is_empty());
        // Ranges of the other family alone admit nobody (fail closed), nor does an empty list.
        for ranges in [&[net("10.0.0.0/8")][..], &[]] {
            let keys = entries::<SourceRange6>(&v6, ranges);
            assert_eq!(
                keys.iter().map(|k| k.verdict()).collect::<Vec<_>>(),
                [SOURCE_DENY],
                "{ranges:?}"
            );
        }
    }
}
