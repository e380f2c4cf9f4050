//! Loading the embedded object with its maps pinned, and finding its programs and maps by
//! name and type once loaded.
//!
//! Pinned maps are adopted when their layout and capacity match (a growable map's capacity
//! need only be within its flag) and replaced (with a warning) when not; [`load_grown`]
//! loads the programs again over larger maps (see the dataplane's `growth`). Every program
//! is loaded into the kernel (verifier included) here; attaching them is `attach`'s.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfError, EbpfLoader, GlobalData,
    maps::{HashMap, Map, MapData, MapError},
    programs::{CgroupSock, Program, ProgramError},
};
use socklb_abi::{ServiceEntry, ServiceKey, globals, map_names, program_names};
use tracing::{debug, info, warn};

use super::{
    carry, destroy, flow_filter, links::PinnedLinkError, pins, program_logs::ProgramLogLevel,
};
use crate::desired::sizing::{self, Capacities, Sizes};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object failed")]
    Load(#[source] EbpfError),
    #[error("the embedded eBPF object has no program {0}: the build is broken")]
    MissingProgram(&'static str),
    #[error("the embedded eBPF object has no map {0}: the build is broken")]
    MissingMap(&'static str),
    #[error("the kernel rejected program {name}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("cannot replace the incompatible pinned map {path}")]
    ReplaceMap {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open cgroup {path}")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    PinnedLink(#[from] PinnedLinkError),
    #[error("cannot swap the program of the pinned link {path}")]
    UpdateLink {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The loaded object, and what a replaced service map held.
pub struct Loaded {
    pub ebpf: Ebpf,
    /// Master keys of the frontends a replaced service map held (pinned and incompatible,
    /// or pinned under an older layout's name): they were serving, so they get the room
    /// first in the new one.
    pub replaced_masters: Vec<ServiceKey>,
    /// The sizes the growable maps were loaded with.
    pub sizes: Sizes,
    /// False when [`ProgramLoad::WhenSized`] left them for [`load_programs`].
    pub programs_loaded: bool,
}

/// When [`load`] has the kernel verify the programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProgramLoad {
    /// At load.
    #[default]
    Now,
    /// At once over pinned maps, but on a pin directory without socklb's maps (a fresh
    /// node) only once the caller knows how large the maps must be ([`load_programs`]):
    /// maps grown by the first apply would have the kernel verify every program again.
    WhenSized,
}

/// Loads `object` (the embedded one, its kfunc call patched), adopting compatible pinned
/// maps, and loads every program into the kernel (verifier included) but the socket
/// iterators, which are optional (`destroy`), unless `when` defers them; nothing is attached
/// yet. When loading fails, the maps this call pinned are unpinned again: a failed start
/// leaves what it found, nothing more.
pub fn load(
    pin_dir: &Path,
    capacities: &Capacities,
    programs: ProgramSettings,
    object: &[u8],
    when: ProgramLoad,
) -> Result<Loaded, LoadError> {
    let unpinned: Vec<PathBuf> = map_names::ALL
        .iter()
        .map(|name| pins::map_pin(pin_dir, name))
        .filter(|path| !path.exists())
        .collect();
    let no_older_maps = map_names::RETIRED
        .iter()
        .all(|name| !pins::map_pin(pin_dir, name).exists());
    remove_staging(pin_dir);
    let renamed = carry::hold_renamed(pin_dir).map_err(|source| LoadError::ReplaceMap {
        path: pins::holding_dir(pin_dir),
        source,
    })?;
    let fresh = unpinned.len() == map_names::ALL.len() && no_older_maps && renamed.is_empty();
    let defer = fresh && when == ProgramLoad::WhenSized;
    if !renamed.is_empty() {
        info!(
            maps = %crate::listed(&renamed),
            "maps an older agent pinned under older names: their entries are carried over \
             into the maps of the new names"
        );
    }
    load_pinning(pin_dir, capacities, programs, object, !defer).inspect_err(|_| {
        carry::restore(pin_dir);
        for path in unpinned.iter().filter(|path| path.exists()) {
            if let Err(error) = fs::remove_file(path) {
                warn!(path = %path.display(), %error, "cannot unpin a map of the failed load");
            }
        }
    })
}

fn load_pinning(
    pin_dir: &Path,
    capacities: &Capacities,
    programs: ProgramSettings,
    object: &[u8],
    load_now: bool,
) -> Result<Loaded, LoadError> {
    // An older agent's service map, under its old name: the frontends it holds were serving.
    let mut replaced_masters: Vec<ServiceKey> = map_names::RETIRED_SERVICES
        .iter()
        .flat_map(|name| pinned_masters(&pins::map_pin(pin_dir, name)))
        .collect();
    let sizes = starting_sizes(pin_dir, capacities);
    let globals = Globals::new(capacities, programs);
    if globals.skc_cookie_offset == 0 {
        warn!(
            "struct sock_common has no skc_cookie in the kernel's BTF: the socket iterators \
             ask the cookie helper, which hands a cookie to every socket they visit"
        );
    }
    // Each round replaces at most one incompatible map; there are only so many maps.
    for _ in 0..=map_names::ALL.len() {
        let mut loader = EbpfLoader::new();
        configure(&mut loader, pin_dir, capacities, &sizes, &globals);
        match loader.load(object) {
            Ok(mut ebpf) => {
                if load_now {
                    load_programs(&mut ebpf)?;
                }
                // Only now: a failed load leaves the older agent's maps pinned as it found
                // them (and their frontends to be read again by the next attempt).
                remove_retired(pin_dir);
                return Ok(Loaded {
                    ebpf,
                    replaced_masters,
                    sizes,
                    programs_loaded: load_now,
                });
            }
            Err(EbpfError::MapError(MapError::IncompatiblePinnedMap {
                name,
                property,
                expected,
                actual,
            })) => {
                let path = pins::map_pin(pin_dir, &name);
                if property == "max_entries" && carry::CARRIED.contains(&name.as_str()) {
                    warn!(
                        map = %name, property, expected, actual,
                        "pinned map has another size than its flag asks: replacing it, with \
                         its entries carried over into the new map"
                    );
                    carry::hold(pin_dir, &name)
                        .map_err(|source| LoadError::ReplaceMap { path, source })?;
                    continue;
                }
                warn!(
                    map = %name, property, expected, actual,
                    "pinned map differs from what this agent needs: replacing it (the running \
                     programs keep the old map until they are replaced; service and backend \
                     entries are rewritten, reverse entries start empty)"
                );
                if name == map_names::SERVICES {
                    replaced_masters.extend(pinned_masters(&path));
                }
                fs::remove_file(&path).map_err(|source| LoadError::ReplaceMap { path, source })?;
            }
            Err(error) => return Err(LoadError::Load(error)),
        }
    }
    Err(LoadError::Load(EbpfError::NoBTF))
}

/// Loads the object again over the pinned maps, except the `grown` maps, which are created
/// anew with their size in `sizes` and pinned under [`pins::staging_dir`] (the caller copies their
/// entries, swaps the programs in and moves the pins). Every other map must be the pinned
/// one: nothing is replaced here. The programs are verified only with `verify` (not before
/// the agent's first sync on a fresh node: it has them verified over the final maps).
pub fn load_grown(
    pin_dir: &Path,
    capacities: &Capacities,
    programs: ProgramSettings,
    object: &[u8],
    sizes: &Sizes,
    grown: &[&'static str],
    verify: bool,
) -> Result<Ebpf, LoadError> {
    let staging = pins::staging_dir(pin_dir);
    remove_staging(pin_dir);
    fs::create_dir_all(&staging).map_err(|source| LoadError::Dir {
        path: staging.clone(),
        source,
    })?;
    let globals = Globals::new(capacities, programs);
    let mut loader = EbpfLoader::new();
    configure(&mut loader, pin_dir, capacities, sizes, &globals);
    for name in grown {
        loader.map_pin_path(name, pins::staged_map_pin(pin_dir, name));
    }
    let result = loader
        .load(object)
        .map_err(LoadError::Load)
        .and_then(|mut ebpf| {
            if verify {
                load_programs(&mut ebpf)?;
            }
            Ok(ebpf)
        });
    if result.is_err() {
        remove_staging(pin_dir);
    }
    result
}

/// Unpins the maps a start pinned before any program of its ran: the kernel refused the
/// programs, or the agent stopped before its first sync on a node it found bare. Nothing
/// else reads them.
pub fn unpin_maps(pin_dir: &Path) {
    for name in map_names::ALL {
        let _ = fs::remove_file(pins::map_pin(pin_dir, name));
    }
    remove_staging(pin_dir);
}

/// Removes what an interrupted growth left under [`pins::staging_dir`] (only socklb's maps).
pub fn remove_staging(pin_dir: &Path) {
    let staging = pins::staging_dir(pin_dir);
    for name in map_names::ALL {
        let _ = fs::remove_file(pins::staged_map_pin(pin_dir, name));
    }
    let _ = fs::remove_dir(&staging);
}

/// How the programs behave, set at load time through their globals.
#[derive(Clone, Copy, Debug)]
pub struct ProgramSettings {
    pub log_level: ProgramLogLevel,
    /// connect() records TCP sockets for the destroy iterators (only when the agent closes
    /// TCP connections: the record costs an allocation per socket).
    pub record_tcp: bool,
    /// The network namespace whose sockets the socket hooks translate (with those of the
    /// namespaces map if `socket_lb_listed`); `None`: all.
    pub socket_lb_netns: Option<u64>,
    pub socket_lb_listed: bool,
    /// The external devices' programs translate packets to ClusterIPs too.
    pub cluster_ips_from_outside: bool,
}

/// The programs' read-only globals, set at load time.
struct Globals {
    socket_slot_mask: u32,
    /// aya-log's level: 0 (off) lets the verifier remove every log call.
    log_level: u8,
    /// Where the socket iterators find a socket's cookie (0: they ask the helper).
    skc_cookie_offset: u32,
    /// Where the socket iterators find an IPv6 socket's peer (0: they skip IPv6 sockets).
    skc_v6_daddr_offset: u32,
    record_tcp: u32,
    max_socket_records: u32,
    /// 0: every namespace.
    socket_lb_netns: u64,
    socket_lb_listed: u32,
    cluster_ips_from_outside: u32,
}

impl Globals {
    fn new(capacities: &Capacities, programs: ProgramSettings) -> Self {
        Self {
            socket_slot_mask: capacities.socket_slots() - 1,
            log_level: programs.log_level.global(),
            skc_cookie_offset: destroy::skc_cookie_offset(),
            skc_v6_daddr_offset: destroy::skc_v6_daddr_offset(),
            record_tcp: u32::from(programs.record_tcp),
            max_socket_records: capacities.socket_records,
            socket_lb_netns: programs.socket_lb_netns.unwrap_or(0),
            socket_lb_listed: u32::from(programs.socket_lb_listed),
            cluster_ips_from_outside: u32::from(programs.cluster_ips_from_outside),
        }
    }

    /// Each value under its name in the object.
    fn by_name(&self) -> [(&'static str, GlobalData<'_>); 9] {
        [
            (globals::SOCKET_SLOT_MASK, (&self.socket_slot_mask).into()),
            (aya_log::LEVEL, (&self.log_level).into()),
            (globals::SKC_COOKIE_OFFSET, (&self.skc_cookie_offset).into()),
            (
                globals::SKC_V6_DADDR_OFFSET,
                (&self.skc_v6_daddr_offset).into(),
            ),
            (globals::RECORD_TCP, (&self.record_tcp).into()),
            (globals::SOCKET_LB_NETNS, (&self.socket_lb_netns).into()),
            (globals::SOCKET_LB_LISTED, (&self.socket_lb_listed).into()),
            (
                globals::CLUSTER_IPS_FROM_OUTSIDE,
                (&self.cluster_ips_from_outside).into(),
            ),
            (
                globals::MAX_SOCKET_RECORDS,
                (&self.max_socket_records).into(),
            ),
        ]
    }
}

/// aya-log's ring buffer in the object.
const PROGRAM_LOGS_MAP: &str = "AYA_LOGS";

/// Map sizes and globals, the same for every load. The program log buffer is pinned too,
/// so that programs loaded again over grown maps write where the agent reads.
fn configure<'a>(
    loader: &mut EbpfLoader<'a>,
    pin_dir: &'a Path,
    capacities: &Capacities,
    sizes: &Sizes,
    values: &'a Globals,
) {
    loader
        .default_map_pin_directory(pin_dir)
        .map_pin_path(
            PROGRAM_LOGS_MAP,
            pins::map_pin(pin_dir, map_names::PROGRAM_LOGS),
        )
        .map_max_entries(map_names::SOCKETS, capacities.socket_slots())
        // Each family's maps have their own size: the writer counts each family's entries
        // against its own maps.
        .map_max_entries(map_names::SERVICES, Sizes::service_map(sizes.services))
        .map_max_entries(map_names::SLOTS, sizes.slot_pairs())
        .map_max_entries(map_names::BACKENDS, sizes.backends)
        .map_max_entries(map_names::SERVICES6, Sizes::service_map(sizes.services6))
        .map_max_entries(map_names::BACKENDS6, sizes.backends6)
        // One name per frontend (not preallocated: only names cost memory).
        .map_max_entries(map_names::NAMES, sizes.names)
        .map_max_entries(map_names::REVERSE, capacities.reverse)
        // The socket maps of both families share one slot mask.
        .map_max_entries(map_names::SOCKETS6, capacities.socket_slots())
        .map_max_entries(map_names::REVERSE6, ipv6_share(capacities.reverse))
        .map_max_entries(map_names::AFFINITY, capacities.affinity)
        .map_max_entries(map_names::CONNTRACK, capacities.conntrack)
        .map_max_entries(map_names::CONNTRACK_NEW, capacities.conntrack_new)
        .map_max_entries(map_names::SOURCE_RANGES, capacities.source_ranges)
        .map_max_entries(map_names::MAGLEV, sizes.maglev)
        .map_max_entries(map_names::AFFINITY6, ipv6_share(capacities.affinity))
        .map_max_entries(map_names::CONNTRACK6, ipv6_share(capacities.conntrack))
        .map_max_entries(
            map_names::CONNTRACK_NEW6,
            ipv6_share(capacities.conntrack_new),
        )
        .map_max_entries(map_names::SOURCE_RANGES6, capacities.source_ranges);
    for (name, value) in values.by_name() {
        loader.override_global(name, value, true);
    }
}

/// The capacity of an IPv6 table the programs write (conntrack, unconfirmed conntrack,
/// affinity of clients outside the node, unconnected UDP sockets' reverse entries) whose
/// IPv4 twin has `ipv4`: half of it, as preallocated LRUs with larger entries
/// (docs/operations.md, "Map memory and capacities").
fn ipv6_share(ipv4: u32) -> u32 {
    (ipv4 / 2).max(1)
}

/// A growable map keeps the size an earlier agent grew it to, within its flag; a new one
/// (or one above a lowered flag, which is then replaced) starts at [`sizing::INITIAL`].
fn starting_sizes(pin_dir: &Path, capacities: &Capacities) -> Sizes {
    // `entries`: what a map of that size holds (a service map's size is in master entries).
    let sized = |name: &str, initial: u32, bound: u32, entries: &dyn Fn(u32) -> u32| {
        MapData::from_pin(pins::map_pin(pin_dir, name))
            .ok()
            .and_then(|map| map.info().ok())
            .map(|info| entries(info.max_entries()))
            .filter(|pinned| (1..=bound).contains(pinned))
            .unwrap_or(initial.min(bound))
    };
    let size = |name: &str, initial: u32, bound: u32| sized(name, initial, bound, &|size| size);
    let service_entries = |name: &str, initial: u32| {
        let bound = capacities.service_entries;
        sized(name, initial, bound, &|masters| {
            Sizes::service_entries_of_map(masters, bound)
        })
    };
    Sizes {
        services: service_entries(map_names::SERVICES, sizing::INITIAL.services),
        backends: size(
            map_names::BACKENDS,
            sizing::INITIAL.backends,
            capacities.backends,
        ),
        services6: service_entries(map_names::SERVICES6, sizing::INITIAL.services6),
        backends6: size(
            map_names::BACKENDS6,
            sizing::INITIAL.backends6,
            capacities.backends,
        ),
        names: size(
            map_names::NAMES,
            sizing::INITIAL.names,
            capacities.service_entries,
        ),
        maglev: size(
            map_names::MAGLEV,
            sizing::INITIAL.maglev,
            capacities.maglev_entries,
        ),
    }
}

/// Unpins the maps of older layouts ([`map_names::RETIRED`]) and of layouts this agent does
/// not know ([`pins::other_layout_maps`]); programs still using one keep it until they are
/// replaced (a retired flow filter, distrusted first, is then correct).
fn remove_retired(pin_dir: &Path) {
    for name in map_names::RETIRED {
        if map_names::RETIRED_FLOW_FILTERS.contains(&name)
            && pins::map_pin(pin_dir, name).exists()
            && let Err(error) = flow_filter::distrust_retired(pin_dir, name)
        {
            warn!(
                map = name,
                error = %error,
                "could not make the older programs distrust their flow filter: until they are \
                 replaced, they may pass replies of this agent's new flows untranslated"
            );
        }
        if fs::remove_file(pins::map_pin(pin_dir, name)).is_ok() {
            info!(
                map = name,
                "removed the pin of a map this agent no longer uses"
            );
        }
    }
    for path in pins::other_layout_maps(pin_dir) {
        if fs::remove_file(&path).is_ok() {
            info!(
                map = %path.display(),
                "removed the pin of a map of a layout this agent does not know (a newer \
                 agent's, before a downgrade)"
            );
        }
    }
}

/// The master keys a pinned service map holds, of this layout or an older one (the same
/// key; values read as bytes); none if it cannot be read.
fn pinned_masters(path: &Path) -> Vec<ServiceKey> {
    let Ok(data) = MapData::from_pin(path) else {
        return Vec::new();
    };
    // The layouts before masters had a map of their own held the slots' fields too.
    const OLDER_VALUE: usize = 24;
    let value_size = data.info().map_or(0, |info| info.value_size() as usize);
    let map = Map::HashMap(data);
    let keys: Vec<ServiceKey> = match value_size {
        OLDER_VALUE => HashMap::<_, ServiceKey, [u8; OLDER_VALUE]>::try_from(map)
            .map(|map| map.keys().filter_map(Result::ok).collect())
            .unwrap_or_default(),
        size if size == size_of::<ServiceEntry>() => {
            HashMap::<_, ServiceKey, ServiceEntry>::try_from(map)
                .map(|map| map.keys().filter_map(Result::ok).collect())
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    keys.into_iter().filter(|key| key.slot == 0).collect()
}

/// Has the kernel verify every program but the optional socket iterators. The verifier is
/// most of a start's cost (about a second for the TC programs), and it runs in the calling
/// thread: the programs are spread over one thread per CPU, the costliest first.
pub fn load_programs(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    let started = std::time::Instant::now();
    let wanted = program_names::TC
        .into_iter()
        .chain(program_names::SOCK_ADDR)
        .chain([program_names::SOCK_RELEASE]);
    let mut queue: Vec<(&'static str, &mut Program)> = Vec::new();
    let mut programs: std::collections::HashMap<&str, &mut Program> = ebpf.programs_mut().collect();
    for name in wanted {
        let program = programs
            .remove(name)
            .ok_or(LoadError::MissingProgram(name))?;
        queue.push((name, program));
    }
    // pop() takes from the end: the TC programs, the costliest, go first.
    queue.reverse();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let queue = std::sync::Mutex::new(queue);
    let next = || {
        queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
    };
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    while let Some((name, program)) = next() {
                        load_program(name, program)?;
                    }
                    Ok::<(), LoadError>(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|worker| {
            worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    })?;
    info!(took = ?started.elapsed(), threads, "programs verified and loaded by the kernel");
    if super::privileges::verifier_hardens() {
        info!(
            "the verifier hardened the programs against Spectre (no CAP_PERFMON or \
             CAP_SYS_ADMIN): the TC programs cost a third to three quarters more per packet \
             and take nearly three times as long to verify; add PERFMON to the Helm value \
             `capabilities` to lift it (docs/operations.md)"
        );
    }
    Ok(())
}

/// Loads one program of a type the agent attaches (the types have no common `load`).
fn load_program(name: &'static str, program: &mut Program) -> Result<(), LoadError> {
    let started = std::time::Instant::now();
    let result = match program {
        Program::CgroupSockAddr(program) => program.load(),
        Program::SchedClassifier(program) => program.load(),
        Program::CgroupSock(program) => program.load(),
        _ => Err(ProgramError::UnexpectedProgramType),
    };
    debug!(program = name, took = ?started.elapsed(), refused = result.is_err(), "program through the verifier");
    result.map_err(|source| LoadError::Program { name, source })
}

/// The program `name` of the loaded object, as the type its hook needs. A program that is
/// missing or of another type means the build is broken.
pub fn program<'a, P>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut P, LoadError>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(LoadError::MissingProgram(name))?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })
}

/// The sock_release program, which counts the sockets that leave with a record.
pub fn release_program(ebpf: &mut Ebpf) -> Result<&mut CgroupSock, LoadError> {
    program(ebpf, program_names::SOCK_RELEASE)
}

/// Takes the map `name` out of the loaded object, to be owned by its writer.
pub fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, LoadError> {
    ebpf.take_map(name).ok_or(LoadError::MissingMap(name))
}
