//! The network namespaces of this node's pods, for `--socket-lb-scope pods`: those the
//! node's runtime pinned, by cookie, with the addresses they hold (which pod each belongs
//! to); docs/operations.md, "The per-packet path", says which are found. A cookie is read
//! from inside its namespace, so each new one is entered once (CAP_SYS_ADMIN), and again
//! while it holds no address yet (the CNI plugs the pod after its namespace exists).
use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    time::{Duration, Instant},
};

use tracing::{info, warn};

use crate::{
    dataplane,
    sweep::netns::{self, Namespace},
};

/// What was read inside one namespace.
#[derive(Clone, Debug)]
struct Inside {
    cookie: u64,
    addresses: Vec<IpAddr>,
}

/// How long a namespace found without an address is read again at every
/// [`PodNamespaces::waiting`] recheck: a CNI plugs a pod within seconds of making its
/// namespace; one without an address for longer is no pod's, or one that waits for
/// something else (read again at each sync).
const ADDRESS_WAIT: Duration = Duration::from_secs(60);

#[derive(Default)]
pub struct PodNamespaces {
    /// What was read in each pinned namespace, by inode.
    seen: HashMap<u64, Inside>,
    /// When each namespace was first found without an address, by inode.
    addressless_since: HashMap<u64, Instant>,
    /// Entering a namespace failed (no CAP_SYS_ADMIN): said once.
    refused: bool,
}

/// Which pods' namespaces the socket hooks serve.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// Their cookies: every namespace pinned now, but those the per-packet path serves.
    pub socket: BTreeSet<u64>,
    /// Addresses of pods the per-packet path would serve whose namespaces no served device
    /// leads to: they stay in `socket`.
    pub unserved: BTreeSet<IpAddr>,
    /// Addresses of pods the per-packet path would serve that no pinned namespace holds
    /// (left empty while one cannot be read): such a pod's namespace is not found, so not
    /// left out of `socket` if pinned, nor known to be served if pinned elsewhere.
    pub unfound: BTreeSet<IpAddr>,
}

impl PodNamespaces {
    /// Whether a namespace found lately holds no address yet: its pod's path is known only
    /// once it does, so it is read again soon rather than at the next sync (a meshed pod
    /// would meanwhile stay in the socket hooks, and its sidecar see backends).
    pub fn waiting(&self) -> bool {
        self.addressless_since
            .values()
            .any(|since| since.elapsed() < ADDRESS_WAIT)
    }

    /// The namespaces pinned now, and which of them hold one of `per_packet` (the
    /// addresses of pods the per-packet path serves) behind one of `served_devices` (the
    /// pod devices its programs are attached to): those are left out of the socket hooks.
    pub fn find(&mut self, per_packet: &[IpAddr], served_devices: &[String]) -> Found {
        let pinned = netns::pinned();
        self.seen
            .retain(|inode, _| pinned.iter().any(|namespace| namespace.inode == *inode));
        let unread: Vec<&Namespace> = pinned
            .iter()
            .filter(|namespace| {
                self.seen
                    .get(&namespace.inode)
                    .is_none_or(|inside| inside.addresses.is_empty())
            })
            .collect();
        if !unread.is_empty() {
            let new = unread
                .iter()
                .filter(|namespace| !self.seen.contains_key(&namespace.inode))
                .count();
            // A thread of its own: it is left in the last namespace it entered.
            let read = std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        unread
                            .iter()
                            .map(|namespace| read_inside(namespace))
                            .collect::<Vec<_>>()
                    })
                    .join()
            });
            for (namespace, inside) in unread.iter().zip(read.unwrap_or_default()) {
                match inside {
                    Ok(inside) => {
                        self.seen.insert(namespace.inode, inside);
                    }
                    Err(error) if !self.refused => {
                        self.refused = true;
                        warn!(
                            namespace = %namespace.path.display(),
                            %error,
                            "cannot enter the pods' network namespaces (CAP_SYS_ADMIN: the chart's \
                             closeSocketsInPods): their sockets are not translated at connect(); \
                             the per-packet path on their devices serves them"
                        );
                    }
                    Err(_) => {}
                }
            }
            if new > 0 {
                info!(
                    new,
                    namespaces = self.seen.len(),
                    "pods' network namespaces found"
                );
            }
        }
        let now = Instant::now();
        self.addressless_since.retain(|inode, _| {
            self.seen
                .get(inode)
                .is_some_and(|inside| inside.addresses.is_empty())
        });
        for (inode, inside) in &self.seen {
            if inside.addresses.is_empty() {
                self.addressless_since.entry(*inode).or_insert(now);
            }
        }
        let mut found = Found::default();
        let mut served_pods = BTreeSet::new();
        let mut links = None;
        for namespace in &pinned {
            let Some(inside) = self.seen.get(&namespace.inode) else {
                continue;
            };
            let pods: Vec<IpAddr> = inside
                .addresses
                .iter()
                .filter(|address| per_packet.contains(address))
                .copied()
                .collect();
            if pods.is_empty() {
                found.socket.insert(inside.cookie);
                continue;
            }
            // Listed only when a pod is served per packet (a netlink dump of its own). Links
            // that cannot be listed tell nothing: the pod stays served per packet.
            let links = links.get_or_insert_with(|| dataplane::links().ok());
            let served = links.as_ref().is_none_or(|links| {
                let id = dataplane::netns_id(&namespace.file).ok().flatten();
                id.is_some()
                    && links
                        .iter()
                        .any(|link| link.peer_netns == id && served_devices.contains(&link.name))
            });
            if served {
                served_pods.extend(pods);
            } else {
                found.socket.insert(inside.cookie);
                found.unserved.extend(pods);
            }
        }
        // A pod is served if one namespace holding its address is (another may hold it too:
        // a namespace not of this node's pods, such as a nested cluster's).
        found
            .unserved
            .retain(|address| !served_pods.contains(address));
        // Namespaces without an address were read again above: a pod's address is in its
        // status only once the CNI has given it. One that could not be read may hold any.
        let read: Vec<&Inside> = pinned
            .iter()
            .filter_map(|namespace| self.seen.get(&namespace.inode))
            .collect();
        if read.len() == pinned.len() {
            let held: BTreeSet<&IpAddr> =
                read.iter().flat_map(|inside| &inside.addresses).collect();
            found.unfound = per_packet
                .iter()
                .filter(|address| !held.contains(address))
                .copied()
                .collect();
        }
        found
    }
}

fn read_inside(namespace: &Namespace) -> std::io::Result<Inside> {
    netns::enter(namespace)?;
    let cookie = dataplane::netns_cookie().map_err(std::io::Error::other)?;
    let addresses = dataplane::local_addresses()?
        .into_iter()
        .map(|(address, _)| address)
        .filter(|address| !address.is_loopback() && !is_link_local(address))
        .collect();
    Ok(Inside { cookie, addresses })
}

/// A pinned network namespace, as `socklb inspect` shows it.
#[derive(Clone, Debug)]
pub struct Pinned {
    pub path: String,
    pub cookie: u64,
    pub addresses: Vec<IpAddr>,
    /// The id this namespace gives it, which the links to it carry.
    pub id: Option<i32>,
}

/// Every namespace pinned now, read from inside (CAP_SYS_ADMIN).
pub fn read_pinned() -> std::io::Result<Vec<Pinned>> {
    let pinned = netns::pinned();
    // A thread of its own: it is left in the last namespace it entered.
    let read = std::thread::scope(|scope| {
        scope
            .spawn(|| pinned.iter().map(read_inside).collect::<Vec<_>>())
            .join()
    })
    .map_err(|_| std::io::Error::other("reading the pinned namespaces panicked"))?;
    pinned
        .iter()
        .zip(read)
        .map(|(namespace, inside)| {
            let inside = inside?;
            Ok(Pinned {
                path: namespace.path.display().to_string(),
                cookie: inside.cookie,
                addresses: inside.addresses,
                id: dataplane::netns_id(&namespace.file)?,
            })
        })
        .collect()
}

/// fe80::/10: every IPv6 interface has one; no pod is known by it.
fn is_link_local(address: &IpAddr) -> bool {
    matches!(address, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}
