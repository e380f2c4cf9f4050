//! Prometheus metrics: kube-proxy's names where the meaning is the same, so that existing
//! dashboards and alerts keep working, and `socklb_*` for what is socklb's own.
//! docs/operations.md documents every one (a test keeps it so).
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _, text::encode},
    metrics::{
        MetricType, TypedMetric,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Metric, Registry},
};
use socklb_abi::Counters;

use crate::dataplane::Outcome;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabels {
    pub map: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub protocol: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FrontendLabels {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// `internal` (local sockets) or `external` (traffic from outside, TC).
    pub scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub mode: String,
}

pub struct Metrics {
    /// Behind [`Families`], which records what is registered.
    registry: Families,
    pub sync_duration: Histogram,
    pub network_programming: Histogram,
    pub last_sync_timestamp: Gauge<f64, AtomicU64>,
    pub endpoint_changes_pending: Gauge,
    pub endpoint_changes: Counter,
    pub service_changes_pending: Gauge,
    pub service_changes: Counter,
    pub map_entries: Family<MapLabels, Gauge>,
    pub map_capacity: Family<MapLabels, Gauge>,
    /// The size a growing map may reach (its `--max-*` flag).
    pub map_max_entries: Family<MapLabels, Gauge>,
    pub skipped_services: Family<ReasonLabels, Gauge>,
    /// Frontends the selections ask for, by address family and scope.
    pub frontends: Family<FrontendLabels, Gauge>,
    /// Frontends not programmed as desired, by what became of them.
    pub rejected_frontends: Family<OutcomeLabels, Gauge>,
    /// healthCheckNodePorts by state: `serving`, or `failed` (could not be bound).
    pub health_check_ports: Family<StateLabels, Gauge>,
    /// Sockets closed because their backend left, by protocol (`udp`, `tcp`).
    pub sockets_destroyed: Family<ProtocolLabels, Counter>,
    /// How sockets of removed backends are closed: 1 for the mode in use.
    pub socket_destroy_mode: Family<ModeLabels, Gauge>,
    /// Service and backend entries found deleted or changed behind the agent's back, and
    /// written back.
    pub map_entries_restored: Counter,
    /// Service and backend entries found that the agent did not write, and deleted.
    pub map_entries_removed: Counter,
    /// Conntrack entries past their idle timeout, removed by the agent's conntrack GC.
    pub conntrack_expired_removed: Counter,
}

/// The registry and every family registered in it: an empty family exports no series (not
/// even its `# TYPE`), yet is part of what the agent exports.
#[derive(Default)]
struct Families {
    registry: Registry,
    families: Vec<(&'static str, MetricType)>,
}

impl Families {
    fn register<M: Metric + TypedMetric>(&mut self, name: &'static str, help: &str, metric: M) {
        self.registry.register(name, help, metric);
        self.families.push((name, M::TYPE));
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Families::default();
        // kube-proxy's buckets: 1 ms doubling to about 16 s.
        let sync_duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let network_programming = Histogram::new(exponential_buckets(0.001, 2.0, 20));
        let metrics = Self {
            sync_duration,
            network_programming,
            last_sync_timestamp: Gauge::default(),
            endpoint_changes_pending: Gauge::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            service_changes: Counter::default(),
            map_entries: Family::default(),
            map_capacity: Family::default(),
            map_max_entries: Family::default(),
            skipped_services: Family::default(),
            frontends: Family::default(),
            rejected_frontends: Family::default(),
            health_check_ports: Family::default(),
            sockets_destroyed: Family::default(),
            socket_destroy_mode: Family::default(),
            map_entries_restored: Counter::default(),
            map_entries_removed: Counter::default(),
            conntrack_expired_removed: Counter::default(),
            registry: Families::default(),
        };
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "How long one sync of the datapath maps took",
            metrics.sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "From an EndpointSlice change (its last-change-trigger-time) to the maps programmed",
            metrics.network_programming.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "When the maps were last synced (Unix time)",
            metrics.last_sync_timestamp.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "EndpointSlice changes not yet programmed",
            metrics.endpoint_changes_pending.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "EndpointSlice changes seen",
            metrics.endpoint_changes.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Service changes not yet programmed",
            metrics.service_changes_pending.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Service changes seen",
            metrics.service_changes.clone(),
        );
        registry.register(
            "socklb_map_entries",
            "Entries in use in a BPF map",
            metrics.map_entries.clone(),
        );
        registry.register(
            "socklb_map_capacity",
            "Capacity (max_entries) of a BPF map now",
            metrics.map_capacity.clone(),
        );
        registry.register(
            "socklb_map_max_entries",
            "The capacity a growing BPF map may reach (its --max-* flag)",
            metrics.map_max_entries.clone(),
        );
        registry.register(
            "socklb_map_entries_restored",
            "Service and backend map entries found deleted or changed behind the agent's back \
             (by hand, with bpftool) by the resyncs' verification, and written back",
            metrics.map_entries_restored.clone(),
        );
        registry.register(
            "socklb_map_entries_removed",
            "Service and backend map entries the agent did not write (added by hand, with \
             bpftool), found by the resyncs' walk through the maps and deleted by the next sync",
            metrics.map_entries_removed.clone(),
        );
        registry.register(
            "socklb_conntrack_expired_removed",
            "Conntrack entries (flows from outside the node and of the per-packet path) past \
             their idle timeout, removed by the agent's conntrack GC",
            metrics.conntrack_expired_removed.clone(),
        );
        registry.register(
            "socklb_skipped_services",
            "Services not served, in whole or in part, by reason (a Service counts once per \
             reason)",
            metrics.skipped_services.clone(),
        );
        registry.register(
            "socklb_frontends",
            "Service frontends the agent programs, by address family (ipv4, ipv6) and scope \
             (internal: local sockets; external: traffic from outside)",
            metrics.frontends.clone(),
        );
        registry.register(
            "socklb_rejected_frontends",
            "Frontends not programmed as desired because a map is full or a frontend has too \
             many backends, by outcome: kept_previous (keeps its previous backends), refused \
             (connections refused: no backend programmed), not_programmed (not translated at \
             all)",
            metrics.rejected_frontends.clone(),
        );
        for outcome in Outcome::ALL {
            metrics
                .rejected_frontends
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.label(),
                })
                .set(0);
        }
        registry.register(
            "socklb_health_check_ports",
            "healthCheckNodePorts of LoadBalancer Services with externalTrafficPolicy Local: \
             serving, or failed (the port could not be bound; retried at every sync)",
            metrics.health_check_ports.clone(),
        );
        registry.register(
            "socklb_sockets_destroyed",
            "Sockets socklb translated to a backend that left, closed by the agent, by protocol",
            metrics.sockets_destroyed.clone(),
        );
        registry.register(
            "socklb_socket_destroy_mode",
            "How the sockets of removed backends are closed (bpf-iterator, netlink, off): 1 \
             for the mode in use",
            metrics.socket_destroy_mode.clone(),
        );
        // At zero from the start, so that a rate() has a first sample before any sweep.
        for protocol in ["udp", "tcp"] {
            metrics
                .sockets_destroyed
                .get_or_create(&ProtocolLabels {
                    protocol: protocol.to_owned(),
                })
                .inc_by(0);
        }
        Self {
            registry,
            ..metrics
        }
    }

    /// Exports the kernel programs' counters as `socklb_datapath_events_total{event}`,
    /// `read` at every scrape (no series when it fails: the map is not there).
    #[must_use]
    pub fn with_datapath_events(
        mut self,
        read: impl Fn() -> Option<Counters> + Send + Sync + 'static,
    ) -> Self {
        self.registry
            .registry
            .register_collector(Box::new(DatapathEvents {
                read: Box::new(read),
            }));
        self.registry
            .families
            .push((DatapathEvents::NAME, MetricType::Counter));
        self
    }

    /// Sets `socklb_rejected_frontends` from the count of each outcome.
    pub fn set_rejected(&self, counts: impl IntoIterator<Item = (Outcome, usize)>) {
        for (outcome, count) in counts {
            self.rejected_frontends
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.label(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry.registry);
        text
    }
}

/// The kernel counters, read when scraped: Prometheus counters without a copy to keep in
/// step (they restart from 0 only when the counters map is recreated, which Prometheus
/// handles as a counter reset).
struct DatapathEvents {
    read: Box<dyn Fn() -> Option<Counters> + Send + Sync>,
}

impl DatapathEvents {
    const NAME: &str = "socklb_datapath_events";
}

impl std::fmt::Debug for DatapathEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DatapathEvents")
    }
}

impl Collector for DatapathEvents {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(counters) = (self.read)() else {
            return Ok(());
        };
        let mut family = encoder.encode_descriptor(
            Self::NAME,
            "Kernel program events since the counters map was created, summed over CPUs, by \
             event (the counter names of `socklb inspect`)",
            None,
            MetricType::Counter,
        )?;
        for (event, value) in Counters::NAMES.iter().zip(counters.values()) {
            let labels = [("event", *event)];
            ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Every series name the agent exports, as PromQL names them (`_total` of a counter,
/// `_bucket`/`_sum`/`_count` of a histogram), sorted: from what is registered, so that
/// nothing is missed.
pub fn exported_names(metrics: &Metrics) -> Vec<String> {
    let mut names: Vec<String> = metrics
        .registry
        .families
        .iter()
        .flat_map(|(name, kind)| {
            let suffixes: &[&str] = match kind {
                MetricType::Counter => &["_total"],
                MetricType::Histogram => &["_bucket", "_sum", "_count"],
                MetricType::Info => &["_info"],
                MetricType::Gauge | MetricType::Unknown => &[""],
            };
            suffixes.iter().map(move |suffix| format!("{name}{suffix}"))
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The agent's full set of metrics, the kernel counters included (at zero), for listing
/// their names without a datapath.
pub fn all() -> Metrics {
    Metrics::new().with_datapath_events(|| Some(Counters::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_kube_proxy_names() {
        let metrics = Metrics::new();
        assert!(
            metrics
                .encode()
                .contains("socklb_sockets_destroyed_total{protocol=\"tcp\"} 0"),
            "at zero before any sweep"
        );
        metrics.endpoint_changes.inc();
        metrics.sync_duration.observe(0.002);
        metrics
            .sockets_destroyed
            .get_or_create(&ProtocolLabels {
                protocol: "udp".to_owned(),
            })
            .inc_by(2);
        let text = metrics.encode();
        for name in [
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "kubeproxy_network_programming_duration_seconds",
            "socklb_sockets_destroyed_total{protocol=\"udp\"} 2",
        ] {
            assert!(text.contains(name), "{name} missing in:\n{text}");
        }
    }

    #[test]
    fn kernel_counters_are_prometheus_counters_under_their_abi_names() {
        let counters = Counters {
            translated: 7,
            affinity_hits: 3,
            ..Counters::default()
        };
        let metrics = Metrics::new().with_datapath_events(move || Some(counters));
        let text = metrics.encode();
        assert!(
            text.contains("# TYPE socklb_datapath_events counter"),
            "{text}"
        );
        for (event, value) in Counters::NAMES.iter().zip(counters.values()) {
            let line = format!("socklb_datapath_events_total{{event=\"{event}\"}} {value}\n");
            assert!(text.contains(&line), "{line} missing in:\n{text}");
        }
        // No counters map: no series rather than zeros.
        let unread = Metrics::new().with_datapath_events(|| None).encode();
        assert!(!unread.contains("socklb_datapath_events"), "{unread}");
    }

    #[test]
    fn rejected_frontends_are_reported_by_outcome() {
        let metrics = Metrics::new();
        assert!(
            metrics
                .encode()
                .contains("socklb_rejected_frontends{outcome=\"refused\"} 0"),
            "every outcome has a series before any sync"
        );
        metrics.set_rejected([(Outcome::Refused, 2), (Outcome::KeptPrevious, 5)]);
        let text = metrics.encode();
        for line in [
            "socklb_rejected_frontends{outcome=\"refused\"} 2",
            "socklb_rejected_frontends{outcome=\"kept_previous\"} 5",
            "socklb_rejected_frontends{outcome=\"not_programmed\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }

    /// The list of names covers whatever the registry encodes (no family registered
    /// around [`Families`]).
    #[test]
    fn exported_names_cover_every_encoded_family() {
        let metrics = all();
        metrics
            .map_entries
            .get_or_create(&MapLabels { map: "m".into() })
            .set(1);
        let names = exported_names(&metrics);
        for line in metrics.encode().lines() {
            if let Some((name, kind)) = line
                .strip_prefix("# TYPE ")
                .and_then(|rest| rest.split_once(' '))
            {
                let series = match kind {
                    "counter" => format!("{name}_total"),
                    "histogram" => format!("{name}_count"),
                    _ => name.to_owned(),
                };
                assert!(names.contains(&series), "{series} not in {names:?}");
            }
        }
    }

    /// docs/operations.md has a reference entry for every series the agent exports (and
    /// every kernel counter), so that the docs cannot fall behind the code.
    #[test]
    fn every_exported_metric_is_documented() {
        let docs = include_str!("../../docs/operations.md");
        let reference = docs
            .split_once("## Metrics reference")
            .map(|(_, rest)| rest)
            .expect("docs/operations.md has a \"## Metrics reference\" section");
        let names = exported_names(&all());
        assert!(
            names.contains(&"socklb_datapath_events_total".to_owned()),
            "{names:?}"
        );
        for name in &names {
            // A histogram's series are documented under its base name.
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            assert!(
                reference.contains(&format!("`{base}`"))
                    || reference.contains(&format!("`{base}{{")),
                "metric {name} is exported but not documented in docs/operations.md's \
                 metrics reference: add it (type, labels, meaning, what to alert on)"
            );
        }
        for event in Counters::NAMES {
            assert!(
                reference.contains(&format!("`{event}`")),
                "kernel counter {event} is not described in docs/operations.md's metrics \
                 reference"
            );
        }
    }
}
