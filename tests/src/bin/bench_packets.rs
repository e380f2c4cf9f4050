//! `cargo xtask bench packets`: what each packet of a pod's TCP connection to a ClusterIP
//! costs socklb's per-packet programs, packet by packet, with the network stack taken away:
//! the breakdown behind `bench pod`'s per-connection figures, to see which step a change
//! of the programs makes cheaper.
//!
//! socklb-bench-packets [--services 1000,10000] [--connections N]
//!                      [--trace off|flows|packets] [--docs DIR] [--smoke]
//!
//! The agent runs in a network namespace of its own with `--socket-lb-scope host` and its
//! pod programs on one pod device, over `--services` ClusterIP Services of 10 endpoints and
//! the measured one (one endpoint, the pod 10.244.1.10:8080). Each connection's packets
//! (a client pod's SYN, ACK, FIN and last ACK to the VIP, the server's SYN-ACK, answer and
//! FIN) are run through the programs as a node runs them, each packet on the client's
//! device and on the server's (ingress of the sender's device, egress of the receiver's),
//! each run once in the kernel's test harness (`BPF_PROG_TEST_RUN`), which times the
//! program alone. Connections alternate between the frontend filter trusted and not
//! (README, "The frontend filter"), so both are measured alike.
//!
//! `--trace flows` runs a `socklb trace` session through the replay (its output discarded),
//! `--trace packets` one with `--packets` (every packet of a known flow shown too): what a
//! session costs each packet. Such a run prints its table and writes nothing.
//!
//! Caches are warmer than on a node, where the network stack runs between two packets:
//! `bench pod` measures what a connection pays; this one, where the programs spend it.
use std::{collections::BTreeMap, fmt::Write as _, net::SocketAddrV4, path::Path};

use anyhow::{Context as _, ensure};
use aya::maps::{Array, Map, MapData};
use etherparse::PacketBuilder;
use socklb_abi::{FRONTEND_FILTER_READY, map_names, program_names};
use socklb_tests::{
    bench::{
        cluster::{ENDPOINT_PORT, SERVICE_PORT},
        flags::Flags,
        netns::{End, new_netns, run_in, veth},
        node::{AgentFiles, POD, measured_services, start_agent},
        section::Section,
        trace_session::TraceSession,
    },
    test_run::TestRun,
};

const USAGE: &str = "usage: socklb-bench-packets [--services 1000,10000] [--connections N] \
                     [--trace off|flows|packets] [--docs DIR] [--smoke]";
const SECTION: Section = Section::new(
    "packets",
    "packets",
    "The per-packet path, packet by packet",
);
/// The client pod's address; its device's name on the node.
const CLIENT: &str = "10.244.2.10";
const POD_DEVICE: &str = "pod1";

/// Which TC program a packet meets on which device.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hook {
    /// Ingress of the sender's device (`socklb_tc_pod`).
    Ingress,
    /// Egress of the receiver's device (`socklb_tc_out`).
    Egress,
}

/// A packet of the connection: what it is, whether the client sent it (else the server),
/// its TCP flags and payload length.
struct Packet {
    name: &'static str,
    from_client: bool,
    syn: bool,
    ack: bool,
    fin: bool,
    payload: usize,
}

const fn packet(
    name: &'static str,
    from_client: bool,
    flags: (bool, bool, bool),
    payload: usize,
) -> Packet {
    let (syn, ack, fin) = flags;
    Packet {
        name,
        from_client,
        syn,
        ack,
        fin,
        payload,
    }
}

/// A connection's packets, in order; each meets the pod program at its sender's device and
/// the egress program at its receiver's.
const PACKETS: [Packet; 7] = [
    packet("client SYN", true, (true, false, false), 0),
    packet("server SYN-ACK", false, (true, true, false), 0),
    packet("client ACK", true, (false, true, false), 0),
    packet("server answer", false, (false, true, false), 4),
    packet("client FIN", true, (false, true, true), 0),
    packet("server FIN", false, (false, true, true), 0),
    packet("client last ACK", true, (false, true, false), 0),
];
const HOOKS: [Hook; 2] = [Hook::Ingress, Hook::Egress];
/// Program runs per connection.
const STEPS: usize = PACKETS.len() * HOOKS.len();

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(error) = run(&args) {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

struct Options {
    services: Vec<u32>,
    connections: u32,
    /// The flags of a trace session that runs during the replay, if one does.
    trace: Option<&'static [&'static str]>,
    docs: Option<std::path::PathBuf>,
}

fn parse(args: &[String]) -> anyhow::Result<Options> {
    let mut options = Options {
        services: vec![1_000, 10_000],
        connections: 4_000,
        trace: None,
        docs: None,
    };
    let mut flags = Flags::new(args, USAGE);
    while let Some((flag, value)) = flags.next_flag()? {
        match flag {
            "--services" => options.services = flags.numbers(flag, value, "1000,10000")?,
            "--connections" => options.connections = flags.number(flag, value)?,
            "--trace" => {
                options.trace = match value {
                    "off" => None,
                    "flows" => Some(&[]),
                    "packets" => Some(&["--packets"]),
                    _ => anyhow::bail!("--trace takes off, flows or packets, not {value}\n{USAGE}"),
                }
            }
            "--docs" => options.docs = Some(value.into()),
            _ => anyhow::bail!("unknown flag {flag}\n{USAGE}"),
        }
    }
    if flags.smoke {
        options.services = vec![100];
        options.connections = 50;
        options.docs = None;
    }
    ensure!(
        options.connections >= 1 && options.services.iter().all(|n| *n <= 60_000),
        "--connections at least 1, --services counts of at most 60,000 (the address plan)"
    );
    Ok(options)
}

/// One Service count's run times: per filter state (trusted or not), per step, in ns.
type Times = BTreeMap<bool, Vec<Vec<u32>>>;

fn run(args: &[String]) -> anyhow::Result<()> {
    let options = parse(args)?;
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "loads BPF programs into network namespaces it creates: run it as root"
    );
    let signals = socklb_tests::block_termination_signals();
    let machine = socklb_tests::machine_context();
    let files = AgentFiles::new("socklb-bench-packets", &[])?;
    socklb_tests::cleanup_on_signal(signals, files.leftovers(Vec::new()));
    let (node, pod) = (new_netns()?, new_netns()?);
    run_in(&node, "ip", &["link", "set", "lo", "up"])?;
    veth(
        &End {
            netns: &node,
            device: POD_DEVICE,
            address: "10.244.1.1/24",
        },
        &End {
            netns: &pod,
            device: "eth0",
            address: &format!("{POD}/24"),
        },
    )?;
    let mut measured = Vec::new();
    for &services in &options.services {
        let cluster = measured_services(services, None);
        files.reset(&cluster)?;
        let vip = cluster
            .iter()
            .find(|service| service.name == "web")
            .context("the measured Service")?
            .vip;
        let flags = ["--socket-lb-scope", "host", "--pod-devices", POD_DEVICE];
        let agent = start_agent(&node, &files, cluster.len(), &flags)?;
        let trace = options
            .trace
            .map(|flags| TraceSession::start(&files.pin_dir, flags));
        let times = replay(
            &files.pin_dir,
            SocketAddrV4::new(vip, SERVICE_PORT),
            options.connections,
        )?;
        if let Some(trace) = trace {
            trace.stop();
        }
        agent.stop();
        eprintln!(
            "{services} services: replayed {} connections",
            options.connections
        );
        measured.push((services, times));
    }
    let report = report(&machine, &options, &measured);
    println!("## {}\n", SECTION.heading);
    print!("{report}");
    match &options.docs {
        Some(docs) if options.trace.is_none() => SECTION.write(docs, &report)?,
        Some(_) => eprintln!("runs with a trace session are not written into the docs"),
        None => {}
    }
    Ok(())
}

/// `connections` connections to `vip`, each step run once, the frontend filter trusted
/// for every other connection.
fn replay(pin_dir: &Path, vip: SocketAddrV4, connections: u32) -> anyhow::Result<Times> {
    let ingress = TestRun::of_link(pin_dir, program_names::TC_POD, POD_DEVICE)?;
    let egress = TestRun::of_link(pin_dir, program_names::TC_EGRESS, POD_DEVICE)?;
    let pin = pin_dir.join(map_names::FRONTEND_FILTER);
    let map = MapData::from_pin(&pin).with_context(|| format!("open {}", pin.display()))?;
    let mut filter: Array<MapData, u64> = Map::Array(map)
        .try_into()
        .context("the frontend filter is an array")?;
    let backend = SocketAddrV4::new(POD, ENDPOINT_PORT);
    let mut times = Times::new();
    for connection in 0..connections {
        let trusted = connection % 2 == 0;
        filter
            .set(FRONTEND_FILTER_READY, &u64::from(trusted), 0)
            .context("set the frontend filter's ready word")?;
        let client = SocketAddrV4::new(
            CLIENT.parse().context("the client address")?,
            // A new client port per connection, as a client's connect() takes.
            20_000 + u16::try_from(connection % 40_000).unwrap_or(0),
        );
        let per_step = times
            .entry(trusted)
            .or_insert_with(|| vec![Vec::new(); STEPS]);
        let steps = PACKETS
            .iter()
            .flat_map(|packet| HOOKS.map(|hook| (packet, hook)));
        for ((packet, hook), samples) in steps.zip(per_step.iter_mut()) {
            let frame = frame(packet, hook, client, vip, backend)?;
            let program = match hook {
                Hook::Ingress => &ingress,
                Hook::Egress => &egress,
            };
            samples.push(program.run(&frame).with_context(|| packet.name)?);
        }
    }
    filter
        .set(FRONTEND_FILTER_READY, &1, 0)
        .context("trust the frontend filter again")?;
    Ok(times)
}

/// The frame of `packet` as `hook` sees it: the client's to the VIP on its own device, to
/// the backend (translated) on the server's; the server's to the client on both.
fn frame(
    packet: &Packet,
    hook: Hook,
    client: SocketAddrV4,
    vip: SocketAddrV4,
    backend: SocketAddrV4,
) -> anyhow::Result<Vec<u8>> {
    let (from, to, sequence, acknowledgement) = if packet.from_client {
        let to = if hook == Hook::Ingress { vip } else { backend };
        (client, to, 1_000, 5_001)
    } else {
        (backend, client, 5_000, 1_001)
    };
    let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4(from.ip().octets(), to.ip().octets(), 64)
        .tcp(from.port(), to.port(), sequence, 64_240);
    let builder = if packet.syn { builder.syn() } else { builder };
    let builder = if packet.ack {
        builder.ack(acknowledgement)
    } else {
        builder
    };
    let builder = if packet.fin { builder.fin() } else { builder };
    let payload = vec![b'a'; packet.payload];
    let mut frame = Vec::with_capacity(builder.size(payload.len()));
    builder
        .write(&mut frame, &payload)
        .context("build a frame")?;
    Ok(frame)
}

fn report(machine: &str, options: &Options, measured: &[(u32, Times)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{machine}\n");
    let session = match options.trace {
        None => "",
        Some([]) => "; a `socklb trace` session running (output discarded)",
        Some(_) => "; a `socklb trace --packets` session running (output discarded)",
    };
    let _ = writeln!(
        out,
        "A pod's TCP connections to a ClusterIP of one local endpoint, last of N ClusterIP \
         Services of 10 endpoints; {} connections per Service count, each packet run once \
         through the program it meets (BPF_PROG_TEST_RUN), the frontend filter trusted for \
         every other connection{session}; median run time per packet, ns.\n",
        options.connections
    );
    let _ = writeln!(
        out,
        "| Services | packet | program (device) | filter trusted | filter not trusted |"
    );
    let _ = writeln!(out, "|---|---|---|---:|---:|");
    for (services, times) in measured {
        let median = |trusted: bool, step: usize| {
            times.get(&trusted).map_or(0, |steps| median(&steps[step]))
        };
        let steps = PACKETS
            .iter()
            .flat_map(|packet| HOOKS.map(|hook| (packet, hook)));
        for (index, (packet, hook)) in steps.enumerate() {
            let program = match (hook, packet.from_client) {
                (Hook::Ingress, true) => "pod ingress (client's)",
                (Hook::Ingress, false) => "pod ingress (server's)",
                (Hook::Egress, true) => "egress (server's)",
                (Hook::Egress, false) => "egress (client's)",
            };
            let _ = writeln!(
                out,
                "| {services} | {} | {program} | {} | {} |",
                packet.name,
                median(true, index),
                median(false, index)
            );
        }
        let total = |trusted: bool| (0..STEPS).map(|step| median(trusted, step)).sum::<u32>();
        let _ = writeln!(
            out,
            "| {services} | **a connection** (sum of medians) | | **{}** | **{}** |",
            total(true),
            total(false)
        );
    }
    out
}

fn median(samples: &[u32]) -> u32 {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or(0)
}
