//! Loading the embedded object with its maps pinned, attaching the programs through pinned
//! bpf links, and removing everything again.
//!
//! Pinned maps are adopted when their layout and capacity match (a growable map's capacity
//! need only be within its flag) and replaced (with a warning) when not; [`load_grown`]
//! loads the programs again over larger maps (see `growth`). Pinned links keep the programs
//! attached while no agent runs; a new agent swaps its programs into the existing links
//! atomically (`BPF_LINK_UPDATE`), so translation never stops across a restart or an
//! upgrade.
use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::{HashMap, Map, MapData, MapError},
    programs::{
        CgroupAttachMode, CgroupSock, CgroupSockAddr, ProgramError,
        cgroup_sock_addr::CgroupSockAddrLink,
        links::{FdLink, LinkError, PinnedLink},
    },
};
use socklb_abi::{ServiceEntry, ServiceKey, globals, map_names, program_names};
use tracing::{info, warn};

use super::{
    Capacities, carry, link_update,
    program_logs::ProgramLogLevel,
    sizing::{self, Sizes},
    tc,
};

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
    #[error("cannot {action} the pinned link {path}")]
    Link {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: LinkError,
    },
    #[error("cannot swap the program of the pinned link {path}")]
    UpdateLink {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot pin the link {path}")]
    PinLink {
        path: PathBuf,
        #[source]
        source: aya::pin::PinError,
    },
    #[error("cannot create {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Where a pinned link of `program` lives.
pub fn link_pin(pin_dir: &Path, program: &str) -> PathBuf {
    pin_dir.join("links").join(program)
}

/// The empty directory a `socklb trace` session holds an exclusive flock on while it runs:
/// one session per pin directory, taken atomically, and freed by the kernel however the
/// session ends (bpffs holds no regular files, but its directories lock like any other).
pub fn trace_lease_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("trace_lease")
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
}

/// Loads `object` (the embedded one, its kfunc call patched), adopting compatible pinned
/// maps, and loads every program into the kernel (verifier included) but the socket
/// iterators, which are optional (`destroy`); nothing is attached yet. When loading fails,
/// the maps this call pinned are unpinned again: a failed start leaves what it found,
/// nothing more.
pub fn load(
    pin_dir: &Path,
    capacities: &Capacities,
    programs: ProgramSettings,
    object: &[u8],
) -> Result<Loaded, LoadError> {
    let unpinned: Vec<PathBuf> = map_names::ALL
        .iter()
        .map(|name| pin_dir.join(name))
        .filter(|path| !path.exists())
        .collect();
    remove_staging(pin_dir);
    load_pinning(pin_dir, capacities, programs, object).inspect_err(|_| {
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
) -> Result<Loaded, LoadError> {
    // An older agent's service map, under its old name: the frontends it holds were serving.
    let mut replaced_masters = pinned_masters(&pin_dir.join(map_names::RETIRED_SERVICES));
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
                load_programs(&mut ebpf)?;
                // Only now: a failed load leaves the older agent's maps pinned as it found
                // them (and their frontends to be read again by the next attempt).
                remove_retired(pin_dir);
                return Ok(Loaded {
                    ebpf,
                    replaced_masters,
                    sizes,
                });
            }
            Err(EbpfError::MapError(MapError::IncompatiblePinnedMap {
                name,
                property,
                expected,
                actual,
            })) => {
                let path = pin_dir.join(&name);
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
/// anew with their size in `sizes` and pinned under [`staging_dir`] (the caller copies their
/// entries, swaps the programs in and moves the pins). Every other map must be the pinned
/// one: nothing is replaced here.
pub fn load_grown(
    pin_dir: &Path,
    capacities: &Capacities,
    programs: ProgramSettings,
    object: &[u8],
    sizes: &Sizes,
    grown: &[&'static str],
) -> Result<Ebpf, LoadError> {
    let staging = staging_dir(pin_dir);
    remove_staging(pin_dir);
    fs::create_dir_all(&staging).map_err(|source| LoadError::Dir {
        path: staging.clone(),
        source,
    })?;
    let globals = Globals::new(capacities, programs);
    let mut loader = EbpfLoader::new();
    configure(&mut loader, pin_dir, capacities, sizes, &globals);
    for name in grown {
        loader.map_pin_path(name, staging.join(name));
    }
    let result = loader
        .load(object)
        .map_err(LoadError::Load)
        .and_then(|mut ebpf| load_programs(&mut ebpf).map(|()| ebpf));
    if result.is_err() {
        remove_staging(pin_dir);
    }
    result
}

/// Where [`load_grown`] pins the maps it creates until they replace the pinned ones.
pub fn staging_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("grow")
}

/// Removes what an interrupted growth left under [`staging_dir`] (only socklb's maps).
pub fn remove_staging(pin_dir: &Path) {
    let staging = staging_dir(pin_dir);
    for name in map_names::ALL {
        let _ = fs::remove_file(staging.join(name));
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
}

impl Globals {
    fn new(capacities: &Capacities, programs: ProgramSettings) -> Self {
        Self {
            socket_slot_mask: capacities.socket_slots() - 1,
            log_level: programs.log_level.global(),
            skc_cookie_offset: super::destroy::skc_cookie_offset(),
            skc_v6_daddr_offset: super::destroy::skc_v6_daddr_offset(),
            record_tcp: u32::from(programs.record_tcp),
            max_socket_records: capacities.socket_records,
        }
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
        .map_pin_path(PROGRAM_LOGS_MAP, pin_dir.join(map_names::PROGRAM_LOGS))
        .override_global(globals::SOCKET_SLOT_MASK, &values.socket_slot_mask, true)
        .override_global(aya_log::LEVEL, &values.log_level, true)
        .override_global(globals::SKC_COOKIE_OFFSET, &values.skc_cookie_offset, true)
        .override_global(
            globals::SKC_V6_DADDR_OFFSET,
            &values.skc_v6_daddr_offset,
            true,
        )
        .override_global(globals::RECORD_TCP, &values.record_tcp, true)
        .override_global(
            globals::MAX_SOCKET_RECORDS,
            &values.max_socket_records,
            true,
        )
        .map_max_entries(map_names::SOCKETS, capacities.socket_slots())
        .map_max_entries(map_names::SERVICES, sizes.services)
        .map_max_entries(map_names::BACKENDS, sizes.backends)
        // Each family's map has the size of the pair: the writer counts both families'
        // entries against one capacity, so neither can overflow.
        .map_max_entries(map_names::SERVICES6, sizes.services)
        .map_max_entries(map_names::BACKENDS6, sizes.backends)
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
}

/// The capacity of an IPv6 table the programs write (conntrack, unconfirmed conntrack,
/// affinity of clients outside the node, unconnected UDP sockets' reverse entries) whose
/// IPv4 twin has `ipv4`: half of it. They are preallocated LRUs whose IPv6 entries are
/// larger (a confirmed-flow entry 152 bytes against 112), so a node pays for both families
/// up front; the same flag raises both.
fn ipv6_share(ipv4: u32) -> u32 {
    (ipv4 / 2).max(1)
}

/// A growable map keeps the size an earlier agent grew it to, within its flag; a new one
/// (or one above a lowered flag, which is then replaced) starts at [`sizing::INITIAL`].
fn starting_sizes(pin_dir: &Path, capacities: &Capacities) -> Sizes {
    let size = |name: &str, initial: u32, bound: u32| {
        MapData::from_pin(pin_dir.join(name))
            .ok()
            .and_then(|map| map.info().ok())
            .map(|info| info.max_entries())
            .filter(|pinned| (1..=bound).contains(pinned))
            .unwrap_or(initial.min(bound))
    };
    Sizes {
        services: size(
            map_names::SERVICES,
            sizing::INITIAL.services,
            capacities.service_entries,
        ),
        backends: size(
            map_names::BACKENDS,
            sizing::INITIAL.backends,
            capacities.backends,
        ),
        maglev: size(
            map_names::MAGLEV,
            sizing::INITIAL.maglev,
            capacities.maglev_entries,
        ),
    }
}

/// Unpins the maps of older layouts ([`map_names::RETIRED`]); programs still using one keep
/// it until they are replaced.
fn remove_retired(pin_dir: &Path) {
    for name in map_names::RETIRED {
        if fs::remove_file(pin_dir.join(name)).is_ok() {
            info!(
                map = name,
                "removed the pin of a map this agent no longer uses"
            );
        }
    }
}

/// The master keys a pinned service map holds; none if it cannot be read (it is being
/// replaced because it differs, possibly in layout).
fn pinned_masters(path: &Path) -> Vec<ServiceKey> {
    let Ok(data) = MapData::from_pin(path) else {
        return Vec::new();
    };
    let Ok(map) = HashMap::<_, ServiceKey, ServiceEntry>::try_from(Map::HashMap(data)) else {
        return Vec::new();
    };
    map.keys()
        .filter_map(Result::ok)
        .filter(|key| key.slot == 0)
        .collect()
}

fn load_programs(ebpf: &mut Ebpf) -> Result<(), LoadError> {
    for name in program_names::SOCK_ADDR {
        sock_addr_program(ebpf, name)?
            .load()
            .map_err(|source| LoadError::Program { name, source })?;
    }
    for name in program_names::TC {
        tc::program(ebpf, name)?
            .load()
            .map_err(|source| LoadError::Program { name, source })?;
    }
    let name = program_names::SOCK_RELEASE;
    release_program(ebpf)?
        .load()
        .map_err(|source| LoadError::Program { name, source })
}

fn release_program(ebpf: &mut Ebpf) -> Result<&mut CgroupSock, LoadError> {
    let name = program_names::SOCK_RELEASE;
    ebpf.program_mut(name)
        .ok_or(LoadError::MissingProgram(name))?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })
}

fn sock_addr_program<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut CgroupSockAddr, LoadError> {
    ebpf.program_mut(name)
        .ok_or(LoadError::MissingProgram(name))?
        .try_into()
        .map_err(|source| LoadError::Program { name, source })
}

/// What `attach` did for each program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attachment {
    /// A new link was created and pinned.
    Attached,
    /// The program of an existing pinned link was replaced in place.
    Replaced,
}

/// Attaches every program to `cgroup`, or swaps it into the pinned link a previous agent
/// left. The links stay pinned: the programs remain attached after this process exits.
pub fn attach(
    ebpf: &mut Ebpf,
    pin_dir: &Path,
    cgroup: &Path,
) -> Result<Vec<(&'static str, Attachment)>, LoadError> {
    let links_dir = pin_dir.join("links");
    fs::create_dir_all(&links_dir).map_err(|source| LoadError::Dir {
        path: links_dir.clone(),
        source,
    })?;
    let cgroup_file = File::open(cgroup).map_err(|source| LoadError::Cgroup {
        path: cgroup.to_owned(),
        source,
    })?;

    let mut done = Vec::new();
    for name in program_names::SOCK_ADDR {
        let program = sock_addr_program(ebpf, name)?;
        let pin = link_pin(pin_dir, name);
        let link_error = |action, source| LoadError::Link {
            action,
            path: pin.clone(),
            source,
        };
        let attachment = if pin.exists() {
            replace_in_link(program, name, &pin)?;
            Attachment::Replaced
        } else {
            // bpf links to cgroups always coexist with other programs; the mode must be 0.
            let id = program
                .attach(&cgroup_file, CgroupAttachMode::Single)
                .map_err(|source| LoadError::Program { name, source })?;
            let link = program
                .take_link(id)
                .map_err(|source| LoadError::Program { name, source })?;
            let fd_link = FdLink::try_from(link).map_err(|e| link_error("pin", e))?;
            fd_link.pin(&pin).map_err(|source| LoadError::PinLink {
                path: pin.clone(),
                source,
            })?;
            Attachment::Attached
        };
        info!(program = name, cgroup = %cgroup.display(), ?attachment, "program attached");
        done.push((name, attachment));
    }
    let name = program_names::SOCK_RELEASE;
    let attachment = attach_release(ebpf, pin_dir, &cgroup_file)?;
    info!(program = name, cgroup = %cgroup.display(), ?attachment, "program attached");
    done.push((name, attachment));
    Ok(done)
}

/// [`attach`] for the sock_release program, which counts the sockets that leave with a
/// record.
fn attach_release(ebpf: &mut Ebpf, pin_dir: &Path, cgroup: &File) -> Result<Attachment, LoadError> {
    let name = program_names::SOCK_RELEASE;
    let pin = link_pin(pin_dir, name);
    if pin.exists() {
        replace_release(ebpf, &pin)?;
        return Ok(Attachment::Replaced);
    }
    let program = release_program(ebpf)?;
    let id = program
        .attach(cgroup, CgroupAttachMode::Single)
        .map_err(|source| LoadError::Program { name, source })?;
    let link = program
        .take_link(id)
        .map_err(|source| LoadError::Program { name, source })?;
    let fd_link = FdLink::try_from(link).map_err(|source| LoadError::Link {
        action: "pin",
        path: pin.clone(),
        source,
    })?;
    fd_link.pin(&pin).map_err(|source| LoadError::PinLink {
        path: pin.clone(),
        source,
    })?;
    Ok(Attachment::Attached)
}

/// Swaps the sock_release program into the pinned link at `pin`.
fn replace_release(ebpf: &mut Ebpf, pin: &Path) -> Result<(), LoadError> {
    let name = program_names::SOCK_RELEASE;
    let program = release_program(ebpf)?
        .fd()
        .map_err(|source| LoadError::Program { name, source })?;
    link_update::update_pinned(pin, program).map_err(|source| LoadError::UpdateLink {
        path: pin.to_owned(),
        source,
    })
}

/// Swaps `program` into the pinned link at `pin` (`BPF_LINK_UPDATE`: atomic, no moment
/// without a program).
fn replace_in_link(
    program: &mut CgroupSockAddr,
    name: &'static str,
    pin: &Path,
) -> Result<(), LoadError> {
    let link_error = |action, source| LoadError::Link {
        action,
        path: pin.to_owned(),
        source,
    };
    let pinned = PinnedLink::from_pin(pin).map_err(|e| link_error("open", e))?;
    let link = CgroupSockAddrLink::try_from(FdLink::from(pinned))
        .map_err(|e| link_error("reuse (not a cgroup sock_addr link)", e))?;
    let id = program
        .attach_to_link(link)
        .map_err(|source| LoadError::Program { name, source })?;
    // Dropping our handle closes the fd only; the pin keeps the link.
    drop(program.take_link(id));
    Ok(())
}

/// Swaps the programs of `ebpf` into every cgroup link pinned under `pin_dir`, creating
/// none: what is attached stays attached, now running these programs. Returns how many.
pub fn replace_attached(ebpf: &mut Ebpf, pin_dir: &Path) -> Result<usize, LoadError> {
    let mut replaced = 0;
    for name in program_names::SOCK_ADDR {
        let pin = link_pin(pin_dir, name);
        if pin.exists() {
            replace_in_link(sock_addr_program(ebpf, name)?, name, &pin)?;
            replaced += 1;
        }
    }
    let pin = link_pin(pin_dir, program_names::SOCK_RELEASE);
    if pin.exists() {
        replace_release(ebpf, &pin)?;
        replaced += 1;
    }
    Ok(replaced)
}

/// Removes the link pinned at `path`, if there is one, and returns once its program is
/// detached. The pin is the link's last holder but one: our own fd, whose close releases
/// the link at once. Dropping the pin alone would leave the detach to a kernel work queue,
/// so that programs could still run for a while after `cleanup` returned.
fn unpin_link(path: &Path) -> io::Result<bool> {
    let link = match PinnedLink::from_pin(path) {
        Ok(link) => link,
        Err(_) if !path.exists() => return Ok(false),
        Err(e) => {
            // Not a link (or not readable as one): removing the pin is all there is to do.
            warn!(pin = %path.display(), error = %e, "not opened as a link; removing the pin");
            return match fs::remove_file(path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
            };
        }
    };
    let held = link
        .unpin()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    drop(held);
    Ok(true)
}

/// What `cleanup` removed.
#[derive(Debug, Default)]
pub struct Cleanup {
    pub removed: Vec<PathBuf>,
}

/// Detaches the programs (by removing their link pins, and the netlink TC filters recorded
/// under `pin_dir` on kernels without TCX) and removes socklb's pinned maps and directories
/// under `pin_dir`; nothing it did not create, nothing another instance attached.
pub fn cleanup(pin_dir: &Path) -> io::Result<Cleanup> {
    let mut cleanup = Cleanup::default();
    // Maps of a growth an agent did not finish.
    remove_staging(pin_dir);
    // Maps a start replaced and had not finished carrying over.
    carry::finish(pin_dir);
    let links = program_names::SOCK_ADDR
        .iter()
        .chain([&program_names::SOCK_RELEASE])
        .map(|name| link_pin(pin_dir, name));
    let tc_links = tc::tc_pins(pin_dir)
        .map_err(io::Error::other)?
        .into_iter()
        .map(|(path, _)| path);
    for path in links.chain(tc_links) {
        if unpin_link(&path)? {
            cleanup.removed.push(path);
        }
    }
    let maps = map_names::ALL
        .iter()
        .chain(&map_names::RETIRED)
        .map(|name| pin_dir.join(name));
    for path in maps {
        match fs::remove_file(&path) {
            Ok(()) => cleanup.removed.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }
    cleanup.removed.extend(
        tc::detach_netlink_filters(pin_dir)?
            .into_iter()
            .map(PathBuf::from),
    );
    for dir in [
        pin_dir.join("links"),
        trace_lease_dir(pin_dir),
        super::pin_lock::lock_path(pin_dir),
        pin_dir.to_owned(),
    ] {
        // Only if empty: anything else in there is not ours.
        match fs::remove_dir(&dir) {
            Ok(()) => cleanup.removed.push(dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                warn!(dir = %dir.display(), "not removed: it holds files socklb did not create");
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
        }
    }
    Ok(cleanup)
}
