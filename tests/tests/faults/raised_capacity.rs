//! An operator raises a map capacity (as the agent's own warning advises) on a node whose
//! service map is full: the restarted agent grows the map in place, and the Services that
//! were serving must keep serving through the restart, ahead of those that never fitted.
use std::{process::Command, time::Duration};

use socklb_tests::{
    Agent, Sandbox, TwoBackendWeb, assert_all_answered_by, eventually, monotonic_ns, service_yaml,
    slice_yaml,
};

/// Waits until the agent's /metrics has every line of `expected`, failing with what it has.
fn wait_for_metrics(expected: &[&str]) {
    eventually(
        &format!("{expected:?} in the metrics"),
        Duration::from_secs(20),
        || {
            let output = Command::new("curl")
                .args(["-sS", "-m", "5", "http://127.0.0.1:10249/metrics"])
                .output()
                .expect("prerequisite missing: curl");
            let metrics = String::from_utf8_lossy(&output.stdout);
            if expected
                .iter()
                .all(|line| metrics.lines().any(|l| l == *line))
            {
                Ok(())
            } else {
                Err(metrics.into_owned())
            }
        },
    );
}

#[test]
fn raising_a_capacity_keeps_serving_services_up() {
    let sandbox = Sandbox::new("raise");
    // The serving Service has the highest VIP: in frontend order it would come last.
    let TwoBackendWeb { manifests, vip, .. } = &TwoBackendWeb::new(&sandbox, 22, 90);
    let serving = *vip;
    let first = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--max-service-entries", "5"],
    );
    // Five more Services arrive that do not fit (3 entries each, 2 free): the first is
    // refused (its master counts 2 entries, a frontend's least), the others left out.
    for i in 1..=5 {
        manifests.two_endpoint_service(
            &format!("a-{i}"),
            &format!("10.96.0.{}", 80 + i),
            "127.0.22.1",
            "127.0.22.2",
        );
    }
    first.wait_for_log("frontend not programmed", 1);
    // Each named with its Service.
    assert!(
        first
            .log()
            .lines()
            .any(|line| line.contains("frontend not programmed") && line.contains("default/a-")),
        "the warning names the Service: {}",
        first.log()
    );
    // The metric counts every frontend not programmed, whichever sync rejected it: the
    // first new one got a master without backends (refused), the other four nothing.
    wait_for_metrics(&[
        "socklb_rejected_frontends{outcome=\"refused\"} 1",
        "socklb_rejected_frontends{outcome=\"not_programmed\"} 4",
        "socklb_rejected_frontends{outcome=\"kept_previous\"} 0",
    ]);
    // Said as an error with the count and the flag (once per sync that left more out), and
    // the node is not ready meanwhile.
    let log = first.log();
    assert!(
        log.lines().any(|line| line.contains("ERROR")
            && line.contains("frontends=5")
            && line.contains("--max-service-entries")),
        "an error counts the frontends that do not fit and names the flag: {log}"
    );
    let readyz = Command::new("curl")
        .args(["-sS", "-m", "5", "-w", " %{http_code}"])
        .arg("http://127.0.0.1:10256/readyz")
        .output()
        .expect("prerequisite missing: curl");
    let readyz = String::from_utf8_lossy(&readyz.stdout);
    assert!(
        readyz.starts_with("5 frontends are not programmed") && readyz.ends_with(" 503"),
        "/readyz while Services do not fit: {readyz}"
    );

    // Raised, but not enough for everything: 12 entries hold four Services of six. The
    // client runs until stopped below, however long the restart takes on a loaded machine.
    let client = sandbox.spawn_probe_for("tcp", serving, Duration::from_secs(600), 1);
    // Let the client run against the first agent for a while (checked below).
    std::thread::sleep(Duration::from_millis(500));
    let stopped = monotonic_ns();
    first.stop();
    let second = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--max-service-entries", "12"],
    );
    let log = second.log();
    assert!(
        log.contains("maps grown") && !log.contains("pinned map differs"),
        "the service map was not grown in place: {log}"
    );
    let serving_again = monotonic_ns();
    // Traffic through the second agent for a while (the check below counts it).
    std::thread::sleep(Duration::from_secs(1));
    let attempts = client.stop();
    second.stop();

    // The client ran across the whole change: before the first agent stopped, and after
    // the second one had programmed the new map.
    let before = attempts.iter().filter(|a| a.finished_ns < stopped).count();
    let after = attempts
        .iter()
        .filter(|a| a.started_ns > serving_again)
        .count();
    assert!(
        before > 0 && after > 0,
        "the client did not run across the restart: {} attempts, {before} before the first \
         agent stopped, {after} after the second served",
        attempts.len()
    );

    assert_all_answered_by(
        &attempts,
        &["b1", "b2"],
        "the serving Service across the raise",
    );
}

/// Frontends that did not fit and whose Services then go are gone, not programmed: the log
/// must not say they were.
#[test]
fn rejected_frontends_whose_services_go_are_not_said_programmed() {
    let sandbox = Sandbox::new("rejgone");
    let TwoBackendWeb { manifests, .. } = &TwoBackendWeb::new(&sandbox, 23, 90);
    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--max-service-entries", "5"],
    );
    // The three come and go in one file: removed one by one, the last would fit once the
    // others had gone, and be programmed (rightly) while it is still there.
    let rejected: Vec<String> = (1..=3)
        .map(|i| {
            let name = format!("a-{i}");
            let service = service_yaml(&name, &format!("10.96.0.{}", 80 + i), 80, "");
            let slice = slice_yaml(
                &format!("{name}-1"),
                &name,
                8080,
                &[
                    ("127.0.23.1", "node-a", "zone-a", ""),
                    ("127.0.23.2", "node-b", "zone-b", ""),
                ],
                false,
            );
            format!("{service}---\n{slice}")
        })
        .collect();
    manifests.write("rejected.yaml", &rejected.join("---\n"));
    wait_for_metrics(&["socklb_rejected_frontends{outcome=\"not_programmed\"} 2"]);
    manifests.remove("rejected.yaml");
    wait_for_metrics(&[
        "socklb_rejected_frontends{outcome=\"refused\"} 0",
        "socklb_rejected_frontends{outcome=\"not_programmed\"} 0",
    ]);
    let log = agent.log();
    assert!(
        !log.contains("programmed after they were rejected"),
        "frontends of Services that went are said programmed: {log}"
    );
}
