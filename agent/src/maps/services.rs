//! The service and backend maps of both address families: the kernel-side [`Store`] of the
//! writer, and reading them back for adoption (and for `socklb inspect`). The writer
//! speaks of frontends and backends; this module alone encodes them into each family's
//! map layout (network byte order, 4- or 16-byte addresses).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use aya::maps::{HashMap, Map, MapData, MapError};
use socklb_abi::{
    BACKEND_FLAG_REMOTE, Backend, Backend6, ServiceEntry, ServiceEntry6, ServiceKey, ServiceKey6,
    ipv6_octets, ipv6_words,
};

use super::{
    ignore_missing,
    writer::{MapContents, Master, Op, SlotKey, SlotValue, Store, StoreError, StrayKey},
};
use crate::desired::{BackendAddr, Frontend, Protocol, Scope};

/// The service and backend maps of both families, typed. The dataplane's growth reads the
/// fields, to copy the entries into larger maps.
pub struct KernelMaps {
    pub(crate) services: HashMap<MapData, ServiceKey, ServiceEntry>,
    pub(crate) backends: HashMap<MapData, u32, Backend>,
    pub(crate) services6: HashMap<MapData, ServiceKey6, ServiceEntry6>,
    pub(crate) backends6: HashMap<MapData, u32, Backend6>,
}

/// The four maps, as taken from the loaded object.
pub struct RawMaps {
    pub services: Map,
    pub backends: Map,
    pub services6: Map,
    pub backends6: Map,
}

impl KernelMaps {
    pub fn new(maps: RawMaps) -> Result<Self, MapError> {
        Ok(Self {
            services: maps.services.try_into()?,
            backends: maps.backends.try_into()?,
            services6: maps.services6.try_into()?,
            backends6: maps.backends6.try_into()?,
        })
    }

    /// Reads the maps of both families. Entries that vanish during the walk are skipped.
    pub fn read(&self) -> Result<MapContents, MapError> {
        let mut contents = MapContents::default();
        for entry in self.services.iter() {
            let (key, value) = entry?;
            match decode_key4(&key) {
                Some(key) => contents.services.push((key, decode_value4(&key, &value))),
                None => contents.strays.push(StrayKey::V4(key)),
            }
        }
        for entry in self.services6.iter() {
            let (key, value) = entry?;
            match decode_key6(&key) {
                Some(key) => contents.services.push((key, decode_value6(&key, &value))),
                None => contents.strays.push(StrayKey::V6(key)),
            }
        }
        for entry in self.backends.iter() {
            let (id, backend) = entry?;
            let addr = backend_addr(ipv4(backend.address).into(), backend.port, backend.flags);
            contents
                .backends
                .push((id, addr, Protocol::from_number(backend.protocol)));
        }
        for entry in self.backends6.iter() {
            let (id, backend) = entry?;
            let addr = backend_addr(ipv6(backend.address).into(), backend.port, backend.flags);
            contents
                .backends
                .push((id, addr, Protocol::from_number(backend.protocol)));
        }
        Ok(contents)
    }

    fn apply(&mut self, op: &Op) -> Result<(), MapError> {
        match op {
            Op::PutBackend {
                id,
                backend,
                protocol,
            } => {
                let flags = if backend.remote {
                    BACKEND_FLAG_REMOTE
                } else {
                    0
                };
                match backend.address {
                    IpAddr::V4(address) => {
                        let entry = Backend {
                            address: u32::from(address).to_be(),
                            port: backend.port.to_be(),
                            protocol: protocol.number(),
                            flags,
                        };
                        self.backends.insert(id, &entry, 0)
                    }
                    IpAddr::V6(address) => {
                        let entry = Backend6 {
                            address: ipv6_words(address.octets()),
                            port: backend.port.to_be(),
                            protocol: protocol.number(),
                            flags,
                        };
                        self.backends6.insert(id, &entry, 0)
                    }
                }
            }
            Op::PutService { key, value } => match key.frontend.address {
                IpAddr::V4(_) => {
                    let entry = encode_value4(value).ok_or_else(family_mismatch)?;
                    self.services.insert(&encode_key4(key), &entry, 0)
                }
                IpAddr::V6(_) => {
                    let entry = encode_value6(value).ok_or_else(family_mismatch)?;
                    self.services6.insert(&encode_key6(key), &entry, 0)
                }
            },
            Op::DeleteService { key } => ignore_missing(match key.frontend.address {
                IpAddr::V4(_) => self.services.remove(&encode_key4(key)),
                IpAddr::V6(_) => self.services6.remove(&encode_key6(key)),
            }),
            Op::DeleteStray { key } => ignore_missing(match key {
                StrayKey::V4(key) => self.services.remove(key),
                StrayKey::V6(key) => self.services6.remove(key),
            }),
            Op::DeleteBackend { id, address } => ignore_missing(match address {
                IpAddr::V4(_) => self.backends.remove(id),
                IpAddr::V6(_) => self.backends6.remove(id),
            }),
        }
    }
}

impl Store for KernelMaps {
    fn write(&mut self, op: &Op) -> Result<(), StoreError> {
        self.apply(op).map_err(|error| StoreError {
            op: op.clone(),
            source: match error {
                MapError::SyscallError(syscall) => syscall.io_error,
                other => std::io::Error::other(other.to_string()),
            },
        })
    }
}

/// A slot naming a backend of the other family: selection never crosses families, so
/// this is a bug, refused rather than written.
fn family_mismatch() -> MapError {
    MapError::SyscallError(aya::sys::SyscallError {
        call: "encode slot",
        io_error: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a frontend's slot names a backend of the other address family",
        ),
    })
}

fn ipv4(network_order: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from_be(network_order))
}

fn ipv6(words: socklb_abi::Ipv6Words) -> Ipv6Addr {
    Ipv6Addr::from(ipv6_octets(words))
}

fn backend_addr(address: IpAddr, port: u16, flags: u8) -> BackendAddr {
    BackendAddr {
        address,
        port: u16::from_be(port),
        remote: flags & BACKEND_FLAG_REMOTE != 0,
    }
}

fn frontend(address: IpAddr, port: u16, protocol: u8, scope: u8) -> Option<Frontend> {
    Some(Frontend {
        address,
        port: u16::from_be(port),
        protocol: Protocol::from_number(protocol)?,
        scope: Scope::from_number(scope)?,
    })
}

/// The IPv4 service-map key of `key`; its frontend must be IPv4.
pub fn encode_key4(key: &SlotKey) -> ServiceKey {
    let IpAddr::V4(address) = key.frontend.address else {
        unreachable!("encode_key4 is called for IPv4 frontends only")
    };
    ServiceKey {
        address: u32::from(address).to_be(),
        port: key.frontend.port.to_be(),
        protocol: key.frontend.protocol.number(),
        scope: key.frontend.scope.number(),
        slot: key.slot,
        pad: 0,
    }
}

fn encode_key6(key: &SlotKey) -> ServiceKey6 {
    let IpAddr::V6(address) = key.frontend.address else {
        unreachable!("encode_key6 is called for IPv6 frontends only")
    };
    ServiceKey6 {
        address: ipv6_words(address.octets()),
        port: key.frontend.port.to_be(),
        protocol: key.frontend.protocol.number(),
        scope: key.frontend.scope.number(),
        slot: key.slot,
        pad: 0,
    }
}

/// The frontend and slot of an IPv4 service-map key; `None` for a protocol or scope this
/// agent does not know.
pub fn decode_key4(key: &ServiceKey) -> Option<SlotKey> {
    Some(SlotKey {
        frontend: frontend(ipv4(key.address).into(), key.port, key.protocol, key.scope)?,
        slot: key.slot,
    })
}

pub fn decode_key6(key: &ServiceKey6) -> Option<SlotKey> {
    Some(SlotKey {
        frontend: frontend(ipv6(key.address).into(), key.port, key.protocol, key.scope)?,
        slot: key.slot,
    })
}

fn master(count: u16, flags: u16, service_id: u32, affinity_timeout_s: u32) -> SlotValue {
    SlotValue::Master(Master {
        count,
        flags,
        service_id,
        affinity_timeout_s,
    })
}

pub fn decode_value4(key: &SlotKey, entry: &ServiceEntry) -> SlotValue {
    if key.slot == 0 {
        return master(
            entry.count,
            entry.flags,
            entry.service_id,
            entry.affinity_timeout_s,
        );
    }
    SlotValue::Backend {
        id: entry.backend_id,
        backend: backend_addr(
            ipv4(entry.backend_address).into(),
            entry.backend_port,
            // A slot's flags are its backend's, in the low byte.
            entry.flags.to_le_bytes()[0],
        ),
    }
}

pub fn decode_value6(key: &SlotKey, entry: &ServiceEntry6) -> SlotValue {
    if key.slot == 0 {
        return master(
            entry.count,
            entry.flags,
            entry.service_id,
            entry.affinity_timeout_s,
        );
    }
    SlotValue::Backend {
        id: entry.backend_id,
        backend: backend_addr(
            ipv6(entry.backend_address).into(),
            entry.backend_port,
            entry.flags.to_le_bytes()[0],
        ),
    }
}

fn slot_flags(backend: &BackendAddr) -> u16 {
    if backend.remote {
        u16::from(BACKEND_FLAG_REMOTE)
    } else {
        0
    }
}

fn encode_value4(value: &SlotValue) -> Option<ServiceEntry> {
    Some(match value {
        SlotValue::Master(master) => ServiceEntry {
            count: master.count,
            flags: master.flags,
            service_id: master.service_id,
            affinity_timeout_s: master.affinity_timeout_s,
            ..ServiceEntry::default()
        },
        SlotValue::Backend { id, backend } => {
            let IpAddr::V4(address) = backend.address else {
                return None;
            };
            ServiceEntry {
                backend_id: *id,
                backend_address: u32::from(address).to_be(),
                backend_port: backend.port.to_be(),
                flags: slot_flags(backend),
                ..ServiceEntry::default()
            }
        }
    })
}

fn encode_value6(value: &SlotValue) -> Option<ServiceEntry6> {
    Some(match value {
        SlotValue::Master(master) => ServiceEntry6 {
            count: master.count,
            flags: master.flags,
            service_id: master.service_id,
            affinity_timeout_s: master.affinity_timeout_s,
            ..ServiceEntry6::default()
        },
        SlotValue::Backend { id, backend } => {
            let IpAddr::V6(address) = backend.address else {
                return None;
            };
            ServiceEntry6 {
                backend_id: *id,
                backend_address: ipv6_words(address.octets()),
                backend_port: backend.port.to_be(),
                flags: slot_flags(backend),
                ..ServiceEntry6::default()
            }
        }
    })
}

#[cfg(test)]
mod tests {
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
    fn keys_and_values_round_trip_in_both_families() {
        let rows = [
            (frontend("10.96.0.10"), "10.0.0.7"),
            (frontend("fd00:96::10"), "fd00:10::7"),
        ];
        for (frontend, backend) in rows {
            let key = SlotKey { frontend, slot: 2 };
            let value = SlotValue::Backend {
                id: 9,
                backend: BackendAddr {
                    address: backend.parse().expect("backend"),
                    port: 5353,
                    remote: true,
                },
            };
            let master_key = SlotKey { slot: 0, ..key };
            let master = master(3, 1, 4, 30);
            let decoded = match frontend.address {
                IpAddr::V4(_) => (
                    decode_key4(&encode_key4(&key)),
                    decode_value4(&key, &encode_value4(&value).expect("v4")),
                    decode_value4(&master_key, &encode_value4(&master).expect("v4")),
                ),
                IpAddr::V6(_) => (
                    decode_key6(&encode_key6(&key)),
                    decode_value6(&key, &encode_value6(&value).expect("v6")),
                    decode_value6(&master_key, &encode_value6(&master).expect("v6")),
                ),
            };
            assert_eq!(decoded, (Some(key), value, master), "{frontend}");
        }
    }

    #[test]
    fn a_slot_never_names_a_backend_of_the_other_family() {
        let v6_backend = SlotValue::Backend {
            id: 1,
            backend: BackendAddr::local("fd00::1".parse::<Ipv6Addr>().expect("v6"), 80),
        };
        assert_eq!(encode_value4(&v6_backend), None);
        let v4_backend = SlotValue::Backend {
            id: 1,
            backend: BackendAddr::local(Ipv4Addr::LOCALHOST, 80),
        };
        assert_eq!(encode_value6(&v4_backend), None);
    }

    #[test]
    fn ipv6_key_bytes_are_the_address_in_network_order() {
        let key = encode_key6(&SlotKey {
            frontend: frontend("fd00::1"),
            slot: 0,
        });
        let octets = ipv6_octets(key.address);
        assert_eq!(octets[0..2], [0xfd, 0]);
        assert_eq!(octets[15], 1);
        assert_eq!(key.port, 53u16.to_be());
    }
}
