//! `cargo xtask bench control-plane`: how fast the real agent (`socklb run`) programs the
//! maps from cluster state, and what that costs it, at 10,000 services of 10 endpoints.
//!
//! socklb-bench-control-plane [--services N] [--changes N] [--rate R] [--seconds S]
//!                            [--docs DIR]
//! socklb-bench-control-plane --outages N [--outage-seconds S] [--services N] [--docs DIR]
//!
//! 1. Cold start from the file source: the manifests are written first (not timed), then the
//!    agent is started and timed until it logs that it is ready; its peak RSS is read and the
//!    maps' entry counts are checked.
//! 2. The kube source against the fake API server: the same cold start, then `--changes`
//!    EndpointSlice changes one at a time, each timed from `FakeApiServer::apply` until the new
//!    endpoint's address is in a slot of its service in the pinned service map.
//! 3. `--rate` changes per second for `--seconds`, with `--min-sync-period 0s` and with the
//!    default 20ms: the agent's CPU time (utime + stime from /proc) over the window.
//!
//! With `--outages`, only the recovery after API-server outages is measured (see
//! [`outage`]).
//!
//! With `--docs DIR`, the report also replaces the `control-plane` (or `control-plane
//! outages`) section of DIR/benchmarks.md.
//!
//! Everything runs in one `Sandbox` (network namespace, cgroup, pins); the agent's pins are
//! removed between the file and the kube cold start so that both program empty maps.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use aya::maps::{HashMap, Map, MapData};
use socklb_abi::{Backend, PROTO_TCP, SCOPE_INTERNAL, ServiceEntry, ServiceKey, map_names};
use socklb_agent::{
    dataplane,
    source::{Object, file::parse},
};
use socklb_tests::{
    Agent, ManifestDir, Sandbox, SyncLine, bench::section::Section, fake_apiserver::FakeApiServer,
    node_yaml, process_memory_kib, service_yaml, slice_yaml,
};

mod outage;

const USAGE: &str = "usage: socklb-bench-control-plane [--services N] [--changes N] [--rate R] \
                     [--seconds S] [--docs DIR] | --outages N [--outage-seconds S] [--services N] \
                     [--docs DIR]";
const ENDPOINTS_PER_SERVICE: u32 = 10;
const SERVICE_PORT: u16 = 80;
const ENDPOINT_PORT: u16 = 8080;
const NODE: &str = "node-a";
const ZONE: &str = "zone-a";
/// The manifests are split into files of this many Services (and their slices).
const SERVICES_PER_FILE: u32 = 1_000;
/// Least time from one timed change to the next, so that each is programmed alone.
const CHANGE_SPACING: Duration = Duration::from_millis(20);
/// A change not in the maps by then fails the benchmark.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the maps are read while waiting for a change.
const POLL: Duration = Duration::from_micros(50);
/// The agent's CPU without changes, as a baseline for the sustained rows.
const IDLE: Duration = Duration::from_secs(3);
/// How long the resyncs (one a second, nothing changing) are watched.
const RESYNC_WINDOW: Duration = Duration::from_secs(10);
/// Keeps the address plan (VIPs in 10.96.0.0/12, endpoints in 10.128.0.0/9) valid.
const MAX_SERVICES: u32 = 100_000;
const SECTION: Section = Section::new("control-plane", "control-plane", "Control plane");

struct Options {
    services: u32,
    changes: u32,
    rate: u32,
    seconds: u32,
    /// API-server outages to recover from (0: the other measurements instead).
    outages: u32,
    outage_seconds: u32,
    /// Where benchmarks.md is, to rewrite this run's section.
    docs: Option<PathBuf>,
}

fn main() {
    let options = parse_options(&std::env::args().skip(1).collect::<Vec<_>>());
    socklb_tests::bench::preflight::exit_unless_root("control-plane");
    // Before any thread exists, so that only the cleanup thread sees these signals.
    let signals = socklb_tests::block_termination_signals();
    let machine = socklb_tests::machine_context();
    let sandbox = Sandbox::new("bench-cp");
    let manifests = ManifestDir::new(&sandbox);
    socklb_tests::cleanup_on_signal(
        signals,
        socklb_tests::Leftovers {
            pin_dir: sandbox.pin_dir.clone(),
            cgroup: sandbox.cgroup.clone(),
            dirs: vec![manifests.path.clone()],
            also: None,
        },
    );
    let mut cluster = Cluster::new(options.services);
    if options.outages > 0 {
        let recovery = outage::run(&sandbox, &manifests, &mut cluster, &options);
        publish(
            &options,
            &outage::SECTION,
            &outage::report(&machine, &options, &recovery),
        );
        return;
    }

    let (file, file_idle) = file_cold_start(&sandbox, &manifests, &cluster);
    let resyncs = resyncs(&sandbox, &manifests, cluster.len());
    // The kube agent starts on empty maps too, not on the file agent's pinned ones.
    dataplane::cleanup(&sandbox.pin_dir).expect("remove the file agent's pins");
    let mut kube = kube_source(&sandbox, &manifests, &mut cluster, &options);
    kube.rows.insert(0, file_idle);

    publish(
        &options,
        &SECTION,
        &report(&machine, &options, &file, &resyncs, &kube),
    );
}

/// Prints the report and, with `--docs`, writes it into its section.
fn publish(options: &Options, section: &Section, report: &str) {
    print!("{report}");
    if let Some(docs) = &options.docs {
        section
            .write(docs, report)
            .expect("write the results into the docs");
    }
}

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2);
}

fn parse_options(args: &[String]) -> Options {
    let mut options = Options {
        services: 10_000,
        changes: 200,
        rate: 100,
        seconds: 10,
        outages: 0,
        outage_seconds: 15,
        docs: None,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let text = args.next().unwrap_or_else(|| usage());
        if flag == "--docs" {
            options.docs = Some(PathBuf::from(text));
            continue;
        }
        let value: u32 = text.parse().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--services" => options.services = value,
            "--changes" => options.changes = value,
            "--rate" => options.rate = value,
            "--seconds" => options.seconds = value,
            "--outages" => options.outages = value,
            "--outage-seconds" => options.outage_seconds = value,
            _ => usage(),
        }
    }
    if !(1..=MAX_SERVICES).contains(&options.services) {
        eprintln!("--services must be between 1 and {MAX_SERVICES}");
        std::process::exit(2);
    }
    if options.changes == 0 || !(1..=1_000).contains(&options.rate) || options.seconds == 0 {
        eprintln!("--changes and --seconds must be at least 1, --rate between 1 and 1000");
        std::process::exit(2);
    }
    options
}

/// The flags every measured agent gets besides its source: maps with room for every
/// service's master entry and slots and every endpoint (131,072 each at 10,000 services).
fn agent_flags(services: u32, min_sync_period: &str) -> Vec<String> {
    let room = |entries: u32| (entries + entries / 8).next_power_of_two().to_string();
    let service_entries = room(services * (1 + ENDPOINTS_PER_SERVICE));
    let backends = room(services * ENDPOINTS_PER_SERVICE);
    [
        "--max-service-entries",
        &service_entries,
        "--max-backends",
        &backends,
        "--min-sync-period",
        min_sync_period,
    ]
    .map(str::to_owned)
    .to_vec()
}

fn start_file(sandbox: &Sandbox, manifests: &Path, services: u32, extra: &[&str]) -> Agent {
    let flags = agent_flags(services, "0s");
    let flags: Vec<&str> = flags
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .collect();
    Agent::start(sandbox, manifests, NODE, &flags)
}

fn start_kube(sandbox: &Sandbox, kubeconfig: &Path, services: u32, period: &str) -> Agent {
    let flags = agent_flags(services, period);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Agent::start_kube(sandbox, kubeconfig, NODE, &flags)
}

// ---------------------------------------------------------------------------------------
// The cluster: Services svc-00000... with ENDPOINTS_PER_SERVICE endpoints each on this node.

struct Cluster {
    /// Every service's current endpoint addresses.
    endpoints: Vec<Vec<Ipv4Addr>>,
    /// Changes made so far; also numbers the replacement addresses.
    changes: u32,
}

/// One EndpointSlice change: which service, its new slice, and the address it brings.
struct Change {
    service: u32,
    slice: Object,
    address: Ipv4Addr,
}

impl Cluster {
    fn new(services: u32) -> Self {
        let endpoints = (0..services)
            .map(|service| {
                (0..ENDPOINTS_PER_SERVICE)
                    .map(|endpoint| Ipv4Addr::from(0x0a80_0000 + service * 16 + endpoint))
                    .collect()
            })
            .collect();
        Self {
            endpoints,
            changes: 0,
        }
    }

    fn len(&self) -> u32 {
        u32::try_from(self.endpoints.len()).unwrap_or(u32::MAX)
    }

    fn service_yaml(&self, service: u32) -> String {
        service_yaml(
            &service_name(service),
            &vip(service).to_string(),
            SERVICE_PORT,
            "",
        )
    }

    fn slice_yaml(&self, service: u32) -> String {
        let addresses: Vec<String> = self.endpoints[service as usize]
            .iter()
            .map(ToString::to_string)
            .collect();
        let endpoints: Vec<(&str, &str, &str, &str)> = addresses
            .iter()
            .map(|address| (address.as_str(), NODE, ZONE, ""))
            .collect();
        let name = service_name(service);
        slice_yaml(
            &format!("{name}-1"),
            &name,
            ENDPOINT_PORT,
            &endpoints,
            false,
        )
    }

    /// Replaces one endpoint of a service with an address never used before (11.0.0.0/8),
    /// so that seeing it in the maps can only mean this change. Consecutive changes hit
    /// services far apart, as unrelated deployments would.
    fn change(&mut self) -> Change {
        let number = self.changes;
        self.changes += 1;
        let service = u32::try_from((u64::from(number) * 7_919 + 13) % u64::from(self.len()))
            .unwrap_or_default();
        let address = Ipv4Addr::from(0x0b00_0000 + number);
        let slot = (number % ENDPOINTS_PER_SERVICE) as usize;
        self.endpoints[service as usize][slot] = address;
        let slice = objects(&self.slice_yaml(service))
            .pop()
            .expect("a slice manifest holds one object");
        Change {
            service,
            slice,
            address,
        }
    }
}

fn service_name(service: u32) -> String {
    format!("svc-{service:05}")
}

/// The service's cluster IP, from 10.96.0.1 upwards.
fn vip(service: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a60_0001 + service)
}

/// The objects of a manifest, for the fake API server (parsed as the file source does).
fn objects(yaml: &str) -> Vec<Object> {
    parse(Path::new("bench.yaml"), yaml).expect("the generated manifests parse")
}

/// The fake API server's sockets do not set TCP_NODELAY (a real API server's do: Go sets
/// it on every TCP connection). With Nagle on the server and delayed ACKs (40 ms) on the
/// agent, a watch event written while the previous one is unacknowledged waits for that
/// ACK: 1 in 10 changes paced 20 ms apart took ~21 ms instead of ~0.7 ms, and changes at
/// 100/s arrived in bursts. Quick ACKs on the sandbox's loopback route (its own network
/// namespace) release each event at once, as TCP_NODELAY on the server would.
fn ack_at_once_on_loopback() {
    let route = "route replace local 127.0.0.1 dev lo table local proto kernel scope host src \
                 127.0.0.1 quickack 1";
    socklb_tests::run(Command::new("ip").args(route.split_whitespace()));
}

fn apply(api: &FakeApiServer, object: &Object) {
    api.apply_object(object);
}

// ---------------------------------------------------------------------------------------
// The pinned maps, read as the kernel programs read them.

struct Maps {
    services: HashMap<MapData, ServiceKey, ServiceEntry>,
    backends: HashMap<MapData, u32, Backend>,
}

impl Maps {
    fn open(pin_dir: &Path) -> Self {
        let open = |name: &str| {
            let path = pin_dir.join(name);
            Map::HashMap(
                MapData::from_pin(&path)
                    .unwrap_or_else(|e| panic!("open the pinned map {}: {e}", path.display())),
            )
        };
        Self {
            services: open(map_names::SERVICES)
                .try_into()
                .expect("the service map's key and value types"),
            backends: open(map_names::BACKENDS)
                .try_into()
                .expect("the backend map's key and value types"),
        }
    }

    /// Whether `address` is in one of the service's backend slots.
    fn serves(&self, service: u32, address: Ipv4Addr) -> bool {
        let key = |slot: u16| ServiceKey {
            address: u32::from(vip(service)).to_be(),
            port: SERVICE_PORT.to_be(),
            protocol: PROTO_TCP,
            scope: SCOPE_INTERNAL,
            slot,
            pad: 0,
        };
        let wanted = u32::from(address).to_be();
        let Ok(master) = self.services.get(&key(0), 0) else {
            return false;
        };
        (1..=master.count).any(|slot| {
            self.services
                .get(&key(slot), 0)
                .is_ok_and(|entry| entry.backend_address == wanted)
        })
    }

    /// Waits until `address` serves `service`; panics with the agent's log after a while.
    fn wait_for(&self, service: u32, address: Ipv4Addr, agent: &Agent) {
        self.wait_within(service, address, agent, CHANGE_TIMEOUT);
    }

    fn wait_within(&self, service: u32, address: Ipv4Addr, agent: &Agent, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.serves(service, address) {
            assert!(
                Instant::now() < deadline,
                "{address} did not reach {}'s slots within {timeout:?}; agent log:\n{}",
                service_name(service),
                tail(&agent.log(), 30)
            );
            std::thread::sleep(POLL);
        }
    }

    /// Entries of the service map and of the backend map.
    fn entries(&self) -> (usize, usize) {
        (self.services.keys().count(), self.backends.keys().count())
    }
}

/// Every service must have a master entry and ENDPOINTS_PER_SERVICE slots, every endpoint
/// one backend: the numbers are only worth reporting for fully programmed maps.
fn check_maps(maps: &Maps, services: u32) -> (usize, usize) {
    let (service_entries, backends) = maps.entries();
    let expected = services as usize * (1 + ENDPOINTS_PER_SERVICE as usize);
    assert_eq!(
        service_entries, expected,
        "service map entries: {services} services x (1 + {ENDPOINTS_PER_SERVICE}) expected"
    );
    assert_eq!(
        backends,
        services as usize * ENDPOINTS_PER_SERVICE as usize,
        "backend map entries: one per endpoint expected"
    );
    (service_entries, backends)
}

// ---------------------------------------------------------------------------------------
// Measurements.

/// From spawning the agent until it is ready, and what it holds then.
struct ColdStart {
    /// Until "starting": the datapath is loaded (before any cluster state is read).
    loaded: Duration,
    /// Until "manifests read" (file source only).
    read: Option<Duration>,
    /// How often the file source read the manifests before the agent was ready.
    reads: usize,
    /// Until "datapath attached; ready": the first full sync is done.
    ready: Duration,
    /// The first full sync as the agent timed it, and its map writes.
    sync: SyncLine,
    peak_rss_kib: u64,
    rss_kib: u64,
    /// Entries of the service map and the backend map once ready.
    entries: (usize, usize),
}

fn cold_start(agent: &Agent) -> ColdStart {
    // Read at once: the peak so far is the cold start's.
    let (peak_rss_kib, rss_kib) = process_memory_kib(agent.pid());
    let since_start = |text: &str| {
        agent
            .lines()
            .iter()
            .find(|(_, line)| line.contains(text))
            .map(|(at, _)| at.duration_since(agent.started()))
    };
    let ready = since_start("datapath attached; ready").expect("Agent::start waits for ready");
    let reads = agent
        .lines()
        .iter()
        .filter(|(at, line)| {
            at.duration_since(agent.started()) <= ready && line.contains("manifests read")
        })
        .count();
    agent.wait_for_log("synced", 1);
    let sync = agent
        .syncs(agent.started(), Instant::now())
        .into_iter()
        .find(|sync| sync.full)
        .expect("the first sync is a full one");
    ColdStart {
        loaded: since_start("starting").unwrap_or_default(),
        read: since_start("manifests read"),
        reads,
        ready,
        sync,
        peak_rss_kib,
        rss_kib,
        entries: (0, 0),
    }
}

/// The cold start, and the agent's CPU afterwards without changes.
fn file_cold_start(
    sandbox: &Sandbox,
    manifests: &ManifestDir,
    cluster: &Cluster,
) -> (ColdStart, Sustained) {
    let services = cluster.len();
    eprintln!(
        "file source: writing {services} services x {ENDPOINTS_PER_SERVICE} endpoints to {}",
        manifests.path.display()
    );
    manifests.write("node.yaml", &node_yaml(NODE, ZONE, "192.168.0.1"));
    for first in (0..services).step_by(SERVICES_PER_FILE as usize) {
        let documents: Vec<String> = (first..services.min(first + SERVICES_PER_FILE))
            .flat_map(|service| [cluster.service_yaml(service), cluster.slice_yaml(service)])
            .collect();
        manifests.write(
            &format!("services-{first:05}.yaml"),
            &documents.join("---\n"),
        );
    }
    let agent = start_file(sandbox, &manifests.path, services, &[]);
    let mut cold = cold_start(&agent);
    cold.entries = check_maps(&Maps::open(&sandbox.pin_dir), services);
    eprintln!(
        "file source: ready after {:.2?} (first sync {:.2?})",
        cold.ready, cold.sync.took
    );
    let idle = idle(&agent, "file");
    agent.stop();
    (cold, idle)
}

/// What resyncs cost at this size, from the file agent restarted over its programmed maps.
struct Resyncs {
    /// Its first sync: a full resync's re-read of every map, with nothing to write.
    full: SyncLine,
    /// Each later resync: entries read back, and its time as the agent took it.
    verified: Vec<(usize, Duration)>,
    /// Verification passes over every entry completed in the window.
    passes: usize,
    /// The agent's CPU over the window, in seconds.
    cpu: f64,
    window: Duration,
}

/// Restarts the file agent over the maps the cold start programmed, with a resync every
/// second: its first (full) sync re-reads every map and writes nothing, then for
/// RESYNC_WINDOW nothing changes but the resyncs.
fn resyncs(sandbox: &Sandbox, manifests: &ManifestDir, services: u32) -> Resyncs {
    let agent = start_file(sandbox, &manifests.path, services, &["--sync-period", "1s"]);
    agent.wait_for_log("synced", 1);
    let full = agent
        .syncs(agent.started(), Instant::now())
        .into_iter()
        .find(|sync| sync.full)
        .expect("the first sync is a full one");
    assert_eq!(full.writes, 0, "the restarted agent rewrote its maps");
    let began = Instant::now();
    let cpu_before = cpu_seconds(agent.pid());
    std::thread::sleep(RESYNC_WINDOW);
    let cpu = cpu_seconds(agent.pid()) - cpu_before;
    let window = began.elapsed();
    let lines: Vec<String> = agent
        .lines()
        .into_iter()
        .filter(|(at, line)| *at >= began && line.contains("maps verified"))
        .map(|(_, line)| line)
        .collect();
    agent.stop();
    let field = |line: &str, name: &str| -> String {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
            .to_owned()
    };
    let verified = lines
        .iter()
        .map(|line| {
            let read = field(line, "read").parse().expect("read=");
            let took = socklb_tests::parse_debug_duration(&field(line, "took")).expect("took=");
            (read, took)
        })
        .collect::<Vec<_>>();
    assert!(!verified.is_empty(), "no resync within {RESYNC_WINDOW:?}");
    let passes = lines
        .iter()
        .filter(|line| field(line, "pass_done") == "true")
        .count();
    Resyncs {
        full,
        verified,
        passes,
        cpu,
        window,
    }
}

/// The kube source's cold start, then the change latency and the sustained rows.
struct KubeResults {
    cold: ColdStart,
    latency: Latency,
    rows: Vec<Sustained>,
}

/// The fake API server, started inside the sandbox (the agent reaches it on the sandbox's
/// 127.0.0.1) and holding the cluster, and a kubeconfig for it in the manifests directory.
fn fake_cluster(manifests: &ManifestDir, cluster: &Cluster) -> (FakeApiServer, PathBuf) {
    ack_at_once_on_loopback();
    let api = FakeApiServer::start();
    eprintln!(
        "kube source: {} services in the fake API server",
        cluster.len()
    );
    api.apply_manifests(&node_yaml(NODE, ZONE, "192.168.0.1"));
    for service in 0..cluster.len() {
        let yaml = format!(
            "{}---\n{}",
            cluster.service_yaml(service),
            cluster.slice_yaml(service)
        );
        api.apply_manifests(&yaml);
    }
    let kubeconfig = manifests.path.join("kubeconfig");
    fs::write(&kubeconfig, api.kubeconfig()).expect("write the kubeconfig");
    (api, kubeconfig)
}

fn kube_source(
    sandbox: &Sandbox,
    manifests: &ManifestDir,
    cluster: &mut Cluster,
    options: &Options,
) -> KubeResults {
    let (api, kubeconfig) = fake_cluster(manifests, cluster);
    let agent = start_kube(sandbox, &kubeconfig, cluster.len(), "0s");
    let mut cold = cold_start(&agent);
    let maps = Maps::open(&sandbox.pin_dir);
    cold.entries = check_maps(&maps, cluster.len());
    eprintln!(
        "kube source: ready after {:.2?} (first sync {:.2?})",
        cold.ready, cold.sync.took
    );

    let mut rows = vec![idle(&agent, "kube")];
    let latency = change_latency(&api, &maps, &agent, cluster, options.changes);
    eprintln!(
        "kube source: {} changes, p50 {:.2?}, p99 {:.2?}",
        options.changes, latency.p50, latency.p99
    );
    rows.push(sustained(&api, &maps, &agent, cluster, options, "0s"));
    agent.stop();

    // The default period; this agent adopts the maps the last one left (nothing to write).
    let agent = start_kube(sandbox, &kubeconfig, cluster.len(), "20ms");
    let maps = Maps::open(&sandbox.pin_dir);
    rows.push(sustained(&api, &maps, &agent, cluster, options, "20ms"));
    check_maps(&maps, cluster.len());
    agent.stop();
    KubeResults {
        cold,
        latency,
        rows,
    }
}

/// One change at a time: apply, then wait until the maps serve the new address.
struct Latency {
    samples: usize,
    min: Duration,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
    /// The incremental syncs meanwhile, as the agent timed them.
    sync_p50: Duration,
    sync_p99: Duration,
    /// Services and map writes per incremental sync (1 and 3 when each change is alone).
    services_per_sync: f64,
    writes_per_sync: f64,
}

fn change_latency(
    api: &FakeApiServer,
    maps: &Maps,
    agent: &Agent,
    cluster: &mut Cluster,
    changes: u32,
) -> Latency {
    let began = Instant::now();
    let mut samples = Vec::new();
    for _ in 0..changes {
        let change = cluster.change();
        let applied = Instant::now();
        apply(api, &change.slice);
        maps.wait_for(change.service, change.address, agent);
        samples.push(applied.elapsed());
        std::thread::sleep(CHANGE_SPACING.saturating_sub(applied.elapsed()));
    }
    let syncs = incremental(agent.syncs(began, Instant::now()));
    samples.sort_unstable();
    let mut took: Vec<Duration> = syncs.iter().map(|sync| sync.took).collect();
    took.sort_unstable();
    Latency {
        samples: samples.len(),
        min: samples.first().copied().unwrap_or_default(),
        p50: percentile(&samples, 50),
        p90: percentile(&samples, 90),
        p99: percentile(&samples, 99),
        max: samples.last().copied().unwrap_or_default(),
        sync_p50: percentile(&took, 50),
        sync_p99: percentile(&took, 99),
        services_per_sync: per_sync(&syncs, |sync| sync.services),
        writes_per_sync: per_sync(&syncs, |sync| sync.writes),
    }
}

/// The agent's CPU over a window, with or without changes.
struct Sustained {
    label: String,
    changes: u32,
    window: Duration,
    /// utime + stime over the window, in seconds.
    cpu: f64,
    syncs: Vec<SyncLine>,
    /// From applying the last change until it was in the maps.
    caught_up: Duration,
}

/// Nothing changes; the file source counts how often it re-read the manifests meanwhile.
fn idle(agent: &Agent, source: &str) -> Sustained {
    let began = Instant::now();
    let cpu_before = cpu_seconds(agent.pid());
    std::thread::sleep(IDLE);
    let cpu = cpu_seconds(agent.pid()) - cpu_before;
    let window = began.elapsed();
    let reads = agent
        .lines()
        .iter()
        .filter(|(at, line)| *at >= began && line.contains("manifests read"))
        .count();
    let label = if reads == 0 {
        format!("idle, {source} source")
    } else {
        format!("idle, {source} source ({reads} manifest re-reads)")
    };
    Sustained {
        label,
        changes: 0,
        window,
        cpu,
        syncs: incremental(agent.syncs(began, Instant::now())),
        caught_up: Duration::ZERO,
    }
}

/// `options.rate` changes per second for `options.seconds`, on a fixed schedule; the window
/// ends once the last change is in the maps (the changes arrive in order on one watch, so
/// every earlier one is too; checked afterwards, outside the window).
fn sustained(
    api: &FakeApiServer,
    maps: &Maps,
    agent: &Agent,
    cluster: &mut Cluster,
    options: &Options,
    min_sync_period: &str,
) -> Sustained {
    let total = options.rate * options.seconds;
    let interval = Duration::from_secs(1) / options.rate;
    let mut last: BTreeMap<u32, Ipv4Addr> = BTreeMap::new();
    let mut newest = None;
    let began = Instant::now();
    let mut applied = began;
    let cpu_before = cpu_seconds(agent.pid());
    for number in 0..total {
        let due = began + interval * number;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        let change = cluster.change();
        applied = Instant::now();
        apply(api, &change.slice);
        last.insert(change.service, change.address);
        newest = Some((change.service, change.address));
    }
    if let Some((service, address)) = newest {
        maps.wait_for(service, address, agent);
    }
    let ended = Instant::now();
    let cpu = cpu_seconds(agent.pid()) - cpu_before;
    let window = ended.duration_since(began);
    for (service, address) in &last {
        maps.wait_for(*service, *address, agent);
    }
    let row = Sustained {
        label: format!(
            "{} changes/s, --min-sync-period {min_sync_period}",
            options.rate
        ),
        changes: total,
        window,
        cpu,
        syncs: incremental(agent.syncs(began, ended)),
        caught_up: ended.duration_since(applied),
    };
    eprintln!(
        "kube source: {total} changes in {window:.2?} with --min-sync-period \
         {min_sync_period}: {:.1}% of a core",
        row.cpu_percent()
    );
    row
}

impl Sustained {
    fn cpu_percent(&self) -> f64 {
        100.0 * self.cpu / self.window.as_secs_f64()
    }
}

/// Without the full syncs: a restarted agent's first one is logged just after it is
/// ready, and periodic ones (every 30 s) do not fall into a window this short.
fn incremental(syncs: Vec<SyncLine>) -> Vec<SyncLine> {
    syncs.into_iter().filter(|sync| !sync.full).collect()
}

fn per_sync(syncs: &[SyncLine], value: impl Fn(&SyncLine) -> u64) -> f64 {
    let total: u64 = syncs.iter().map(value).sum();
    total as f64 / syncs.len().max(1) as f64
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], percent: usize) -> Duration {
    let rank = (sorted.len() * percent).div_ceil(100).max(1);
    sorted.get(rank - 1).copied().unwrap_or_default()
}

/// The process's user + system CPU time, all threads, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    // The fields after the command name, which is in parentheses and may hold spaces:
    // state is field 3, utime 14, stime 15.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |field: usize| -> u64 {
        fields
            .get(field - 3)
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("field {field} of {path}: {stat}"))
    };
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    (ticks(14) + ticks(15)) as f64 / per_second as f64
}

fn tail(log: &str, lines: usize) -> String {
    let all: Vec<&str> = log.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------
// Report.

fn report(
    machine: &str,
    options: &Options,
    file: &ColdStart,
    resyncs: &Resyncs,
    kube: &KubeResults,
) -> String {
    let mut out = String::new();
    let services = options.services;
    let endpoints = u64::from(services) * u64::from(ENDPOINTS_PER_SERVICE);
    let s = |d: Duration| format!("{:.3} s", d.as_secs_f64());
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    let mib = |kib: u64| format!("{:.0} MiB", kib as f64 / 1024.0);
    let _ = writeln!(out, "{machine}");
    let _ = writeln!(
        out,
        "{services} services x {ENDPOINTS_PER_SERVICE} endpoints ({endpoints} endpoints), one \
         port each, all on this node; release build of the agent\n"
    );

    let _ = writeln!(out, "Cold start (spawn -> \"datapath attached; ready\"):\n");
    let _ = writeln!(
        out,
        "| source | datapath loaded | manifests read | first full sync (agent) | map writes | \
         ready | peak RSS (VmHWM) | RSS at ready | service / backend map entries |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (source, cold) in [("file", file), ("kube (fake API server)", &kube.cold)] {
        let _ = writeln!(
            out,
            "| {source} | {} | {} | {} | {} | **{}** | **{}** | {} | {} / {} |",
            s(cold.loaded),
            cold.read.map_or_else(
                || "-".to_owned(),
                |read| format!("{} (reads before ready: {})", s(read), cold.reads)
            ),
            s(cold.sync.took),
            cold.sync.writes,
            s(cold.ready),
            mib(cold.peak_rss_kib),
            mib(cold.rss_kib),
            cold.entries.0,
            cold.entries.1,
        );
    }

    let entries = file.entries.0 + file.entries.1;
    let count = resyncs.verified.len();
    let read: usize = resyncs.verified.iter().map(|(read, _)| read).sum();
    let mut took: Vec<Duration> = resyncs.verified.iter().map(|(_, took)| *took).collect();
    took.sort_unstable();
    let _ = writeln!(
        out,
        "\nResyncs (file agent restarted over its maps, --sync-period 1s, nothing changing for \
         {} s):\n",
        RESYNC_WINDOW.as_secs()
    );
    let _ = writeln!(
        out,
        "| resync | entries read back each | took (agent) p50 / max | agent CPU per resync | \
         passes over all {entries} entries |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    let _ = writeln!(
        out,
        "| full (first sync, every --full-sync-period) | {entries} | {} | - | - |",
        ms(resyncs.full.took)
    );
    let _ = writeln!(
        out,
        "| verification (every --sync-period) | {} | {} / {} | **{:.1} ms** ({count} resyncs in \
         {}) | {} |",
        read / count.max(1),
        ms(percentile(&took, 50)),
        ms(took.last().copied().unwrap_or_default()),
        resyncs.cpu * 1e3 / count.max(1) as f64,
        s(resyncs.window),
        resyncs.passes,
    );

    let latency = &kube.latency;
    let _ = writeln!(
        out,
        "\nOne EndpointSlice change -> new backend in the service map (kube source, \
         --min-sync-period 0s, one change every >= {} ms):\n",
        CHANGE_SPACING.as_millis()
    );
    let _ = writeln!(
        out,
        "| changes | min | p50 | p90 | p99 | max | agent sync p50 | agent sync p99 | services \
         / writes per sync |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(
        out,
        "| {} | {} | **{}** | {} | **{}** | {} | {} | {} | {:.2} / {:.2} |",
        latency.samples,
        ms(latency.min),
        ms(latency.p50),
        ms(latency.p90),
        ms(latency.p99),
        ms(latency.max),
        ms(latency.sync_p50),
        ms(latency.sync_p99),
        latency.services_per_sync,
        latency.writes_per_sync,
    );

    let _ = writeln!(
        out,
        "\nAgent CPU (utime + stime from /proc) without changes, then under sustained \
         EndpointSlice changes (kube source):\n"
    );
    let _ = writeln!(
        out,
        "| load | changes | window | agent CPU (% of one core) | CPU per change | syncs | \
         services / writes per sync | sync p50 / max (agent) | caught up after the last change |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &kube.rows {
        let mut took: Vec<Duration> = row.syncs.iter().map(|sync| sync.took).collect();
        took.sort_unstable();
        let per_change = if row.changes == 0 {
            "-".to_owned()
        } else {
            format!("{:.2} ms", row.cpu * 1e3 / f64::from(row.changes))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | **{:.1}%** | {per_change} | {} | {:.2} / {:.2} | {} / {} | {} |",
            row.label,
            row.changes,
            s(row.window),
            row.cpu_percent(),
            row.syncs.len(),
            per_sync(&row.syncs, |sync| sync.services),
            per_sync(&row.syncs, |sync| sync.writes),
            ms(percentile(&took, 50)),
            ms(took.last().copied().unwrap_or_default()),
            ms(row.caught_up),
        );
    }
    out
}

// ---------------------------------------------------------------------------------------
// Cleanup on Ctrl-C or SIGTERM (a panic unwinds through the Drops instead).
