//! The network namespaces of this node's pods, by cookie, for `--socket-lb-scope pods`:
//! those the node's runtime pinned (/run/netns, /var/run/netns: containerd, CRI-O and `ip
//! netns add` pin every pod's). A namespace made inside a pod (a nested cluster's, a
//! container's within the pod) is pinned, if at all, in the pod's own mount namespace, so
//! it is not found here, and its sockets keep their destinations. A namespace's cookie is
//! read from a socket made inside it, so each new one is entered once (CAP_SYS_ADMIN).
use std::collections::{BTreeSet, HashMap};

use tracing::{info, warn};

use crate::{
    dataplane,
    sweep::netns::{self, Namespace},
};

#[derive(Default)]
pub struct PodNamespaces {
    /// Cookie of each pinned namespace seen, by inode.
    cookies: HashMap<u64, u64>,
    /// Entering a namespace failed (no CAP_SYS_ADMIN): said once.
    refused: bool,
}

impl PodNamespaces {
    /// The cookies of the namespaces pinned now; those not yet seen are entered for theirs.
    pub fn find(&mut self) -> BTreeSet<u64> {
        let pinned = netns::pinned();
        self.cookies
            .retain(|inode, _| pinned.iter().any(|namespace| namespace.inode == *inode));
        let new: Vec<Namespace> = pinned
            .into_iter()
            .filter(|namespace| !self.cookies.contains_key(&namespace.inode))
            .collect();
        if !new.is_empty() {
            // A thread of its own: it is left in the last namespace it entered.
            let found = std::thread::scope(|scope| {
                scope
                    .spawn(|| new.iter().map(cookie_of).collect::<Vec<_>>())
                    .join()
            });
            for (namespace, cookie) in new.iter().zip(found.unwrap_or_default()) {
                match cookie {
                    Ok(cookie) => {
                        self.cookies.insert(namespace.inode, cookie);
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
            info!(
                namespaces = self.cookies.len(),
                "pods' network namespaces found"
            );
        }
        self.cookies.values().copied().collect()
    }
}

fn cookie_of(namespace: &Namespace) -> std::io::Result<u64> {
    netns::enter(namespace)?;
    dataplane::netns_cookie().map_err(std::io::Error::other)
}
