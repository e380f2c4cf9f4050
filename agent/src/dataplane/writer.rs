//! The diff writer: the only code that changes the service and backend maps.
//!
//! It keeps a mirror of what the maps hold (adopted from the maps at start, so an agent
//! restart changes nothing), diffs the desired state against it and writes only the
//! differences, frontend by frontend, in an order that keeps every concurrent lookup of the
//! kernel programs consistent:
//! - backends a frontend needs are written before any slot points at them;
//! - slots are written before the master entry's count covers them;
//! - a slot a lookup may still reach is deleted one apply later: a program that read a
//!   master entry's count just before it was lowered (or just before a removed frontend's
//!   master went) still finds every slot that count covered, never a hole;
//! - a backend no frontend uses any more is deleted last (the slots carry the address the
//!   programs connect to, so a stale slot never needs its backend entry).
//!
//! A frontend whose change does not fit the maps' capacity is left exactly as it was and
//! reported; the others are still applied. A new frontend that does not fit is programmed
//! without backends, so that connections to it are refused rather than left untranslated
//! (an untranslated VIP could leave the node). Frontends already programmed (or that were
//! programmed in maps this agent replaced) get the room before new ones.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::IpAddr,
};

use socklb_abi::{
    SERVICE_FLAG_AFFINITY, SERVICE_FLAG_MAGLEV, SERVICE_FLAG_REJECT, ServiceKey, ServiceKey6,
};

use super::{
    desired::{BackendAddr, Desired, Frontend, FrontendSpec, Protocol},
    layout::assign_slots,
};

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
}

#[derive(Debug, thiserror::Error)]
#[error("{op:?} failed")]
pub struct StoreError {
    pub op: Op,
    #[source]
    pub source: std::io::Error,
}

/// Capacities of the maps the writer fills (entries, as in `max_entries`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub service_entries: u32,
    pub backends: u32,
}

/// A frontend that was not programmed as desired.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    #[error(
        "frontend {frontend} needs {needed} more entries in map {map} but only {free} of its \
         {capacity} are free: raise {flag} ({outcome})"
    )]
    MapFull {
        frontend: Frontend,
        map: &'static str,
        flag: &'static str,
        capacity: u32,
        free: u32,
        needed: u32,
        outcome: Outcome,
    },
    #[error(
        "frontend {frontend} has {count} endpoints, more than the {max} a frontend holds: \
         its change is refused whole, {outcome}; split the Service"
    )]
    TooManyBackends {
        frontend: Frontend,
        count: usize,
        max: u16,
        outcome: Outcome,
    },
}

impl Rejected {
    pub fn frontend(&self) -> Frontend {
        match self {
            Self::MapFull { frontend, .. } | Self::TooManyBackends { frontend, .. } => *frontend,
        }
    }

    pub fn outcome(&self) -> Outcome {
        match self {
            Self::MapFull { outcome, .. } | Self::TooManyBackends { outcome, .. } => *outcome,
        }
    }

    fn with_outcome(mut self, new: Outcome) -> Self {
        match &mut self {
            Self::MapFull { outcome, .. } | Self::TooManyBackends { outcome, .. } => {
                *outcome = new;
            }
        }
        self
    }
}

/// What became of a frontend that could not be programmed as desired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    KeptPrevious,
    /// A new frontend got a master entry without backends.
    Refused,
    /// Not even a master entry fitted: its traffic is not translated.
    NotProgrammed,
}

impl Outcome {
    pub const ALL: [Self; 3] = [Self::KeptPrevious, Self::Refused, Self::NotProgrammed];

    /// Its name in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::KeptPrevious => "kept_previous",
            Self::Refused => "refused",
            Self::NotProgrammed => "not_programmed",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::KeptPrevious => "the frontend keeps its previous state",
            Self::Refused => "connections to it are refused until it fits",
            Self::NotProgrammed => "not even its master entry fits: its traffic is not translated",
        })
    }
}

/// What an `apply` did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Map writes issued.
    pub writes: usize,
    /// Frontends left unchanged because their change could not be applied.
    pub rejected: Vec<Rejected>,
    /// Backends that left their frontend (filled by the [`super::Dataplane`]).
    pub gone: Vec<super::Gone>,
}

/// The writer's mirror of one frontend in the maps.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Programmed {
    service_id: u32,
    flags: u16,
    affinity_timeout_s: u32,
    /// Backend id per slot; index 0 is slot 1. 0 marks a slot that could not be read.
    slots: Vec<u32>,
}

impl Programmed {
    /// Service-map entries it occupies: master and slots.
    fn entries(&self) -> usize {
        1 + self.slots.len()
    }

    fn master(&self) -> Master {
        Master {
            count: u16::try_from(self.slots.len()).unwrap_or(u16::MAX),
            flags: self.flags,
            service_id: self.service_id,
            affinity_timeout_s: self.affinity_timeout_s,
        }
    }
}

#[derive(Debug)]
pub struct Writer<S> {
    store: S,
    capacity: Capacity,
    frontends: BTreeMap<Frontend, Programmed>,
    backends: HashMap<u32, (BackendAddr, Protocol)>,
    backend_ids: HashMap<(BackendAddr, Protocol), u32>,
    /// Service-map entries no count covers any more, deleted at the start of the next
    /// apply: slots above a lowered count, a removed frontend's slots, and what adoption
    /// found without a master or above its count.
    pending_deletes: BTreeSet<SlotKey>,
    /// Entries found in the maps that name no frontend, deleted at the next apply.
    strays: BTreeSet<StrayKey>,
    /// Service-map entries the mirror accounts for (pending deletes included), kept up to
    /// date (not recounted).
    service_entries: usize,
    /// How many slots name each backend.
    refs: HashMap<u32, usize>,
    /// Backends no slot names any more: deleted at the end of the next apply.
    unreferenced: BTreeSet<u32>,
    service_ids: HashSet<u32>,
    next_backend_id: u32,
    next_service_id: u32,
    /// Frontends the replaced maps held: programmed ahead of other new frontends.
    preferred: BTreeSet<Frontend>,
    /// Every frontend whose last apply was rejected, whichever apply that was: the
    /// current state, not one sync's report.
    rejected: BTreeMap<Frontend, Outcome>,
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

impl<S: Store> Writer<S> {
    /// A writer that adopts what the maps already hold.
    pub fn adopt(store: S, capacity: Capacity, contents: MapContents) -> Self {
        let mut writer = Self {
            store,
            capacity,
            frontends: BTreeMap::new(),
            backends: HashMap::new(),
            backend_ids: HashMap::new(),
            pending_deletes: BTreeSet::new(),
            strays: BTreeSet::new(),
            service_entries: 0,
            refs: HashMap::new(),
            unreferenced: BTreeSet::new(),
            service_ids: HashSet::new(),
            next_backend_id: 1,
            next_service_id: 1,
            preferred: BTreeSet::new(),
            rejected: BTreeMap::new(),
        };
        writer.readopt(contents);
        writer
    }

    /// Replaces the mirror with what the maps hold now.
    pub fn readopt(&mut self, contents: MapContents) {
        self.frontends.clear();
        self.backends.clear();
        self.backend_ids.clear();
        self.pending_deletes.clear();
        self.strays = contents.strays.into_iter().collect();
        self.next_backend_id = 1;
        self.next_service_id = 1;
        let backend_entries: HashMap<u32, BackendAddr> = contents
            .backends
            .iter()
            .map(|(id, addr, _)| (*id, *addr))
            .collect();
        for (id, addr, protocol) in contents.backends {
            let Some(protocol) = protocol else {
                // Unknown protocol: not ours to interpret; dropped at the next apply.
                self.backends.insert(id, (addr, Protocol::Tcp));
                continue;
            };
            self.backends.insert(id, (addr, protocol));
            self.backend_ids.entry((addr, protocol)).or_insert(id);
            self.next_backend_id = self.next_backend_id.max(id.saturating_add(1));
        }

        let mut slots: HashMap<Frontend, BTreeMap<u16, u32>> = HashMap::new();
        let mut masters = Vec::new();
        for (key, value) in contents.services {
            match value {
                SlotValue::Master(master) if key.slot == 0 => masters.push((key.frontend, master)),
                SlotValue::Backend { id, backend } if key.slot != 0 => {
                    // A slot must agree with its backend; one that does not (edited by
                    // hand) is a hole, rewritten at the next apply.
                    let agrees = backend_entries
                        .get(&id)
                        .is_some_and(|b| (b.address, b.port) == (backend.address, backend.port));
                    let id = if agrees { id } else { 0 };
                    slots.entry(key.frontend).or_default().insert(key.slot, id);
                }
                // Decoded as the other kind: cannot happen, the store decodes by slot.
                _ => {
                    self.pending_deletes.insert(key);
                }
            }
        }
        for (frontend, master) in masters {
            let mut held = slots.remove(&frontend).unwrap_or_default();
            let programmed = Programmed {
                service_id: master.service_id,
                flags: master.flags,
                affinity_timeout_s: master.affinity_timeout_s,
                slots: (1..=master.count)
                    .map(|slot| held.remove(&slot).unwrap_or(0))
                    .collect(),
            };
            // Entries above the count.
            self.pending_deletes
                .extend(held.into_keys().map(|slot| SlotKey { frontend, slot }));
            self.next_service_id = self
                .next_service_id
                .max(master.service_id.saturating_add(1));
            self.frontends.insert(frontend, programmed);
        }
        // Slots whose master is gone.
        for (frontend, held) in slots {
            self.pending_deletes
                .extend(held.into_keys().map(|slot| SlotKey { frontend, slot }));
        }
        self.service_entries = self
            .frontends
            .values()
            .map(Programmed::entries)
            .sum::<usize>()
            + self.pending_deletes.len()
            + self.strays.len();
        self.service_ids = self.frontends.values().map(|p| p.service_id).collect();
        self.refs.clear();
        for id in self.frontends.values().flat_map(|p| p.slots.iter()) {
            *self.refs.entry(*id).or_default() += 1;
        }
        self.unreferenced = self
            .backends
            .keys()
            .filter(|id| !self.refs.contains_key(id))
            .copied()
            .collect();
    }

    /// Counts the slots of a frontend as added (`+`) or removed (`-`) references.
    fn reference(&mut self, slots: &[u32], added: bool) {
        for id in slots {
            if added {
                *self.refs.entry(*id).or_default() += 1;
                self.unreferenced.remove(id);
            } else if let Some(count) = self.refs.get_mut(id) {
                *count -= 1;
                if *count == 0 {
                    self.refs.remove(id);
                    self.unreferenced.insert(*id);
                }
            }
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    #[cfg(test)]
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Gives `frontends` (those maps this agent replaced held) the room before other new
    /// frontends, so that raising a capacity never takes a serving frontend down.
    pub fn prefer(&mut self, frontends: impl IntoIterator<Item = Frontend>) {
        self.preferred.extend(frontends);
    }

    /// Whether entries wait to be deleted by the next apply (which frees their room).
    /// How many frontends are not programmed as desired now, by outcome (every outcome,
    /// zeros included).
    pub fn rejected(&self) -> [(Outcome, usize); 3] {
        Outcome::ALL.map(|outcome| {
            let count = self.rejected.values().filter(|o| **o == outcome).count();
            (outcome, count)
        })
    }

    pub fn has_pending_deletes(&self) -> bool {
        !self.pending_deletes.is_empty() || !self.strays.is_empty()
    }

    /// Number of service-map entries the mirror accounts for.
    pub fn service_entries(&self) -> u32 {
        u32::try_from(self.service_entries).unwrap_or(u32::MAX)
    }

    /// Every programmed frontend.
    pub fn frontends(&self) -> impl Iterator<Item = &Frontend> {
        self.frontends.keys()
    }

    /// A programmed frontend's service id and its backends by slot (index 0 is slot 1);
    /// a slot that could not be read shows as the unspecified address.
    pub fn programmed(&self, frontend: &Frontend) -> Option<(u32, Vec<BackendAddr>)> {
        let programmed = self.frontends.get(frontend)?;
        let backends = programmed
            .slots
            .iter()
            .map(|id| {
                self.backends.get(id).map_or(
                    BackendAddr::local(unspecified_like(frontend.address), 0),
                    |(addr, _)| *addr,
                )
            })
            .collect();
        Some((programmed.service_id, backends))
    }

    /// A programmed frontend's service id.
    pub fn service_id(&self, frontend: &Frontend) -> Option<u32> {
        Some(self.frontends.get(frontend)?.service_id)
    }

    pub fn backend_entries(&self) -> u32 {
        u32::try_from(self.backends.len()).unwrap_or(u32::MAX)
    }

    /// At most how many entries the maps hold while `changes` are applied: what they hold
    /// now (entries waiting for deletion included) plus what growing frontends and new
    /// backends add. Removals and shrinks free nothing within an apply.
    pub fn demand<'a>(
        &self,
        changes: impl IntoIterator<Item = (&'a Frontend, Option<&'a FrontendSpec>)>,
    ) -> Capacity {
        let mut service_entries = self.service_entries;
        let mut new_backends = HashSet::new();
        for (frontend, spec) in changes {
            let Some(spec) = spec else { continue };
            let old = self.frontends.get(frontend).map_or(0, Programmed::entries);
            service_entries += (1 + spec.backends.len()).saturating_sub(old);
            new_backends.extend(
                spec.backends
                    .iter()
                    .map(|addr| (*addr, frontend.protocol))
                    .filter(|key| !self.backend_ids.contains_key(key)),
            );
        }
        let total = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Capacity {
            service_entries: total(service_entries),
            backends: total(self.backends.len() + new_backends.len()),
        }
    }

    /// The maps' capacity changed (they grew): frontends are refused against the new one.
    pub fn set_capacity(&mut self, capacity: Capacity) {
        self.capacity = capacity;
    }

    /// Writes go to `store` from now on; it must hold what the old one held.
    pub fn replace_store(&mut self, store: S) -> S {
        std::mem::replace(&mut self.store, store)
    }

    /// Makes the maps hold `desired` (every frontend), writing only what differs.
    ///
    /// After an error the mirror may no longer match the maps: adopt them again (the
    /// [`super::Dataplane`] does) before the next apply.
    pub fn apply(&mut self, desired: &Desired) -> Result<ApplyReport, StoreError> {
        // A frontend no longer desired is no longer rejected, programmed or not.
        self.rejected
            .retain(|frontend, _| desired.frontends.contains_key(frontend));
        let mut changes: BTreeMap<Frontend, Option<&FrontendSpec>> = self
            .frontends
            .keys()
            .filter(|f| !desired.frontends.contains_key(f))
            .map(|f| (*f, None))
            .collect();
        changes.extend(desired.frontends.iter().map(|(f, spec)| (*f, Some(spec))));
        self.apply_changes(&changes)
    }

    /// Applies the given frontends only (`None`: remove it), leaving all others alone: a
    /// sync after a few Service changes costs in proportion to those changes.
    pub fn apply_changes(
        &mut self,
        changes: &BTreeMap<Frontend, Option<&FrontendSpec>>,
    ) -> Result<ApplyReport, StoreError> {
        let mut report = ApplyReport::default();

        // What the previous apply uncovered: no lookup can be on its way there any more.
        while let Some(key) = self.pending_deletes.pop_first() {
            if let Err(error) = self.write(&mut report, Op::DeleteService { key }) {
                self.pending_deletes.insert(key);
                return Err(error);
            }
            self.service_entries -= 1;
        }
        while let Some(key) = self.strays.pop_first() {
            if let Err(error) = self.write(&mut report, Op::DeleteStray { key }) {
                self.strays.insert(key);
                return Err(error);
            }
            self.service_entries -= 1;
        }

        for (frontend, _) in changes.iter().filter(|(_, spec)| spec.is_none()) {
            self.rejected.remove(frontend);
            self.remove_frontend(&mut report, *frontend)?;
        }

        // Shrinking frontends first, so that growing ones find the room they free; of the
        // growing ones, those programmed (or preferred) before new ones.
        let mut changes: Vec<(&Frontend, &FrontendSpec)> = changes
            .iter()
            .filter_map(|(frontend, spec)| Some((frontend, (*spec)?)))
            .collect();
        changes.sort_by_key(|(frontend, spec)| {
            let old = self.frontends.get(frontend);
            let grows = (spec.backends.len() + 1)
                .cast_signed()
                .saturating_sub(old.map_or(0, |p| p.slots.len() + 1).cast_signed());
            let known = old.is_some() || self.preferred.contains(frontend);
            (grows > 0, !known, grows)
        });
        for (frontend, spec) in changes {
            match self.update_frontend(&mut report, *frontend, spec)? {
                Ok(()) => {
                    self.rejected.remove(frontend);
                }
                Err(rejected) => {
                    // Kept with no backend (a refused frontend retried, or one that had no
                    // endpoints): its connections are refused, whatever kept it so.
                    let refusing = self
                        .frontends
                        .get(frontend)
                        .is_some_and(|programmed| programmed.slots.is_empty());
                    let outcome = match rejected.outcome() {
                        Outcome::KeptPrevious if refusing => Outcome::Refused,
                        outcome => outcome,
                    };
                    self.rejected.insert(*frontend, outcome);
                    report.rejected.push(rejected);
                }
            }
        }

        self.collect_backends(&mut report)?;
        Ok(report)
    }

    fn write(&mut self, report: &mut ApplyReport, op: Op) -> Result<(), StoreError> {
        self.store.write(&op)?;
        report.writes += 1;
        Ok(())
    }

    /// Leaves `keys` in the map until the next apply, accounted for until then.
    fn delete_later(&mut self, keys: impl IntoIterator<Item = SlotKey>) {
        for key in keys {
            if self.pending_deletes.insert(key) {
                self.service_entries += 1;
            }
        }
    }

    fn remove_frontend(
        &mut self,
        report: &mut ApplyReport,
        frontend: Frontend,
    ) -> Result<(), StoreError> {
        let Some(programmed) = self.frontends.get(&frontend).cloned() else {
            return Ok(());
        };
        // The master now: from then on lookups no longer see the frontend. Its slots at
        // the next apply: a lookup that read the master just before may still go there.
        self.write(
            report,
            Op::DeleteService {
                key: service_key(&frontend, 0),
            },
        )?;
        self.frontends.remove(&frontend);
        self.reference(&programmed.slots, false);
        self.service_entries -= programmed.entries();
        self.delete_later(
            (1..=programmed.slots.len()).map(|i| service_key(&frontend, slot_number(i - 1))),
        );
        self.service_ids.remove(&programmed.service_id);
        Ok(())
    }

    /// Applies one frontend's change, or leaves it untouched and says why.
    fn update_frontend(
        &mut self,
        report: &mut ApplyReport,
        frontend: Frontend,
        spec: &FrontendSpec,
    ) -> Result<Result<(), Rejected>, StoreError> {
        let old = self.frontends.get(&frontend).cloned();
        let (mut flags, affinity_timeout_s) = match spec.affinity_timeout_seconds {
            Some(timeout) => (SERVICE_FLAG_AFFINITY, timeout),
            None => (0, 0),
        };
        if spec.maglev {
            flags |= SERVICE_FLAG_MAGLEV;
        }
        if spec.no_endpoints && spec.backends.is_empty() {
            flags |= SERVICE_FLAG_REJECT;
        }

        // Backend ids: existing ones reused, new ones reserved (written only if accepted).
        let mut new_backends: Vec<(u32, BackendAddr)> = Vec::new();
        let mut new_ids: HashMap<BackendAddr, u32> = HashMap::new();
        let mut wanted = Vec::with_capacity(spec.backends.len());
        for addr in &spec.backends {
            let id = match self.backend_ids.get(&(*addr, frontend.protocol)) {
                Some(id) => *id,
                None => match new_ids.get(addr) {
                    Some(id) => *id,
                    None => {
                        let id = self.allocate_backend_id();
                        new_ids.insert(*addr, id);
                        new_backends.push((id, *addr));
                        id
                    }
                },
            };
            wanted.push(id);
        }

        let old_slots = old.as_ref().map_or(&[][..], |p| &p.slots[..]);
        let slots = assign_slots(old_slots, &wanted);
        if slots.len() > usize::from(socklb_abi::MAX_BACKENDS_PER_SERVICE) {
            let rejected = Rejected::TooManyBackends {
                frontend,
                count: slots.len(),
                max: socklb_abi::MAX_BACKENDS_PER_SERVICE,
                outcome: Outcome::KeptPrevious,
            };
            return self.refuse(report, frontend, flags, affinity_timeout_s, rejected);
        }

        let programmed = Programmed {
            service_id: match &old {
                Some(p) => p.service_id,
                None => self.allocate_service_id(),
            },
            flags,
            affinity_timeout_s,
            slots,
        };
        if old.as_ref() == Some(&programmed) {
            return Ok(Ok(()));
        }

        // Capacity: the peak during the update is the old entries plus the added slots.
        let old_entries = old.as_ref().map_or(0, |p| p.slots.len() + 1);
        let grow = (programmed.slots.len() + 1).saturating_sub(old_entries);
        if let Err(rejected) = self.check_room(frontend, grow, new_backends.len()) {
            return self.refuse(report, frontend, flags, affinity_timeout_s, rejected);
        }

        let new_entry: HashMap<u32, BackendAddr> = new_backends.iter().copied().collect();
        let backend_of = |id: u32| {
            new_entry
                .get(&id)
                .or_else(|| Some(&self.backends.get(&id)?.0))
                .copied()
        };
        let ops = frontend_ops(
            &frontend,
            old.as_ref(),
            &programmed,
            &new_backends,
            backend_of,
        );
        for op in ops {
            self.write(report, op)?;
        }
        for (id, addr) in new_backends {
            self.backends.insert(id, (addr, frontend.protocol));
            self.backend_ids.insert((addr, frontend.protocol), id);
        }
        self.service_entries -= old.as_ref().map_or(0, Programmed::entries);
        self.service_entries += programmed.entries();
        // Only the slots that changed move references: a one-endpoint change of a large
        // Service costs a few hash updates, not two per slot.
        let old_slots = old.as_ref().map_or(&[][..], |p| &p.slots[..]);
        let changed = |slots: &[u32], other: &[u32]| -> Vec<u32> {
            let moved = slots.iter().enumerate();
            moved
                .filter(|(index, id)| other.get(*index) != Some(*id))
                .map(|(_, id)| *id)
                .collect()
        };
        let (added, removed) = (
            changed(&programmed.slots, old_slots),
            changed(old_slots, &programmed.slots),
        );
        // Added first, so that a backend that only changes slot never looks unused.
        self.reference(&added, true);
        self.reference(&removed, false);
        if let Some(old) = &old {
            // Above the new count: a lookup that read the old count may still go there.
            self.delete_later(
                (programmed.slots.len()..old.slots.len())
                    .map(|i| service_key(&frontend, slot_number(i))),
            );
        }
        self.service_ids.insert(programmed.service_id);
        self.frontends.insert(frontend, programmed);
        Ok(Ok(()))
    }

    /// Reports `rejected` with what became of the frontend: one programmed before keeps its
    /// state; a new one is programmed without backends (refused) if its master entry fits,
    /// so that its VIP is not left untranslated.
    fn refuse(
        &mut self,
        report: &mut ApplyReport,
        frontend: Frontend,
        flags: u16,
        affinity_timeout_s: u32,
        rejected: Rejected,
    ) -> Result<Result<(), Rejected>, StoreError> {
        if self.frontends.contains_key(&frontend) {
            return Ok(Err(rejected.with_outcome(Outcome::KeptPrevious)));
        }
        if self.service_entries() >= self.capacity.service_entries {
            return Ok(Err(rejected.with_outcome(Outcome::NotProgrammed)));
        }
        let programmed = Programmed {
            service_id: self.allocate_service_id(),
            flags,
            affinity_timeout_s,
            slots: Vec::new(),
        };
        self.write(
            report,
            Op::PutService {
                key: service_key(&frontend, 0),
                value: SlotValue::Master(programmed.master()),
            },
        )?;
        self.service_entries += programmed.entries();
        self.service_ids.insert(programmed.service_id);
        self.frontends.insert(frontend, programmed);
        Ok(Err(rejected.with_outcome(Outcome::Refused)))
    }

    fn check_room(
        &self,
        frontend: Frontend,
        grow: usize,
        new_backends: usize,
    ) -> Result<(), Rejected> {
        let used = self.service_entries();
        let free = self.capacity.service_entries.saturating_sub(used);
        let grow = u32::try_from(grow).unwrap_or(u32::MAX);
        if grow > free {
            return Err(Rejected::MapFull {
                frontend,
                map: socklb_abi::map_names::SERVICES,
                flag: "--max-service-entries",
                capacity: self.capacity.service_entries,
                free,
                needed: grow,
                outcome: Outcome::KeptPrevious,
            });
        }
        let free = self
            .capacity
            .backends
            .saturating_sub(self.backend_entries());
        let needed = u32::try_from(new_backends).unwrap_or(u32::MAX);
        if needed > free {
            return Err(Rejected::MapFull {
                frontend,
                map: socklb_abi::map_names::BACKENDS,
                flag: "--max-backends",
                capacity: self.capacity.backends,
                free,
                needed,
                outcome: Outcome::KeptPrevious,
            });
        }
        Ok(())
    }

    /// Deletes backends that no frontend's slot refers to any more.
    fn collect_backends(&mut self, report: &mut ApplyReport) -> Result<(), StoreError> {
        for id in std::mem::take(&mut self.unreferenced) {
            let Some((addr, _)) = self.backends.get(&id) else {
                continue;
            };
            let address = addr.address;
            self.write(report, Op::DeleteBackend { id, address })?;
            if let Some(key) = self.backends.remove(&id)
                && self.backend_ids.get(&key) == Some(&id)
            {
                self.backend_ids.remove(&key);
            }
        }
        Ok(())
    }

    /// A backend id no backend has. Ids handed out by one update are distinct without a
    /// check: the counter only moves on, and one update needs fewer than 2^32 of them.
    fn allocate_backend_id(&mut self) -> u32 {
        loop {
            let id = self.next_backend_id;
            self.next_backend_id = self.next_backend_id.checked_add(1).unwrap_or(1);
            if id != 0 && !self.backends.contains_key(&id) {
                return id;
            }
        }
    }

    fn allocate_service_id(&mut self) -> u32 {
        loop {
            let id = self.next_service_id;
            self.next_service_id = self.next_service_id.checked_add(1).unwrap_or(1);
            if id != 0 && !self.service_ids.contains(&id) {
                return id;
            }
        }
    }
}

/// The writes that take one frontend from `old` to `new`, in a lookup-safe order. Pure.
fn frontend_ops(
    frontend: &Frontend,
    old: Option<&Programmed>,
    new: &Programmed,
    new_backends: &[(u32, BackendAddr)],
    backend_of: impl Fn(u32) -> Option<BackendAddr>,
) -> Vec<Op> {
    let mut ops: Vec<Op> = new_backends
        .iter()
        .map(|(id, backend)| Op::PutBackend {
            id: *id,
            backend: *backend,
            protocol: frontend.protocol,
        })
        .collect();
    let old_slots = old.map_or(&[][..], |p| &p.slots[..]);
    // Slots first: those beyond the old count are not yet visible to lookups.
    for (index, id) in new.slots.iter().enumerate() {
        if old_slots.get(index) != Some(id) {
            // Every slot id comes from the mirror or the new backends.
            let backend = backend_of(*id)
                .unwrap_or_else(|| BackendAddr::local(unspecified_like(frontend.address), 0));
            ops.push(Op::PutService {
                key: service_key(frontend, slot_number(index)),
                value: SlotValue::Backend { id: *id, backend },
            });
        }
    }
    // Then the master: new count, flags and timeout become visible at once. Slots above
    // a lowered count stay until the next apply (the caller schedules them).
    if old.map(Programmed::master) != Some(new.master()) {
        ops.push(Op::PutService {
            key: service_key(frontend, 0),
            value: SlotValue::Master(new.master()),
        });
    }
    ops
}

/// The unspecified address of `address`'s family: what a slot that could not be read shows.
pub fn unspecified_like(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    }
}

fn slot_number(index: usize) -> u16 {
    // Bounded by MAX_BACKENDS_PER_SERVICE, checked before any slot is written.
    u16::try_from(index + 1).unwrap_or(u16::MAX)
}

pub fn service_key(frontend: &Frontend, slot: u16) -> SlotKey {
    SlotKey {
        frontend: *frontend,
        slot,
    }
}

/// An in-memory store for tests: what the maps would hold, checked after every write as a
/// concurrent lookup would see it.
#[cfg(test)]
pub(crate) mod recorder {
    use std::collections::BTreeMap;

    use super::{BackendAddr, Op, Protocol, SlotKey, SlotValue, Store, StoreError};

    /// Records operations and keeps the resulting map contents.
    pub struct Recorder {
        pub ops: Vec<Op>,
        pub services: BTreeMap<SlotKey, SlotValue>,
        pub backends: BTreeMap<u32, (BackendAddr, Protocol)>,
        pub check_every_write: bool,
        /// The most entries each map held at once, since the start or `reset_peaks`.
        pub peak_services: usize,
        pub peak_backends: usize,
    }

    impl Recorder {
        /// Peaks start again from what the maps hold now.
        pub fn reset_peaks(&mut self) {
            self.peak_services = self.services.len();
            self.peak_backends = self.backends.len();
        }

        /// What the maps hold, as a store would read it back.
        pub fn contents(&self) -> super::MapContents {
            super::MapContents {
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
                peak_services: 0,
                peak_backends: 0,
            }
        }
    }

    impl Store for Recorder {
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
            self.peak_services = self.peak_services.max(self.services.len());
            self.peak_backends = self.peak_backends.max(self.backends.len());
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
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::{
        recorder::{Recorder, assert_consistent},
        *,
    };
    use crate::dataplane::Scope;

    /// The count of a test frontend's master entry.
    fn master_count(w: &Writer<Recorder>, last: u8) -> u16 {
        match w.store.services[&service_key(&frontend(last), 0)] {
            SlotValue::Master(master) => master.count,
            SlotValue::Backend { .. } => panic!("slot 0 holds a backend"),
        }
    }

    const CAPACITY: Capacity = Capacity {
        service_entries: 1000,
        backends: 1000,
    };

    fn frontend(last: u8) -> Frontend {
        Frontend {
            address: Ipv4Addr::new(10, 96, 0, last).into(),
            port: 80,
            protocol: Protocol::Tcp,
            scope: Scope::Internal,
        }
    }

    fn backends(lasts: &[u8]) -> Vec<BackendAddr> {
        lasts
            .iter()
            .map(|last| BackendAddr::local(Ipv4Addr::new(10, 0, 0, *last), 8080))
            .collect()
    }

    fn desired(entries: &[(u8, &[u8])]) -> Desired {
        let mut desired = Desired::default();
        for (f, b) in entries {
            desired.insert(
                frontend(*f),
                FrontendSpec {
                    backends: backends(b),
                    affinity_timeout_seconds: None,
                    source_ranges: None,
                    maglev: false,
                    no_endpoints: false,
                },
            );
        }
        desired
    }

    /// The writes of the next apply when nothing changed: the deletions it catches up on.
    fn next_apply(w: &mut Writer<Recorder>) -> Vec<String> {
        w.store.ops.clear();
        w.apply_changes(&BTreeMap::new()).expect("apply");
        kinds(&w.store.ops)
    }

    fn writer() -> Writer<Recorder> {
        Writer::adopt(Recorder::default(), CAPACITY, MapContents::default())
    }

    fn kinds(ops: &[Op]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::PutBackend { id, .. } => format!("+be{id}"),
                Op::DeleteBackend { id, .. } => format!("-be{id}"),
                Op::PutService {
                    value: SlotValue::Master(master),
                    ..
                } => format!("+master(count={})", master.count),
                Op::PutService {
                    key,
                    value: SlotValue::Backend { id, .. },
                } => format!("+slot{}=be{id}", key.slot),
                Op::DeleteService { key } if key.slot == 0 => "-master".to_owned(),
                Op::DeleteService { key } => format!("-slot{}", key.slot),
                Op::DeleteStray { key } => format!("-stray{key:?}"),
            })
            .collect()
    }

    #[test]
    fn new_frontend_writes_backends_then_slots_then_master() {
        let mut w = writer();
        w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
        assert_eq!(
            kinds(&w.store.ops),
            [
                "+be1",
                "+be2",
                "+slot1=be1",
                "+slot2=be2",
                "+master(count=2)"
            ]
        );
    }

    #[test]
    fn unchanged_desired_writes_nothing() {
        let mut w = writer();
        let d = desired(&[(1, &[1, 2]), (2, &[])]);
        w.apply(&d).expect("apply");
        let report = w.apply(&d).expect("apply");
        assert_eq!(report.writes, 0);
    }

    #[test]
    fn shrink_lowers_count_and_deletes_the_slots_above_it_one_apply_later() {
        let mut w = writer();
        w.apply(&desired(&[(1, &[1, 2, 3])])).expect("apply");
        w.store.ops.clear();
        w.apply(&desired(&[(1, &[1, 3])])).expect("apply");
        // Slot 3 stays for a lookup that read count 3 (it names be3, which stays).
        assert_eq!(
            kinds(&w.store.ops),
            ["+slot2=be3", "+master(count=2)", "-be2"]
        );
        assert_eq!(w.service_entries() as usize, w.store.services.len());
        assert_eq!(next_apply(&mut w), ["-slot3"]);
    }

    #[test]
    fn replacing_the_whole_set_never_exposes_a_missing_backend() {
        let mut w = writer();
        w.apply(&desired(&[(1, &[1, 2, 3])])).expect("apply");
        w.store.ops.clear();
        w.apply(&desired(&[(1, &[4, 5])])).expect("apply");
        assert_eq!(
            kinds(&w.store.ops),
            [
                "+be4",
                "+be5",
                "+slot1=be4",
                "+slot2=be5",
                "+master(count=2)",
                "-be1",
                "-be2",
                "-be3"
            ]
        );
        assert_eq!(next_apply(&mut w), ["-slot3"]);
    }

    #[test]
    fn removed_frontend_loses_master_before_slots() {
        let mut w = writer();
        w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
        w.store.ops.clear();
        w.apply(&desired(&[])).expect("apply");
        assert_eq!(kinds(&w.store.ops), ["-master", "-be1", "-be2"]);
        assert_eq!(next_apply(&mut w), ["-slot1", "-slot2"]);
        assert!(w.store.services.is_empty());
        assert_eq!(w.service_entries(), 0);
    }

    #[test]
    fn no_backends_keeps_a_master_with_count_zero() {
        let mut w = writer();
        w.apply(&desired(&[(1, &[1])])).expect("apply");
        w.store.ops.clear();
        w.apply(&desired(&[(1, &[])])).expect("apply");
        assert_eq!(kinds(&w.store.ops), ["+master(count=0)", "-be1"]);
        assert_eq!(next_apply(&mut w), ["-slot1"]);
    }

    #[test]
    fn shared_backend_is_written_once_and_kept_while_used() {
        let mut w = writer();
        w.apply(&desired(&[(1, &[1]), (2, &[1])])).expect("apply");
        assert_eq!(w.store.backends.len(), 1);
        w.store.ops.clear();
        w.apply(&desired(&[(2, &[1])])).expect("apply");
        assert_eq!(kinds(&w.store.ops), ["-master"]);
    }

    #[test]
    fn a_remote_backend_is_flagged_in_its_slot_and_survives_adoption() {
        let mut w = writer();
        let mut d = desired(&[(1, &[1, 2])]);
        for spec in d.frontends.values_mut() {
            spec.backends[1].remote = true;
        }
        w.apply(&d).expect("apply");
        let remote: Vec<bool> = (1..=2)
            .map(
                |slot| match w.store.services[&service_key(&frontend(1), slot)] {
                    SlotValue::Backend { backend, .. } => backend.remote,
                    SlotValue::Master(_) => panic!("slot {slot} holds a master"),
                },
            )
            .collect();
        assert_eq!(remote, [false, true]);
        let contents = w.store.contents();
        let recorder = Recorder {
            services: w.store.services.clone(),
            backends: w.store.backends.clone(),
            ..Recorder::default()
        };
        let mut adopted = Writer::adopt(recorder, CAPACITY, contents);
        assert_eq!(adopted.apply(&d).expect("apply").writes, 0);
    }

    #[test]
    fn affinity_change_rewrites_only_the_master() {
        let mut w = writer();
        let mut d = desired(&[(1, &[1])]);
        w.apply(&d).expect("apply");
        w.store.ops.clear();
        d.frontends
            .get_mut(&frontend(1))
            .expect("frontend")
            .affinity_timeout_seconds = Some(30);
        w.apply(&d).expect("apply");
        assert_eq!(kinds(&w.store.ops), ["+master(count=1)"]);
        let SlotValue::Master(master) = w.store.services[&service_key(&frontend(1), 0)] else {
            panic!("no master");
        };
        assert_eq!(master.flags, SERVICE_FLAG_AFFINITY);
        assert_eq!(master.affinity_timeout_s, 30);
    }

    #[test]
    fn adopting_the_maps_makes_a_restart_write_nothing() {
        let mut first = writer();
        let d = desired(&[(1, &[1, 2, 3]), (2, &[2]), (3, &[])]);
        first.apply(&d).expect("apply");
        let contents = first.store.contents();
        let recorder = Recorder {
            services: first.store.services.clone(),
            backends: first.store.backends.clone(),
            ..Recorder::default()
        };
        let mut second = Writer::adopt(recorder, CAPACITY, contents);
        let report = second.apply(&d).expect("apply");
        assert_eq!(report.writes, 0, "{:?}", kinds(&second.store.ops));
    }

    #[test]
    fn adopting_repairs_strays_orphans_holes_and_edited_slots() {
        let f = frontend(1);
        let backend = |id: u32| BackendAddr::local(Ipv4Addr::new(10, 0, 0, id as u8), 8080);
        let slot = |id: u32, backend: BackendAddr| SlotValue::Backend { id, backend };
        let master = SlotValue::Master(Master {
            count: 3,
            service_id: 7,
            ..Master::default()
        });
        let stray = StrayKey::V4(socklb_abi::ServiceKey {
            protocol: 99,
            ..socklb_abi::ServiceKey::default()
        });
        let contents = MapContents {
            services: vec![
                (service_key(&f, 0), master),
                (service_key(&f, 1), slot(1, backend(1))),
                // slot 2 missing (a hole), slot 3 edited by hand (wrong port)
                (
                    service_key(&f, 3),
                    slot(
                        3,
                        BackendAddr {
                            port: 9999,
                            ..backend(3)
                        },
                    ),
                ),
                // above the count
                (service_key(&f, 5), slot(2, backend(2))),
                // an orphan slot of a frontend without master
                (service_key(&frontend(9), 1), slot(1, backend(1))),
            ],
            // a key of a protocol this agent does not know
            strays: vec![stray],
            backends: (1..=3)
                .map(|id| (id, backend(id), Some(Protocol::Tcp)))
                .collect(),
        };
        // The adopted maps are inconsistent on purpose: check only the end state.
        let recorder = Recorder {
            services: contents.services.iter().copied().collect(),
            backends: contents
                .backends
                .iter()
                .map(|(id, addr, _)| (*id, (*addr, Protocol::Tcp)))
                .collect(),
            check_every_write: false,
            ..Recorder::default()
        };
        let mut w = Writer::adopt(recorder, CAPACITY, contents);
        w.apply(&desired(&[(1, &[1, 2, 3])])).expect("apply");
        assert!(w.store.ops.contains(&Op::DeleteStray { key: stray }));
        assert_consistent(&w.store.services, &w.store.backends);
        let slots: Vec<_> = w
            .store
            .services
            .keys()
            .map(|k| (k.frontend, k.slot))
            .collect();
        assert_eq!(slots, [(f, 0), (f, 1), (f, 2), (f, 3)]);
        let SlotValue::Master(master) = w.store.services[&service_key(&f, 0)] else {
            panic!("no master");
        };
        assert_eq!(master.service_id, 7);
        assert_eq!(w.store.services[&service_key(&f, 3)], slot(3, backend(3)));
        assert_eq!(w.store.backends.len(), 3);
        assert_eq!(w.service_entries() as usize, w.store.services.len());
    }

    #[test]
    fn partial_changes_touch_only_the_named_frontends() {
        let mut w = writer();
        w.apply(&desired(&[(1, &[1, 2]), (2, &[2, 3])]))
            .expect("apply");
        w.store.ops.clear();
        let spec = FrontendSpec {
            backends: backends(&[3]),
            affinity_timeout_seconds: None,
            source_ranges: None,
            maglev: false,
            no_endpoints: false,
        };
        // Frontend 1 now uses backend 3 only; frontend 3 is removed (never existed: no-op).
        let changes = BTreeMap::from([(frontend(1), Some(&spec)), (frontend(3), None)]);
        w.apply_changes(&changes).expect("apply");
        // Backend 2 is still used by frontend 2; backend 1 is not used any more.
        assert_eq!(
            kinds(&w.store.ops),
            ["+slot1=be3", "+master(count=1)", "-be1"]
        );
        assert_eq!(w.store.backends.len(), 2);
    }

    #[test]
    fn entry_accounting_matches_the_maps_through_changes() {
        let mut w = writer();
        let steps: [&[(u8, &[u8])]; 5] = [
            &[(1, &[1, 2, 3]), (2, &[2])],
            &[(1, &[1]), (2, &[2, 3, 4]), (3, &[])],
            &[(3, &[5, 6])],
            &[],
            &[(4, &[1, 2, 3, 4, 5, 6])],
        ];
        for step in steps {
            w.apply(&desired(step)).expect("apply");
            assert_eq!(
                w.service_entries() as usize,
                w.store.services.len(),
                "{step:?}"
            );
            assert_eq!(
                w.backend_entries() as usize,
                w.store.backends.len(),
                "{step:?}"
            );
        }
    }

    #[test]
    fn a_change_that_does_not_fit_leaves_the_frontend_as_it_was() {
        let mut w = Writer::adopt(
            Recorder::default(),
            Capacity {
                service_entries: 5,
                backends: 10,
            },
            MapContents::default(),
        );
        w.apply(&desired(&[(1, &[1, 2]), (2, &[])])).expect("apply");
        let before = w.store.services.clone();
        let report = w
            .apply(&desired(&[(1, &[1, 2, 3, 4]), (2, &[])]))
            .expect("apply");
        assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
        let message = report.rejected[0].to_string();
        assert!(message.contains("socklb_svc_v2"), "{message}");
        assert!(message.contains("--max-service-entries"), "{message}");
        assert!(message.contains("keeps its previous state"), "{message}");
        assert_eq!(w.store.services, before);
        assert!(!w.store.backends.contains_key(&3));
    }

    #[test]
    fn programmed_frontends_get_the_room_and_a_new_one_that_does_not_fit_is_refused() {
        let mut w = Writer::adopt(
            Recorder::default(),
            Capacity {
                service_entries: 6,
                backends: 10,
            },
            MapContents::default(),
        );
        w.apply(&desired(&[(2, &[1, 2])])).expect("apply");
        // Frontend 1 sorts first but is new: frontend 2, programmed, grows first.
        let report = w
            .apply(&desired(&[(1, &[5, 6]), (2, &[1, 2, 3, 4])]))
            .expect("apply");
        assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
        assert_eq!(report.rejected[0].frontend(), frontend(1));
        let message = report.rejected[0].to_string();
        assert!(message.contains("refused until it fits"), "{message}");
        assert_eq!(master_count(&w, 2), 4);
        // Frontend 1 refuses connections (count 0) instead of leaving its VIP untranslated.
        assert_eq!(master_count(&w, 1), 0);
        // Once there is room, it is programmed in full.
        w.apply(&desired(&[(1, &[5, 6]), (2, &[1])]))
            .expect("apply");
        let report = w
            .apply(&desired(&[(1, &[5, 6]), (2, &[1])]))
            .expect("apply");
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        assert_eq!(master_count(&w, 1), 2);
    }

    /// The writer's count of rejected frontends is the current state: a frontend rejected
    /// by an earlier apply stays counted through applies that do not touch it, and leaves
    /// the count when it fits, is removed, or is no longer desired.
    #[test]
    fn rejected_frontends_are_counted_until_they_fit_or_go() {
        let mut w = Writer::adopt(
            Recorder::default(),
            Capacity {
                service_entries: 4,
                backends: 10,
            },
            MapContents::default(),
        );
        let count = |w: &Writer<Recorder>, outcome: Outcome| {
            w.rejected()
                .into_iter()
                .find_map(|(o, n)| (o == outcome).then_some(n))
                .expect("every outcome")
        };
        w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
        let wanted = desired(&[(1, &[1, 2, 3, 4]), (2, &[5]), (3, &[6])]);
        let spec = |f: u8| wanted.frontends.get(&frontend(f));
        // Frontend 1 cannot grow (kept), frontend 2 gets a master only (refused).
        let report = w
            .apply_changes(&BTreeMap::from([
                (frontend(1), spec(1)),
                (frontend(2), spec(2)),
            ]))
            .expect("apply");
        assert_eq!(report.rejected.len(), 2, "{:?}", report.rejected);
        assert_eq!(count(&w, Outcome::KeptPrevious), 1);
        assert_eq!(count(&w, Outcome::Refused), 1);
        // An apply of another frontend only: the two above are still not programmed.
        let report = w
            .apply_changes(&BTreeMap::from([(frontend(3), spec(3))]))
            .expect("apply");
        assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
        assert_eq!(count(&w, Outcome::KeptPrevious), 1);
        assert_eq!(count(&w, Outcome::Refused), 1);
        assert_eq!(count(&w, Outcome::NotProgrammed), 1);
        // Retried, the refused frontend still does not fit: kept as it was, which is refusing.
        w.apply_changes(&BTreeMap::from([(frontend(2), spec(2))]))
            .expect("apply");
        assert_eq!(count(&w, Outcome::Refused), 1);
        assert_eq!(count(&w, Outcome::KeptPrevious), 1);
        // Frontend 2 removed; frontend 3 no longer desired at a full apply.
        w.apply_changes(&BTreeMap::from([(frontend(2), None)]))
            .expect("apply");
        assert_eq!(count(&w, Outcome::Refused), 0);
        assert_eq!(count(&w, Outcome::NotProgrammed), 1);
        let report = w.apply(&desired(&[(1, &[1, 2, 3])])).expect("apply");
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        assert_eq!(
            w.rejected().map(|(_, n)| n),
            [0, 0, 0],
            "frontend 1 fits now"
        );
    }

    #[test]
    fn a_new_frontend_without_room_even_for_its_master_says_it_is_untranslated() {
        let mut w = Writer::adopt(
            Recorder::default(),
            Capacity {
                service_entries: 3,
                backends: 10,
            },
            MapContents::default(),
        );
        w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
        let report = w
            .apply(&desired(&[(1, &[1, 2]), (2, &[3])]))
            .expect("apply");
        assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
        assert_eq!(report.rejected[0].outcome(), Outcome::NotProgrammed);
        assert!(
            report.rejected[0].to_string().contains("not translated"),
            "{}",
            report.rejected[0]
        );
        assert!(!w.store.services.contains_key(&service_key(&frontend(2), 0)));
    }

    #[test]
    fn preferred_frontends_get_the_room_before_other_new_ones() {
        let mut w = Writer::adopt(
            Recorder::default(),
            Capacity {
                service_entries: 4,
                backends: 10,
            },
            MapContents::default(),
        );
        // As after the maps were replaced: frontend 2 was programmed in the old ones.
        w.prefer([frontend(2)]);
        let report = w
            .apply(&desired(&[(1, &[1, 2]), (2, &[3, 4])]))
            .expect("apply");
        assert_eq!(report.rejected.len(), 1, "{:?}", report.rejected);
        assert_eq!(report.rejected[0].frontend(), frontend(1));
        assert_eq!(master_count(&w, 2), 2);
    }

    #[test]
    fn backend_map_full_is_reported_with_its_flag() {
        let mut w = Writer::adopt(
            Recorder::default(),
            Capacity {
                service_entries: 100,
                backends: 1,
            },
            MapContents::default(),
        );
        let report = w.apply(&desired(&[(1, &[1, 2])])).expect("apply");
        assert!(report.rejected[0].to_string().contains("--max-backends"));
        assert_eq!(kinds(&w.store.ops), ["+master(count=0)"]);
    }
}
