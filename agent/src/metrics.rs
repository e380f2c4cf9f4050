//! Prometheus metrics: kube-proxy's names where the meaning is the same, so that existing
//! dashboards and alerts keep working, and `socklb_*` for what is socklb's own.
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};
use socklb_abi::Counters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabels {
    pub map: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub event: String,
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
pub struct ModeLabels {
    pub mode: String,
}

pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    pub network_programming: Histogram,
    pub last_sync_timestamp: Gauge<f64, AtomicU64>,
    pub endpoint_changes_pending: Gauge,
    pub endpoint_changes: Counter,
    pub service_changes_pending: Gauge,
    pub service_changes: Counter,
    pub map_entries: Family<MapLabels, Gauge>,
    pub map_capacity: Family<MapLabels, Gauge>,
    /// Kernel programs' counters (summed over CPUs), mirrored at every sync.
    pub datapath_events: Family<EventLabels, Gauge>,
    pub skipped_services: Family<ReasonLabels, Gauge>,
    pub rejected_frontends: Gauge,
    /// healthCheckNodePorts by state: `serving`, or `failed` (could not be bound).
    pub health_check_ports: Family<StateLabels, Gauge>,
    /// Sockets closed because their backend left, by protocol (`udp`, `tcp`).
    pub sockets_destroyed: Family<ProtocolLabels, Counter>,
    /// How sockets of removed backends are closed: 1 for the mode in use.
    pub socket_destroy_mode: Family<ModeLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
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
            datapath_events: Family::default(),
            skipped_services: Family::default(),
            rejected_frontends: Gauge::default(),
            health_check_ports: Family::default(),
            sockets_destroyed: Family::default(),
            socket_destroy_mode: Family::default(),
            registry: Registry::default(),
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
            "Capacity (max_entries) of a BPF map",
            metrics.map_capacity.clone(),
        );
        registry.register(
            "socklb_datapath_events",
            "Kernel program events since the counters map was created, summed over CPUs",
            metrics.datapath_events.clone(),
        );
        registry.register(
            "socklb_skipped_services",
            "Services not served, by reason",
            metrics.skipped_services.clone(),
        );
        registry.register(
            "socklb_rejected_frontends",
            "Frontends left unchanged at the last sync because a map was full",
            metrics.rejected_frontends.clone(),
        );
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
        Self {
            registry,
            ..metrics
        }
    }

    pub fn set_counters(&self, counters: &Counters) {
        let events = Counters::NAMES
            .iter()
            .map(|(_, event)| *event)
            .zip(counters.values());
        for (event, value) in events {
            self.datapath_events
                .get_or_create(&EventLabels {
                    event: event.to_owned(),
                })
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_kube_proxy_names() {
        let metrics = Metrics::new();
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
}
