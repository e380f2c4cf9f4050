//! The pinned maps, read as the kernel programs read them.
use std::{
    net::Ipv4Addr,
    path::Path,
    time::{Duration, Instant},
};

use aya::maps::{Array, HashMap, Map, MapData};
use socklb_abi::{
    Backend, PROTO_TCP, SCOPE_INTERNAL, ServiceEntry, ServiceKey, SlotPair, map_names,
};
use socklb_tests::Agent;

use crate::{
    ENDPOINTS_PER_SERVICE, SERVICE_PORT,
    cluster::{service_name, vip},
    tail,
};

/// A change not in the maps by then fails the benchmark.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the maps are read while waiting for a change.
const POLL: Duration = Duration::from_micros(50);

pub struct Maps {
    services: HashMap<MapData, ServiceKey, ServiceEntry>,
    /// Backend ids, two to an entry, each frontend's at the range its master entry names.
    slots: Array<MapData, SlotPair>,
    /// Indexed by backend id; zeros where no backend holds the id.
    backends: Array<MapData, Backend>,
}

impl Maps {
    pub fn open(pin_dir: &Path) -> Self {
        let open = |name: &str| {
            let path = pin_dir.join(name);
            MapData::from_pin(&path)
                .unwrap_or_else(|e| panic!("open the pinned map {}: {e}", path.display()))
        };
        Self {
            services: Map::HashMap(open(map_names::SERVICES))
                .try_into()
                .expect("the service map's key and value types"),
            slots: Map::Array(open(map_names::SLOTS))
                .try_into()
                .expect("the slot array's value type"),
            backends: Map::Array(open(map_names::BACKENDS))
                .try_into()
                .expect("the backend map's key and value types"),
        }
    }

    /// Whether `address` is in one of the service's backend slots.
    pub fn serves(&self, service: u32, address: Ipv4Addr) -> bool {
        let key = ServiceKey {
            address: u32::from(vip(service)).to_be(),
            port: SERVICE_PORT.to_be(),
            protocol: PROTO_TCP,
            scope: SCOPE_INTERNAL,
            slot: 0,
            pad: 0,
        };
        let wanted = u32::from(address).to_be();
        let Ok(master) = self.services.get(&key, 0) else {
            return false;
        };
        (0..u32::from(master.count)).any(|slot| {
            let index = master.first_slot + slot;
            self.slots
                .get(&(index / 2), 0)
                .and_then(|pair| self.backends.get(&pair[index as usize % 2], 0))
                .is_ok_and(|backend| backend.address == wanted)
        })
    }

    /// Waits until `address` serves `service`; panics with the agent's log after a while.
    pub fn wait_for(&self, service: u32, address: Ipv4Addr, agent: &Agent) {
        self.wait_within(service, address, agent, CHANGE_TIMEOUT);
    }

    pub fn wait_within(&self, service: u32, address: Ipv4Addr, agent: &Agent, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.serves(service, address) {
            assert!(
                Instant::now() < deadline,
                "{address} did not reach {}'s slots within {timeout:?}; agent log:\n{}",
                service_name(service),
                tail(&agent.log(), 30)
            );
            std::thread::sleep(POLL);
        }
    }

    /// Master entries and the slots they count, and backends in the backend array.
    pub fn entries(&self) -> (usize, usize, usize) {
        let none = Backend::default();
        let backends = self
            .backends
            .iter()
            .filter(|b| b.as_ref().is_ok_and(|b| *b != none));
        let masters: Vec<ServiceEntry> = self
            .services
            .iter()
            .filter_map(Result::ok)
            .map(|(_, entry)| entry)
            .collect();
        let slots = masters.iter().map(|m| usize::from(m.count)).sum();
        (masters.len(), slots, backends.count())
    }
}

/// Every service must have a master entry and ENDPOINTS_PER_SERVICE slots, every endpoint
/// one backend: the numbers are only worth reporting for fully programmed maps. Gives the
/// service-map entries (masters and slots, as before the slot array) and the backends.
pub fn check_maps(maps: &Maps, services: u32) -> (usize, usize) {
    let (masters, slots, backends) = maps.entries();
    assert_eq!(
        masters, services as usize,
        "one master entry per service expected"
    );
    assert_eq!(
        slots,
        services as usize * ENDPOINTS_PER_SERVICE as usize,
        "{ENDPOINTS_PER_SERVICE} slots per service expected"
    );
    let service_entries = masters + slots;
    assert_eq!(
        backends,
        services as usize * ENDPOINTS_PER_SERVICE as usize,
        "backend map entries: one per endpoint expected"
    );
    (service_entries, backends)
}
