//! The `socklb` commands: what each subcommand does with the flags `args` parsed.
mod args;
mod checks;

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use anyhow::{Context as _, anyhow, bail};
use clap::{CommandFactory as _, FromArgMatches as _};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

pub use self::args::*;
use crate::{
    conntrack_gc,
    dataplane::{self, Capacities, Config, Dataplane, ProgramLoad},
    explain, inspect,
    metrics::Metrics,
    runner::{ExternalTraffic, Runner, SyncPeriods},
    server::{self, Health},
    shutdown::Shutdown,
    source::{
        Event, Kind,
        file::FileSource,
        kube::{self, KubeSource},
    },
    state::ClusterState,
    stdout,
    sweep::Sweeper,
    trace,
};

/// Logs to stderr; `RUST_LOG` filters, else `info` for the agent and `warn` for the
/// one-shot commands (whose output is on stdout). kube's client logs every failed request
/// as an error, dozens a second while the API server is out of reach: the source's own
/// warnings say the same, with the cause, at most once a minute per feed.
pub fn init_tracing(cli: &Cli) {
    let default = match cli.command {
        Command::Run(_) => "info,kube_client::client::builder=off",
        _ => "warn,kube_client::client::builder=off",
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
            "socklb {} (map layout {})",
            env!("CARGO_PKG_VERSION"),
            map_layout()
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
    // The subcommand list names pages of their own (`socklb-run(8)`): they are sections of
    // this page, titled `SOCKLB RUN`.
    let names = command.get_subcommands().map(|sub| sub.get_name());
    // clap's own `help` is listed too.
    for name in names.chain(["help"]) {
        page = page.replace(&format!("socklb\\-{name}(8)"), &format!("socklb {name}"));
    }
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

/// `count` events, in words.
fn events(count: usize) -> String {
    match count {
        1 => "1 event".to_owned(),
        count => format!("{count} events"),
    }
}

/// A short fingerprint of the pinned maps' names, each with its layout's `_vN`: two builds
/// that print the same one use the same maps, so that one takes over the other's pins.
fn map_layout() -> String {
    let names = socklb_abi::map_names::ALL.join(" ");
    format!("{:08x}", xxhash_rust::xxh3::xxh3_64(names.as_bytes()) >> 32)
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
        // `run` checked it before anything started (`checks`); `explain` is told here.
        return checks::node_name(name).map_err(|problem| anyhow!("--node-name: {problem}"));
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("no --node-name or NODE_NAME, and the hostname cannot be read")?;
    checks::node_name(&hostname).map_err(|problem| {
        anyhow!(
            "the hostname {:?} is not a Node name, so --node-name is needed: {problem}",
            hostname.trim()
        )
    })
}

/// The configured source, ready to start: its directory checked, or its API client made
/// (from the kubeconfig or the in-cluster config), before anything is pinned.
enum Source {
    File(PathBuf),
    Kube(::kube::Client),
}

impl Source {
    async fn prepare(args: &SourceArgs) -> anyhow::Result<Self> {
        Ok(match args.source {
            SourceKind::File => {
                let Some(dir) = args.manifests.clone() else {
                    bail!("--source file needs --manifests DIR");
                };
                if !dir.is_dir() {
                    bail!("--manifests {}: not a directory", dir.display());
                }
                Self::File(dir)
            }
            SourceKind::Kube => Self::Kube(kube::client(args.kubeconfig.as_deref()).await?),
        })
    }

    /// Starts the source; its events arrive on the returned channel.
    fn start(
        self,
        node_name: &str,
        api_retry_max: Duration,
    ) -> (
        mpsc::Receiver<Event>,
        tokio::task::JoinHandle<anyhow::Result<()>>,
    ) {
        let (events, receiver) = mpsc::channel(4096);
        let task = match self {
            Self::File(dir) => {
                tokio::spawn(async move { Ok(FileSource::new(dir).run(events).await?) })
            }
            Self::Kube(client) => {
                let source =
                    KubeSource::new(client, node_name.to_owned()).with_retry_max(api_retry_max);
                tokio::spawn(async move { Ok(source.run(events).await?) })
            }
        };
        (receiver, task)
    }
}

fn run(args: &RunArgs) -> anyhow::Result<()> {
    // Before anything is created: a bad flag leaves the node as it was.
    checks::check(args)?;
    let node_name = node_name(&args.source)?;
    // Before anything is created: a device the programs cannot serve fails the start.
    dataplane::check_devices(&args.external.devices)
        .context("--devices names a device socklb cannot serve: remove it from --devices")?;
    // From here a SIGTERM ends the start at its next step (the lock's wait, before the
    // load, or the run, which then returns): never with a pin directory half made.
    let runtime = runtime()?;
    let shutdown = {
        let _runtime = runtime.enter();
        Shutdown::install()
    };
    let listeners = [
        server::bind(args.healthz_bind_address, "--healthz-bind-address")?,
        server::bind(args.metrics_bind_address, "--metrics-bind-address")?,
    ];
    // One writer per pin directory, held until the process exits.
    let pin_dir = &args.pins.pin_dir;
    let pin_dir_existed = pin_dir.exists();
    dataplane::prepare_pin_dir(pin_dir)?;
    let _pin_lock = match dataplane::lock_pin_dir(pin_dir, args.handover_wait, &|| shutdown.asked())
    {
        Err(dataplane::PinLockError::Stopped) => {
            // The directory is the other agent's (it may have made it meanwhile).
            info!("stopped while waiting for the other agent to exit; nothing was changed");
            return Ok(());
        }
        lock => lock?,
    };
    // After the host's checks (bpffs above, cgroup v2 at the load), before anything is
    // pinned: a source that cannot start leaves the node as it was.
    let source = runtime
        .block_on(Source::prepare(&args.source))
        .inspect_err(|_| remove_pin_dir_left_empty(pin_dir, pin_dir_existed))?;
    if shutdown.asked() {
        remove_pin_dir_left_empty(pin_dir, pin_dir_existed);
        info!("stopped before loading the programs; nothing was changed");
        return Ok(());
    }
    let socket_lb_scope = effective_scope(args.socket_lb_scope);
    let mut dataplane = Dataplane::load(Config {
        pin_dir: pin_dir.clone(),
        cgroup: args.cgroup_path.clone(),
        capacities: Capacities::from(&args.capacities),
        maglev_table_size: args.external.maglev_table_size,
        program_log_level: args.bpf_log_level,
        record_tcp: args.destroy_tcp_on_backend_removal,
        socket_lb_netns: match socket_lb_scope {
            SocketLbScope::All => None,
            SocketLbScope::Host | SocketLbScope::Pods => Some(dataplane::netns_cookie()?),
        },
        socket_lb_listed: socket_lb_scope == SocketLbScope::Pods,
        cluster_ips_from_outside: args.external.cluster_ips_from_outside,
        pod_delivery: args.pod_delivery,
        program_load: ProgramLoad::WhenSized,
    })
    .inspect_err(|_| remove_pin_dir_left_empty(pin_dir, pin_dir_existed))?;
    let program_logs = dataplane.program_logs()?;
    let source_kind = clap::ValueEnum::to_possible_value(&args.source.source)
        .map_or_else(String::new, |value| value.get_name().to_owned());
    info!(
        node = %node_name,
        source = %source_kind,
        %socket_lb_scope,
        pod_delivery = %args.pod_delivery,
        "starting"
    );
    runtime.block_on(async {
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
        let routers = [
            ("health", server::health_router(health.clone())),
            ("metrics", server::metrics_router(metrics.clone())),
        ];
        let mut servers = Vec::new();
        for (listener, router) in listeners.into_iter().zip(routers) {
            let shutdown = stopped();
            servers.push(tokio::spawn(async move {
                server::serve(listener, router, shutdown).await
            }));
        }

        let (events, source) = source.start(&node_name, args.source.api_retry_max);
        let conntrack_gc = tokio::spawn(conntrack_gc::run(
            pin_dir.clone(),
            args.external.conntrack_gc_interval,
            metrics.clone(),
            stopped(),
        ));
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
                resync: args.sync_period,
                full: args.full_sync_period,
            },
            health,
            metrics,
        )
        .with_external(external_traffic(&args.external))
        .with_pod_devices(args.pod_devices.clone())
        .with_sweeper(sweeper);
        let runner = if socket_lb_scope == SocketLbScope::Pods {
            runner.with_pod_namespaces()
        } else {
            runner
        };
        let result = runner
            .run(events, shutdown.wait())
            .await
            // A failed first sync unpinned its maps (`Dataplane::apply_first`).
            .inspect_err(|_| remove_pin_dir_left_empty(pin_dir, pin_dir_existed));
        let _ = stop_tx.send(true);
        source.abort();
        let _ = conntrack_gc.await;
        for server in servers {
            if let Ok(Err(error)) = server.await {
                return Err(error).context("the health/metrics server failed");
            }
        }
        if let Ok(Err(error)) = source.await {
            return Err(error).context("the cluster source stopped");
        }
        if result? {
            // The links stay pinned: the datapath keeps working while no agent runs.
            info!("stopped; programs stay attached (`socklb cleanup` removes them)");
        } else if pin_dir_existed {
            info!(
                "stopped before the first full sync: this run attached nothing (what an \
                 earlier agent attached stays; `socklb cleanup` removes it)"
            );
        } else {
            // A bare node: the maps pinned at load are this run's, and no program read them.
            dataplane::unpin_maps(pin_dir);
            remove_pin_dir_left_empty(pin_dir, pin_dir_existed);
            info!(
                "stopped before the first full sync: this run attached nothing and unpinned \
                 the maps it made"
            );
        }
        Ok(())
    })
}

/// A failed start leaves nothing behind: the loader unpinned its maps, and a pin directory
/// this start made goes with its lock if nothing else is in it.
fn remove_pin_dir_left_empty(pin_dir: &std::path::Path, pin_dir_existed: bool) {
    if !pin_dir_existed
        && std::fs::read_dir(pin_dir).is_ok_and(|entries| {
            entries
                .flatten()
                .all(|entry| entry.path() == dataplane::pin_lock_path(pin_dir))
        })
    {
        let _ = std::fs::remove_dir(dataplane::pin_lock_path(pin_dir));
        let _ = std::fs::remove_dir(pin_dir);
    }
}

/// `pods` needs setns(2) into the pods' namespaces to learn their cookies: without
/// CAP_SYS_ADMIN it cannot tell a pod's namespace from a nested one, and serves every
/// namespace's sockets, as before there was a choice.
fn effective_scope(scope: SocketLbScope) -> SocketLbScope {
    use caps::{CapSet, Capability, has_cap};
    if scope == SocketLbScope::Pods
        && !has_cap(None, CapSet::Effective, Capability::CAP_SYS_ADMIN).unwrap_or(false)
    {
        warn!(
            "--socket-lb-scope pods needs CAP_SYS_ADMIN to enter the pods' network namespaces \
             (the chart's closeSocketsInPods grants it): the socket hooks serve every \
             namespace (as `all`), nested ones included"
        );
        return SocketLbScope::All;
    }
    scope
}

fn external_traffic(args: &ExternalArgs) -> ExternalTraffic {
    if let Some(ephemeral) = dataplane::ephemeral_ports()
        && ephemeral.start() <= args.snat_port_range.end()
        && args.snat_port_range.start() <= ephemeral.end()
    {
        warn!(
            snat_port_range = %format!(
                "{}-{}",
                args.snat_port_range.start(),
                args.snat_port_range.end()
            ),
            ip_local_port_range = %format!("{}-{}", ephemeral.start(), ephemeral.end()),
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

fn explain_command(args: &ExplainArgs) -> anyhow::Result<()> {
    let node_name = node_name(&args.source)?;
    let state = runtime()?.block_on(initial_state(&args.source, &node_name))?;
    let only = explain::Only {
        service: args.service.as_ref(),
        pod: args.pod.as_deref(),
    };
    let explanation = explain::explain(&state, args.socket_lb_scope, &only);
    if let Some(service) = &args.service
        && explanation.services.is_empty()
        && explanation.skipped.is_empty()
    {
        let read = match (&args.source.source, &args.source.manifests) {
            (SourceKind::File, Some(manifests)) => {
                format!("in the manifests under {}", manifests.display())
            }
            _ => "from the API server, which lists no headless Service, nor one another \
                  proxy serves"
                .to_owned(),
        };
        bail!("--service {service}: no such Service among those socklb reads ({read})");
    }
    if let Some(pod) = &args.pod
        && explanation.pods.is_empty()
    {
        bail!("--pod {pod}: no such pod on node {node_name}");
    }
    match args.output {
        Output::Table => stdout::print(&explain::table(&explanation))?,
        Output::Json => stdout::println(&serde_json::to_string_pretty(&explanation)?)?,
    }
    Ok(())
}

/// The cluster as the source first lists it (every kind once: this node's pods and the
/// Namespaces too).
async fn initial_state(args: &SourceArgs, node_name: &str) -> anyhow::Result<ClusterState> {
    let (mut events, source) = Source::prepare(args)
        .await?
        .start(node_name, args.api_retry_max);
    let mut state = ClusterState::new(node_name);
    let mut listed = std::collections::HashSet::new();
    let wait = async {
        while listed.len() < Kind::ALL.len() {
            let Some(event) = events.recv().await else {
                break;
            };
            if let Some(kind) = event.listed() {
                listed.insert(kind);
            }
            state.apply(event);
        }
    };
    let timed_out = tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .is_err();
    source.abort();
    if timed_out {
        bail!(
            "the cluster source did not list Services, EndpointSlices, Nodes, this node's Pods \
             and Namespaces within 30 s"
        );
    }
    let missing: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|kind| !listed.contains(kind))
        .collect();
    if !missing.is_empty() {
        bail!(
            "the cluster source stopped before listing {}",
            crate::listed(missing.iter().map(|kind| format!("{kind:?}s")))
        );
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
    let mut note = String::new();
    if let Some(service) = &args.service {
        inspection = inspect::only_service(inspection, service);
        if inspection.frontends.is_empty() {
            let on = args
                .address
                .map(|address| format!(" on {address}"))
                .unwrap_or_default();
            note = format!(
                "no frontend of {service} is programmed{on} (`socklb explain --service \
                 {service}` says why)\n"
            );
        }
    }
    match args.output {
        Output::Table => stdout::print(&(inspect::table(&inspection) + &note))?,
        Output::Json => stdout::println(&serde_json::to_string_pretty(&inspection)?)?,
    }
    Ok(())
}

fn trace_command(args: &TraceArgs) -> anyhow::Result<()> {
    let service = args
        .service
        .as_ref()
        .map(|service| (service.namespace.clone(), service.name.clone()));
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
    let runtime = runtime()?;
    let shutdown = {
        let _runtime = runtime.enter();
        Shutdown::install()
    };
    let summary = runtime.block_on(async {
        let stop = async {
            tokio::select! {
                () = shutdown.wait() => {}
                () = stdout::reader_gone() => {}
            }
        };
        trace::session::run(&options, std::io::stdout().lock(), stop).await
    })?;
    stdout::note(&format!(
        "{} shown; {} lost to a full ring buffer",
        events(summary.shown),
        summary.lost
    ));
    if summary.reader_gone || stdout::reader_gone_now() {
        return Err(stdout::StdoutError::ReaderGone.into());
    }
    Ok(())
}

fn cleanup(args: &CleanupArgs) -> anyhow::Result<()> {
    let pin_dir = &args.pins.pin_dir;
    let running = if args.force {
        dataplane::RunningAgent::Ignore
    } else {
        dataplane::RunningAgent::Refuse
    };
    let cleanup = dataplane::cleanup_with(pin_dir, running)
        .with_context(|| format!("cleaning up {}", pin_dir.display()))?;
    let mut text = String::new();
    if cleanup.removed.is_empty() {
        text = if pin_dir.exists() {
            format!("nothing to remove under {}\n", pin_dir.display())
        } else {
            // A mistyped directory must not read as a node cleaned up.
            format!(
                "nothing to remove: there is no {} (an agent pins where its --bpffs says; the \
                 default is {})\n",
                pin_dir.display(),
                dataplane::DEFAULT_PIN_DIR
            )
        };
    }
    for path in &cleanup.removed {
        text.push_str(&format!("removed {}\n", path.display()));
    }
    if !cleanup.removed.is_empty() {
        text.push_str(&format!(
            "{} removed: socklb no longer translates Services on this node (kube-proxy's \
             rules, if any, were not touched)\n",
            cleanup.removed.len()
        ));
    }
    stdout::print(&text)?;
    Ok(())
}
