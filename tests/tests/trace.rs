//! `socklb trace` on the real kernel, for both address families: each kind of translation
//! shows up with the right Service and reason, filters work, and a session that dies leaves
//! emission off.
use std::{
    io::{BufRead as _, BufReader, Read as _},
    net::SocketAddr,
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
    family::Family,
    lan::{Addresses, LanNode, VM, VM6, addresses, answers, lan},
    node_yaml,
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

    /// Ctrl-C: every event the session showed before it ended.
    fn interrupt(mut self) -> Vec<Value> {
        let mut child = self.child.take().expect("trace child");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id().cast_signed(), libc::SIGINT) };
        let status = child.wait().expect("wait for the trace");
        assert!(status.success(), "the interrupted trace failed: {status}");
        // The reader thread ends at the output's end, which the exit closed.
        self.events.iter().collect()
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

/// Three ClusterIP Services of one family on backends b1, b2 of this sandbox: `web`,
/// `sticky` (ClientIP affinity) and `empty` (no endpoints).
struct Local {
    manifests: ManifestDir,
    servers: Vec<NamedServer>,
    web: SocketAddr,
    sticky: SocketAddr,
    empty: SocketAddr,
}

impl Local {
    fn new(sandbox: &Sandbox, family: Family) -> Self {
        let servers = family.tcp_servers(sandbox, 31, 2, 8080);
        let manifests = ManifestDir::new(sandbox);
        manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.90.1"));
        let a = addresses(family);
        let endpoints: Vec<(String, &str)> = servers
            .iter()
            .map(|server| (server.addr.ip().to_string(), "node-a"))
            .collect();
        let ports = "[{name: http, port: 80, targetPort: 8080, protocol: TCP}]";
        for (name, host, extra, endpoints) in [
            ("web", 0x31, "", &endpoints[..]),
            (
                "sticky",
                0x32,
                "  sessionAffinity: ClientIP",
                &endpoints[..],
            ),
            ("empty", 0x33, "", &[][..]),
        ] {
            manifests.service(
                name,
                &a.service(name, host, ports, extra, false),
                &a.slice(&format!("{name}-1"), name, ("http", 8080, "TCP"), endpoints),
            );
        }
        let at = |host| SocketAddr::new(family.vip(host), 80);
        Self {
            manifests,
            servers,
            web: at(0x31),
            sticky: at(0x32),
            empty: at(0x33),
        }
    }

    fn backends(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.to_string()).collect()
    }
}

socklb_tests::for_each_family!(
    a_translation_an_affinity_hit_and_a_refusal_show_their_service_and_reason,
    the_service_filter_shows_only_that_service,
    the_address_filters_show_only_their_frontend_and_backend,
    flows_from_outside_show_the_client_the_snat_source_and_a_denied_source,
    flows_from_a_pod_device_show_as_pod_and_a_hairpin_its_snat_source,
    reverse_translations_show_only_on_request,
);

fn a_translation_an_affinity_hit_and_a_refusal_show_their_service_and_reason(family: Family) {
    let sandbox = Sandbox::new(&format!("trace-reasons{}", family.tag()));
    let local = Local::new(&sandbox, family);
    let _agent = Agent::start(&sandbox, &local.manifests.path, "node-a", &[]);
    let trace = Trace::start(&sandbox, &[]);

    sandbox.probe("tcp", local.web, 1);
    let event = trace.next("a connect to web");
    assert_eq!(text(&event, "/source"), "connect");
    assert_eq!(text(&event, "/service/name"), "web");
    assert_eq!(text(&event, "/frontend"), local.web.to_string());
    assert_eq!(text(&event, "/reason"), "random");
    assert!(
        local
            .backends()
            .contains(&text(&event, "/backend").to_owned()),
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
    assert!(
        event.get("device").is_none(),
        "a socket has no device: {event}"
    );

    sandbox.probe("tcp", local.sticky, 2);
    let first = trace.next("the first connect to sticky");
    let second = trace.next("the second connect to sticky");
    assert_eq!(text(&first, "/reason"), "random", "{first}");
    assert_eq!(text(&second, "/reason"), "affinity", "{second}");
    assert_eq!(first["backend"], second["backend"]);

    sandbox.probe("tcp", local.empty, 1);
    let refused = trace.next("a connect to empty");
    assert_eq!(text(&refused, "/service/name"), "empty");
    assert_eq!(text(&refused, "/reason"), "no-backend");
    assert!(refused["backend"].is_null(), "{refused}");
}

fn the_service_filter_shows_only_that_service(family: Family) {
    let sandbox = Sandbox::new(&format!("trace-filter{}", family.tag()));
    let local = Local::new(&sandbox, family);
    let _agent = Agent::start(&sandbox, &local.manifests.path, "node-a", &[]);
    let trace = Trace::start(&sandbox, &["--service", "default/sticky"]);
    for vip in [local.web, local.empty, local.sticky] {
        sandbox.probe("tcp", vip, 1);
    }
    let event = trace.next("the connect to sticky");
    assert_eq!(text(&event, "/service/name"), "sticky", "{event}");
    assert_no_more(&trace, "an event of another Service got through");
    trace.kill();

    // A Service of no programmed frontend (a typo) is said at once.
    let typo = Command::new(agent_bin())
        .arg("trace")
        .arg("--bpffs")
        .arg(&sandbox.pin_dir)
        .args(["--service", "default/stiky", "--duration", "1s"])
        .output()
        .expect("run socklb trace");
    let said = String::from_utf8_lossy(&typo.stderr);
    assert!(
        typo.status.success() && said.contains("no frontend of default/stiky is programmed"),
        "{said}"
    );
}

/// `--frontend` and `--backend`, filtered in the kernel, for addresses of either family.
fn the_address_filters_show_only_their_frontend_and_backend(family: Family) {
    let sandbox = Sandbox::new(&format!("trace-address{}", family.tag()));
    let local = Local::new(&sandbox, family);
    let _agent = Agent::start(&sandbox, &local.manifests.path, "node-a", &[]);

    let frontend = Trace::start(&sandbox, &["--frontend", &local.sticky.to_string()]);
    for vip in [local.web, local.empty, local.sticky] {
        sandbox.probe("tcp", vip, 1);
    }
    let event = frontend.next("the connect to sticky");
    assert_eq!(
        text(&event, "/frontend"),
        local.sticky.to_string(),
        "{event}"
    );
    assert_no_more(&frontend, "an event of another frontend got through");
    drop(frontend);

    let backend = local.servers[1].addr;
    let trace = Trace::start(&sandbox, &["--backend", &backend.ip().to_string()]);
    // Random choices: 20 connections reach both backends but for a chance of 2^-20.
    sandbox.probe("tcp", local.web, 20);
    let event = trace.next("a connect to the second backend");
    assert_eq!(text(&event, "/backend"), backend.to_string(), "{event}");
    while let Ok(event) = trace.events.recv_timeout(Duration::from_millis(300)) {
        assert_eq!(text(&event, "/backend"), backend.to_string(), "{event}");
    }
}

/// No further event within 300 ms.
fn assert_no_more(trace: &Trace, what: &str) {
    if let Ok(event) = trace.events.recv_timeout(Duration::from_millis(300)) {
        panic!("{what}: {event}");
    }
}

/// The source a SNATed flow's backend saw (`seen`, as it answered the probe) is the one the
/// event names: `node`'s address and a port of the default SNAT range.
fn assert_snat_source(event: &Value, node: &str, seen: SocketAddr) {
    let snat: SocketAddr = text(event, "/snat").parse().expect("a socket address");
    assert_eq!(snat, seen, "the backend saw another source: {event}");
    assert_eq!(snat.ip().to_string(), node, "{event}");
    assert!((61000..=65535).contains(&snat.port()), "{event}");
}

/// A new flow to a local and to a remote backend (SNATed: the event names the source its
/// backend sees), and one refused by loadBalancerSourceRanges; each event names the node's
/// device the packet came in on.
fn flows_from_outside_show_the_client_the_snat_source_and_a_denied_source(family: Family) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("trace-external{}", family.tag()));
    let lan = lan(&format!("t{}", family.tag()));
    let _pods = [
        NamedServer::tcp_in(&lan.pod1, "pod1", SocketAddr::new(a.pod1, 8080)),
        NamedServer::tcp_in(&lan.pod2, "pod2", SocketAddr::new(a.pod2, 8080)),
    ];
    let manifests = ManifestDir::new(&sandbox);
    a.nodes(&manifests);
    for (name, host, node_port, kind, lb, endpoint) in [
        (
            "np",
            0x83,
            30131,
            String::from("  type: NodePort"),
            false,
            a.pod1_endpoint(),
        ),
        // Its backend on node2: SNATed (IPv6 takes the port in a frame of its own).
        (
            "remote",
            0x85,
            30133,
            String::from("  type: NodePort"),
            false,
            a.pod2_endpoint(),
        ),
        (
            "guarded",
            0x84,
            30132,
            format!(
                "  type: LoadBalancer\n  loadBalancerSourceRanges: [\"{}\"]",
                a.other_clients
            ),
            true,
            a.pod1_endpoint(),
        ),
    ] {
        let ports = format!(
            "[{{name: http, port: 80, targetPort: 8080, nodePort: {node_port}, protocol: TCP}}]"
        );
        manifests.service(
            name,
            &a.service(name, host, &ports, &kind, lb),
            &a.slice(
                &format!("{name}-1"),
                name,
                ("http", 8080, "TCP"),
                &[endpoint],
            ),
        );
    }
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);
    let trace = Trace::start(&sandbox, &[]);

    let attempts = lan.client.probe("tcp", &Addresses::at(a.node1, 30131), 1);
    assert!(attempts.iter().all(|a| a.error.is_none()), "{attempts:?}");
    let event = trace.next("the flow through the NodePort");
    assert_eq!(text(&event, "/source"), "external");
    assert_eq!(text(&event, "/service/name"), "np");
    assert_eq!(text(&event, "/frontend"), Addresses::at(a.node1, 30131));
    assert_eq!(text(&event, "/reason"), "random");
    assert_eq!(
        text(&event, "/backend"),
        SocketAddr::new(a.pod1, 8080).to_string()
    );
    let client: SocketAddr = text(&event, "/client").parse().expect("a socket address");
    assert_eq!(client.ip().to_string(), a.client, "{event}");
    assert_eq!(text(&event, "/device"), "eth0", "{event}");
    assert!(event.get("process").is_none(), "{event}");
    assert!(
        event.get("snat").is_none(),
        "a flow to a backend on this node keeps its client's address: {event}"
    );

    let attempts = lan.client.probe("tcp", &Addresses::at(a.node1, 30133), 1);
    let [(_, seen)] = answers(&attempts)[..] else {
        panic!("one answer: {attempts:?}");
    };
    let remote = trace.next("the flow to a backend on another node");
    assert_eq!(text(&remote, "/service/name"), "remote", "{remote}");
    assert_eq!(text(&remote, "/reason"), "random", "{remote}");
    assert_eq!(
        text(&remote, "/backend"),
        SocketAddr::new(a.pod2, 8080).to_string()
    );
    assert_snat_source(&remote, a.node1, seen);
    assert_eq!(text(&remote, "/device"), "eth0", "{remote}");

    lan.client.probe("tcp", &Addresses::at(a.lb_ip, 80), 1);
    let denied = trace.next("the denied flow");
    assert_eq!(text(&denied, "/service/name"), "guarded");
    assert_eq!(text(&denied, "/reason"), "source-denied");
    assert_eq!(text(&denied, "/device"), "eth0", "{denied}");
}

/// A VM's connection to a ClusterIP, translated by the per-packet path on its device: shown
/// with the source `pod`, the VM's address as the client, its device (`vm1`), no process and
/// no SNAT source (pod addresses route). A pod chosen as its own backend (hairpin) is SNATed
/// to the node: its event names the node's address and port the pod sees, and the pod's
/// device (`pod1`).
fn flows_from_a_pod_device_show_as_pod_and_a_hairpin_its_snat_source(family: Family) {
    let node = LanNode::new(family, "trace-pod", "p");
    let vm = node.lan.vm();
    let a = &node.a;
    let _servers = node.tcp_servers(8080);
    node.expose_pod2("web", 0x86, ("http", 80, 8080, 30134, "TCP"));
    node.write(
        "self.yaml",
        &a.exposed("self", 0x87)
            .port("http", 80, 8080, 30135, "TCP")
            .endpoints(&[a.pod1_endpoint()])
            .yaml(),
    );
    let _agent = node.agent(&[]);
    let trace = Trace::start(&node.sandbox, &[]);
    let frontend = Addresses::at(&family.vip(0x86).to_string(), 80);
    let attempts = vm.probe("tcp", &frontend, 1);
    assert!(attempts.iter().all(|a| a.error.is_none()), "{attempts:?}");
    let event = trace.next("the VM's flow");
    assert_eq!(text(&event, "/source"), "pod", "{event}");
    assert_eq!(text(&event, "/service/name"), "web", "{event}");
    assert_eq!(text(&event, "/frontend"), frontend, "{event}");
    assert_eq!(
        text(&event, "/backend"),
        SocketAddr::new(a.pod2, 8080).to_string()
    );
    let client: SocketAddr = text(&event, "/client").parse().expect("a socket address");
    let vm_address = match family {
        Family::V4 => VM,
        Family::V6 => VM6,
    };
    assert_eq!(client.ip().to_string(), vm_address, "{event}");
    assert_eq!(text(&event, "/device"), "vm1", "{event}");
    assert!(event.get("process").is_none(), "{event}");
    assert!(event.get("snat").is_none(), "{event}");

    let frontend = Addresses::at(&family.vip(0x87).to_string(), 80);
    let attempts = node.lan.pod1.probe("tcp", &frontend, 1);
    let [(_, seen)] = answers(&attempts)[..] else {
        panic!("one answer: {attempts:?}");
    };
    let hairpin = trace.next("the pod's flow to itself");
    assert_eq!(text(&hairpin, "/source"), "pod", "{hairpin}");
    assert_eq!(text(&hairpin, "/service/name"), "self", "{hairpin}");
    assert_eq!(
        text(&hairpin, "/backend"),
        SocketAddr::new(a.pod1, 8080).to_string()
    );
    let client: SocketAddr = text(&hairpin, "/client").parse().expect("an address");
    assert_eq!(client.ip(), a.pod1, "{hairpin}");
    assert_eq!(text(&hairpin, "/device"), "pod1", "{hairpin}");
    assert_snat_source(&hairpin, a.node1, seen);
}

#[test]
fn a_killed_session_leaves_emission_off_and_does_not_block_the_next() {
    let sandbox = Sandbox::new("trace-killed");
    let local = Local::new(&sandbox, Family::V4);
    let _agent = Agent::start(&sandbox, &local.manifests.path, "node-a", &[]);
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
    sandbox.probe("tcp", local.web, 3);
    assert!(
        ring.next().is_none(),
        "the programs still write trace events after the session died"
    );

    // A new session starts at once after a killed one (its pid is gone).
    let next = Trace::start(&sandbox, &[]);
    sandbox.probe("tcp", local.web, 1);
    next.next("a connect after the restart");
}

/// The events written since the last poll when a session is stopped are shown before it
/// ends, not dropped unannounced (they were neither shown nor counted lost).
#[test]
fn an_interrupted_session_shows_every_event_written_before_it_stopped() {
    const CONNECTIONS: u32 = 200;
    let sandbox = Sandbox::new("trace-drain");
    let local = Local::new(&sandbox, Family::V4);
    let _agent = Agent::start(&sandbox, &local.manifests.path, "node-a", &[]);
    let trace = Trace::start(&sandbox, &[]);
    let attempts = sandbox.probe("tcp", local.web, CONNECTIONS);
    assert!(
        attempts.iter().all(|a| a.reply.is_some()),
        "web did not answer every connection: {attempts:?}"
    );
    // At once: the last connections' events are still in the ring, unread.
    let events = trace.interrupt();
    let to_web = events
        .iter()
        .filter(|event| event["service"]["name"] == "web")
        .count();
    assert_eq!(
        to_web,
        CONNECTIONS as usize,
        "events shown of {CONNECTIONS} connections to web ({} in all)",
        events.len()
    );
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

fn reverse_translations_show_only_on_request(family: Family) {
    let sandbox = Sandbox::new(&format!("trace-reverse{}", family.tag()));
    let local = Local::new(&sandbox, family);
    let _agent = Agent::start(&sandbox, &local.manifests.path, "node-a", &[]);
    let web = local.web;

    // The probe asks getpeername() of every connection: a reverse translation.
    let plain = Trace::start(&sandbox, &[]);
    sandbox.probe("tcp", web, 1);
    assert_eq!(text(&plain.next("the connect"), "/source"), "connect");
    assert_no_more(&plain, "a reverse translation was shown without --reverse");
    drop(plain);

    let reverse = Trace::start(&sandbox, &["--reverse"]);
    sandbox.probe("tcp", web, 1);
    let connect = reverse.next("the connect");
    let answer = reverse.next("the getpeername answer");
    assert_eq!(text(&connect, "/source"), "connect");
    assert_eq!(text(&answer, "/source"), "reverse", "{answer}");
    assert_eq!(text(&answer, "/reason"), "reverse");
    assert_eq!(text(&answer, "/frontend"), web.to_string());
    assert_eq!(answer["backend"], connect["backend"]);
    assert_eq!(
        answer["process"]["socket_cookie"],
        connect["process"]["socket_cookie"]
    );
}

/// Kernel-side address filters are of one family: a frontend and a backend of two
/// families would match nothing, and are refused with a message before anything is opened.
#[test]
fn address_filters_of_two_families_are_refused_with_a_message() {
    let out = Command::new(agent_bin())
        .args([
            "trace",
            "--frontend",
            "[fd00:96::10]:80",
            "--backend",
            "10.0.0.5",
        ])
        .args(["--bpffs", "/nonexistent/socklb"])
        .output()
        .expect("run socklb trace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted:\n{stderr}");
    assert!(
        stderr.contains("different address families"),
        "the message says why:\n{stderr}"
    );
}

/// A `socklb trace` process started raw (stdout a pipe this test holds), killed on drop.
struct Session(Child);

impl Session {
    fn spawn(sandbox: &Sandbox) -> Self {
        Self(
            Command::new(agent_bin())
                .arg("trace")
                .arg("--bpffs")
                .arg(&sandbox.pin_dir)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn socklb trace"),
        )
    }

    fn stderr(&mut self) -> String {
        let mut text = String::new();
        if let Some(mut stderr) = self.0.stderr.take() {
            let _ = stderr.read_to_string(&mut text);
        }
        text
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `check` with a deadline.
fn eventually(what: &str, within: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two sessions started at the same instant: exactly one takes the lease (taking it is
/// atomic), the other is refused with a message naming the holder's pid, and the refused
/// one leaves the holder's entry alone. The holder, its reader gone, gives the lease back
/// at once (cleared, not left to lapse) and dies of SIGPIPE, as `| head` expects.
#[test]
fn of_two_concurrent_sessions_one_is_refused_naming_the_holder_and_never_clears_its_lease() {
    use std::os::unix::process::ExitStatusExt as _;

    let sandbox = Sandbox::new("trace-race");
    let local = Local::new(&sandbox, Family::V4);
    let _agent = Agent::start(&sandbox, &local.manifests.path, "node-a", &[]);
    for round in 0..5 {
        let mut sessions = [Session::spawn(&sandbox), Session::spawn(&sandbox)];
        // The loser exits by itself; the holder runs on.
        let mut refused = None;
        eventually(
            &format!("round {round}: one of two sessions is refused"),
            Duration::from_secs(10),
            || {
                for (index, session) in sessions.iter_mut().enumerate() {
                    if let Ok(Some(status)) = session.0.try_wait() {
                        refused = Some((index, status));
                    }
                }
                refused.is_some()
            },
        );
        let (loser, status) = refused.expect("a refused session");
        let winner = 1 - loser;
        let winner_pid = sessions[winner].0.id();
        let message = sessions[loser].stderr();
        assert!(
            !status.success(),
            "round {round}: the loser succeeded: {message}"
        );
        assert!(
            message.contains("another trace session")
                && message.contains(&format!("pid {winner_pid}")),
            "round {round}: the refusal names the holder (pid {winner_pid}): {message}"
        );
        assert_eq!(
            sessions[winner].0.try_wait().expect("try_wait"),
            None,
            "round {round}: both sessions ended"
        );
        eventually(
            &format!("round {round}: the holder's entry is in the control map"),
            Duration::from_secs(5),
            || control(&sandbox.pin_dir).session_pid == winner_pid,
        );
        let entry = control(&sandbox.pin_dir);
        assert!(
            entry.until_ns > monotonic_ns(),
            "round {round}: the refused session cleared the holder's lease: {entry:?}"
        );

        // Its reader gone, the holder notices without any event to write.
        drop(sessions[winner].0.stdout.take());
        let mut ended = None;
        eventually(
            &format!("round {round}: the holder ends after its reader went away"),
            Duration::from_secs(5),
            || {
                ended = sessions[winner].0.try_wait().expect("try_wait");
                ended.is_some()
            },
        );
        let ended = ended.expect("the holder's status");
        let stderr = sessions[winner].stderr();
        assert_eq!(
            ended.signal(),
            Some(libc::SIGPIPE),
            "round {round}: the holder ends as a closed pipe ends a Unix tool: {ended:?}\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(
            control(&sandbox.pin_dir),
            TraceControl::default(),
            "round {round}: the lease was not given back on leaving"
        );
    }
}
