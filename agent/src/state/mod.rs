//! Cluster state: Services, EndpointSlices grouped by Service, and Nodes, built from source
//! events; and which Services changed since the last sync (like kube-proxy's change
//! trackers), so that a sync recomputes only those.
pub mod convert;
pub mod workloads;

use std::collections::{BTreeMap, BTreeSet};

// foldhash: SipHash was a tenth of the main thread's work over the first lists of
// 100,000 Services.
use hashbrown::{HashMap, HashSet};
use tracing::warn;

use self::workloads::Workloads;
use crate::{
    select::{
        NodeLabels, ServiceInfo, ServiceName, ServiceSelection, SkipReason, SliceInfo, ThisNode,
        select,
    },
    source::{Event, Kind, Object},
};

/// What a sync must recompute.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub services: BTreeSet<ServiceName>,
    /// This node's addresses or labels changed: its SNAT address and devices are
    /// re-evaluated even if no Service is affected.
    pub this_node: bool,
    /// Services and EndpointSlices that changed (added, modified, removed) since the last
    /// sync, for the changes metrics; unchanged objects of a relist do not count.
    pub service_events: u64,
    pub endpoint_events: u64,
}

/// From this many Services on, [`ClusterState::select_each`] shares them out between
/// threads; fewer take less than a thread's start.
const SELECT_APART_FROM: usize = 1_000;

#[derive(Debug)]
pub struct ClusterState {
    node_name: String,
    services: BTreeMap<ServiceName, Result<ServiceInfo, SkipReason>>,
    /// Slices by owning Service, sorted by name (deterministic merging). A Vec, not a map:
    /// most Services have one slice, and a map's node would take over a kilobyte each.
    slices: BTreeMap<ServiceName, Vec<SliceInfo>>,
    /// By kind whose list is under way: what it has not applied yet (namespace, name).
    unlisted: HashMap<Kind, HashSet<ListKey>>,
    /// The node and zone names the slices' endpoints share.
    names: convert::Names,
    /// Which Service each slice (namespace, name) belongs to, to follow relabels/deletes.
    slice_owners: HashMap<(String, String), ServiceName>,
    node_labels: NodeLabels,
    this_node: ThisNode,
    /// This node's addresses that are not IPs, as last warned about.
    invalid_node_addresses: Vec<String>,
    changes: Changes,
    /// This node's pods and the Namespaces' labels: which path serves each pod.
    workloads: Workloads,
}

impl ClusterState {
    pub fn new(node_name: &str) -> Self {
        Self {
            node_name: node_name.to_owned(),
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            names: convert::Names::default(),
            unlisted: HashMap::new(),
            slice_owners: HashMap::new(),
            node_labels: NodeLabels::new(),
            this_node: ThisNode {
                name: node_name.to_owned(),
                ..ThisNode::default()
            },
            invalid_node_addresses: Vec::new(),
            changes: Changes::default(),
            workloads: Workloads::default(),
        }
    }

    fn set_service(&mut self, name: ServiceName, info: Result<ServiceInfo, SkipReason>) {
        self.services.insert(name, info);
    }

    fn remove_service(&mut self, name: &ServiceName) -> bool {
        self.services.remove(name).is_some()
    }

    pub fn this_node(&self) -> &ThisNode {
        &self.this_node
    }

    /// Whether a change waits for a sync.
    pub fn has_changes(&self) -> bool {
        !self.changes.services.is_empty() || self.changes.this_node || self.workloads.changed()
    }

    /// This node's pods and the Namespaces' labels.
    pub fn workloads(&self) -> &Workloads {
        &self.workloads
    }

    /// Whether a pod or a Namespace changed since the last call.
    pub fn take_workloads_changed(&mut self) -> bool {
        self.workloads.take_changed()
    }

    /// Service and EndpointSlice events not yet taken by a sync.
    pub fn pending_events(&self) -> (u64, u64) {
        (self.changes.service_events, self.changes.endpoint_events)
    }

    /// Every Service's selection (skipped ones excluded), in name order.
    pub fn select_all(&self) -> Vec<ServiceSelection> {
        self.services
            .keys()
            .filter_map(|name| self.select(name))
            .collect()
    }

    /// Takes the set of Services changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    pub fn services(&self) -> impl Iterator<Item = &ServiceName> {
        self.services.keys()
    }

    /// Skipped Services with their reason.
    pub fn skipped(&self) -> impl Iterator<Item = (&ServiceName, &SkipReason)> {
        self.services
            .iter()
            .filter_map(|(name, info)| info.as_ref().err().map(|reason| (name, reason)))
    }

    /// Why a Service is skipped as a whole; `None` if it is served or does not exist.
    pub fn skip_reason(&self, name: &ServiceName) -> Option<&SkipReason> {
        self.services.get(name)?.as_ref().err()
    }

    /// Selection for one Service; `None` if it does not exist or is skipped.
    pub fn select(&self, name: &ServiceName) -> Option<ServiceSelection> {
        let service = self.services.get(name)?.as_ref().ok()?;
        let slices = self.slices.get(name).map_or(&[][..], Vec::as_slice);
        Some(select(service, slices, &self.this_node, &self.node_labels))
    }

    /// Selection for each of `names`, in their order. Many are selected on as many threads
    /// as the node has cores: a full sync of 100,000 Services spent a quarter of a second
    /// here on one, while the other waited.
    pub fn select_each(&self, names: &[&ServiceName]) -> Vec<Option<ServiceSelection>> {
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        if names.len() < SELECT_APART_FROM || threads == 1 {
            return names.iter().map(|name| self.select(name)).collect();
        }
        std::thread::scope(|scope| {
            let parts: Vec<_> = names
                .chunks(names.len().div_ceil(threads))
                .map(|part| {
                    scope.spawn(|| {
                        part.iter()
                            .map(|name| self.select(name))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            parts
                .into_iter()
                .flat_map(|part| {
                    part.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        })
    }

    pub fn apply(&mut self, event: Event) {
        match event {
            Event::Reset(kind, objects) => self.reset(kind, objects),
            Event::Listing(kind) => self.listing(kind),
            Event::Listed(kind) => self.listed(kind),
            Event::Applied(object) => self.upsert(object),
            Event::Deleted(object) => self.delete(&object),
        }
    }

    fn reset(&mut self, kind: Kind, objects: Vec<Object>) {
        if matches!(kind, Kind::Pod | Kind::Namespace) {
            self.workloads.reset(&self.node_name, kind, objects);
            return;
        }
        self.listing(kind);
        for object in objects {
            self.upsert(object);
        }
        self.listed(kind);
    }

    /// A list of `kind` begins: what it does not apply before [`Self::listed`] is gone.
    fn listing(&mut self, kind: Kind) {
        let held: HashSet<ListKey> = match kind {
            Kind::Service => self
                .services
                .keys()
                .map(|name| (name.namespace.clone(), name.name.clone()))
                .collect(),
            Kind::EndpointSlice => self.slice_owners.keys().cloned().collect(),
            Kind::Node => self
                .node_labels
                .keys()
                .map(|name| (String::new(), name.clone()))
                .collect(),
            // Listed whole only (Event::Reset).
            Kind::Pod | Kind::Namespace => return,
        };
        self.unlisted.insert(kind, held);
    }

    /// The list of `kind` is complete: what it did not apply is deleted.
    fn listed(&mut self, kind: Kind) {
        let Some(gone) = self.unlisted.remove(&kind) else {
            return;
        };
        for (namespace, name) in gone {
            match kind {
                Kind::Service => {
                    let name = ServiceName { namespace, name };
                    if self.remove_service(&name) {
                        self.changes.service_events += 1;
                        self.mark(name);
                    }
                }
                Kind::EndpointSlice => self.remove_slice(&(namespace, name)),
                Kind::Node => self.remove_node(&name),
                Kind::Pod | Kind::Namespace => {}
            }
        }
        if kind == Kind::EndpointSlice {
            self.names.forget_unused();
        }
        if kind == Kind::Node {
            self.check_this_node();
        }
    }

    /// Warns when the Nodes listed lack this node: none of its addresses then serves a
    /// NodePort and no topology applies, most often for a wrong node name.
    fn check_this_node(&self) {
        if self.node_labels.contains_key(&self.node_name) {
            return;
        }
        let mut some: Vec<&str> = self.node_labels.keys().map(String::as_str).collect();
        some.truncate(5);
        warn!(
            node = %self.node_name,
            nodes = self.node_labels.len(),
            some = %some.join(" "),
            "this node is not among the cluster's Nodes: no NodePort is served on its \
             addresses and no topology hint applies; give the Node's name with --node-name \
             (or NODE_NAME; the default is the hostname)"
        );
    }

    fn upsert(&mut self, object: Object) {
        if let Some(unlisted) = self.unlisted.get_mut(&object.kind())
            && let Some(key) = list_key(&object)
        {
            unlisted.remove(&key);
        }
        match object {
            Object::Service(service) => {
                let Some(name) = convert::service_name(
                    service.metadata.namespace.as_ref(),
                    service.metadata.name.as_ref(),
                ) else {
                    warn!("ignoring a Service without metadata.name");
                    return;
                };
                let info = convert::service(&service);
                // A new version with a malformed field its last good version did not have
                // (only a manifest can hold most: the API server refuses them) leaves that
                // version served, as a file that does not parse does: a typo in a port must
                // not take the Service's frontends away.
                if let Some(Ok(served)) = self.services.get(&name)
                    && let Some(why) = newly_invalid(&info, served)
                {
                    warn!(
                        service = %name,
                        reason = %why,
                        "Service not updated: its new version is invalid; its last good \
                         version stays served"
                    );
                    return;
                }
                if self.services.get(&name) != Some(&info) {
                    self.set_service(name.clone(), info);
                    self.changes.service_events += 1;
                    self.mark(name);
                }
            }
            Object::EndpointSlice(slice) => {
                let key = slice_key(&slice);
                let owner = convert::slice_owner(&slice);
                // A slice that moved to another Service (or lost its label) leaves the old.
                if self.slice_owners.get(&key) != owner.as_ref() {
                    self.remove_slice(&key);
                }
                let Some(owner) = owner else {
                    warn!(
                        slice = %format!("{}/{}", key.0, key.1),
                        "ignoring an EndpointSlice without the {} label",
                        convert::SERVICE_NAME_LABEL
                    );
                    return;
                };
                // FQDN slices too: they have no endpoints, but say why (explain, log).
                let info = convert::slice(&slice, &mut self.names);
                let slices = self.slices.entry(owner.clone()).or_default();
                let changed = match slices.binary_search_by(|s| s.name.cmp(&key.1)) {
                    Ok(at) if slices[at] == info => false,
                    Ok(at) => {
                        slices[at] = info;
                        true
                    }
                    Err(at) => {
                        // Most Services have one slice: no room for four.
                        slices.reserve_exact(1);
                        slices.insert(at, info);
                        true
                    }
                };
                if changed {
                    self.changes.endpoint_events += 1;
                    self.mark(owner.clone());
                }
                self.slice_owners.insert(key, owner);
            }
            Object::Node(node) => {
                let Some(name) = node.metadata.name.clone() else {
                    return;
                };
                let (labels, mut addresses, invalid) = convert::node(&node);
                let is_this_node = name == self.node_name;
                // An address that is not an IP (a typo: only a manifest can hold one) keeps
                // this node's last good addresses, which its external frontends are made of.
                if is_this_node && !invalid.is_empty() {
                    if invalid != self.invalid_node_addresses {
                        warn!(
                            node = name,
                            addresses = %crate::listed(&invalid),
                            "Node addresses that are not IPs: this node's addresses stay as \
                             they were (its NodePorts are served on them)"
                        );
                    }
                    if !self.this_node.addresses.is_empty() {
                        addresses.clone_from(&self.this_node.addresses);
                    }
                }
                if is_this_node {
                    self.invalid_node_addresses = invalid;
                }
                let labels_changed = self.node_labels.get(&name) != Some(&labels);
                let addresses_changed = is_this_node && self.this_node.addresses != addresses;
                if is_this_node {
                    self.this_node.labels = labels.clone();
                    self.this_node.addresses = addresses;
                }
                self.node_labels.insert(name.clone(), labels);
                if labels_changed || addresses_changed {
                    self.node_changed(is_this_node);
                }
            }
            object @ (Object::Pod(_) | Object::Namespace(_)) => {
                self.workloads.upsert_for(&self.node_name, object);
            }
        }
    }

    fn delete(&mut self, object: &Object) {
        match object {
            Object::Service(service) => {
                if let Some(name) = convert::service_name(
                    service.metadata.namespace.as_ref(),
                    service.metadata.name.as_ref(),
                ) && self.remove_service(&name)
                {
                    self.changes.service_events += 1;
                    self.mark(name);
                }
            }
            Object::EndpointSlice(slice) => self.remove_slice(&slice_key(slice)),
            Object::Node(node) => {
                if let Some(name) = &node.metadata.name {
                    self.remove_node(name);
                }
            }
            Object::Pod(_) | Object::Namespace(_) => self.workloads.delete(object),
        }
    }

    fn remove_slice(&mut self, key: &(String, String)) {
        let Some(owner) = self.slice_owners.remove(key) else {
            return;
        };
        if let Some(slices) = self.slices.get_mut(&owner) {
            if let Ok(at) = slices.binary_search_by(|s| s.name.cmp(&key.1)) {
                slices.remove(at);
                self.changes.endpoint_events += 1;
            }
            if slices.is_empty() {
                self.slices.remove(&owner);
            }
        }
        self.mark(owner);
    }

    fn remove_node(&mut self, name: &str) {
        if self.node_labels.remove(name).is_some() {
            let is_this_node = name == self.node_name;
            if is_this_node {
                self.this_node.labels.clear();
                self.this_node.addresses.clear();
            }
            self.node_changed(is_this_node);
        }
    }

    /// This node's labels and addresses shape every Service (zone hints, NodePorts);
    /// another node's labels only those using topology keys.
    fn node_changed(&mut self, is_this_node: bool) {
        self.changes.this_node |= is_this_node;
        let affected: Vec<ServiceName> = self
            .services
            .iter()
            .filter(|(_, info)| {
                is_this_node
                    || info
                        .as_ref()
                        .is_ok_and(|service| service.topology_keys.is_some())
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in affected {
            self.mark(name);
        }
    }

    fn mark(&mut self, name: ServiceName) {
        self.changes.services.insert(name);
    }
}

/// What makes a Service's new version `info` invalid where its `served` version was not:
/// invalid whole, or a part (a port, an address) invalid that was not before.
fn newly_invalid(info: &Result<ServiceInfo, SkipReason>, served: &ServiceInfo) -> Option<String> {
    match info {
        Err(SkipReason::Invalid(why)) => Some(why.clone()),
        Err(_) => None,
        Ok(info) => info
            .partial_skips
            .iter()
            .find(|skip| {
                matches!(skip.1, SkipReason::Invalid(_)) && !served.partial_skips.contains(skip)
            })
            .map(|(part, reason)| format!("{part}: {reason}")),
    }
}

fn slice_key(slice: &k8s_openapi::api::discovery::v1::EndpointSlice) -> (String, String) {
    (
        slice
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        slice.metadata.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests;

/// An object's namespace and name in a list ("" for a Node's namespace).
type ListKey = (String, String);

fn list_key(object: &Object) -> Option<ListKey> {
    match object {
        Object::Service(service) => convert::service_name(
            service.metadata.namespace.as_ref(),
            service.metadata.name.as_ref(),
        )
        .map(|name| (name.namespace, name.name)),
        Object::EndpointSlice(slice) => Some(slice_key(slice)),
        Object::Node(node) => Some((String::new(), node.metadata.name.clone()?)),
        Object::Pod(_) | Object::Namespace(_) => None,
    }
}
