//! loadBalancerSourceRanges as entries of the LPM tries the TC ingress program consults
//! for a new flow to an external frontend, one per address family, and the order of the
//! writes that change them. Pure; the tries' writer is `maps::source_ranges`.
//!
//! Per restricted frontend, a deny entry for the frontend alone and an allow entry per CIDR
//! of its family; the longest match decides. A frontend that becomes restricted gets its
//! deny entry before its allowed ranges, so it is never open on the way (nor after a failed
//! write); changed ranges are added before the old ones go, so no client allowed before and
//! after is dropped.
use std::{
    collections::BTreeSet,
    fmt::Debug,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::IpNet;
use socklb_abi::{
    SOURCE_ALLOW, SOURCE_DENY, SOURCE_RANGE_FRONTEND_BITS, SOURCE_RANGE6_FRONTEND_BITS,
    SourceRange, SourceRange6, SourceVerdict, ipv6_octets, ipv6_words, map_names,
};

use super::frontend::{Frontend, Protocol, Scope};

/// The data of one family's trie key: a frontend and a client address.
pub trait RangeData: Copy + Ord + Debug {
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
    /// Deny for a frontend's own entry (the shortest prefix), allow for a range's.
    pub fn verdict(self) -> SourceVerdict {
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
