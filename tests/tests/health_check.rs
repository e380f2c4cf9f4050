//! healthCheckNodePorts end to end: `socklb run` on a manifests directory in a private
//! network namespace answers a real HTTP client (curl) on the healthCheckNodePort of a
//! LoadBalancer Service with `externalTrafficPolicy: Local`, as kube-proxy does, and follows
//! edits of the manifests.
use std::{
    net::{Ipv4Addr, TcpListener},
    process::Command,
    time::{Duration, Instant},
};

use socklb_tests::{
    Agent, ManifestDir, Sandbox, assert_logged, node_yaml, service_yaml, slice_yaml,
};

/// A LoadBalancer Service `name` with externalTrafficPolicy Local and a healthCheckNodePort.
fn lb_yaml(name: &str, cluster_ip: &str, health_check_node_port: u16) -> String {
    service_yaml(
        name,
        cluster_ip,
        80,
        &format!(
            "  type: LoadBalancer\n  externalTrafficPolicy: Local\n  \
             healthCheckNodePort: {health_check_node_port}\n"
        ),
    )
}

/// One HTTP answer, as curl saw it.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The header lines, lowercased.
    headers: String,
    body: String,
}

/// GET http://127.0.0.1:<port>/ with curl: the answer, or curl's error when there is none.
fn get(port: u16) -> Result<Answer, String> {
    get_from("127.0.0.1", port)
}

/// GET http://<host>:<port>/ with curl (host `[::1]` for IPv6).
fn get_from(host: &str, port: u16) -> Result<Answer, String> {
    let output = Command::new("curl")
        .args(["-sS", "-i", "-m", "5"])
        .arg(format!("http://{host}:{port}/"))
        .output()
        .expect("prerequisite missing: curl (apt-get install curl; ./x setup does)");
    if !output.status.success() {
        return Err(format!(
            "curl {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    Ok(Answer {
        status,
        headers: head.to_lowercase(),
        body: body.to_owned(),
    })
}

/// Polls `port` until `done` holds (the agent syncs asynchronously after an edit), failing
/// with the last answer after a bounded wait.
fn wait_for(
    port: u16,
    what: &str,
    done: impl Fn(&Result<Answer, String>) -> bool,
) -> Result<Answer, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = get(port);
        if done(&answer) {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "port {port}: expected {what}, got {answer:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits for `status` with `local_endpoints` in the body and checks the whole answer
/// against kube-proxy's.
fn wait_for_status(port: u16, service: &str, status: u16, local_endpoints: u64) {
    let answer = wait_for(port, &format!("{status} with {local_endpoints}"), |a| {
        a.as_ref().is_ok_and(|a| {
            a.status == status
                && a.body
                    .contains(&format!("\"localEndpoints\": {local_endpoints}"))
        })
    })
    .expect("an answer");
    for header in [
        "content-type: application/json".to_owned(),
        "x-content-type-options: nosniff".to_owned(),
        format!("x-load-balancing-endpoint-weight: {local_endpoints}"),
    ] {
        assert!(answer.headers.contains(&header), "{header} in {answer:?}");
    }
    let json: serde_json::Value = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("body is not JSON ({e}): {answer:?}"));
    assert_eq!(
        json,
        serde_json::json!({
            "service": {"namespace": "default", "name": service},
            "localEndpoints": local_endpoints,
            "serviceProxyHealthy": true,
        }),
        "{answer:?}"
    );
}

#[test]
fn the_health_check_follows_local_ready_endpoints_and_closes_with_the_service() {
    const PORT: u16 = 32_125;
    let sandbox = Sandbox::new("hc-follow");
    let manifests = ManifestDir::new(&sandbox);
    manifests.write(
        "nodes.yaml",
        &[
            node_yaml("node-a", "zone-a", "192.168.25.1"),
            node_yaml("node-b", "zone-a", "192.168.25.2"),
        ]
        .join("---\n"),
    );
    manifests.write("lb.yaml", &lb_yaml("lb", "10.96.25.10", PORT));
    let slice =
        |endpoints: &[(&str, &str, &str, &str)]| slice_yaml("lb-1", "lb", 8080, endpoints, false);
    manifests.write(
        "slice.yaml",
        &slice(&[("127.0.25.1", "node-a", "zone-a", "")]),
    );
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);

    // A ready endpoint on this node: 200, over both families (one dual-stack listener).
    wait_for_status(PORT, "lb", 200, 1);
    let over_ipv6 = get_from("[::1]", PORT).expect("an answer over IPv6");
    assert_eq!(over_ipv6.status, 200, "{over_ipv6:?}");

    // The endpoint moves to another node: 503.
    manifests.write(
        "slice.yaml",
        &slice(&[("127.0.25.1", "node-b", "zone-a", "")]),
    );
    wait_for_status(PORT, "lb", 503, 0);

    // Two ready endpoints here again (and one elsewhere, which does not count): 200.
    manifests.write(
        "slice.yaml",
        &slice(&[
            ("127.0.25.1", "node-a", "zone-a", ""),
            ("127.0.25.2", "node-a", "zone-a", ""),
            ("127.0.25.3", "node-b", "zone-a", ""),
        ]),
    );
    wait_for_status(PORT, "lb", 200, 2);

    // Only terminating (still serving) endpoints here: they drain, the check fails.
    let terminating = "{ready: false, serving: true, terminating: true}";
    manifests.write(
        "slice.yaml",
        &slice(&[
            ("127.0.25.1", "node-a", "zone-a", terminating),
            ("127.0.25.2", "node-a", "zone-a", terminating),
            ("127.0.25.3", "node-b", "zone-a", ""),
        ]),
    );
    wait_for_status(PORT, "lb", 503, 0);

    // The Service is deleted: the port closes.
    manifests.remove("lb.yaml");
    wait_for(PORT, "the port closed", |a| {
        a.as_ref().is_err_and(|e| e.contains("exit status: 7"))
    })
    .expect_err("closed");
    assert_logged(
        &agent.stop(),
        &["serving health check", "health check closed"],
        "the health check port opens and closes",
    );
}

#[test]
fn a_busy_port_is_logged_and_retried_without_stopping_the_others() {
    const BUSY: u16 = 32_126;
    const FREE: u16 = 32_127;
    let sandbox = Sandbox::new("hc-busy");
    // Someone else holds BUSY (in the sandbox's network namespace, as the agent).
    let occupant = TcpListener::bind((Ipv4Addr::UNSPECIFIED, BUSY)).expect("occupy the port");
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.26.1"));
    manifests.write(
        "services.yaml",
        &[
            lb_yaml("busy", "10.96.26.10", BUSY),
            lb_yaml("free", "10.96.26.11", FREE),
        ]
        .join("---\n"),
    );
    manifests.write(
        "slices.yaml",
        &[
            slice_yaml(
                "busy-1",
                "busy",
                8080,
                &[("127.0.26.1", "node-a", "zone-a", "")],
                false,
            ),
            slice_yaml(
                "free-1",
                "free",
                8080,
                &[("127.0.26.2", "node-a", "zone-a", "")],
                false,
            ),
        ]
        .join("---\n"),
    );
    // Resyncs every second retry the busy port.
    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--sync-period", "1s"],
    );

    // The other Service's health check is served; the busy port is reported with its
    // Service and port, once however many syncs fail.
    wait_for_status(FREE, "free", 200, 1);
    agent.wait_for_log("health check of Service default/busy", 1);
    // Every address of both families: one dual-stack socket on [::].
    assert!(
        agent.log().contains(&format!("[::]:{BUSY}")),
        "{}",
        agent.log()
    );
    // Two more resyncs.
    let resyncs = agent.log().matches("maps verified").count();
    agent.wait_for_log("maps verified", resyncs + 2);
    assert_eq!(
        agent
            .log()
            .matches("health check of Service default/busy")
            .count(),
        1,
        "{}",
        agent.log()
    );

    // Freed: a later sync takes it.
    drop(occupant);
    wait_for_status(BUSY, "busy", 200, 1);
    wait_for_status(FREE, "free", 200, 1);
    agent.stop();
}
