//! What `socklb inspect` shows, as `-o json` prints it.
use std::collections::HashSet;

use serde::Serialize;
use socklb_abi::Counters;

use super::{
    affinity::AffinityState,
    conntrack::ConntrackState,
    frontends::{FrontendState, ServiceLabel},
    pods::PodState,
};
use crate::{
    dataplane::PodDelivery, kernel::flow_filter, maps::frontend_filter, select::socket_path::Scope,
};

#[derive(Debug, Serialize)]
pub struct Inspection {
    pub frontends: Vec<FrontendState>,
    pub affinity: Vec<AffinityState>,
    pub conntrack: Vec<ConntrackState>,
    /// Datagrams whose first fragment's ports are remembered for their later fragments.
    pub fragments: usize,
    /// Sockets holding a record of what they were translated for (bounded by
    /// `--max-socket-records`).
    pub socket_records: u64,
    /// Which sockets the socket hooks translate (`--socket-lb-scope`), as the agent wrote
    /// it at its last sync; `None`: not written yet.
    pub socket_lb_scope: Option<Scope>,
    /// How pods' per-packet flows to backends on this node go on (`--pod-delivery`), as
    /// the agent wrote it; `None`: not written.
    pub pod_delivery: Option<PodDelivery>,
    /// Pods' network namespaces whose sockets the socket hooks translate besides the
    /// host's (`--socket-lb-scope pods`).
    pub pod_namespaces: usize,
    /// The pods' namespaces the runtime pinned, and which path serves each.
    pub pods: Vec<PodState>,
    /// Why `pods` is empty although there may be pods (the namespaces cannot be entered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods_unreadable: Option<String>,
    /// Devices whose traffic from outside the TC programs translate.
    pub external_devices: Vec<String>,
    /// Workloads' devices the per-packet path serves (`--pod-devices`).
    pub pod_devices: Vec<String>,
    pub counters: CountersView,
    /// How full the flow filter of the TC programs is (`None`: not pinned).
    pub flow_filter: Option<flow_filter::Fill>,
    pub frontend_filter: Option<frontend_filter::Fill>,
    /// How an agent in this container closes the sockets of removed backends.
    pub socket_destroy: crate::sweep::Expected,
}

/// The counters as `socklb inspect -o json` shows them (and tests and tools read them back):
/// the ABI's table, one field per counter.
pub type CountersView = Counters;

/// Keeps what belongs to the Service `namespace/name`: its frontends, and the affinity and
/// conntrack entries of those frontends.
pub fn only_service(
    mut inspection: Inspection,
    service: &crate::select::ServiceName,
) -> Inspection {
    let matches =
        |label: &ServiceLabel| label.namespace == service.namespace && label.name == service.name;
    inspection
        .frontends
        .retain(|f| f.service.as_ref().is_some_and(matches));
    let ids: HashSet<u32> = inspection.frontends.iter().map(|f| f.service_id).collect();
    inspection.affinity.retain(|a| ids.contains(&a.service_id));
    inspection.conntrack.retain(|c| ids.contains(&c.service_id));
    inspection
}
