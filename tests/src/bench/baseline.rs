//! What every namespace of a benchmark gets, whatever the peer: the conditions of a node
//! with a CNI and of its pods, and the TIME_WAIT settings that keep thousands of connections
//! per second from faking the ratios.
//!
//! A node's namespace ([`node`]):
//! - Conntrack on: an nft table `inet slbcni` whose input, forward and output chains accept
//!   `ct state established,related` (what CNIs and kubeadm leave on a node), so that the
//!   peers without netfilter rules of their own (direct, socklb) pay conntrack like
//!   kube-proxy's do.
//! - NAT hooks on: an nft table `ip slbcninat` with the masquerade of pod traffic leaving the
//!   pod network that flannel, kindnet and Calico install (it matches none of the
//!   benchmarks' traffic through a node). The kernel runs NAT hooks on every packet of a
//!   namespace where a NAT chain exists, as kube-proxy's own chains make it do on its peers.
//! - A short conntrack TIME_WAIT timeout: closed flows leave the table within a second
//!   instead of two minutes.
//!
//! A pod's namespace, or a client's outside the node ([`pod`]): no netfilter, as a pod's
//! namespace has on a node (CNIs and kubelet leave it alone; only a mesh's sidecar adds
//! rules). With the node's tables there, a pod's connection to a Service address would also
//! be tracked and masqueraded inside the pod: a cost only the paths that leave the address
//! to the node would pay.
//!
//! Every namespace: no TIME_WAIT sockets (`net.ipv4.tcp_max_tw_buckets=0`): a SYN that
//! reuses a port still in TIME_WAIT fails about half the time on this kernel (random
//! timestamp offsets), and tens of thousands of TIME_WAIT sockets make connect() search for
//! a port.
use std::{fs::File, io::Write as _, process::Stdio};

use anyhow::{Context as _, ensure};

use super::netns::{in_netns, run_in};

/// One line for a report.
pub const SUMMARY: &str = "every node's namespace: conntrack on (nft table inet slbcni: ct \
                           state established,related accept), NAT hooks on (nft table ip \
                           slbcninat: a CNI's masquerade of pod traffic leaving \
                           10.244.0.0/16), conntrack TCP TIME_WAIT timeout 1 s; pods' and \
                           outside clients' namespaces: no netfilter; every namespace: \
                           net.ipv4.tcp_max_tw_buckets=0";

/// The CNI-like tables, in `nft -f` syntax.
const CNI_TABLES: &str = "table inet slbcni {
  chain input {
    type filter hook input priority filter; policy accept;
    ct state established,related accept
  }
  chain forward {
    type filter hook forward priority filter; policy accept;
    ct state established,related accept
  }
  chain output {
    type filter hook output priority filter; policy accept;
    ct state established,related accept
  }
}
table ip slbcninat {
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 masquerade
  }
}
";

/// Closed TCP sockets go at once instead of lingering in TIME_WAIT.
const NO_TIME_WAIT_SOCKETS: &str = "net.ipv4.tcp_max_tw_buckets=0";

/// Seconds a closed TCP flow stays in conntrack (the kernel's default is 120).
const CONNTRACK_TIME_WAIT_S: u32 = 1;

/// A node's namespace: the CNI's tables, then the TIME_WAIT settings.
pub fn node(netns: &File) -> anyhow::Result<()> {
    let mut nft = in_netns(netns, "nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run nft: install nftables (`cargo xtask setup` does)")?;
    nft.stdin
        .take()
        .context("nft stdin")?
        .write_all(CNI_TABLES.as_bytes())
        .context("write the CNI tables to nft")?;
    let output = nft.wait_with_output().context("wait for nft")?;
    ensure!(
        output.status.success(),
        "nft -f of the CNI tables failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // After the table: conntrack's sysctls exist in a namespace once conntrack is on there.
    let time_wait =
        format!("net.netfilter.nf_conntrack_tcp_timeout_time_wait={CONNTRACK_TIME_WAIT_S}");
    run_in(netns, "sysctl", &["-qw", NO_TIME_WAIT_SOCKETS, &time_wait])
}

/// A pod's namespace, or a client's outside the node: no netfilter, no TIME_WAIT sockets.
pub fn pod(netns: &File) -> anyhow::Result<()> {
    run_in(netns, "sysctl", &["-qw", NO_TIME_WAIT_SOCKETS])
}
