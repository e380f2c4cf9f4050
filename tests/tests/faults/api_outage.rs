//! The API server goes away for 30 s: the datapath keeps serving what it had (no list that
//! failed deletes anything), and once the server is back (answering 403 for a moment, as a
//! restarted server does while its authorizer's cache warms) a change is applied within 3 s.
//! One out of reach from the start is named in the log, with the cause.
use std::{
    collections::BTreeSet,
    net::SocketAddr,
    time::{Duration, Instant},
};

use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox, cluster::kubeconfig as kubeconfig_for,
    fake_apiserver::FakeApiServer, node_yaml, service_yaml, slice_yaml,
};

const VIP: &str = "10.96.30.10:80";
const OUTAGE: Duration = Duration::from_secs(30);
/// How long the restarted server refuses every request with 403 Forbidden.
const WARMING: Duration = Duration::from_secs(1);
/// The guarantee: a change made when the server is back is programmed this soon.
const APPLIED_WITHIN: Duration = Duration::from_secs(3);

fn slice(endpoints: &[&str]) -> String {
    let endpoints: Vec<_> = endpoints
        .iter()
        .map(|address| (*address, "node-a", "zone-a", ""))
        .collect();
    slice_yaml("web-1", "web", 8080, &endpoints, false)
}

/// Waits until exactly `expected` answer the VIP, failing at `deadline`.
fn wait_for_answers(sandbox: &Sandbox, expected: &[&str], deadline: Instant, what: &str) {
    let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    loop {
        let got = sandbox.answering(VIP.parse().expect("address"), 20);
        if got == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: expected {expected:?} to answer, got {got:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_api_server_outage_keeps_the_datapath_and_changes_apply_soon_after() {
    let sandbox = Sandbox::new("api-outage");
    let _servers = NamedServer::numbered(30, 3);
    // Started after the sandbox: it listens inside the sandbox's network namespace.
    let mut api = FakeApiServer::start();
    api.apply_manifests(&node_yaml("node-a", "zone-a", "192.168.30.1"));
    api.apply_manifests(&service_yaml("web", "10.96.30.10", 80, ""));
    api.apply_manifests(&slice(&["127.0.30.1", "127.0.30.2"]));
    let dir = ManifestDir::new(&sandbox);
    let kubeconfig = dir.path.join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig()).expect("write the kubeconfig");
    let agent = Agent::start_kube(&sandbox, &kubeconfig, "node-a", &[]);
    let before = ["127.0.30.1", "127.0.30.2"];
    let soon = Instant::now() + Duration::from_secs(20);
    wait_for_answers(&sandbox, &before, soon, "before the outage");

    // Looping clients through the Service for the whole outage.
    let vip: SocketAddr = VIP.parse().expect("address");
    let clients: Vec<_> = (0..2)
        .map(|_| sandbox.spawn_probe("tcp", vip, u32::MAX, 10))
        .collect();
    api.stop();
    // The fault itself lasts this long; nothing is awaited.
    std::thread::sleep(OUTAGE);
    let outage_ended = socklb_tests::monotonic_ns();

    // Back, refusing for a moment; the change is there as soon as it answers.
    api.refuse_for(403, "Forbidden", WARMING);
    let back = Instant::now();
    api.restart();
    api.apply_manifests(&slice(&["127.0.30.3"]));
    wait_for_answers(
        &sandbox,
        &["127.0.30.3"],
        back + APPLIED_WITHIN,
        "a change made when the API server came back, within 3 s",
    );

    let attempts: Vec<_> = clients.into_iter().flat_map(|c| c.stop()).collect();
    socklb_tests::assert_all_connected(&attempts, "through the Service during the outage");
    let during: BTreeSet<&str> = attempts
        .iter()
        .filter(|a| a.finished_ns < outage_ended)
        .filter_map(|a| a.reply.as_deref())
        .collect();
    assert_eq!(
        during,
        BTreeSet::from(before),
        "during the outage the datapath serves what it had"
    );
    assert!(
        attempts.len() > 100,
        "the clients looped through the outage: {} connects",
        attempts.len()
    );
    agent.stop();
}

/// An API server out of reach from the start (nothing listens at its address): the agent's
/// log names the server and the cause, and the agent, stopped before its first sync on a
/// node it found bare, leaves no pin behind.
#[test]
fn an_api_server_out_of_reach_is_named_and_a_stop_before_the_first_sync_leaves_no_pin() {
    let sandbox = Sandbox::new("api-away");
    let dir = ManifestDir::new(&sandbox);
    let kubeconfig = dir.path.join("kubeconfig");
    // Port 1 of the sandbox's loopback: refused at once, and nothing leaves the sandbox.
    std::fs::write(&kubeconfig, kubeconfig_for("https://127.0.0.1:1"))
        .expect("write the kubeconfig");
    let agent = Agent::spawn_kube(&sandbox, &kubeconfig, "node-a", &[]);
    agent.wait_for_log("the datapath keeps its state meanwhile", 1);
    let log = agent.stop();
    for said in [
        "api_server=https://127.0.0.1:1",
        "Connection refused",
        "unpinned the maps it made",
    ] {
        assert!(log.contains(said), "the log does not say {said:?}:\n{log}");
    }
    assert!(
        !sandbox.pin_dir.exists(),
        "{} is left after a start that never synced:\n{log}",
        sandbox.pin_dir.display()
    );
}
