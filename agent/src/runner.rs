//! The sync loop: source events -> cluster state -> selection -> the maps, at a bounded
//! frequency.
//!
//! - Changes are coalesced: a sync runs at most every `min_sync_period`, and programs only
//!   the frontends of the Services that changed.
//! - Every `sync_period` a resync verifies a bounded part of the service and backend maps
//!   against what the agent wrote and writes back what drifted (an entry changed or deleted
//!   by hand), and walks on through the maps for entries the agent never wrote, which the
//!   next sync deletes: a pass over every entry takes as many resyncs as the maps hold
//!   budgets.
//! - Every `full_sync_period` (an hour, as kube-proxy's full sync), a full resync selects
//!   the backends of every Service again and programs those that differ from what was
//!   written (which only a missed change could make), without reading the large maps back.
//! - Nothing is programmed before every kind (Services, EndpointSlices, Nodes) has been
//!   listed once: a Service without its endpoints yet would refuse connections.
//! - The programs are attached after that first full sync, so they never run on maps that
//!   are not programmed (an agent restart keeps the old programs until then).
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    ops::RangeInclusive,
    sync::Arc,
    time::{Duration, SystemTime},
};

use k8s_openapi::jiff::Timestamp;
use tokio::{sync::mpsc, time::Instant};
use tracing::{debug, error, info, info_span, warn};

use crate::{
    dataplane::{
        self, ConntrackTimeouts, Dataplane, DataplaneError, Frontend, FrontendLabel, FrontendSpec,
        Gone, NodeSettings, PodDevices, Rejected, TcMode, local_addresses,
    },
    frontends::FrontendTable,
    health_check::{self, HealthChecks},
    metrics::{FrontendLabels, MapLabels, Metrics, ReasonLabels},
    pod_namespaces::PodNamespaces,
    select::{Family, FrontendKind, ServiceName, SkipReason, SkippedPart, socket_path::SocketPath},
    server::Health,
    source::{Event, Kind, Object},
    state::{ClusterState, convert},
    sweep::Sweeper,
    tc_devices::TcDevices,
};

/// The next change of links, or never when they are not watched.
async fn link_changed(changes: &mut Option<mpsc::Receiver<()>>) -> Option<()> {
    match changes {
        Some(changes) => changes.recv().await,
        None => std::future::pending().await,
    }
}

/// How long the events of the first lists gather between two takes.
const LIST_BATCH: Duration = Duration::from_millis(1);

/// How soon a failed sync is retried (as a full sync).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How soon a pod's network namespace found without an address is read again.
const ADDRESS_RECHECK: Duration = Duration::from_millis(500);

/// Entries each resync reads back to verify them: 20-40 ms of lookups (1-2 µs each). At
/// 30,000 a resync of 100,000 Services cost 92-98 ms of CPU, at the edge of its 100 ms; a
/// pass over their two million entries now takes about 105 resyncs (53 minutes).
const VERIFY_BUDGET: usize = 20_000;

/// Entries each resync walks through in the maps' own order, for those the agent did not
/// write: 10-20 ms of batch reads.
const WALK_BUDGET: usize = 40_000;

/// EndpointSlice annotation: when the change that produced this slice version happened.
const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Settings for traffic from outside the node (the TC programs).
#[derive(Clone, Debug)]
pub struct ExternalTraffic {
    /// Devices to attach to; empty means the devices that hold this Node's addresses.
    pub devices: Vec<String>,
    pub mode: TcMode,
    pub snat_ports: RangeInclusive<u16>,
    pub conntrack_timeouts: ConntrackTimeouts,
}

impl Default for ExternalTraffic {
    fn default() -> Self {
        Self {
            devices: Vec::new(),
            mode: TcMode::Auto,
            // Above Linux's default ephemeral range (32768-60999).
            snat_ports: 61000..=65535,
            conntrack_timeouts: ConntrackTimeouts::default(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct SyncPeriods {
    /// Least time between two syncs: bursts of changes are programmed together.
    pub min: Duration,
    /// Time between two resyncs, each verifying a part of the maps.
    pub resync: Duration,
    /// Time between two full resyncs, which select every Service's backends again.
    pub full: Duration,
}

/// What a sync does beyond programming the changed Services.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SyncKind {
    /// Only the changes.
    Changes,
    /// The changes, then a part of the maps read back and what drifted written back.
    Verify,
    /// Every Service selected again, and what differs from the maps applied.
    Full,
}

pub struct Runner {
    state: ClusterState,
    table: FrontendTable,
    dataplane: Dataplane,
    periods: SyncPeriods,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    /// Kinds listed at least once.
    listed: HashSet<Kind>,
    /// Earliest trigger time of the EndpointSlice changes not yet programmed, per Service.
    triggers: BTreeMap<ServiceName, SystemTime>,
    attached: bool,
    external: ExternalTraffic,
    /// The devices the TC programs serve.
    tc_devices: TcDevices,
    /// Says when links came or went (pod devices to serve); `None`: not watched.
    link_changes: Option<mpsc::Receiver<()>>,
    /// The pods' namespaces the socket hooks serve (`--socket-lb-scope pods`); `None`:
    /// another scope.
    pod_namespaces: Option<PodNamespaces>,
    /// The pods whose sockets the socket hooks leave alone, and why, as last logged.
    per_packet_pods: BTreeMap<String, SocketPath>,
    /// Pods the per-packet path would serve, kept on the socket path (said when it changes).
    unserved_pods: BTreeMap<String, SocketPath>,
    /// Those whose addresses no pinned namespace holds, as last logged.
    unfound_pods: BTreeMap<String, SocketPath>,
    /// Under a scope other than `pods`: the pods' namespaces' map was emptied.
    stale_namespaces_cleared: bool,
    /// The SNAT addresses last programmed, per family (`None`: not yet), to log only their
    /// changes.
    snat_addresses: Option<(Option<Ipv4Addr>, Option<Ipv6Addr>)>,
    /// What was last logged as not served, per Service, to log only its changes.
    logged_skips: HashMap<ServiceName, Vec<SkippedPart>>,
    /// The healthCheckNodePorts, brought in line with the selections after every sync.
    health_checks: HealthChecks,
    /// Frontends the last sync could not program as desired: retried by every sync, logged
    /// when they are first rejected and when they are programmed at last.
    rejected: BTreeSet<Frontend>,
    /// The last sync rejected frontends while entries wait to be deleted by the next apply:
    /// a sync soon frees that room and retries them.
    retry_soon: bool,
    /// Closes the sockets of the backends each sync removed.
    sweeper: Option<Sweeper>,
    /// The pairs the last sync swept, swept again by the next one (see `sync`).
    recheck: Vec<Gone>,
}

impl Runner {
    pub fn new(
        node_name: &str,
        dataplane: Dataplane,
        periods: SyncPeriods,
        health: Arc<Health>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            state: ClusterState::new(node_name),
            table: FrontendTable::default(),
            dataplane,
            periods,
            listed: HashSet::new(),
            triggers: BTreeMap::new(),
            attached: false,
            external: ExternalTraffic::default(),
            tc_devices: TcDevices::new(Vec::new(), PodDevices::None, TcMode::Auto),
            link_changes: None,
            pod_namespaces: None,
            per_packet_pods: BTreeMap::new(),
            unserved_pods: BTreeMap::new(),
            unfound_pods: BTreeMap::new(),
            stale_namespaces_cleared: false,
            snat_addresses: None,
            logged_skips: HashMap::new(),
            rejected: BTreeSet::new(),
            retry_soon: false,
            sweeper: None,
            recheck: Vec::new(),
            health_checks: HealthChecks::new(
                std::net::Ipv4Addr::UNSPECIFIED.into(),
                health.clone(),
                metrics.clone(),
            ),
            health,
            metrics,
        }
    }

    pub fn with_external(mut self, external: ExternalTraffic) -> Self {
        self.tc_devices = TcDevices::new(external.devices.clone(), PodDevices::None, external.mode);
        self.external = external;
        self
    }

    /// Keeps the socket hooks' list of pods' namespaces (`--socket-lb-scope pods`) in line
    /// with the namespaces pinned on the node, at every sync and as links come and go.
    pub fn with_pod_namespaces(mut self) -> Self {
        self.pod_namespaces = Some(PodNamespaces::default());
        self
    }

    /// Serves the workloads' devices with the per-packet path, picked up as links come and
    /// go (else at every sync). After [`Self::with_external`].
    pub fn with_pod_devices(mut self, pods: PodDevices) -> Self {
        if pods != PodDevices::None {
            self.link_changes = match dataplane::watch_links() {
                Ok(changes) => Some(changes),
                Err(error) => {
                    warn!(%error, "cannot watch the network devices: new pod devices are picked up at the next sync");
                    None
                }
            };
        }
        self.tc_devices = TcDevices::new(self.external.devices.clone(), pods, self.external.mode);
        self
    }

    pub fn with_sweeper(mut self, sweeper: Sweeper) -> Self {
        self.sweeper = Some(sweeper);
        self
    }

    /// The first sync waits for these lists: under `--socket-lb-scope pods` this node's
    /// pods and the Namespaces too, so that ready means both paths serve the pods as they
    /// will (a pod's first connections are not left to the per-packet path by a start).
    fn initial_lists_done(&self) -> bool {
        let workloads: &[Kind] = if self.pod_namespaces.is_some() {
            &[Kind::Pod, Kind::Namespace]
        } else {
            &[]
        };
        [Kind::Service, Kind::EndpointSlice, Kind::Node]
            .iter()
            .chain(workloads)
            .all(|kind| self.listed.contains(kind))
    }

    /// Runs until `events` closes (the source stopped) or `shutdown` completes; returns
    /// whether it attached the programs (a stop before the first full sync does not).
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<bool, DataplaneError> {
        tokio::pin!(shutdown);
        let mut drops = crate::drops::Drops::default();
        let mut check_drops = tokio::time::interval(crate::drops::CHECK_EVERY);
        check_drops.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sync: Option<Instant> = None;
        let mut next_full = Instant::now();
        let mut next_resync = Instant::now() + self.periods.resync;
        loop {
            let ready = self.initial_lists_done();
            let now = Instant::now();
            let deadline = if !ready {
                now + Duration::from_secs(3600)
            } else if !self.attached {
                // The first full sync, or its retry.
                next_full
            } else if now >= next_full.min(next_resync) {
                now
            } else if self.state.has_changes() || self.retry_soon {
                last_sync.map_or(now, |at| at + self.periods.min)
            } else {
                next_full.min(next_resync)
            };
            tokio::select! {
                () = &mut shutdown => return Ok(self.attached),
                _ = check_drops.tick() => {
                    if let Ok(counters) = self.dataplane.counters() {
                        for warning in drops.observe(std::time::Instant::now(), counters) {
                            warn!("{warning}");
                        }
                    }
                }
                event = events.recv() => {
                    let Some(event) = event else { return Ok(self.attached) };
                    self.receive(event);
                    // Whatever else is already queued joins this sync.
                    while let Ok(event) = events.try_recv() {
                        self.receive(event);
                    }
                    if !ready {
                        // The first lists come as fast as the source decodes them: taken a
                        // batch at a time rather than woken for each object, which cost a
                        // fifth of the CPU of 100,000 Services' lists.
                        tokio::time::sleep(LIST_BATCH).await;
                    }
                }
                () = tokio::time::sleep(ADDRESS_RECHECK), if self.pod_namespaces.as_ref().is_some_and(PodNamespaces::waiting) => {
                    if let Err(error) = self.program_pod_namespaces() {
                        warn!(error = %crate::error_chain(&error), "the pods' namespaces stay as they were until the next sync");
                    }
                }
                Some(()) = link_changed(&mut self.link_changes) => {
                    // A pod's device comes with its namespace, before its containers start:
                    // served first, so that its pod can leave the socket hooks.
                    if self.attached {
                        self.program_devices();
                    }
                    if let Err(error) = self.program_pod_namespaces() {
                        warn!(error = %crate::error_chain(&error), "the pods' namespaces stay as they were until the next sync");
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    let now = Instant::now();
                    let kind = if !self.attached || now >= next_full {
                        SyncKind::Full
                    } else if now >= next_resync {
                        SyncKind::Verify
                    } else {
                        SyncKind::Changes
                    };
                    let programmed = self.sync(kind)?;
                    let now = Instant::now();
                    last_sync = Some(now);
                    if !programmed {
                        // The failed part was re-read; a full sync retries everything soon.
                        next_full = now + RETRY_AFTER.min(self.periods.resync);
                    } else if kind == SyncKind::Full {
                        next_full = now + self.periods.full;
                        next_resync = now + self.periods.resync;
                    } else if kind == SyncKind::Verify {
                        next_resync = now + self.periods.resync;
                    }
                }
            }
        }
    }

    fn receive(&mut self, event: Event) {
        if let Some(kind) = event.listed() {
            self.listed.insert(kind);
        }
        if let Event::Applied(Object::EndpointSlice(slice)) = &event {
            self.note_trigger(slice);
        }
        let before = self.state.pending_events();
        self.state.apply(event);
        if self.state.has_changes() {
            self.health.queued();
        }
        let (services, endpoints) = self.state.pending_events();
        self.metrics.service_changes.inc_by(services - before.0);
        self.metrics.endpoint_changes.inc_by(endpoints - before.1);
        self.metrics
            .service_changes_pending
            .set(i64::try_from(services).unwrap_or(i64::MAX));
        self.metrics
            .endpoint_changes_pending
            .set(i64::try_from(endpoints).unwrap_or(i64::MAX));
    }

    fn note_trigger(&mut self, slice: &k8s_openapi::api::discovery::v1::EndpointSlice) {
        let Some(owner) = convert::slice_owner(slice) else {
            return;
        };
        let trigger = slice
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TRIGGER_TIME_ANNOTATION))
            .and_then(|text| text.parse::<Timestamp>().ok())
            .map(SystemTime::from);
        if let Some(trigger) = trigger {
            let earliest = self.triggers.entry(owner).or_insert(trigger);
            *earliest = (*earliest).min(trigger);
        }
    }

    /// Programs the changed Services (for [`SyncKind::Full`], every frontend that differs
    /// from what was written; for [`SyncKind::Verify`], then verifies a part of the maps).
    /// Returns whether the maps were written; errors are only those that stop the agent.
    fn sync(&mut self, kind: SyncKind) -> Result<bool, DataplaneError> {
        let full = kind == SyncKind::Full;
        let started = std::time::Instant::now();
        let changes = self.state.take_changes();
        let mut touched: BTreeSet<Frontend> = BTreeSet::new();
        let names: Vec<&ServiceName> = changes.services.iter().collect();
        let selections = self.state.select_each(&names);
        for (name, selection) in names.into_iter().zip(selections) {
            let skipped: Vec<SkippedPart> = match (&selection, self.state.skip_reason(name)) {
                (Some(selection), _) => selection.skipped.clone(),
                (None, Some(reason)) => vec![SkippedPart {
                    part: "service".to_owned(),
                    reason: reason.clone(),
                }],
                (None, None) => Vec::new(),
            };
            self.log_skips(name, skipped);
            touched.extend(self.table.update(name, selection));
        }

        // What did not fit last time is tried again: removals may have made room.
        touched.extend(self.rejected.iter().copied());
        let report = if full {
            let desired = self.table.desired();
            if self.attached {
                self.dataplane.apply_drifted(&desired)
            } else {
                self.dataplane.apply_first(&desired)?
            }
        } else {
            let specs: BTreeMap<Frontend, Option<&FrontendSpec>> = touched
                .iter()
                .map(|frontend| (*frontend, self.table.spec(frontend)))
                .collect();
            self.dataplane.apply_changes(&specs)
        };
        let report = match report {
            Ok(report) => report,
            Err(error) => {
                warn!(error = %crate::error_chain(&error), "sync failed; retrying with a full sync");
                // Backends it removed before failing are gone from the maps all the same.
                let unswept = self.dataplane.take_unswept();
                if let Some(sweeper) = &self.sweeper
                    && !unswept.is_empty()
                {
                    sweeper.sweep(&unswept, |queued| self.dataplane.still_gone(queued));
                }
                return Ok(false);
            }
        };
        if kind == SyncKind::Verify {
            if let Err(error) = self.verify_maps() {
                warn!(error = %crate::error_chain(&error), "resync failed; retrying with a full sync");
                return Ok(false);
            }
            self.check_attached();
        }
        // The maps no longer lead to the backends that left: their sockets can go. The last
        // sync's pairs go once more: a connect() that read a slot just before that sync
        // wrote its socket's record after the sweep had passed.
        if let Some(sweeper) = &self.sweeper {
            let recheck = self.dataplane.still_gone(std::mem::take(&mut self.recheck));
            let pairs: BTreeSet<Gone> = report.gone.iter().copied().chain(recheck).collect();
            // Queued pairs whose backend this sync brought back are dropped.
            let pairs: Vec<Gone> = pairs.into_iter().collect();
            sweeper.sweep(&pairs, |queued| self.dataplane.still_gone(queued));
            self.recheck.clone_from(&report.gone);
        }
        // Every sync: a change of this Node's addresses marks every Service, so it is
        // applied by the next incremental sync; a device change, by the next sync of any kind.
        match self.program_external() {
            // At start, a device that cannot be served is a configuration error.
            Err(error) if !self.attached => return Err(error),
            Err(error) => warn!(
                error = %crate::error_chain(&error),
                "traffic from outside: the TC programs stay as they were"
            ),
            Ok(()) => {}
        }
        // After the devices: a pod leaves the socket hooks only for a device that serves it.
        if let Err(error) = self.program_pod_namespaces() {
            warn!(
                error = %crate::error_chain(&error),
                "the pods' namespaces in the socket hooks' scope stay as they were: new pods are \
                 served per packet until a sync writes them"
            );
        }
        let attaching = !self.attached;
        if attaching {
            self.dataplane.attach()?;
            self.attached = true;
            self.health.set_ready();
            info!("programs attached; the node serves every Service programmed");
        }
        // Display only, so written once the node serves: naming 100,000 frontends takes
        // about 0.3 s. The log line comes after, for whoever reads the names at once.
        self.name_frontends(if full { None } else { Some(&touched) });
        if attaching {
            info!("datapath attached; ready");
        }
        self.health.updated();
        if kind != SyncKind::Changes || !changes.services.is_empty() {
            // Also retries the ports that could not be bound before.
            let (wanted, conflicts) = health_check::desired(self.table.health_checked());
            self.health_checks.sync(&wanted, &conflicts);
        }

        let elapsed = started.elapsed();
        self.metrics.sync_duration.observe(elapsed.as_secs_f64());
        self.metrics.last_sync_timestamp.set(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        let now = SystemTime::now();
        for name in &changes.services {
            if let Some(trigger) = self.triggers.remove(name)
                && let Ok(latency) = now.duration_since(trigger)
            {
                self.metrics
                    .network_programming
                    .observe(latency.as_secs_f64());
            }
        }
        self.record();
        self.log_rejections(&report.rejected);
        self.retry_soon = !self.rejected.is_empty() && self.dataplane.has_pending_deletes();
        if full || !changes.services.is_empty() {
            info!(
                full,
                services = changes.services.len(),
                writes = report.writes,
                rejected = report.rejected.len(),
                took = ?elapsed,
                "synced"
            );
        }
        Ok(true)
    }

    /// Socket programs detached behind the agent's back (their link pins removed) leave the
    /// node unready and unhealthy, so that a restart attaches them again: said as an error
    /// when found.
    fn check_attached(&self) {
        let detached = self.dataplane.detached();
        if !detached.is_empty() && !self.health.is_detached() {
            error!(
                programs = %crate::listed(&detached),
                pin_dir = %self.dataplane.pin_dir().display(),
                "socket programs detached behind the agent's back (their link pins were \
                 removed): this node's sockets reach no Service; /healthz and /readyz fail \
                 until the agent is restarted, which attaches them again"
            );
        }
        self.health.set_detached(!detached.is_empty());
    }

    /// Reads a part of the service and backend maps back and writes back what drifted.
    fn verify_maps(&mut self) -> Result<(), DataplaneError> {
        let started = std::time::Instant::now();
        let (verified, extras) = self.dataplane.verify(VERIFY_BUDGET, WALK_BUDGET)?;
        if extras.found > 0 {
            self.metrics
                .map_entries_removed
                .inc_by(u64::try_from(extras.found).unwrap_or(u64::MAX));
            warn!(
                entries = extras.found,
                "service or backend map entries this agent did not write were found (added \
                 by hand, with bpftool?): the next sync deletes them"
            );
        }
        if verified.restored > 0 {
            self.metrics
                .map_entries_restored
                .inc_by(u64::try_from(verified.restored).unwrap_or(u64::MAX));
            warn!(
                entries = verified.restored,
                "service or backend map entries were deleted or changed behind the agent's \
                 back (by hand, with bpftool?): written back"
            );
        }
        info!(
            read = verified.read,
            restored = verified.restored,
            pass_done = verified.pass_done,
            walked = extras.read,
            found = extras.found,
            walk_done = extras.pass_done,
            took = ?started.elapsed(),
            "maps verified"
        );
        Ok(())
    }

    /// Logs the frontends rejected for the first time (a few by name, the rest counted) and
    /// those programmed after they were rejected; the `socklb_rejected_frontends` metric has
    /// the current count (from the dataplane's writer).
    fn log_rejections(&mut self, rejected: &[Rejected]) {
        const NAMED: usize = 10;
        let now: BTreeSet<Frontend> = rejected.iter().map(Rejected::frontend).collect();
        let new: Vec<&Rejected> = rejected
            .iter()
            .filter(|r| !self.rejected.contains(&r.frontend()))
            .collect();
        for rejected in new.iter().take(NAMED) {
            let service = self
                .table
                .owner(&rejected.frontend())
                .map_or_else(|| "?".to_owned(), ToString::to_string);
            warn!(%service, error = %rejected, "frontend not programmed");
        }
        if new.len() > NAMED {
            warn!(
                more = new.len() - NAMED,
                "more frontends not programmed, for the same reasons (metric \
                 socklb_rejected_frontends)"
            );
        }
        self.log_short_of_room(rejected, !new.is_empty());
        // Those no Service claims any more were not programmed: they are gone.
        let programmed = self
            .rejected
            .difference(&now)
            .filter(|frontend| self.table.owner(frontend).is_some())
            .count();
        if programmed > 0 {
            info!(
                frontends = programmed,
                "frontends programmed after they were rejected"
            );
        }
        self.rejected = now;
    }

    /// The frontends left out because a map is full at its bound: said once as an error
    /// with the flags to raise whenever more are left out (`grew`), and kept off /readyz.
    fn log_short_of_room(&self, rejected: &[Rejected], grew: bool) {
        let flags: Vec<&str> = rejected
            .iter()
            .filter_map(|rejected| match rejected {
                Rejected::MapFull { flag, .. } => Some(*flag),
                Rejected::TooManyBackends { .. } => None,
            })
            .collect();
        let short = flags.len();
        let flags: BTreeSet<&str> = flags.into_iter().collect();
        self.health.set_short_of_room(short);
        if short > 0 && grew {
            error!(
                frontends = short,
                raise = %crate::listed(&flags),
                "Service frontends are not programmed: the maps are full at their bounds; raise \
                 these flags (the node is not ready until they fit)"
            );
        }
    }

    /// Records which Service each frontend belongs to, for `socklb inspect`: the `touched`
    /// ones, or (`None`) all of them. Display only: a failure is logged, never fatal.
    fn name_frontends(&mut self, touched: Option<&BTreeSet<Frontend>>) {
        let table = &self.table;
        let label = |frontend: &Frontend| {
            let choice = table.choice(frontend)?;
            let owner = table.owner(frontend)?;
            Some(FrontendLabel {
                namespace: owner.namespace.clone(),
                name: owner.name.clone(),
                port: choice.port_name.clone(),
                kind: match choice.kind {
                    FrontendKind::ClusterIp => "cluster-ip",
                    FrontendKind::NodePort => "node-port",
                    FrontendKind::ExternalIp => "external-ip",
                    FrontendKind::LoadBalancer => "load-balancer",
                },
            })
        };
        let labelled = |frontend: &Frontend| (*frontend, label(frontend));
        let result = match touched {
            Some(touched) => self
                .dataplane
                .apply_labels(touched.iter().map(labelled), false),
            None => self
                .dataplane
                .apply_labels(table.frontends().map(labelled), true),
        };
        if let Err(error) = result {
            warn!(error = %crate::error_chain(&error), "frontend names not written (display only)");
        }
    }

    /// One log line per part of a Service that is not served, when that changes (not at
    /// every change of its endpoints): a warning for an invalid field, else info, or debug
    /// for what is skipped by design (ExternalName, headless, another proxy's).
    fn log_skips(&mut self, name: &ServiceName, skipped: Vec<SkippedPart>) {
        if self
            .logged_skips
            .get(name)
            .map_or(skipped.is_empty(), |l| *l == skipped)
        {
            return;
        }
        // Only here: a span per Service of every sync took a tenth of a full sync.
        let _span = info_span!("service", service = %name).entered();
        for SkippedPart { part, reason } in &skipped {
            match reason {
                SkipReason::Invalid(_) => warn!(part, %reason, "not served"),
                SkipReason::ExternalName | SkipReason::Headless | SkipReason::OtherProxy => {
                    debug!(part, %reason, "not served")
                }
                _ => info!(part, %reason, "not served"),
            }
        }
        if skipped.is_empty() {
            self.logged_skips.remove(name);
        } else {
            self.logged_skips.insert(name.clone(), skipped);
        }
    }

    /// The socket hooks' pods' namespaces, found again (`--socket-lb-scope pods`), but those
    /// of the pods the per-packet path serves (meshed, or opted out) on a device of theirs
    /// that carries its programs: a pod whose device is not served keeps the socket path.
    fn program_pod_namespaces(&mut self) -> Result<(), DataplaneError> {
        self.state.take_workloads_changed();
        let Some(namespaces) = &mut self.pod_namespaces else {
            // Another scope reads no list: one a `pods` agent left would only mislead
            // `socklb inspect`.
            if !self.stale_namespaces_cleared {
                self.dataplane.set_socket_lb_namespaces(&BTreeSet::new())?;
                self.stale_namespaces_cleared = true;
            }
            return Ok(());
        };
        // Until this node's pods and the Namespaces are listed, a meshed pod would be let
        // in: the map keeps what it holds (a previous agent's, or nothing: served per packet).
        if ![Kind::Pod, Kind::Namespace]
            .iter()
            .all(|kind| self.listed.contains(kind))
        {
            return Ok(());
        }
        let workloads = self.state.workloads();
        let found = namespaces.find(
            &workloads.per_packet_addresses(),
            &self.tc_devices.served_pod_devices(),
        );
        self.dataplane.set_socket_lb_namespaces(&found.socket)?;
        let mut pods = BTreeMap::new();
        let mut unserved = BTreeMap::new();
        let mut unfound = BTreeMap::new();
        for (pod, path) in workloads.paths().filter(|(_, path)| path.per_packet()) {
            let name = format!("{}/{}", pod.namespace, pod.name);
            if pod.ips.iter().any(|ip| found.unserved.contains(ip)) {
                unserved.insert(name, path);
            } else if !pod.terminating
                && !pod.ips.is_empty()
                && pod.ips.iter().all(|ip| found.unfound.contains(ip))
            {
                unfound.insert(name, path);
            } else {
                pods.insert(name, path);
            }
        }
        let label = |pods: &BTreeMap<String, SocketPath>| {
            if pods.is_empty() {
                return "none".to_owned();
            }
            crate::listed(
                pods.iter()
                    .map(|(pod, path)| format!("{pod} ({})", path.label())),
            )
        };
        if pods != self.per_packet_pods {
            info!(
                pods = %label(&pods),
                "pods served by the per-packet path (their sockets keep the Service address)"
            );
            self.per_packet_pods = pods;
        }
        if unserved != self.unserved_pods {
            if !unserved.is_empty() {
                warn!(
                    pods = %label(&unserved),
                    "pods the per-packet path would serve, but no device of theirs carries its \
                     programs (--pod-devices): they keep the socket path, whose hooks rewrite \
                     the Service address at connect()"
                );
            }
            self.unserved_pods = unserved;
        }
        if unfound != self.unfound_pods {
            if !unfound.is_empty() {
                warn!(
                    pods = %label(&unfound),
                    "pods the per-packet path would serve, but no network namespace pinned on \
                     this node (/run/netns, /var/run/netns) holds their addresses \
                     (status.podIPs): their namespace is not found, so it is not left out of \
                     the socket hooks if it is pinned there (their sidecars may see backends), \
                     nor known to be served at all if it is pinned elsewhere; check the Pods' \
                     addresses and where the runtime pins namespaces"
                );
            }
            self.unfound_pods = unfound;
        }
        Ok(())
    }

    /// Serves the devices that came or went since the last time, outside a sync (a pod
    /// started or ended): a failure is logged, and the next sync tries again.
    fn program_devices(&mut self) {
        let local = match local_addresses() {
            Ok(local) => local,
            Err(error) => {
                warn!(%error, "cannot list the network devices; keeping the TC programs as they are");
                return;
            }
        };
        let node = self.state.this_node();
        if let Err(error) = self.tc_devices.program(&mut self.dataplane, node, local) {
            warn!(
                error = %crate::error_chain(&error),
                "the TC programs stay as they were until the next sync"
            );
        }
    }

    /// This node's SNAT settings, and the TC programs on its devices (attached where they
    /// are new: the devices found from the Node's addresses changed, or pods came).
    fn program_external(&mut self) -> Result<(), DataplaneError> {
        let node = self.state.this_node();
        let local = match local_addresses() {
            Ok(local) => local,
            Err(error) => {
                warn!(%error, "cannot list the network devices; keeping the TC programs as they are");
                // The rest of the node map does not depend on them (a new map is empty).
                let snat_addresses = self.snat_addresses.unwrap_or_default();
                return self.dataplane.set_node(&self.node_settings(snat_addresses));
            }
        };
        let held: Vec<IpAddr> = local.iter().map(|(address, _)| *address).collect();
        let snat_addresses = (node.snat_address4(&held), node.snat_address6(&held));
        if self.snat_addresses != Some(snat_addresses) {
            for family in Family::ALL {
                let wanted: Vec<IpAddr> = node.addresses_of(family).collect();
                match node.snat_address(family, &held) {
                    Some(address) => {
                        info!(%address, %family, "SNAT address for flows to other nodes");
                    }
                    None if !wanted.is_empty() => warn!(
                        addresses = %crate::listed(&wanted),
                        %family,
                        "this node holds none of its Node's addresses of this family: flows \
                         from outside to a backend on another node cannot be SNATed and are \
                         dropped; check the Node's InternalIP"
                    ),
                    None => {}
                }
            }
            self.snat_addresses = Some(snat_addresses);
        }
        self.dataplane
            .set_node(&self.node_settings(snat_addresses))?;
        self.tc_devices.program(&mut self.dataplane, node, local)
    }

    /// What the TC programs are told of this node, with these SNAT addresses.
    fn node_settings(
        &self,
        (snat_address, snat_address6): (Option<Ipv4Addr>, Option<Ipv6Addr>),
    ) -> NodeSettings {
        NodeSettings {
            snat_address,
            snat_address6,
            snat_ports: self.external.snat_ports.clone(),
            conntrack_timeouts: self.external.conntrack_timeouts,
        }
    }

    fn record(&self) {
        let metrics = &self.metrics;
        metrics.endpoint_changes_pending.set(0);
        metrics.service_changes_pending.set(0);
        metrics.set_rejected(self.dataplane.rejected_frontends());
        for usage in self.dataplane.usage() {
            let labels = MapLabels {
                map: usage.map.to_owned(),
            };
            metrics
                .map_entries
                .get_or_create(&labels)
                .set(usage.entries.into());
            metrics
                .map_capacity
                .get_or_create(&labels)
                .set(usage.capacity.into());
            metrics
                .map_max_entries
                .get_or_create(&labels)
                .set(usage.max_entries.into());
        }
        for (family, scope, count) in self.table.counts() {
            metrics
                .frontends
                .get_or_create(&FrontendLabels {
                    family: family.label(),
                    scope: scope.name(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        // A Service counts once per reason it is not served, in whole or in part.
        let mut skipped: BTreeMap<&'static str, i64> = BTreeMap::new();
        for parts in self.logged_skips.values() {
            let reasons: BTreeSet<&'static str> =
                parts.iter().map(|part| part.reason.label()).collect();
            for reason in reasons {
                *skipped.entry(reason).or_default() += 1;
            }
        }
        metrics.skipped_services.clear();
        for (reason, count) in skipped {
            metrics
                .skipped_services
                .get_or_create(&ReasonLabels {
                    reason: reason.to_owned(),
                })
                .set(count);
        }
    }
}
