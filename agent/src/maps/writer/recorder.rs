//! An in-memory store for tests: what the maps would hold, checked after every write as a
//! concurrent lookup would see it.
use std::{collections::BTreeMap, net::IpAddr};

use super::{BackendEntry, MapContents, Op, SlotKey, SlotValue, Store, StoreError, WalkPosition};
use crate::desired::{BackendAddr, Protocol};

/// Records operations and keeps the resulting map contents.
pub struct Recorder {
    pub ops: Vec<Op>,
    pub services: BTreeMap<SlotKey, SlotValue>,
    pub backends: BTreeMap<u32, (BackendAddr, Protocol)>,
    pub check_every_write: bool,
    /// The most entries each map held at once, since the start or `reset_peaks`, by family
    /// (index 0: IPv4, 1: IPv6).
    pub peak_services: [usize; 2],
    pub peak_backends: [usize; 2],
}

impl Recorder {
    /// Peaks start again from what the maps hold now.
    pub fn reset_peaks(&mut self) {
        self.peak_services = self.service_counts();
        self.peak_backends = self.backend_counts();
    }

    /// Service entries held now, by family (index 1: IPv6).
    fn service_counts(&self) -> [usize; 2] {
        let ipv6 = self
            .services
            .keys()
            .filter(|key| key.frontend.address.is_ipv6())
            .count();
        [self.services.len() - ipv6, ipv6]
    }

    /// Backends held now, by family (index 1: IPv6).
    fn backend_counts(&self) -> [usize; 2] {
        let ipv6 = self
            .backends
            .values()
            .filter(|(backend, _)| backend.address.is_ipv6())
            .count();
        [self.backends.len() - ipv6, ipv6]
    }

    /// What the maps hold, as a store would read it back.
    pub fn contents(&self) -> MapContents {
        MapContents {
            services: self.services.iter().map(|(k, v)| (*k, *v)).collect(),
            strays: Vec::new(),
            backends: self
                .backends
                .iter()
                .map(|(id, (addr, protocol))| (*id, *addr, Some(*protocol)))
                .collect(),
        }
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            ops: Vec::new(),
            services: BTreeMap::new(),
            backends: BTreeMap::new(),
            check_every_write: true,
            peak_services: [0; 2],
            peak_backends: [0; 2],
        }
    }
}

impl Store for Recorder {
    fn read_slot(&self, key: &SlotKey) -> std::io::Result<Option<SlotValue>> {
        Ok(self.services.get(key).copied())
    }

    fn read_backend(&self, id: u32, _address: IpAddr) -> std::io::Result<Option<BackendEntry>> {
        Ok(self
            .backends
            .get(&id)
            .map(|(backend, protocol)| (*backend, Some(*protocol))))
    }

    /// The service map is map 0 and the backend map map 1; a position counts entries.
    fn walk(
        &self,
        from: WalkPosition,
        budget: usize,
    ) -> std::io::Result<(MapContents, Option<WalkPosition>)> {
        let mut contents = MapContents::default();
        let mut at = from;
        while contents.len() < budget && at.map < 2 {
            let skip = at.within.unwrap_or(0) as usize;
            let room = budget - contents.len();
            let (taken, len) = if at.map == 0 {
                let before = contents.services.len();
                let services = self.services.iter().skip(skip).take(room);
                contents.services.extend(services.map(|(k, v)| (*k, *v)));
                (contents.services.len() - before, self.services.len())
            } else {
                let before = contents.backends.len();
                let backends = self.backends.iter().skip(skip).take(room);
                contents
                    .backends
                    .extend(backends.map(|(id, (addr, protocol))| (*id, *addr, Some(*protocol))));
                (contents.backends.len() - before, self.backends.len())
            };
            at = if skip + taken < len {
                WalkPosition {
                    map: at.map,
                    within: u32::try_from(skip + taken).ok(),
                }
            } else {
                WalkPosition {
                    map: at.map + 1,
                    within: None,
                }
            };
        }
        Ok((contents, (at.map < 2).then_some(at)))
    }

    fn write(&mut self, op: &Op) -> Result<(), StoreError> {
        self.ops.push(op.clone());
        match op {
            Op::PutBackend {
                id,
                backend,
                protocol,
            } => {
                self.backends.insert(*id, (*backend, *protocol));
            }
            Op::PutService { key, value } => {
                self.services.insert(*key, *value);
            }
            Op::DeleteService { key } => {
                self.services.remove(key);
            }
            Op::DeleteStray { .. } => {}
            Op::DeleteBackend { id, .. } => {
                self.backends.remove(id);
            }
        }
        let (services, backends) = (self.service_counts(), self.backend_counts());
        for family in 0..2 {
            self.peak_services[family] = self.peak_services[family].max(services[family]);
            self.peak_backends[family] = self.peak_backends[family].max(backends[family]);
        }
        // After every single write, what a lookup sees must be consistent.
        if self.check_every_write {
            assert_consistent(&self.services, &self.backends);
        }
        Ok(())
    }
}

/// Every slot a master entry's count covers exists and names an existing backend of
/// the frontend's family.
pub fn assert_consistent(
    services: &BTreeMap<SlotKey, SlotValue>,
    backends: &BTreeMap<u32, (BackendAddr, Protocol)>,
) {
    for (key, value) in services {
        let SlotValue::Master(master) = value else {
            continue;
        };
        for slot in 1..=master.count {
            let slot_key = SlotKey { slot, ..*key };
            let Some(SlotValue::Backend { id, backend }) = services.get(&slot_key) else {
                panic!("slot {slot} of {key:?} is covered by count but missing");
            };
            let Some((entry, _)) = backends.get(id) else {
                panic!("slot {slot} of {key:?} names missing backend {id}");
            };
            assert_eq!(
                (backend.address, backend.port),
                (entry.address, entry.port),
                "slot {slot} of {key:?} disagrees with its backend"
            );
            assert_eq!(
                backend.address.is_ipv4(),
                key.frontend.address.is_ipv4(),
                "slot {slot} of {key:?} crosses address families"
            );
        }
    }
}

impl Recorder {
    /// Every slot some master entry's count covers.
    pub fn covered(&self) -> Vec<SlotKey> {
        self.services
            .iter()
            .filter_map(|(key, value)| match value {
                SlotValue::Master(master) => Some((key, master.count)),
                SlotValue::Backend { .. } => None,
            })
            .flat_map(|(key, count)| (1..=count).map(|slot| SlotKey { slot, ..*key }))
            .collect()
    }
}
