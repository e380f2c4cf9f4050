//! A `socklb trace` session: takes the lease that turns the programs' trace events on,
//! reads them from the ring buffer, adds what the kernel did not give (process name, cgroup
//! path, Service name), filters and prints them. The lease lapses by itself a few seconds
//! after a session dies, so a killed session leaves no cost behind.
use std::{
    collections::HashMap,
    fs::File,
    io::{self, Write},
    net::{IpAddr, SocketAddr},
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData, MapError, PerCpuArray, RingBuf};
use nix::{
    fcntl::{Flock, FlockArg},
    time::{ClockId, clock_gettime},
};
use socklb_abi::{
    Counters, FrontendName, Ipv6Words, NodeConfig, TRACE_FAMILY_V4, TRACE_FAMILY_V6,
    TRACE_FLAG_PACKETS, TRACE_FLAG_REVERSE, TraceControl, ipv6_words, map_names,
};

use super::event::{self, DecodeError, Service, Shown, unnamed_device};
use crate::{
    dataplane::cgroup2_mount,
    kernel::pins::{self, trace_lease_dir},
    maps::names::FrontendLabel,
    terminal::printable,
};

/// How long a lease lasts unless renewed; renewed every [`RENEW`].
const LEASE: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
/// How often the ring buffer is read. The programs do not wake the reader (a wakeup per
/// event would cost each translation an interrupt); 256 KiB hold some 1,900 events, so
/// this reads up to about 95,000 a second before any is lost.
const POLL: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(
        "cannot open the pinned map {path}: is socklb running on this node with this version \
         (see `socklb run`), and is --bpffs right?"
    )]
    Open {
        path: PathBuf,
        #[source]
        source: MapError,
    },
    #[error(
        "another trace session ({holder}) holds the trace lease of this pin directory: the \
         programs write to one reader; stop that session first, or wait for it to end"
    )]
    Busy { holder: Holder },
    #[error("cannot lock {path} to take the trace lease (is --bpffs right, and are you root?)")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the trace lease to {map}")]
    Lease {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("cannot write the trace to standard output")]
    Output(#[source] io::Error),
    #[error("cannot read the clock")]
    Clock(#[source] nix::Error),
    #[error(
        "--frontend {frontend} and --backend {backend} are of different address families: a \
         frontend's backends are of its own family, so nothing would match; drop one of them"
    )]
    MixedFamilies {
        frontend: SocketAddr,
        backend: IpAddr,
    },
}

/// What a session shows.
#[derive(Clone, Debug, Default)]
pub struct Filters {
    /// NAMESPACE/NAME: only that Service's frontends (checked here, not in the kernel: a
    /// Service has several).
    pub service: Option<(String, String)>,
    /// Only this frontend, IPv4 or IPv6 (in the kernel; port 0: any port).
    pub frontend: Option<SocketAddr>,
    /// Only this backend address, of the frontend's family (in the kernel).
    pub backend: Option<IpAddr>,
    /// Also recvmsg/getpeername answers shown as the frontend.
    pub reverse: bool,
    /// Also every packet of known flows from outside (conntrack hits).
    pub packets: bool,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub pin_dir: PathBuf,
    pub filters: Filters,
    pub json: bool,
    /// Stop after this many events shown.
    pub count: Option<usize>,
    /// Stop after this long.
    pub duration: Option<Duration>,
}

/// What a session saw.
#[derive(Debug, Default)]
pub struct Summary {
    pub shown: usize,
    /// Events the programs could not write because the ring buffer was full.
    pub lost: u64,
    /// The session ended because the output's reader went away (EPIPE).
    pub reader_gone: bool,
}

/// Runs a session until `stop` resolves, `count` events were shown or `duration` passed.
/// Events go to `out`; the lease is given back whatever ends the session.
pub async fn run(
    options: &Options,
    mut out: impl Write,
    stop: impl Future<Output = ()>,
) -> Result<Summary, TraceError> {
    let pin_dir = &options.pin_dir;
    let mut lease = Lease::take(pin_dir, &options.filters)?;
    let mut ring: RingBuf<MapData> = open(pin_dir, map_names::TRACE, Map::RingBuf)?;
    let counters: PerCpuArray<MapData, Counters> =
        open(pin_dir, map_names::COUNTERS, Map::PerCpuArray)?;
    let lost_before = lost(&counters);
    let mut details = Details::new(pin_dir)?;
    crate::stdout::note("tracing translations (lease renewed every second; Ctrl-C to stop)");
    if details.devices.agent_elsewhere {
        crate::stdout::note(
            "this process is not in the agent's network namespace: devices are shown by their \
             index there (if<N>); run trace where the agent runs (in its pod, or on the node) \
             for their names",
        );
    }
    if let Some((namespace, name)) = &options.filters.service
        && !details.programs_service(namespace, name)
    {
        // A typo would wait for events that never come.
        crate::stdout::note(&format!(
            "no frontend of {namespace}/{name} is programmed now (`socklb inspect --service \
             {namespace}/{name}`): its events show once one is"
        ));
    }

    let mut summary = Summary::default();
    let mut renew = tokio::time::interval(RENEW);
    let mut poll = tokio::time::interval(POLL);
    let deadline = options.duration.map(|d| tokio::time::Instant::now() + d);
    let until_deadline = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop, until_deadline);
    let drain = loop {
        tokio::select! {
            () = &mut stop => break true,
            () = &mut until_deadline => break true,
            _ = renew.tick() => {
                lease.renew()?;
                let now_lost = lost(&counters).wrapping_sub(lost_before);
                if now_lost > summary.lost {
                    crate::stdout::note(&format!(
                        "{now_lost} trace events lost so far: the ring buffer was full (narrow \
                         the trace with --service, --frontend or --backend)"
                    ));
                    summary.lost = now_lost;
                }
            }
            _ = poll.tick() => {
                if show_ready(&mut ring, &mut details, options, &mut out, &mut summary)?
                    == Reading::Ended
                {
                    break false;
                }
            }
        }
    };
    lease.give_back();
    // Stopped (Ctrl-C, --duration): the events written before emission went off are still
    // in the ring, up to a poll's worth or more if the output was slow; show them too.
    if drain {
        show_ready(&mut ring, &mut details, options, &mut out, &mut summary)?;
    }
    summary.lost = lost(&counters).wrapping_sub(lost_before);
    Ok(summary)
}

/// Whether the session goes on reading after [`show_ready`].
#[derive(PartialEq, Eq)]
enum Reading {
    GoesOn,
    /// `--count` events were shown, or the output's reader went away.
    Ended,
}

/// Shows every event the ring holds that passes the filters.
fn show_ready(
    ring: &mut RingBuf<MapData>,
    details: &mut Details,
    options: &Options,
    out: &mut impl Write,
    summary: &mut Summary,
) -> Result<Reading, TraceError> {
    while let Some(record) = ring.next() {
        let event = event::decode(&record)?;
        drop(record);
        let Some(shown) = details.show(&event, &options.filters) else {
            continue;
        };
        let written = if options.json {
            serde_json::to_string(&shown)
                .map_err(io::Error::other)
                .and_then(|line| writeln!(out, "{line}"))
        } else {
            writeln!(out, "{}", shown.line())
        };
        // A closed output (`| head`) ends the session; any other failure to write ends it
        // with that error, the lease given back either way.
        if let Err(error) = written.and_then(|()| out.flush()) {
            if error.kind() == io::ErrorKind::BrokenPipe {
                summary.reader_gone = true;
                return Ok(Reading::Ended);
            }
            return Err(TraceError::Output(error));
        }
        summary.shown += 1;
        if options.count.is_some_and(|count| summary.shown >= count) {
            return Ok(Reading::Ended);
        }
    }
    Ok(Reading::GoesOn)
}

fn open<T: TryFrom<Map, Error = MapError>>(
    pin_dir: &Path,
    name: &'static str,
    kind: fn(MapData) -> Map,
) -> Result<T, TraceError> {
    let path = pins::map_pin(pin_dir, name);
    let error = |source| TraceError::Open {
        path: path.clone(),
        source,
    };
    MapData::from_pin(&path)
        .and_then(|data| T::try_from(kind(data)))
        .map_err(error)
}

/// Whether the agent that serves `pin_dir` runs in another network namespace than this
/// process (false when its node map cannot be read: an agent from before it said).
fn agent_elsewhere(pin_dir: &Path) -> bool {
    open::<Array<MapData, NodeConfig>>(pin_dir, map_names::NODE, Map::Array)
        .ok()
        .and_then(|node| node.get(&0, 0).ok())
        .is_some_and(|node| crate::dataplane::outside_netns(node.agent_netns_cookie))
}

fn lost(counters: &PerCpuArray<MapData, Counters>) -> u64 {
    counters
        .get(&0, 0)
        .map(|per_cpu| Counters::sum(per_cpu.iter()).trace_lost)
        .unwrap_or(0)
}

/// CLOCK_MONOTONIC in ns: the programs' `bpf_ktime_get_ns`.
fn monotonic_ns() -> Result<u64, TraceError> {
    let now = clock_gettime(ClockId::CLOCK_MONOTONIC).map_err(TraceError::Clock)?;
    let ns = i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec());
    Ok(u64::try_from(ns).unwrap_or(0))
}

/// The session that holds the lease, as far as the control entry tells.
#[derive(Debug)]
pub struct Holder {
    /// 0 while the holder has locked but not yet written its entry.
    pub pid: u32,
    pub comm: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.pid {
            0 => f.write_str("just starting, pid not yet known"),
            pid if self.comm.is_empty() => write!(f, "pid {pid}"),
            pid => write!(f, "pid {pid}, {}", printable(&self.comm)),
        }
    }
}

impl Holder {
    fn of(control: &TraceControl, now: u64) -> Self {
        let pid = if control.until_ns > now {
            control.session_pid
        } else {
            0
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|comm| comm.trim_end().to_owned())
            .unwrap_or_default();
        Self { pid, comm }
    }
}

/// The session's hold on the control map.
///
/// Taking it is atomic: an exclusive, non-blocking flock on [`trace_lease_dir`], which the
/// kernel gives to one session and takes back when that session exits, however it exits
/// (no stale holder to judge, so no check-then-set). Only the lock holder writes the
/// control entry, and it clears the entry on leaving only if the entry is still its own.
struct Lease {
    control: Array<MapData, TraceControl>,
    wanted: TraceControl,
    held: bool,
    /// Released after the entry is cleared (fields drop in order).
    _lock: Flock<File>,
}

/// The control entry a session wants (its lease not yet running): its flags, and the
/// kernel-side filters with their one family.
fn wanted_control(filters: &Filters, pid: u32) -> Result<TraceControl, TraceError> {
    let mut flags = 0;
    if filters.reverse {
        flags |= TRACE_FLAG_REVERSE;
    }
    if filters.packets {
        flags |= TRACE_FLAG_PACKETS;
    }
    let family = match (filters.frontend, filters.backend) {
        (Some(frontend), Some(backend)) if frontend.is_ipv4() != backend.is_ipv4() => {
            return Err(TraceError::MixedFamilies { frontend, backend });
        }
        (Some(frontend), _) => family_of(frontend.ip()),
        (None, Some(backend)) => family_of(backend),
        (None, None) => 0,
    };
    Ok(TraceControl {
        until_ns: 0,
        session_pid: pid,
        frontend_port: filters.frontend.map_or(0, |f| f.port().to_be()),
        flags,
        frontend_address: filters.frontend.map_or([0; 4], |f| words(f.ip())),
        backend_address: filters.backend.map_or([0; 4], words),
        family,
        ..TraceControl::default()
    })
}

fn family_of(address: IpAddr) -> u8 {
    match address {
        IpAddr::V4(_) => TRACE_FAMILY_V4,
        IpAddr::V6(_) => TRACE_FAMILY_V6,
    }
}

/// An address as the control map holds it: IPv4 in the last word.
fn words(address: IpAddr) -> Ipv6Words {
    match address {
        IpAddr::V4(v4) => [0, 0, 0, u32::from(v4).to_be()],
        IpAddr::V6(v6) => ipv6_words(v6.octets()),
    }
}

impl Lease {
    fn take(pin_dir: &Path, filters: &Filters) -> Result<Self, TraceError> {
        let pid = std::process::id();
        let wanted = wanted_control(filters, pid)?;
        let control: Array<MapData, TraceControl> =
            open(pin_dir, map_names::TRACE_CONTROL, Map::Array)?;
        let current = |control: &Array<MapData, TraceControl>| {
            control.get(&0, 0).map_err(|source| TraceError::Lease {
                map: map_names::TRACE_CONTROL,
                source,
            })
        };
        let path = trace_lease_dir(pin_dir);
        let lock_error = |source| TraceError::Lock {
            path: path.clone(),
            source,
        };
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Err(error) if error.kind() != io::ErrorKind::AlreadyExists => {
                return Err(lock_error(error));
            }
            _ => {}
        }
        let dir = File::open(&path).map_err(lock_error)?;
        let lock = match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                // The holder writes its entry right after locking: a session that lost a
                // race by microseconds waits a moment for it, to name the holder.
                let deadline = Instant::now() + Duration::from_millis(500);
                let holder = loop {
                    let holder = Holder::of(&current(&control)?, monotonic_ns()?);
                    if holder.pid != 0 || Instant::now() >= deadline {
                        break holder;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                };
                return Err(TraceError::Busy { holder });
            }
            Err((_, errno)) => return Err(lock_error(io::Error::from(errno))),
        };
        // A session of a version before the lock still running (the lease lapses 3 s after
        // it dies).
        let now = monotonic_ns()?;
        let entry = current(&control)?;
        if entry.until_ns > now
            && entry.session_pid != pid
            && Path::new(&format!("/proc/{}", entry.session_pid)).exists()
        {
            return Err(TraceError::Busy {
                holder: Holder::of(&entry, now),
            });
        }
        let mut lease = Self {
            control,
            wanted,
            held: true,
            _lock: lock,
        };
        lease.renew()?;
        Ok(lease)
    }

    /// Emission on for another [`LEASE`].
    fn renew(&mut self) -> Result<(), TraceError> {
        self.wanted.until_ns = monotonic_ns()? + LEASE.as_nanos() as u64;
        self.control
            .set(0, &self.wanted, 0)
            .map_err(|source| TraceError::Lease {
                map: map_names::TRACE_CONTROL,
                source,
            })
    }

    /// Emission off: the programs stop writing at once. Only our own entry is cleared.
    fn give_back(&mut self) {
        if std::mem::take(&mut self.held)
            && self
                .control
                .get(&0, 0)
                .is_ok_and(|entry| entry.session_pid == self.wanted.session_pid)
        {
            let _ = self.control.set(0, &TraceControl::default(), 0);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// What the kernel did not put in an event, looked up when it is read.
struct Details {
    names: BpfHashMap<MapData, u32, FrontendName>,
    services: HashMap<u32, Option<Service>>,
    cgroups: CgroupPaths,
    devices: DeviceNames,
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, to date the events.
    epoch_offset: Option<(SystemTime, u64)>,
}

impl Details {
    fn new(pin_dir: &Path) -> Result<Self, TraceError> {
        Ok(Self {
            names: open(pin_dir, map_names::NAMES, Map::HashMap)?,
            services: HashMap::new(),
            cgroups: CgroupPaths::new(),
            devices: DeviceNames {
                agent_elsewhere: agent_elsewhere(pin_dir),
                ..DeviceNames::default()
            },
            epoch_offset: monotonic_ns().ok().map(|now| (SystemTime::now(), now)),
        })
    }

    /// The event as shown, or `None` if the Service filter leaves it out.
    fn show(&mut self, event: &socklb_abi::TraceEvent, filters: &Filters) -> Option<Shown> {
        let service = self.service(event.service_id);
        if let Some((namespace, name)) = &filters.service
            && !service
                .as_ref()
                .is_some_and(|s| &s.namespace == namespace && &s.name == name)
        {
            return None;
        }
        let mut shown = Shown::new(event, self.time(event.time_ns), service);
        if let Some(process) = shown.process.as_mut() {
            // Raw bytes, any of them: the text output escapes what a terminal would act on.
            process.comm = std::fs::read(format!("/proc/{}/comm", process.pid))
                .map(|comm| {
                    let comm = comm.strip_suffix(b"\n").unwrap_or(&comm);
                    String::from_utf8_lossy(comm).into_owned()
                })
                .unwrap_or_default();
            process.cgroup = self.cgroups.path(process.cgroup_id).unwrap_or_default();
        }
        if shown.device.is_some() {
            shown.device = Some(self.devices.name(event.ifindex));
        }
        Some(shown)
    }

    /// Whether a programmed frontend bears the Service's name.
    fn programs_service(&self, namespace: &str, name: &str) -> bool {
        self.names.iter().flatten().any(|(_, frontend)| {
            FrontendLabel::decode(&frontend)
                .is_some_and(|label| label.namespace == namespace && label.name == name)
        })
    }

    fn service(&mut self, id: u32) -> Option<Service> {
        if let Some(known) = self.services.get(&id).filter(|known| known.is_some()) {
            return known.clone();
        }
        let service = self
            .names
            .get(&id, 0)
            .ok()
            .and_then(|name| FrontendLabel::decode(&name))
            .map(|label| Service {
                namespace: label.namespace,
                name: label.name,
                port: label.port,
            });
        self.services.insert(id, service.clone());
        service
    }

    fn time(&self, event_ns: u64) -> String {
        let Some((wall, mono)) = self.epoch_offset else {
            return event_ns.to_string();
        };
        let at = if event_ns >= mono {
            wall + Duration::from_nanos(event_ns - mono)
        } else {
            wall - Duration::from_nanos(mono - event_ns)
        };
        humantime::format_rfc3339_micros(at).to_string()
    }
}

/// Device indexes to names, in this process's network namespace (the node's, where the
/// TC programs run, when `socklb trace` runs on the node as documented). A name is looked
/// up again after [`DEVICE_NAME_AGE`]: devices come and go with pods and VMs, and an index
/// may be renamed.
#[derive(Default)]
struct DeviceNames {
    by_index: HashMap<u32, (String, Instant)>,
    /// The agent runs in another network namespace, whose indexes these are: none is named.
    agent_elsewhere: bool,
}

/// How long a device's name is trusted before it is looked up again.
const DEVICE_NAME_AGE: Duration = Duration::from_secs(5);

impl DeviceNames {
    /// The name of device `ifindex`, or `if<N>` when this namespace has none of that index.
    fn name(&mut self, ifindex: u32) -> String {
        if self.agent_elsewhere {
            return unnamed_device(ifindex);
        }
        if let Some((name, at)) = self.by_index.get(&ifindex)
            && at.elapsed() < DEVICE_NAME_AGE
        {
            return name.clone();
        }
        // nix 0.30 takes libc's NULL (no such index) for success and gives an empty name.
        let name = nix::net::if_::if_indextoname(ifindex)
            .ok()
            .filter(|name| !name.is_empty())
            .map_or_else(
                || unnamed_device(ifindex),
                |name| name.to_string_lossy().into_owned(),
            );
        self.by_index
            .insert(ifindex, (name.clone(), Instant::now()));
        name
    }
}

/// cgroup ids (the inode numbers of cgroup v2 directories) to paths below the mount.
struct CgroupPaths {
    root: Option<PathBuf>,
    by_id: HashMap<u64, String>,
    walked: Option<Instant>,
}

impl CgroupPaths {
    fn new() -> Self {
        Self {
            root: cgroup2_mount().ok(),
            by_id: HashMap::new(),
            walked: None,
        }
    }

    /// The path of cgroup `id`; the tree is walked again (at most once a second) for an id
    /// not seen yet, since cgroups come and go with pods.
    fn path(&mut self, id: u64) -> Option<String> {
        if !self.by_id.contains_key(&id)
            && self
                .walked
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
        {
            self.walk();
        }
        self.by_id.get(&id).cloned()
    }

    fn walk(&mut self) {
        self.walked = Some(Instant::now());
        let Some(root) = self.root.clone() else {
            return;
        };
        self.by_id.clear();
        let mut pending = vec![root.clone()];
        while let Some(dir) = pending.pop() {
            if let Ok(metadata) = std::fs::metadata(&dir) {
                let relative = dir.strip_prefix(&root).unwrap_or(&dir);
                self.by_id
                    .insert(metadata.ino(), format!("/{}", relative.display()));
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            pending.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|entry| entry.path()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filters(frontend: Option<&str>, backend: Option<&str>) -> Filters {
        Filters {
            frontend: frontend.map(|f| f.parse().expect("frontend")),
            backend: backend.map(|b| b.parse().expect("backend")),
            ..Filters::default()
        }
    }

    #[test]
    fn filters_reach_the_kernel_with_their_family() {
        let none = wanted_control(&filters(None, None), 7).expect("no filter");
        assert_eq!((none.family, none.frontend_address), (0, [0; 4]));

        let v4 =
            wanted_control(&filters(Some("10.96.0.10:80"), Some("10.0.1.5")), 7).expect("IPv4");
        assert_eq!(v4.family, TRACE_FAMILY_V4);
        assert_eq!(v4.frontend_address, [0, 0, 0, 0x0a60_000a_u32.to_be()]);
        assert_eq!(v4.backend_address, [0, 0, 0, 0x0a00_0105_u32.to_be()]);
        assert_eq!(v4.frontend_port, 80u16.to_be());

        let v6 = wanted_control(&filters(None, Some("fd00::5")), 7).expect("IPv6");
        assert_eq!(v6.family, TRACE_FAMILY_V6);
        assert_eq!(
            v6.backend_address,
            [0xfd00_0000_u32.to_be(), 0, 0, 5u32.to_be()]
        );
        assert_eq!(v6.frontend_address, [0; 4]);
    }

    #[test]
    fn a_device_is_named_in_this_namespace_or_by_its_index() {
        let mut devices = DeviceNames::default();
        // Loopback is index 1 in every network namespace.
        assert_eq!(devices.name(1), "lo");
        assert_eq!(devices.name(1), "lo", "from the cache");
        assert_eq!(devices.name(u32::MAX), "if4294967295");
        let mut elsewhere = DeviceNames {
            agent_elsewhere: true,
            ..DeviceNames::default()
        };
        assert_eq!(
            elsewhere.name(1),
            "if1",
            "the agent's index 1, not this namespace's"
        );
    }

    #[test]
    fn a_frontend_and_a_backend_of_two_families_are_refused() {
        let error = wanted_control(&filters(Some("[fd00:96::10]:80"), Some("10.0.1.5")), 7)
            .expect_err("mixed families");
        assert!(matches!(error, TraceError::MixedFamilies { .. }), "{error}");
    }
}
