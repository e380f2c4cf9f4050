//! The service and backend maps of both address families, and the slot array: the
//! kernel-side [`Store`] of the writer, and reading them back for adoption (and for `socklb
//! inspect`). The writer speaks of frontends, slots and backends; this module alone encodes
//! them into each family's map layout (network byte order, 4- or 16-byte addresses), and
//! places each frontend's slots in the array (`slots`).
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsFd as _, BorrowedFd},
    sync::atomic::AtomicU32,
    thread::JoinHandle,
};

use aya::{
    Pod,
    maps::{Array, HashMap, IterableMap, Map, MapData, MapError},
};
use socklb_abi::{
    BACKEND_FLAG_REMOTE, Backend, Backend6, Ipv6Words, ServiceEntry, ServiceKey, ServiceKey6,
    ipv6_octets, ipv6_words,
};

use super::{
    batch::{self, BatchError},
    frontend_filter::FrontendFilter,
    ignore_missing,
    slots::{SlotRange, Slots, SlotsFull},
    writer::{
        BackendEntry, MapContents, Master, Op, SlotKey, SlotValue, Store, StoreError, StrayKey,
        WalkPosition,
    },
};
use crate::{
    desired::{BackendAddr, Frontend, Protocol, Scope},
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

/// A put into a map, as held or batched: the writer's op, and for a master entry the slot
/// range it names (known once the frontend's slots are written, which come before).
#[derive(Clone, Debug)]
struct Put {
    op: Op,
    range: Option<SlotRange>,
}

/// A map's puts given back by the thread that wrote them, and how it went ([`put_run`]).
type WrittenRun = (Vec<Put>, Option<Result<(), BatchError>>);

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

/// Which map a put goes to, for batching consecutive puts into one map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Run {
    Services { v6: bool },
    Backends { v6: bool },
}

impl Run {
    fn of(op: &Op) -> Option<Self> {
        match op {
            Op::PutService {
                key,
                value: SlotValue::Master(_),
            } => Some(Self::Services {
                v6: key.frontend.address.is_ipv6(),
            }),
            Op::PutBackend { backend, .. } => Some(Self::Backends {
                v6: backend.address.is_ipv6(),
            }),
            _ => None,
        }
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

/// The entries of a run of master-entry puts; `None` if one does not encode for this
/// family (the one-by-one path reports it).
fn master_entries<A: MapAddress>(puts: &[Put]) -> Option<Vec<(ServiceKey<A>, ServiceEntry)>> {
    puts.iter()
        .map(|put| match &put.op {
            Op::PutService {
                key,
                value: SlotValue::Master(master),
            } => Some((encode_key::<A>(key)?, encode_master(master, put.range))),
            _ => None,
        })
        .collect()
}

fn backend_entries<A: MapAddress>(puts: &[Put]) -> Option<Vec<(u32, Backend<A>)>> {
    puts.iter()
        .map(|put| match &put.op {
            Op::PutBackend {
                id,
                backend,
                protocol,
            } => Some((*id, encode_backend::<A>(backend, *protocol)?)),
            _ => None,
        })
        .collect()
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

/// One batch update for `ops` (all puts into `run`'s map, `map`): `None` if one of them
/// does not encode.
fn put_run(map: BorrowedFd<'_>, run: Run, puts: &[Put]) -> Option<Result<(), BatchError>> {
    match run {
        Run::Services { v6: false } => {
            put_batch::<ServiceKey, ServiceEntry>(map, master_entries(puts))
        }
        Run::Services { v6: true } => {
            put_batch::<ServiceKey6, ServiceEntry>(map, master_entries(puts))
        }
        Run::Backends { v6: false } => put_batch::<u32, Backend>(map, backend_entries(puts)),
        Run::Backends { v6: true } => put_batch::<u32, Backend6>(map, backend_entries(puts)),
    }
}

/// Fewer puts than this are not shared among threads: a thread costs more than they do.
const SHARE_MIN: usize = 4096;

/// `ops` in at most `threads` shares of about equal length (none below [`SHARE_MIN`]
/// unless there are fewer), in order, none empty.
fn shares<T>(mut ops: Vec<T>, threads: usize) -> Vec<Vec<T>> {
    let count = threads.min(ops.len() / SHARE_MIN).max(1);
    let share = ops.len().div_ceil(count);
    let mut shares = Vec::new();
    while ops.len() > share {
        let rest = ops.split_off(share);
        shares.push(std::mem::replace(&mut ops, rest));
    }
    if !ops.is_empty() {
        shares.push(ops);
    }
    shares
}

/// One batch update of `entries` into `map`.
fn put_batch<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    entries: Option<Vec<(K, V)>>,
) -> Option<Result<(), BatchError>> {
    let (keys, values): (Vec<K>, Vec<V>) = entries?.into_iter().unzip();
    Some(batch::update(map, &keys, &values))
}

/// A thread's result; its panic goes on here.
fn joined<T>(thread: JoinHandle<T>) -> T {
    thread
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
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

fn backend_addr(address: IpAddr, port: u16, flags: u8) -> BackendAddr {
    BackendAddr {
        address,
        port: u16::from_be(port),
        remote: flags & BACKEND_FLAG_REMOTE != 0,
    }
}

/// The service-map key of `key`; `None` if its frontend is of the other family.
pub fn encode_key<A: MapAddress>(key: &SlotKey) -> Option<ServiceKey<A>> {
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
pub fn decode_master(entry: &ServiceEntry) -> Master {
    Master {
        count: entry.count,
        flags: entry.flags,
        service_id: entry.service_id,
        affinity_timeout_s: entry.affinity_timeout_s,
    }
}

/// The master entry of `master`, naming `range` (none: a frontend without slots).
fn encode_master(master: &Master, range: Option<SlotRange>) -> ServiceEntry {
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
fn slot_value(frontend: &Frontend, id: u32, backend: Option<&BackendAddr>) -> SlotValue {
    SlotValue::Backend {
        id,
        backend: backend.copied().unwrap_or_else(|| {
            BackendAddr::local(super::writer::unspecified_like(frontend.address), 0)
        }),
    }
}

/// A frontend's slots did not fit the slot array, as a map error of the write.
fn slots_full(full: SlotsFull) -> MapError {
    MapError::SyscallError(aya::sys::SyscallError {
        call: "slot array",
        io_error: std::io::Error::new(std::io::ErrorKind::StorageFull, full),
    })
}

/// The backend-map value of `backend`; `None` for the other family.
fn encode_backend<A: MapAddress>(backend: &BackendAddr, protocol: Protocol) -> Option<Backend<A>> {
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
fn decode_backend<A: MapAddress>(
    (id, backend): &(u32, Backend<A>),
) -> (u32, BackendAddr, Option<Protocol>) {
    let addr = backend_addr(backend.address.ip(), backend.port, backend.flags);
    (*id, addr, Protocol::from_number(backend.protocol))
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
    fn held_puts_are_shared_among_threads_in_order_and_small_runs_stay_whole() {
        let deletes = |range: std::ops::Range<u32>| -> Vec<Op> {
            range
                .map(|id| Op::DeleteBackend {
                    id,
                    address: IpAddr::V4(Ipv4Addr::LOCALHOST),
                })
                .collect()
        };
        let ids = |shares: &[Vec<Op>]| -> Vec<Vec<u32>> {
            let id = |op: &Op| match op {
                Op::DeleteBackend { id, .. } => *id,
                _ => unreachable!("only deletes were shared"),
            };
            shares
                .iter()
                .map(|share| share.iter().map(id).collect())
                .collect()
        };
        let rows: [(u32, usize, &[usize]); 5] = [
            (20_000, 2, &[10_000, 10_000]),
            (20_001, 2, &[10_001, 10_000]),
            (20_000, 3, &[6_667, 6_667, 6_666]),
            (SHARE_MIN as u32 * 2 - 1, 2, &[SHARE_MIN * 2 - 1]),
            (100, 8, &[100]),
        ];
        for (len, threads, lengths) in rows {
            let shares = shares(deletes(0..len), threads);
            let got: Vec<usize> = shares.iter().map(Vec::len).collect();
            assert_eq!(got, lengths, "{len} puts, {threads} threads");
            let flat: Vec<u32> = ids(&shares).concat();
            assert_eq!(flat, (0..len).collect::<Vec<_>>(), "in order");
        }
        assert!(shares(Vec::<Op>::new(), 2).is_empty());
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
