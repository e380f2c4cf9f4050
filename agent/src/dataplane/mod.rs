//! The datapath as the control plane sees it: load and attach the kernel programs, and
//! `apply` a desired state to their maps.
mod carry;
mod desired;
mod destroy;
mod devices;
mod gone;
mod growth;
mod host;
mod layout;
mod link_update;
mod loader;
mod maglev;
mod maps;
mod names;
mod object;
mod pin_lock;
mod privileges;
mod program_logs;
mod sizing;
mod source_ranges;
mod tc;
pub(crate) mod writer;

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    ops::RangeInclusive,
    path::{Path, PathBuf},
    time::Duration,
};

use aya::{
    Ebpf,
    maps::{Array, MapData, MapError, PerCpuArray},
};
pub use desired::{BackendAddr, Desired, Frontend, FrontendSpec, Protocol, Scope};
pub use destroy::{DestroyPrograms, Unavailable as DestroyUnavailable, skc_cookie_offset};
pub use devices::{DeviceError, check_devices, check_ethernet};
pub use gone::Gone;
pub use host::{
    HostError, cgroup2_mount, ephemeral_ports, ipv4_forwarding, ipv6_forwarding, local_addresses,
    prepare_pin_dir,
};
pub use loader::{Attachment, Cleanup, LoadError, cleanup, link_pin, trace_lease_dir};
pub use pin_lock::{
    Holder, PinLock, PinLockError, lock as lock_pin_dir, lock_path as pin_lock_path,
};
pub use privileges::{
    FOR_FEATURES as FEATURE_CAPABILITIES, ForFeature, NEEDED as NEEDED_CAPABILITIES, Needed,
    PrivilegeError, diagnose,
};
pub use program_logs::{ProgramLogLevel, ProgramLogs, ProgramLogsError};
use socklb_abi::{Counters, NodeConfig, NodeConfig6, SocketRecordCount, map_names};
pub use tc::{TcAttachError, TcMode};
use tracing::{info, warn};
pub use writer::{ApplyReport, Capacity, Outcome, Rejected, StoreError};

/// The service-map encodings of both families, for `socklb inspect`.
pub(crate) use self::maps::{decode_key4, decode_key6, decode_value4, decode_value6};
pub use self::{maglev::TABLE_SIZES as MAGLEV_TABLE_SIZES, names::FrontendLabel};
use self::{
    maglev::{MaglevError, MaglevWriter},
    maps::{KernelMaps, RawMaps},
    names::{NamesError, NamesWriter},
    source_ranges::{SourceRangeError, SourceRangeWriter},
    writer::Writer,
};

/// Whether this kernel has the kfunc the socket iterators call (for `socklb inspect`).
pub fn probe_destroy_kfunc() -> Result<(), DestroyUnavailable> {
    destroy::kfunc_id().map(|_| ())
}

/// Default directory of socklb's pins on bpffs.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/socklb";

/// Map capacities (`max_entries`). The service, backend and Maglev maps start smaller and
/// grow up to theirs (`sizing`); the others have theirs from the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities {
    /// Service map entries: one per frontend plus one per backend slot (an upper bound).
    pub service_entries: u32,
    /// Distinct backends (address, port, protocol) (an upper bound).
    pub backends: u32,
    /// Sockets whose peer is shown as the frontend: connect()ed sockets (a ring of this
    /// size rounded up to a power of two) and unconnected UDP sockets' (socket, backend)
    /// pairs (LRU).
    pub reverse: u32,
    /// Session-affinity entries (LRU).
    pub affinity: u32,
    /// Conntrack entries for traffic from outside, two per flow (LRU): confirmed flows.
    pub conntrack: u32,
    /// Conntrack entries of flows from outside not yet confirmed (LRU): what a SYN flood
    /// fills, apart from the confirmed flows.
    pub conntrack_new: u32,
    /// loadBalancerSourceRanges entries: one per range plus one per restricted frontend.
    pub source_ranges: u32,
    /// Maglev table entries: the table size for each Maglev frontend (an upper bound).
    pub maglev_entries: u32,
    /// Sockets that may hold a record at once (what each was translated for, so that the
    /// sweep closes it when its backend leaves). Records are charged to the agent's memory
    /// cgroup and any pod creates them; past the bound, sockets are still translated.
    pub socket_records: u32,
}

impl Capacities {
    /// Slots of the socket ring: `reverse` rounded up to a power of two, so that the
    /// programs index it with a mask.
    pub fn socket_slots(&self) -> u32 {
        self.reverse
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << 31)
    }
}

/// Sized for a small node (`faults/map_memory.rs`; docs/operations.md, "Map memory", has
/// the cost of each). The service, backend and Maglev maps are not preallocated (nor is the
/// source-range trie) and start small (`sizing::INITIAL`): their capacities are bounds a
/// large cluster reaches by growth alone (20,000 Services of 10 endpoints need about
/// 220,000 service entries). The LRU maps and the socket ring are preallocated to their
/// capacity, which a busy node raises with the flags.
impl Default for Capacities {
    fn default() -> Self {
        Self {
            service_entries: 1_048_576,
            backends: 262_144,
            reverse: 16_384,
            affinity: 8_192,
            conntrack: 32_768,
            conntrack_new: 8_192,
            source_ranges: 16_384,
            maglev_entries: 1_048_576,
            socket_records: 65_536,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    /// Directory on bpffs for socklb's pinned maps and links.
    pub pin_dir: PathBuf,
    /// cgroup v2 directory to attach to; `None` means the root of the cgroup v2 mount, so
    /// that every process on the node is served.
    pub cgroup: Option<PathBuf>,
    pub capacities: Capacities,
    /// Positions of every Maglev table: one of [`MAGLEV_TABLE_SIZES`].
    pub maglev_table_size: u32,
    /// The kernel programs' own log lines forwarded (off: compiled out by the verifier).
    pub program_log_level: ProgramLogLevel,
    /// connect() records TCP sockets too, so that they can be closed when their backend
    /// leaves (`--destroy-tcp-on-backend-removal`); connected UDP sockets always are.
    pub record_tcp: bool,
}

impl Config {
    fn program_settings(&self) -> loader::ProgramSettings {
        loader::ProgramSettings {
            log_level: self.program_log_level,
            record_tcp: self.record_tcp,
        }
    }
}

/// Cilium's default: about 1% imbalance with 100 backends, 64 KiB per frontend of value.
pub const DEFAULT_MAGLEV_TABLE_SIZE: u32 = 16_381;

impl Default for Config {
    fn default() -> Self {
        Self {
            pin_dir: PathBuf::from(DEFAULT_PIN_DIR),
            cgroup: None,
            capacities: Capacities::default(),
            maglev_table_size: DEFAULT_MAGLEV_TABLE_SIZE,
            program_log_level: ProgramLogLevel::Off,
            record_tcp: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot use map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("writing the maps failed; the agent re-read them and retries at the next sync")]
    Write(#[source] StoreError),
    #[error(transparent)]
    Tc(Box<TcAttachError>),
    #[error(
        "writing the source ranges failed; the agent re-read them and retries at the next sync"
    )]
    SourceRanges(#[source] SourceRangeError),
    #[error("writing a Maglev table failed; the agent re-read them and retries at the next sync")]
    Maglev(#[source] MaglevError),
    #[error("writing a frontend's name failed; the agent re-reads them at the next full sync")]
    Names(#[source] NamesError),
    #[error(transparent)]
    ProgramLogs(#[from] ProgramLogsError),
    /// The kernel refused for lack of a privilege: what to grant, then what was refused.
    #[error("{diagnosis}")]
    Privileges {
        diagnosis: PrivilegeError,
        #[source]
        refused: Box<DataplaneError>,
    },
}

impl DataplaneError {
    /// Puts the missing privilege first when that is why the kernel refused.
    fn explain_refusal(self) -> Self {
        match privileges::diagnose(&self) {
            Some(diagnosis) => Self::Privileges {
                diagnosis,
                refused: Box::new(self),
            },
            None => self,
        }
    }
}

/// How full a map the agent fills is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapUsage {
    pub map: &'static str,
    pub entries: u32,
    /// Its `max_entries` now.
    pub capacity: u32,
    /// What it may grow to: its `--max-*` flag.
    pub max_entries: u32,
}

/// What the TC programs need to know about this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSettings {
    /// Flows to backends on other nodes are SNATed to this address; `None` drops them
    /// (counted as errors) until the node has an address.
    pub snat_address: Option<Ipv4Addr>,
    /// The same for IPv6 flows: the node's first IPv6 InternalIP it holds.
    pub snat_address6: Option<Ipv6Addr>,
    /// Source ports for SNAT (both families).
    pub snat_ports: RangeInclusive<u16>,
    pub conntrack_timeouts: ConntrackTimeouts,
}

/// Idle time after which a flow from outside is forgotten (its SNAT port reused, its
/// backend chosen afresh), per state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConntrackTimeouts {
    /// TCP before the handshake completed (SYN only, or SYN and SYN-ACK).
    pub tcp_syn: Duration,
    /// TCP once the handshake completed.
    pub tcp_established: Duration,
    /// TCP after a FIN or RST.
    pub tcp_close: Duration,
    /// UDP.
    pub udp: Duration,
}

impl Default for ConntrackTimeouts {
    fn default() -> Self {
        let seconds = |s: u32| Duration::from_secs(u64::from(s));
        Self {
            tcp_syn: seconds(socklb_abi::CT_TIMEOUT_SYN_S),
            tcp_established: seconds(socklb_abi::CT_TIMEOUT_TCP_S),
            tcp_close: seconds(socklb_abi::CT_TIMEOUT_CLOSING_S),
            udp: seconds(socklb_abi::CT_TIMEOUT_OTHER_S),
        }
    }
}

/// Whole seconds, at least 1 (0 would mean "the default" to the programs).
fn timeout_seconds(timeout: Duration) -> u32 {
    u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).max(1)
}

/// The loaded datapath: programs verified by the kernel, maps pinned, and the writer that
/// owns the service and backend maps.
pub struct Dataplane {
    ebpf: Ebpf,
    writer: Writer<KernelMaps>,
    source_ranges: SourceRangeWriter,
    maglev: MaglevWriter,
    names: NamesWriter,
    counters: PerCpuArray<MapData, Counters>,
    /// How many sockets hold a record, kept by the programs.
    socket_records: Array<MapData, SocketRecordCount>,
    node: Array<MapData, NodeConfig>,
    /// This node's IPv6 settings, when the object has the map (the IPv6 TC programs).
    node6: Option<Array<MapData, NodeConfig6>>,
    /// The cgroup v2 directory the programs attach to.
    cgroup: PathBuf,
    config: Config,
    /// Sizes of the growable maps now.
    sizes: sizing::Sizes,
    /// After a failed growth: when to try again.
    growth_retry_at: Option<std::time::Instant>,
    /// The object loaded (its kfunc call patched), for loading it again when maps grow.
    object: std::borrow::Cow<'static, [u8]>,
    /// The socket iterators, until the sweeper takes them, or why there are none.
    destroy: Option<Result<DestroyPrograms, DestroyUnavailable>>,
    /// Pairs whose backend a failed sync removed: swept after the next sync that succeeds.
    unswept: Vec<Gone>,
}

impl Dataplane {
    /// Loads the programs and adopts (or creates) the pinned maps. Nothing is attached: call
    /// [`Self::apply`] first and then [`Self::attach`], so that the programs never run
    /// against maps that are not programmed yet.
    pub fn load(config: Config) -> Result<Self, DataplaneError> {
        // Resolved and checked now, so that a bad path fails before anything is touched.
        let cgroup = match &config.cgroup {
            Some(path) => path.clone(),
            None => host::cgroup2_mount()?,
        };
        host::check_cgroup2(&cgroup)?;
        let pin_dir_existed = config.pin_dir.exists();
        host::prepare_pin_dir(&config.pin_dir)?;
        let kfunc = destroy::kfunc_id();
        let (object, kfunc) =
            match destroy::patch_kfunc_call(object::OBJECT, kfunc.as_ref().ok().map(|(_, id)| *id))
            {
                Ok(object) => (object, kfunc),
                Err(error) => (std::borrow::Cow::Borrowed(object::OBJECT), Err(error)),
            };
        let loader::Loaded {
            mut ebpf,
            replaced_masters,
            sizes,
        } = loader::load(
            &config.pin_dir,
            &config.capacities,
            config.program_settings(),
            &object,
        )
        .map_err(|error| {
            // The loader unpinned its maps; the directory goes too if this load made it.
            if !pin_dir_existed {
                let _ = std::fs::remove_dir(&config.pin_dir);
            }
            DataplaneError::from(error).explain_refusal()
        })?;
        carry_over(&config.pin_dir, "at load");
        let kernel_maps = KernelMaps::new(RawMaps {
            services: take_map(&mut ebpf, map_names::SERVICES)?,
            backends: take_map(&mut ebpf, map_names::BACKENDS)?,
            services6: take_map(&mut ebpf, map_names::SERVICES6)?,
            backends6: take_map(&mut ebpf, map_names::BACKENDS6)?,
        })
        .map_err(|source| DataplaneError::Map {
            name: map_names::SERVICES,
            source,
        })?;
        let counters = take_map(&mut ebpf, map_names::COUNTERS)?
            .try_into()
            .map_err(|source| DataplaneError::Map {
                name: map_names::COUNTERS,
                source,
            })?;
        let socket_records = take_map(&mut ebpf, map_names::SOCKET_RECORD_COUNT)?
            .try_into()
            .map_err(|source| DataplaneError::Map {
                name: map_names::SOCKET_RECORD_COUNT,
                source,
            })?;
        let source_ranges = SourceRangeWriter::adopt(
            take_trie(&mut ebpf, map_names::SOURCE_RANGES)?,
            take_trie(&mut ebpf, map_names::SOURCE_RANGES6)?,
            config.capacities.source_ranges,
        )
        .map_err(|source| DataplaneError::Map {
            name: map_names::SOURCE_RANGES,
            source,
        })?;
        let maglev = take_map(&mut ebpf, map_names::MAGLEV)?
            .try_into()
            .and_then(|map| MaglevWriter::adopt(map, config.maglev_table_size))
            .map_err(|source| DataplaneError::Map {
                name: map_names::MAGLEV,
                source,
            })?;
        let names = take_map(&mut ebpf, map_names::NAMES)?
            .try_into()
            .and_then(NamesWriter::adopt)
            .map_err(|source| DataplaneError::Map {
                name: map_names::NAMES,
                source,
            })?;
        let node = take_map(&mut ebpf, map_names::NODE)?
            .try_into()
            .map_err(|source| DataplaneError::Map {
                name: map_names::NODE,
                source,
            })?;
        let node6 = ebpf
            .take_map(map_names::NODE6)
            .map(Array::try_from)
            .transpose()
            .map_err(|source| DataplaneError::Map {
                name: map_names::NODE6,
                source,
            })?;
        let contents = kernel_maps.read().map_err(|source| DataplaneError::Map {
            name: map_names::SERVICES,
            source,
        })?;
        let destroy = kfunc.and_then(|(btf, _)| destroy::load(&mut ebpf, &btf));
        let adopted = contents.services.len();
        let capacity = Capacity {
            service_entries: sizes.services,
            backends: sizes.backends,
        };
        let mut writer = Writer::adopt(kernel_maps, capacity, contents);
        writer.prefer(
            replaced_masters
                .iter()
                .filter_map(|key| Some(self::maps::decode_key4(key)?.frontend)),
        );
        info!(
            pin_dir = %config.pin_dir.display(),
            adopted_service_entries = adopted,
            ?sizes,
            "datapath loaded"
        );
        Ok(Self {
            ebpf,
            writer,
            source_ranges,
            maglev,
            names,
            counters,
            socket_records,
            node,
            node6,
            cgroup,
            config,
            sizes,
            growth_retry_at: None,
            object,
            destroy: Some(destroy),
            unswept: Vec::new(),
        })
    }

    /// The reader of the programs' log lines, taken once (`None` when logging is off).
    pub fn program_logs(&mut self) -> Result<Option<ProgramLogs>, DataplaneError> {
        Ok(ProgramLogs::take(
            &mut self.ebpf,
            self.config.program_log_level,
        )?)
    }

    /// The socket iterators that close the sockets of backends that left, or why they
    /// could not be loaded; once.
    pub fn take_destroy_programs(&mut self) -> Option<Result<DestroyPrograms, DestroyUnavailable>> {
        self.destroy.take()
    }

    /// Backends programmed for local sockets' frontends among `frontends`.
    fn internal_backends<'a>(
        &self,
        frontends: impl Iterator<Item = &'a Frontend>,
    ) -> gone::Programmed {
        frontends
            .filter(|f| f.scope == Scope::Internal)
            .filter_map(|f| Some((*f, self.writer.programmed(f)?.1)))
            .collect()
    }

    /// Makes the maps hold `desired`, writing only the differences. Frontends whose change
    /// does not fit are left as they were and listed in the report.
    pub fn apply(&mut self, desired: &Desired) -> Result<ApplyReport, DataplaneError> {
        let changes = || desired.frontends.iter().map(|(f, spec)| (f, Some(spec)));
        self.make_room(self.writer.demand(changes()), self.maglev.demand(changes()));
        let before = self.internal_backends(self.writer.frontends());
        let result = self.writer.apply(desired);
        let report = self.report_gone(result, &before)?;
        let ranges = self.source_ranges.apply_all(&desired.frontends);
        let rest = self.report_ranges(ranges).and_then(|()| {
            self.apply_maglev(
                desired.frontends.iter().map(|(f, spec)| (f, Some(spec))),
                true,
            )
        });
        self.finish(report, rest)
    }

    /// How many frontends are not programmed as desired now, by outcome, whichever sync
    /// rejected them.
    pub fn rejected_frontends(&self) -> [(Outcome, usize); 3] {
        self.writer.rejected()
    }

    /// Whether entries wait to be deleted by the next apply, which frees their room.
    pub fn has_pending_deletes(&self) -> bool {
        self.writer.has_pending_deletes()
    }

    /// Applies only the given frontends (`None`: remove it), leaving all others alone.
    pub fn apply_changes(
        &mut self,
        changes: &std::collections::BTreeMap<Frontend, Option<&FrontendSpec>>,
    ) -> Result<ApplyReport, DataplaneError> {
        let changed = || changes.iter().map(|(f, spec)| (f, *spec));
        self.make_room(self.writer.demand(changed()), self.maglev.demand(changed()));
        let before = self.internal_backends(changes.keys());
        let result = self.writer.apply_changes(changes);
        let report = self.report_gone(result, &before)?;
        let ranges = self.source_ranges.apply(changes);
        let rest = self
            .report_ranges(ranges)
            .and_then(|()| self.apply_maglev(changes.iter().map(|(f, spec)| (f, *spec)), false));
        self.finish(report, rest)
    }

    /// The Maglev tables of `changes` (of every frontend when `full`).
    fn apply_maglev<'a>(
        &mut self,
        changes: impl IntoIterator<Item = (&'a Frontend, Option<&'a FrontendSpec>)>,
        full: bool,
    ) -> Result<(), DataplaneError> {
        let writer = &self.writer;
        let tables = self.maglev.apply(changes, |f| writer.programmed(f), full);
        self.report_maglev(tables)
    }

    /// The writer's report with the pairs whose backend left since `before`, and those a
    /// failed sync left unswept whose backend has not come back. When the writer failed, the
    /// pairs it removed before failing (seen in the maps read again) wait for the next
    /// sync that succeeds.
    fn report_gone(
        &mut self,
        result: Result<ApplyReport, StoreError>,
        before: &gone::Programmed,
    ) -> Result<ApplyReport, DataplaneError> {
        let result = self.report(result);
        let now = self.internal_backends(before.keys());
        let left = gone::gone(before, &now);
        let Ok(mut report) = result else {
            // Kept for take_unswept.
            self.unswept.extend(left);
            return result;
        };
        let mut pairs: std::collections::BTreeSet<Gone> = left.into_iter().collect();
        pairs.extend(self.take_unswept());
        report.gone = pairs.into_iter().collect();
        Ok(report)
    }

    /// The pairs a failed sync removed from the maps before failing whose backend has not
    /// come back since: their sockets are closed all the same, since the maps no longer lead
    /// there (a sync that keeps failing would otherwise never close them).
    pub fn take_unswept(&mut self) -> Vec<Gone> {
        let unswept = std::mem::take(&mut self.unswept);
        self.still_gone(unswept)
    }

    /// Those of `pairs` whose backend is not programmed for its frontend now.
    pub fn still_gone(&self, pairs: Vec<Gone>) -> Vec<Gone> {
        let now = self.internal_backends(pairs.iter().map(|pair| &pair.frontend));
        gone::still_gone(pairs, &now)
    }

    /// `report` if the rest of the sync (source ranges, Maglev) succeeded; else its gone
    /// pairs are kept for [`Self::take_unswept`].
    fn finish(
        &mut self,
        report: ApplyReport,
        rest: Result<(), DataplaneError>,
    ) -> Result<ApplyReport, DataplaneError> {
        match rest {
            Ok(()) => Ok(report),
            Err(error) => {
                self.unswept.extend(report.gone);
                Err(error)
            }
        }
    }

    /// Records which Service each given frontend belongs to (`None`: gone), for `socklb
    /// inspect`; with `full`, the names of frontends not given are removed.
    pub fn apply_labels(
        &mut self,
        labels: &std::collections::BTreeMap<Frontend, Option<FrontendLabel>>,
        full: bool,
    ) -> Result<(), DataplaneError> {
        let writer = &self.writer;
        let result = self.names.apply(labels, |f| writer.service_id(f), full);
        if let Err(error) = result {
            self.names.readopt().map_err(|source| DataplaneError::Map {
                name: map_names::NAMES,
                source,
            })?;
            return Err(DataplaneError::Names(error));
        }
        Ok(())
    }

    fn report_maglev(&mut self, result: Result<(), MaglevError>) -> Result<(), DataplaneError> {
        if let Err(error) = result {
            self.readopt()?;
            return Err(DataplaneError::Maglev(error));
        }
        Ok(())
    }

    fn report_ranges(
        &mut self,
        result: Result<Vec<SourceRangeError>, SourceRangeError>,
    ) -> Result<(), DataplaneError> {
        match result {
            Ok(rejected) => {
                for error in rejected {
                    warn!(%error, "source ranges not programmed");
                }
                Ok(())
            }
            Err(error) => {
                self.readopt()?;
                Err(DataplaneError::SourceRanges(error))
            }
        }
    }

    fn report(
        &mut self,
        result: Result<ApplyReport, StoreError>,
    ) -> Result<ApplyReport, DataplaneError> {
        match result {
            // The caller logs the rejected frontends (only their changes).
            Ok(report) => Ok(report),
            Err(error) => {
                self.readopt()?;
                Err(DataplaneError::Write(error))
            }
        }
    }

    /// Entries in use, capacity now and the capacity they may grow to, of the maps the
    /// agent fills, for metrics.
    pub fn usage(&self) -> [MapUsage; 6] {
        let bounds = &self.config.capacities;
        let usage = |map, entries, capacity, max_entries| MapUsage {
            map,
            entries,
            capacity,
            max_entries,
        };
        [
            usage(
                map_names::SERVICES,
                self.writer.service_entries(),
                self.sizes.services,
                bounds.service_entries,
            ),
            usage(
                map_names::BACKENDS,
                self.writer.backend_entries(),
                self.sizes.backends,
                bounds.backends,
            ),
            usage(
                map_names::SOURCE_RANGES,
                self.source_ranges.entries().0,
                bounds.source_ranges,
                bounds.source_ranges,
            ),
            usage(
                map_names::SOURCE_RANGES6,
                self.source_ranges.entries().1,
                bounds.source_ranges,
                bounds.source_ranges,
            ),
            usage(
                map_names::MAGLEV,
                self.maglev.entries(),
                self.sizes.maglev,
                bounds.maglev_entries,
            ),
            // Not a capacity the kernel enforces: the programs stop creating records there.
            usage(
                map_names::SOCKET_RECORDS,
                self.socket_records(),
                bounds.socket_records,
                bounds.socket_records,
            ),
        ]
    }

    /// How many sockets hold a record now (0 if the count cannot be read).
    fn socket_records(&self) -> u32 {
        self.socket_records
            .get(&0, 0)
            .map(|count| u32::try_from(count.live.max(0)).unwrap_or(u32::MAX))
            .unwrap_or(0)
    }

    /// Forgets the writer's mirror and reads the maps again: repairs any drift (entries
    /// changed or removed by hand) at the next apply.
    pub fn readopt(&mut self) -> Result<(), DataplaneError> {
        let contents = self
            .writer
            .store()
            .read()
            .map_err(|source| DataplaneError::Map {
                name: map_names::SERVICES,
                source,
            })?;
        self.writer.readopt(contents);
        self.source_ranges
            .readopt()
            .map_err(|source| DataplaneError::Map {
                name: map_names::SOURCE_RANGES,
                source,
            })?;
        self.maglev
            .readopt()
            .map_err(|source| DataplaneError::Map {
                name: map_names::MAGLEV,
                source,
            })?;
        self.names.readopt().map_err(|source| DataplaneError::Map {
            name: map_names::NAMES,
            source,
        })?;
        Ok(())
    }

    /// Attaches the programs (or replaces those a previous agent left attached). Called
    /// after [`Self::attach_external`]: from here on only these programs run, so the flow
    /// entries of maps replaced with another size are carried over a last time.
    pub fn attach(&mut self) -> Result<Vec<(&'static str, Attachment)>, DataplaneError> {
        let attached = loader::attach(&mut self.ebpf, &self.config.pin_dir, &self.cgroup)
            .map_err(|error| DataplaneError::from(error).explain_refusal())?;
        carry_over(&self.config.pin_dir, "after the programs were swapped");
        carry::finish(&self.config.pin_dir);
        Ok(attached)
    }

    /// Attaches the TC programs to `devices` (or replaces those a previous agent left), and
    /// detaches them from devices no longer listed.
    pub fn attach_external(
        &mut self,
        devices: &[String],
        mode: TcMode,
    ) -> Result<Vec<(String, Attachment)>, DataplaneError> {
        tc::attach(&mut self.ebpf, &self.config.pin_dir, devices, mode)
            .map_err(|error| DataplaneError::Tc(Box::new(error)).explain_refusal())
    }

    /// Tells the TC programs this node's SNAT address and ports; written only on change.
    pub fn set_node(&mut self, settings: &NodeSettings) -> Result<(), DataplaneError> {
        let wanted = NodeConfig {
            snat_address: settings.snat_address.map_or(0, |a| u32::from(a).to_be()),
            snat_port_min: *settings.snat_ports.start(),
            snat_port_max: *settings.snat_ports.end(),
            maglev_table_size: self.config.maglev_table_size,
            ct_timeout_syn_s: timeout_seconds(settings.conntrack_timeouts.tcp_syn),
            ct_timeout_established_s: timeout_seconds(settings.conntrack_timeouts.tcp_established),
            ct_timeout_closing_s: timeout_seconds(settings.conntrack_timeouts.tcp_close),
            ct_timeout_udp_s: timeout_seconds(settings.conntrack_timeouts.udp),
        };
        let map_error = |source| DataplaneError::Map {
            name: map_names::NODE,
            source,
        };
        if self.node.get(&0, 0).map_err(map_error)? != wanted {
            self.node.set(0, &wanted, 0).map_err(map_error)?;
            info!(
                snat_address = ?settings.snat_address,
                snat_ports = ?settings.snat_ports,
                conntrack_timeouts = ?settings.conntrack_timeouts,
                "node settings for traffic from outside written"
            );
        }
        if let Some(node6) = &mut self.node6 {
            let wanted = NodeConfig6 {
                snat_address: settings
                    .snat_address6
                    .map_or([0; 4], |a| socklb_abi::ipv6_words(a.octets())),
            };
            let map_error = |source| DataplaneError::Map {
                name: map_names::NODE6,
                source,
            };
            if node6.get(&0, 0).map_err(map_error)? != wanted {
                node6.set(0, &wanted, 0).map_err(map_error)?;
                info!(
                    snat_address6 = ?settings.snat_address6,
                    "IPv6 node settings for traffic from outside written"
                );
            }
        }
        Ok(())
    }

    /// The kernel programs' counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters, DataplaneError> {
        let per_cpu = self
            .counters
            .get(&0, 0)
            .map_err(|source| DataplaneError::Map {
                name: map_names::COUNTERS,
                source,
            })?;
        Ok(Counters::sum(per_cpu.iter()))
    }

    pub fn pin_dir(&self) -> &Path {
        &self.config.pin_dir
    }
}

/// Copies the entries of the maps a load replaced with another size into their new maps
/// (see `carry`). A failure is logged: the flows it misses are reset, as they would be
/// without the copy, and the agent serves on.
fn carry_over(pin_dir: &Path, when: &str) {
    match carry::copy(pin_dir) {
        Ok(0) => {}
        Ok(entries) => info!(
            entries,
            when, "conntrack and affinity entries carried over into the resized maps"
        ),
        Err(error) => warn!(
            error = %crate::error_chain(&error),
            when,
            "cannot carry conntrack and affinity entries over into the resized maps: the \
             flows they held start anew (SNATed flows from outside are reset)"
        ),
    }
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, LoadError> {
    ebpf.take_map(name).ok_or(LoadError::MissingMap(name))
}

/// A source-range trie of either family.
fn take_trie<K: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<aya::maps::LpmTrie<MapData, K, socklb_abi::SourceVerdict>, DataplaneError> {
    take_map(ebpf, name)?
        .try_into()
        .map_err(|source| DataplaneError::Map { name, source })
}

#[cfg(test)]
mod tests {
    use super::Capacities;

    #[test]
    fn the_socket_ring_is_the_reverse_capacity_rounded_up_to_a_power_of_two() {
        // (--max-reverse-entries, ring slots)
        let rows = [
            (0, 1),
            (1, 1),
            (3, 4),
            (16_384, 16_384),
            (262_145, 524_288),
            (u32::MAX, 1 << 31),
        ];
        for (reverse, slots) in rows {
            let capacities = Capacities {
                reverse,
                ..Capacities::default()
            };
            assert_eq!(capacities.socket_slots(), slots, "reverse = {reverse}");
        }
    }
}
