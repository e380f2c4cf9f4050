//! What the scenarios share: the cluster's addresses, the answers a client gets (a pod's
//! name, [`REFUSED`] or [`NOT_SERVED`]) and waiting until they are as expected, as the
//! agents follow the API asynchronously.
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
};

use socklb_tests::{
    Attempt, lan,
    testbed::{At, NodeId, Pod, Testbed},
};

pub const ONE: NodeId = NodeId::One;
pub const TWO: NodeId = NodeId::Two;
/// The answer of a probe attempt that socklb refused.
pub const REFUSED: &str = "error: ECONNREFUSED";
/// The answer of a probe attempt whose destination was not translated (blackhole route).
pub const NOT_SERVED: &str = "error: EINVAL";

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
/// (server names, [`REFUSED`] or [`NOT_SERVED`]): the agents follow API changes
/// asynchronously, and a random draw may miss a server once but not forever.
pub fn wait_for(tb: &Testbed, at: At, mode: &str, target: SocketAddrV4, expected: &[&str]) {
    let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    tb.eventually(
        &format!("{mode} to {target} answered by {expected:?}"),
        || {
            let got = answered(&tb.probe(at, mode, target, 12));
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

/// Connections `node`'s socklb refused for want of a backend.
pub fn no_backend(tb: &Testbed, node: NodeId) -> u64 {
    tb.inspect(node, None).counters.no_backend
}
