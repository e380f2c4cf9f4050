//! The service and backend maps' layouts: frontends, slots and backends as each family's
//! keys and values hold them (network byte order, 4- or 16-byte addresses), and back.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::MapError;
use socklb_abi::{
    BACKEND_FLAG_REMOTE, Backend, Ipv6Words, ServiceEntry, ServiceKey, ipv6_octets, ipv6_words,
};

use crate::{
    desired::{BackendAddr, Frontend, Protocol, Scope},
    maps::{
        slots::{SlotRange, SlotsFull},
        writer::{Master, SlotKey, SlotValue},
    },
};

/// A slot naming a backend of the other family: selection never crosses families, so
/// this is a bug, refused rather than written.
pub(super) fn family_mismatch() -> MapError {
    MapError::SyscallError(aya::sys::SyscallError {
        call: "encode slot",
        io_error: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a frontend's slot names a backend of the other address family",
        ),
    })
}

/// An address as the maps hold it (network byte order, 4 or 16 bytes wide): each family's
/// keys and values are one generic declaration over it, and so is their encoding here.
pub trait MapAddress: Copy + Default {
    /// `None` for an address of the other family.
    fn from_ip(address: IpAddr) -> Option<Self>;
    fn ip(self) -> IpAddr;
}

impl MapAddress for u32 {
    fn from_ip(address: IpAddr) -> Option<Self> {
        match address {
            IpAddr::V4(address) => Some(u32::from(address).to_be()),
            IpAddr::V6(_) => None,
        }
    }

    fn ip(self) -> IpAddr {
        Ipv4Addr::from(u32::from_be(self)).into()
    }
}

impl MapAddress for Ipv6Words {
    fn from_ip(address: IpAddr) -> Option<Self> {
        match address {
            IpAddr::V6(address) => Some(ipv6_words(address.octets())),
            IpAddr::V4(_) => None,
        }
    }

    fn ip(self) -> IpAddr {
        Ipv6Addr::from(ipv6_octets(self)).into()
    }
}

pub(super) fn backend_addr(address: IpAddr, port: u16, flags: u8) -> BackendAddr {
    BackendAddr {
        address,
        port: u16::from_be(port),
        remote: flags & BACKEND_FLAG_REMOTE != 0,
    }
}

/// The service-map key of `key`; `None` if its frontend is of the other family.
pub(super) fn encode_key<A: MapAddress>(key: &SlotKey) -> Option<ServiceKey<A>> {
    Some(ServiceKey {
        address: A::from_ip(key.frontend.address)?,
        port: key.frontend.port.to_be(),
        protocol: key.frontend.protocol.number(),
        scope: key.frontend.scope.number(),
        slot: key.slot,
        pad: 0,
    })
}

/// The frontend and slot of a service-map key; `None` for a protocol or scope this agent
/// does not know.
pub fn decode_key<A: MapAddress>(key: &ServiceKey<A>) -> Option<SlotKey> {
    Some(SlotKey {
        frontend: Frontend {
            address: key.address.ip(),
            port: u16::from_be(key.port),
            protocol: Protocol::from_number(key.protocol)?,
            scope: Scope::from_number(key.scope)?,
        },
        slot: key.slot,
    })
}

/// A master entry as the writer knows it (without the slot range, which is this store's).
pub(super) fn decode_master(entry: &ServiceEntry) -> Master {
    Master {
        count: entry.count,
        flags: entry.flags,
        service_id: entry.service_id,
        affinity_timeout_s: entry.affinity_timeout_s,
    }
}

/// The master entry of `master`, naming `range` (none: a frontend without slots).
pub(super) fn encode_master(master: &Master, range: Option<SlotRange>) -> ServiceEntry {
    let range = range.unwrap_or(SlotRange { first: 0, room: 0 });
    ServiceEntry {
        count: master.count,
        flags: master.flags,
        service_id: master.service_id,
        affinity_timeout_s: master.affinity_timeout_s,
        first_slot: range.first,
        slot_room: range.room,
    }
}

/// What a slot of `frontend` holding `id` reads as: the id and the backend holding it
/// (the unspecified address when none does).
pub(super) fn slot_value(frontend: &Frontend, id: u32, backend: Option<&BackendAddr>) -> SlotValue {
    SlotValue::Backend {
        id,
        backend: backend.copied().unwrap_or_else(|| {
            BackendAddr::local(crate::maps::writer::unspecified_like(frontend.address), 0)
        }),
    }
}

/// A frontend's slots did not fit the slot array, as a map error of the write.
pub(super) fn slots_full(full: SlotsFull) -> MapError {
    MapError::SyscallError(aya::sys::SyscallError {
        call: "slot array",
        io_error: std::io::Error::new(std::io::ErrorKind::StorageFull, full),
    })
}

/// The backend-map value of `backend`; `None` for the other family.
pub(super) fn encode_backend<A: MapAddress>(
    backend: &BackendAddr,
    protocol: Protocol,
) -> Option<Backend<A>> {
    Some(Backend {
        address: A::from_ip(backend.address)?,
        port: backend.port.to_be(),
        protocol: protocol.number(),
        flags: if backend.remote {
            BACKEND_FLAG_REMOTE
        } else {
            0
        },
    })
}

/// A backend-map entry as the writer's mirror holds it.
pub(super) fn decode_backend<A: MapAddress>(
    (id, backend): &(u32, Backend<A>),
) -> (u32, BackendAddr, Option<Protocol>) {
    let addr = backend_addr(backend.address.ip(), backend.port, backend.flags);
    (*id, addr, Protocol::from_number(backend.protocol))
}

#[cfg(test)]
mod tests {
    use socklb_abi::ServiceKey6;

    use super::*;

    fn frontend(address: &str) -> Frontend {
        Frontend {
            address: address.parse().expect("address"),
            port: 53,
            protocol: Protocol::Udp,
            scope: Scope::External,
        }
    }

    #[test]
    fn keys_and_masters_round_trip_in_both_families() {
        let master = Master {
            count: 3,
            flags: 1,
            service_id: 4,
            affinity_timeout_s: 30,
        };
        let range = SlotRange { first: 64, room: 4 };
        for frontend in [frontend("10.96.0.10"), frontend("fd00:96::10")] {
            let key = SlotKey { frontend, slot: 0 };
            let decoded = match frontend.address {
                IpAddr::V4(_) => decode_key::<u32>(&encode_key(&key).expect("a v4 key")),
                IpAddr::V6(_) => decode_key::<Ipv6Words>(&encode_key(&key).expect("a v6 key")),
            };
            assert_eq!(decoded, Some(key), "{frontend}");
        }
        let entry = encode_master(&master, Some(range));
        assert_eq!((entry.first_slot, entry.slot_room), (64, 4));
        assert_eq!(decode_master(&entry), master);
        let without = encode_master(&master, None);
        assert_eq!((without.first_slot, without.slot_room), (0, 0));
    }

    #[test]
    fn a_backend_never_goes_into_the_other_family_s_map() {
        let v6 = BackendAddr::local("fd00::1".parse::<Ipv6Addr>().expect("v6"), 80);
        assert_eq!(encode_backend::<u32>(&v6, Protocol::Tcp), None);
        let v4 = BackendAddr::local(Ipv4Addr::LOCALHOST, 80);
        assert_eq!(encode_backend::<Ipv6Words>(&v4, Protocol::Tcp), None);
    }

    #[test]
    fn ipv6_key_bytes_are_the_address_in_network_order() {
        let key: ServiceKey6 = encode_key(&SlotKey {
            frontend: frontend("fd00::1"),
            slot: 0,
        })
        .expect("an IPv6 key");
        let octets = ipv6_octets(key.address);
        assert_eq!(octets[0..2], [0xfd, 0]);
        assert_eq!(octets[15], 1);
        assert_eq!(key.port, 53u16.to_be());
    }
}
