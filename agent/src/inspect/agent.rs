//! What the agent runs with, as it wrote it into the node map: the socket hooks' scope, how
//! pods' flows to local backends are delivered, and its network namespace, which tells
//! whether this process sees the devices it serves.
use std::path::Path;

use aya::maps::{Array, MapData};
use socklb_abi::{
    NodeConfig, POD_DELIVERY_DIRECT, POD_DELIVERY_KERNEL, SOCKET_LB_SCOPE_ALL,
    SOCKET_LB_SCOPE_HOST, SOCKET_LB_SCOPE_PODS, map_names,
};

use super::{error::InspectError, pinned::open};
use crate::{dataplane::PodDelivery, kernel::pins, select::socket_path::Scope};

/// The agent's settings this process needs to say which path serves a pod.
pub(super) struct AgentView {
    /// `None`: not written yet (the agent has not synced), or by an agent from before.
    pub scope: Option<Scope>,
    /// `--pod-delivery`; `None`: no node map.
    pub pod_delivery: Option<PodDelivery>,
    /// The agent runs in another network namespace than this process: the devices this
    /// process sees are not the ones it serves.
    pub elsewhere: bool,
}

pub(super) fn read(pin_dir: &Path) -> Result<AgentView, InspectError> {
    let name = map_names::NODE;
    if !pins::map_pin(pin_dir, name).exists() {
        return Ok(AgentView {
            scope: None,
            pod_delivery: None,
            elsewhere: false,
        });
    }
    let map: Array<MapData, NodeConfig> = open(pin_dir, name)?
        .try_into()
        .map_err(InspectError::reading(name))?;
    let node = map.get(&0, 0).map_err(InspectError::reading(name))?;
    let scope = match node.socket_lb_scope {
        SOCKET_LB_SCOPE_ALL => Some(Scope::All),
        SOCKET_LB_SCOPE_HOST => Some(Scope::Host),
        SOCKET_LB_SCOPE_PODS => Some(Scope::Pods),
        _ => None,
    };
    let pod_delivery = match node.pod_delivery {
        POD_DELIVERY_KERNEL => Some(PodDelivery::Kernel),
        POD_DELIVERY_DIRECT => Some(PodDelivery::Direct),
        _ => None,
    };
    Ok(AgentView {
        scope,
        pod_delivery,
        elsewhere: crate::dataplane::outside_netns(node.agent_netns_cookie),
    })
}
