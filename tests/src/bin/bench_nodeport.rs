//! `cargo xtask bench nodeport`: traffic from outside the node through a NodePort, socklb's
//! TC programs against kube-proxy's iptables and nftables rules, and the direct path as the
//! floor, measured in one run with the peers interleaved.
//!
//! socklb-bench-nodeport [--connections N] [--rounds N] [--services N] [--seconds S]
//!                       [--iptables legacy|nft] [--docs DIR] [--smoke]
//!
//! Each peer gets its own world of three network namespaces (socklb_tests::bench::node): an
//! external client, a node that translates (or, for "direct", only routes), and a pod behind
//! the node. Same addresses in every world, so that the only difference is what the node
//! runs:
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
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
};

use anyhow::{Context as _, bail, ensure};
use socklb_abi::program_names;
use socklb_tests::bench::{
    baseline,
    cgroup::own_cgroup,
    client::{self, Client, Place},
    cluster::{ENDPOINT_PORT, IPERF_PORT, SERVICE_PORT, Service, services, vip},
    flags::Flags,
    kube_proxy,
    loader::IptablesBackend,
    measure::{self, Moment, Plan, iperf3},
    node::{AgentFiles, ClientLink, POD, Scratch, Translator, World, per_run, preflight, world},
    peer::{PEERS, Peer},
    section::Section,
    server::Servers,
};

const USAGE: &str = "usage: socklb-bench-nodeport [--connections N] [--rounds N] [--services N] \
                     [--seconds S] [--iptables legacy|nft] [--docs DIR] [--smoke]";
const NODE_IP: &str = "10.88.0.1";
/// The client outside (10.88.0.2) on the node's eth0, routed to the pods through it.
const OUTSIDE: ClientLink = ClientLink {
    client: "10.88.0.2/24",
    node: "10.88.0.1/24",
    node_device: "eth0",
    route: &["route", "add", "10.244.1.0/24", "via", NODE_IP],
    node_ip_on_lo: None,
};
const NODE_PORT: u16 = 30080;
const IPERF_NODE_PORT: u16 = 30201;
/// The pod network is 10.244.0.0/16: the external client (10.88.0.2) is not a pod, so its
/// traffic takes the Local policy, not kube-proxy's pod short-circuit.
const KUBE_PROXY: kube_proxy::Config = kube_proxy::Config {
    pod_cidr: "10.244.0.0/16",
    node_ip: NODE_IP,
};
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

/// socklb's TC programs on the node's eth0, whose run time is measured.
const TC_LINKS: [(&str, &str); 2] = [
    (program_names::TC_INGRESS, "eth0"),
    (program_names::TC_EGRESS, "eth0"),
];

fn bench(options: &Options) -> anyhow::Result<()> {
    preflight(options.iptables)?;
    // Before any thread exists, so that only the cleanup thread sees these signals.
    let signals = socklb_tests::block_termination_signals();
    let machine = socklb_tests::machine_context();
    let cluster = node_services(options.services);
    let files = AgentFiles::new("socklb-bench-nodeport", NODE_IP, &cluster)?;
    let scratch = Scratch::new("socklb-bench-nodeport")?;
    socklb_tests::cleanup_on_signal(signals, files.leftovers(vec![scratch.0.clone()]));
    let _stats =
        aya::sys::enable_stats(aya::sys::Stats::RunTime).context("enable BPF run-time stats")?;

    eprintln!(
        "building the four worlds ({} filler services)",
        options.services
    );
    let mut worlds: BTreeMap<Peer, World> = BTreeMap::new();
    for peer in PEERS {
        let translator = match peer {
            Peer::Direct => Translator::Nothing,
            Peer::Socklb => Translator::Agent(&files, &[]),
            Peer::Iptables => Translator::Iptables(options.iptables),
            Peer::Nftables => Translator::Nftables,
        };
        let world = world(&OUTSIDE, &translator, &KUBE_PROXY, &cluster, &scratch.0)?;
        worlds.insert(peer, world);
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
    let tc_before = files.tc_run_time(&TC_LINKS)?;
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
            match (moment, files.tc_run_time(&TC_LINKS)) {
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
    let tc_after = files.tc_run_time(&TC_LINKS)?;

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
    let _ = writeln!(
        report,
        "socklb TC programs: {:.0} ns per packet during the connection rounds ({} packets), \
         {:.0} ns per packet over the whole run",
        per_run(tc_latency),
        tc_latency.1,
        per_run((tc_after.0 - tc_before.0, tc_after.1 - tc_before.1)),
    );
    println!("## NodePort from outside: socklb TC vs kube-proxy iptables and nftables\n");
    print!("{report}");
    if let Some(docs) = &options.docs {
        SECTION.write(docs, &report)?;
    }
    drop(worlds);
    Ok(())
}
