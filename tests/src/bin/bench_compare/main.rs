//! `cargo xtask bench compare`: socklb side by side with kube-proxy's iptables and nftables
//! modes, from 100 to 30,000 services of 10 endpoints, measured on the same machine in the
//! same run with the peers interleaved.
//!
//! socklb-bench-compare [--services 100,1000,10000,30000] [--connections N] [--changes N]
//!                      [--iperf-seconds S] [--iptables legacy|nft] [--load-limit SECONDS]
//!                      [--docs DIR] [--smoke]
//!
//! The world (all of it private to this process, every name prefixed `slbcmp`):
//! - a server network namespace: real TCP servers on every endpoint address (one listener on
//!   0.0.0.0:8080 and a `local` route for 10.128.0.0/9) that answer each connection with the
//!   4 bytes of the address it reached, and an iperf3 server;
//! - one client network namespace per peer, each with its own veth pair to the server
//!   namespace: `direct` (nothing), `socklb` (nothing in netfilter; the client runs in the
//!   child cgroup where the real agent's programs are attached), `iptables` (kube-proxy's
//!   iptables-mode ruleset, loaded with iptables-restore) and `nftables` (kube-proxy's
//!   nftables-mode table, loaded with nft -f). iptables rules are per network namespace, so
//!   each rule set lives only in its own namespace, never in the host's.
//!
//! The namespaces are anonymous (held by file descriptors of this process): they, their
//! rules, conntrack tables and veth pairs disappear when it exits, however it exits. The
//! agent's pins and cgroup (the harness's `Sandbox`), the manifests and the scratch files are
//! removed by guards, and on SIGINT/SIGTERM/SIGHUP by a cleanup thread.
//!
//! The timed client is this binary again (`client`, socklb_tests::bench::client).
//!
//! Modules: `step` programs and measures the peers at one service count, `report` writes
//! the tables, `plot` the figures.
use std::{
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail, ensure};
use socklb_tests::{
    ManifestDir, Sandbox,
    bench::{
        baseline, client,
        cluster::{ENDPOINT_PORT, ENDPOINT_RANGE, MAX_SERVICES, cluster},
        flags::Flags,
        kube_proxy::{self, iptables::IptablesSync},
        loader::IptablesBackend,
        netns::{new_netns, run_in},
        server::Servers,
    },
};

mod plot;
mod report;
mod step;

const USAGE: &str = "usage: socklb-bench-compare [--services 100,1000,10000,30000] \
                     [--connections N] [--changes N] [--iperf-seconds S] \
                     [--iptables legacy|nft] [--load-limit SECONDS] [--docs DIR] [--smoke]";
/// The pod network (clients and endpoints are inside it, so kube-proxy's "not from a pod"
/// masquerade rule does not fire: the usual pod-to-service path) and the node's address.
const KUBE_PROXY: kube_proxy::Config = kube_proxy::Config {
    pod_cidr: "10.0.0.0/8",
    node_ip: "192.168.0.1",
};
/// Timed batches per cell; the cells (peer x service position) alternate in every round, in
/// a new order each round, so that drift hits every peer alike.
const ROUNDS: u32 = 150;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.split_first() {
        Some((command, _)) if command == "client" => client::run(),
        Some((command, rest)) if command == "ruleset" => ruleset(rest),
        _ => compare(&args),
    };
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

/// `ruleset iptables|nftables N`: prints what the benchmark loads for N services, to read
/// or to load by hand.
fn ruleset(args: &[String]) -> anyhow::Result<()> {
    let [mode, services] = args else {
        bail!("usage: socklb-bench-compare ruleset iptables|nftables N");
    };
    let services: u32 = services.parse().context("N: a number of services")?;
    let cluster = cluster(services);
    match mode.as_str() {
        "iptables" => print!(
            "{}",
            kube_proxy::iptables::restore_input(&KUBE_PROXY, &cluster, IptablesSync::Initial)
        ),
        "nftables" => print!("{}", kube_proxy::nftables::initial(&KUBE_PROXY, &cluster)),
        _ => bail!("ruleset iptables|nftables N, not {mode}"),
    }
    Ok(())
}

pub struct Options {
    pub services: Vec<u32>,
    pub connections: u32,
    pub changes: u32,
    pub iperf_seconds: u32,
    pub iperf_rounds: u32,
    pub iptables: IptablesBackend,
    /// A rule load still running after this is stopped and its peer left out at that N.
    pub load_limit: Duration,
    pub docs: Option<PathBuf>,
    pub smoke: bool,
}

fn parse_options(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        services: vec![100, 1_000, 10_000, 30_000],
        connections: 30_000,
        changes: 3,
        iperf_seconds: 3,
        iperf_rounds: 2,
        iptables: IptablesBackend::Legacy,
        load_limit: Duration::from_secs(300),
        docs: None,
        smoke: false,
    };
    let mut services_given = false;
    let mut flags = Flags::new(args, USAGE);
    while let Some((flag, value)) = flags.next_flag()? {
        let number = || flags.number(flag, value);
        match flag {
            "--services" => {
                options.services = flags.numbers(flag, value, "100,1000")?;
                services_given = true;
            }
            "--connections" => options.connections = number()?,
            "--changes" => options.changes = number()?,
            "--iperf-seconds" => options.iperf_seconds = number()?,
            "--load-limit" => options.load_limit = Duration::from_secs(u64::from(number()?)),
            "--iptables" => options.iptables = IptablesBackend::parse(value).context(USAGE)?,
            "--docs" => options.docs = Some(PathBuf::from(value)),
            _ => bail!("unknown flag {flag}\n{USAGE}"),
        }
    }
    options.smoke = flags.smoke;
    if options.smoke {
        // Seconds long: keeps the benchmark working in CI, measures nothing worth keeping.
        if !services_given {
            options.services = vec![100];
        }
        options.connections = options.connections.min(500);
        options.changes = 1;
        options.iperf_seconds = 1;
        options.iperf_rounds = 1;
        options.docs = None;
    }
    let growing = options.services.windows(2).all(|pair| pair[0] < pair[1]);
    let in_range = options
        .services
        .iter()
        .all(|count| (4..=MAX_SERVICES).contains(count));
    ensure!(
        !options.services.is_empty() && growing && in_range,
        "--services must be increasing counts between 4 and {MAX_SERVICES}"
    );
    ensure!(
        options.connections >= ROUNDS && options.changes >= 1 && options.iperf_seconds >= 1,
        "--connections must be at least {ROUNDS}, --changes and --iperf-seconds at least 1"
    );
    Ok(options)
}

fn compare(args: &[String]) -> anyhow::Result<()> {
    let options = parse_options(args)?;
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "the benchmark creates network namespaces, loads netfilter rules and BPF programs: \
         run it as root (e.g. `sudo cargo xtask bench compare`)"
    );
    for (program, package) in [
        (options.iptables.restore(), "iptables"),
        ("nft", "nftables"),
        ("iperf3", "iperf3"),
        ("ip", "iproute2"),
    ] {
        ensure!(
            which(program),
            "{program} is missing: install {package} (`cargo xtask setup` does)"
        );
    }
    // Before any thread exists, so that only the cleanup thread sees these signals.
    let signals = socklb_tests::block_termination_signals();
    let machine = socklb_tests::machine_context();
    let sandbox = Sandbox::new("bench-compare");
    let manifests = ManifestDir::new(&sandbox);
    let scratch = Scratch::new(&sandbox)?;
    socklb_tests::cleanup_on_signal(
        signals,
        socklb_tests::Leftovers {
            pin_dir: sandbox.pin_dir.clone(),
            cgroup: sandbox.cgroup.clone(),
            dirs: vec![manifests.path.clone(), scratch.path.clone()],
            also: None,
        },
    );
    let mut server = server_side()?;
    let mut run = step::Run {
        options: &options,
        sandbox: &sandbox,
        manifests: &manifests,
        scratch: &scratch.path,
        server: &mut server,
        next_slot: 0,
        changes: 0,
    };
    let mut steps = Vec::new();
    let began = Instant::now();
    for &services in &options.services {
        steps.push(run.step(services)?);
    }
    eprintln!("measured in {:.0?}", began.elapsed());
    let report = report::report(&machine, &options, &steps);
    println!("{report}");
    if let Some(docs) = &options.docs {
        report::write_docs(docs, &report, &steps)?;
    }
    Ok(())
}

/// The server namespace, the pods: every endpoint address is local there (one listener serves
/// them all).
fn server_side() -> anyhow::Result<Servers> {
    let netns = new_netns()?;
    run_in(&netns, "ip", &["link", "set", "lo", "up"])?;
    baseline::pod(&netns)?;
    run_in(
        &netns,
        "ip",
        &["route", "add", "local", ENDPOINT_RANGE, "dev", "lo"],
    )?;
    Servers::start(
        netns,
        std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, ENDPOINT_PORT),
    )
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}

/// Files handed to the rule loaders; removed when dropped.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn new(sandbox: &Sandbox) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(format!("slbcmp-{}", sandbox.name));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}
