//! `cargo xtask bench nodeport`: traffic from outside the node through a NodePort, socklb's
//! TC programs against kube-proxy's iptables and nftables rules, and the direct path as the
//! floor, measured in one run with the peers interleaved.
//!
//! socklb-bench-nodeport [--connections N] [--rounds N] [--services N] [--seconds S]
//!                       [--iptables legacy|nft] [--docs DIR] [--smoke]
//!
//! Each peer gets its own world of three network namespaces: an external client, a node
//! that translates (or, for "direct", only routes), and a pod behind the node. Same
//! addresses in every world, so that the only difference is what the node runs:
//!
//! - socklb: the agent (file source) with its TC programs on the node's eth0;
//! - iptables / nftables: kube-proxy's rules for the same services, from the generator that
//!   `bench compare` uses (socklb_tests::bench::kube_proxy), loaded into the node;
//! - direct: the client connects to the pod's address, routed by the node.
//!
//! The services: `--services` ClusterIP services of 10 endpoints (ahead of the NodePorts in
//! kube-proxy's rules), then the measured NodePort and an iperf3 NodePort, both with
//! `externalTrafficPolicy: Local` and the one local pod, so that every peer does the same
//! work per flow (DNAT to a local pod, the client address kept).
//!
//! The method is `bench compare`'s: one client process (this binary again, `client`) that
//! moves into each peer's client namespace before each batch, the peers in a new random
//! order every round; client and servers pinned to separate CPUs.
//!
//! Measured: connection setup (connect, 4-byte answer, close) p50/p99 per peer; iperf3
//! throughput of one TCP stream per peer; socklb's TC programs' run time per packet (BPF
//! stats). Prints a markdown report and, with `--docs DIR` (not with `--smoke`), writes it
//! into the `nodeport` section of DIR/benchmarks.md. The namespaces are anonymous (they die
//! with this process); the pins, cgroup, manifests and scratch files are removed by a guard
//! and on SIGINT/SIGTERM/SIGHUP.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs::{self, File},
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use aya::programs::{
    links::{FdLink, PinnedLink},
    loaded_programs,
};
use socklb_abi::program_names;
use socklb_tests::{
    Agent, Source,
    bench::{
        baseline,
        cgroup::own_cgroup,
        client::{self, Client, Place},
        cluster::{
            ENDPOINT_PORT, IPERF_PORT, NODE, SERVICE_PORT, Service, ZONE, agent_capacity_flags,
            manifest_file, services, vip,
        },
        flags::Flags,
        kube_proxy::{
            self,
            iptables::{self, IptablesSync},
            nftables,
        },
        loader::{IptablesBackend, load_rules},
        measure::{self, Moment, Plan, iperf3},
        netns::{End, enter, new_netns, run_in, veth},
        peer::{PEERS, Peer},
        section::Section,
        server::Servers,
    },
    node_yaml,
};

const USAGE: &str = "usage: socklb-bench-nodeport [--connections N] [--rounds N] [--services N] \
                     [--seconds S] [--iptables legacy|nft] [--docs DIR] [--smoke]";
const NODE_IP: &str = "10.88.0.1";
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 10);
const NODE_PORT: u16 = 30080;
const IPERF_NODE_PORT: u16 = 30201;
/// The pod network is 10.244.0.0/16: the external client (10.88.0.2) is not a pod, so its
/// traffic takes the Local policy, not kube-proxy's pod short-circuit.
const KUBE_PROXY: kube_proxy::Config = kube_proxy::Config {
    pod_cidr: "10.244.0.0/16",
    node_ip: NODE_IP,
};
/// A rule load still running after this fails the benchmark.
const LOAD_LIMIT: Duration = Duration::from_secs(300);
const SECTION: Section = Section::new(
    "nodeport",
    "nodeport",
    "Traffic from outside: NodePort through TC vs kube-proxy",
);

struct Options {
    connections: u32,
    rounds: u32,
    services: u32,
    seconds: u32,
    iperf_rounds: u32,
    iptables: IptablesBackend,
    /// Where benchmarks.md is, to rewrite the `nodeport` section (never for a smoke run).
    docs: Option<PathBuf>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first() {
        Some(command) if command == "client" => client::run(),
        _ => parse_options(&args).and_then(|options| bench(&options)),
    };
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

fn parse_options(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        connections: 2000,
        rounds: 5,
        services: 1000,
        seconds: 3,
        iperf_rounds: 2,
        iptables: IptablesBackend::Legacy,
        docs: None,
    };
    let mut flags = Flags::new(args, USAGE);
    while let Some((flag, value)) = flags.next_flag()? {
        let number = || flags.number(flag, value);
        match flag {
            "--connections" => options.connections = number()?,
            "--rounds" => options.rounds = number()?,
            "--services" => options.services = number()?,
            "--seconds" => options.seconds = number()?,
            "--iptables" => options.iptables = IptablesBackend::parse(value).context(USAGE)?,
            "--docs" => options.docs = Some(PathBuf::from(value)),
            _ => bail!("unknown flag {flag}\n{USAGE}"),
        }
    }
    if flags.smoke {
        // Seconds long: keeps the benchmark working, measures nothing worth keeping.
        options.connections = options.connections.min(50);
        options.rounds = options.rounds.min(3);
        options.services = options.services.min(100);
        options.seconds = 1;
        options.iperf_rounds = 1;
        options.docs = None;
    }
    ensure!(
        options.connections >= 1 && options.rounds >= 1 && options.seconds >= 1,
        "--connections, --rounds and --seconds must be at least 1"
    );
    ensure!(
        options.services <= 60_000,
        "--services: at most 60,000 (the address plan)"
    );
    Ok(options)
}

/// The fillers, then the measured NodePort and the iperf3 NodePort, both to the one pod.
fn node_services(fillers: u32) -> Vec<Service> {
    let mut cluster = services(fillers);
    for (index, (name, port, target_port, node_port)) in [
        ("web", SERVICE_PORT, ENDPOINT_PORT, NODE_PORT),
        ("web-iperf", IPERF_PORT, IPERF_PORT, IPERF_NODE_PORT),
    ]
    .into_iter()
    .enumerate()
    {
        cluster.push(Service {
            name: name.to_owned(),
            vip: vip(fillers + index as u32),
            port,
            target_port,
            node_port: Some(node_port),
            endpoints: vec![POD],
        });
    }
    cluster
}

/// Where the client connects: the pod itself, or the NodePort.
fn target(peer: Peer, pod_port: u16, node_port: u16) -> SocketAddrV4 {
    match peer {
        Peer::Direct => SocketAddrV4::new(POD, pod_port),
        _ => SocketAddrV4::new(NODE_IP.parse().unwrap_or(Ipv4Addr::UNSPECIFIED), node_port),
    }
}

/// socklb's pins, cgroup and manifests, and the rule loader's scratch files; removed when
/// dropped.
struct Files {
    pin_dir: PathBuf,
    cgroup: PathBuf,
    manifests: PathBuf,
    scratch: PathBuf,
}

impl Files {
    fn new(services: &[Service]) -> anyhow::Result<Self> {
        let name = format!("socklb-bench-nodeport-{}", std::process::id());
        let files = Self {
            pin_dir: PathBuf::from("/sys/fs/bpf").join(&name),
            cgroup: socklb_tests::cgroup2_root().join(&name),
            manifests: std::env::temp_dir().join(format!("{name}-manifests")),
            scratch: std::env::temp_dir().join(format!("{name}-scratch")),
        };
        for dir in [&files.cgroup, &files.manifests, &files.scratch] {
            fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        let yaml = format!(
            "{}---\n{}",
            node_yaml(NODE, ZONE, NODE_IP),
            manifest_file(services, 0..services.len())
        );
        let file = files.manifests.join("cluster.yaml");
        fs::write(&file, yaml).with_context(|| format!("write {}", file.display()))?;
        Ok(files)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        if let Err(e) = socklb_agent::dataplane::cleanup(&self.pin_dir) {
            eprintln!("cleanup of {}: {e}", self.pin_dir.display());
        }
        socklb_tests::remove_cgroup(&self.cgroup);
        let _ = fs::remove_dir_all(&self.manifests);
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

/// One peer's namespaces and what runs in them; dropped in field order.
struct World {
    _agent: Option<Agent>,
    servers: Servers,
    client: File,
    _node: File,
}

/// client (10.88.0.2) - node (10.88.0.1, 10.244.1.1) - pod (10.244.1.10), the node
/// forwarding; the pod serves 8080 and iperf3; the node runs what the peer is.
fn world(
    peer: Peer,
    options: &Options,
    files: &Files,
    cluster: &[Service],
) -> anyhow::Result<World> {
    let (client, node, pod) = (new_netns()?, new_netns()?, new_netns()?);
    for netns in [&client, &node, &pod] {
        run_in(netns, "ip", &["link", "set", "lo", "up"])?;
        baseline::apply(netns)?;
    }
    let end = |netns, device, address| End {
        netns,
        device,
        address,
    };
    veth(
        &end(&client, "eth0", "10.88.0.2/24"),
        &end(&node, "eth0", "10.88.0.1/24"),
    )?;
    run_in(
        &client,
        "ip",
        &["route", "add", "10.244.1.0/24", "via", NODE_IP],
    )?;
    run_in(&node, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    veth(
        &end(&node, "pod1", "10.244.1.1/24"),
        &end(&pod, "eth0", "10.244.1.10/24"),
    )?;
    run_in(
        &pod,
        "ip",
        &["route", "add", "default", "via", "10.244.1.1"],
    )?;
    let mut servers = Servers::start(pod, SocketAddrV4::new(POD, ENDPOINT_PORT))?;
    servers.start_iperf(POD, IPERF_PORT)?;

    let load = |program: &str, args: &[&str], input: String| -> anyhow::Result<()> {
        let took = load_rules(&node, &files.scratch, program, args, &input, LOAD_LIMIT)?;
        ensure!(
            took.is_some(),
            "{program} did not finish within {LOAD_LIMIT:?}"
        );
        Ok(())
    };
    let agent = match peer {
        Peer::Direct => None,
        Peer::Socklb => Some(start_agent(&node, files, cluster.len())?),
        Peer::Iptables => {
            let input = iptables::restore_input(&KUBE_PROXY, cluster, IptablesSync::Initial);
            load(options.iptables.restore(), &["--noflush"], input)?;
            None
        }
        Peer::Nftables => {
            load("nft", &["-f", "-"], nftables::initial(&KUBE_PROXY, cluster))?;
            None
        }
    };
    Ok(World {
        _agent: agent,
        servers,
        client,
        _node: node,
    })
}

/// The agent, in the node's namespace (its TC programs attach to the node's eth0).
fn start_agent(node: &File, files: &Files, services: usize) -> anyhow::Result<Agent> {
    let mut flags = agent_capacity_flags(services);
    flags.extend([
        "--healthz-bind-address".to_owned(),
        "127.0.0.1:0".to_owned(),
    ]);
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> anyhow::Result<Agent> {
                enter(node)?;
                let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                let state = (files.pin_dir.as_path(), files.cgroup.as_path());
                let source = Source::File(&files.manifests);
                Ok(Agent::start_at(state, source, NODE, &flags))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the agent did not start (its log is above)"))?
    })
}

/// Run time and run count, summed, of the TC programs socklb pinned links for on eth0.
fn tc_run_time(pin_dir: &Path) -> anyhow::Result<(u64, u64)> {
    let mut ids = Vec::new();
    for program in [program_names::TC_INGRESS, program_names::TC_EGRESS] {
        let pin = socklb_agent::dataplane::link_pin(pin_dir, &format!("{program}@eth0"));
        let link = PinnedLink::from_pin(&pin)
            .with_context(|| format!("open the link pin {}", pin.display()))?;
        let info = FdLink::from(link)
            .info()
            .with_context(|| format!("read the link {}", pin.display()))?;
        ids.push(info.program_id());
    }
    let mut total = (0, 0);
    for info in loaded_programs().flatten() {
        if ids.contains(&info.id()) {
            total.0 += u64::try_from(info.run_time().as_nanos()).unwrap_or(0);
            total.1 += info.run_count();
        }
    }
    Ok(total)
}

fn bench(options: &Options) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "creates network namespaces, rules and BPF programs: run it as root"
    );
    for tool in [options.iptables.restore(), "nft", "iperf3", "ip", "sysctl"] {
        ensure!(
            which::which(tool).is_ok(),
            "{tool} is missing: `cargo xtask setup` installs it (apt: iperf3 iptables nftables \
             iproute2 procps)"
        );
    }
    // Before any thread exists, so that only the cleanup thread sees these signals.
    let signals = socklb_tests::block_termination_signals();
    let machine = socklb_tests::machine_context();
    let cluster = node_services(options.services);
    let files = Files::new(&cluster)?;
    socklb_tests::cleanup_on_signal(
        signals,
        socklb_tests::Leftovers {
            pin_dir: files.pin_dir.clone(),
            cgroup: files.cgroup.clone(),
            dirs: vec![files.manifests.clone(), files.scratch.clone()],
            also: None,
        },
    );
    let _stats =
        aya::sys::enable_stats(aya::sys::Stats::RunTime).context("enable BPF run-time stats")?;

    eprintln!(
        "building the four worlds ({} filler services)",
        options.services
    );
    let mut worlds = BTreeMap::new();
    for peer in PEERS {
        worlds.insert(peer, world(peer, options, &files, &cluster)?);
    }
    let home = own_cgroup()?;
    let places: BTreeMap<Peer, Place> = worlds
        .iter()
        .map(|(&peer, world)| (peer, Place::new(&world.client, &home)))
        .collect();
    let plans: Vec<Plan<'_, Peer>> = PEERS
        .into_iter()
        .map(|peer| Plan {
            key: peer,
            place: &places[&peer],
            targets: vec![target(peer, ENDPOINT_PORT, NODE_PORT)],
            endpoints: vec![POD],
        })
        .collect();
    let servers: Vec<&Servers> = worlds.values().map(|world| &world.servers).collect();
    let mut client = Client::spawn(&worlds[&Peer::Direct].client)?;
    let tc_before = tc_run_time(&files.pin_dir)?;
    let (mut tc_latency, mut tc_mark, mut tc_error) = ((0, 0), (0, 0), None);
    let cells = measure::rounds(
        &mut client,
        &servers,
        &plans,
        options.connections,
        options.rounds,
        |peer, moment| {
            if peer != Peer::Socklb {
                return;
            }
            match (moment, tc_run_time(&files.pin_dir)) {
                (Moment::Before, Ok(now)) => tc_mark = now,
                (Moment::After, Ok(now)) => {
                    tc_latency.0 += now.0 - tc_mark.0;
                    tc_latency.1 += now.1 - tc_mark.1;
                }
                (_, Err(error)) => tc_error = Some(error),
            }
        },
    )?;
    if let Some(error) = tc_error {
        return Err(error);
    }
    drop(client);

    let mut throughput: BTreeMap<Peer, Vec<measure::Stream>> = BTreeMap::new();
    for round in 0..options.iperf_rounds as usize {
        for offset in 0..PEERS.len() {
            let peer = PEERS[(offset + round) % PEERS.len()];
            let to = target(peer, IPERF_PORT, IPERF_NODE_PORT);
            let stream = iperf3(&worlds[&peer].client, None, to, options.seconds)?;
            throughput.entry(peer).or_default().push(stream);
        }
    }
    let tc_after = tc_run_time(&files.pin_dir)?;

    let mut report = String::new();
    let _ = writeln!(report, "{machine}\n");
    let _ = writeln!(
        report,
        "One TCP Service, `externalTrafficPolicy: Local`, one local pod; {} ClusterIP services \
         of 10 endpoints ahead of it in kube-proxy's rules; iptables backend {}; {} rounds x {} \
         connections per peer, one client process, peers in a new random order every round; \
         iperf3 {} x {} s per peer; {}.\n",
        options.services,
        options.iptables.name(),
        options.rounds,
        options.connections,
        options.iperf_rounds,
        options.seconds,
        baseline::SUMMARY,
    );
    let _ = writeln!(
        report,
        "| path | connect+answer+close p50 (µs) | p99 (µs) | p50 / direct | iperf3 Gbit/s | sender CPU % |"
    );
    let _ = writeln!(report, "|---|---|---|---|---|---|");
    let p50 = |peer: Peer| cells[&peer].percentile(50) as f64 / 1e3;
    for peer in PEERS {
        let runs = &throughput[&peer];
        let mean = |value: &dyn Fn(&measure::Stream) -> f64| {
            runs.iter().map(value).sum::<f64>() / runs.len().max(1) as f64
        };
        let _ = writeln!(
            report,
            "| {} | {:.1} | {:.1} | {:.3} | {:.2} | {:.0} |",
            peer.name(),
            p50(peer),
            cells[&peer].percentile(99) as f64 / 1e3,
            p50(peer) / p50(Peer::Direct),
            mean(&|stream| stream.gbits),
            mean(&|stream| stream.sender_cpu),
        );
    }
    let _ = writeln!(
        report,
        "\nsocklb / iptables p50: {:.3}; socklb / nftables p50: {:.3}",
        p50(Peer::Socklb) / p50(Peer::Iptables),
        p50(Peer::Socklb) / p50(Peer::Nftables)
    );
    let per_packet = |(ns, runs): (u64, u64)| {
        if runs == 0 {
            0.0
        } else {
            ns as f64 / runs as f64
        }
    };
    let _ = writeln!(
        report,
        "socklb TC programs: {:.0} ns per packet during the connection rounds ({} packets), \
         {:.0} ns per packet over the whole run",
        per_packet(tc_latency),
        tc_latency.1,
        per_packet((tc_after.0 - tc_before.0, tc_after.1 - tc_before.1)),
    );
    println!("## NodePort from outside: socklb TC vs kube-proxy iptables and nftables\n");
    print!("{report}");
    if let Some(docs) = &options.docs {
        SECTION.write(docs, &report)?;
    }
    drop(worlds);
    Ok(())
}
