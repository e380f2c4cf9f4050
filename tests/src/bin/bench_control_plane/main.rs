//! `cargo xtask bench control-plane`: how fast the real agent (`socklb run`) programs the
//! maps from cluster state, and what that costs it, at 10,000 services of 10 endpoints.
//!
//! socklb-bench-control-plane [--services N] [--changes N] [--rate R] [--seconds S]
//!                            [--docs DIR]
//! socklb-bench-control-plane --outages N [--outage-seconds S] [--services N] [--docs DIR]
//! socklb-bench-control-plane --scale N,N,... [--changes N] [--docs DIR]
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
//! [`outage`]); with `--scale`, the agent with its default flags at each Service count (see
//! [`scale`]).
//!
//! With `--docs DIR`, the report also replaces the `control-plane` (or `control-plane
//! outages`, or `scale`) section of DIR/benchmarks.md.
//!
//! Everything runs in one `Sandbox` (network namespace, cgroup, pins); the agent's pins are
//! removed between the file and the kube cold start so that both program empty maps.
use std::{
    collections::BTreeMap,
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use socklb_agent::dataplane;
use socklb_tests::{
    Agent, ManifestDir, Sandbox, Source, SyncLine,
    bench::{agent_privileges, section::Section},
    fake_apiserver::FakeApiServer,
    process_memory_kib,
};

use crate::{
    cluster::{Cluster, Format, apply, fake_cluster},
    maps::{Maps, check_maps},
    report::report,
};

mod cluster;
mod maps;
mod outage;
mod report;
mod scale;

const USAGE: &str = "usage: socklb-bench-control-plane [--services N] [--changes N] [--rate R] \
                     [--seconds S] [--docs DIR] | --outages N [--outage-seconds S] [--services N] \
                     [--docs DIR] | --scale N,N,... [--changes N] [--docs DIR]";
const ENDPOINTS_PER_SERVICE: u32 = 10;
const SERVICE_PORT: u16 = 80;
const ENDPOINT_PORT: u16 = 8080;
const NODE: &str = "node-a";
const ZONE: &str = "zone-a";
/// Least time from one timed change to the next, so that each is programmed alone.
const CHANGE_SPACING: Duration = Duration::from_millis(20);
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
    /// Service counts for the scale report (empty: the other measurements instead).
    scale: Vec<u32>,
    /// Where benchmarks.md is, to rewrite this run's section.
    docs: Option<PathBuf>,
}

/// How the measured agents' maps are bounded.
#[derive(Clone, Copy)]
enum Sizing {
    /// Flags with room for exactly this many Services.
    Fitted(u32),
    /// The agent's default bounds, as an operator runs it.
    Defaults,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|command| command == "client") {
        // The timed client of the scale report's connections (this binary again).
        if let Err(error) = socklb_tests::bench::client::run() {
            eprintln!("error: {error:#}");
            std::process::exit(1);
        }
        return;
    }
    let options = parse_options(&args);
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
    if !options.scale.is_empty() {
        let rows = scale::run(&sandbox, &manifests, &options);
        publish(
            &options,
            &scale::SECTION,
            &scale::report(&machine, &options, &rows),
        );
        return;
    }
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
    let resyncs = resyncs(&sandbox, &manifests, Sizing::Fitted(cluster.len()));
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
        scale: Vec::new(),
        docs: None,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let text = args.next().unwrap_or_else(|| usage());
        if flag == "--docs" {
            options.docs = Some(PathBuf::from(text));
            continue;
        }
        if flag == "--scale" {
            options.scale = text
                .split(',')
                .map(|count| count.parse().unwrap_or_else(|_| usage()))
                .collect();
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
    let valid = |count: &u32| (1..=MAX_SERVICES).contains(count);
    if !valid(&options.services) || !options.scale.iter().all(valid) {
        eprintln!("--services and --scale must be between 1 and {MAX_SERVICES}");
        std::process::exit(2);
    }
    if options.changes == 0 || !(1..=1_000).contains(&options.rate) || options.seconds == 0 {
        eprintln!("--changes and --seconds must be at least 1, --rate between 1 and 1000");
        std::process::exit(2);
    }
    options
}

/// The flags every measured agent gets besides its source. Fitted: maps with room for every
/// service's master entry and slots and every endpoint (131,072 each at 10,000 services).
fn agent_flags(sizing: Sizing, min_sync_period: &str) -> Vec<String> {
    let mut flags = vec!["--min-sync-period".to_owned(), min_sync_period.to_owned()];
    if let Sizing::Fitted(services) = sizing {
        let room = |entries: u32| (entries + entries / 8).next_power_of_two().to_string();
        flags.extend([
            "--max-service-entries".to_owned(),
            room(services * (1 + ENDPOINTS_PER_SERVICE)),
            "--max-backends".to_owned(),
            room(services * ENDPOINTS_PER_SERVICE),
        ]);
    }
    flags
}

fn start_file(sandbox: &Sandbox, manifests: &Path, sizing: Sizing, extra: &[&str]) -> Agent {
    let flags = agent_flags(sizing, "0s");
    let flags: Vec<&str> = flags
        .iter()
        .map(String::as_str)
        .chain(extra.iter().copied())
        .collect();
    Agent::start_as(agent_privileges(), sandbox, manifests, NODE, &flags)
}

fn start_kube(sandbox: &Sandbox, kubeconfig: &Path, sizing: Sizing, period: &str) -> Agent {
    let flags = agent_flags(sizing, period);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let state = (sandbox.pin_dir.as_path(), sandbox.cgroup.as_path());
    let source = Source::Kube(kubeconfig);
    Agent::start_with(agent_privileges(), state, source, NODE, &flags)
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
    /// Until "programs attached": the first full sync is done and the node serves every
    /// Service (`/readyz` answers 200 from then on; the frontends' names, for display, are
    /// written after).
    ready: Duration,
    /// The first full sync as the agent timed it, and its map writes.
    sync: SyncLine,
    /// The kernel's verification and load of the programs, as the agent timed it.
    verifier: Duration,
    /// The instructions the verifier walked for each TC program this agent loaded: a
    /// program's walk grows with the paths it cannot merge, which its start pays for.
    verified_instructions: Vec<(String, u32)>,
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
    let ready = since_start("programs attached; the node serves")
        .expect("Agent::start waits for ready, which comes after");
    let reads = agent
        .lines()
        .iter()
        .filter(|(at, line)| {
            at.duration_since(agent.started()) <= ready && line.contains("manifests read")
        })
        .count();
    let verifier = agent
        .verifier_took()
        .expect("the agent logs how long the kernel took over its programs before it is ready");
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
        verifier,
        verified_instructions: verified_instructions(agent),
        peak_rss_kib,
        rss_kib,
        entries: (0, 0),
    }
}

/// The TC programs loaded since `agent` started, by name, with the instructions the verifier
/// walked for each.
fn verified_instructions(agent: &Agent) -> Vec<(String, u32)> {
    let since = SystemTime::now() - agent.started().elapsed();
    let mut walked: Vec<(String, u32)> = aya::programs::loaded_programs()
        .flatten()
        .filter(|info| info.loaded_at().is_some_and(|at| at >= since))
        .filter_map(|info| {
            let name = info.name_as_str()?.to_owned();
            let count = info.verified_instruction_count()?;
            name.starts_with("socklb_tc_").then_some((name, count))
        })
        .collect();
    walked.sort();
    walked.dedup();
    walked
}

/// The cold start, and the agent's CPU afterwards without changes.
fn file_cold_start(
    sandbox: &Sandbox,
    manifests: &ManifestDir,
    cluster: &Cluster,
) -> (ColdStart, Sustained) {
    let services = cluster.len();
    cluster.write_manifests(manifests, Format::Yaml);
    let agent = start_file(sandbox, &manifests.path, Sizing::Fitted(services), &[]);
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
    /// A periodic full resync after the window (every Service selected again, with nothing
    /// to write).
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
/// second: its first (full) sync writes nothing, then for RESYNC_WINDOW nothing changes
/// but the resyncs, and then comes a periodic full resync (the hourly one), timed.
fn resyncs(sandbox: &Sandbox, manifests: &ManifestDir, sizing: Sizing) -> Resyncs {
    let full_period = format!("{}s", (RESYNC_WINDOW + Duration::from_secs(3)).as_secs());
    let agent = start_file(
        sandbox,
        &manifests.path,
        sizing,
        &["--sync-period", "1s", "--full-sync-period", &full_period],
    );
    agent.wait_for_log("synced", 1);
    let first = agent
        .syncs(agent.started(), Instant::now())
        .into_iter()
        .find(|sync| sync.full)
        .expect("the first sync is a full one");
    assert_eq!(first.writes, 0, "the restarted agent rewrote its maps");
    let began = Instant::now();
    let cpu_before = cpu_seconds(agent.pid());
    std::thread::sleep(RESYNC_WINDOW);
    let cpu = cpu_seconds(agent.pid()) - cpu_before;
    let window = began.elapsed();
    agent.wait_for_log("full=true", 2);
    let full = agent
        .syncs(began, Instant::now())
        .into_iter()
        .find(|sync| sync.full)
        .expect("a periodic full resync");
    assert_eq!(full.writes, 0, "the full resync rewrote the maps");
    let lines: Vec<String> = agent
        .lines()
        .into_iter()
        .filter(|(at, line)| *at >= began && *at < began + window && line.contains("maps verified"))
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

fn kube_source(
    sandbox: &Sandbox,
    manifests: &ManifestDir,
    cluster: &mut Cluster,
    options: &Options,
) -> KubeResults {
    let (api, kubeconfig) = fake_cluster(manifests, cluster);
    let agent = start_kube(sandbox, &kubeconfig, Sizing::Fitted(cluster.len()), "0s");
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
    let agent = start_kube(sandbox, &kubeconfig, Sizing::Fitted(cluster.len()), "20ms");
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
