//! Developer and CI tasks: `cargo xtask setup | build-ebpf | test | bench | image | dist`.
mod image;
mod setup;

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "socklb's developer and CI tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install everything a fresh Debian 12 machine lacks (idempotent).
    Setup,
    /// Build the eBPF object the agent embeds and print its path.
    BuildEbpf,
    /// Set up, build, and show the datapath at work on the embedded demo frontends.
    Demo,
    /// The release build in target/dist: the static binary, its shell completions and man
    /// page.
    Dist,
    /// Build the container image (static binary, FROM scratch) with podman, offline.
    Image {
        /// Image name and tag.
        #[arg(long, default_value = "localhost/socklb:dev")]
        name: String,
    },
    /// Set up, then run every test: unit tests, clippy, the code's docs, and the privileged
    /// tests (as root).
    Test {
        /// Only the tests whose name contains this filter.
        filter: Option<String>,
    },
    /// Run a benchmark, print its results and write them into its section of
    /// docs/benchmarks.md.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// connect()+close() to a VIP vs to the backend, and the programs' kernel run time,
    /// with 1, 1,000 and 10,000 services of 10 backends in the maps.
    Datapath {
        /// Connections per measurement.
        #[arg(long, default_value_t = 20_000)]
        connections: u32,
        /// Service counts to measure at.
        #[arg(long, value_delimiter = ',', default_value = "1,1000,10000")]
        services: Vec<u32>,
        /// Load the programs with a default install's capabilities (`chart`, as on a node),
        /// the chart's least (`minimal`, closeSocketsInPods=false: the verifier's Spectre
        /// hardening on) or every capability (`root`).
        #[arg(long, default_value = "chart")]
        loader: String,
        /// `on`: a `socklb trace` session runs during the measurements (what tracing
        /// costs each translation).
        #[arg(long, default_value = "off")]
        trace: String,
        /// `ipv6`: IPv6 Services beside the IPv4 ones, both families measured in the same
        /// run (connect6 beside connect4).
        #[arg(long, default_value = "ipv4")]
        family: String,
    },
    /// The real agent: cold start (file and kube sources), EndpointSlice change to map
    /// latency, and its CPU under a sustained rate of changes.
    ControlPlane {
        /// Services of 10 endpoints each.
        #[arg(long, default_value_t = 10_000)]
        services: u32,
        /// Changes timed one at a time.
        #[arg(long, default_value_t = 200)]
        changes: u32,
        /// Changes per second of the sustained load.
        #[arg(long, default_value_t = 100)]
        rate: u32,
        /// Duration of the sustained load, in seconds.
        #[arg(long, default_value_t = 10)]
        seconds: u32,
        /// Instead of the above: recovery after this many API-server outages.
        #[arg(long, default_value_t = 0)]
        outages: u32,
        /// Duration of each outage, in seconds.
        #[arg(long, default_value_t = 15)]
        outage_seconds: u32,
    },
    /// The agent with its default flags at each Service count: time to ready, peak RSS,
    /// BPF map memory, resync CPU, change latency, and VIP/direct connection setup.
    Scale {
        /// Service counts (10 endpoints each) to measure at.
        #[arg(long, default_value = "1000,10000,100000")]
        services: String,
        /// Changes timed one at a time at each count.
        #[arg(long, default_value_t = 100)]
        changes: u32,
    },
    /// One Service with very many endpoints: its first sync and the sync after a change of
    /// one endpoint, at each endpoint count.
    LargeService {
        /// Endpoint counts to measure at.
        #[arg(long, value_delimiter = ',', default_value = "5000,20000,60000")]
        endpoints: Vec<u32>,
        /// Changes timed per endpoint count.
        #[arg(long, default_value_t = 20)]
        changes: u32,
    },
    /// Closing the sockets of a removed backend: the agent's sweep (CPU and wall time) with
    /// this many connected UDP sockets open, in each socket-destroy mode.
    Destroy {
        /// Connected UDP sockets open during each sweep.
        #[arg(long, default_value_t = 50_000)]
        sockets: u32,
        /// Sweeps measured per mode.
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Modes to measure.
        #[arg(long, default_value = "bpf-iterator,netlink")]
        modes: String,
        /// The agent's socket map (ring) size: below the sockets open, the oldest are
        /// forgotten and not closed.
        #[arg(long, default_value_t = 131_072)]
        max_reverse_entries: u32,
    },
    /// Traffic from outside through a NodePort: socklb's TC programs vs kube-proxy's
    /// iptables and nftables rules vs the direct path (connection setup, iperf3).
    Nodeport {
        /// ClusterIP services ahead of the NodePort in kube-proxy's rules.
        #[arg(long, default_value_t = 1000)]
        services: u32,
        #[command(flatten)]
        flags: NodeBench,
    },
    /// A pod's connections to a ClusterIP: socklb's per-packet path vs kube-proxy's iptables
    /// and nftables rules vs socklb's socket path vs the direct path, at each Service count.
    Pod {
        /// Service counts (10 endpoints each) ahead of the measured one.
        #[arg(long, default_value = "1000,10000")]
        services: String,
        #[command(flatten)]
        flags: NodeBench,
        /// Another build's agent binary: its per-packet path is measured as one more path,
        /// against this build's, in the same run (nothing is written to docs/ then).
        #[arg(long)]
        compare_agent: Option<PathBuf>,
        /// Agent flags added to the compared agent's, e.g. "--pod-devices pod2".
        #[arg(long, allow_hyphen_values = true, requires = "compare_agent")]
        compare_flags: Option<String>,
        /// `iptables`: leave the iptables path out of the rotation (its rule walks at
        /// 10,000 Services evict the caches of the next connection of any path; nothing is
        /// written to docs/ then).
        #[arg(long, value_parser = ["iptables"])]
        without: Option<String>,
    },
    /// What each packet of a pod's connection to a ClusterIP costs the per-packet path's
    /// programs, packet by packet (BPF_PROG_TEST_RUN), with the frontend filter and
    /// without.
    Packets {
        /// Service counts (10 endpoints each) ahead of the measured one.
        #[arg(long, default_value = "1000,10000")]
        services: String,
        /// Connections replayed per Service count.
        #[arg(long, default_value_t = 4_000)]
        connections: u32,
        /// `flows`: a `socklb trace` session runs during the replay, `packets`: one with
        /// `--packets` (what tracing costs each packet); the results are printed, not
        /// written to docs/.
        #[arg(long, default_value = "off")]
        trace: String,
    },
    /// socklb side by side with kube-proxy's iptables and nftables modes (connection setup,
    /// throughput, programming time, memory) at each service count; writes the results into
    /// docs/benchmarks.md and docs/plots/.
    Compare {
        /// Service counts (10 endpoints each) to measure at [default: 100,1000,10000,30000;
        /// with --smoke: 100].
        #[arg(long, value_delimiter = ',')]
        services: Option<Vec<u32>>,
        /// Connections per peer and service position.
        #[arg(long, default_value_t = 30_000)]
        connections: u32,
        /// iptables backend of the iptables peer: legacy or nft.
        #[arg(long, default_value = "legacy")]
        iptables: String,
        /// Seconds long, 100 services, nothing written to docs/: keeps the benchmark working
        /// in CI (debug build).
        #[arg(long)]
        smoke: bool,
    },
}

/// The flags both node benchmarks (`nodeport`, `pod`) take besides their Service counts.
#[derive(Args)]
struct NodeBench {
    /// Connections per peer and round.
    #[arg(long, default_value_t = 2000)]
    connections: u32,
    /// Rounds, the peers interleaved in each.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Seconds of each iperf3 run.
    #[arg(long, default_value_t = 3)]
    seconds: u32,
    /// iptables backend of the iptables peer: legacy or nft.
    #[arg(long, default_value = "legacy")]
    iptables: String,
    /// Seconds long, 100 filler services, debug build: checks that the benchmark works.
    #[arg(long)]
    smoke: bool,
}

impl NodeBench {
    /// What `test` runs: the smoke run's own numbers, as the benchmark would clamp them.
    fn smoke() -> Self {
        Self {
            connections: 50,
            rounds: 3,
            seconds: 1,
            iptables: "legacy".to_owned(),
            smoke: true,
        }
    }
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::BuildEbpf => {
            let object = build_ebpf()?;
            println!("{}", object.display());
            Ok(())
        }
        Task::Test { filter } => test(filter.as_deref()),
        Task::Dist => {
            let root = image::dist()?;
            println!("{}", root.display());
            Ok(())
        }
        Task::Image { name } => {
            require_root("building the image with podman")?;
            setup::run()?;
            let version = image::build(&name)?;
            println!("{name}: {version}");
            Ok(())
        }
        Task::Demo => {
            require_root("the demo")?;
            setup::run()?;
            build_agent("build the agent", &["--quiet"])?;
            step(
                "demo",
                &[
                    "run",
                    "--quiet",
                    "--package",
                    "socklb-tests",
                    "--bin",
                    "socklb-demo",
                ],
            )
        }
        Task::Bench { bench } => {
            setup::run()?;
            match bench {
                Bench::Datapath {
                    connections,
                    services,
                    loader,
                    trace,
                    family,
                } => {
                    // The release agent, next to the benchmark binary: the trace session
                    // runs it, and the sandbox's cleanup (`socklb cleanup`) always does.
                    build_agent("build the agent", &["--quiet", "--release"])?;
                    let services: Vec<String> = services.iter().map(u32::to_string).collect();
                    let args = [
                        "datapath".to_owned(),
                        "--docs".to_owned(),
                        docs_dir()?,
                        "--connections".to_owned(),
                        connections.to_string(),
                        "--services".to_owned(),
                        services.join(","),
                        "--loader".to_owned(),
                        loader,
                        "--trace".to_owned(),
                        trace,
                        "--family".to_owned(),
                        family,
                    ];
                    run_bench("socklb-bench", true, &args)
                }
                Bench::ControlPlane {
                    services,
                    changes,
                    rate,
                    seconds,
                    outages,
                    outage_seconds,
                } => {
                    let mut args = flag_args(&[
                        ("--services", services),
                        ("--changes", changes),
                        ("--rate", rate),
                        ("--seconds", seconds),
                        ("--outages", outages),
                        ("--outage-seconds", outage_seconds),
                    ]);
                    args.extend(["--docs".to_owned(), docs_dir()?]);
                    run_with_agent("socklb-bench-control-plane", &args)
                }
                Bench::Scale { services, changes } => run_with_agent(
                    "socklb-bench-control-plane",
                    &[
                        "--scale".to_owned(),
                        services,
                        "--changes".to_owned(),
                        changes.to_string(),
                        "--docs".to_owned(),
                        docs_dir()?,
                    ],
                ),
                Bench::LargeService { endpoints, changes } => {
                    let endpoints: Vec<String> = endpoints.iter().map(u32::to_string).collect();
                    run_with_agent(
                        "socklb-bench-large-service",
                        &[
                            "--endpoints".to_owned(),
                            endpoints.join(","),
                            "--changes".to_owned(),
                            changes.to_string(),
                            "--docs".to_owned(),
                            docs_dir()?,
                        ],
                    )
                }
                Bench::Destroy {
                    sockets,
                    rounds,
                    modes,
                    max_reverse_entries,
                } => {
                    require_root("the socket destroy benchmark")?;
                    // The client that holds the sockets, next to the benchmark.
                    step(
                        "build the socket holder (release)",
                        &[
                            "build",
                            "--release",
                            "--package",
                            "socklb-tests",
                            "--bin",
                            "socklb-hold",
                        ],
                    )?;
                    let mut args = flag_args(&[
                        ("--sockets", sockets),
                        ("--rounds", rounds),
                        ("--max-reverse-entries", max_reverse_entries),
                    ]);
                    args.extend([
                        "--modes".to_owned(),
                        modes,
                        "--docs".to_owned(),
                        docs_dir()?,
                    ]);
                    run_with_agent("socklb-bench-destroy", &args)
                }
                Bench::Nodeport { services, flags } => {
                    node_bench(NODEPORT, &services.to_string(), &flags, Vec::new())
                }
                Bench::Pod {
                    services,
                    flags,
                    compare_agent,
                    compare_flags,
                    without,
                } => {
                    let mut extra = Vec::new();
                    if let Some(binary) = compare_agent {
                        let binary = std::path::absolute(&binary)
                            .with_context(|| format!("{}", binary.display()))?;
                        if !binary.is_file() {
                            bail!("--compare-agent: no agent binary at {}", binary.display());
                        }
                        let binary = binary
                            .to_str()
                            .context("--compare-agent: a path in UTF-8")?
                            .to_owned();
                        extra.extend(["--compare-agent".to_owned(), binary]);
                    }
                    if let Some(added) = compare_flags {
                        extra.extend(["--compare-flags".to_owned(), added]);
                    }
                    if let Some(path) = without {
                        extra.extend(["--without".to_owned(), path]);
                    }
                    node_bench(POD, &services, &flags, extra)
                }
                Bench::Packets {
                    services,
                    connections,
                    trace,
                } => {
                    require_root("the packet benchmark")?;
                    let mut args = flag_args(&[("--connections", connections)]);
                    args.extend(["--services".to_owned(), services, "--trace".to_owned()]);
                    args.extend([trace, "--docs".to_owned()]);
                    args.push(docs_dir()?);
                    run_with_agent("socklb-bench-packets", &args)
                }
                Bench::Compare {
                    services,
                    connections,
                    iptables,
                    smoke,
                } => compare(services.as_deref(), connections, &iptables, smoke),
            }
        }
    }
}

/// A benchmark that runs the agent binary next to it: both in the release build.
fn run_with_agent(bench: &str, args: &[String]) -> anyhow::Result<()> {
    build_agent("build the agent (release)", &["--release"])?;
    run_bench(bench, true, args)
}

fn flag_args(flags: &[(&str, u32)]) -> Vec<String> {
    flags
        .iter()
        .flat_map(|(flag, value)| [(*flag).to_owned(), value.to_string()])
        .collect()
}

/// A node benchmark's binary and what it is (for the message that it needs root).
const NODEPORT: (&str, &str) = ("socklb-bench-nodeport", "the NodePort benchmark");
const POD: (&str, &str) = ("socklb-bench-pod", "the pod benchmark");

/// `bench nodeport` and `bench pod`: release build, or the debug build for the smoke run.
fn node_bench(
    (bench, what): (&str, &str),
    services: &str,
    flags: &NodeBench,
    extra: Vec<String>,
) -> anyhow::Result<()> {
    require_root(what)?;
    let mut args = flag_args(&[
        ("--connections", flags.connections),
        ("--rounds", flags.rounds),
        ("--seconds", flags.seconds),
    ]);
    args.extend(["--services", services, "--iptables", &flags.iptables].map(str::to_owned));
    args.extend(extra);
    if !flags.smoke {
        args.extend(["--docs".to_owned(), docs_dir()?]);
        return run_with_agent(bench, &args);
    }
    args.push("--smoke".to_owned());
    smoke_run(bench, &args)
}

/// A benchmark's smoke run: the debug build of the agent and the benchmark (which `test`
/// has built).
fn smoke_run(bench: &str, args: &[String]) -> anyhow::Result<()> {
    build_agent("build the agent", &[])?;
    run_bench(bench, false, args)
}

/// `bench compare`: the benchmark runs the agent binary next to it, so both are built in the
/// same profile: release for measurements, debug for the smoke run (which `test` has built).
fn compare(
    services: Option<&[u32]>,
    connections: u32,
    iptables: &str,
    smoke: bool,
) -> anyhow::Result<()> {
    require_root("the comparison benchmark")?;
    let mut args = vec![
        "--connections".to_owned(),
        connections.to_string(),
        "--iptables".to_owned(),
        iptables.to_owned(),
    ];
    // Without counts, the benchmark's own defaults: every size, or 100 for the smoke run.
    if let Some(services) = services {
        let services: Vec<String> = services.iter().map(u32::to_string).collect();
        args.extend(["--services".to_owned(), services.join(",")]);
    }
    if smoke {
        args.push("--smoke".to_owned());
        return smoke_run("socklb-bench-compare", &args);
    }
    args.extend(["--docs".to_owned(), docs_dir()?]);
    run_with_agent("socklb-bench-compare", &args)
}

/// The workspace's docs directory: a benchmark's full run rewrites its own section of
/// benchmarks.md there (smoke runs write nothing).
fn docs_dir() -> anyhow::Result<String> {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("the workspace directory")?
        .join("docs");
    Ok(docs.display().to_string())
}

/// Builds the agent (whose build script builds the eBPF crate) and returns the object it
/// embeds, so that what one inspects is exactly what the agent loads.
fn build_ebpf() -> anyhow::Result<PathBuf> {
    let output = Command::new(cargo())
        .args([
            "build",
            "--package",
            "socklb-agent",
            "--lib",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo build")?;
    if !output.status.success() {
        bail!("building the agent (and its eBPF object) failed; did `cargo xtask setup` run?");
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The build-script-executed message of socklb-agent names its OUT_DIR.
    let out_dir = stdout
        .lines()
        .filter(|line| line.contains("\"build-script-executed\"") && line.contains("socklb-agent"))
        .find_map(|line| {
            let start = line.find("\"out_dir\":\"")? + "\"out_dir\":\"".len();
            let end = line[start..].find('"')? + start;
            Some(PathBuf::from(&line[start..end]))
        })
        .context("cargo did not report the agent's build script output directory")?;
    let object = out_dir.join("socklb");
    if !object.is_file() {
        bail!("expected the eBPF object at {}", object.display());
    }
    Ok(object)
}

fn require_root(what: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "{what} loads BPF programs and creates network namespaces and cgroups: run it as \
             root, or through `./x`, which asks sudo for root when there is one"
        );
    }
    Ok(())
}

fn test(filter: Option<&str>) -> anyhow::Result<()> {
    require_root("the test suite")?;
    setup::run()?;
    // The default members: every crate but the eBPF one, which only builds for the bpf target.
    step(
        "clippy",
        &["clippy", "--all-targets", "--", "-D", "warnings"],
    )?;
    ebpf_clippy()?;
    // The code's docs are read with their private items; a broken link fails like a lint.
    step(
        "docs",
        &[
            "doc",
            "--no-deps",
            "--document-private-items",
            "--config",
            "build.rustdocflags=['-D', 'warnings']",
        ],
    )?;
    // The privileged tests start the real agent binary.
    build_agent("build the agent", &[])?;
    // --all-targets: unit, integration and binary tests (there are no doc tests).
    let mut args = vec!["test", "--all-targets", "--no-fail-fast"];
    if let Some(filter) = filter {
        args.push(filter);
    }
    eprintln!("==> tests (unit and privileged): cargo {}", args.join(" "));
    let mut child = Command::new(cargo())
        .args(&args)
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let stdout = child.stdout.take().context("cargo test stdout")?;
    let (mut passed, mut failed) = (0u64, 0u64);
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo test output")?;
        println!("{line}");
        if let Some((p, f)) = parse_test_result(&line) {
            passed += p;
            failed += f;
        }
    }
    let status = child.wait().context("waiting for cargo test")?;
    // The Helm chart, with a real Helm engine (charts/check.sh), on full runs.
    let chart_ok = match filter {
        Some(_) => true,
        None => {
            let (chart_passed, chart_failed, ok) = chart_check()?;
            passed += chart_passed;
            failed += chart_failed;
            ok
        }
    };
    // The container image builds and its binary runs, on full runs.
    let image_ok = match filter {
        Some(_) => true,
        None => {
            let ok = image_check();
            if ok {
                passed += 1;
            } else {
                failed += 1;
            }
            ok
        }
    };
    // The benchmarks stay working: seconds-long smoke runs, on full runs.
    let benchmarks_ok = match filter {
        Some(_) => true,
        None => {
            let smokes = [
                ("compare", compare(None, 500, "legacy", true)),
                (
                    "nodeport",
                    node_bench(NODEPORT, "100", &NodeBench::smoke(), Vec::new()),
                ),
                (
                    "pod",
                    node_bench(POD, "100", &NodeBench::smoke(), Vec::new()),
                ),
                (
                    "packets",
                    smoke_run("socklb-bench-packets", &["--smoke".to_owned()]),
                ),
                (
                    "scale",
                    smoke_run(
                        "socklb-bench-control-plane",
                        &["--scale", "200", "--changes", "5"].map(str::to_owned),
                    ),
                ),
                // The debug socket holder is built by `cargo test` (every binary).
                (
                    "destroy",
                    smoke_run(
                        "socklb-bench-destroy",
                        &["--sockets", "2000", "--rounds", "1"].map(str::to_owned),
                    ),
                ),
            ];
            let mut all_ok = true;
            for (name, result) in smokes {
                match result {
                    Ok(()) => passed += 1,
                    Err(error) => {
                        eprintln!("==> bench {name} --smoke failed: {error:#}");
                        failed += 1;
                        all_ok = false;
                    }
                }
            }
            all_ok
        }
    };
    // One closing line for the whole run, across all test binaries and the chart check.
    println!("{passed} passed, {failed} failed");
    if !status.success() {
        bail!("tests failed ({status})");
    }
    if !chart_ok {
        bail!("the chart check failed");
    }
    if !image_ok {
        bail!("the image check failed");
    }
    if !benchmarks_ok {
        bail!("a benchmark's smoke run failed");
    }
    if passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// Builds the image and checks that its binary is the agent just built.
fn image_check() -> bool {
    let name = "localhost/socklb:test";
    let expected = Command::new("target/debug/socklb").arg("version").output();
    let built = image::build(name);
    if built.is_ok()
        && let Err(error) = image::remove(name)
    {
        println!("FAIL image {name} not removed: {error:#}");
        return false;
    }
    match (built, expected) {
        (Ok(inside), Ok(expected))
            if inside == String::from_utf8_lossy(&expected.stdout).trim() =>
        {
            println!("ok   image {name} runs: {inside}");
            true
        }
        (Ok(inside), _) => {
            println!("FAIL image {name}: its binary says {inside:?}");
            false
        }
        (Err(error), _) => {
            println!("FAIL image {name}: {error:#}");
            false
        }
    }
}

/// Runs charts/check.sh against the agent just built; returns its counts and success.
fn chart_check() -> anyhow::Result<(u64, u64, bool)> {
    eprintln!("==> chart: bash charts/check.sh");
    let mut child = Command::new("bash")
        .arg("charts/check.sh")
        .env("SOCKLB_BIN", "target/debug/socklb")
        .stdout(Stdio::piped())
        .spawn()
        .context("running charts/check.sh")?;
    let stdout = child.stdout.take().context("charts/check.sh stdout")?;
    let mut counts = (0, 0);
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading charts/check.sh output")?;
        // Its own closing line is folded into the run's total, not repeated.
        match line.split_once(" passed, ").and_then(|(p, rest)| {
            Some((p.parse().ok()?, rest.strip_suffix(" failed")?.parse().ok()?))
        }) {
            Some(found) => counts = found,
            None => println!("{line}"),
        }
    }
    let status = child.wait().context("waiting for charts/check.sh")?;
    Ok((counts.0, counts.1, status.success()))
}

/// Counts from libtest's `test result: ok. 12 passed; 0 failed; ...` line.
fn parse_test_result(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("test result: ")?;
    let count = |label: &str| {
        rest.split(';').find_map(|part| {
            let words: Vec<&str> = part.split_whitespace().collect();
            match words.as_slice() {
                [.., number, word] if *word == label => number.parse::<u64>().ok(),
                _ => None,
            }
        })
    };
    Some((count("passed")?, count("failed")?))
}

/// Clippy on the kernel programs, with the nightly that builds them for the bpf target.
fn ebpf_clippy() -> anyhow::Result<()> {
    let toolchain = format!("+{}", setup::EBPF_TOOLCHAIN);
    let args = [
        toolchain.as_str(),
        "clippy",
        "--package",
        "socklb-ebpf",
        "--bins",
        "--target",
        "bpfel-unknown-none",
        "-Zbuild-std=core",
        "--target-dir",
        "target/ebpf-clippy",
        "--",
        "-D",
        "warnings",
    ];
    eprintln!("==> clippy (eBPF programs): cargo {}", args.join(" "));
    // The rustup proxy (not $CARGO, the host toolchain's own cargo) honours `+toolchain`.
    let status = Command::new("cargo")
        .args(args)
        .env_remove("RUSTUP_TOOLCHAIN")
        .status()
        .context("running cargo clippy for the eBPF programs")?;
    if !status.success() {
        bail!("clippy (eBPF programs) failed ({status})");
    }
    Ok(())
}

/// Runs benchmark `bench` with `args`: its release build measures, its debug build is a
/// smoke run.
fn run_bench(bench: &str, release: bool, args: &[String]) -> anyhow::Result<()> {
    let mut full = vec![
        "run",
        "--quiet",
        "--package",
        "socklb-tests",
        "--bin",
        bench,
    ];
    let what = if release {
        full.push("--release");
        format!("benchmark {bench}")
    } else {
        format!("benchmark {bench} (smoke)")
    };
    full.push("--");
    full.extend(args.iter().map(String::as_str));
    step(&what, &full)
}

/// Builds the agent binary; `extra` adds cargo arguments (`--release`, a target).
fn build_agent(what: &str, extra: &[&str]) -> anyhow::Result<()> {
    let mut args = vec!["build", "--package", "socklb-agent", "--bins"];
    args.extend_from_slice(extra);
    step(what, &args)
}

fn step(what: &str, args: &[&str]) -> anyhow::Result<()> {
    eprintln!("==> {what}: cargo {}", args.join(" "));
    let status = Command::new(cargo())
        .args(args)
        .status()
        .with_context(|| format!("running cargo for {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}
