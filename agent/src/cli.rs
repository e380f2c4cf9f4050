//! The `socklb` command line.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use tracing::info;

use crate::{
    dataplane::{self, Capacities, Config, Dataplane},
    static_frontends,
};

#[derive(Debug, Parser)]
#[command(
    name = "socklb",
    version,
    about = "eBPF socket-level load balancer that replaces kube-proxy"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load and attach the datapath, program it, and keep it programmed until stopped.
    Run(RunArgs),
    /// Detach the programs and remove every pin socklb created.
    Cleanup(PinArgs),
    /// Print the version and the map layout version.
    Version,
}

#[derive(Debug, Args)]
pub struct PinArgs {
    /// Directory on bpffs for socklb's pinned maps and links.
    #[arg(long = "bpffs", env = "SOCKLB_BPFFS", default_value = dataplane::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    /// cgroup v2 directory to attach to [default: the cgroup v2 mount, found in
    /// /proc/self/mountinfo].
    #[arg(long)]
    pub cgroup_path: Option<PathBuf>,
    /// Frontends and backends as a JSON list (temporary, until the cluster sources land).
    #[arg(long = "static-frontends")]
    pub static_frontends: PathBuf,
    #[command(flatten)]
    pub capacities: CapacityArgs,
}

#[derive(Debug, Args)]
pub struct CapacityArgs {
    /// Service map entries: one per frontend plus one per backend of each frontend.
    #[arg(long, default_value_t = Capacities::default().service_entries)]
    pub max_service_entries: u32,
    /// Distinct backends (address, port, protocol).
    #[arg(long, default_value_t = Capacities::default().backends)]
    pub max_backends: u32,
    /// Sockets remembered for reverse translation (LRU).
    #[arg(long, default_value_t = Capacities::default().reverse)]
    pub max_reverse_entries: u32,
    /// Session-affinity entries (LRU).
    #[arg(long, default_value_t = Capacities::default().affinity)]
    pub max_affinity_entries: u32,
}

impl From<&CapacityArgs> for Capacities {
    fn from(args: &CapacityArgs) -> Self {
        Self {
            service_entries: args.max_service_entries,
            backends: args.max_backends,
            reverse: args.max_reverse_entries,
            affinity: args.max_affinity_entries,
        }
    }
}

pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // aya logs through the `log` crate: the subscriber's log bridge carries it into tracing.
    // Colours only on a terminal: container logs stay plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

pub fn main(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Cleanup(args) => cleanup(&args),
        Command::Version => {
            println!(
                "socklb {} (map layout v{})",
                env!("CARGO_PKG_VERSION"),
                socklb_abi::LAYOUT_VERSION
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let desired = static_frontends::read(&args.static_frontends)?;
    let mut dataplane = Dataplane::load(Config {
        pin_dir: args.pins.pin_dir.clone(),
        cgroup: args.cgroup_path.clone(),
        capacities: Capacities::from(&args.capacities),
    })?;
    // Program the maps before the programs can see them.
    let report = dataplane.apply(&desired)?;
    info!(
        frontends = desired.frontends.len(),
        writes = report.writes,
        rejected = report.rejected.len(),
        "maps programmed"
    );
    dataplane.attach()?;
    info!("ready");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(wait_for_shutdown())?;
    // The links stay pinned: the datapath keeps working while no agent runs.
    info!("stopping; programs stay attached (`socklb cleanup` removes them)");
    Ok(())
}

async fn wait_for_shutdown() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    Ok(())
}

fn cleanup(args: &PinArgs) -> anyhow::Result<()> {
    let cleanup = dataplane::cleanup(&args.pin_dir)
        .with_context(|| format!("cleaning up {}", args.pin_dir.display()))?;
    if cleanup.removed.is_empty() {
        println!("nothing to remove under {}", args.pin_dir.display());
    }
    for path in &cleanup.removed {
        println!("removed {}", path.display());
    }
    Ok(())
}
