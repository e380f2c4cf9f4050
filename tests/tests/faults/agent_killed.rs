//! The agent killed with SIGKILL (an OOM kill, a node under pressure) and restarted, three
//! times, while clients connect: the pinned programs and maps keep translating without it,
//! and each new agent adopts them without a failed connect.
use std::time::Duration;

use socklb_tests::{Agent, Sandbox, TwoBackendWeb, assert_all_answered_by};

#[test]
fn sigkilled_agents_lose_no_connect() {
    let sandbox = Sandbox::new("killed");
    let TwoBackendWeb { manifests, vip, .. } = &TwoBackendWeb::new(&sandbox, 21, 71);
    let vip = *vip;

    let mut agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    let mut clients: Vec<_> = (0..4)
        .map(|_| sandbox.spawn_probe_for("tcp", vip, Duration::from_secs(12), 1))
        .collect();
    for kill in 1..=3 {
        // Dropping the harness's handle SIGKILLs the agent: no shutdown code runs.
        drop(agent);
        agent = Agent::start_after_a_gap(&sandbox, &manifests.path);
        let log = agent.log();
        assert!(
            log.contains("writes=0"),
            "agent {kill} after a SIGKILL rewrote the adopted maps: {log}"
        );
        assert!(
            clients.iter_mut().all(|c| c.running()),
            "the clients stopped before kill {kill} was recovered from"
        );
    }
    agent.stop();

    let attempts: Vec<_> = clients.into_iter().flat_map(|c| c.wait()).collect();
    assert_all_answered_by(&attempts, &["b1", "b2"], "across three SIGKILLs");
}
