//! The service and backend maps of both address families, and the slot array: the
//! kernel-side [`Store`] of the writer, and reading them back for adoption (and for `socklb
//! inspect`). The writer speaks of frontends, slots and backends; this module alone encodes
//! them into each family's map layout (network byte order, 4- or 16-byte addresses), and
//! places each frontend's slots in the array (`slots`).
//!
//! [`encoding`] holds the layouts; [`puts`] prepares batch updates and shares them among
//! threads.
mod encoding;
mod puts;

use std::{net::IpAddr, os::fd::AsFd as _, sync::atomic::AtomicU32, thread::JoinHandle};

use aya::maps::{Array, HashMap, IterableMap, Map, MapData, MapError};
use socklb_abi::{Backend, Backend6, ServiceEntry, ServiceKey, ServiceKey6};

pub use self::encoding::decode_key;
use self::{
    encoding::{
        MapAddress, decode_backend, decode_master, encode_backend, encode_key, encode_master,
        family_mismatch, slot_value, slots_full,
    },
    puts::{Put, Run, WrittenRun, joined, put_run, shares},
};
use super::{
    batch::{self, BatchError},
    frontend_filter::FrontendFilter,
    ignore_missing,
    slots::{SlotRange, Slots},
    writer::{
        BackendEntry, MapContents, Op, SlotKey, SlotValue, Store, StoreError, StrayKey,
        WalkPosition,
    },
};
use crate::{
    desired::{BackendAddr, Frontend},
    kernel::mapped_words::MappedWords,
};

/// The service and backend maps of both families and the slot array, typed. The dataplane's
/// growth reads the fields, to copy the entries into larger maps.
pub struct KernelMaps {
    pub(crate) services: HashMap<MapData, ServiceKey, ServiceEntry>,
    pub(crate) slots: Slots,
    /// Indexed by id; all zeros where no backend holds the id.
    pub(crate) backends: Array<MapData, Backend>,
    pub(crate) services6: HashMap<MapData, ServiceKey6, ServiceEntry>,
    pub(crate) backends6: HashMap<MapData, u32, Backend6>,
    /// Marked before each master entry is written (see `frontend_filter`).
    pub(crate) frontend_filter: FrontendFilter,
    /// Whether the kernel takes batch updates (false after it refused one).
    batches: bool,
    /// Puts held back while no program reads the maps ([`Self::hold_writes`]).
    held: Option<Held>,
}

/// Puts not written yet, in order, per map, and the chunk being written.
#[derive(Default)]
struct Held {
    runs: Vec<(Run, Vec<Put>)>,
    len: usize,
    writing: Vec<JoinHandle<WrittenRun>>,
}

/// Held puts written at once: a batch per map large enough to cost little in calls and
/// small enough to cost little in memory (a first sync of 100,000 Services holds two
/// million).
const HELD_CHUNK: usize = 1 << 15;

/// The four maps, as taken from the loaded object, and the slot array and the frontend
/// filter, mapped.
pub struct RawMaps {
    pub services: Map,
    pub slots: MappedWords<AtomicU32>,
    pub backends: Map,
    pub services6: Map,
    pub backends6: Map,
    pub frontend_filter: FrontendFilter,
}

impl KernelMaps {
    pub fn new(maps: RawMaps) -> Result<Self, MapError> {
        Ok(Self {
            services: maps.services.try_into()?,
            slots: Slots::new(maps.slots),
            backends: maps.backends.try_into()?,
            services6: maps.services6.try_into()?,
            backends6: maps.backends6.try_into()?,
            frontend_filter: maps.frontend_filter,
            batches: true,
            held: None,
        })
    }

    /// From now on until [`Self::write_held`], puts are held back and written a chunk at a
    /// time on threads of their own, in no order: only while no program reads these maps
    /// (a fresh node's first sync), as a slot may then be written before the backend it
    /// names. The kernel's hash-map inserts were about half of the 4-5 s of a first sync of
    /// 100,000 Services, on one core.
    pub fn hold_writes(&mut self) {
        if self.batches {
            self.held = Some(Held::default());
        }
    }

    /// Writes what is held and stops holding.
    pub fn write_held(&mut self) -> Result<(), StoreError> {
        let result = self.flush_held();
        self.held = None;
        result
    }

    /// Every held put written, before a write that must follow them.
    fn flush_held(&mut self) -> Result<(), StoreError> {
        let started = self.write_chunk();
        let finished = self.finish_chunk();
        started.and(finished)
    }

    /// Starts writing the held puts in the background, once the chunk before is written:
    /// the writer goes on with the next chunk meanwhile. A map's puts are shared among a
    /// thread per CPU: the kernel's hash-map inserts, a microsecond each, are most of a
    /// first sync, and take a bucket lock each, not one for the map.
    fn write_chunk(&mut self) -> Result<(), StoreError> {
        self.finish_chunk()?;
        let Some(mut held) = self.held.take() else {
            return Ok(());
        };
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        for (run, ops) in std::mem::take(&mut held.runs) {
            for ops in shares(ops, threads) {
                let fd = match self.map_of(run).fd().as_fd().try_clone_to_owned() {
                    Ok(fd) => fd,
                    Err(source) => {
                        self.held = Some(held);
                        return Err(StoreError {
                            op: ops[0].op.clone(),
                            source,
                        });
                    }
                };
                held.writing.push(std::thread::spawn(move || {
                    let result = put_run(fd.as_fd(), run, &ops);
                    (ops, result)
                }));
            }
        }
        held.len = 0;
        self.held = Some(held);
        Ok(())
    }

    /// Waits for the chunk being written, and reports how it went.
    fn finish_chunk(&mut self) -> Result<(), StoreError> {
        let writing = self
            .held
            .as_mut()
            .map(|held| std::mem::take(&mut held.writing))
            .unwrap_or_default();
        let mut result = Ok(());
        // Every thread joined, also after an error.
        for thread in writing {
            let (ops, written) = joined(thread);
            if result.is_ok() {
                result = self.finish_run(&ops, written);
            }
        }
        result
    }

    fn map_of(&self, run: Run) -> &MapData {
        match run {
            Run::Services { v6: false } => IterableMap::map(&self.services),
            Run::Services { v6: true } => IterableMap::map(&self.services6),
            Run::Backends { v6: false } => IterableMap::map(&self.backends),
            Run::Backends { v6: true } => IterableMap::map(&self.backends6),
        }
    }

    /// Holds `op` if it is a put and puts are held; whether it was.
    fn hold(&mut self, op: &Op) -> Result<bool, StoreError> {
        let (true, Some(run)) = (self.held.is_some(), Run::of(op)) else {
            return Ok(false);
        };
        let put = self.put(op);
        let Some(held) = self.held.as_mut() else {
            return Ok(false);
        };
        match held.runs.iter_mut().find(|(r, _)| *r == run) {
            Some((_, puts)) => puts.push(put),
            None => held.runs.push((run, vec![put])),
        }
        held.len += 1;
        if held.len >= HELD_CHUNK {
            self.write_chunk()?;
        }
        Ok(true)
    }

    /// Reads the maps of both families, and takes the slot ranges their master entries
    /// name. Entries that vanish during the walk are skipped.
    pub fn read(&mut self) -> Result<MapContents, MapError> {
        let mut contents = MapContents::default();
        let mut ranges = Vec::new();
        for map in 0..MAPS {
            let mut from = None;
            while let Some(next) = self.read_chunk(map, from, &mut contents, &mut ranges)? {
                from = Some(next);
            }
        }
        self.slots.adopt(ranges);
        let backends: hashbrown::HashMap<u32, BackendAddr> = contents
            .backends
            .iter()
            .map(|(id, addr, _)| (*id, *addr))
            .collect();
        let mut slots = Vec::new();
        for (key, value) in &contents.services {
            let SlotValue::Master(master) = value else {
                continue;
            };
            for slot in 1..=master.count {
                let Some(id) = self.slots.get(&key.frontend, slot) else {
                    break;
                };
                slots.push((
                    SlotKey {
                        frontend: key.frontend,
                        slot,
                    },
                    slot_value(&key.frontend, id, backends.get(&id)),
                ));
            }
        }
        contents.services.extend(slots);
        Ok(contents)
    }

    /// One chunk of the `map`th map (v4 services, v6 services, v4 backends, v6 backends)
    /// from the position `from` on (`None`: its start), decoded into `contents`. Returns
    /// where that map's next chunk begins, `None` at its end.
    fn read_chunk(
        &self,
        map: usize,
        from: Option<u32>,
        contents: &mut MapContents,
        ranges: &mut Vec<(Frontend, SlotRange)>,
    ) -> Result<Option<u32>, MapError> {
        match map {
            0 => {
                let (entries, next) = batch::chunk(&self.services, from)?;
                decode_services(entries, StrayKey::V4, contents, ranges);
                Ok(next)
            }
            1 => {
                let (entries, next) = batch::chunk(&self.services6, from)?;
                decode_services(entries, StrayKey::V6, contents, ranges);
                Ok(next)
            }
            2 => {
                let (entries, next) = batch::array_chunk(&self.backends, from)?;
                let held = entries.iter().filter(|(_, backend)| *backend != NO_BACKEND);
                contents.backends.extend(held.map(decode_backend));
                Ok(next)
            }
            _ => {
                let (entries, next) = batch::chunk(&self.backends6, from)?;
                contents.backends.extend(entries.iter().map(decode_backend));
                Ok(next)
            }
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), MapError> {
        match op {
            Op::PutBackend {
                id,
                backend,
                protocol,
            } => match backend.address {
                IpAddr::V4(_) => {
                    let entry = encode_backend(backend, *protocol).ok_or_else(family_mismatch)?;
                    self.backends.set(*id, &entry, 0)
                }
                IpAddr::V6(_) => {
                    let entry = encode_backend(backend, *protocol).ok_or_else(family_mismatch)?;
                    self.backends6.insert(id, &entry, 0)
                }
            },
            Op::PutService {
                key,
                value: SlotValue::Backend { id, .. },
            } => self
                .slots
                .put(&key.frontend, key.slot, *id)
                .map_err(slots_full),
            Op::PutService {
                key,
                value: SlotValue::Master(master),
            } => {
                let range = self.slots.range(&key.frontend);
                let entry = encode_master(master, range);
                match key.frontend.address {
                    IpAddr::V4(_) => {
                        let key = encode_key(key).ok_or_else(family_mismatch)?;
                        self.services.insert(&key, &entry, 0)?;
                    }
                    IpAddr::V6(_) => {
                        let key = encode_key(key).ok_or_else(family_mismatch)?;
                        self.services6.insert(&key, &entry, 0)?;
                    }
                }
                self.slots.named(&key.frontend);
                Ok(())
            }
            Op::DeleteService { key } if key.slot != 0 => {
                self.slots.clear(&key.frontend, key.slot);
                Ok(())
            }
            Op::DeleteService { key } => {
                ignore_missing(match key.frontend.address {
                    IpAddr::V4(_) => self
                        .services
                        .remove(&encode_key(key).ok_or_else(family_mismatch)?),
                    IpAddr::V6(_) => self
                        .services6
                        .remove(&encode_key(key).ok_or_else(family_mismatch)?),
                })?;
                self.slots.remove(&key.frontend);
                Ok(())
            }
            Op::DeleteStray { key } => ignore_missing(match key {
                StrayKey::V4(key) => self.services.remove(key),
                StrayKey::V6(key) => self.services6.remove(key),
            }),
            Op::DeleteBackend { id, address } => ignore_missing(match address {
                IpAddr::V4(_) => self.backends.set(*id, &NO_BACKEND, 0),
                IpAddr::V6(_) => self.backends6.remove(id),
            }),
        }
    }
}

impl Store for KernelMaps {
    fn write(&mut self, op: &Op) -> Result<(), StoreError> {
        self.mark_frontend(op);
        // Slots are stores into the array, in order, never held: nothing to wait for.
        if self.held.is_some() && !is_slot(op) {
            if self.hold(op)? {
                return Ok(());
            }
            // A delete goes after the puts before it.
            self.flush_held()?;
        }
        self.apply(op).map_err(|error| StoreError {
            op: op.clone(),
            source: io_error(error),
        })
    }

    /// Runs of puts into one map (a frontend's backends, then its master) go in one batch
    /// call each, in order; the slots in between are stores into the array, in a range made
    /// room for first.
    fn write_all(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        self.reserve_slots(ops)?;
        if self.held.is_some() {
            return ops.iter().try_for_each(|op| self.write(op));
        }
        ops.iter().for_each(|op| self.mark_frontend(op));
        let mut rest = ops;
        while let Some(first) = rest.first() {
            let run = Run::of(first);
            let len = rest
                .iter()
                .take_while(|op| run.is_some() && Run::of(op) == run)
                .count()
                .max(1);
            let (these, next) = rest.split_at(len);
            match run {
                Some(run) if these.len() > 1 && self.batches => self.write_run(run, these)?,
                _ => these.iter().try_for_each(|op| self.write(op))?,
            }
            rest = next;
        }
        Ok(())
    }

    fn apply_started(&mut self) {
        self.slots.free_retired();
    }

    /// A slot's id, with the backend that holds it now; a master entry only if it names the
    /// range its slots are written to (else it reads as missing, and is written again).
    fn read_slot(&self, key: &SlotKey) -> std::io::Result<Option<SlotValue>> {
        if key.slot != 0 {
            let Some(id) = self.slots.get(&key.frontend, key.slot) else {
                return Ok(None);
            };
            let backend = self
                .read_backend(id, key.frontend.address)?
                .map(|(backend, _)| backend);
            return Ok(Some(slot_value(&key.frontend, id, backend.as_ref())));
        }
        let found = match key.frontend.address {
            IpAddr::V4(_) => encode_key(key).map(|k| self.services.get(&k, 0)),
            IpAddr::V6(_) => encode_key(key).map(|k| self.services6.get(&k, 0)),
        };
        let Some(entry) = found.map_or(Ok(None), found_or_none)? else {
            return Ok(None);
        };
        let range = self.slots.range(&key.frontend);
        if encode_master(&decode_master(&entry), range) != entry {
            return Ok(None);
        }
        Ok(Some(SlotValue::Master(decode_master(&entry))))
    }

    fn walk(
        &self,
        from: WalkPosition,
        budget: usize,
    ) -> std::io::Result<(MapContents, Option<WalkPosition>)> {
        let mut contents = MapContents::default();
        let mut at = from;
        while contents.len() < budget && at.map < MAPS {
            let next = self
                .read_chunk(at.map, at.within, &mut contents, &mut Vec::new())
                .map_err(io_error)?;
            at = match next {
                Some(within) => WalkPosition {
                    map: at.map,
                    within: Some(within),
                },
                None => WalkPosition {
                    map: at.map + 1,
                    within: None,
                },
            };
        }
        Ok((contents, (at.map < MAPS).then_some(at)))
    }

    fn read_backend(&self, id: u32, address: IpAddr) -> std::io::Result<Option<BackendEntry>> {
        let found = match address {
            IpAddr::V4(_) => match self.backends.get(&id, 0) {
                Ok(NO_BACKEND) | Err(MapError::OutOfBounds { .. }) => Err(MapError::KeyNotFound),
                found => found.map(|b| decode_backend(&(id, b))),
            },
            IpAddr::V6(_) => self.backends6.get(&id, 0).map(|b| decode_backend(&(id, b))),
        };
        found_or_none(found.map(|(_, addr, protocol)| (addr, protocol)))
    }
}

impl KernelMaps {
    /// Makes room in the slot array for the counts the master entries among `ops` give.
    fn reserve_slots(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        for op in ops {
            if let Op::PutService {
                key,
                value: SlotValue::Master(master),
            } = op
            {
                self.slots
                    .reserve(&key.frontend, master.count)
                    .map_err(|full| StoreError {
                        op: op.clone(),
                        source: io_error(slots_full(full)),
                    })?;
            }
        }
        Ok(())
    }

    /// A master entry's frontend, marked in the frontend filter before the entry is
    /// written (a held write included: the programs may read the filter already).
    fn mark_frontend(&self, op: &Op) {
        if let Op::PutService {
            key,
            value: SlotValue::Master(_),
        } = op
        {
            self.frontend_filter.mark(&key.frontend);
        }
    }

    /// One batch update for `ops` (all puts into `run`'s map); one update each where the
    /// kernel has no batches.
    fn write_run(&mut self, run: Run, ops: &[Op]) -> Result<(), StoreError> {
        let puts: Vec<Put> = ops.iter().map(|op| self.put(op)).collect();
        let result = put_run(self.map_of(run).fd().as_fd(), run, &puts);
        self.finish_run(&puts, result)
    }

    /// `op` as a [`Put`]: a master entry with the range its frontend's slots are in now.
    fn put(&self, op: &Op) -> Put {
        let range = match op {
            Op::PutService {
                key,
                value: SlotValue::Master(_),
            } => self.slots.range(&key.frontend),
            _ => None,
        };
        Put {
            op: op.clone(),
            range,
        }
    }

    /// After [`put_run`]: its error, or `puts` one by one where batches did not work. The
    /// master entries written now name their ranges.
    fn finish_run(
        &mut self,
        puts: &[Put],
        result: Option<Result<(), BatchError>>,
    ) -> Result<(), StoreError> {
        match result {
            Some(Ok(())) => {
                for put in puts {
                    if let Op::PutService { key, .. } = &put.op {
                        self.slots.named(&key.frontend);
                    }
                }
                Ok(())
            }
            Some(Err(error)) if !error.unsupported() => Err(StoreError {
                op: puts[error.done.min(puts.len() - 1)].op.clone(),
                source: error.error,
            }),
            unsupported_or_unencodable => {
                if unsupported_or_unencodable.is_some() {
                    self.batches = false;
                }
                puts.iter().try_for_each(|put| {
                    self.apply(&put.op).map_err(|error| StoreError {
                        op: put.op.clone(),
                        source: io_error(error),
                    })
                })
            }
        }
    }
}

/// Whether `op` writes into the slot array (not the service map).
fn is_slot(op: &Op) -> bool {
    matches!(
        op,
        Op::PutService { key, .. } | Op::DeleteService { key } if key.slot != 0
    )
}

/// What the IPv4 backend array holds at an id no backend has.
const NO_BACKEND: Backend = Backend {
    address: 0,
    port: 0,
    protocol: 0,
    flags: 0,
};

/// The service and backend maps of both families, as [`KernelMaps::read_chunk`] numbers
/// them.
const MAPS: usize = 4;

/// Master entries read back, into `contents`, and the slot ranges they name, into
/// `ranges`: keys that name no frontend this agent knows, or a slot (an older layout's), as
/// strays (`stray` says of which family).
fn decode_services<A: MapAddress>(
    entries: Vec<(ServiceKey<A>, ServiceEntry)>,
    stray: fn(ServiceKey<A>) -> StrayKey,
    contents: &mut MapContents,
    ranges: &mut Vec<(Frontend, SlotRange)>,
) {
    for (key, entry) in entries {
        match decode_key(&key).filter(|decoded| decoded.slot == 0) {
            Some(decoded) => {
                contents
                    .services
                    .push((decoded, SlotValue::Master(decode_master(&entry))));
                ranges.push((
                    decoded.frontend,
                    SlotRange {
                        first: entry.first_slot,
                        room: entry.slot_room,
                    },
                ));
            }
            None => contents.strays.push(stray(key)),
        }
    }
}

/// A lookup's value, `None` when the map has no such key.
fn found_or_none<T>(result: Result<T, MapError>) -> std::io::Result<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(error) => Err(io_error(error)),
    }
}

fn io_error(error: MapError) -> std::io::Error {
    match error {
        MapError::SyscallError(syscall) => syscall.io_error,
        other => std::io::Error::other(other.to_string()),
    }
}
