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
//! The method is `bench pod`'s: the peers alternate connection by connection, each from a
//! client process of its own (this binary again, `client`) that stays in the peer's client
//! namespace, the turn in a new random order every round; clients and servers pinned to
//! separate CPUs.
//!
//! Measured: connection setup (connect, 4-byte answer, close) p50/p99 per peer; iperf3
//! throughput of one TCP stream per peer; socklb's TC programs' run time per packet (BPF
//! stats, on only for one more batch of socklb's peer after the timed rounds: they add two
//! clock reads to every program run, which only socklb would pay in the timed rounds).
//! Prints a markdown report and, with `--docs DIR` (not with `--smoke`), writes it into the
//! `nodeport` section of DIR/benchmarks.md. The namespaces are anonymous (they die
//! with this process); the pins, cgroup, manifests and scratch files are removed by a guard
//! and on SIGINT/SIGTERM/SIGHUP.
use std::{
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddrV4},
};

use anyhow::ensure;
use socklb_abi::program_names;
use socklb_tests::bench::{
    cgroup::own_cgroup,
    cluster::{ENDPOINT_PORT, IPERF_PORT},
    measure::{self, iperf3, iperf3_rounds},
    node::{
        AgentFiles, ClientLink, NODE_IP, POD, Scratch, Translator, alternating_rounds,
        measured_services, per_run, preflight, tc_run_time_of_batch, worlds,
    },
    node_flags::{self, Options},
    peer::{PEERS, Peer},
    section::Section,
};

const USAGE: &str = "usage: socklb-bench-nodeport [--connections N] [--rounds N] [--services N] \
                     [--seconds S] [--iptables legacy|nft] [--docs DIR] [--smoke]";
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
const SECTION: Section = Section::new(
    "nodeport",
    "nodeport",
    "Traffic from outside: NodePort through TC vs kube-proxy",
);

fn main() {
    node_flags::main(|args| {
        let (options, services) = parse_options(args)?;
        bench(&options, services)
    });
}

/// The common options and the number of filler Services.
fn parse_options(args: &[String]) -> anyhow::Result<(Options, u32)> {
    let mut services = 1000;
    let options = Options::parse(args, USAGE, |flags, flag, value| {
        if flag != "--services" {
            return Ok(false);
        }
        services = flags.number(flag, value)?;
        Ok(true)
    })?;
    if options.smoke {
        services = services.min(100);
    }
    ensure!(
        services <= 60_000,
        "--services: at most 60,000 (the address plan)"
    );
    Ok((options, services))
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

fn bench(options: &Options, services: u32) -> anyhow::Result<()> {
    preflight(options.iptables)?;
    // Before any thread exists, so that only the cleanup thread sees these signals.
    let signals = socklb_tests::block_termination_signals();
    let machine = socklb_tests::machine_context();
    let cluster = measured_services(services, Some([NODE_PORT, IPERF_NODE_PORT]));
    let files = AgentFiles::new("socklb-bench-nodeport", &cluster)?;
    let scratch = Scratch::new("socklb-bench-nodeport")?;
    socklb_tests::cleanup_on_signal(signals, files.leftovers(vec![scratch.0.clone()]));

    eprintln!("building the four worlds ({services} filler services)");
    let translator = |peer| match peer {
        Peer::Direct => Translator::Nothing,
        Peer::Socklb => Translator::Agent(&files, &[]),
        Peer::Iptables => Translator::Iptables(options.iptables),
        Peer::Nftables => Translator::Nftables,
    };
    let worlds = worlds(&PEERS, &OUTSIDE, translator, &cluster, &scratch.0)?;
    let home = own_cgroup()?;
    let cells = alternating_rounds(
        &worlds,
        |_| &home,
        |peer| target(peer, ENDPOINT_PORT, NODE_PORT),
        options.connections,
        options.rounds,
    )?;
    let throughput = iperf3_rounds(&PEERS, options.iperf_rounds, |peer| {
        let to = target(peer, IPERF_PORT, IPERF_NODE_PORT);
        iperf3(&worlds[&peer].client, None, to, options.seconds)
    })?;
    // The programs' cost per packet, in one more batch of socklb's peer.
    let [tc_latency] = tc_run_time_of_batch(
        &worlds,
        Peer::Socklb,
        &home,
        target(Peer::Socklb, ENDPOINT_PORT, NODE_PORT),
        options.connections,
        &files,
        [&TC_LINKS],
    )?;
    ensure!(
        tc_latency.1 > 0,
        "socklb's TC programs never ran: were they attached to the node's eth0?"
    );

    let mut report = String::new();
    let _ = writeln!(report, "{machine}\n");
    let _ = writeln!(
        report,
        "One TCP Service, `externalTrafficPolicy: Local`, one local pod; {services} ClusterIP \
         services of 10 endpoints ahead of it in kube-proxy's rules; {}.\n",
        options.method("peer"),
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
        "socklb TC programs: {:.0} ns per packet, in one more batch of connections after the \
         timed rounds ({} packets)",
        per_run(tc_latency),
        tc_latency.1,
    );
    println!("## NodePort from outside: socklb TC vs kube-proxy iptables and nftables\n");
    print!("{report}");
    if let Some(docs) = &options.docs {
        SECTION.write(docs, &report)?;
    }
    drop(worlds);
    Ok(())
}
