//! `socklb inspect`: what the pinned maps hold, read directly from bpffs, so it works while
//! the agent is down: frontends with their backends per scope, session-affinity entries,
//! conntrack entries of traffic from outside, the kernel programs' counters, and which path
//! serves each pod (`pods`).
//!
//! One module per kind of state: [`frontends`], [`affinity`], [`conntrack`], [`pods`], each
//! read from its maps, and [`agent`], what the agent runs with; [`inspection`] is what they
//! make together, [`mod@table`] how it is shown; [`pinned`] opens the pins and decodes
//! addresses.
mod affinity;
mod agent;
mod conntrack;
mod error;
mod frontends;
mod inspection;
mod pinned;
mod pods;
mod table;

use std::{collections::BTreeSet, net::IpAddr, path::Path};

use aya::maps::{Array, MapData, PerCpuArray};
use socklb_abi::{Counters, SocketRecordCount, map_names};

pub use self::{
    affinity::AffinityState,
    conntrack::ConntrackState,
    error::InspectError,
    frontends::{FrontendState, ServiceLabel},
    inspection::{CountersView, Inspection, only_service},
    pods::{PodPathState, PodState},
    table::table,
};
use self::{
    pinned::{entries_of, open, open6},
    pods::SocketScope,
};
use crate::{
    kernel::{
        attach::tc::{DeviceRole, served_devices},
        flow_filter,
    },
    maps::frontend_filter,
};

/// Reads the maps under `pin_dir`, both families; `only` keeps the frontends on that
/// address and their affinity entries, and the flows with that address on either side.
pub fn inspect(pin_dir: &Path, only: Option<IpAddr>) -> Result<Inspection, InspectError> {
    let (frontends, slot_ids) = frontends::read(pin_dir, only)?;
    let affinity = affinity::read(pin_dir, &frontends, &slot_ids, only)?;
    let conntrack = conntrack::read(pin_dir, only)?;
    let fragments = conntrack::fragments(pin_dir)?;
    let counters_map: PerCpuArray<MapData, Counters> = open(pin_dir, map_names::COUNTERS)?
        .try_into()
        .map_err(InspectError::reading(map_names::COUNTERS))?;
    let per_cpu = counters_map
        .get(&0, 0)
        .map_err(InspectError::reading(map_names::COUNTERS))?;
    let sum = Counters::sum(per_cpu.iter());
    let socket_records = socket_records(pin_dir)?;
    let listed: BTreeSet<u64> = entries_of(
        open6(pin_dir, map_names::SOCKET_LB_NAMESPACES)?,
        map_names::SOCKET_LB_NAMESPACES,
        |cookie: u64, _: u8| Some(cookie),
    )?
    .into_iter()
    .collect();
    let devices = served_devices(pin_dir).map_err(|source| InspectError::Devices {
        source: Box::new(source),
    })?;
    let of_role = |wanted| {
        devices
            .iter()
            .filter(|(_, role)| *role == wanted)
            .map(|(device, _)| device.clone())
            .collect()
    };
    let pod_devices: Vec<String> = of_role(DeviceRole::Pod);
    let agent = agent::read(pin_dir)?;
    let socket_scope = SocketScope {
        scope: agent.scope,
        listed: &listed,
    };
    // Its devices are the agent's namespace's: matched against this one's, every pod would
    // read as served by neither path.
    let pods = if agent.elsewhere {
        Err(
            "this process is not in the agent's network namespace, whose devices tell which \
             path serves a pod: run inspect where the agent runs (in its pod, or through \
             nsenter --net=/proc/<agent pid>/ns/net)"
                .to_owned(),
        )
    } else {
        pods::pods(&socket_scope, &pod_devices, only).map_err(|error| {
            format!(
                "cannot enter the pods' network namespaces ({error}): run as root, or in the \
                 agent's container with CAP_SYS_ADMIN"
            )
        })
    };
    let (pods, pods_unreadable) = match pods {
        Ok(pods) => (pods, None),
        Err(why) => (Vec::new(), Some(why)),
    };
    Ok(Inspection {
        socket_lb_scope: agent.scope,
        pod_delivery: agent.pod_delivery,
        external_devices: of_role(DeviceRole::External),
        pod_devices,
        pods,
        pods_unreadable,
        frontends,
        affinity,
        conntrack,
        fragments,
        socket_records,
        pod_namespaces: listed.len(),
        counters: sum,
        flow_filter: flow_filter::fill(pin_dir).map_err(|source| InspectError::FlowFilter {
            source: Box::new(source),
        })?,
        frontend_filter: frontend_filter::fill(pin_dir).map_err(|source| {
            InspectError::FrontendFilter {
                source: Box::new(source),
            }
        })?,
        socket_destroy: crate::sweep::Expected::probe(),
    })
}

/// How many sockets hold a record: the programs' count, which a release racing another may
/// leave a moment below zero.
fn socket_records(pin_dir: &Path) -> Result<u64, InspectError> {
    let name = map_names::SOCKET_RECORD_COUNT;
    let map: Array<MapData, SocketRecordCount> = open(pin_dir, name)?
        .try_into()
        .map_err(InspectError::reading(name))?;
    let count = map.get(&0, 0).map_err(InspectError::reading(name))?;
    Ok(u64::try_from(count.live).unwrap_or(0))
}
