//! `cargo xtask bench large-service`: how long the real agent takes to sync one Service
//! with very many endpoints, first when it is programmed and then at every change of one of
//! its endpoints (a sync must not cost in proportion to the square of the endpoints, or one
//! large Service stalls every other change).
//!
//! socklb-bench-large-service [--endpoints N,N,...] [--changes N] [--docs DIR]
//!
//! For each endpoint count: a fresh sandbox, one ClusterIP Service whose endpoints (on
//! another node) come in EndpointSlices of 1,000, one file each; the agent (file source,
//! `--min-sync-period 0s`, maps sized to fit) is started and its first sync timed, with the
//! kernel's verification of the programs, which a fresh node's first sync waits for; then
//! `--changes` times one endpoint of one slice is replaced by a new address, and the sync
//! that follows is timed, as the agent logs it (`took=`) and from the file's write until the
//! agent logged the sync. With `--docs DIR`, the table also replaces the `large-service`
//! section of DIR/benchmarks.md.
use std::{
    fmt::Write as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use socklb_tests::{
    Agent, ManifestDir, Sandbox, SyncLine,
    bench::{agent_privileges, section::Section},
    node_yaml, process_memory_kib, service_yaml, slice_yaml,
};

const USAGE: &str =
    "usage: socklb-bench-large-service [--endpoints N,N,...] [--changes N] [--docs DIR]";
const ENDPOINTS_PER_SLICE: u32 = 1_000;
/// Keeps the endpoint addresses (10.128.0.0/9) valid, with room for the changes' new ones.
const MAX_ENDPOINTS: u32 = 1_000_000;
/// A sync not logged by then fails the benchmark.
const SYNC_TIMEOUT: Duration = Duration::from_secs(120);
const SECTION: Section = Section::new("large-service", "large-service", "One large Service");

struct Options {
    endpoints: Vec<u32>,
    changes: u32,
    /// Where benchmarks.md is, to rewrite the `large-service` section.
    docs: Option<PathBuf>,
}

struct Row {
    endpoints: u32,
    first_sync: Duration,
    /// The kernel's verification of the programs, which the first sync waited for.
    verifier: Duration,
    /// The agent's own time per change sync, sorted.
    took: Vec<Duration>,
    /// From the slice file's write until the agent logged its sync, sorted.
    write_to_sync: Vec<Duration>,
    peak_rss_mib: u64,
}

fn main() {
    let options = parse_options(&std::env::args().skip(1).collect::<Vec<_>>());
    socklb_tests::bench::preflight::exit_unless_root("large-service");
    let machine = socklb_tests::machine_context();
    let rows: Vec<Row> = options
        .endpoints
        .iter()
        .map(|endpoints| measure(*endpoints, options.changes))
        .collect();
    let report = report(&machine, &options, &rows);
    println!("One Service with many endpoints (`cargo xtask bench large-service`)\n");
    print!("{report}");
    if let Some(docs) = &options.docs {
        SECTION
            .write(docs, &report)
            .expect("write the results into the docs");
    }
}

fn parse_options(args: &[String]) -> Options {
    let mut options = Options {
        endpoints: vec![5_000, 20_000, 60_000],
        changes: 20,
        docs: None,
    };
    let usage = || -> ! {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--endpoints" => {
                options.endpoints = value
                    .split(',')
                    .map(|n| n.parse().unwrap_or_else(|_| usage()))
                    .collect();
            }
            "--changes" => options.changes = value.parse().unwrap_or_else(|_| usage()),
            "--docs" => options.docs = Some(PathBuf::from(value)),
            _ => usage(),
        }
    }
    if options.changes == 0
        || options
            .endpoints
            .iter()
            .any(|n| !(1..=MAX_ENDPOINTS).contains(n))
    {
        eprintln!(
            "--changes must be at least 1, every endpoint count between 1 and {MAX_ENDPOINTS}"
        );
        std::process::exit(2);
    }
    options
}

/// The i-th endpoint address, in 10.128.0.0/9.
fn endpoint(i: u32) -> String {
    let [_, b, c, d] = (0x0a80_0000 + i).to_be_bytes();
    format!("10.{b}.{c}.{d}")
}

/// The slice file of slice `slice`, whose endpoint `replaced` (if any) is `with`.
fn slice_file(endpoints: u32, slice: u32, replaced: Option<(u32, u32)>) -> String {
    let first = slice * ENDPOINTS_PER_SLICE;
    let last = (first + ENDPOINTS_PER_SLICE).min(endpoints);
    let addresses: Vec<String> = (first..last)
        .map(|i| match replaced {
            Some((index, with)) if index == i => endpoint(with),
            _ => endpoint(i),
        })
        .collect();
    let rows: Vec<(&str, &str, &str, &str)> = addresses
        .iter()
        .map(|address| (address.as_str(), "node-b", "zone-b", ""))
        .collect();
    slice_yaml(&format!("big-{slice}"), "big", 8080, &rows, false)
}

fn measure(endpoints: u32, changes: u32) -> Row {
    eprintln!("==> {endpoints} endpoints");
    let sandbox = Sandbox::new(&format!("bench-large-{endpoints}"));
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.79.1"));
    manifests.write("big.yaml", &service_yaml("big", "10.96.0.10", 80, ""));
    let slices = endpoints.div_ceil(ENDPOINTS_PER_SLICE);
    for slice in 0..slices {
        manifests.write(
            &format!("big-{slice}.yaml"),
            &slice_file(endpoints, slice, None),
        );
    }
    let room = |entries: u32| (entries + entries / 8).next_power_of_two().to_string();
    let (service_entries, backends) = (room(endpoints + 1), room(endpoints + changes));
    let agent = Agent::start_as(
        agent_privileges(),
        &sandbox,
        &manifests.path,
        "node-a",
        &[
            "--max-service-entries",
            &service_entries,
            "--max-backends",
            &backends,
            "--min-sync-period",
            "0s",
        ],
    );
    let first = wait_for_sync(&agent, agent.started());
    let verifier = agent
        .verifier_took()
        .expect("the agent logs how long the kernel took over its programs by its first sync");

    let mut took = Vec::new();
    let mut write_to_sync = Vec::new();
    for change in 0..changes {
        let slice = change % slices;
        let index = slice * ENDPOINTS_PER_SLICE;
        let written = Instant::now();
        manifests.write(
            &format!("big-{slice}.yaml"),
            &slice_file(endpoints, slice, Some((index, MAX_ENDPOINTS + change))),
        );
        let sync = wait_for_sync(&agent, written);
        assert!(sync.writes > 0, "the change wrote nothing: {sync:?}");
        took.push(sync.took);
        write_to_sync.push(
            agent
                .lines()
                .last()
                .map_or(Duration::ZERO, |(at, _)| *at - written),
        );
    }
    let (_, peak_rss_kib) = process_memory_kib(agent.pid());
    agent.stop();
    took.sort();
    write_to_sync.sort();
    Row {
        endpoints,
        first_sync: first.took,
        verifier,
        took,
        write_to_sync,
        peak_rss_mib: peak_rss_kib / 1024,
    }
}

/// The first sync the agent logged after `from` that changed something.
fn wait_for_sync(agent: &Agent, from: Instant) -> SyncLine {
    let deadline = Instant::now() + SYNC_TIMEOUT;
    loop {
        if let Some(sync) = agent
            .syncs(from, Instant::now())
            .into_iter()
            .find(|sync| sync.services > 0)
        {
            return sync;
        }
        assert!(
            Instant::now() < deadline,
            "no sync within {SYNC_TIMEOUT:?}:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn percentile(sorted: &[Duration], percent: usize) -> Duration {
    sorted
        .get((sorted.len() * percent / 100).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

fn ms(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1000.0)
}

fn report(machine: &str, options: &Options, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{machine}; release build; {} changes per row.\n",
        options.changes
    );
    let _ = writeln!(
        out,
        "| endpoints | first sync (ms) | programs verified, in the first sync (ms) | change sync p50 (ms) | change sync max (ms) | write to synced p50 (ms) | write to synced max (ms) | agent peak RSS (MiB) |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            row.endpoints,
            ms(row.first_sync),
            ms(row.verifier),
            ms(percentile(&row.took, 50)),
            ms(row.took.last().copied().unwrap_or_default()),
            ms(percentile(&row.write_to_sync, 50)),
            ms(row.write_to_sync.last().copied().unwrap_or_default()),
            row.peak_rss_mib,
        );
    }
    out
}
