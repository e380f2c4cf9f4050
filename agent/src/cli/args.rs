//! The `socklb` command line as clap parses it: every subcommand and its flags, with
//! their defaults and help. What the commands do with them is `cli`'s.
use std::{net::SocketAddr, ops::RangeInclusive, path::PathBuf, time::Duration};

use clap::{Arg, ArgAction, Args, Parser, Subcommand, ValueEnum};

use crate::{
    conntrack_gc::GcInterval,
    dataplane::{self, Capacities, ProgramLogLevel, TcMode},
    select::ServiceName,
    sweep::Requested,
};

/// A `--pod` value: NAMESPACE/NAME, as [`service_name`].
fn namespaced(text: &str) -> Result<String, String> {
    service_name(text).map(|_| text.to_owned())
}

/// A `--frontend` value: `ADDRESS:PORT`, `[IPV6]:PORT`, or an address alone (port 0: any).
fn frontend_address(text: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>()
        .or_else(|_| {
            text.parse::<std::net::IpAddr>()
                .map(|ip| SocketAddr::new(ip, 0))
        })
        .map_err(|_| {
            "expected ADDRESS:PORT, [IPV6]:PORT or an address, such as 10.96.0.10:80".to_owned()
        })
}

/// The longest `trace --duration`: a week (a trace without `--duration` runs until
/// stopped). Its end is a deadline on the clock, which a value of years would overflow.
const TRACE_DURATION_MAX: Duration = Duration::from_secs(7 * 24 * 3600);

/// A `trace --duration`: longer than zero, at most [`TRACE_DURATION_MAX`].
fn trace_duration(text: &str) -> Result<humantime::Duration, String> {
    match text.parse::<humantime::Duration>() {
        Ok(duration) if duration.is_zero() => {
            Err("0s would end at once: give a longer one, e.g. 30s".to_owned())
        }
        Ok(duration) if *duration > TRACE_DURATION_MAX => Err(format!(
            "give at most {}, or leave --duration out to trace until stopped",
            humantime::format_duration(TRACE_DURATION_MAX)
        )),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

/// A count that must be at least 1.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("0 would end at once: give at least 1".to_owned()),
        Ok(count) => Ok(count),
        Err(error) => Err(error.to_string()),
    }
}

/// A `--service` value: NAMESPACE/NAME, both parts given.
fn service_name(text: &str) -> Result<ServiceName, String> {
    match text.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => Ok(ServiceName {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }),
        _ => Err("expected NAMESPACE/NAME, such as default/web".to_owned()),
    }
}

/// `#[arg(chart_switch())]`: a `bool` flag that is off unless given, alone or as `=true`, and
/// also takes `=false`, the form the chart writes for a value.
trait ChartSwitch {
    fn chart_switch(self) -> Self;
}

impl ChartSwitch for Arg {
    fn chart_switch(self) -> Self {
        self.action(ArgAction::Set)
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true")
            .default_value("false")
    }
}

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
    // A flag given again overrides the earlier one, as kube-proxy's flags do: the chart's
    // `extraArgs` come after its own flags.
    #[command(args_override_self = true)]
    Run(Box<RunArgs>),
    /// Show, for every Service frontend, the backends this node uses and why.
    Explain(ExplainArgs),
    /// Show what the pinned maps hold (works while the agent is down).
    Inspect(InspectArgs),
    /// Show each translation as it happens: which backend, and why.
    Trace(TraceArgs),
    /// Detach the programs and remove every pin socklb created.
    ///
    /// The node then translates no Service: run it once kube-proxy (or another dataplane)
    /// serves the node again, or when socklb leaves for good. Nothing socklb did not create
    /// is touched: kube-proxy's rules and other programs' pins and links stay. Refused while
    /// an agent runs on the pin directory: stop it first (`--force` from inside its pod).
    Cleanup(CleanupArgs),
    /// Print the version and the map layout: a fingerprint of the pinned maps' names and
    /// their layouts' versions (two builds that print the same one share the maps as they
    /// are; otherwise the newer one carries the older's entries over).
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
    MetricsNames,
}

pub use crate::select::socket_path::Scope as SocketLbScope;

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
    /// Directory of Service, EndpointSlice, Node, Pod and Namespace manifests (with --source
    /// file), in .yaml, .yml or .json files; JSON is read about six times faster.
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
    #[arg(long = "bpffs", alias = "pin-dir", env = "SOCKLB_BPFFS", default_value = dataplane::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    /// Also while an agent runs on the pin directory (from inside its pod): the node stops
    /// translating at once, and that agent keeps running over nothing until it is stopped.
    #[arg(long)]
    pub force: bool,
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
    /// Time between resyncs: each reads back a part of the service and backend entries the
    /// agent wrote (20,000) and writes back what was deleted or changed behind its back, and
    /// walks through 40,000 more for entries it did not write, which the next sync deletes.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub sync_period: Duration,
    /// Time between full resyncs, which select every Service's backends again and program
    /// what differs from what was written (as kube-proxy's hourly full sync).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub full_sync_period: Duration,
    /// How long to wait for another agent holding the pin directory to exit (the handover of
    /// a rolling update) before giving up.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub handover_wait: Duration,
    /// Address for /healthz, /livez and /readyz (kube-proxy's health port).
    #[arg(long, default_value = "0.0.0.0:10256", value_parser = parse_bind_address)]
    pub healthz_bind_address: SocketAddr,
    /// Address for /metrics (kube-proxy's metrics port).
    #[arg(long, default_value = "127.0.0.1:10249", value_parser = parse_bind_address)]
    pub metrics_bind_address: SocketAddr,
    /// The kernel programs' own log lines (their rare failure paths, at warn) forwarded
    /// into this log. Off costs nothing: the verifier removes the log calls at load.
    #[arg(long, value_enum, default_value_t = ProgramLogLevel::Off)]
    pub bpf_log_level: ProgramLogLevel,
    /// Also close the TCP connections still open to a backend that left its Service
    /// (connected UDP sockets are always closed). Off by default: kube-proxy lets TCP
    /// connections drain. Given alone, or as =true / =false (the chart's form).
    #[arg(long, chart_switch())]
    pub destroy_tcp_on_backend_removal: bool,
    /// Which sockets the socket hooks translate at connect() and sendmsg(): `pods` (the
    /// host's network namespace, where the agent runs, and the pods' namespaces the node's
    /// runtime pinned under /run/netns or /var/run/netns, but those of pods the per-packet
    /// path serves instead: an Istio or Linkerd sidecar, or the annotation
    /// `socklb.io/socket-lb: "off"` (or a Namespace labelled so), on a device that carries
    /// its program; not namespaces made inside a pod, such as a nested cluster's), `host`
    /// (the host's only: pods keep the Service address, as Cilium's hostNamespaceOnly, for
    /// meshes that route by the original destination), or `all` (every namespace). What the
    /// hooks leave alone is served per packet on the pod's device (`--pod-devices`).
    #[arg(long, value_enum, default_value_t = SocketLbScope::Pods)]
    pub socket_lb_scope: SocketLbScope,
    /// Devices of workloads whose packets to internal frontends (ClusterIPs, and the
    /// node's NodePorts) are translated per packet, for what the socket hooks leave alone
    /// (VMs, sandboxes, meshed pods, processes outside the cgroup): `auto` (every veth
    /// whose peer is in another network namespace, as every veth CNI gives its pods),
    /// `none`, or names, comma-separated, each exact or a prefix ending in `*` (`cali*`),
    /// with `auto` among them to add what it finds (`auto,tap0`).
    #[arg(long, default_value = "auto")]
    pub pod_devices: dataplane::PodDevices,
    /// How a pod's packets the per-packet path translated to a backend on this node go on:
    /// `kernel` (handed back to the node's routing and netfilter, which see the flow as
    /// from the client to the backend, as under kube-proxy: its conntrack, an iptables
    /// NetworkPolicy) or `direct` (redirected to the backend's device, and its answers to
    /// the client's, past them: faster, for nodes where no NetworkPolicy is enforced
    /// between pods). Flows to other nodes take the kernel's path either way.
    #[arg(long, value_enum, default_value_t = dataplane::PodDelivery::Kernel)]
    pub pod_delivery: dataplane::PodDelivery,
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
    /// Idle time after which a TCP flow the TC programs translate (from outside, or a pod's
    /// on the per-packet path) whose handshake did not complete (a SYN, or a SYN and its
    /// SYN-ACK) is forgotten and its SNAT port reused.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub conntrack_tcp_timeout_syn: Duration,
    /// Idle time after which an established TCP flow the TC programs translate is
    /// forgotten.
    #[arg(long, default_value = "6h", value_parser = humantime::parse_duration)]
    pub conntrack_tcp_timeout_established: Duration,
    /// Idle time after which a TCP flow the TC programs translate that saw a FIN or RST is
    /// forgotten.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub conntrack_tcp_timeout_close: Duration,
    /// Idle time after which a UDP flow the TC programs translate is forgotten.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub conntrack_udp_timeout: Duration,
    /// How often the agent removes conntrack entries past their timeout: auto (every
    /// shortest timeout, between 1s and 60s), a duration of at least 1s, or off (an expired
    /// entry then goes only when a packet of its flow comes or the table needs room).
    #[arg(long, default_value_t = GcInterval::Auto)]
    pub conntrack_gc_interval: GcInterval,
    /// Translate packets from outside the node to ClusterIPs too (clients routed to the
    /// Service CIDR: a BGP-advertised or static route to the node), as kube-proxy does;
    /// their flows are SNATed to the node like a NodePort's. Off by default, as in Cilium
    /// (bpf-lb-external-clusterip): a ClusterIP is then reachable from inside only.
    #[arg(long, chart_switch())]
    pub cluster_ips_from_outside: bool,
}

fn parse_maglev_size(text: &str) -> Result<u32, String> {
    let sizes = dataplane::MAGLEV_TABLE_SIZES;
    text.parse::<u32>()
        .ok()
        .filter(|size| sizes.contains(size))
        .ok_or_else(|| format!("{text:?} is not one of the prime table sizes {sizes:?}"))
}

/// An address to listen on: `IP:PORT`, or `[IPv6]:PORT`. A host name is not resolved (which
/// address it meant would depend on the node's resolver at the agent's start).
fn parse_bind_address(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| {
        let example = match text.rsplit_once(':') {
            Some((_, port)) if port.parse::<u16>().is_ok() => port,
            _ => "10256",
        };
        format!(
            "{text:?} is not IP:PORT: give an IP address and a port, such as 0.0.0.0:{example} \
             or [::]:{example} (a host name is not resolved)"
        )
    })
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

/// Each flag reads a negative value as its value, refused as one that is not a count,
/// rather than as an unknown flag.
#[derive(Debug, Args)]
pub struct CapacityArgs {
    /// Service map entries of each family: one per frontend plus one per backend of each
    /// frontend. An upper bound: each family's map starts smaller and grows by itself with
    /// that family's frontends (the names map with all frontends, up to this bound too).
    #[arg(long, allow_negative_numbers = true, default_value_t = Capacities::default().service_entries)]
    pub max_service_entries: u32,
    /// Distinct backends (address, port, protocol) of each family. An upper bound: each
    /// family's map starts smaller and grows by itself with that family's backends.
    #[arg(long, allow_negative_numbers = true, default_value_t = Capacities::default().backends)]
    pub max_backends: u32,
    /// Translated sockets whose peer getpeername() and recvmsg() show as the frontend:
    /// slots of the connected-socket ring (rounded up to a power of two; a socket's slot is
    /// taken over by the translated socket whose cookie is this much larger, after at most
    /// this many socket cookies handed out on the node) and LRU entries for the datagrams
    /// of unconnected UDP sockets.
    #[arg(long, allow_negative_numbers = true, default_value_t = Capacities::default().reverse)]
    pub max_reverse_entries: u32,
    /// Session-affinity entries (LRU).
    #[arg(long, allow_negative_numbers = true, default_value_t = Capacities::default().affinity)]
    pub max_affinity_entries: u32,
    /// Conntrack entries for traffic from outside the node and of the per-packet path
    /// (meshed pods, VMs), two per flow (LRU): flows confirmed (TCP past its handshake,
    /// UDP answered and continued).
    #[arg(long, allow_negative_numbers = true, default_value_t = Capacities::default().conntrack)]
    pub max_conntrack_entries: u32,
    /// Conntrack entries of flows from outside not yet confirmed, two per flow (LRU): a SYN
    /// flood fills this table and never evicts a confirmed flow.
    #[arg(long, allow_negative_numbers = true, default_value_t = Capacities::default().conntrack_new)]
    pub max_conntrack_new_entries: u32,
    /// loadBalancerSourceRanges entries: one per range plus one per restricted frontend.
    #[arg(long, allow_negative_numbers = true, default_value_t = Capacities::default().source_ranges)]
    pub max_source_ranges: u32,
    /// Maglev table entries: --maglev-table-size for each Service using Maglev. An upper
    /// bound: the map starts smaller and grows by itself.
    #[arg(long, allow_negative_numbers = true, default_value_t = Capacities::default().maglev_entries)]
    pub max_maglev_entries: u32,
    /// Sockets holding a record of what they were translated for, which the sweep uses to
    /// close them when their backend leaves: connected UDP sockets, and TCP sockets with
    /// --destroy-tcp-on-backend-removal. The kernel charges records to the agent's memory
    /// (about 400 bytes each: 24 MiB at the default); past the bound a socket is still translated, and the sweep
    /// finds it through the socket ring only (docs/operations.md, "Sockets of removed
    /// backends").
    #[arg(long, allow_negative_numbers = true, default_value_t = Capacities::default().socket_records)]
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
    #[arg(long, value_parser = service_name)]
    pub service: Option<ServiceName>,
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub pins: PinArgs,
    /// Only the frontends of this Service, NAMESPACE/NAME.
    #[arg(long, value_parser = service_name)]
    pub service: Option<ServiceName>,
    /// Only this frontend, ADDRESS:PORT or [IPV6]:PORT; an ADDRESS alone (or port 0): any
    /// port of the address.
    // A help text: `[IPV6]` is literal, not a link.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long, value_parser = frontend_address)]
    pub frontend: Option<std::net::SocketAddr>,
    /// Only translations to this backend address (IPv4 or IPv6).
    #[arg(long)]
    pub backend: Option<std::net::IpAddr>,
    /// Also recvmsg() and getpeername() answers shown as the frontend.
    #[arg(long)]
    pub reverse: bool,
    /// Also every packet of known flows the TC programs translate (conntrack hits: from
    /// outside, and pods' on the per-packet path), not only new flows.
    #[arg(long)]
    pub packets: bool,
    /// Stop after this many events (at least 1).
    #[arg(long, value_parser = at_least_one)]
    pub count: Option<usize>,
    /// Stop after this long (e.g. `30s`).
    #[arg(long, value_parser = trace_duration)]
    pub duration: Option<humantime::Duration>,
    /// `table`: one line per event; `json`: one JSON object per line.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Only this Service, NAMESPACE/NAME.
    #[arg(long, value_parser = service_name)]
    pub service: Option<ServiceName>,
    /// Only this pod of the node, NAMESPACE/NAME, in the list of which path serves each.
    #[arg(long, value_parser = namespaced)]
    pub pod: Option<String>,
    /// The agent's `--socket-lb-scope`: which path serves each pod depends on it.
    #[arg(long, value_enum, default_value_t = SocketLbScope::Pods)]
    pub socket_lb_scope: SocketLbScope,
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::{Cli, Command, RunArgs};

    #[test]
    fn names_and_counts_are_checked_alike_by_every_subcommand() {
        let parses = |args: &[&str]| Cli::try_parse_from(["socklb"].iter().chain(args)).is_ok();
        for command in ["explain", "inspect", "trace"] {
            assert!(parses(&[command, "--service", "default/web"]), "{command}");
            for bad in ["web", "default/", "/web"] {
                assert!(!parses(&[command, "--service", bad]), "{command} {bad}");
            }
        }
        assert!(!parses(&["explain", "--pod", "client"]));
        assert!(parses(&["trace", "--count", "1"]));
        assert!(!parses(&["trace", "--count", "0"]));
        assert!(parses(&["trace", "--duration", "1s"]));
        assert!(!parses(&["trace", "--duration", "0s"]));
        assert!(parses(&["trace", "--duration", "7days"]));
        assert!(!parses(&["trace", "--duration", "8days"]));
        assert!(!parses(&["trace", "--duration", "10000000000000000000s"]));
        for frontend in ["10.96.0.10:80", "10.96.0.10", "[fd00::10]:53", "fd00::10"] {
            assert!(parses(&["trace", "--frontend", frontend]), "{frontend}");
        }
        assert!(!parses(&["trace", "--frontend", "10.96.0.300"]));
    }

    fn run(args: &[&str]) -> Result<Box<RunArgs>, clap::Error> {
        let cli = Cli::try_parse_from(["socklb", "run"].iter().chain(args))?;
        match cli.command {
            Command::Run(run) => Ok(run),
            _ => panic!("`socklb run` parsed as another command"),
        }
    }

    #[test]
    fn a_bind_address_is_ip_and_port() {
        let bind = |address: &str| {
            run(&["--healthz-bind-address", address])
                .map(|run| run.healthz_bind_address.to_string())
                .map_err(|error| error.to_string())
        };
        assert_eq!(bind("[::]:10256").as_deref(), Ok("[::]:10256"));
        assert_eq!(bind("127.0.0.1:9").as_deref(), Ok("127.0.0.1:9"));
        for (address, says) in [
            ("localhost:19356", "such as 0.0.0.0:19356 or [::]:19356"),
            ("127.0.0.1", "such as 0.0.0.0:10256"),
            ("::1:80", "is not IP:PORT"),
        ] {
            let error = bind(address).expect_err(address);
            assert!(
                error.contains(says) && error.contains("host name is not resolved"),
                "{address}: {error}"
            );
        }
    }

    /// Each chart switch, in each form: absent, alone, `=true`, `=false`.
    #[test]
    fn chart_switches_take_every_form() {
        let switches = |args: &[&str]| {
            let run = run(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            [
                run.destroy_tcp_on_backend_removal,
                run.external.cluster_ips_from_outside,
            ]
        };
        assert_eq!(switches(&[]), [false, false]);
        let flags = [
            "--destroy-tcp-on-backend-removal",
            "--cluster-ips-from-outside",
        ];
        for (index, flag) in flags.into_iter().enumerate() {
            for (form, on) in [("", true), ("=true", true), ("=false", false)] {
                let arg = format!("{flag}{form}");
                let mut expected = [false; 2];
                expected[index] = on;
                assert_eq!(switches(&[&arg]), expected, "{arg}");
            }
            // Only with `=`: a separate word is not the switch's value.
            assert!(run(&[flag, "false"]).is_err(), "{flag} false");
        }
    }
}
