//! `socklb trace` on the real kernel: each kind of translation shows up with the right
//! Service and reason, filters work, and a session that dies leaves emission off.
use std::{
    io::{BufRead as _, BufReader, Read as _},
    net::{SocketAddr, SocketAddrV4},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use aya::maps::{Array, Map, MapData, RingBuf};
use serde_json::Value;
use socklb_abi::{TraceControl, map_names};
use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox, agent_bin, cgroup2_root,
    lan::{CLIENT, LB_IP, NODE1, POD1, POD1_ENDPOINT, lan, nodes, service, slice},
    node_yaml, service_yaml, slice_yaml, tcp_backends,
};

/// A `socklb trace -o json` session in the background.
struct Trace {
    child: Option<Child>,
    events: mpsc::Receiver<Value>,
}

impl Trace {
    /// Starts a session and waits until it holds the lease.
    fn start(sandbox: &Sandbox, args: &[&str]) -> Self {
        let mut child = Command::new(agent_bin())
            .arg("trace")
            .arg("--bpffs")
            .arg(&sandbox.pin_dir)
            .args(["-o", "json"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn socklb trace");
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        stderr
            .read_line(&mut line)
            .expect("read the trace's stderr");
        assert!(
            line.contains("tracing translations"),
            "the trace did not start: {line}{}",
            {
                let mut rest = String::new();
                let _ = stderr.read_to_string(&mut rest);
                rest
            }
        );
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (sender, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let event = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("trace output {line:?}: {e}"));
                if sender.send(event).is_err() {
                    break;
                }
            }
        });
        Self {
            child: Some(child),
            events,
        }
    }

    /// The next event, within 5 s.
    fn next(&self, what: &str) -> Value {
        self.events
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("no trace event for {what} within 5 s"))
    }

    fn kill(mut self) {
        let mut child = self.child.take().expect("trace child");
        child.kill().expect("kill the trace");
        child.wait().expect("wait for the trace");
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn text<'a>(event: &'a Value, pointer: &str) -> &'a str {
    event
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no {pointer} in {event}"))
}

/// The sandbox's cgroup as the trace names it: its path below the cgroup v2 mount.
fn cgroup_of(sandbox: &Sandbox) -> String {
    let relative = sandbox
        .cgroup
        .strip_prefix(cgroup2_root())
        .expect("the sandbox cgroup is below the mount");
    format!("/{}", relative.display())
}

fn local_services(sandbox: &Sandbox) -> ManifestDir {
    let manifests = ManifestDir::new(sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.90.1"));
    let endpoints = [
        ("127.0.31.1", "node-a", "zone-a", ""),
        ("127.0.31.2", "node-a", "zone-a", ""),
    ];
    for (name, vip, extra, endpoints) in [
        ("web", "10.96.0.31", "", &endpoints[..]),
        (
            "sticky",
            "10.96.0.32",
            "  sessionAffinity: ClientIP\n",
            &endpoints[..],
        ),
        ("empty", "10.96.0.33", "", &[][..]),
    ] {
        manifests.service(
            name,
            &service_yaml(name, vip, 80, extra),
            &slice_yaml(&format!("{name}-1"), name, 8080, endpoints, false),
        );
    }
    manifests
}

#[test]
fn a_translation_an_affinity_hit_and_a_refusal_show_their_service_and_reason() {
    let sandbox = Sandbox::new("trace-reasons");
    let _servers = tcp_backends([127, 0, 31], 2, 8080);
    let manifests = local_services(&sandbox);
    let _agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    let trace = Trace::start(&sandbox, &[]);

    let web: SocketAddr = "10.96.0.31:80".parse().expect("address");
    sandbox.probe("tcp", web, 1);
    let event = trace.next("a connect to web");
    assert_eq!(text(&event, "/source"), "connect");
    assert_eq!(text(&event, "/service/name"), "web");
    assert_eq!(text(&event, "/frontend"), "10.96.0.31:80");
    assert_eq!(text(&event, "/reason"), "random");
    assert!(
        ["127.0.31.1:8080", "127.0.31.2:8080"].contains(&text(&event, "/backend")),
        "{event}"
    );
    assert_eq!(event["count"], 2, "{event}");
    assert!(
        event["slot"]
            .as_u64()
            .is_some_and(|slot| (1..=2).contains(&slot))
    );
    assert!(event["process"]["pid"].as_u64().is_some_and(|pid| pid > 0));
    assert_eq!(text(&event, "/process/cgroup"), cgroup_of(&sandbox));

    let sticky: SocketAddr = "10.96.0.32:80".parse().expect("address");
    sandbox.probe("tcp", sticky, 2);
    let first = trace.next("the first connect to sticky");
    let second = trace.next("the second connect to sticky");
    assert_eq!(text(&first, "/reason"), "random", "{first}");
    assert_eq!(text(&second, "/reason"), "affinity", "{second}");
    assert_eq!(first["backend"], second["backend"]);

    let empty: SocketAddr = "10.96.0.33:80".parse().expect("address");
    sandbox.probe("tcp", empty, 1);
    let refused = trace.next("a connect to empty");
    assert_eq!(text(&refused, "/service/name"), "empty");
    assert_eq!(text(&refused, "/reason"), "no-backend");
    assert!(refused["backend"].is_null(), "{refused}");
}

#[test]
fn the_service_filter_shows_only_that_service() {
    let sandbox = Sandbox::new("trace-filter");
    let _servers = tcp_backends([127, 0, 31], 2, 8080);
    let manifests = local_services(&sandbox);
    let _agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    let trace = Trace::start(&sandbox, &["--service", "default/sticky"]);
    for vip in ["10.96.0.31:80", "10.96.0.33:80", "10.96.0.32:80"] {
        sandbox.probe("tcp", vip.parse().expect("address"), 1);
    }
    let event = trace.next("the connect to sticky");
    assert_eq!(text(&event, "/service/name"), "sticky", "{event}");
    assert!(
        trace
            .events
            .recv_timeout(Duration::from_millis(300))
            .is_err(),
        "an event of another Service got through"
    );
}

#[test]
fn flows_from_outside_show_the_client_and_a_denied_source() {
    let sandbox = Sandbox::new("trace-external");
    let lan = lan("t");
    let _pod = NamedServer::tcp_in(&lan.pod1, "pod1", SocketAddrV4::new(POD1, 8080));
    let manifests = ManifestDir::new(&sandbox);
    nodes(&manifests);
    for (name, vip, node_port, kind, lb_ip) in [
        ("np", "10.96.0.131", 30131, "  type: NodePort", None),
        (
            "guarded",
            "10.96.0.132",
            30132,
            "  type: LoadBalancer\n  loadBalancerSourceRanges: [192.0.2.0/24]",
            Some(LB_IP),
        ),
    ] {
        let ports = format!(
            "[{{name: http, port: 80, targetPort: 8080, nodePort: {node_port}, protocol: TCP}}]"
        );
        manifests.service(
            name,
            &service(name, vip, &ports, kind, lb_ip),
            &slice(
                &format!("{name}-1"),
                name,
                ("http", 8080, "TCP"),
                &[POD1_ENDPOINT],
            ),
        );
    }
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);
    let trace = Trace::start(&sandbox, &[]);

    let attempts = lan.client.probe("tcp", &format!("{NODE1}:30131"), 1);
    assert!(attempts.iter().all(|a| a.error.is_none()), "{attempts:?}");
    let event = trace.next("the flow through the NodePort");
    assert_eq!(text(&event, "/source"), "external");
    assert_eq!(text(&event, "/service/name"), "np");
    assert_eq!(text(&event, "/reason"), "random");
    assert_eq!(text(&event, "/backend"), "10.244.1.10:8080");
    assert!(
        text(&event, "/client").starts_with(&format!("{CLIENT}:")),
        "{event}"
    );
    assert!(event.get("process").is_none(), "{event}");

    lan.client.probe("tcp", &format!("{LB_IP}:80"), 1);
    let denied = trace.next("the denied flow");
    assert_eq!(text(&denied, "/service/name"), "guarded");
    assert_eq!(text(&denied, "/reason"), "source-denied");
}

#[test]
fn a_killed_session_leaves_emission_off_and_does_not_block_the_next() {
    let sandbox = Sandbox::new("trace-killed");
    let _servers = tcp_backends([127, 0, 31], 2, 8080);
    let manifests = local_services(&sandbox);
    let _agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    let trace = Trace::start(&sandbox, &[]);
    assert!(
        control(&sandbox.pin_dir).until_ns > monotonic_ns(),
        "the session holds no lease"
    );
    let second = Command::new(agent_bin())
        .args(["trace", "--count", "1", "--bpffs"])
        .arg(&sandbox.pin_dir)
        .output()
        .expect("run a second trace");
    let refused = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success() && refused.contains("another trace session"),
        "a second session must be refused while one runs: {refused}"
    );
    trace.kill();

    // The lease lapses by itself (3 s), with nobody to give it back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while control(&sandbox.pin_dir).until_ns > monotonic_ns() {
        assert!(
            Instant::now() < deadline,
            "the dead session's lease never lapsed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut ring = ring(&sandbox.pin_dir);
    while ring.next().is_some() {}
    sandbox.probe("tcp", "10.96.0.31:80".parse().expect("address"), 3);
    assert!(
        ring.next().is_none(),
        "the programs still write trace events after the session died"
    );

    // A new session starts at once after a killed one (its pid is gone).
    let next = Trace::start(&sandbox, &[]);
    sandbox.probe("tcp", "10.96.0.31:80".parse().expect("address"), 1);
    next.next("a connect after the restart");
}

fn control(pin_dir: &Path) -> TraceControl {
    let data = MapData::from_pin(pin_dir.join(map_names::TRACE_CONTROL)).expect("control map");
    let array: Array<_, TraceControl> = Array::try_from(Map::Array(data)).expect("an array");
    array.get(&0, 0).expect("the control entry")
}

fn ring(pin_dir: &Path) -> RingBuf<MapData> {
    let data = MapData::from_pin(pin_dir.join(map_names::TRACE)).expect("ring buffer");
    RingBuf::try_from(Map::RingBuf(data)).expect("a ring buffer")
}

fn monotonic_ns() -> u64 {
    socklb_tests::monotonic_ns()
}

#[test]
fn reverse_translations_show_only_on_request() {
    let sandbox = Sandbox::new("trace-reverse");
    let _servers = tcp_backends([127, 0, 31], 2, 8080);
    let manifests = local_services(&sandbox);
    let _agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    let web: SocketAddr = "10.96.0.31:80".parse().expect("address");

    // The probe asks getpeername() of every connection: a reverse translation.
    let plain = Trace::start(&sandbox, &[]);
    sandbox.probe("tcp", web, 1);
    assert_eq!(text(&plain.next("the connect"), "/source"), "connect");
    assert!(
        plain
            .events
            .recv_timeout(Duration::from_millis(300))
            .is_err(),
        "a reverse translation was shown without --reverse"
    );
    drop(plain);

    let reverse = Trace::start(&sandbox, &["--reverse"]);
    sandbox.probe("tcp", web, 1);
    let connect = reverse.next("the connect");
    let answer = reverse.next("the getpeername answer");
    assert_eq!(text(&connect, "/source"), "connect");
    assert_eq!(text(&answer, "/source"), "reverse", "{answer}");
    assert_eq!(text(&answer, "/reason"), "reverse");
    assert_eq!(text(&answer, "/frontend"), "10.96.0.31:80");
    assert_eq!(answer["backend"], connect["backend"]);
    assert_eq!(
        answer["process"]["socket_cookie"],
        connect["process"]["socket_cookie"]
    );
}

/// The kernel filters trace events by IPv4 address only: an IPv6 `--frontend` or
/// `--backend` is refused with a message that says what to use instead, before anything
/// is opened.
#[test]
fn an_ipv6_address_filter_is_refused_with_a_message() {
    for filter in [["--frontend", "[fd00:96::10]:80"], ["--backend", "fd00::5"]] {
        let out = Command::new(agent_bin())
            .arg("trace")
            .args(filter)
            .args(["--bpffs", "/nonexistent/socklb"])
            .output()
            .expect("run socklb trace");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{filter:?} accepted:\n{stderr}");
        assert!(
            stderr.contains("IPv4") && stderr.contains("--service"),
            "{filter:?}: the message says why and what to use instead:\n{stderr}"
        );
    }
}
