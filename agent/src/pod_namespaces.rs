//! The network namespaces of this node's pods, for `--socket-lb-scope pods`: those the
//! node's runtime pinned, by cookie, with the addresses they hold (which pod each belongs
//! to); docs/operations.md, "The per-packet path", says which are found. A cookie is read
//! from inside its namespace, so each new one is entered once (CAP_SYS_ADMIN), and again
//! while it holds no address yet (the CNI plugs the pod after its namespace exists).
use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
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

#[derive(Default)]
pub struct PodNamespaces {
    /// What was read in each pinned namespace, by inode.
    seen: HashMap<u64, Inside>,
    /// Entering a namespace failed (no CAP_SYS_ADMIN): said once.
    refused: bool,
}

impl PodNamespaces {
    /// The cookies of the namespaces pinned now, but those holding one of `per_packet` (the
    /// addresses of pods the per-packet path serves).
    pub fn find(&mut self, per_packet: &[IpAddr]) -> BTreeSet<u64> {
        let pinned = netns::pinned();
        self.seen
            .retain(|inode, _| pinned.iter().any(|namespace| namespace.inode == *inode));
        let unread: Vec<Namespace> = pinned
            .into_iter()
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
                    .spawn(|| unread.iter().map(read_inside).collect::<Vec<_>>())
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
        self.seen
            .values()
            .filter(|inside| !inside.addresses.iter().any(|a| per_packet.contains(a)))
            .map(|inside| inside.cookie)
            .collect()
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
