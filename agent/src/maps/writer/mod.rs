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
mod backends;
mod extras;
#[cfg(test)]
pub(crate) mod recorder;
mod report;
mod store;
#[cfg(test)]
mod tests;
mod verified;
mod verify;

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

// foldhash rather than std's SipHash: a first sync of 100,000 Services hashes millions of
// ids and addresses.
use hashbrown::{HashMap, HashSet};
use socklb_abi::{SERVICE_FLAG_AFFINITY, SERVICE_FLAG_MAGLEV, SERVICE_FLAG_REJECT, map_names};

pub use self::{
    report::{ApplyReport, Capacity, Demand, Outcome, Rejected, Room},
    store::{
        BackendEntry, MapContents, Master, Op, SlotKey, SlotValue, Store, StoreError, StrayKey,
        WalkPosition,
    },
    verified::{Extras, Verified, VerifyError},
};
use crate::desired::{
    BackendAddr, Desired, Frontend, FrontendSpec, Protocol, layout::assign_slots,
    sizing::MIN_FRONTEND_ENTRIES,
};

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
    /// Service entries it counts for: master and slots ([`frontend_entries`]).
    fn entries(&self) -> usize {
        frontend_entries(self.slots.len())
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
    backends: backends::Backends,
    /// Service-map entries no count covers any more, deleted at the start of the next
    /// apply: slots above a lowered count, a removed frontend's slots, and what adoption
    /// found without a master or above its count.
    pending_deletes: BTreeSet<SlotKey>,
    /// Entries found in the maps that name no frontend, deleted at the next apply.
    strays: BTreeSet<StrayKey>,
    /// Backend-map entries found that the mirror does not hold (by id, with the address
    /// that says which family's map), deleted at the next apply.
    stray_backends: BTreeSet<(u32, IpAddr)>,
    /// Service-map entries the mirror accounts for (pending deletes included), each
    /// family's, kept up to date (not recounted).
    service_entries: PerFamily,
    service_ids: HashSet<u32>,
    next_service_id: u32,
    /// Frontends the replaced maps held: programmed ahead of other new frontends.
    preferred: BTreeSet<Frontend>,
    /// Every frontend whose last apply was rejected, whichever apply that was: the
    /// current state, not one sync's report.
    rejected: BTreeMap<Frontend, Outcome>,
    /// Where [`Self::verify`] goes on from.
    verify_cursor: verified::Cursor,
    /// Where [`Self::find_extras`] goes on from.
    walk_from: WalkPosition,
}

impl<S: Store> Writer<S> {
    /// A writer that adopts what the maps already hold.
    pub fn adopt(store: S, capacity: Capacity, contents: MapContents) -> Self {
        let mut writer = Self {
            store,
            capacity,
            frontends: BTreeMap::new(),
            backends: backends::Backends::default(),
            pending_deletes: BTreeSet::new(),
            strays: BTreeSet::new(),
            stray_backends: BTreeSet::new(),
            service_entries: PerFamily::default(),
            service_ids: HashSet::new(),
            next_service_id: 1,
            preferred: BTreeSet::new(),
            rejected: BTreeMap::new(),
            verify_cursor: verified::Cursor::START,
            walk_from: WalkPosition::default(),
        };
        writer.readopt(contents);
        writer
    }

    /// Replaces the mirror with what the maps hold now.
    pub fn readopt(&mut self, contents: MapContents) {
        self.frontends.clear();
        self.backends.clear();
        self.pending_deletes.clear();
        self.verify_cursor = verified::Cursor::START;
        self.walk_from = WalkPosition::default();
        self.strays = contents.strays.into_iter().collect();
        self.next_service_id = 1;
        // Ids are dense within a family, so none this writer gives is beyond its map's room;
        // one that is (an older agent's, whose ids only grew) is not adopted: it is deleted
        // before the next apply hands out ids, and the slots naming it are rewritten.
        let capacity = self.capacity;
        let (adopted, dropped): (Vec<_>, Vec<_>) =
            contents.backends.into_iter().partition(|(id, addr, _)| {
                let room = capacity.of(addr.address).backends;
                backends::fits_family(*id, addr) && (id & !backends::IPV6_ID) < room
            });
        self.stray_backends = dropped
            .into_iter()
            .map(|(id, addr, _)| (id, addr.address))
            .collect();
        for (id, addr, protocol) in adopted {
            let Some(protocol) = protocol else {
                // Unknown protocol: not ours to interpret; dropped at the next apply.
                self.backends.insert(id, addr, Protocol::Tcp, false);
                continue;
            };
            self.backends.insert(id, addr, protocol, true);
        }

        let mut slots: HashMap<Frontend, BTreeMap<u16, u32>> = HashMap::new();
        let mut masters = Vec::new();
        for (key, value) in contents.services {
            match value {
                SlotValue::Master(master) if key.slot == 0 => masters.push((key.frontend, master)),
                SlotValue::Backend { id, backend } if key.slot != 0 => {
                    // A slot must name a backend adopted above, with the address it was
                    // read with; one that does not is a hole, rewritten at the next apply.
                    let agrees = self.backends.get(id).is_some_and(|(b, _)| {
                        (b.address, b.port) == (backend.address, backend.port)
                    });
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
        let mut entries = PerFamily::default();
        for (frontend, programmed) in &self.frontends {
            *entries.of(frontend.address.is_ipv6()) += programmed.entries();
        }
        for key in &self.pending_deletes {
            *entries.of(key.frontend.address.is_ipv6()) += 1;
        }
        for stray in &self.strays {
            *entries.of(stray.is_ipv6()) += 1;
        }
        self.service_entries = entries;
        self.service_ids = self.frontends.values().map(|p| p.service_id).collect();
        for programmed in self.frontends.values() {
            self.backends.reference(&programmed.slots, true);
        }
    }

    /// Counts the slots of a frontend as added (`+`) or removed (`-`) references.
    fn reference(&mut self, slots: &[u32], added: bool) {
        self.backends.reference(slots, added);
    }

    pub fn store(&self) -> &S {
        &self.store
    }

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
        !self.pending_deletes.is_empty()
            || !self.strays.is_empty()
            || !self.stray_backends.is_empty()
    }

    /// Number of service-map entries the mirror accounts for, both families.
    #[cfg(test)]
    pub fn service_entries(&self) -> u32 {
        count(self.service_entries.v4 + self.service_entries.v6)
    }

    /// Entries each family's service and backend maps hold, as the mirror accounts for them
    /// (the IPv4 backend array: the entries it needs to span every id held).
    pub fn entries(&self) -> Capacity {
        let room = |ipv6: bool| Room {
            service_entries: count(self.service_entries.get(ipv6)),
            backends: count(backend_entries(&self.backends, ipv6, 0)),
        };
        Capacity {
            v4: room(false),
            v6: room(true),
        }
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
                self.backends.get(*id).map_or(
                    BackendAddr::local(unspecified_like(frontend.address), 0),
                    |(addr, _)| addr,
                )
            })
            .collect();
        Some((programmed.service_id, backends))
    }

    /// A programmed frontend's service id.
    pub fn service_id(&self, frontend: &Frontend) -> Option<u32> {
        Some(self.frontends.get(frontend)?.service_id)
    }

    #[cfg(test)]
    pub fn backend_entries(&self) -> u32 {
        count(self.backends.len())
    }

    /// At most how many entries the maps hold while `changes` are applied: what they hold
    /// now (entries waiting for deletion included) plus what growing frontends and new
    /// backends add, and how many frontends are programmed at once. Removals and shrinks
    /// free nothing within an apply.
    pub fn demand<'a>(
        &self,
        changes: impl IntoIterator<Item = (&'a Frontend, Option<&'a FrontendSpec>)>,
    ) -> Demand {
        let mut service_entries = self.service_entries;
        let mut frontends = self.frontends.len();
        let mut new_backends = Vec::new();
        for (frontend, spec) in changes {
            let Some(spec) = spec else { continue };
            let old = self.frontends.get(frontend).map_or(0, Programmed::entries);
            frontends += usize::from(old == 0);
            *service_entries.of(frontend.address.is_ipv6()) +=
                frontend_entries(spec.backends.len()).saturating_sub(old);
            new_backends.extend(
                spec.backends
                    .iter()
                    .map(|addr| (*addr, frontend.protocol))
                    .filter(|(addr, protocol)| self.backends.id_of(addr, *protocol).is_none()),
            );
        }
        // Counted sorted rather than in a set: a first sync of 100,000 Services has a
        // million new backends, and a growing set spent about 0.3 s rehashing them.
        new_backends.sort_unstable();
        new_backends.dedup();
        let new_ipv6 = new_backends
            .iter()
            .filter(|(addr, _)| addr.address.is_ipv6())
            .count();
        let room = |ipv6: bool, new: usize| Room {
            service_entries: count(service_entries.get(ipv6)),
            backends: count(backend_entries(&self.backends, ipv6, new)),
        };
        Demand {
            maps: Capacity {
                v4: room(false, new_backends.len() - new_ipv6),
                v6: room(true, new_ipv6),
            },
            frontends: count(frontends),
        }
    }

    /// The maps' capacity changed (they grew): frontends are refused against the new one.
    pub fn set_capacity(&mut self, capacity: Capacity) {
        self.capacity = capacity;
    }

    /// Writes go to `store` from now on; it must hold what the old one held.
    pub fn replace_store(&mut self, store: S) -> S {
        // A position in the old maps means nothing in the new ones.
        self.walk_from = WalkPosition::default();
        std::mem::replace(&mut self.store, store)
    }

    /// The frontends an apply of `desired` would change: those not programmed as desired
    /// (or refused), and those programmed or refused but no longer desired (`None`). Found
    /// from the mirror alone: a full resync applies only these instead of every frontend.
    pub fn drifted<'d>(
        &self,
        desired: &'d Desired<'_>,
    ) -> BTreeMap<Frontend, Option<&'d FrontendSpec>> {
        let mut changes: BTreeMap<Frontend, Option<&FrontendSpec>> = self
            .frontends
            .keys()
            .chain(self.rejected.keys())
            .filter(|f| !desired.frontends.contains_key(f))
            .map(|f| (*f, None))
            .collect();
        changes.extend(
            desired
                .iter()
                .filter(|(frontend, spec)| !self.holds(frontend, spec))
                .map(|(frontend, spec)| (*frontend, Some(spec))),
        );
        changes
    }

    /// Whether `frontend` is programmed as `spec` asks, so that an update would write
    /// nothing: its flags, and its slots holding exactly the spec's backends.
    fn holds(&self, frontend: &Frontend, spec: &FrontendSpec) -> bool {
        let Some(programmed) = self.frontends.get(frontend) else {
            return false;
        };
        if self.rejected.contains_key(frontend)
            || (programmed.flags, programmed.affinity_timeout_s) != flags_of(spec)
            || programmed.slots.len() != spec.backends.len()
        {
            return false;
        }
        let mut wanted = Vec::with_capacity(spec.backends.len());
        for addr in &spec.backends {
            match self.backends.id_of(addr, frontend.protocol) {
                Some(id) => wanted.push(id),
                None => return false,
            }
        }
        // Both ways, as the slots hold no id twice and a spec might: a few backends are
        // compared in place, many through the layout the update would compute.
        if wanted.len() <= 32 {
            wanted.iter().all(|id| programmed.slots.contains(id))
                && programmed.slots.iter().all(|id| wanted.contains(id))
        } else {
            assign_slots(&programmed.slots, &wanted) == programmed.slots
        }
    }

    /// Makes the maps hold `desired` (every frontend), writing only what differs.
    ///
    /// After an error the mirror may no longer match the maps: adopt them again (the
    /// [`Dataplane`](crate::dataplane::Dataplane) does) before the next apply.
    pub fn apply(&mut self, desired: &Desired<'_>) -> Result<ApplyReport, StoreError> {
        // A frontend no longer desired is no longer rejected, programmed or not.
        self.rejected
            .retain(|frontend, _| desired.frontends.contains_key(frontend));
        let mut changes: BTreeMap<Frontend, Option<&FrontendSpec>> = self
            .frontends
            .keys()
            .filter(|f| !desired.frontends.contains_key(f))
            .map(|f| (*f, None))
            .collect();
        changes.extend(desired.iter().map(|(f, spec)| (*f, Some(spec))));
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
            *self.service_entries.of(key.frontend.address.is_ipv6()) -= 1;
        }
        self.store.apply_started();
        while let Some(key) = self.strays.pop_first() {
            if let Err(error) = self.write(&mut report, Op::DeleteStray { key }) {
                self.strays.insert(key);
                return Err(error);
            }
            *self.service_entries.of(key.is_ipv6()) -= 1;
        }
        // Before any id is handed out: a stray's id may be the next one.
        while let Some((id, address)) = self.stray_backends.pop_first() {
            if self.backends.contains(id) {
                continue;
            }
            if let Err(error) = self.write(&mut report, Op::DeleteBackend { id, address }) {
                self.stray_backends.insert((id, address));
                return Err(error);
            }
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
        if self.backends.len() == 0 {
            // Sized once: growing by doubling holds the old and new tables at once (35 MB
            // more at the peak of a first sync of 1,000,000 backends).
            self.backends
                .reserve(changes.iter().map(|(_, spec)| spec.backends.len()).sum());
        }
        changes.sort_by_key(|(frontend, spec)| {
            let old = self.frontends.get(frontend);
            let grows = frontend_entries(spec.backends.len())
                .cast_signed()
                .saturating_sub(old.map_or(0, Programmed::entries).cast_signed());
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
                *self.service_entries.of(key.frontend.address.is_ipv6()) += 1;
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
        *self.service_entries.of(frontend.address.is_ipv6()) -= programmed.entries();
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
        let (flags, affinity_timeout_s) = flags_of(spec);

        // Backend ids: existing ones reused, new ones the lowest free (taken only if the
        // update is accepted).
        let mut new_backends: Vec<(u32, BackendAddr)> = Vec::new();
        let mut new_ids: HashMap<BackendAddr, u32> = HashMap::new();
        let mut wanted = Vec::with_capacity(spec.backends.len());
        let mut vacant = self.backends.vacant_ids(frontend.address.is_ipv6());
        for addr in &spec.backends {
            let id = match self.backends.id_of(addr, frontend.protocol) {
                Some(id) => id,
                None => match new_ids.get(addr) {
                    Some(id) => *id,
                    None => {
                        let id = vacant.next().expect("an endless supply of ids");
                        new_ids.insert(*addr, id);
                        new_backends.push((id, *addr));
                        id
                    }
                },
            };
            wanted.push(id);
        }
        drop(vacant);

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
        let old_entries = old.as_ref().map_or(0, Programmed::entries);
        let grow = programmed.entries().saturating_sub(old_entries);
        if let Err(rejected) = self.check_room(frontend, grow, new_backends.len()) {
            return self.refuse(report, frontend, flags, affinity_timeout_s, rejected);
        }

        let new_entry: HashMap<u32, BackendAddr> = new_backends.iter().copied().collect();
        let backend_of = |id: u32| {
            new_entry
                .get(&id)
                .copied()
                .or_else(|| Some(self.backends.get(id)?.0))
        };
        let ops = frontend_ops(
            &frontend,
            old.as_ref(),
            &programmed,
            &new_backends,
            backend_of,
        );
        self.store.write_all(&ops)?;
        report.writes += ops.len();
        for (id, addr) in new_backends {
            // Found by no address above: indexed without a second lookup.
            self.backends.insert_new(id, addr, frontend.protocol);
        }
        let entries = self.service_entries.of(frontend.address.is_ipv6());
        *entries -= old.as_ref().map_or(0, Programmed::entries);
        *entries += programmed.entries();
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
        let (room, used) = (
            self.capacity.of(frontend.address),
            self.entries().of(frontend.address),
        );
        if used.service_entries + count(frontend_entries(0)) > room.service_entries {
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
        *self.service_entries.of(frontend.address.is_ipv6()) += programmed.entries();
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
        let ipv6 = frontend.address.is_ipv6();
        let (room, used) = (
            self.capacity.of(frontend.address),
            self.entries().of(frontend.address),
        );
        let (services, backends) = if ipv6 {
            (map_names::SERVICES6, map_names::BACKENDS6)
        } else {
            (map_names::SERVICES, map_names::BACKENDS)
        };
        // (map, its flag, its capacity, entries used, entries needed)
        let maps = [
            (
                services,
                "--max-service-entries",
                room.service_entries,
                used.service_entries,
                grow,
            ),
            (
                backends,
                "--max-backends",
                room.backends,
                used.backends,
                new_backends,
            ),
        ];
        for (map, flag, capacity, used, needed) in maps {
            let free = capacity.saturating_sub(used);
            let needed = u32::try_from(needed).unwrap_or(u32::MAX);
            if needed > free {
                return Err(Rejected::MapFull {
                    frontend,
                    map,
                    flag,
                    capacity,
                    free,
                    needed,
                    outcome: Outcome::KeptPrevious,
                });
            }
        }
        Ok(())
    }

    /// Deletes backends that no frontend's slot refers to any more.
    fn collect_backends(&mut self, report: &mut ApplyReport) -> Result<(), StoreError> {
        for id in self.backends.take_unreferenced() {
            let Some((addr, _)) = self.backends.get(id) else {
                continue;
            };
            let address = addr.address;
            self.write(report, Op::DeleteBackend { id, address })?;
            self.backends.remove(id);
        }
        Ok(())
    }

    fn allocate_service_id(&mut self) -> u32 {
        allocate_id(&mut self.next_service_id, |id| {
            self.service_ids.contains(&id)
        })
    }
}

/// What a family's backend map must hold for the backends held and `new` more: the IPv4
/// array spans their ids; the IPv6 hash map holds them.
fn backend_entries(backends: &backends::Backends, ipv6: bool, new: usize) -> usize {
    if ipv6 {
        backends.count(true) + new
    } else {
        backends.id_span(false, new)
    }
}

/// The master entry's flags and affinity timeout for `spec`.
fn flags_of(spec: &FrontendSpec) -> (u16, u32) {
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
    (flags, affinity_timeout_s)
}

/// The first id from `next` on that is not 0 and not `taken` (wrapping); `next` moves past
/// it.
fn allocate_id(next: &mut u32, taken: impl Fn(u32) -> bool) -> u32 {
    loop {
        let id = *next;
        *next = next.checked_add(1).unwrap_or(1);
        if id != 0 && !taken(id) {
            return id;
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

/// A count for each family (service-map entries).
#[derive(Clone, Copy, Debug, Default)]
struct PerFamily {
    v4: usize,
    v6: usize,
}

impl PerFamily {
    fn get(&self, ipv6: bool) -> usize {
        if ipv6 { self.v6 } else { self.v4 }
    }

    fn of(&mut self, ipv6: bool) -> &mut usize {
        if ipv6 { &mut self.v6 } else { &mut self.v4 }
    }
}

/// A count as map sizes are given (`max_entries`), saturating.
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Service entries a frontend of `slots` backends counts for: its master and its slots, and
/// at least [`MIN_FRONTEND_ENTRIES`], so that the service map (half as many entries) holds a
/// master for every frontend the service entries admit.
fn frontend_entries(slots: usize) -> usize {
    (1 + slots).max(MIN_FRONTEND_ENTRIES as usize)
}
