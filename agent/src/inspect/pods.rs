//! Which path serves each pod of this node, read off the node itself: the socket hooks when
//! its network namespace's cookie is in their list (under `--socket-lb-scope pods`), the
//! per-packet path when its host-side device carries the pod program, else neither. The
//! pods are the namespaces the runtime pinned; reading them means entering each
//! (CAP_SYS_ADMIN), as the agent does.
use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
};

use serde::Serialize;

use crate::{dataplane, pod_namespaces::Pinned};

/// One pod's network namespace and the path that serves it.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct PodState {
    /// Where the runtime pinned it (/run/netns/...).
    pub namespace: String,
    pub addresses: Vec<IpAddr>,
    /// Its host-side devices (the peers of its veths).
    pub devices: Vec<String>,
    pub path: PodPathState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PodPathState {
    /// Its cookie is in the socket hooks' list: translated at connect().
    Socket,
    /// Not in the list; a device of its carries the per-packet program.
    PerPacket,
    /// Neither: its connections to Services are not translated on this node.
    None,
}

/// Every pinned namespace (holding `only`, if given) and its path, given the socket hooks'
/// list (`listed` cookies) and the devices the per-packet path serves.
pub fn pods(
    listed: &BTreeSet<u64>,
    pod_devices: &[String],
    only: Option<IpAddr>,
) -> std::io::Result<Vec<PodState>> {
    let names: HashMap<u32, String> = dataplane::links()?
        .into_iter()
        .map(|link| (link.index, link.name))
        .collect();
    Ok(crate::pod_namespaces::read_pinned()?
        .into_iter()
        .filter(|pinned| only.is_none_or(|only| pinned.addresses.contains(&only)))
        .map(|pinned| pod_state(pinned, listed, &names, pod_devices))
        .collect())
}

fn pod_state(
    pinned: Pinned,
    listed: &BTreeSet<u64>,
    names: &HashMap<u32, String>,
    pod_devices: &[String],
) -> PodState {
    let devices: Vec<String> = pinned
        .peers
        .iter()
        .filter_map(|index| names.get(index).cloned())
        .collect();
    let path = if listed.contains(&pinned.cookie) {
        PodPathState::Socket
    } else if devices.iter().any(|device| pod_devices.contains(device)) {
        PodPathState::PerPacket
    } else {
        PodPathState::None
    };
    PodState {
        namespace: pinned.path,
        addresses: pinned.addresses,
        devices,
        path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_decides_then_the_device() {
        let names = HashMap::from([(7, "veth7".to_owned()), (8, "veth8".to_owned())]);
        let served = ["veth7".to_owned()];
        let listed = BTreeSet::from([100]);
        let state = |cookie, peer| {
            let pinned = Pinned {
                path: "/run/netns/pod".to_owned(),
                cookie,
                addresses: Vec::new(),
                peers: vec![peer],
            };
            pod_state(pinned, &listed, &names, &served).path
        };
        assert_eq!(state(100, 7), PodPathState::Socket);
        assert_eq!(state(101, 7), PodPathState::PerPacket);
        assert_eq!(state(101, 8), PodPathState::None);
        // A peer the host does not have (a namespace plugged elsewhere).
        assert_eq!(state(101, 9), PodPathState::None);
    }
}
