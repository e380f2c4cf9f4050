//! `cargo xtask bench pod`: a pod's connections to a ClusterIP through the node, socklb's
//! per-packet path (the TC program on the pod's device) against kube-proxy's iptables and
//! nftables rules and socklb's socket path, the direct path as the floor, at each Service
//! count, measured in one run with the paths interleaved.
//!
//! socklb-bench-pod [--services 1000,10000] [--connections N] [--rounds N] [--seconds S]
//!                  [--iptables legacy|nft] [--docs DIR] [--smoke] [--compare-agent PATH]
//!                  [--compare-flags "FLAGS"] [--without iptables]
//!
//! Each path gets its own world (socklb_tests::bench::node): a client pod (10.244.2.10, on
//! the node's device pod2), the node, and the server pod behind it. What differs is what
//! the node runs:
//!
//! - per-packet: the agent with `--socket-lb-scope host`, so the pod's sockets keep the
//!   VIP, and its pod programs on pod2 (found by `--pod-devices auto`) translate per packet;
//! - per-packet, direct delivery: the same with `--pod-delivery direct`, whose programs
//!   redirect the flow's packets both ways past the node's routing and netfilter;
//! - socket: the agent with `--socket-lb-scope all`, the client in its cgroup: the VIP is
//!   replaced at connect() (what most pods get), and the connection crosses the pod
//!   programs on both pods' devices (`--pod-devices auto`, as on every node);
//! - iptables / nftables: kube-proxy's rules for the same Services in the node, which
//!   translate in PREROUTING as for every pod;
//! - direct: the client connects to the server pod's address.
//!
//! Two more paths measure what traffic to no Service pays on each kind of node: the client
//! connects to the server pod's address through a node running socklb's per-packet path
//! (the agent as above, its programs screening every packet) and through a node running
//! kube-proxy's nftables rules.
//!
//! The Services: `--services` ClusterIP Services of 10 endpoints, then the measured one and
//! the iperf3 one, both to the server pod, last in kube-proxy's rule order (its worst case:
//! iptables matches Services one by one). The paths alternate connection by connection: a
//! client process per path, staying in its namespace (and cgroup), all on one CPU, the
//! paths' turn in a new random order every round.
//!
//! Measured: connection setup (connect, 4-byte answer, close) p50/p99 per path; iperf3
//! throughput; the per-packet path's TC programs' run time per packet (BPF stats, on only
//! for one more batch after the timed rounds, so that no timed path pays them). Prints a
//! markdown report and, with `--docs DIR` (not with `--smoke`), writes it into the `pod`
//! section of DIR/benchmarks.md.
//!
//! `--compare-agent PATH` adds one more world, the per-packet path run by the agent binary
//! at PATH (another build), alternating with the others: a change of the programs is then
//! measured against the build before it within one run, where runs of each build apart
//! differ by more than most such changes. `--compare-flags` adds agent flags to that
//! agent's (`--pod-devices pod2`: no programs on the server pod's device). Nothing is
//! written to the docs then.
//!
//! `--without iptables` leaves the iptables path out of the rotation (nothing is written to
//! the docs either): at 10,000 Services each of its connections walks 10,000 rules, which
//! evicts from the caches what the next connection of any path would have found there.
use std::{collections::BTreeMap, fmt::Write as _, fs, net::SocketAddrV4, path::PathBuf};

use anyhow::ensure;
use socklb_abi::program_names;
use socklb_tests::bench::{
    cgroup::own_cgroup,
    cluster::Service,
    measure::{self, iperf3, iperf3_rounds},
    node::{
        AgentFiles, ClientLink, POD, Scratch, Translator, alternating_rounds, measured_services,
        per_run, preflight, tc_run_time_of_batch, worlds,
    },
    node_flags::{self, Options},
    section::Section,
};

const USAGE: &str = "usage: socklb-bench-pod [--services 1000,10000] [--connections N] \
                     [--rounds N] [--seconds S] [--iptables legacy|nft] [--docs DIR] [--smoke] \
                     [--compare-agent PATH] [--compare-flags \"FLAGS\"] [--without iptables]";
/// The client pod on the node's device pod2, its default route through the node.
const CLIENT_POD: ClientLink = ClientLink {
    client: "10.244.2.10/24",
    node: "10.244.2.1/24",
    node_device: "pod2",
    route: &["route", "add", "default", "via", "10.244.2.1"],
    node_ip_on_lo: Some("10.88.0.1/32"),
};
const SECTION: Section = Section::new(
    "pod",
    "pod",
    "Pods to a ClusterIP: the per-packet path vs kube-proxy and the socket path",
);
/// The per-packet path's programs, each measured over every device it runs on: the pod
/// program (ingress of the client's and the server's devices) and the egress program.
const TC_PROGRAMS: [&[(&str, &str)]; 2] = [
    &[(program_names::TC_POD, "pod2")],
    &[(program_names::TC_EGRESS, "pod2")],
];

/// What translates the pod's connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Path {
    Direct,
    PerPacket,
    /// The per-packet path with `--pod-delivery direct`.
    PerPacketDirect,
    /// The per-packet path of the agent binary `--compare-agent` names.
    Compared,
    Socket,
    Iptables,
    Nftables,
    /// To the server pod's address, through the per-packet path's node.
    NoServicePerPacket,
    /// To the server pod's address, through kube-proxy's nftables node.
    NoServiceNftables,
}

const PATHS: [Path; 8] = [
    Path::Direct,
    Path::PerPacket,
    Path::PerPacketDirect,
    Path::Socket,
    Path::Iptables,
    Path::Nftables,
    Path::NoServicePerPacket,
    Path::NoServiceNftables,
];

/// The paths measured: [`PATHS`], [`Path::Compared`] with `--compare-agent`, and without
/// [`Path::Iptables`] with `--without iptables`.
fn paths(plan: &Plan) -> Vec<Path> {
    let mut paths = PATHS.to_vec();
    if plan.compared.is_some() {
        paths.insert(3, Path::Compared);
    }
    if !plan.iptables {
        paths.retain(|&path| path != Path::Iptables);
    }
    paths
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::PerPacket => "socklb per-packet",
            Self::PerPacketDirect => "socklb per-packet, direct delivery",
            Self::Compared => "socklb per-packet (compared agent)",
            Self::Socket => "socklb socket",
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
            Self::NoServicePerPacket => "no Service: per-packet node",
            Self::NoServiceNftables => "no Service: nftables node",
        }
    }

    /// Whether the client connects to the server pod's address rather than the VIP.
    fn to_pod(self) -> bool {
        matches!(
            self,
            Self::Direct | Self::NoServicePerPacket | Self::NoServiceNftables
        )
    }
}

fn main() {
    node_flags::main(|args| {
        let (options, plan) = parse_options(args)?;
        bench(&options, plan)
    });
}

/// The agent `--compare-agent` names and the flags `--compare-flags` adds to its.
struct Compared {
    binary: PathBuf,
    flags: Vec<String>,
}

/// What this benchmark measures beyond the common options.
struct Plan {
    /// The filler Service counts, one step each.
    services: Vec<u32>,
    /// The agent to compare.
    compared: Option<Compared>,
    /// Whether the iptables path is in the rotation.
    iptables: bool,
}

/// The common options and the plan.
fn parse_options(args: &[String]) -> anyhow::Result<(Options, Plan)> {
    let mut services = vec![1_000, 10_000];
    let (mut binary, mut compared_flags) = (None, Vec::new());
    let mut iptables = true;
    let mut options = Options::parse(args, USAGE, |flags, flag, value| {
        match flag {
            "--services" => services = flags.numbers(flag, value, "1000,10000")?,
            "--without" => {
                ensure!(
                    value == "iptables",
                    "--without {value}: only iptables\n{USAGE}"
                );
                iptables = false;
            }
            "--compare-agent" => binary = Some(PathBuf::from(value)),
            "--compare-flags" => {
                compared_flags = value.split_whitespace().map(str::to_owned).collect();
            }
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let compared = match binary {
        Some(binary) => {
            ensure!(
                binary.is_file(),
                "--compare-agent: no agent binary at {}",
                binary.display()
            );
            options.docs = None;
            Some(Compared {
                binary,
                flags: compared_flags,
            })
        }
        None => {
            ensure!(
                compared_flags.is_empty(),
                "--compare-flags: only with --compare-agent"
            );
            None
        }
    };
    if !iptables {
        options.docs = None;
    }
    if options.smoke {
        services = vec![100];
    }
    ensure!(
        !services.is_empty() && services.iter().all(|n| *n <= 60_000),
        "--services: counts of at most 60,000 (the address plan)"
    );
    let plan = Plan {
        services,
        compared,
        iptables,
    };
    Ok((options, plan))
}

/// What one Service count measured.
struct Step {
    services: u32,
    cells: BTreeMap<Path, measure::Cell>,
    throughput: BTreeMap<Path, Vec<measure::Stream>>,
    /// Each of [`TC_PROGRAMS`] during the metered batch: (ns, runs).
    tc: [(u64, u64); 2],
}

/// The agents' files: the per-packet path's (delivered through the kernel, and directly),
/// the socket path's, the per-packet node's that no Service's traffic crosses, and the
/// compared agent's with its added flags.
struct Agents {
    per_packet: AgentFiles,
    per_packet_direct: AgentFiles,
    socket: AgentFiles,
    no_service: AgentFiles,
    compared: Option<(AgentFiles, Vec<String>)>,
}

impl Agents {
    fn all(&self) -> impl Iterator<Item = &AgentFiles> {
        self.others().chain([&self.per_packet])
    }

    /// All but the per-packet path's, whose leftovers guard removes the rest.
    fn others(&self) -> impl Iterator<Item = &AgentFiles> {
        [&self.per_packet_direct, &self.socket, &self.no_service]
            .into_iter()
            .chain(self.compared.as_ref().map(|(files, _)| files))
    }
}

fn bench(options: &Options, plan: Plan) -> anyhow::Result<()> {
    let paths = paths(&plan);
    let Plan {
        services, compared, ..
    } = plan;
    preflight(options.iptables)?;
    // Before any thread exists, so that only the cleanup thread sees these signals.
    let signals = socklb_tests::block_termination_signals();
    let machine = socklb_tests::machine_context();
    let scratch = Scratch::new("socklb-bench-pod")?;
    // Named before its binary moves into the agent's files.
    let compared_label = compared.as_ref().map(|Compared { binary, flags }| {
        format!("{}, added flags: {:?}", binary.display(), flags.join(" "))
    });
    let agents = Agents {
        per_packet: AgentFiles::new("socklb-bench-pod-pp", &[])?,
        per_packet_direct: AgentFiles::new("socklb-bench-pod-pd", &[])?,
        socket: AgentFiles::new("socklb-bench-pod-sk", &[])?,
        no_service: AgentFiles::new("socklb-bench-pod-ns", &[])?,
        compared: match compared {
            Some(Compared { binary, flags }) => {
                let mut files = AgentFiles::new("socklb-bench-pod-cmp", &[])?;
                files.binary = Some(binary);
                Some((files, flags))
            }
            None => None,
        },
    };
    let mut leftovers = agents.per_packet.leftovers(vec![scratch.0.clone()]);
    let others: Vec<_> = agents
        .others()
        .map(|files| {
            (
                files.pin_dir.clone(),
                files.cgroup.clone(),
                files.manifests.clone(),
            )
        })
        .collect();
    leftovers.also = Some(Box::new(move || {
        for (pins, cgroup, manifests) in &others {
            let _ = socklb_agent::dataplane::cleanup(pins);
            socklb_tests::remove_cgroup(cgroup);
            let _ = fs::remove_dir_all(manifests);
        }
    }));
    socklb_tests::cleanup_on_signal(signals, leftovers);

    let mut steps = Vec::new();
    for &count in &services {
        let cluster = measured_services(count, None);
        for files in agents.all() {
            files.reset(&cluster)?;
        }
        steps.push(step(options, &paths, &cluster, count, &agents, &scratch)?);
    }
    let report = report(&machine, options, &steps, compared_label.as_deref());
    println!("## {}\n", SECTION.heading);
    print!("{report}");
    if let Some(docs) = &options.docs {
        SECTION.write(docs, &report)?;
    }
    Ok(())
}

/// Builds the worlds for `cluster` and measures them.
fn step(
    options: &Options,
    paths: &[Path],
    cluster: &[Service],
    count: u32,
    agents: &Agents,
    scratch: &Scratch,
) -> anyhow::Result<Step> {
    eprintln!(
        "building the {} worlds ({count} filler services)",
        paths.len()
    );
    let (per_packet, socket) = (&agents.per_packet, &agents.socket);
    let home = own_cgroup()?;
    // Its programs on every pod's device, as a default install puts them: the socket
    // path's connections cross them too (their screens pass each packet).
    let socket_flags = ["--socket-lb-scope", "all"];
    let per_packet_flags = ["--socket-lb-scope", "host"];
    let direct_flags = ["--socket-lb-scope", "host", "--pod-delivery", "direct"];
    let mut compared_flags = per_packet_flags.to_vec();
    if let Some((_, added)) = &agents.compared {
        compared_flags.extend(added.iter().map(String::as_str));
    }
    let translator = |path| match path {
        Path::Direct => Translator::Nothing,
        Path::PerPacket => Translator::Agent(per_packet, &per_packet_flags),
        Path::PerPacketDirect => Translator::Agent(&agents.per_packet_direct, &direct_flags),
        Path::Compared => Translator::Agent(
            agents
                .compared
                .as_ref()
                .map(|(files, _)| files)
                .expect("a compared path only with --compare-agent"),
            &compared_flags,
        ),
        Path::Socket => Translator::Agent(socket, &socket_flags),
        Path::Iptables => Translator::Iptables(options.iptables),
        Path::Nftables | Path::NoServiceNftables => Translator::Nftables,
        Path::NoServicePerPacket => Translator::Agent(&agents.no_service, &per_packet_flags),
    };
    let worlds = worlds(paths, &CLIENT_POD, translator, cluster, &scratch.0)?;
    let cgroup = |path| {
        if path == Path::Socket {
            socket.cgroup.as_path()
        } else {
            home.as_path()
        }
    };
    let target = |path: Path, service: usize| {
        if path.to_pod() {
            SocketAddrV4::new(POD, cluster[service].target_port)
        } else {
            SocketAddrV4::new(cluster[service].vip, cluster[service].port)
        }
    };
    let web = cluster.len() - 2;
    let cells = alternating_rounds(
        &worlds,
        cgroup,
        |path| target(path, web),
        options.connections,
        options.rounds,
    )?;
    // The programs' cost per packet, in one more batch of the per-packet path.
    let tc = tc_run_time_of_batch(
        &worlds,
        Path::PerPacket,
        cgroup(Path::PerPacket),
        target(Path::PerPacket, web),
        options.connections,
        per_packet,
        TC_PROGRAMS,
    )?;
    ensure!(
        tc[0].1 > 0,
        "the per-packet path's programs never ran: were the pods' devices found?"
    );

    let throughput = iperf3_rounds(paths, options.iperf_rounds, |path| {
        let cgroup = (path == Path::Socket).then_some(socket.cgroup.as_path());
        iperf3(
            &worlds[&path].client,
            cgroup,
            target(path, web + 1),
            options.seconds,
        )
    })?;
    Ok(Step {
        services: count,
        cells,
        throughput,
        tc,
    })
}

/// The markdown report; `compared` names the compared agent and its added flags.
fn report(machine: &str, options: &Options, steps: &[Step], compared: Option<&str>) -> String {
    let mut report = String::new();
    let _ = writeln!(report, "{machine}\n");
    let _ = writeln!(
        report,
        "A pod's TCP connections to a ClusterIP of one endpoint (a pod behind the node), last \
         of N ClusterIP Services of 10 endpoints in kube-proxy's rules, and on the no-Service \
         paths to that pod's address; {}; BPF run-time \
         stats on only for one more, untimed batch of the per-packet path.\n",
        options.method("path"),
    );
    let _ = writeln!(
        report,
        "| Services | path | connect+answer+close p50 (µs) | p99 (µs) | p50 / direct | \
         connections/s (1 client) | iperf3 Gbit/s |"
    );
    let _ = writeln!(report, "|---|---|---|---|---|---|---|");
    for step in steps {
        let p50 = |path: Path| step.cells[&path].percentile(50) as f64 / 1e3;
        for &path in step.cells.keys() {
            let runs = &step.throughput[&path];
            let gbits = runs.iter().map(|s| s.gbits).sum::<f64>() / runs.len().max(1) as f64;
            let cell = &step.cells[&path];
            let _ = writeln!(
                report,
                "| {} | {} | {:.1} | {:.1} | {:.3} | {:.0} | {:.2} |",
                step.services,
                path.name(),
                p50(path),
                cell.percentile(99) as f64 / 1e3,
                p50(path) / p50(Path::Direct),
                1e9 / mean_ns(cell).max(1.0),
                gbits,
            );
        }
    }
    let _ = writeln!(report);
    for step in steps {
        let p50 = |path: Path| step.cells[&path].percentile(50) as f64 / 1e3;
        // Left out of the rotation by `--without iptables`.
        let over_iptables = step.cells.get(&Path::Iptables).map_or_else(
            || "no iptables path".to_owned(),
            |_| {
                format!(
                    "per-packet / iptables p50 {:.3}",
                    p50(Path::PerPacket) / p50(Path::Iptables)
                )
            },
        );
        let _ = writeln!(
            report,
            "- {} Services: {over_iptables}, per-packet / nftables p50 {:.3}, \
             per-packet / socket p50 {:.3}, per-packet with direct delivery / nftables p50 \
             {:.3}; the per-packet path's programs per packet: {:.0} ns at the pods' ingress \
             ({} packets), {:.0} ns at their egress ({} packets).",
            step.services,
            p50(Path::PerPacket) / p50(Path::Nftables),
            p50(Path::PerPacket) / p50(Path::Socket),
            p50(Path::PerPacketDirect) / p50(Path::Nftables),
            per_run(step.tc[0]),
            step.tc[0].1,
            per_run(step.tc[1]),
            step.tc[1].1,
        );
        let _ = writeln!(
            report,
            "- {} Services, traffic to no Service (the server pod's address): p50 {:.3} x \
             direct through the per-packet path's node, {:.3} x through nftables' node \
             (per-packet node / nftables node {:.3}).",
            step.services,
            p50(Path::NoServicePerPacket) / p50(Path::Direct),
            p50(Path::NoServiceNftables) / p50(Path::Direct),
            p50(Path::NoServicePerPacket) / p50(Path::NoServiceNftables),
        );
        if let Some(compared) = compared {
            let mean = |path: Path| mean_ns(&step.cells[&path]);
            let _ = writeln!(
                report,
                "- {} Services: compared agent ({compared}) / per-packet p50 {:.3}, mean {:.3}.",
                step.services,
                p50(Path::Compared) / p50(Path::PerPacket),
                mean(Path::Compared) / mean(Path::PerPacket),
            );
        }
    }
    report
}

/// A cell's mean connection time, ns.
fn mean_ns(cell: &measure::Cell) -> f64 {
    cell.samples.iter().sum::<u64>() as f64 / cell.samples.len().max(1) as f64
}
