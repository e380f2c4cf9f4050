//! `cargo xtask bench datapath`: what socket translation costs a client. It times
//! connect()+close() to a service VIP against the same connections made directly to the
//! service's backends, in one client process and interleaved, with 1, 1,000 and 10,000
//! services of 10 backends in the maps, and reads the programs' kernel run time (BPF stats).
//!
//! socklb-bench datapath [--connections N] [--services 1,1000,10000]
//!     [--loader chart|minimal|root]
//!     [--trace on|off] [--family ipv4|ipv6] [--docs DIR]
//!
//! `--family ipv6` puts as many IPv6 Services as IPv4 ones in the maps and measures both
//! families in the same run, IPv6 sockets to an IPv6 VIP (connect6) beside IPv4 ones
//! (connect4): what IPv6 costs, and that IPv4 did not get slower for it.
//!
//! `--trace on` runs a `socklb trace -o json` session (its output discarded) during every
//! measurement: what tracing costs each translation.
//!
//! The programs are loaded with a default install's capabilities (the chart's default values:
//! BPF, NET_ADMIN, SYS_ADMIN), as on a node. `--loader minimal` loads them with the chart's
//! least (`closeSocketsInPods=false`: BPF, NET_ADMIN), under which the verifier applies its
//! Spectre hardening (masking of pointer arithmetic, speculation barriers), which it skips
//! for a loader with CAP_PERFMON or CAP_SYS_ADMIN; `--loader root` loads with every
//! capability.
//!
//! Only processes in the sandbox cgroup are translated, so the timed client is this binary
//! again, started inside the cgroup with the hidden `client` subcommand; it prints one JSON
//! line that the parent turns into a markdown table.
//!
//! With `--docs DIR`, the table also replaces the `datapath` (or, with `--family ipv6`,
//! `datapath ipv6`) section of DIR/benchmarks.md. Runs with `--trace on` or another loader
//! only print: their figures are read against other runs, which the page keeps by hand.
use std::{
    fmt::Write as _,
    io,
    mem::size_of,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::Stdio,
    ptr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::programs::{
    links::{FdLink, PinnedLink},
    loaded_programs,
};
use serde::{Deserialize, Serialize};
use socklb_abi::{Counters, program_names};
use socklb_agent::dataplane::{
    self, BackendAddr, Capacities, Config, Dataplane, Desired, Frontend, FrontendSpec, Protocol,
    Scope,
};
use socklb_tests::{
    Sandbox,
    bench::{section::Section, trace_session::TraceSession},
    family::Family,
    privileges,
};

const USAGE: &str = "usage: socklb-bench datapath [--connections N] [--services 1,1000,10000] [--loader chart|minimal|root] [--trace on|off] [--family ipv4|ipv6] [--docs DIR]";
const BACKENDS_PER_SERVICE: u32 = 10;
/// Each measurement is split into this many VIP and direct batches, alternating which goes
/// first, so that drift on a noisy machine hits both sides alike. Short batches matter: with
/// 20 rounds the VIP/direct ratio of one run spread over 0.99-1.09, with 100 over 1.01-1.04.
const ROUNDS: u32 = 100;
const SERVICE_PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;
/// Above the connections a batch can leave unaccepted: a full accept queue drops SYNs and
/// the retransmit adds a 1 s stall that would look like datapath latency.
const BACKLOG: i32 = 4096;
/// Untimed VIP connections that call getpeername(), only to read getpeername4's run time.
const PEERNAME_CONNECTS: u32 = 2_000;
/// Keeps the address plan (10.96.0.0/12 VIPs, 127.128.0.0/9 placeholder backends) and the
/// maps within reason.
const MAX_SERVICES: u32 = 100_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((command, rest)) if command == "datapath" => datapath(rest),
        Some((command, rest)) if command == "client" => client(rest),
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2);
}

struct Options {
    connections: u32,
    services: Vec<u32>,
    /// With which capabilities the programs are loaded.
    loader: Loader,
    /// A trace session runs during the measurements.
    trace: bool,
    /// The families measured, each with its own Services in the maps.
    families: Vec<Family>,
    /// Where benchmarks.md is, to rewrite this run's section.
    docs: Option<PathBuf>,
}

/// Whose capabilities load the programs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Loader {
    /// A default install's agent (the chart's default values).
    Chart,
    /// The chart's least (`closeSocketsInPods=false`): the verifier's Spectre hardening on.
    Minimal,
    /// Every capability.
    Root,
}

/// IPv4 alone, loaded as a default install loads, no trace session.
const SECTION: Section = Section::new("datapath", "datapath", "Datapath: socket translation cost");
/// `--family ipv6`, loaded as a default install loads, no trace session.
const SECTION_IPV6: Section = Section::new("datapath ipv6", "datapath", "Datapath over IPv6");

fn parse_options(args: &[String]) -> Options {
    let mut options = Options {
        connections: 20_000,
        services: vec![1, 1_000, 10_000],
        loader: Loader::Chart,
        trace: false,
        families: vec![Family::V4],
        docs: None,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--connections" => options.connections = value.parse().unwrap_or_else(|_| usage()),
            "--services" => {
                options.services = value
                    .split(',')
                    .map(|count| count.trim().parse())
                    .collect::<Result<_, _>>()
                    .unwrap_or_else(|_| usage());
            }
            "--loader" => {
                options.loader = match value.as_str() {
                    "chart" => Loader::Chart,
                    "minimal" => Loader::Minimal,
                    "root" => Loader::Root,
                    _ => usage(),
                }
            }
            "--trace" => {
                options.trace = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => usage(),
                }
            }
            "--family" => {
                options.families = match value.as_str() {
                    "ipv4" => vec![Family::V4],
                    // IPv4 measured in the same run, for comparison.
                    "ipv6" => vec![Family::V4, Family::V6],
                    _ => usage(),
                }
            }
            "--docs" => options.docs = Some(PathBuf::from(value)),
            _ => usage(),
        }
    }
    if options.connections < ROUNDS {
        eprintln!("--connections must be at least {ROUNDS} (one per round)");
        std::process::exit(2);
    }
    // The same maps grow from step to step, as a cluster's would.
    let growing = options.services.windows(2).all(|pair| pair[0] < pair[1]);
    let in_range = options
        .services
        .iter()
        .all(|count| (1..=MAX_SERVICES).contains(count));
    if options.services.is_empty() || !growing || !in_range {
        eprintln!("--services must be increasing counts between 1 and {MAX_SERVICES}");
        std::process::exit(2);
    }
    options
}

/// One measurement, as the client reports it.
#[derive(Debug, Serialize, Deserialize)]
struct Measurement {
    vip: Latency,
    direct: Latency,
    /// connect4 or connect6 during the VIP batches (lookup hit and translation).
    connect_vip: RunTime,
    /// connect4 or connect6 during the direct batches (the lookup miss every other connect
    /// pays).
    connect_direct: RunTime,
    getpeername: RunTime,
    /// Every VIP connection the client made (timed, warm-up and getpeername ones).
    vip_connects: u64,
    /// Every direct connection the client made.
    direct_connects: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Latency {
    p50_ns: u64,
    p99_ns: u64,
    samples: u64,
}

impl Latency {
    fn of(mut samples: Vec<u64>) -> Self {
        samples.sort_unstable();
        Self {
            p50_ns: percentile(&samples, 50),
            p99_ns: percentile(&samples, 99),
            samples: samples.len() as u64,
        }
    }
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[u64], percent: usize) -> u64 {
    let rank = (sorted.len() * percent).div_ceil(100).max(1);
    sorted.get(rank - 1).copied().unwrap_or(0)
}

/// A program's accumulated kernel run time, as BPF stats count it.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct RunTime {
    run_ns: u64,
    runs: u64,
}

impl RunTime {
    fn since(self, before: Self) -> Self {
        Self {
            run_ns: self.run_ns.saturating_sub(before.run_ns),
            runs: self.runs.saturating_sub(before.runs),
        }
    }

    fn add(&mut self, other: Self) {
        self.run_ns += other.run_ns;
        self.runs += other.runs;
    }

    fn per_call_ns(self) -> Option<f64> {
        (self.runs > 0).then(|| self.run_ns as f64 / self.runs as f64)
    }
}

// ---------------------------------------------------------------------------------------
// Parent: sandbox, servers, maps, and the report.

fn datapath(args: &[String]) {
    let options = parse_options(args);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "the benchmark loads BPF programs and creates a network namespace and a cgroup: run \
             it as root (e.g. `sudo cargo xtask bench datapath`)"
        );
        std::process::exit(1);
    }
    // Before any thread exists, so that every thread inherits the mask and only the
    // cleanup thread sees these signals.
    let signals = socklb_tests::block_termination_signals();
    let machine = socklb_tests::machine_context();
    let sandbox = Sandbox::new("bench");
    socklb_tests::cleanup_on_signal(
        signals,
        socklb_tests::Leftovers {
            pin_dir: sandbox.pin_dir.clone(),
            cgroup: sandbox.cgroup.clone(),
            dirs: Vec::new(),
            also: None,
        },
    );

    let real: Vec<SocketAddr> = options
        .families
        .iter()
        .flat_map(|&family| real_backends(&sandbox, family))
        .collect();
    let servers = Servers::start(&real);
    let max_services = options.services.iter().copied().max().unwrap_or(1);
    let config = Config {
        // Both families' entries count against one capacity.
        capacities: capacities(max_services * options.families.len() as u32),
        ..sandbox.config()
    };
    let dataplane = match options.loader {
        Loader::Chart => privileges::chart_agent().within(|| Dataplane::load(config)),
        Loader::Minimal => sandbox.load(config),
        Loader::Root => Dataplane::load(config),
    };
    let mut dataplane = dataplane.expect("load the datapath");
    // Run-time stats are counted only while this fd is open.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .expect("enable BPF run-time stats (BPF_ENABLE_STATS needs CAP_SYS_ADMIN)");

    let mut attached = false;
    let mut rows = Vec::new();
    for &services in &options.services {
        // The middle service by index; its backends are the real servers.
        let measured = services / 2;
        let started = Instant::now();
        let report = dataplane
            .apply(&desired(&sandbox, &options.families, services, measured))
            .expect("apply the services to the maps");
        assert!(
            report.rejected.is_empty(),
            "{services} services do not fit the maps: {:?}",
            report.rejected
        );
        eprintln!(
            "{services} services x {BACKENDS_PER_SERVICE} backends: {} map writes in {:.1?}",
            report.writes,
            started.elapsed()
        );
        if !attached {
            dataplane.attach().expect("attach the programs");
            attached = true;
        }
        for &family in &options.families {
            // Read after every apply: a map that grew swapped new programs into the links.
            let [connect, getpeername] = programs(family);
            let ids = [
                program_id(&sandbox.pin_dir, connect),
                program_id(&sandbox.pin_dir, getpeername),
            ];

            let trace = options
                .trace
                .then(|| TraceSession::start(&sandbox.pin_dir, &[]));
            let counters_before = dataplane.counters().expect("read the counters");
            let accepted_before = servers.accepted();
            let measurement = run_client(
                &sandbox,
                vip(family, measured),
                &real_backends(&sandbox, family),
                ids,
                options.connections,
            );
            if let Some(trace) = trace {
                trace.stop();
            }
            let counters = dataplane
                .counters()
                .expect("read the counters")
                .since(&counters_before);
            check(&measurement, &counters);
            servers
                .wait_for(accepted_before + measurement.vip_connects + measurement.direct_connects);
            rows.push((services, family, measurement));
        }
    }
    drop(servers);

    let report = report(&machine, &options, &rows);
    print!("{report}");
    if let Some(docs) = &options.docs {
        let section = if options.families.contains(&Family::V6) {
            &SECTION_IPV6
        } else {
            &SECTION
        };
        if options.loader == Loader::Chart && !options.trace {
            section
                .write(docs, &report)
                .expect("write the results into the docs");
        } else {
            eprintln!("--trace on and --loader minimal|root runs are not written into the docs");
        }
    }
}

/// The connect and getpeername programs that serve `family`'s sockets.
fn programs(family: Family) -> [&'static str; 2] {
    match family {
        Family::V4 => [program_names::CONNECT4, program_names::GETPEERNAME4],
        Family::V6 => [program_names::CONNECT6, program_names::GETPEERNAME6],
    }
}

/// The measured service's backends: 127.0.1.1.. or fd00:0:0:1::1.. (on the sandbox's lo).
fn real_backends(sandbox: &Sandbox, family: Family) -> Vec<SocketAddr> {
    (1..=BACKENDS_PER_SERVICE)
        .map(|i| {
            let host = u8::try_from(i).expect("fewer than 256 backends");
            SocketAddr::new(family.local(sandbox, 1, host), BACKEND_PORT)
        })
        .collect()
}

/// Service `index`'s VIP, from 10.96.0.1 or fd00:96::1 upwards.
fn vip(family: Family, index: u32) -> SocketAddr {
    let address: IpAddr = match family {
        Family::V4 => Ipv4Addr::from(0x0a60_0001 + index).into(),
        Family::V6 => Ipv6Addr::from(0xfd00_0096_u128 << 96 | u128::from(1 + index)).into(),
    };
    SocketAddr::new(address, SERVICE_PORT)
}

/// A distinct backend of every other service: addresses nothing listens on and nothing
/// connects to (only the measured VIP gets traffic), in 127.128.0.0/9 or fd00:0:0:80::/64.
fn placeholder_backend(family: Family, service: u32, backend: u32) -> SocketAddr {
    let index = service * BACKENDS_PER_SERVICE + backend;
    let address: IpAddr = match family {
        Family::V4 => Ipv4Addr::from(0x7f80_0000 + index).into(),
        Family::V6 => Ipv6Addr::from(0xfd00_0000_0000_0080_u128 << 64 | u128::from(index)).into(),
    };
    SocketAddr::new(address, BACKEND_PORT)
}

/// `services` Services of each family in `families`.
fn desired(
    sandbox: &Sandbox,
    families: &[Family],
    services: u32,
    measured: u32,
) -> Desired<'static> {
    let mut desired = Desired::default();
    for &family in families {
        let real = real_backends(sandbox, family);
        for service in 0..services {
            let backends = (0..BACKENDS_PER_SERVICE)
                .map(|backend| match real.get(backend as usize) {
                    Some(addr) if service == measured => *addr,
                    _ => placeholder_backend(family, service, backend),
                })
                .map(|addr| BackendAddr::local(addr.ip(), addr.port()))
                .collect();
            let address = vip(family, service);
            desired.insert(
                Frontend {
                    address: address.ip(),
                    port: address.port(),
                    protocol: Protocol::Tcp,
                    scope: Scope::Internal,
                },
                FrontendSpec {
                    backends,
                    ..FrontendSpec::default()
                },
            );
        }
    }
    desired
}

/// Maps sized for the largest step, with room for the writer to spare.
fn capacities(max_services: u32) -> Capacities {
    let room = |entries: u32| (entries + entries / 8).next_power_of_two();
    Capacities {
        // A master entry and one entry per backend slot for every service.
        service_entries: room(max_services * (BACKENDS_PER_SERVICE + 1)),
        backends: room(max_services * BACKENDS_PER_SERVICE),
        ..Capacities::default()
    }
}

/// The id of the program behind the link the datapath pinned: exactly ours, even while
/// other tests load programs of the same name.
fn program_id(pin_dir: &Path, program: &str) -> u32 {
    let pin = dataplane::link_pin(pin_dir, program);
    let link = PinnedLink::from_pin(&pin)
        .unwrap_or_else(|e| panic!("open the link pin {}: {e}", pin.display()));
    FdLink::from(link)
        .info()
        .unwrap_or_else(|e| panic!("read the link info of {}: {e}", pin.display()))
        .program_id()
}

fn run_client(
    sandbox: &Sandbox,
    vip: SocketAddr,
    backends: &[SocketAddr],
    ids: [u32; 2],
    connections: u32,
) -> Measurement {
    let backends: Vec<String> = backends.iter().map(ToString::to_string).collect();
    let exe = std::env::current_exe().expect("find this executable to run the client");
    let output = sandbox
        .in_cgroup(exe)
        .args([
            "client".to_owned(),
            vip.to_string(),
            backends.join(","),
            connections.to_string(),
            ids[0].to_string(),
            ids[1].to_string(),
        ])
        .stderr(Stdio::inherit())
        .output()
        .expect("run the client in the sandbox cgroup");
    assert!(
        output.status.success(),
        "the client failed ({})",
        output.status
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "client output {:?}: {e}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// Numbers are only worth reporting if every VIP connection was translated and nothing
/// else was.
fn check(measurement: &Measurement, counters: &Counters) {
    assert_eq!(
        counters.translated, measurement.vip_connects,
        "translations vs VIP connections: {counters:?}"
    );
    assert_eq!(
        counters.errors, 0,
        "the programs counted errors: {counters:?}"
    );
    assert_eq!(counters.no_backend, 0, "{counters:?}");
    for (what, timed, runs) in [
        ("VIP", measurement.vip.samples, measurement.connect_vip.runs),
        (
            "direct",
            measurement.direct.samples,
            measurement.connect_direct.runs,
        ),
    ] {
        if timed != runs {
            eprintln!("warning: {timed} {what} connects but the connect program ran {runs} times");
        }
    }
}

fn report(machine: &str, options: &Options, rows: &[(u32, Family, Measurement)]) -> String {
    let mut out = String::new();
    let us = |ns: u64| format!("{:.1} µs", ns as f64 / 1_000.0);
    let per_call = |run_time: RunTime| {
        run_time
            .per_call_ns()
            .map_or_else(|| "-".to_owned(), |ns| format!("{ns:.0}"))
    };
    let _ = writeln!(out, "{machine}");
    let _ = writeln!(
        out,
        "{} connections per measurement (VIP and direct each), {ROUNDS} interleaved rounds; \
         {BACKENDS_PER_SERVICE} backends per service; programs loaded {}; {}\n",
        options.connections,
        match options.loader {
            Loader::Chart => format!(
                "as a default install loads them ({})",
                privileges::chart_agent().capabilities.join(", ")
            ),
            Loader::Minimal => format!(
                "with the chart's least capabilities ({}: Spectre hardening on)",
                privileges::chart_agent_minimal().capabilities.join(", ")
            ),
            Loader::Root => "as root (every capability)".to_owned(),
        },
        if options.trace {
            "a `socklb trace` session running (output discarded)"
        } else {
            "no trace session"
        }
    );
    // connect4/getpeername4 for IPv4 rows, connect6/getpeername6 for IPv6 ones.
    let _ = writeln!(
        out,
        "| services | family | VIP p50 | direct p50 | VIP/direct (p50) | VIP p99 | direct p99 \
         | VIP/direct (p99) | connect ns/call (VIP) | connect ns/call (direct) | getpeername \
         ns/call |"
    );
    let _ = writeln!(
        out,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (services, family, m) in rows {
        let ratio = |vip: u64, direct: u64| vip as f64 / direct.max(1) as f64;
        let family = match family {
            Family::V4 => "IPv4 (connect4)",
            Family::V6 => "IPv6 (connect6)",
        };
        let _ = writeln!(
            out,
            "| {services} | {family} | {} | {} | {:.3} | {} | {} | {:.3} | {} | {} | {} |",
            us(m.vip.p50_ns),
            us(m.direct.p50_ns),
            ratio(m.vip.p50_ns, m.direct.p50_ns),
            us(m.vip.p99_ns),
            us(m.direct.p99_ns),
            ratio(m.vip.p99_ns, m.direct.p99_ns),
            per_call(m.connect_vip),
            per_call(m.connect_direct),
            per_call(m.getpeername),
        );
    }
    out
}

/// Accept-and-close servers on the measured service's backends. They count what they
/// accept, which shows that every connection reached a real backend.
struct Servers {
    listeners: Vec<TcpListener>,
    threads: Vec<JoinHandle<()>>,
    accepted: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Servers {
    fn start(addrs: &[SocketAddr]) -> Self {
        let accepted = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut servers = Self {
            listeners: Vec::new(),
            threads: Vec::new(),
            accepted,
            stop,
        };
        for addr in addrs {
            let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
            // std listens with a backlog of 128; listening again only raises it.
            // SAFETY: a listening socket we own.
            let rc = unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) };
            assert_eq!(
                rc,
                0,
                "listen({addr}, {BACKLOG}): {}",
                io::Error::last_os_error()
            );
            let accepting = listener.try_clone().expect("clone the listener");
            let (accepted, stop) = (servers.accepted.clone(), servers.stop.clone());
            servers.threads.push(std::thread::spawn(move || {
                loop {
                    match accepting.accept() {
                        // Dropping the stream closes it: all a client waits for is connect().
                        Ok(_) => {
                            accepted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) if stop.load(Ordering::Relaxed) => return,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        // E.g. out of file descriptors: retry without spinning.
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            }));
            servers.listeners.push(listener);
        }
        servers
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Waits until the servers have accepted `total` connections in all.
    fn wait_for(&self, total: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.accepted() < total {
            assert!(
                Instant::now() < deadline,
                "the backends accepted {} connections, expected {total}: some VIP connections \
                 did not reach a backend",
                self.accepted()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for listener in &self.listeners {
            // Wakes the thread blocked in accept() (which then fails with EINVAL).
            // SAFETY: a socket we own.
            unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Client: runs inside the sandbox cgroup.

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Vip,
    Direct,
}

/// client VIP BACKEND,BACKEND,... CONNECTIONS CONNECT_ID GETPEERNAME_ID
fn client(args: &[String]) {
    let [vip, backends, connections, connect, getpeername] = args else {
        usage()
    };
    let vip: SocketAddr = parse(vip);
    let backends: Vec<RawAddr> = backends
        .split(',')
        .map(|backend| RawAddr::new(parse(backend)))
        .collect();
    let connections: u32 = parse(connections);
    let ids: [u32; 2] = [parse(connect), parse(getpeername)];
    let vip_addr = RawAddr::new(vip);
    let batch = connections.div_ceil(ROUNDS);
    let mut next_backend = 0usize;
    let mut direct = || {
        next_backend = (next_backend + 1) % backends.len();
        &backends[next_backend]
    };

    // Untimed: the first connections pay for page faults, cold caches and route lookups.
    for _ in 0..batch {
        connect_close(&vip_addr);
        connect_close(direct());
    }

    let samples = usize::try_from(batch * ROUNDS).unwrap_or(0);
    let (mut vip_ns, mut direct_ns) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    let (mut connect_vip, mut connect_direct) = (RunTime::default(), RunTime::default());
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [Target::Vip, Target::Direct]
        } else {
            [Target::Direct, Target::Vip]
        };
        for target in order {
            // Read outside the timed loop; the reads themselves do not run our programs.
            let before = run_times(ids)[0];
            for _ in 0..batch {
                match target {
                    Target::Vip => vip_ns.push(connect_close(&vip_addr)),
                    Target::Direct => direct_ns.push(connect_close(direct())),
                }
            }
            let spent = run_times(ids)[0].since(before);
            match target {
                Target::Vip => connect_vip.add(spent),
                Target::Direct => connect_direct.add(spent),
            }
        }
    }

    let before = run_times(ids)[1];
    for _ in 0..PEERNAME_CONNECTS {
        let peer = connect_peer(vip);
        if peer != vip {
            fail(&format!(
                "getpeername() of a VIP connection says {peer}, not {vip}"
            ));
        }
    }
    let getpeername = run_times(ids)[1].since(before);

    let measurement = Measurement {
        vip: Latency::of(vip_ns),
        direct: Latency::of(direct_ns),
        connect_vip,
        connect_direct,
        getpeername,
        vip_connects: u64::from(batch * (ROUNDS + 1) + PEERNAME_CONNECTS),
        direct_connects: u64::from(batch * (ROUNDS + 1)),
    };
    println!(
        "{}",
        serde_json::to_string(&measurement).expect("a plain struct serializes")
    );
}

fn parse<T: std::str::FromStr>(text: &str) -> T {
    text.parse()
        .unwrap_or_else(|_| fail(&format!("client: cannot parse {text:?}")))
}

fn fail(message: &str) -> ! {
    eprintln!("client: {message}");
    std::process::exit(1);
}

/// A socket address in the kernel's form, of either family.
struct RawAddr {
    addr: SocketAddr,
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl RawAddr {
    fn new(addr: SocketAddr) -> Self {
        // SAFETY: an all-zero sockaddr_storage is valid.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match addr {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from(*v4.ip()).to_be(),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { ptr::write(ptr::from_mut(&mut storage).cast(), sin) };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: 0,
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { ptr::write(ptr::from_mut(&mut storage).cast(), sin6) };
                size_of::<libc::sockaddr_in6>()
            }
        };
        Self {
            addr,
            storage,
            len: len as libc::socklen_t,
        }
    }

    fn domain(&self) -> libc::c_int {
        match self.addr {
            SocketAddr::V4(_) => libc::AF_INET,
            SocketAddr::V6(_) => libc::AF_INET6,
        }
    }
}

/// Nanoseconds spent in connect() and close() of a fresh TCP socket; socket() is not timed.
/// Raw calls rather than `TcpStream`, so that nothing but those two syscalls is measured.
fn connect_close(target: &RawAddr) -> u64 {
    // SAFETY: plain syscall; the fd is checked and closed below.
    let fd = unsafe { libc::socket(target.domain(), libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        fail(&format!("socket(): {}", io::Error::last_os_error()));
    }
    let started = Instant::now();
    // SAFETY: the storage holds a socket address of the length passed; fd is our socket.
    let rc = unsafe { libc::connect(fd, ptr::from_ref(&target.storage).cast(), target.len) };
    let error = (rc != 0).then(io::Error::last_os_error);
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    let elapsed = started.elapsed();
    if let Some(error) = error {
        fail(&format!("connect({}): {error}", target.addr));
    }
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

/// The peer address a VIP connection reports (getpeername shows the VIP again).
fn connect_peer(vip: SocketAddr) -> SocketAddr {
    let stream = TcpStream::connect(vip).unwrap_or_else(|e| fail(&format!("connect({vip}): {e}")));
    stream
        .peer_addr()
        .unwrap_or_else(|e| fail(&format!("getpeername(): {e}")))
}

/// Accumulated run time of the programs `ids`, in that order.
fn run_times(ids: [u32; 2]) -> [RunTime; 2] {
    let mut found = [None; 2];
    for info in loaded_programs().flatten() {
        if let Some(slot) = ids.iter().position(|id| *id == info.id()) {
            found[slot] = Some(RunTime {
                run_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                runs: info.run_count(),
            });
        }
    }
    found.map(|run_time| {
        run_time.unwrap_or_else(|| fail(&format!("programs {ids:?} are not loaded any more")))
    })
}
