//! What a test checks of the answers through the LAN: which backend answered and the
//! address it saw, and socklb's counters.
use std::net::SocketAddr;

use super::{Addresses, LanNode, addresses};
use crate::{clients::Attempt, family::Family, sandbox::Sandbox};

impl LanNode {
    /// `count` probes (`mode`: tcp, udp) from the client to `frontend`: every one translated
    /// ([`Addresses::assert_translated`]), and both pods answered.
    pub fn assert_both_pods_serve(&self, mode: &str, frontend: &str, count: u32) {
        let attempts = self.lan.client.probe(mode, frontend, count);
        self.a.assert_translated(&attempts, frontend);
        assert_eq!(
            servers_of(&attempts),
            ["pod1", "pod2"],
            "both backends serve"
        );
    }
}

impl Addresses {
    /// Every reply came from a backend that saw the client's own address (pod1) or node1's
    /// address with a SNAT port (pod2), and the client saw the frontend as its peer.
    pub fn assert_translated(&self, attempts: &[Attempt], frontend: &str) {
        for attempt in attempts {
            assert_eq!(
                attempt.peer.as_deref(),
                Some(frontend),
                "the client must see the frontend: {attempt:?}"
            );
        }
        for (server, seen) in answers(attempts) {
            match server.as_str() {
                "pod1" => assert_eq!(
                    seen.ip().to_string(),
                    self.client,
                    "local backend: source kept"
                ),
                "pod2" => {
                    assert_eq!(
                        seen.ip().to_string(),
                        self.node1,
                        "remote backend: SNAT to node1"
                    );
                    assert!(
                        (61000..=65535).contains(&seen.port()),
                        "SNAT port {} outside the default range",
                        seen.port()
                    );
                }
                other => panic!("unexpected server {other}"),
            }
        }
    }
}

/// Splits probe replies `<server> <address:port it saw>` into (server, address seen).
pub fn answers(attempts: &[Attempt]) -> Vec<(String, SocketAddr)> {
    attempts
        .iter()
        .map(|attempt| {
            let reply = attempt
                .reply
                .as_deref()
                .unwrap_or_else(|| panic!("attempt failed: {attempt:?}"));
            let (server, seen) = reply
                .split_once(' ')
                .unwrap_or_else(|| panic!("unexpected reply {reply:?}"));
            (
                server.to_owned(),
                seen.parse()
                    .unwrap_or_else(|e| panic!("address in {reply:?}: {e}")),
            )
        })
        .collect()
}

/// [`Addresses::assert_translated`] over IPv4.
pub fn assert_translated(attempts: &[Attempt], frontend: &str) {
    addresses(Family::V4).assert_translated(attempts, frontend);
}

pub fn servers_of(attempts: &[Attempt]) -> Vec<String> {
    let mut servers: Vec<String> = answers(attempts).into_iter().map(|(s, _)| s).collect();
    servers.sort();
    servers.dedup();
    servers
}

/// The counters as `socklb inspect` shows them, run as in the agent's container.
pub fn counters(sandbox: &Sandbox) -> socklb_agent::inspect::CountersView {
    serde_json::from_value(sandbox.inspect()["counters"].clone()).expect("inspect's counters")
}
