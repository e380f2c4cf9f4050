//! The writer's words for the service and backend maps: keys and values of either family,
//! the writes it issues, and the [`Store`] they go to (the kernel's maps, `maps::services`,
//! or a recorder in tests). The store alone knows each family's encoding.
use std::net::IpAddr;

use socklb_abi::{ServiceKey, ServiceKey6};

use crate::desired::{BackendAddr, Frontend, Protocol};

/// A service-map key of either address family: a frontend and a slot (0: its master).
/// The store encodes it into the map of the frontend's family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    pub frontend: Frontend,
    pub slot: u16,
}

/// A service-map value in the agent's terms; the store encodes it for the key's family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotValue {
    /// Slot 0.
    Master(Master),
    /// Slots `1..=count`: the backend's id, and the address and port the programs connect
    /// to (so that a translation needs no backend-map lookup).
    Backend { id: u32, backend: BackendAddr },
}

/// A frontend's master entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Master {
    /// Backend slots; 0: known frontend without a usable backend (refused).
    pub count: u16,
    /// `SERVICE_FLAG_*` bits.
    pub flags: u16,
    pub service_id: u32,
    pub affinity_timeout_s: u32,
}

/// A service-map key read back that names no frontend this agent knows (an unknown
/// protocol or scope): deleted at the next apply, in the map it was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StrayKey {
    V4(ServiceKey),
    V6(ServiceKey6),
}

impl StrayKey {
    pub fn is_ipv6(&self) -> bool {
        matches!(self, Self::V6(_))
    }
}

/// One write to the maps, in the order the writer issues them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    PutBackend {
        id: u32,
        backend: BackendAddr,
        protocol: Protocol,
    },
    PutService {
        key: SlotKey,
        value: SlotValue,
    },
    DeleteService {
        key: SlotKey,
    },
    DeleteStray {
        key: StrayKey,
    },
    /// `address` says which family's backend map holds the id.
    DeleteBackend {
        id: u32,
        address: IpAddr,
    },
}

/// Where the writer's operations go: the pinned BPF maps, or a recorder in tests.
pub trait Store {
    fn write(&mut self, op: &Op) -> Result<(), StoreError>;

    /// `ops` in order, as many writes would (the kernel's maps batch them).
    fn write_all(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        ops.iter().try_for_each(|op| self.write(op))
    }

    /// An apply starts: no lookup can be on its way to what the last one uncovered.
    fn apply_started(&mut self) {}

    /// What the service map holds at `key` now (`None`: no entry).
    fn read_slot(&self, key: &SlotKey) -> std::io::Result<Option<SlotValue>>;

    /// What the backend map of `address`'s family holds for `id` now (`None`: no entry).
    fn read_backend(&self, id: u32, address: IpAddr) -> std::io::Result<Option<BackendEntry>>;

    /// Reads the maps' entries from `from` on, about `budget` of them (the store reads whole
    /// chunks), in the order the maps keep them: a walk through every map in bounded steps.
    /// Returns where the next step goes on from, `None` once the last map is read through.
    fn walk(
        &self,
        from: WalkPosition,
        budget: usize,
    ) -> std::io::Result<(MapContents, Option<WalkPosition>)>;
}

/// Where a walk through the maps ([`Store::walk`]) goes on from: which map, and a position
/// in it that only the store interprets (`None`: its start).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkPosition {
    pub map: usize,
    pub within: Option<u32>,
}

/// A backend-map entry read back; `None` for a protocol this agent does not know.
pub type BackendEntry = (BackendAddr, Option<Protocol>);

#[derive(Debug, thiserror::Error)]
#[error("{op:?} failed")]
pub struct StoreError {
    pub op: Op,
    #[source]
    pub source: std::io::Error,
}

/// Contents of the service and backend maps of both families, as read back from the
/// kernel and decoded by the store.
#[derive(Debug, Default)]
pub struct MapContents {
    pub services: Vec<(SlotKey, SlotValue)>,
    pub strays: Vec<StrayKey>,
    /// `None`: a protocol this agent does not know (the entry goes at the next apply).
    pub backends: Vec<(u32, BackendAddr, Option<Protocol>)>,
}

impl MapContents {
    /// Entries read, of every kind.
    pub fn len(&self) -> usize {
        self.services.len() + self.strays.len() + self.backends.len()
    }
}
