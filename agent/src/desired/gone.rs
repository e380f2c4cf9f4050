//! Which backends left which frontends in one apply: the sockets socklb translated to
//! them are closed afterwards (the `sweep` module).
//!
//! Only the frontends of local sockets (scope internal) count: socklb translates their
//! sockets at connect(). What "left" means: docs/operations.md, "Sockets of removed
//! backends".
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use socklb_abi::{GoneKey, GoneKey6, ipv6_words};

use super::frontend::{BackendAddr, Frontend, Protocol, Scope};

/// A (frontend, backend) pair whose backend left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gone {
    pub frontend: Frontend,
    pub backend: BackendAddr,
}

impl Gone {
    pub fn protocol(&self) -> Protocol {
        self.frontend.protocol
    }

    /// The gone map's key (network byte order), as the iterators compare it with a socket
    /// map entry; `None` for an IPv6 pair (see [`key6`](Self::key6)).
    pub fn key(&self) -> Option<GoneKey> {
        self.key_of(|address| match address {
            IpAddr::V4(address) => Some(u32::from(address).to_be()),
            IpAddr::V6(_) => None,
        })
    }

    /// The IPv6 gone map's key; `None` for an IPv4 pair.
    pub fn key6(&self) -> Option<GoneKey6> {
        self.key_of(|address| match address {
            IpAddr::V6(address) => Some(ipv6_words(address.octets())),
            IpAddr::V4(_) => None,
        })
    }

    /// The key of the family whose addresses `encode` encodes (`None`: the other family).
    fn key_of<A>(&self, encode: impl Fn(IpAddr) -> Option<A>) -> Option<GoneKey<A>> {
        Some(GoneKey {
            frontend_address: encode(self.frontend.address)?,
            frontend_port: self.frontend.port.to_be(),
            protocol: self.frontend.protocol.number(),
            pad: 0,
            backend_address: encode(self.backend.address)?,
            backend_port: self.backend.port.to_be(),
            pad2: 0,
        })
    }
}

/// Backends programmed per frontend, before or after an apply (absent: not programmed).
pub type Programmed = BTreeMap<Frontend, Vec<BackendAddr>>;

/// The pairs programmed `before` and not `after`, for local sockets' frontends. Backends
/// are compared by address and port only (a `remote` flag change does not move sockets);
/// an unreadable slot (unspecified address) names no backend.
pub fn gone(before: &Programmed, after: &Programmed) -> Vec<Gone> {
    let mut gone = BTreeSet::new();
    for (frontend, backends) in before {
        if frontend.scope != Scope::Internal {
            continue;
        }
        let kept: BTreeSet<(IpAddr, u16)> = after
            .get(frontend)
            .into_iter()
            .flatten()
            .map(|b| (b.address, b.port))
            .collect();
        for backend in backends {
            if backend.address.is_unspecified() || kept.contains(&(backend.address, backend.port)) {
                continue;
            }
            gone.insert(Gone {
                frontend: *frontend,
                backend: BackendAddr::local(backend.address, backend.port),
            });
        }
    }
    gone.into_iter().collect()
}

/// Of `pairs` left over from a sync that failed after writing them, those whose backend
/// has not come back to its frontend since (`now`): a socket translated to a backend that
/// is programmed again is a good one.
pub fn still_gone(pairs: impl IntoIterator<Item = Gone>, now: &Programmed) -> Vec<Gone> {
    pairs
        .into_iter()
        .filter(|pair| {
            !now.get(&pair.frontend).is_some_and(|backends| {
                backends
                    .iter()
                    .any(|b| (b.address, b.port) == (pair.backend.address, pair.backend.port))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn frontend(port: u16, scope: Scope) -> Frontend {
        Frontend {
            address: Ipv4Addr::new(10, 96, 0, 10).into(),
            port,
            protocol: Protocol::Udp,
            scope,
        }
    }

    fn backend(last: u8) -> BackendAddr {
        BackendAddr::local(Ipv4Addr::new(10, 0, 0, last), 53)
    }

    fn programmed(rows: &[(Frontend, &[BackendAddr])]) -> Programmed {
        rows.iter().map(|(f, b)| (*f, b.to_vec())).collect()
    }

    #[test]
    fn which_backends_left() {
        let dns = frontend(53, Scope::Internal);
        let external = frontend(53, Scope::External);
        let remote = BackendAddr {
            remote: true,
            ..backend(2)
        };
        let unreadable = BackendAddr::local(Ipv4Addr::UNSPECIFIED, 0);
        // (what, before, after, gone)
        let rows: Vec<(&str, Programmed, Programmed, Vec<Gone>)> = vec![
            (
                "a removed backend left",
                programmed(&[(dns, &[backend(1), backend(2)])]),
                programmed(&[(dns, &[backend(2)])]),
                vec![Gone {
                    frontend: dns,
                    backend: backend(1),
                }],
            ),
            (
                "a replaced backend left, its successor did not",
                programmed(&[(dns, &[backend(1)])]),
                programmed(&[(dns, &[backend(3)])]),
                vec![Gone {
                    frontend: dns,
                    backend: backend(1),
                }],
            ),
            (
                "every backend of a removed frontend left",
                programmed(&[(dns, &[backend(1), backend(2)])]),
                programmed(&[]),
                vec![
                    Gone {
                        frontend: dns,
                        backend: backend(1),
                    },
                    Gone {
                        frontend: dns,
                        backend: backend(2),
                    },
                ],
            ),
            (
                "a frontend without backends now: all left",
                programmed(&[(dns, &[backend(1)])]),
                programmed(&[(dns, &[])]),
                vec![Gone {
                    frontend: dns,
                    backend: backend(1),
                }],
            ),
            (
                "a backend still selected (e.g. terminating, the fallback) has not left",
                programmed(&[(dns, &[backend(1)])]),
                programmed(&[(dns, &[backend(1), backend(3)])]),
                vec![],
            ),
            (
                "a backend that became remote has not left",
                programmed(&[(dns, &[backend(2)])]),
                programmed(&[(dns, &[remote])]),
                vec![],
            ),
            (
                "frontends of traffic from outside have no sockets to close",
                programmed(&[(external, &[backend(1)])]),
                programmed(&[]),
                vec![],
            ),
            (
                "an unreadable slot names no backend",
                programmed(&[(dns, &[unreadable])]),
                programmed(&[]),
                vec![],
            ),
        ];
        for (what, before, after, expected) in rows {
            assert_eq!(gone(&before, &after), expected, "{what}");
        }
    }

    #[test]
    fn a_pair_left_from_a_failed_sync_is_swept_unless_its_backend_came_back() {
        let dns = frontend(53, Scope::Internal);
        let pair = |last| Gone {
            frontend: dns,
            backend: backend(last),
        };
        let now = programmed(&[(dns, &[backend(2)])]);
        assert_eq!(still_gone([pair(1), pair(2)], &now), [pair(1)]);
        assert_eq!(still_gone([pair(1)], &programmed(&[])), [pair(1)]);
    }

    #[test]
    fn the_key_is_in_network_byte_order() {
        let pair = Gone {
            frontend: frontend(53, Scope::Internal),
            backend: backend(7),
        };
        let key = pair.key().expect("an IPv4 pair");
        assert_eq!(key.frontend_address.to_ne_bytes(), [10, 96, 0, 10]);
        assert_eq!(key.frontend_port.to_ne_bytes(), 53u16.to_be_bytes());
        assert_eq!(key.backend_address.to_ne_bytes(), [10, 0, 0, 7]);
        assert_eq!(key.protocol, socklb_abi::PROTO_UDP);
        assert_eq!(pair.key6(), None);
    }

    #[test]
    fn an_ipv6_pair_has_the_ipv6_key_only() {
        let pair = Gone {
            frontend: Frontend {
                address: "fd00:96::a"
                    .parse::<std::net::Ipv6Addr>()
                    .expect("address")
                    .into(),
                ..frontend(53, Scope::Internal)
            },
            backend: BackendAddr::local(
                "fd00::7".parse::<std::net::Ipv6Addr>().expect("address"),
                53,
            ),
        };
        assert_eq!(pair.key(), None);
        let key = pair.key6().expect("an IPv6 pair");
        assert_eq!(
            socklb_abi::ipv6_octets(key.frontend_address),
            "fd00:96::a"
                .parse::<std::net::Ipv6Addr>()
                .expect("address")
                .octets()
        );
        assert_eq!(
            socklb_abi::ipv6_octets(key.backend_address)[15],
            7,
            "the last octet"
        );
        assert_eq!(key.frontend_port.to_ne_bytes(), 53u16.to_be_bytes());
        assert_eq!(key.protocol, socklb_abi::PROTO_UDP);
    }
}
