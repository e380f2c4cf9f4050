//! The entry point and the command line the node benchmarks (`bench nodeport`, `bench pod`)
//! share: the flags of the method (connections, rounds, iperf3 seconds, the iptables
//! backend, where the docs are) and what `--smoke` makes of them. Each benchmark adds its own
//! flags (its Service counts).
use std::path::PathBuf;

use anyhow::{Context as _, bail, ensure};

use super::{baseline, client, flags::Flags, loader::IptablesBackend};

/// A node benchmark's `main`: `client` runs the timed client (this binary again, started by
/// the benchmark), anything else `bench`; an error ends the process with status 1.
pub fn main(bench: impl FnOnce(&[String]) -> anyhow::Result<()>) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first() {
        Some(command) if command == "client" => client::run(),
        _ => bench(&args),
    };
    if let Err(error) = result {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

/// The flags every node benchmark takes.
pub struct Options {
    /// Connections per peer and round.
    pub connections: u32,
    pub rounds: u32,
    /// Seconds of each iperf3 run.
    pub seconds: u32,
    pub iperf_rounds: u32,
    pub iptables: IptablesBackend,
    /// Where benchmarks.md is, to rewrite the benchmark's section (never for a smoke run).
    pub docs: Option<PathBuf>,
    /// `--smoke`: seconds long, keeps the benchmark working, measures nothing worth keeping.
    pub smoke: bool,
}

impl Options {
    /// `args` with the defaults of a full run; `own` takes each flag that is not one of these
    /// (`Ok(false)`: no flag of the benchmark either).
    pub fn parse(
        args: &[String],
        usage: &'static str,
        mut own: impl FnMut(&Flags<'_>, &str, &str) -> anyhow::Result<bool>,
    ) -> anyhow::Result<Self> {
        let mut options = Self {
            connections: 2000,
            rounds: 5,
            seconds: 3,
            iperf_rounds: 2,
            iptables: IptablesBackend::Legacy,
            docs: None,
            smoke: false,
        };
        let mut flags = Flags::new(args, usage);
        while let Some((flag, value)) = flags.next_flag()? {
            let number = || flags.number(flag, value);
            match flag {
                "--connections" => options.connections = number()?,
                "--rounds" => options.rounds = number()?,
                "--seconds" => options.seconds = number()?,
                "--iptables" => options.iptables = IptablesBackend::parse(value).context(usage)?,
                "--docs" => options.docs = Some(PathBuf::from(value)),
                _ if own(&flags, flag, value)? => {}
                _ => bail!("unknown flag {flag}\n{usage}"),
            }
        }
        options.smoke = flags.smoke;
        if options.smoke {
            options.connections = options.connections.min(50);
            options.rounds = options.rounds.min(3);
            options.seconds = 1;
            options.iperf_rounds = 1;
            options.docs = None;
        }
        ensure!(
            options.connections >= 1 && options.rounds >= 1 && options.seconds >= 1,
            "--connections, --rounds and --seconds must be at least 1"
        );
        Ok(options)
    }

    /// The method, for a report: what the flags chose and the namespaces' baseline, each
    /// `unit` (a peer, a path) measured alike, the units alternating connection by connection.
    pub fn method(&self, unit: &str) -> String {
        format!(
            "iptables backend {}; {} rounds x {} connections per {unit}, the {unit}s alternating \
             connection by connection (a client process per {unit}, staying in its namespace \
             and cgroup, all on one CPU), their turn in a new random order every round; \
             iperf3 {} x {} s per {unit}; {}",
            self.iptables.name(),
            self.rounds,
            self.connections,
            self.iperf_rounds,
            self.seconds,
            baseline::SUMMARY,
        )
    }
}
