//! The host side of the workloads' interfaces, where the per-packet path attaches: a veth
//! of this namespace whose peer lives in another one, or what `--pod-devices` names
//! (docs/operations.md, "The per-packet path"). Links are asked of the kernel over
//! rtnetlink (/sys/class/net shows the namespace that mounted /sys), and a watch on the
//! link group says when they come and go.
use std::{
    io,
    os::fd::{AsFd, AsRawFd as _},
    str::FromStr,
    thread,
};

use netlink_packet_core::{NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::{
    RouteNetlinkMessage,
    link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage},
    nsid::{NsidAttribute, NsidMessage},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tokio::sync::mpsc;

use crate::netlink;

/// Which devices the per-packet path serves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PodDevices {
    /// Every veth whose peer is in another network namespace.
    #[default]
    Auto,
    /// None: only the socket path serves ClusterIPs.
    None,
    /// The devices named, each an exact name or a prefix ending in `*` (`cali*`, `lxc*`),
    /// and with `auto` among them what [`Self::Auto`] finds too.
    Named { auto: bool, patterns: Vec<String> },
}

impl FromStr for PodDevices {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "auto" => Ok(Self::Auto),
            "none" => Ok(Self::None),
            names => {
                let names: Vec<&str> = names.split(',').map(str::trim).collect();
                if names.contains(&"none") {
                    return Err("none stands alone: it serves no device".to_owned());
                }
                let patterns: Vec<String> = names
                    .iter()
                    .filter(|name| **name != "auto")
                    .map(|name| (*name).to_owned())
                    .collect();
                if let Some(name) = patterns.iter().find(|name| !valid_pattern(name)) {
                    return Err(format!(
                        "{name:?} is not a device name or a prefix ending in `*` (a device name \
                         has 1 to 15 characters, none of them '/', ':' or a space)"
                    ));
                }
                if patterns.iter().any(|name| name == LOOPBACK) {
                    return Err(format!(
                        "{LOOPBACK} carries the node's own traffic, which the socket hooks \
                         serve: it is not a workload's device"
                    ));
                }
                Ok(Self::Named {
                    auto: names.contains(&"auto"),
                    patterns,
                })
            }
        }
    }
}

/// The loopback device: never a pod device, whatever a prefix matches.
const LOOPBACK: &str = "lo";

/// A device name, or a prefix of one followed by `*`.
fn valid_pattern(pattern: &str) -> bool {
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    let fits = if pattern.ends_with('*') {
        name.len() < 15
    } else {
        (1..=15).contains(&name.len())
    };
    fits && !name.contains(['/', ':', '*']) && !name.chars().any(char::is_whitespace)
}

fn matches(pattern: &str, device: &str) -> bool {
    if device == LOOPBACK {
        return false;
    }
    match pattern.strip_suffix('*') {
        Some(prefix) => device.starts_with(prefix),
        None => device == pattern,
    }
}

/// A link of this network namespace, as far as choosing pod devices goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub index: u32,
    /// A veth whose peer is in another network namespace.
    pub workload_veth: bool,
    /// The id this namespace gives the peer's namespace ([`netns_id`]).
    pub peer_netns: Option<i32>,
}

impl PodDevices {
    /// The devices of `links` this setting serves, but never one of `external` (traffic
    /// from outside has its own program there), sorted.
    pub fn select(&self, links: &[Link], external: &[String]) -> Vec<String> {
        let mut selected: Vec<String> = links
            .iter()
            .filter(|link| !external.contains(&link.name))
            .filter(|link| match self {
                Self::Auto => link.workload_veth,
                Self::None => false,
                Self::Named { auto, patterns } => {
                    (*auto && link.workload_veth)
                        || patterns.iter().any(|pattern| matches(pattern, &link.name))
                }
            })
            .map(|link| link.name.clone())
            .collect();
        selected.sort();
        selected
    }

    /// The exact names of [`Self::Named`] that no link has (to be logged).
    pub fn missing(&self, links: &[Link]) -> Vec<String> {
        match self {
            Self::Named { patterns, .. } => patterns
                .iter()
                .filter(|pattern| !pattern.ends_with('*'))
                .filter(|name| !links.iter().any(|link| &link.name == *name))
                .cloned()
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// The links of this network namespace.
pub fn links() -> io::Result<Vec<Link>> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    netlink::send(
        &mut socket,
        NLM_F_REQUEST | NLM_F_DUMP,
        None,
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )?;
    let mut links = Vec::new();
    netlink::receive_dump(&mut socket, "link dump", |message| {
        if let RouteNetlinkMessage::NewLink(link) = message {
            links.extend(link_of(&link));
        }
    })?;
    Ok(links)
}

fn link_of(message: &LinkMessage) -> Option<Link> {
    let mut name = None;
    let mut veth = false;
    let mut peer_elsewhere = false;
    let mut peer_netns = None;
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(text) => name = Some(text.clone()),
            LinkAttribute::LinkInfo(infos) => {
                veth = infos
                    .iter()
                    .any(|info| matches!(info, LinkInfo::Kind(InfoKind::Veth)));
            }
            // Present only when the peer is in another namespace.
            LinkAttribute::LinkNetNsId(id) => {
                peer_elsewhere = true;
                peer_netns = Some(*id);
            }
            _ => {}
        }
    }
    let workload_veth = veth && peer_elsewhere;
    Some(Link {
        name: name?,
        index: message.header.index,
        workload_veth,
        peer_netns: peer_netns.filter(|_| workload_veth),
    })
}

/// The id this network namespace gives `namespace` (RTM_GETNSID), by which its links name
/// the namespace of their peer; `None` while it has given none (no link reaches it).
pub fn netns_id(namespace: &impl AsFd) -> io::Result<Option<i32>> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let fd = u32::try_from(namespace.as_fd().as_raw_fd()).map_err(io::Error::other)?;
    let mut message = NsidMessage::default();
    message.attributes.push(NsidAttribute::Fd(fd));
    netlink::send(
        &mut socket,
        NLM_F_REQUEST,
        None,
        RouteNetlinkMessage::GetNsId(message),
    )?;
    let answer = netlink::receive_one(&mut socket, "namespace id")?;
    let RouteNetlinkMessage::NewNsId(answer) = answer else {
        return Ok(None);
    };
    Ok(answer
        .attributes
        .iter()
        .find_map(|attribute| match attribute {
            NsidAttribute::Id(id) if *id >= 0 => Some(*id),
            _ => None,
        }))
}

/// `RTMGRP_LINK`: the multicast group of link changes.
const RTMGRP_LINK: u32 = 1;

/// Says (on the channel it returns) that links came or went in this network namespace:
/// one message per burst of changes the receiver has not yet taken. The watch runs on a
/// thread of its own for the agent's life.
pub fn watch_links() -> io::Result<mpsc::Receiver<()>> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind(&SocketAddr::new(0, RTMGRP_LINK))?;
    let (changed, receiver) = mpsc::channel(1);
    thread::Builder::new()
        .name("socklb-links".into())
        .spawn(move || {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                match socket.recv(&mut &mut buffer[..], 0) {
                    Ok(_) => {}
                    // Too many changes at once for the socket's buffer: links changed all
                    // the same.
                    Err(error) if error.raw_os_error() == Some(libc::ENOBUFS) => {}
                    Err(error) => {
                        tracing::warn!(%error, "the watch of network devices stopped: new pod devices are picked up at the next full resync");
                        return;
                    }
                }
                match changed.try_send(()) {
                    Ok(()) | Err(mpsc::error::TrySendError::Full(())) => {}
                    Err(mpsc::error::TrySendError::Closed(())) => return,
                }
            }
        })?;
    Ok(receiver)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, workload_veth: bool) -> Link {
        Link {
            name: name.to_owned(),
            index: 0,
            workload_veth,
            peer_netns: None,
        }
    }

    #[test]
    fn auto_takes_veths_whose_peer_is_elsewhere_but_not_external_devices() {
        let links = [
            link("eth0", false),
            link("cali1", true),
            link("veth0", true),
            link("lo", false),
        ];
        let external = ["veth0".to_owned()];
        assert_eq!(PodDevices::Auto.select(&links, &external), ["cali1"]);
        assert!(PodDevices::None.select(&links, &external).is_empty());
    }

    #[test]
    fn named_devices_and_prefixes() {
        let devices: PodDevices = "cali*,tap0,gone0".parse().expect("valid");
        let links = [
            link("cali1", true),
            link("cali2", false),
            link("tap0", false),
            link("eth0", false),
        ];
        assert_eq!(devices.select(&links, &[]), ["cali1", "cali2", "tap0"]);
        assert_eq!(devices.missing(&links), ["gone0"]);
    }

    #[test]
    fn auto_among_names_adds_what_it_finds_and_a_prefix_never_takes_loopback() {
        let links = [
            link("veth1", true),
            link("tap0", false),
            link("eth0", false),
            link("lo", false),
        ];
        let devices: PodDevices = "auto, tap0".parse().expect("valid");
        assert_eq!(devices.select(&links, &[]), ["tap0", "veth1"]);
        assert!(devices.missing(&links).is_empty(), "auto is no device name");
        let everything: PodDevices = "*".parse().expect("valid");
        assert_eq!(
            everything.select(&links, &["eth0".to_owned()]),
            ["tap0", "veth1"]
        );
    }

    #[test]
    fn bad_patterns_are_refused_by_name() {
        for bad in ["", "a/b", "x*y", "sixteen-chars-xx", "a b"] {
            let error = bad.parse::<PodDevices>().expect_err(bad);
            assert!(error.contains("is not a device name"), "{bad}: {error}");
        }
        assert_eq!("auto".parse(), Ok(PodDevices::Auto));
        assert_eq!("none".parse(), Ok(PodDevices::None));
        for alone in ["none,tap0", "auto,none"] {
            let error = alone.parse::<PodDevices>().expect_err(alone);
            assert!(error.contains("none stands alone"), "{alone}: {error}");
        }
        let error = "tap0,lo".parse::<PodDevices>().expect_err("lo");
        assert!(error.contains("not a workload's device"), "{error}");
    }
}
