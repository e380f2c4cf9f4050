//! `cargo xtask bench destroy`: what the agent's sweep costs when a backend leaves while
//! many sockets are open on the node (the target: under 50 ms of agent CPU with 50,000).
//!
//! socklb-bench-destroy [--sockets N] [--rounds N] [--modes bpf-iterator,netlink]
//!                      [--max-reverse-entries N] [--docs DIR]
//!
//! Per mode: a fresh sandbox (the node's namespace), a UDP Service with two backends and
//! the real agent (`--socket-destroy-mode MODE`, the chart's capabilities plus PERFMON and
//! SYS_ADMIN, a socket map of `--max-reverse-entries` slots, 131,072 by default: a ring
//! smaller than the sockets open forgets the oldest, whose sockets are then not closed). Each round opens `--sockets` connected UDP sockets to the Service (holder
//! processes in the sandbox's cgroup, about half on each backend), removes one backend, and
//! reads the sweep's own log line: its wall time (`took`), the sweeping thread's CPU time
//! (`cpu`), the sockets closed and the namespaces swept (every namespace of the machine).
//! With `--docs DIR`, the table also replaces the `destroy` section of DIR/benchmarks.md.
use std::{
    fmt::Write as _,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use socklb_tests::{
    Agent, ManifestDir, Sandbox, bench::section::Section, command_in_cgroup, hold::Holder,
    hold_bin, node_yaml, parse_debug_duration, privileges::chart_agent, run,
};

const USAGE: &str = "usage: socklb-bench-destroy [--sockets N] [--rounds N] \
                     [--modes bpf-iterator,netlink] [--max-reverse-entries N] [--docs DIR]";
/// Sockets per holder process: RLIMIT_NOFILE is 20,000 here and cannot be raised without
/// CAP_SYS_RESOURCE.
const PER_HOLDER: u32 = 18_000;
const VIP: &str = "10.96.0.53";
const SWEEP_LINE: &str = "closed the sockets of removed backends";
const DEADLINE: Duration = Duration::from_secs(60);
const SECTION: Section = Section::new(
    "destroy",
    "destroy",
    "Closing the sockets of a removed backend",
);

struct Options {
    sockets: u32,
    rounds: u32,
    modes: Vec<String>,
    ring: u32,
    /// Where benchmarks.md is, to rewrite the `destroy` section.
    docs: Option<PathBuf>,
}

/// One sweep, as the agent logged it.
#[derive(Clone, Copy)]
struct Sweep {
    took: Duration,
    cpu: Duration,
    closed: u64,
    namespaces: u64,
}

fn main() {
    let options = parse_options(&std::env::args().skip(1).collect::<Vec<_>>());
    socklb_tests::bench::preflight::exit_unless_root("destroy");
    let mut report = String::new();
    let _ = writeln!(report, "{}", socklb_tests::machine_context());
    let _ = writeln!(
        report,
        "{} connected UDP sockets to one Service of two backends; one backend removed per \
         round, {} rounds per mode; socket map of {} slots\n",
        options.sockets, options.rounds, options.ring
    );
    let _ = writeln!(
        report,
        "| mode | sockets open | closed per sweep | namespaces swept | sweep CPU median (max) | sweep wall median (max) |"
    );
    let _ = writeln!(report, "|---|---:|---:|---:|---:|---:|");
    for mode in &options.modes {
        let mut sweeps = measure(mode, &options);
        sweeps.sort_by_key(|s| s.cpu);
        let cpu_median = sweeps[sweeps.len() / 2].cpu;
        let cpu_max = sweeps[sweeps.len() - 1].cpu;
        sweeps.sort_by_key(|s| s.took);
        let took_median = sweeps[sweeps.len() / 2].took;
        let took_max = sweeps[sweeps.len() - 1].took;
        let closed: Vec<String> = sweeps.iter().map(|s| s.closed.to_string()).collect();
        let _ = writeln!(
            report,
            "| {mode} | {} | {} | {} | {:.1} ms ({:.1} ms) | {:.1} ms ({:.1} ms) |",
            options.sockets,
            closed.join(", "),
            sweeps[0].namespaces,
            ms(cpu_median),
            ms(cpu_max),
            ms(took_median),
            ms(took_max)
        );
    }
    print!("{report}");
    if let Some(docs) = &options.docs {
        SECTION
            .write(docs, &report)
            .expect("write the results into the docs");
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn measure(mode: &str, options: &Options) -> Vec<Sweep> {
    let sandbox = Sandbox::new(&format!("bench-destroy-{mode}"));
    // Room for the sockets' ephemeral ports.
    run(Command::new("sysctl").args(["-qw", "net.ipv4.ip_local_port_range=1024 65000"]));
    let backends = ["10.201.0.1", "10.201.0.2"];
    for backend in backends {
        run(Command::new("ip").args(["addr", "add", &format!("{backend}/32"), "dev", "lo"]));
    }
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.31.1"));
    manifests.write(
        "dns.yaml",
        &format!(
            "apiVersion: v1
kind: Service
metadata: {{name: dns, namespace: default}}
spec:
  clusterIP: {VIP}
  clusterIPs: [{VIP}]
  ports: [{{name: p, port: 53, protocol: UDP}}]
"
        ),
    );
    let slice = |addresses: &[&str]| {
        let mut yaml = "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: default
  labels: {kubernetes.io/service-name: dns}
addressType: IPv4
ports: [{name: p, port: 5353, protocol: UDP}]
endpoints:
"
        .to_owned();
        for address in addresses {
            yaml.push_str(&format!("- addresses: [{address}]\n  nodeName: node-a\n"));
        }
        yaml
    };
    manifests.write("dns-slice.yaml", &slice(&backends));
    let privileges = chart_agent().with("PERFMON");
    let agent = Agent::start_as(
        &privileges,
        &sandbox,
        &manifests.path,
        "node-a",
        &[
            "--socket-destroy-mode",
            mode,
            "--max-reverse-entries",
            &options.ring.to_string(),
        ],
    );
    let mut sweeps = Vec::new();
    for round in 0..options.rounds {
        if round > 0 {
            // Both backends again (an addition: no sweep), synced before the sockets open.
            let synced = agent.log().matches(" synced ").count();
            manifests.write("dns-slice.yaml", &slice(&backends));
            agent.wait_for_log(" synced ", synced + 1);
        }
        let mut holders = Vec::new();
        let mut left = options.sockets;
        while left > 0 {
            let count = left.min(PER_HOLDER);
            left -= count;
            let mut command = command_in_cgroup(&sandbox.cgroup, hold_bin());
            command.args(["many-udp", &format!("{VIP}:53"), &count.to_string()]);
            let (holder, first) = Holder::start("socket holder", command);
            assert_eq!(
                first.reply,
                Some(count.to_string()),
                "the holder could not open its sockets: {first:?}"
            );
            holders.push(holder);
        }
        let before = agent.log().matches(SWEEP_LINE).count();
        manifests.write("dns-slice.yaml", &slice(&backends[1..]));
        let started = Instant::now();
        while agent.log().matches(SWEEP_LINE).count() == before {
            assert!(
                started.elapsed() < DEADLINE,
                "no sweep logged:\n{}",
                agent.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        sweeps.push(last_sweep(&agent));
        drop(holders);
    }
    sweeps
}

fn last_sweep(agent: &Agent) -> Sweep {
    let log = agent.log();
    let line = log
        .lines()
        .rev()
        .find(|line| line.contains(SWEEP_LINE))
        .expect("a sweep line");
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
    };
    let duration = |name: &str| {
        parse_debug_duration(field(name)).unwrap_or_else(|| panic!("{name}= in {line:?}"))
    };
    let number = |name: &str| -> u64 {
        field(name)
            .parse()
            .unwrap_or_else(|_| panic!("{name}= in {line:?}"))
    };
    Sweep {
        took: duration("took"),
        cpu: duration("cpu"),
        closed: number("udp"),
        namespaces: number("namespaces"),
    }
}

fn parse_options(args: &[String]) -> Options {
    let mut options = Options {
        sockets: 50_000,
        rounds: 5,
        modes: vec!["bpf-iterator".to_owned(), "netlink".to_owned()],
        ring: 131_072,
        docs: None,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--sockets" => options.sockets = value.parse().unwrap_or_else(|_| fail(value)),
            "--rounds" => {
                options.rounds = value
                    .parse()
                    .ok()
                    .filter(|r| *r > 0)
                    .unwrap_or_else(|| fail(value));
            }
            "--modes" => options.modes = value.split(',').map(str::to_owned).collect(),
            "--max-reverse-entries" => {
                options.ring = value.parse().unwrap_or_else(|_| fail(value));
            }
            "--docs" => options.docs = Some(PathBuf::from(value)),
            _ => fail(&format!("unknown flag {flag}")),
        }
    }
    options
}

fn fail(what: &str) -> ! {
    eprintln!("{what}\n{USAGE}");
    std::process::exit(2);
}
