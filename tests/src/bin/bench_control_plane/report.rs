//! The control-plane section of the report.
use std::{fmt::Write as _, time::Duration};

use crate::{
    CHANGE_SPACING, ColdStart, ENDPOINTS_PER_SERVICE, KubeResults, Options, RESYNC_WINDOW, Resyncs,
    per_sync, percentile,
};

pub fn report(
    machine: &str,
    options: &Options,
    file: &ColdStart,
    resyncs: &Resyncs,
    kube: &KubeResults,
) -> String {
    let mut out = String::new();
    let services = options.services;
    let endpoints = u64::from(services) * u64::from(ENDPOINTS_PER_SERVICE);
    let s = |d: Duration| format!("{:.3} s", d.as_secs_f64());
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    let mib = |kib: u64| format!("{:.0} MiB", kib as f64 / 1024.0);
    let _ = writeln!(out, "{machine}");
    let _ = writeln!(
        out,
        "{services} services x {ENDPOINTS_PER_SERVICE} endpoints ({endpoints} endpoints), one \
         port each, all on this node; release build of the agent\n"
    );

    let _ = writeln!(
        out,
        "Cold start (spawn -> \"programs attached\": the node serves, /readyz 200):\n"
    );
    let _ = writeln!(
        out,
        "| source | datapath loaded | manifests read | first full sync (agent) | map writes | \
         ready | peak RSS (VmHWM) | RSS at ready | service / backend map entries |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (source, cold) in [("file", file), ("kube (fake API server)", &kube.cold)] {
        let _ = writeln!(
            out,
            "| {source} | {} | {} | {} | {} | **{}** | **{}** | {} | {} / {} |",
            s(cold.loaded),
            cold.read.map_or_else(
                || "-".to_owned(),
                |read| format!("{} (reads before ready: {})", s(read), cold.reads)
            ),
            s(cold.sync.took),
            cold.sync.writes,
            s(cold.ready),
            mib(cold.peak_rss_kib),
            mib(cold.rss_kib),
            cold.entries.0,
            cold.entries.1,
        );
    }

    let entries = file.entries.0 + file.entries.1;
    let count = resyncs.verified.len();
    let read: usize = resyncs.verified.iter().map(|(read, _)| read).sum();
    let mut took: Vec<Duration> = resyncs.verified.iter().map(|(_, took)| *took).collect();
    took.sort_unstable();
    let _ = writeln!(
        out,
        "\nResyncs (file agent restarted over its maps, --sync-period 1s, nothing changing for \
         {} s):\n",
        RESYNC_WINDOW.as_secs()
    );
    let _ = writeln!(
        out,
        "| resync | entries read back each | took (agent) p50 / max | agent CPU per resync | \
         passes over all {entries} entries |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    let _ = writeln!(
        out,
        "| full (every --full-sync-period: every Service selected again) | - | {} | - | - |",
        ms(resyncs.full.took)
    );
    let _ = writeln!(
        out,
        "| verification (every --sync-period) | {} | {} / {} | **{:.1} ms** ({count} resyncs in \
         {}) | {} |",
        read / count.max(1),
        ms(percentile(&took, 50)),
        ms(took.last().copied().unwrap_or_default()),
        resyncs.cpu * 1e3 / count.max(1) as f64,
        s(resyncs.window),
        resyncs.passes,
    );

    let latency = &kube.latency;
    let _ = writeln!(
        out,
        "\nOne EndpointSlice change -> new backend in the service map (kube source, \
         --min-sync-period 0s, one change every >= {} ms):\n",
        CHANGE_SPACING.as_millis()
    );
    let _ = writeln!(
        out,
        "| changes | min | p50 | p90 | p99 | max | agent sync p50 | agent sync p99 | services \
         / writes per sync |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let _ = writeln!(
        out,
        "| {} | {} | **{}** | {} | **{}** | {} | {} | {} | {:.2} / {:.2} |",
        latency.samples,
        ms(latency.min),
        ms(latency.p50),
        ms(latency.p90),
        ms(latency.p99),
        ms(latency.max),
        ms(latency.sync_p50),
        ms(latency.sync_p99),
        latency.services_per_sync,
        latency.writes_per_sync,
    );

    let _ = writeln!(
        out,
        "\nAgent CPU (utime + stime from /proc) without changes, then under sustained \
         EndpointSlice changes (kube source):\n"
    );
    let _ = writeln!(
        out,
        "| load | changes | window | agent CPU (% of one core) | CPU per change | syncs | \
         services / writes per sync | sync p50 / max (agent) | caught up after the last change |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &kube.rows {
        let mut took: Vec<Duration> = row.syncs.iter().map(|sync| sync.took).collect();
        took.sort_unstable();
        let per_change = if row.changes == 0 {
            "-".to_owned()
        } else {
            format!("{:.2} ms", row.cpu * 1e3 / f64::from(row.changes))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | **{:.1}%** | {per_change} | {} | {:.2} / {:.2} | {} / {} | {} |",
            row.label,
            row.changes,
            s(row.window),
            row.cpu_percent(),
            row.syncs.len(),
            per_sync(&row.syncs, |sync| sync.services),
            per_sync(&row.syncs, |sync| sync.writes),
            ms(percentile(&took, 50)),
            ms(took.last().copied().unwrap_or_default()),
            ms(row.caught_up),
        );
    }
    out
}
