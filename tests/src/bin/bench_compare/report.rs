//! The comparison's tables, and where they go in docs/benchmarks.md.
use std::{fmt::Write as _, fs, path::Path, process::Command, time::Duration};

use anyhow::Context as _;
use socklb_tests::bench::{
    baseline,
    cluster::{ENDPOINTS, POSITIONS},
    measure::Cell,
    peer::Peer,
    section::Section,
};

use crate::{
    Options, ROUNDS, plot,
    step::{Control, Step, median},
};

const SECTION: Section = Section::new("compare", "compare", "Side by side with kube-proxy");

fn us(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1e3)
}

pub fn secs(duration: Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds >= 1.0 {
        format!("{seconds:.2} s")
    } else {
        format!("{:.1} ms", seconds * 1e3)
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

pub fn report(machine: &str, options: &Options, steps: &[Step]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{machine}; {} connections per cell in {ROUNDS} interleaved rounds; {ENDPOINTS} \
         endpoints per service; {} backend {}; {}; {}\n",
        options.connections,
        tool_version(options.iptables.command(), &["--version"]),
        options.iptables.name(),
        tool_version("nft", &["--version"]),
        baseline::SUMMARY,
    );
    let _ = writeln!(
        out,
        "Connection setup (connect + 4-byte answer + close), p50 / p99, and the ratios of the \
         p50s:\n"
    );
    let _ = writeln!(
        out,
        "| services | service | direct | socklb | iptables | nftables | socklb/direct | \
         socklb/iptables | socklb/nftables |"
    );
    let _ = writeln!(out, "|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for step in steps {
        for position in POSITIONS {
            let cell = |peer| step.latency.get(&(peer, position));
            let direct = cell(Peer::Direct);
            let both = |cell: Option<&Cell>| {
                cell.map_or_else(
                    || "not loaded".to_owned(),
                    |cell| format!("{} / {}", us(cell.percentile(50)), us(cell.percentile(99))),
                )
            };
            let ratio = |a: Option<&Cell>, b: Option<&Cell>| match (a, b) {
                (Some(a), Some(b)) => format!(
                    "**{:.3}**",
                    a.percentile(50) as f64 / b.percentile(50).max(1) as f64
                ),
                _ => "-".to_owned(),
            };
            let socklb = cell(Peer::Socklb);
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                step.services,
                position.name(),
                both(direct),
                both(socklb),
                both(cell(Peer::Iptables)),
                both(cell(Peer::Nftables)),
                ratio(socklb, direct),
                ratio(socklb, cell(Peer::Iptables)),
                ratio(socklb, cell(Peer::Nftables)),
            );
        }
    }
    let _ = writeln!(
        out,
        "\nClient CPU time per connection (getrusage of the client process: user + system, \
         which includes the kernel's work for the connection done in its context):\n"
    );
    let _ = writeln!(
        out,
        "| services | service | direct | socklb | iptables | nftables |"
    );
    let _ = writeln!(out, "|---:|---|---:|---:|---:|---:|");
    for step in steps {
        for position in POSITIONS {
            let cpu = |peer, position| {
                step.latency.get(&(peer, position)).map_or_else(
                    || "-".to_owned(),
                    |cell: &Cell| format!("{:.1} µs", cell.cpu_per_connection_ns() / 1e3),
                )
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                step.services,
                position.name(),
                cpu(Peer::Direct, position),
                cpu(Peer::Socklb, position),
                cpu(Peer::Iptables, position),
                cpu(Peer::Nftables, position),
            );
        }
    }
    let _ = writeln!(
        out,
        "\nOne TCP stream through the service (iperf3, {} s per run, mean of {} runs per peer, \
         interleaved):\n",
        options.iperf_seconds, options.iperf_rounds
    );
    let _ = writeln!(out, "| services | direct | socklb | iptables | nftables |");
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|");
    for step in steps {
        let gbits = |peer| {
            let runs: &[f64] = step.throughput.get(&peer).map_or(&[], Vec::as_slice);
            if runs.is_empty() {
                return "-".to_owned();
            }
            format!("{:.1} Gbit/s", runs.iter().sum::<f64>() / runs.len() as f64)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            step.services,
            gbits(Peer::Direct),
            gbits(Peer::Socklb),
            gbits(Peer::Iptables),
            gbits(Peer::Nftables),
        );
    }
    let _ = writeln!(
        out,
        "\nProgramming every service from nothing, and one endpoint change at N (median of the \
         measurements; iptables: full sync = iptables-restore of the whole ruleset, partial = \
         kube-proxy >= 1.27's restore of KUBE-SERVICES and the changed service's chains; \
         socklb: the agent's own sync, then in parentheses from rewriting the manifest to the \
         sync, file watch and parsing included):\n"
    );
    let _ = writeln!(
        out,
        "| services | iptables from nothing | nftables from nothing | socklb first sync (spawn to \
         ready) | iptables change: full / partial sync | nftables change | socklb change |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|");
    for step in steps {
        let ipt = &step.control[&Peer::Iptables];
        let nft = &step.control[&Peer::Nftables];
        let slb = &step.control[&Peer::Socklb];
        let load = |control: &Control| {
            if control.stopped {
                format!("> {:.0} s (stopped)", control.program.as_secs_f64())
            } else {
                secs(control.program)
            }
        };
        let med = |values: &[Duration]| {
            if values.is_empty() {
                "-".to_owned()
            } else {
                secs(median(values))
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | **{}** ({}) | {} / {} | {} | **{}** ({}) |",
            step.services,
            load(ipt),
            load(nft),
            secs(slb.program),
            slb.ready.map_or_else(|| "-".to_owned(), secs),
            med(&ipt.change),
            med(&ipt.change_partial),
            med(&nft.change),
            med(&slb.change),
            med(&slb.change_end_to_end),
        );
    }
    let _ = writeln!(
        out,
        "\nWhat the programmed state holds and costs (kernel memory: memory-cgroup kernel usage \
         charged by iptables-restore and nft; for socklb the kernel's memlock figure of its \
         pinned maps: the LRU maps and the socket ring preallocated to their capacity flags, \
         the others their hash buckets and the entries they hold; plus the agent's RSS):\n"
    );
    let _ = writeln!(
        out,
        "| services | iptables rules | iptables kernel memory | nftables objects | nftables \
         kernel memory | socklb map entries | socklb maps (memlock) | agent RSS |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for step in steps {
        let ipt = &step.control[&Peer::Iptables];
        let nft = &step.control[&Peer::Nftables];
        let slb = &step.control[&Peer::Socklb];
        let memory = |control: &Control| control.kernel_bytes.map_or_else(|| "n/a".to_owned(), mib);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            step.services,
            ipt.objects,
            memory(ipt),
            nft.objects,
            memory(nft),
            slb.objects,
            memory(slb),
            slb.rss_kib
                .map_or_else(|| "-".to_owned(), |kib| mib(kib * 1024)),
        );
    }
    out
}

fn tool_version(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Rewrites the comparison's section of docs/benchmarks.md and draws the plots into
/// docs/plots.
pub fn write_docs(docs: &Path, report: &str, steps: &[Step]) -> anyhow::Result<()> {
    let plots = docs.join("plots");
    fs::create_dir_all(&plots).with_context(|| format!("create {}", plots.display()))?;
    plot::latency(&plots.join("compare-latency.png"), steps)?;
    plot::control(&plots.join("compare-programming.png"), steps)?;
    SECTION.write(
        docs,
        &format!(
            "{report}\n![connection setup latency vs services](plots/compare-latency.png)\n\n\
             ![programming time vs services](plots/compare-programming.png)"
        ),
    )
}
