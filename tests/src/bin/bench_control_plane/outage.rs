//! Recovery after API-server outages: the kube-source agent watches the fake API server,
//! which goes away for `--outage-seconds` (listener closed, every connection dropped) and
//! comes back on the same port answering 403 Forbidden for [`WARMING`], as a restarted API
//! server does while its authorizer's cache warms. An EndpointSlice change is made the
//! moment it is back; timed until the new endpoint is in the pinned service map.
//!
//! Every second outage also compacts the history while the server is down, so the watches'
//! resource versions have expired when it returns: they get 410 Gone and relist.
use std::fmt::Write as _;

use super::{
    Agent, Duration, FakeApiServer, Instant, ManifestDir, Options, Sandbox, Section, Sizing,
    cluster::{Cluster, apply, fake_cluster},
    maps::Maps,
    percentile, start_kube,
};

pub const SECTION: Section = Section::new(
    "control-plane outages",
    "control-plane",
    "Recovery after an API-server outage",
);

/// How long the restarted server refuses every request.
const WARMING: Duration = Duration::from_secs(1);
/// A change not applied by then fails the benchmark.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(120);
/// Between one recovery and the next outage.
const SETTLE: Duration = Duration::from_secs(1);

/// From the server's return to the change in the maps, per outage.
pub struct Recovery {
    /// (history compacted during the outage, time to applied).
    samples: Vec<(bool, Duration)>,
    /// The agent's warnings about the API over all outages.
    warnings: usize,
}

pub fn run(
    sandbox: &Sandbox,
    manifests: &ManifestDir,
    cluster: &mut Cluster,
    options: &Options,
) -> Recovery {
    let (mut api, kubeconfig) = fake_cluster(manifests, cluster);
    let agent = start_kube(sandbox, &kubeconfig, Sizing::Fitted(cluster.len()), "20ms");
    let maps = Maps::open(&sandbox.pin_dir);
    let outage = Duration::from_secs(options.outage_seconds.into());
    let mut samples = Vec::new();
    for number in 0..options.outages {
        let compacted = number % 2 == 1;
        api.stop();
        std::thread::sleep(outage);
        if compacted {
            api.compact();
        }
        let took = recover(&mut api, &maps, &agent, cluster);
        eprintln!(
            "outage {}/{} ({} s, history {}): change applied {took:.2?} after the server \
             returned",
            number + 1,
            options.outages,
            options.outage_seconds,
            if compacted { "compacted" } else { "kept" },
        );
        samples.push((compacted, took));
        std::thread::sleep(SETTLE);
    }
    let warnings = agent
        .log()
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("feed="))
        .count();
    agent.stop();
    Recovery { samples, warnings }
}

/// Brings the server back (refusing at first), makes a change at once, and times it.
fn recover(api: &mut FakeApiServer, maps: &Maps, agent: &Agent, cluster: &mut Cluster) -> Duration {
    api.refuse_for(403, "Forbidden", WARMING);
    let back = Instant::now();
    api.restart();
    let change = cluster.change();
    apply(api, &change.slice);
    maps.wait_within(change.service, change.address, agent, RECOVERY_TIMEOUT);
    back.elapsed()
}

pub fn report(machine: &str, options: &Options, recovery: &Recovery) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{machine}");
    let _ = writeln!(
        out,
        "{} services x {} endpoints in the fake API server; {} outages of {} s, each followed \
         by {} s of 403 Forbidden; release build of the agent, default flags \
         (--api-retry-max 2s, --min-sync-period 20ms)\n",
        options.services,
        super::ENDPOINTS_PER_SERVICE,
        options.outages,
        options.outage_seconds,
        WARMING.as_secs(),
    );
    let _ = writeln!(
        out,
        "| history during the outage | outages | min | p50 | max | target (p50 / max) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
    let s = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let rows = [
        ("kept (watches resume)", Some(false)),
        ("compacted (410 Gone, relist)", Some(true)),
        ("all", None),
    ];
    for (label, compacted) in rows {
        let mut took: Vec<Duration> = recovery
            .samples
            .iter()
            .filter(|(c, _)| compacted.is_none_or(|wanted| *c == wanted))
            .map(|(_, took)| *took)
            .collect();
        if took.is_empty() {
            continue;
        }
        took.sort_unstable();
        let _ = writeln!(
            out,
            "| {label} | {} | {} | **{}** | **{}** | 3 s / 10 s |",
            took.len(),
            s(took[0]),
            s(percentile(&took, 50)),
            s(took[took.len() - 1]),
        );
    }
    let _ = writeln!(
        out,
        "\nThe agent logged {} API warnings over the {} outages.",
        recovery.warnings, options.outages
    );
    out
}
