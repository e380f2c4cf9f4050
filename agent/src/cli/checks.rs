//! Every `socklb run` flag checked before anything is loaded, pinned or attached: a
//! mistake fails the start with the flag's name and what to give instead, and leaves the
//! node as it was (no maps pinned, no programs attached, no busy loop).
use std::{
    net::{IpAddr, Ipv6Addr},
    path::Path,
    time::Duration,
};

use super::args::{RunArgs, SourceKind};
use crate::dataplane::Capacities;

/// The largest `--max-*` value: the kernel's bound for a hash map (its bucket array of 16
/// bytes per power-of-two bucket must stay below 4 GiB).
pub const MAX_CAPACITY: u32 = 1 << 28;

/// Preallocated bytes per unit of each LRU flag (its IPv4 table, plus the IPv6 twin at half
/// the entries; docs/operations.md, "Map memory and capacities").
const PREALLOCATED_BYTES: [(&str, u64); 4] = [
    ("--max-conntrack-entries", 112 + 160 / 2),
    ("--max-conntrack-new-entries", 112 + 160 / 2),
    ("--max-reverse-entries", 96 + 120 / 2 + 32 + 56),
    ("--max-affinity-entries", 96 + 104 / 2),
];

/// The longest `--sync-period` and `--min-sync-period`: a day between resyncs is already
/// past any use (the health endpoints report a stuck agent only after twice the period).
const SYNC_PERIOD_MAX: Duration = Duration::from_secs(24 * 3600);

/// The longest `--full-sync-period`: a week (kube-proxy's full sync is hourly).
const FULL_SYNC_PERIOD_MAX: Duration = Duration::from_secs(7 * 24 * 3600);

/// The longest `--handover-wait`: an hour, far past any pod's termination grace period.
const HANDOVER_WAIT_MAX: Duration = Duration::from_secs(3600);

/// The longest `--api-retry-max`: an hour (changes are applied again at most this long
/// after an API-server outage ends).
const API_RETRY_MAX: Duration = Duration::from_secs(3600);

/// Whether a duration flag takes `0s`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Zero {
    Allowed,
    Refused,
}

/// A flag that cannot work, with what to do instead.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {value}: {problem}")]
pub struct BadFlag {
    pub flag: &'static str,
    pub value: String,
    pub problem: String,
}

/// Every problem with `args`, in the order the flags are listed in `--help`; empty if
/// none. `device_exists` and `memory` (the node's memory in bytes, if known) are the host's
/// answers, passed in so that the checks stay pure.
pub fn problems(
    args: &RunArgs,
    device_exists: &dyn Fn(&str) -> bool,
    memory: Option<u64>,
) -> Vec<BadFlag> {
    let mut bad = Vec::new();
    let mut report = |flag: &'static str, value: String, problem: String| {
        bad.push(BadFlag {
            flag,
            value,
            problem,
        });
    };
    let source = &args.source;
    if source.source == SourceKind::File {
        match &source.manifests {
            Some(dir) if !dir.is_dir() => report(
                "--manifests",
                dir.display().to_string(),
                format!(
                    "{}: give the directory that holds the Service, EndpointSlice and Node \
                     manifests",
                    if dir.exists() {
                        "not a directory"
                    } else {
                        "no such directory"
                    }
                ),
            ),
            _ => {}
        }
    }
    if source.source == SourceKind::Kube
        && let Some(dir) = &source.manifests
    {
        report(
            "--manifests",
            dir.display().to_string(),
            "read only with --source file (the source is the Kubernetes API): add --source \
             file, or drop --manifests"
                .to_owned(),
        );
    }
    if source.source == SourceKind::Kube
        && let Some(kubeconfig) = &source.kubeconfig
        && !std::env::split_paths(kubeconfig).any(|path| path.is_file())
    {
        report(
            "--kubeconfig",
            kubeconfig.display().to_string(),
            "no such file (also read from $KUBECONFIG): give a kubeconfig file, or none \
             in a pod (the in-cluster config)"
                .to_owned(),
        );
    }
    duration(
        "--api-retry-max",
        source.api_retry_max,
        Zero::Refused,
        API_RETRY_MAX,
        &mut report,
    );
    if let Some(path) = &args.cgroup_path
        && !path.is_dir()
    {
        report(
            "--cgroup-path",
            path.display().to_string(),
            format!(
                "{}: give the cgroup v2 mount or a cgroup in it",
                if path.exists() {
                    "not a directory"
                } else {
                    "no such directory"
                }
            ),
        );
    }
    let (health, metrics) = (args.healthz_bind_address, args.metrics_bind_address);
    if health.port() != 0
        && health.port() == metrics.port()
        && binds_overlap(health.ip(), metrics.ip())
    {
        report(
            "--metrics-bind-address",
            metrics.to_string(),
            format!(
                "the port of --healthz-bind-address ({health}): each server needs its own \
                 (kube-proxy's are 10249 and 10256)"
            ),
        );
    }
    // Each duration flag is bounded before anything uses it: the agent adds them to the
    // clock and doubles the sync period, which a value of years would overflow (a panic).
    let sync_fits = duration(
        "--sync-period",
        args.sync_period,
        Zero::Refused,
        SYNC_PERIOD_MAX,
        &mut report,
    );
    duration(
        "--full-sync-period",
        args.full_sync_period,
        Zero::Refused,
        FULL_SYNC_PERIOD_MAX,
        &mut report,
    );
    let min_fits = duration(
        "--min-sync-period",
        args.min_sync_period,
        Zero::Allowed,
        SYNC_PERIOD_MAX,
        &mut report,
    );
    if sync_fits && min_fits && args.min_sync_period > args.sync_period {
        report(
            "--min-sync-period",
            humantime::format_duration(args.min_sync_period).to_string(),
            format!(
                "longer than --sync-period ({}): give at most that",
                humantime::format_duration(args.sync_period)
            ),
        );
    }
    duration(
        "--handover-wait",
        args.handover_wait,
        Zero::Allowed,
        HANDOVER_WAIT_MAX,
        &mut report,
    );
    for device in &args.external.devices {
        if device.is_empty() || !device_exists(device) {
            report(
                "--devices",
                format!("{device:?}"),
                "no such network device in this network namespace: list the devices \
                 that receive traffic from outside (`ip link`), comma-separated, or leave \
                 the flag out to use the devices of the Node's addresses"
                    .to_owned(),
            );
        }
    }
    let external = &args.external;
    for (flag, timeout) in [
        (
            "--conntrack-tcp-timeout-syn",
            external.conntrack_tcp_timeout_syn,
        ),
        (
            "--conntrack-tcp-timeout-established",
            external.conntrack_tcp_timeout_established,
        ),
        (
            "--conntrack-tcp-timeout-close",
            external.conntrack_tcp_timeout_close,
        ),
        ("--conntrack-udp-timeout", external.conntrack_udp_timeout),
    ] {
        if timeout < Duration::from_secs(1) || timeout.as_secs() > u64::from(u32::MAX) {
            report(
                flag,
                humantime::format_duration(timeout).to_string(),
                format!(
                    "the programs count idle time in whole seconds: give between 1s and {}",
                    humantime::format_duration(Duration::from_secs(u64::from(u32::MAX)))
                ),
            );
        }
    }
    let capacities = Capacities::from(&args.capacities);
    for (flag, value) in capacity_flags(&capacities) {
        if value == 0 || value > MAX_CAPACITY {
            report(
                flag,
                value.to_string(),
                format!("give between 1 and {MAX_CAPACITY} (the kernel's bound for a map)"),
            );
        }
    }
    // A bound no Service fits in: every Service would be refused. (A Maglev bound below
    // one table refuses only Maglev Services, each named with the flag at run time.)
    if capacities.service_entries == 1 {
        report(
            "--max-service-entries",
            "1".to_owned(),
            "a frontend takes one entry and each of its backends one more: give at least 2"
                .to_owned(),
        );
    }
    if let Some(name) = &source.node_name
        && let Err(problem) = node_name(name)
    {
        report("--node-name", format!("{name:?}"), problem);
    }
    if let Some(memory) = memory {
        for (flag, per_entry) in PREALLOCATED_BYTES {
            let Some((_, value)) = capacity_flags(&capacities)
                .into_iter()
                .find(|(name, _)| *name == flag)
            else {
                continue;
            };
            let bytes = u64::from(value) * per_entry;
            if value <= MAX_CAPACITY && bytes > memory / 2 {
                report(
                    flag,
                    value.to_string(),
                    format!(
                        "its tables are preallocated: about {} MiB, more than half of this \
                         node's memory ({} MiB); give a smaller value",
                        bytes >> 20,
                        memory >> 20
                    ),
                );
            }
        }
    }
    bad
}

/// This node's name as the agent matches it against Node objects: trimmed and lowercased,
/// as kube-proxy takes `--hostname-override` and the hostname; an error says why it can
/// name no Node (a DNS subdomain, RFC 1123).
pub fn node_name(given: &str) -> Result<String, String> {
    let name = given.trim().to_lowercase();
    if name.is_empty() {
        return Err("empty: give this node's name as `kubectl get nodes` shows it".to_owned());
    }
    let label_ok = |label: &str| {
        let alphanumeric = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        alphanumeric(label.chars().next())
            && alphanumeric(label.chars().last())
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    if name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(
            "no Node can have this name (a DNS subdomain: letters, digits, '-' and \
                    '.', each part starting and ending with a letter or digit): give this \
                    node's name as `kubectl get nodes` shows it"
                .to_owned(),
        );
    }
    Ok(name)
}

/// Whether sockets bound to `a` and `b` on one port would clash: the same address (an
/// IPv4-mapped IPv6 one is its IPv4 address), the unspecified address of the other's
/// family, or `::`, which takes IPv4 too (a dual-stack socket, as the agent binds it).
fn binds_overlap(a: IpAddr, b: IpAddr) -> bool {
    let (a, b) = (a.to_canonical(), b.to_canonical());
    let takes = |any: IpAddr, other: IpAddr| {
        any == IpAddr::from(Ipv6Addr::UNSPECIFIED)
            || (any.is_unspecified() && any.is_ipv4() == other.is_ipv4())
    };
    a == b || takes(a, b) || takes(b, a)
}

/// Reports `value` of `flag` unless it is within its range (0s, if `zero` allows it, to
/// `max`); returns whether it is.
fn duration(
    flag: &'static str,
    value: Duration,
    zero: Zero,
    max: Duration,
    report: &mut impl FnMut(&'static str, String, String),
) -> bool {
    let fits = value <= max && (zero == Zero::Allowed || !value.is_zero());
    if !fits {
        let max = humantime::format_duration(max);
        report(
            flag,
            humantime::format_duration(value).to_string(),
            match zero {
                Zero::Allowed => format!("give between 0s and {max}"),
                Zero::Refused => format!("give a duration longer than 0s and at most {max}"),
            },
        );
    }
    fits
}

fn capacity_flags(capacities: &Capacities) -> [(&'static str, u32); 9] {
    [
        ("--max-service-entries", capacities.service_entries),
        ("--max-backends", capacities.backends),
        ("--max-reverse-entries", capacities.reverse),
        ("--max-affinity-entries", capacities.affinity),
        ("--max-conntrack-entries", capacities.conntrack),
        ("--max-conntrack-new-entries", capacities.conntrack_new),
        ("--max-source-ranges", capacities.source_ranges),
        ("--max-maglev-entries", capacities.maglev_entries),
        ("--max-socket-records", capacities.socket_records),
    ]
}

/// Checks `args` against this host; the error lists every bad flag, one per line.
pub fn check(args: &RunArgs) -> anyhow::Result<()> {
    let bad = problems(
        args,
        &|device| nix::net::if_::if_nametoindex(device).is_ok(),
        memory(),
    );
    if bad.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = bad.iter().map(ToString::to_string).collect();
    anyhow::bail!(
        "invalid flags, nothing was started:\n  {}",
        lines.join("\n  ")
    )
}

/// MemTotal from /proc/meminfo, in bytes.
fn memory() -> Option<u64> {
    let text = std::fs::read_to_string(Path::new("/proc/meminfo")).ok()?;
    let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::args::{Cli, Command};

    fn run_args(flags: &[&str]) -> RunArgs {
        let mut argv = vec!["socklb", "run", "--source", "file"];
        argv.extend_from_slice(flags);
        if !flags.contains(&"--manifests") {
            argv.extend(["--manifests", "/"]);
        }
        match Cli::try_parse_from(argv).expect("flags parse").command {
            Command::Run(args) => *args,
            _ => unreachable!("a run command"),
        }
    }

    fn flags_named(flags: &[&str]) -> Vec<&'static str> {
        let devices = |device: &str| device == "eth0";
        problems(&run_args(flags), &devices, Some(8 << 30))
            .into_iter()
            .map(|bad| bad.flag)
            .collect()
    }

    /// A duration the operator walkthrough gave, far past what a `Duration` added to the
    /// clock can hold.
    const HUGE: &str = "10000000000000000000s";

    #[test]
    fn each_bad_flag_is_named() {
        // (flags given, the flags named in the error)
        let rows: &[(&[&str], &[&str])] = &[
            (&[], &[]),
            (&["--devices", "eth0"], &[]),
            (&["--devices", "eth0,nope0"], &["--devices"]),
            (&["--manifests", "/nonexistent/socklb"], &["--manifests"]),
            (&["--sync-period", "0s"], &["--sync-period"]),
            (&["--min-sync-period", "0s"], &[]),
            (
                &["--sync-period", "1s", "--min-sync-period", "2s"],
                &["--min-sync-period"],
            ),
            (&["--api-retry-max", "0s"], &["--api-retry-max"]),
            (&["--api-retry-max", "1h"], &[]),
            (&["--api-retry-max", "2h"], &["--api-retry-max"]),
            // Durations of years overflow the clock or the health timeout: bounded.
            (&["--sync-period", HUGE], &["--sync-period"]),
            (&["--sync-period", "1day"], &[]),
            (&["--sync-period", "1day 1s"], &["--sync-period"]),
            (&["--full-sync-period", HUGE], &["--full-sync-period"]),
            (&["--full-sync-period", "7days"], &[]),
            (&["--min-sync-period", HUGE], &["--min-sync-period"]),
            (
                &["--sync-period", HUGE, "--min-sync-period", HUGE],
                &["--sync-period", "--min-sync-period"],
            ),
            (&["--handover-wait", "0s"], &[]),
            (&["--handover-wait", "1h"], &[]),
            (&["--handover-wait", HUGE], &["--handover-wait"]),
            (
                &["--conntrack-tcp-timeout-syn", "0s"],
                &["--conntrack-tcp-timeout-syn"],
            ),
            (
                &["--conntrack-udp-timeout", "500ms"],
                &["--conntrack-udp-timeout"],
            ),
            (
                &["--conntrack-tcp-timeout-established", "200years"],
                &["--conntrack-tcp-timeout-established"],
            ),
            (&["--max-service-entries", "0"], &["--max-service-entries"]),
            (&["--max-backends", "4294967295"], &["--max-backends"]),
            (
                &["--max-maglev-entries", "268435457"],
                &["--max-maglev-entries"],
            ),
            (&["--max-maglev-entries", "268435456"], &[]),
            // preallocated: 8 GiB of memory takes at most 4 GiB of conntrack
            (
                &["--max-conntrack-entries", "100000000"],
                &["--max-conntrack-entries"],
            ),
            (&["--max-conntrack-entries", "1000000"], &[]),
            (
                &["--max-affinity-entries", "0", "--max-reverse-entries", "0"],
                &["--max-reverse-entries", "--max-affinity-entries"],
            ),
            (
                &["--cgroup-path", "/nonexistent/cgroup"],
                &["--cgroup-path"],
            ),
            (
                &["--metrics-bind-address", "0.0.0.0:10256"],
                &["--metrics-bind-address"],
            ),
            (
                &["--healthz-bind-address", "127.0.0.1:10249"],
                &["--metrics-bind-address"],
            ),
            (&["--healthz-bind-address", "127.0.0.2:10249"], &[]),
            (&["--max-service-entries", "1"], &["--max-service-entries"]),
            (&["--max-service-entries", "2"], &[]),
            (&["--node-name", ""], &["--node-name"]),
            (&["--node-name", "  "], &["--node-name"]),
            (&["--node-name", "node_1"], &["--node-name"]),
            (&["--node-name=node-"], &["--node-name"]),
            (&["--node-name", "node..1"], &["--node-name"]),
            (&["--node-name", "Worker-1.Example.com"], &[]),
            // Another family: both binds succeed.
            (&["--metrics-bind-address", "[::1]:10256"], &[]),
            // `::` takes IPv4 too, as does an IPv4-mapped address its IPv4 one.
            (
                &["--healthz-bind-address", "[::]:10249"],
                &["--metrics-bind-address"],
            ),
            (
                &["--healthz-bind-address", "[::ffff:127.0.0.1]:10249"],
                &["--metrics-bind-address"],
            ),
            (
                &[
                    "--healthz-bind-address",
                    "127.0.0.1:0",
                    "--metrics-bind-address",
                    "127.0.0.1:0",
                ],
                &[],
            ),
        ];
        for (flags, named) in rows {
            assert_eq!(&flags_named(flags), named, "{flags:?}");
        }
    }

    #[test]
    fn a_node_name_is_taken_as_kube_proxy_takes_it() {
        assert_eq!(
            node_name(" Worker-1.Example.com\n").as_deref(),
            Ok("worker-1.example.com")
        );
        assert!(node_name("node_1").is_err());
    }

    #[test]
    fn a_duration_out_of_range_says_the_range() {
        let problem = |flags: &[&str]| {
            let bad = problems(&run_args(flags), &|_| true, None);
            assert_eq!(bad.len(), 1, "{flags:?}: {bad:?}");
            bad[0].to_string()
        };
        assert_eq!(
            problem(&["--sync-period", "2days"]),
            "--sync-period 2days: give a duration longer than 0s and at most 1day"
        );
        assert_eq!(
            problem(&["--sync-period", "0s"]),
            "--sync-period 0s: give a duration longer than 0s and at most 1day"
        );
        assert_eq!(
            problem(&["--handover-wait", "2h"]),
            "--handover-wait 2h: give between 0s and 1h"
        );
        assert_eq!(
            problem(&["--full-sync-period", "8days"]),
            "--full-sync-period 8days: give a duration longer than 0s and at most 7days"
        );
    }

    #[test]
    fn a_flag_given_again_overrides_the_earlier() {
        let args = run_args(&["--sync-period", "30s", "--sync-period", "10s"]);
        assert_eq!(args.sync_period, Duration::from_secs(10));
        // A list adds to itself, as kube-proxy's do.
        let args = run_args(&["--devices", "eth0,eth1", "--devices", "eth2"]);
        assert_eq!(args.external.devices, ["eth0", "eth1", "eth2"]);
    }

    #[test]
    fn a_missing_kubeconfig_is_named() {
        let argv = ["socklb", "run", "--kubeconfig", "/nonexistent/kubeconfig"];
        let Command::Run(args) = Cli::try_parse_from(argv).expect("flags parse").command else {
            unreachable!("a run command");
        };
        let bad = problems(&args, &|_| true, None);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].flag, "--kubeconfig");
    }

    #[test]
    fn manifests_without_the_file_source_are_named() {
        let argv = ["socklb", "run", "--manifests", "/"];
        let Command::Run(args) = Cli::try_parse_from(argv).expect("flags parse").command else {
            unreachable!("a run command");
        };
        let bad = problems(&args, &|_| true, None);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].flag, "--manifests");
        assert!(bad[0].problem.contains("--source file"), "{bad:?}");
    }
}
