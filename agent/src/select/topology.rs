//! Topology filters of the cluster selection: the topology-keys annotation (for clusters
//! that predate topology hints), else node hints, else zone hints, as kube-proxy's
//! `topologyModeFromHints` decides.
use serde::Serialize;

use super::{
    endpoint::PortEndpoint,
    model::{NodeLabels, ServiceInfo, ThisNode, ZONE_LABEL},
};

/// How the ready endpoints were filtered for this node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "kebab-case")]
pub enum Topology {
    /// No filter.
    #[default]
    None,
    /// Hints exist but cannot be used; no filter.
    HintsIgnored { reason: String },
    /// Endpoints whose `hints.forNodes` names this node.
    NodeHints,
    /// Endpoints whose `hints.forZones` names this node's zone.
    ZoneHints { zone: String },
    /// The first topology key under which some endpoint's node shares this node's value
    /// (`*`: any endpoint).
    #[serde(rename = "topology-key")]
    Key { key: String },
    /// Topology keys given, none matched and no `*`: no endpoints.
    #[serde(rename = "topology-keys-unmatched")]
    KeysUnmatched,
}

/// Applies the service's topology to its ready endpoints.
pub(crate) fn cluster_topology<'e, 'a>(
    service: &ServiceInfo,
    ready: &[&'e PortEndpoint<'a>],
    node: &ThisNode,
    node_labels: &NodeLabels,
) -> (Topology, Vec<&'e PortEndpoint<'a>>) {
    if let Some(keys) = &service.topology_keys {
        return by_topology_keys(keys, ready, node, node_labels);
    }
    by_hints(ready, node)
}

fn by_topology_keys<'e, 'a>(
    keys: &[String],
    ready: &[&'e PortEndpoint<'a>],
    node: &ThisNode,
    node_labels: &NodeLabels,
) -> (Topology, Vec<&'e PortEndpoint<'a>>) {
    for key in keys {
        if key == "*" {
            return (Topology::Key { key: key.clone() }, ready.to_vec());
        }
        let Some(value) = node.labels.get(key) else {
            continue;
        };
        let same: Vec<&PortEndpoint> = ready
            .iter()
            .copied()
            .filter(|e| {
                e.endpoint
                    .node_name
                    .as_ref()
                    .and_then(|name| node_labels.get(&**name))
                    .and_then(|labels| labels.get(key))
                    == Some(value)
            })
            .collect();
        if !same.is_empty() {
            return (Topology::Key { key: key.clone() }, same);
        }
    }
    (Topology::KeysUnmatched, Vec::new())
}

fn by_hints<'e, 'a>(
    ready: &[&'e PortEndpoint<'a>],
    node: &ThisNode,
) -> (Topology, Vec<&'e PortEndpoint<'a>>) {
    if ready.is_empty() {
        return (Topology::None, Vec::new());
    }
    let all_node_hints = ready
        .iter()
        .all(|e| !e.endpoint.hints_for_nodes().is_empty());
    let for_this_node = |e: &&PortEndpoint| {
        e.endpoint
            .hints_for_nodes()
            .iter()
            .any(|n| **n == *node.name)
    };
    if all_node_hints && ready.iter().any(for_this_node) {
        let chosen = ready.iter().copied().filter(for_this_node).collect();
        return (Topology::NodeHints, chosen);
    }

    let any_zone_hints = ready
        .iter()
        .any(|e| !e.endpoint.hints_for_zones().is_empty());
    if !any_zone_hints {
        return (Topology::None, ready.to_vec());
    }
    let all_zone_hints = ready
        .iter()
        .all(|e| !e.endpoint.hints_for_zones().is_empty());
    let ignored = |reason: String| (Topology::HintsIgnored { reason }, ready.to_vec());
    if !all_zone_hints {
        return ignored("some ready endpoints have no zone hint".to_owned());
    }
    let Some(zone) = node.zone() else {
        return ignored(format!("this node has no {ZONE_LABEL} label"));
    };
    let for_this_zone =
        |e: &&PortEndpoint| e.endpoint.hints_for_zones().iter().any(|z| &**z == zone);
    if !ready.iter().any(for_this_zone) {
        return ignored(format!("no endpoint is hinted for zone {zone}"));
    }
    let chosen = ready.iter().copied().filter(for_this_zone).collect();
    (
        Topology::ZoneHints {
            zone: zone.to_owned(),
        },
        chosen,
    )
}
