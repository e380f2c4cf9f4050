//! The `socklb` command line.
mod checks;

use std::{
    net::SocketAddr, ops::RangeInclusive, path::PathBuf, process::ExitCode, sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::{
    dataplane::{self, Capacities, Config, Dataplane, ProgramLogLevel, TcMode},
    explain, inspect,
    metrics::Metrics,
    runner::{ExternalTraffic, Runner, SyncPeriods},
    select::ServiceName,
    server::{self, Health},
    source::{
        Event, Kind,
        file::FileSource,
        kube::{self, KubeSource},
    },
    state::ClusterState,
    stdout,
    sweep::{Requested, Sweeper},
    trace,
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
    /// Load and attach the datapath and keep it programmed from the cluster until stopped.
    Run(Box<RunArgs>),
    /// Show, for every Service frontend, the backends this node uses and why.
    Explain(ExplainArgs),
    /// Show what the pinned maps hold (works while the agent is down).
    Inspect(InspectArgs),
    /// Show each translation as it happens: which backend, and why.
    Trace(TraceArgs),
    /// Detach the programs and remove every pin socklb created.
    Cleanup(PinArgs),
    /// Print the version and the map layout version.
    Version,
    /// Print a shell completion script, e.g. `socklb completion bash >
    /// /etc/bash_completion.d/socklb`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `socklb man > /usr/share/man/man8/socklb.8`.
    Man,
    /// Print the name of every series the agent exports, one per line (for checks of
    /// dashboards and alerts against the agent itself).
    #[command(hide = true)]
    MetricsNames,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourceKind {
    /// The Kubernetes API (in-cluster config or --kubeconfig).
    Kube,
    /// A directory of manifests (--manifests), watched for changes.
    File,
}

#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Where cluster state comes from.
    #[arg(long, value_enum, default_value = "kube")]
    pub source: SourceKind,
    /// Directory of Service, EndpointSlice and Node manifests (with --source file).
    #[arg(long, required_if_eq("source", "file"))]
    pub manifests: Option<PathBuf>,
    /// kubeconfig file (with --source kube) [default: in-cluster config, then
    /// $KUBECONFIG or ~/.kube/config].
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name [default: $NODE_NAME, then the hostname].
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Longest wait between two attempts to reach the API server after a failure (each wait
    /// is drawn between half and all of its step). Bounds how long after an API-server
    /// outage changes are applied again.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub api_retry_max: Duration,
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
    pub source: SourceArgs,
    #[command(flatten)]
    pub pins: PinArgs,
    /// cgroup v2 directory to attach to [default: the cgroup v2 mount, found in
    /// /proc/self/mountinfo, so that every process on the node is served].
    #[arg(long)]
    pub cgroup_path: Option<PathBuf>,
    /// Least time between two syncs: changes arriving meanwhile are programmed together.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pub min_sync_period: Duration,
    /// Time between full resyncs, which re-read the maps and repair any drift.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub sync_period: Duration,
    /// How long to wait for another agent holding the pin directory to exit (the handover of
    /// a rolling update) before giving up.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub handover_wait: Duration,
    /// Address for /healthz, /livez and /readyz (kube-proxy's health port).
    #[arg(long, default_value = "0.0.0.0:10256")]
    pub healthz_bind_address: SocketAddr,
    /// Address for /metrics (kube-proxy's metrics port).
    #[arg(long, default_value = "127.0.0.1:10249")]
    pub metrics_bind_address: SocketAddr,
    /// The kernel programs' own log lines (their rare failure paths, at warn) forwarded
    /// into this log. Off costs nothing: the verifier removes the log calls at load.
    #[arg(long, value_enum, default_value_t = ProgramLogLevel::Off)]
    pub bpf_log_level: ProgramLogLevel,
    /// Also close the TCP connections still open to a backend that left its Service
    /// (connected UDP sockets are always closed). Off by default: kube-proxy lets TCP
    /// connections drain. Given alone, or as =true / =false (the chart's form).
    #[arg(
        long,
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub destroy_tcp_on_backend_removal: bool,
    /// How sockets of removed backends are closed: BPF socket iterators (Linux >= 6.5,
    /// CAP_PERFMON or CAP_SYS_ADMIN), netlink SOCK_DESTROY, auto (the iterators if they
    /// load, else netlink), or off. The sweep enters other network namespaces with
    /// CAP_SYS_ADMIN only (else it covers the agent's own): those pinned under /run/netns
    /// and /var/run/netns, and those of the processes it can read in /proc (the node's only
    /// with hostPID, other users' only with CAP_SYS_PTRACE). `run --help` (below) and
    /// `socklb inspect` say what this process's capabilities give.
    #[arg(long, value_enum, default_value_t = Requested::Auto)]
    pub socket_destroy_mode: Requested,
    #[command(flatten)]
    pub capacities: CapacityArgs,
    #[command(flatten)]
    pub external: ExternalArgs,
}

/// Traffic from outside the node: NodePorts, LoadBalancer IPs, externalIPs.
#[derive(Debug, Args)]
pub struct ExternalArgs {
    /// Devices whose incoming traffic is translated, comma-separated (none given: the
    /// devices that hold the Node's addresses).
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// How the TC programs attach: tcx (kernel >= 6.6), netlink (clsact), or auto.
    #[arg(long, value_enum, default_value_t = TcMode::Auto)]
    pub tc_attach_mode: TcMode,
    /// Source ports for flows SNATed to reach a backend on another node, as MIN-MAX. Keep
    /// it outside net.ipv4.ip_local_port_range, so it never collides with the node's own
    /// connections.
    #[arg(long, default_value = "61000-65535", value_parser = parse_port_range)]
    pub snat_port_range: RangeInclusive<u16>,
    /// Positions of each Maglev table (Services annotated socklb.io/lb-algorithm: maglev):
    /// a prime from the list; more positions spread flows more evenly over many backends,
    /// at 4 bytes of value (about 64 bytes of kernel memory) per position and Service.
    #[arg(long, default_value_t = dataplane::DEFAULT_MAGLEV_TABLE_SIZE, value_parser = parse_maglev_size)]
    pub maglev_table_size: u32,
    /// Idle time after which a TCP flow from outside whose handshake did not complete (a
    /// SYN, or a SYN and its SYN-ACK) is forgotten and its SNAT port reused.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub conntrack_tcp_timeout_syn: Duration,
    /// Idle time after which an established TCP flow from outside is forgotten.
    #[arg(long, default_value = "6h", value_parser = humantime::parse_duration)]
    pub conntrack_tcp_timeout_established: Duration,
    /// Idle time after which a TCP flow from outside that saw a FIN or RST is forgotten.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub conntrack_tcp_timeout_close: Duration,
    /// Idle time after which a UDP flow from outside is forgotten.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub conntrack_udp_timeout: Duration,
}

fn parse_maglev_size(text: &str) -> Result<u32, String> {
    let sizes = dataplane::MAGLEV_TABLE_SIZES;
    text.parse::<u32>()
        .ok()
        .filter(|size| sizes.contains(size))
        .ok_or_else(|| format!("{text:?} is not one of the prime table sizes {sizes:?}"))
}

fn parse_port_range(text: &str) -> Result<RangeInclusive<u16>, String> {
    let (min, max) = text
        .split_once('-')
        .ok_or_else(|| format!("{text:?} is not MIN-MAX, e.g. 61000-65535"))?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{p:?} is not a port between 1 and 65535"))
    };
    let (min, max) = (port(min)?, port(max)?);
    if min > max {
        return Err(format!(
            "{min}-{max}: the first port must not exceed the second"
        ));
    }
    Ok(min..=max)
}

#[derive(Debug, Args)]
pub struct CapacityArgs {
    /// Service map entries: one per frontend plus one per backend of each frontend. An
    /// upper bound: the map starts smaller and grows by itself.
    #[arg(long, default_value_t = Capacities::default().service_entries)]
    pub max_service_entries: u32,
    /// Distinct backends (address, port, protocol). An upper bound: the map starts smaller
    /// and grows by itself.
    #[arg(long, default_value_t = Capacities::default().backends)]
    pub max_backends: u32,
    /// Translated sockets whose peer getpeername() and recvmsg() show as the frontend:
    /// slots of the connected-socket ring (rounded up to a power of two; a socket's slot is
    /// taken over by the translated socket whose cookie is this much larger, after at most
    /// this many socket cookies handed out on the node) and LRU entries for the datagrams
    /// of unconnected UDP sockets.
    #[arg(long, default_value_t = Capacities::default().reverse)]
    pub max_reverse_entries: u32,
    /// Session-affinity entries (LRU).
    #[arg(long, default_value_t = Capacities::default().affinity)]
    pub max_affinity_entries: u32,
    /// Conntrack entries for traffic from outside the node, two per flow (LRU): flows
    /// confirmed (TCP past its handshake, UDP answered and continued).
    #[arg(long, default_value_t = Capacities::default().conntrack)]
    pub max_conntrack_entries: u32,
    /// Conntrack entries of flows from outside not yet confirmed, two per flow (LRU): a SYN
    /// flood fills this table and never evicts a confirmed flow.
    #[arg(long, default_value_t = Capacities::default().conntrack_new)]
    pub max_conntrack_new_entries: u32,
    /// loadBalancerSourceRanges entries: one per range plus one per restricted frontend.
    #[arg(long, default_value_t = Capacities::default().source_ranges)]
    pub max_source_ranges: u32,
    /// Maglev table entries: --maglev-table-size for each Service using Maglev. An upper
    /// bound: the map starts smaller and grows by itself.
    #[arg(long, default_value_t = Capacities::default().maglev_entries)]
    pub max_maglev_entries: u32,
    /// Sockets holding a record of what they were translated for, which the sweep uses to
    /// close them when their backend leaves: connected UDP sockets, and TCP sockets with
    /// --destroy-tcp-on-backend-removal. The kernel charges records to the agent's memory
    /// (about 400 bytes each: 24 MiB at the default); past the bound a socket is still translated, and the sweep
    /// finds it through the socket ring only (docs/operations.md, "Sockets of removed
    /// backends").
    #[arg(long, default_value_t = Capacities::default().socket_records)]
    pub max_socket_records: u32,
}

impl From<&CapacityArgs> for Capacities {
    fn from(args: &CapacityArgs) -> Self {
        Self {
            service_entries: args.max_service_entries,
            backends: args.max_backends,
            reverse: args.max_reverse_entries,
            affinity: args.max_affinity_entries,
            conntrack: args.max_conntrack_entries,
            conntrack_new: args.max_conntrack_new_entries,
            source_ranges: args.max_source_ranges,
            maglev_entries: args.max_maglev_entries,
            socket_records: args.max_socket_records,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    /// Only the frontends on this address, IPv4 or IPv6 (a ClusterIP, node address, ...).
    #[arg(long)]
    pub address: Option<std::net::IpAddr>,
    /// Only the frontends of this Service, NAMESPACE/NAME (and their affinity and
    /// conntrack entries).
    #[arg(long)]
    pub service: Option<String>,
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    /// Only the frontends of this Service, NAMESPACE/NAME.
    #[arg(long)]
    pub service: Option<String>,
    /// Only this frontend, ADDRESS:PORT or [IPV6]:PORT (port 0: any port of the address).
    #[arg(long)]
    pub frontend: Option<std::net::SocketAddr>,
    /// Only translations to this backend address (IPv4 or IPv6).
    #[arg(long)]
    pub backend: Option<std::net::IpAddr>,
    /// Also recvmsg() and getpeername() answers shown as the frontend.
    #[arg(long)]
    pub reverse: bool,
    /// Also every packet of known flows from outside (conntrack hits), not only new flows.
    #[arg(long)]
    pub packets: bool,
    /// Stop after this many events.
    #[arg(long)]
    pub count: Option<usize>,
    /// Stop after this long (e.g. `30s`).
    #[arg(long)]
    pub duration: Option<humantime::Duration>,
    /// `table`: one line per event; `json`: one JSON object per line.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Only this Service (namespace/name).
    #[arg(long)]
    pub service: Option<String>,
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
}

/// Logs to stderr; `RUST_LOG` filters, else `info` for the agent and `warn` for the
/// one-shot commands (whose output is on stdout).
pub fn init_tracing(cli: &Cli) {
    let default = match cli.command {
        Command::Run(_) => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: container logs stay plain text. aya logs through the
    // `log` crate; the subscriber's log bridge carries it into tracing.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

/// Parses the command line. `--help` and `--version` are written like any other output
/// (clap's own printing ignores a closed pipe and exits 0); `run --help` adds what the
/// socket sweep covers with this process's capabilities.
pub fn parse() -> Result<Cli, ExitCode> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut command = Cli::command();
    let wants_help = args.iter().any(|arg| arg == "--help" || arg == "-h");
    if wants_help && args.get(1).is_some_and(|arg| arg == "run") {
        command = command.mut_subcommand("run", |run| {
            run.after_help(format!(
                "With this process's capabilities on this kernel:\n  {}",
                crate::sweep::Expected::probe().describe()
            ))
        });
    }
    let error = match command.try_get_matches_from(args) {
        Ok(mut matches) => match Cli::from_arg_matches_mut(&mut matches) {
            Ok(cli) => return Ok(cli),
            Err(error) => error,
        },
        Err(error) => error,
    };
    if error.use_stderr() {
        error.exit();
    }
    Err(match crate::stdout::print(&error.render().to_string()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(crate::stdout::StdoutError::ReaderGone) => crate::stdout::die_of_sigpipe(),
        Err(write) => {
            crate::stdout::note(&format!("error: {}", crate::error_chain(&write)));
            ExitCode::FAILURE
        }
    })
}

pub fn main(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Run(args) => run(&args),
        Command::Explain(args) => explain_command(&args),
        Command::Inspect(args) => inspect_command(&args).map_err(privilege_first),
        Command::Trace(args) => trace_command(&args).map_err(privilege_first),
        Command::Cleanup(args) => cleanup(&args).map_err(privilege_first),
        Command::MetricsNames => {
            let mut names = String::new();
            for name in crate::metrics::exported_names(&crate::metrics::all()) {
                names.push_str(&name);
                names.push('\n');
            }
            stdout::print(&names).map_err(Into::into)
        }
        Command::Version => stdout::println(&format!(
            "socklb {} (map layout v{})",
            env!("CARGO_PKG_VERSION"),
            socklb_abi::LAYOUT_VERSION
        ))
        .map_err(Into::into),
        Command::Completion { shell } => completion(shell),
        Command::Man => man(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if stdout::is_reader_gone(&error) => stdout::die_of_sigpipe(),
        Err(error) => {
            stdout::note(&format!("error: {error:#}"));
            ExitCode::FAILURE
        }
    }
}

/// A completion script for `shell`, from the parser's own definitions.
fn completion(shell: clap_complete::Shell) -> anyhow::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "socklb", &mut script);
    stdout::print(&String::from_utf8_lossy(&script))?;
    Ok(())
}

/// The man page, from the parser's own definitions: the command, then a section for each
/// subcommand with its synopsis, description and every flag.
fn man() -> anyhow::Result<()> {
    let render = |write: &mut dyn FnMut(&mut Vec<u8>) -> std::io::Result<()>| {
        let mut roff = Vec::new();
        write(&mut roff).map(|()| String::from_utf8_lossy(&roff).into_owned())
    };
    let command = Cli::command();
    let mut page = render(&mut |out| {
        clap_mangen::Man::new(command.clone())
            .section("8")
            .render(out)
    })
    .context("cannot render the man page")?;
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        let name = format!("socklb {}", sub.get_name());
        let man = clap_mangen::Man::new(sub.clone().bin_name(name.clone()));
        let text = render(&mut |out| {
            man.render_synopsis_section(out)?;
            man.render_description_section(out)?;
            man.render_options_section(out)
        })
        .context("cannot render the man page")?;
        // One top-level section per subcommand, its parts below it.
        for line in text.lines() {
            let line = match line.strip_prefix(".SH ") {
                Some("SYNOPSIS") => format!(".SH \"{}\"", name.to_uppercase()),
                Some(heading) => format!(".SS {heading}"),
                None => line.to_owned(),
            };
            page.push_str(&line);
            page.push('\n');
        }
    }
    stdout::print(&page)?;
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn node_name(args: &SourceArgs) -> anyhow::Result<String> {
    if let Some(name) = &args.node_name {
        return Ok(name.clone());
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("no --node-name or NODE_NAME, and the hostname cannot be read")?;
    Ok(hostname.trim().to_owned())
}

/// Starts the configured source; its events arrive on the returned channel.
async fn start_source(
    args: &SourceArgs,
    node_name: &str,
) -> anyhow::Result<(
    mpsc::Receiver<Event>,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    let (events, receiver) = mpsc::channel(4096);
    let task = match args.source {
        SourceKind::File => {
            let Some(dir) = args.manifests.clone() else {
                bail!("--source file needs --manifests DIR");
            };
            if !dir.is_dir() {
                bail!("--manifests {}: not a directory", dir.display());
            }
            tokio::spawn(async move { Ok(FileSource::new(dir).run(events).await?) })
        }
        SourceKind::Kube => {
            let client = kube::client(args.kubeconfig.as_deref()).await?;
            let source =
                KubeSource::new(client, node_name.to_owned()).with_retry_max(args.api_retry_max);
            tokio::spawn(async move { Ok(source.run(events).await?) })
        }
    };
    Ok((receiver, task))
}

fn run(args: &RunArgs) -> anyhow::Result<()> {
    // Before anything is created: a bad flag leaves the node as it was.
    checks::check(args)?;
    let node_name = node_name(&args.source)?;
    // Before anything is created: a device the programs cannot serve fails the start.
    dataplane::check_devices(&args.external.devices)
        .context("--devices names a device socklb cannot serve: remove it from --devices")?;
    let listeners = [
        server::bind(args.healthz_bind_address, "--healthz-bind-address")?,
        server::bind(args.metrics_bind_address, "--metrics-bind-address")?,
    ];
    // One writer per pin directory, held until the process exits.
    let pin_dir = &args.pins.pin_dir;
    let pin_dir_existed = pin_dir.exists();
    dataplane::prepare_pin_dir(pin_dir)?;
    let _pin_lock = dataplane::lock_pin_dir(pin_dir, args.handover_wait)?;
    let mut dataplane = Dataplane::load(Config {
        pin_dir: pin_dir.clone(),
        cgroup: args.cgroup_path.clone(),
        capacities: Capacities::from(&args.capacities),
        maglev_table_size: args.external.maglev_table_size,
        program_log_level: args.bpf_log_level,
        record_tcp: args.destroy_tcp_on_backend_removal,
    })
    .inspect_err(|_| {
        // A failed start leaves nothing behind: the loader unpinned its maps.
        if !pin_dir_existed {
            let _ = std::fs::remove_dir(dataplane::pin_lock_path(pin_dir));
            let _ = std::fs::remove_dir(pin_dir);
        }
    })?;
    let program_logs = dataplane.program_logs()?;
    info!(node = %node_name, source = ?args.source.source, "starting");
    runtime()?.block_on(async {
        // Aborted when the runtime stops.
        if let Some(logs) = program_logs {
            tokio::spawn(logs.forward());
        }
        let health = Arc::new(Health::new(args.sync_period));
        let counters_pins = args.pins.pin_dir.clone();
        let metrics = Arc::new(
            Metrics::new().with_datapath_events(move || server::read_counters(&counters_pins)),
        );
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = move || {
            let mut stop = stop_rx.clone();
            async move {
                let _ = stop.wait_for(|stop| *stop).await;
            }
        };
        let router = server::router(health.clone(), metrics.clone());
        let mut servers = Vec::new();
        for listener in listeners {
            let router = router.clone();
            let shutdown = stopped();
            servers.push(tokio::spawn(async move {
                server::serve(listener, router, shutdown).await
            }));
        }

        let (events, source) = start_source(&args.source, &node_name).await?;
        let sweeper = Sweeper::start(
            dataplane.take_destroy_programs(),
            pin_dir,
            args.socket_destroy_mode,
            args.destroy_tcp_on_backend_removal,
            metrics.clone(),
        )?;
        let runner = Runner::new(
            &node_name,
            dataplane,
            SyncPeriods {
                min: args.min_sync_period,
                full: args.sync_period,
            },
            health,
            metrics,
        )
        .with_external(external_traffic(&args.external))
        .with_sweeper(sweeper);
        let result = runner.run(events, shutdown_signal()).await;
        let _ = stop_tx.send(true);
        source.abort();
        for server in servers {
            if let Ok(Err(error)) = server.await {
                return Err(error).context("the health/metrics server failed");
            }
        }
        if let Ok(Err(error)) = source.await {
            return Err(error).context("the cluster source stopped");
        }
        result?;
        // The links stay pinned: the datapath keeps working while no agent runs.
        info!("stopped; programs stay attached (`socklb cleanup` removes them)");
        Ok(())
    })
}

fn external_traffic(args: &ExternalArgs) -> ExternalTraffic {
    if let Some(ephemeral) = dataplane::ephemeral_ports()
        && ephemeral.start() <= args.snat_port_range.end()
        && args.snat_port_range.start() <= ephemeral.end()
    {
        warn!(
            snat_port_range = ?args.snat_port_range,
            ip_local_port_range = ?ephemeral,
            "the SNAT port range overlaps the kernel's ephemeral ports: a node-local \
             connection to a backend may collide with a SNATed flow; change \
             --snat-port-range or net.ipv4.ip_local_port_range"
        );
    }
    ExternalTraffic {
        devices: args.devices.clone(),
        mode: args.tc_attach_mode,
        snat_ports: args.snat_port_range.clone(),
        conntrack_timeouts: dataplane::ConntrackTimeouts {
            tcp_syn: args.conntrack_tcp_timeout_syn,
            tcp_established: args.conntrack_tcp_timeout_established,
            tcp_close: args.conntrack_tcp_timeout_close,
            udp: args.conntrack_udp_timeout,
        },
    }
}

/// SIGTERM (how Kubernetes stops a pod) or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the agent runs until killed.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
}

fn explain_command(args: &ExplainArgs) -> anyhow::Result<()> {
    let node_name = node_name(&args.source)?;
    let only = args
        .service
        .as_deref()
        .map(|text| match text.split_once('/') {
            Some((namespace, name)) => Ok(ServiceName {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            None => bail!("--service takes namespace/name, not {text}"),
        })
        .transpose()?;
    let state = runtime()?.block_on(initial_state(&args.source, &node_name))?;
    let explanation = explain::explain(&state, only.as_ref());
    match args.output {
        Output::Table => stdout::print(&explain::table(&explanation))?,
        Output::Json => stdout::println(&serde_json::to_string_pretty(&explanation)?)?,
    }
    Ok(())
}

/// The cluster as the source first lists it (every kind once).
async fn initial_state(args: &SourceArgs, node_name: &str) -> anyhow::Result<ClusterState> {
    let (mut events, source) = start_source(args, node_name).await?;
    let mut state = ClusterState::new(node_name);
    let mut listed = std::collections::HashSet::new();
    let wait = async {
        while listed.len() < 3 {
            let Some(event) = events.recv().await else {
                break;
            };
            if let Event::Reset(kind, _) = &event {
                listed.insert(*kind);
            }
            state.apply(event);
        }
    };
    let timed_out = tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .is_err();
    source.abort();
    if timed_out {
        bail!("the cluster source did not list Services, EndpointSlices and Nodes within 30 s");
    }
    let missing: Vec<Kind> = [Kind::Service, Kind::EndpointSlice, Kind::Node]
        .into_iter()
        .filter(|kind| !listed.contains(kind))
        .collect();
    if !missing.is_empty() {
        bail!("the cluster source stopped before listing {missing:?}");
    }
    Ok(state)
}

/// Puts the missing privilege first when the kernel refused for lack of one (the datapath
/// does the same for `run`).
fn privilege_first(error: anyhow::Error) -> anyhow::Error {
    match dataplane::diagnose(error.as_ref()) {
        Some(diagnosis) => error.context(diagnosis),
        None => error,
    }
}

fn inspect_command(args: &InspectArgs) -> anyhow::Result<()> {
    let mut inspection = inspect::inspect(&args.pins.pin_dir, args.address)?;
    if let Some(service) = &args.service {
        inspection = inspect::only_service(inspection, service);
    }
    match args.output {
        Output::Table => stdout::print(&inspect::table(&inspection))?,
        Output::Json => stdout::println(&serde_json::to_string_pretty(&inspection)?)?,
    }
    Ok(())
}

fn trace_command(args: &TraceArgs) -> anyhow::Result<()> {
    let service = match &args.service {
        Some(service) => Some(
            service
                .split_once('/')
                .map(|(namespace, name)| (namespace.to_owned(), name.to_owned()))
                .with_context(|| format!("--service {service}: expected NAMESPACE/NAME"))?,
        ),
        None => None,
    };
    let options = trace::session::Options {
        pin_dir: args.pins.pin_dir.clone(),
        filters: trace::session::Filters {
            service,
            frontend: args.frontend,
            backend: args.backend,
            reverse: args.reverse,
            packets: args.packets,
        },
        json: args.output == Output::Json,
        count: args.count,
        duration: args.duration.map(Into::into),
    };
    // Ctrl-C, SIGTERM, or the reader of a pipe gone (`socklb trace | grep`, grep stopped):
    // each ends the session, which gives its lease back before returning.
    let summary = runtime()?.block_on(async {
        let stop = async {
            use tokio::signal::unix::{SignalKind, signal};
            let terminate = async {
                match signal(SignalKind::terminate()) {
                    Ok(mut terminate) => {
                        terminate.recv().await;
                    }
                    Err(_) => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                () = terminate => {}
                () = stdout::reader_gone() => {}
            }
        };
        trace::session::run(&options, std::io::stdout().lock(), stop).await
    })?;
    stdout::note(&format!(
        "{} events shown, {} lost (ring buffer full)",
        summary.shown, summary.lost
    ));
    if summary.reader_gone || stdout::reader_gone_now() {
        return Err(stdout::StdoutError::ReaderGone.into());
    }
    Ok(())
}

fn cleanup(args: &PinArgs) -> anyhow::Result<()> {
    let cleanup = dataplane::cleanup(&args.pin_dir)
        .with_context(|| format!("cleaning up {}", args.pin_dir.display()))?;
    let mut text = String::new();
    if cleanup.removed.is_empty() {
        text = format!("nothing to remove under {}\n", args.pin_dir.display());
    }
    for path in &cleanup.removed {
        text.push_str(&format!("removed {}\n", path.display()));
    }
    stdout::print(&text)?;
    Ok(())
}
