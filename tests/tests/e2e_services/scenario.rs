//! What the scenarios share: the cluster's addresses, the answers a client gets (a pod's
//! name, [`REFUSED`] or [`not_served`]) on the path that serves it, and waiting until they
//! are as expected, as the agents follow the API asynchronously.
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
};

use socklb_tests::{
    Attempt, lan,
    testbed::{At, NodeId, Pod, PodPath, Testbed},
};

pub const ONE: NodeId = NodeId::One;
pub const TWO: NodeId = NodeId::Two;
/// The answer of a probe attempt that socklb refused: at connect() or sendmsg() by the
/// socket hooks, or by the per-packet path (a TCP reset, ICMP port unreachable for UDP).
pub const REFUSED: &str = "error: ECONNREFUSED";

/// The answer of a probe attempt at `at` whose destination was not translated: the error of
/// the route that stops it ([`PodPath::not_served`]).
pub fn not_served(tb: &Testbed, at: At) -> String {
    format!("error: {}", tb.path.not_served(at))
}

/// Whether the per-packet path serves a client at `at` (a pod, when the testbed's pods take
/// it); else the socket hooks do (or, outside, the external path).
pub fn per_packet(tb: &Testbed, at: At) -> bool {
    tb.path == PodPath::PerPacket && matches!(at, At::Pod(_))
}

/// A cluster IP, 10.96.0.`last`.
pub fn vip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, 0, last)
}

pub fn at(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}

/// The server names that answered (the first word of each reply), and `error: X` for
/// attempts that failed.
pub fn answered(attempts: &[Attempt]) -> BTreeSet<String> {
    attempts
        .iter()
        .map(|attempt| match (&attempt.reply, &attempt.error) {
            (Some(reply), _) => reply.split(' ').next().unwrap_or_default().to_owned(),
            (None, Some(error)) => format!("error: {error}"),
            (None, None) => "nothing".to_owned(),
        })
        .collect()
}

/// The address each answering server saw as the client's.
pub fn seen_by_servers(attempts: &[Attempt]) -> BTreeSet<IpAddr> {
    lan::answers(attempts)
        .into_iter()
        .map(|(_, seen)| seen.ip())
        .collect()
}

/// Waits until 12 `mode` attempts from `at` to `target` are answered by exactly `expected`
/// (server names, [`REFUSED`] or [`not_served`]): the agents follow API changes
/// asynchronously, and a random draw may miss a server once but not forever. An error is no
/// draw: 3 attempts show it (a node of the per-packet path answers a pod's untranslated
/// packets about once a second, the kernel's limit on "unreachable" errors, so each such
/// TCP attempt waits for its SYN's first retransmission).
pub fn wait_for(tb: &Testbed, at: At, mode: &str, target: SocketAddrV4, expected: &[&str]) {
    let attempts = match expected {
        [error] if error.starts_with("error: ") => 3,
        _ => 12,
    };
    let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    tb.eventually(
        &format!("{mode} to {target} answered by {expected:?}"),
        || {
            let got = answered(&tb.probe(at, mode, target, attempts));
            if got == expected {
                Ok(())
            } else {
                Err(format!("answered by {got:?}"))
            }
        },
    );
}

/// One request with curl at `at`: the name of the server that answered.
pub fn curl_answer(tb: &Testbed, at: At, target: SocketAddrV4) -> String {
    let body = tb
        .curl(at, target)
        .unwrap_or_else(|e| panic!("curl http://{target}/: {e}"));
    body.split(' ').next().unwrap_or_default().to_owned()
}

/// Names of pods, for sets of expected answers.
pub fn pod_names<'a>(pods: &[&'a Pod]) -> Vec<&'a str> {
    pods.iter().map(|pod| pod.name.as_str()).collect()
}

/// Connections (or their packets) of clients at `at` that `node`'s socklb refused or dropped
/// for want of a backend: the socket hooks' `no_backend`, or the per-packet path's
/// `pod_no_backend`.
pub fn no_backend(tb: &Testbed, node: NodeId, at: At) -> u64 {
    let counters = tb.inspect(node, None).counters;
    if per_packet(tb, at) {
        counters.pod_no_backend
    } else {
        counters.no_backend
    }
}

/// Asserts that `node`'s socklb served its pods over the testbed's path only: that path
/// translated (the socket hooks' `translated`, the per-packet path's `pod_flows`), the other
/// never did. For clusters whose clients are pods only.
pub fn assert_pods_path(tb: &Testbed, node: NodeId) {
    let counters = tb.inspect(node, None).counters;
    let (this, other) = match tb.path {
        PodPath::SocketLb => (counters.translated, counters.pod_flows),
        PodPath::PerPacket => (counters.pod_flows, counters.translated),
    };
    assert!(
        this > 0 && other == 0,
        "{} served its pods over {:?} only: {counters:?}",
        node.name(),
        tb.path
    );
}
