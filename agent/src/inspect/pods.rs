//! Which path serves each pod of this node, read off the node itself: the socket hooks when
//! the agent's scope takes in every namespace (`--socket-lb-scope all`) or its network
//! namespace's cookie is in their list (`pods`), the per-packet path when its host-side
//! device carries the pod program, else neither. The pods are the namespaces the runtime
//! pinned; reading them means entering each (CAP_SYS_ADMIN), as the agent does.
use std::{collections::BTreeSet, net::IpAddr};

use serde::Serialize;

use crate::{
    dataplane::{self, Link},
    pod_namespaces::Pinned,
    select::socket_path::Scope,
};

/// One pod's network namespace and the path that serves it.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct PodState {
    /// Where the runtime pinned it (/run/netns/...).
    pub namespace: String,
    /// Its cookie, as `socklb trace` names a socket's namespace (`netns N`).
    pub cookie: u64,
    pub addresses: Vec<IpAddr>,
    /// Its host-side devices (veths whose peer is in it).
    pub devices: Vec<String>,
    pub path: PodPathState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PodPathState {
    /// In the socket hooks' scope (every namespace is, or its cookie is in their list):
    /// translated at connect().
    Socket,
    /// Not in the list; a device of its carries the per-packet program.
    PerPacket,
    /// Neither: its connections to Services are not translated on this node.
    None,
}

/// The socket hooks' reach: the agent's scope (`None`: not known, read as `pods`) and
/// their list of pods' namespaces (cookies).
pub struct SocketScope<'a> {
    pub scope: Option<Scope>,
    pub listed: &'a BTreeSet<u64>,
}

impl SocketScope<'_> {
    fn serves(&self, cookie: u64) -> bool {
        match self.scope {
            Some(Scope::All) => true,
            Some(Scope::Host) => false,
            Some(Scope::Pods) | None => self.listed.contains(&cookie),
        }
    }
}

/// Every pinned namespace (holding `only`, if given) and its path, given the socket hooks'
/// reach and the devices the per-packet path serves.
pub fn pods(
    socket: &SocketScope,
    pod_devices: &[String],
    only: Option<IpAddr>,
) -> std::io::Result<Vec<PodState>> {
    let links = dataplane::links()?;
    Ok(crate::pod_namespaces::read_pinned()?
        .into_iter()
        .filter(|pinned| only.is_none_or(|only| pinned.addresses.contains(&only)))
        .map(|pinned| pod_state(pinned, socket, &links, pod_devices))
        .collect())
}

fn pod_state(
    pinned: Pinned,
    socket: &SocketScope,
    links: &[Link],
    pod_devices: &[String],
) -> PodState {
    let devices: Vec<String> = links
        .iter()
        .filter(|link| pinned.id.is_some() && link.peer_netns == pinned.id)
        .map(|link| link.name.clone())
        .collect();
    let path = if socket.serves(pinned.cookie) {
        PodPathState::Socket
    } else if devices.iter().any(|device| pod_devices.contains(device)) {
        PodPathState::PerPacket
    } else {
        PodPathState::None
    };
    PodState {
        namespace: pinned.path,
        cookie: pinned.cookie,
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
        let link = |name: &str, peer_netns| Link {
            name: name.to_owned(),
            index: 0,
            workload_veth: true,
            peer_netns: Some(peer_netns),
        };
        let links = [link("veth7", 7), link("veth8", 8)];
        let served = ["veth7".to_owned()];
        let listed = BTreeSet::from([100]);
        let state = |scope, cookie, id| {
            let pinned = Pinned {
                path: "/run/netns/pod".to_owned(),
                cookie,
                addresses: Vec::new(),
                id,
            };
            let socket = SocketScope {
                scope,
                listed: &listed,
            };
            pod_state(pinned, &socket, &links, &served).path
        };
        for scope in [Some(Scope::Pods), None] {
            assert_eq!(state(scope, 100, Some(7)), PodPathState::Socket);
            assert_eq!(state(scope, 101, Some(7)), PodPathState::PerPacket);
            assert_eq!(state(scope, 101, Some(8)), PodPathState::None);
            // A namespace no link of this one reaches (plugged elsewhere).
            assert_eq!(state(scope, 101, None), PodPathState::None);
        }
        // `all`: the hooks translate every namespace's sockets, listed or not.
        assert_eq!(state(Some(Scope::All), 101, Some(7)), PodPathState::Socket);
        assert_eq!(state(Some(Scope::All), 101, None), PodPathState::Socket);
        // `host`: none of the pods', listed or not.
        assert_eq!(
            state(Some(Scope::Host), 100, Some(7)),
            PodPathState::PerPacket
        );
        assert_eq!(state(Some(Scope::Host), 100, Some(8)), PodPathState::None);
    }
}
