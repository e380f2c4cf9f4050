//! The control plane end to end on the real kernel: `socklb run` fed by a manifests
//! directory or by a (fake, real-HTTP) Kubernetes API server, real servers and clients in a
//! private network namespace; edits of the cluster state and the connections that follow.
use std::{collections::BTreeSet, net::Ipv4Addr, process::Command, time::Duration};

use socklb_agent::dataplane;
use socklb_tests::{
    Agent, FREE_PORTS, KillOnDrop, LogFollower, ManifestDir, NamedServer, Sandbox, assert_logged,
    endpoint_slice, eventually, explain_command, fake_apiserver::FakeApiServer, filler_services,
    node_yaml, privileges::chart_agent_minimal, run_to_exit, service_manifest, service_yaml,
    slice_yaml, stdout_of, unblock_signals_on_exec,
};

const VIP: &str = "10.96.1.10:80";
/// The web Service's port, as its EndpointSlices name it.
const HTTP: (&str, u16, &str) = ("http", 8080, "TCP");

/// Waits until the servers answering the VIP are exactly `expected` (the agent syncs
/// asynchronously after an edit), failing with what answered instead.
fn wait_for_answers(sandbox: &Sandbox, expected: &[&str]) {
    let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    let what = format!("{expected:?} answer");
    eventually(&what, Duration::from_secs(20), || {
        match sandbox.answering(VIP.parse().expect("address"), 40) {
            got if got == expected => Ok(()),
            got => Err(format!("got {got:?}")),
        }
    });
}

fn web_service() -> String {
    service_yaml("web", "10.96.1.10", 80, "")
}

/// Writes slice-2.yaml: a second slice of the web Service with one `(address, node, zone)`.
fn write_second_slice(manifests: &ManifestDir, (address, node, zone): (&str, &str, &str)) {
    manifests.write(
        "slice-2.yaml",
        &slice_yaml("web-2", "web", 8080, &[(address, node, zone, "")], false),
    );
}

/// Manifests of node-a and the web Service with one endpoint, 127.0.<net>.1:8080.
fn one_endpoint_cluster(sandbox: &Sandbox, net: u8) -> ManifestDir {
    ManifestDir::web_with_one_endpoint(sandbox, net, "10.96.1.10")
}

/// [`one_endpoint_cluster`] with `servers` servers 127.0.<net>.1.. and the agent, started
/// with `extra`, serving the first of them.
fn serving(
    sandbox: &Sandbox,
    (net, servers): (u8, u8),
    extra: &[&str],
) -> (Vec<NamedServer>, ManifestDir, Agent) {
    let servers = NamedServer::numbered(net, servers);
    let manifests = one_endpoint_cluster(sandbox, net);
    let agent = Agent::start(sandbox, &manifests.path, "node-a", extra);
    wait_for_answers(sandbox, &[&format!("127.0.{net}.1")]);
    (servers, manifests, agent)
}

#[test]
fn connections_follow_edits_of_the_manifests() {
    let sandbox = Sandbox::new("cp-edits");
    let _servers = NamedServer::numbered(20, 4);
    let manifests = ManifestDir::new(&sandbox);
    // node-b and node-c in zones of their own; node-a's zone as the test moves it.
    let nodes = |zone_a: &str| {
        let nodes = [
            node_yaml("node-a", zone_a, "192.168.20.1"),
            node_yaml("node-b", "zone-b", "192.168.20.2"),
            node_yaml("node-c", "zone-c", "192.168.20.3"),
        ];
        manifests.write("nodes.yaml", &nodes.join("---\n"));
    };
    nodes("zone-a");
    manifests.write("web.yaml", &web_service());
    let three = [
        ("127.0.20.1", "node-a", "zone-a", ""),
        ("127.0.20.2", "node-b", "zone-b", ""),
        ("127.0.20.3", "node-c", "zone-c", ""),
    ];
    manifests.write(
        "slice.yaml",
        &slice_yaml("web-1", "web", 8080, &three, false),
    );
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    wait_for_answers(&sandbox, &["127.0.20.1", "127.0.20.2", "127.0.20.3"]);

    // Scale up: a fourth endpoint in a second slice.
    write_second_slice(&manifests, ("127.0.20.4", "node-b", "zone-b"));
    wait_for_answers(
        &sandbox,
        &["127.0.20.1", "127.0.20.2", "127.0.20.3", "127.0.20.4"],
    );

    // The first three terminate: only the ready one is used.
    let terminating = "{ready: false, serving: true, terminating: true}";
    let three_terminating: Vec<_> = three
        .iter()
        .map(|(a, n, z, _)| (*a, *n, *z, terminating))
        .collect();
    manifests.write(
        "slice.yaml",
        &slice_yaml("web-1", "web", 8080, &three_terminating, false),
    );
    wait_for_answers(&sandbox, &["127.0.20.4"]);

    // The ready one goes away: the terminating ones still serve (graceful shutdown).
    manifests.remove("slice-2.yaml");
    wait_for_answers(&sandbox, &["127.0.20.1", "127.0.20.2", "127.0.20.3"]);

    // Zone hints: this node (zone-a) uses its zone's endpoint...
    manifests.write(
        "slice.yaml",
        &slice_yaml("web-1", "web", 8080, &three, true),
    );
    wait_for_answers(&sandbox, &["127.0.20.1"]);
    // ...and follows its node's zone label.
    nodes("zone-c");
    wait_for_answers(&sandbox, &["127.0.20.3"]);

    // A copy of the Service in another file (the later file's copy wins): said, naming both.
    manifests.write("web-copy.yaml", &web_service());
    agent.wait_for_log("object defined twice", 1);
    assert!(
        agent
            .log()
            .lines()
            .any(|line| line.contains("object defined twice")
                && line.contains("Service default/web")
                && line.contains("web-copy.yaml")),
        "the warning names the object and the files: {}",
        agent.log()
    );
    manifests.remove("web-copy.yaml");

    // The Service is deleted: the VIP is no longer translated (nothing answers it here).
    manifests.remove("web.yaml");
    wait_for_answers(&sandbox, &["error: ENETUNREACH"]);
    agent.stop();
}

#[test]
fn a_broken_manifest_keeps_its_last_good_state_and_others_keep_working() {
    let sandbox = Sandbox::new("cp-broken");
    let (_servers, manifests, agent) = serving(&sandbox, (21, 2), &[]);

    // A syntax error: logged with file and line; the file's last good objects stay.
    manifests.write(
        "slice.yaml",
        "kind: EndpointSlice\nmetadata: {name: [broken\n",
    );
    agent.wait_for_log("slice.yaml:", 1);
    assert!(
        agent.log().contains("last good state is kept"),
        "{}",
        agent.log()
    );
    // A first read has no last good state: `explain` says the file is left out.
    let explain = explain_command(&manifests.path, "node-a")
        .output()
        .expect("run socklb explain");
    let said = String::from_utf8_lossy(&explain.stderr);
    assert!(
        said.contains("slice.yaml:") && said.contains("left out until it is fixed"),
        "{said}"
    );
    // Another file changes meanwhile and is applied; the broken one, unchanged, is not said
    // again.
    write_second_slice(&manifests, ("127.0.21.2", "node-a", "zone-a"));
    wait_for_answers(&sandbox, &["127.0.21.1", "127.0.21.2"]);
    assert_eq!(
        agent.log().matches("last good state is kept").count(),
        1,
        "{}",
        agent.log()
    );

    // A new version of the Service with an unreadable field: its last good version stays
    // served (a first version would be served but that part).
    manifests.write(
        "web.yaml",
        &service_yaml("web", "10.96.1.10", 80, "  externalIPs: [not-an-ip]\n"),
    );
    agent.wait_for_log("Service not updated", 1);
    wait_for_answers(&sandbox, &["127.0.21.1", "127.0.21.2"]);
    agent.stop();
}

/// A manifest with a document that does not parse: the file's other Services are served
/// while the agent runs and across a restart (its first read left the whole file out, and
/// its first sync deleted what was programmed for them); a document that turns bad keeps
/// its object's last good state while the file's other objects change.
#[test]
fn a_bad_document_leaves_the_other_services_of_its_file_served_across_a_restart() {
    let sandbox = Sandbox::new("cp-bad-document");
    let (_servers, manifests, agent) = serving(&sandbox, (28, 2), &[]);
    let typo = service_manifest("typo", "10.96.1.11", "  ports: 5\n");
    manifests.write("web.yaml", &(web_service() + "---\n" + &typo));
    agent.wait_for_log("not served until the document is fixed", 1);
    assert_logged(
        &agent.log(),
        &["web.yaml:", "Service default/typo: spec.ports"],
        "the bad document, by file, line, object and field",
    );
    wait_for_answers(&sandbox, &["127.0.28.1"]);

    let agent = {
        agent.stop();
        Agent::start_after_a_gap(&sandbox, &manifests.path)
    };
    assert_logged(
        &agent.log(),
        &[
            "web.yaml:",
            "Service default/typo",
            "not served until the document is fixed",
        ],
        "the restarted agent's warning",
    );
    wait_for_answers(&sandbox, &["127.0.28.1"]);

    // web's document turns bad while a new Service and its slice join the file.
    let api_vip: std::net::SocketAddr = "10.96.1.12:80".parse().expect("address");
    manifests.write(
        "web.yaml",
        &[
            service_manifest(
                "web",
                "10.96.1.10",
                "  ports: [{name: http, port: \"http\"}]\n",
            ),
            typo,
            service_yaml("api", "10.96.1.12", 80, ""),
            slice_yaml(
                "api-1",
                "api",
                8080,
                &[("127.0.28.2", "node-a", "zone-a", "")],
                false,
            ),
        ]
        .join("---\n"),
    );
    eventually("api answers", Duration::from_secs(20), || {
        match sandbox.answering(api_vip, 10) {
            got if got == BTreeSet::from(["127.0.28.2".to_owned()]) => Ok(()),
            got => Err(format!("got {got:?}")),
        }
    });
    assert_logged(
        &agent.log(),
        &["Service default/web", "last good state is kept"],
        "web's document turned bad",
    );
    wait_for_answers(&sandbox, &["127.0.28.1"]);
    agent.stop();
}

#[test]
fn resyncs_write_back_entries_changed_by_hand_and_remove_entries_the_agent_did_not_write() {
    let sandbox = Sandbox::new("cp-drift");
    let (_servers, _manifests, agent) = serving(
        &sandbox,
        (22, 1),
        // No full resync during the test: resyncs alone repair the maps.
        &["--sync-period", "1s", "--full-sync-period", "1h"],
    );
    let pinned = |name: &str| {
        aya::maps::MapData::from_pin(sandbox.pin_dir.join(name)).expect("open a pinned map")
    };
    let mut services: aya::maps::HashMap<_, socklb_abi::ServiceKey, socklb_abi::ServiceEntry> =
        aya::maps::Map::HashMap(pinned(socklb_abi::map_names::SERVICES))
            .try_into()
            .expect("service map");
    let mut backends: aya::maps::Array<_, socklb_abi::Backend> =
        aya::maps::Map::Array(pinned(socklb_abi::map_names::BACKENDS))
            .try_into()
            .expect("backend map");
    let master = socklb_abi::ServiceKey {
        address: u32::from(Ipv4Addr::new(10, 96, 1, 10)).to_be(),
        port: 80u16.to_be(),
        protocol: socklb_abi::PROTO_TCP,
        ..Default::default()
    };
    // The backend array: an id no backend holds reads as zeros.
    let none = socklb_abi::Backend::default();
    let held = |backends: &aya::maps::Array<_, socklb_abi::Backend>, id: u32| {
        backends.get(&id, 0).expect("read a backend") != none
    };
    let backend = (1..backends.len())
        .find(|id| held(&backends, *id))
        .expect("a backend");
    let mut slots: aya::maps::Array<_, socklb_abi::SlotPair> =
        aya::maps::Map::Array(pinned(socklb_abi::map_names::SLOTS))
            .try_into()
            .expect("slot array");
    let first_slot = services.get(&master, 0).expect("the master").first_slot;
    let slot = |slots: &aya::maps::Array<_, socklb_abi::SlotPair>| {
        slots.get(&(first_slot / 2), 0).expect("read a slot")[first_slot as usize % 2]
    };

    // Deleted behind the agent's back (as `bpftool map delete`, or zeros written into the
    // arrays): the next resync's verification writes all three back, says so, and counts
    // them.
    services.remove(&master).expect("delete the master entry");
    backends
        .set(backend, &none, 0)
        .expect("clear the backend entry");
    let mut pair = slots.get(&(first_slot / 2), 0).expect("read a slot");
    pair[first_slot as usize % 2] = 0;
    slots
        .set(first_slot / 2, &pair, 0)
        .expect("clear the frontend's slot");
    agent.wait_for_log("written back", 1);
    assert!(services.get(&master, 0).is_ok(), "master entry restored");
    assert!(held(&backends, backend), "backend entry restored");
    assert_ne!(slot(&slots), 0, "slot restored");
    wait_for_answers(&sandbox, &["127.0.22.1"]);
    let metrics = metrics();
    assert!(
        metrics.contains("socklb_map_entries_restored_total 3"),
        "{metrics}"
    );

    // Entries the agent never wrote: a frontend of its own, a slot key in the service map
    // (as an older layout kept them), and a backend no slot names. A resync's walk finds them, and
    // the sync after it deletes them.
    let stray = socklb_abi::ServiceKey {
        address: u32::from(Ipv4Addr::new(10, 96, 1, 99)).to_be(),
        ..master
    };
    let slot_key = socklb_abi::ServiceKey { slot: 5, ..master };
    let stray_backend = backends.len() - 1;
    let found = agent.log().matches("did not write").count();
    let entry = socklb_abi::ServiceEntry::default();
    services
        .insert(&stray, &entry, 0)
        .expect("insert a stray master entry");
    services
        .insert(&slot_key, &entry, 0)
        .expect("insert a slot key");
    let copy = backends.get(&backend, 0).expect("a backend");
    backends
        .set(stray_backend, &copy, 0)
        .expect("write a backend no slot names");
    agent.wait_for_log("did not write", found + 1);
    eventually(
        "the entries the agent did not write are deleted",
        Duration::from_secs(20),
        || {
            let left = [
                services.get(&stray, 0).is_ok(),
                services.get(&slot_key, 0).is_ok(),
                held(&backends, stray_backend),
            ];
            if left.contains(&true) {
                Err(format!("still there (stray, slot key, backend): {left:?}"))
            } else {
                Ok(())
            }
        },
    );
    wait_for_answers(&sandbox, &["127.0.22.1"]);
    let metrics = self::metrics();
    assert!(
        metrics.contains("socklb_map_entries_removed_total 3"),
        "{metrics}"
    );
    assert_eq!(
        agent.log().matches("full=true").count(),
        1,
        "only the first sync was a full one:\n{}",
        agent.log()
    );
    agent.stop();
}

/// The agent's metrics, as Prometheus scrapes them.
#[test]
fn a_fresh_node_has_the_programs_verified_once_over_maps_sized_for_its_cluster() {
    let sandbox = Sandbox::new("cp-sized");
    let _servers = NamedServer::numbered(23, 1);
    let manifests = one_endpoint_cluster(&sandbox, 23);
    // 3,200 one-endpoint Services need 6,400 service entries: more than three quarters of
    // the 8,192 the service map starts with.
    manifests.write("fillers.yaml", &filler_services(3_200, 1));
    let verified = |agent: &Agent| agent.log().matches("programs verified").count();

    // Loaded at start and again over the grown maps, the programs would be verified twice.
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    wait_for_answers(&sandbox, &["127.0.23.1"]);
    assert!(
        verified(&agent) == 1 && agent.log().contains("maps grown"),
        "the first sync did not grow the maps before the one verification:\n{}",
        agent.log()
    );
    agent.stop();

    // A restart adopts the pinned maps, already large enough: verified at load, not grown.
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    agent.wait_for_log("synced", 1);
    wait_for_answers(&sandbox, &["127.0.23.1"]);
    assert!(
        verified(&agent) == 1 && !agent.log().contains("maps grown"),
        "the restart verified the programs other than once:\n{}",
        agent.log()
    );
    agent.stop();
}

/// A socket program's link pin removed behind the agent's back (by hand, or a forced
/// cleanup) detaches it: the agent finds it at its next resync, says so, and fails
/// /readyz and /healthz, so that the liveness probe's restart attaches it again.
#[test]
fn programs_detached_behind_the_agents_back_fail_its_health() {
    let sandbox = Sandbox::new("cp-detached");
    let (_servers, _manifests, agent) = serving(&sandbox, (29, 1), &["--sync-period", "1s"]);
    let status = |path: &str| {
        let out = Command::new("curl")
            .args(["-sS", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("http://127.0.0.1:10256/{path}"))
            .output()
            .expect("prerequisite missing: curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(status("readyz"), "200");
    let program = socklb_abi::program_names::SOCK_ADDR[0];
    std::fs::remove_file(socklb_agent::dataplane::link_pin(&sandbox.pin_dir, program))
        .expect("remove a link pin");
    eventually(
        "/readyz and /healthz fail",
        Duration::from_secs(10),
        || match (status("readyz").as_str(), status("healthz").as_str()) {
            ("503", "503") => Ok(()),
            got => Err(format!("got {got:?}")),
        },
    );
    assert!(
        agent.log().lines().any(|line| line.contains("ERROR")
            && line.contains("socket programs detached")
            && line.contains(program)),
        "the error names the program: {}",
        agent.log()
    );
    agent.stop();
}

fn metrics() -> String {
    let out = Command::new("curl")
        .args(["-sS", "-m", "5", "http://127.0.0.1:10249/metrics"])
        .output()
        .expect("prerequisite missing: curl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn health_readiness_and_metrics_are_served() {
    let sandbox = Sandbox::new("cp-http");
    let (_servers, _manifests, agent) = serving(&sandbox, (23, 1), &[]);
    let get = |url: &str| {
        let out = Command::new("curl")
            .args(["-sS", "-m", "5", "-w", "\n%{http_code}", url])
            .output()
            .expect("prerequisite missing: curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let readyz = get("http://127.0.0.1:10256/readyz");
    assert!(readyz.ends_with("200"), "{readyz}");
    let healthz = get("http://127.0.0.1:10256/healthz");
    assert!(
        healthz.ends_with("200") && healthz.contains("lastUpdated"),
        "{healthz}"
    );
    // Each server serves its own: the metrics stay on loopback, where the health port
    // listens on every address for the kubelet's probes. The metrics port answers as
    // kube-proxy's does besides.
    for (url, answer) in [
        ("http://127.0.0.1:10256/metrics", "404"),
        ("http://127.0.0.1:10249/readyz", "404"),
        ("http://127.0.0.1:10249/healthz", "ok\n200"),
        ("http://127.0.0.1:10249/proxyMode", "socklb\n200"),
    ] {
        let got = get(url);
        assert!(got.ends_with(answer), "{url}: {got}");
    }
    let metrics = get("http://127.0.0.1:10249/metrics");
    for expected in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
        "kubeproxy_sync_proxy_rules_service_changes_total 1",
        "socklb_map_entries{map=\"socklb_svc_v3\"} 2",
    ] {
        assert!(
            metrics.contains(expected),
            "{expected} missing in:\n{metrics}"
        );
    }
    // The kernel counters are read at scrape time: every probe connect so far is counted.
    let translated: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("socklb_datapath_events_total{event=\"translated\"} "))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no translated counter in:\n{metrics}"));
    assert!(translated >= 40, "{metrics}");
    agent.stop();

    // `socklb inspect` reads the pinned maps while no agent runs.
    let inspect = |format: &str, filter: &[&str]| {
        sandbox.socklb(&[&["inspect", "-o", format], filter].concat())
    };
    let table = inspect("table", &[]);
    assert!(
        table.contains("10.96.1.10:80/TCP")
            && table.contains("default/web:http")
            && table.contains("127.0.23.1:8080"),
        "the frontend with its Service's name: {table}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&inspect("json", &[])).expect("inspect JSON");
    assert_eq!(json["frontends"][0]["backends"][0]["port"], 8080, "{json}");
    assert_eq!(json["frontends"][0]["service"]["name"], "web", "{json}");
    assert_eq!(
        json["frontends"][0]["service"]["kind"], "cluster-ip",
        "{json}"
    );
    let only = |service: &str| -> serde_json::Value {
        serde_json::from_str(&inspect("json", &["--service", service])).expect("inspect JSON")
    };
    assert!(
        !only("default/web")["frontends"]
            .as_array()
            .is_none_or(Vec::is_empty)
    );
    assert!(
        only("default/other")["frontends"]
            .as_array()
            .is_some_and(Vec::is_empty)
    );
    assert!(
        inspect("table", &["--service", "default/other"])
            .contains("no frontend of default/other is programmed"),
        "a table of no frontend says so"
    );
    assert!(
        json["counters"]["translated"].as_u64() >= Some(40),
        "{json}"
    );
}

#[test]
fn the_kube_source_end_to_end_survives_an_api_server_outage() {
    let sandbox = Sandbox::new("cp-kube");
    let _servers = NamedServer::numbered(24, 2);
    // Started after the sandbox: it listens inside the sandbox's network namespace.
    let mut fake = FakeApiServer::start();
    fake.apply_manifests(&node_yaml("node-a", "zone-a", "192.168.24.1"));
    fake.apply_manifests(&web_service());
    fake.apply_manifests(&slice_yaml(
        "web-1",
        "web",
        8080,
        &[("127.0.24.1", "node-a", "zone-a", "")],
        false,
    ));
    let manifests = ManifestDir::new(&sandbox);
    let kubeconfig = manifests.path.join("kubeconfig");
    std::fs::write(&kubeconfig, fake.kubeconfig()).expect("write kubeconfig");

    let agent = Agent::start_kube(&sandbox, &kubeconfig, "node-a", &[]);
    wait_for_answers(&sandbox, &["127.0.24.1"]);

    fake.apply_manifests(&slice_yaml(
        "web-1",
        "web",
        8080,
        &[
            ("127.0.24.1", "node-a", "zone-a", ""),
            ("127.0.24.2", "node-a", "zone-a", ""),
        ],
        false,
    ));
    wait_for_answers(&sandbox, &["127.0.24.1", "127.0.24.2"]);

    // The API server goes away: the datapath keeps its last state...
    fake.stop();
    std::thread::sleep(Duration::from_millis(500));
    wait_for_answers(&sandbox, &["127.0.24.1", "127.0.24.2"]);
    // ...and changes made while it was away arrive once it is back.
    fake.restart();
    fake.apply_manifests(&slice_yaml(
        "web-1",
        "web",
        8080,
        &[("127.0.24.2", "node-a", "zone-a", "")],
        false,
    ));
    wait_for_answers(&sandbox, &["127.0.24.2"]);
    agent.stop();
}

/// A health or metrics port that another process holds (kube-proxy's, during a migration)
/// stops the agent at start, naming the flag, before anything is loaded.
#[test]
fn a_health_or_metrics_port_in_use_stops_the_agent_at_start() {
    let sandbox = Sandbox::new("cp-port-in-use");
    let manifests = one_endpoint_cluster(&sandbox, 24);
    // kube-proxy's metrics port, held in the sandbox's namespace.
    let _held = std::net::TcpListener::bind("127.0.0.1:10249").expect("hold port 10249");
    // An agent that does not stop at start would run on: it is killed at the deadline.
    let (started, stderr) = run_to_exit(
        &mut sandbox.agent_command(chart_agent_minimal(), &manifests.path),
        Duration::from_secs(20),
    );
    assert!(!started, "started on a port in use:\n{stderr}");
    assert!(
        stderr.contains("cannot listen on 127.0.0.1:10249")
            && stderr.contains("--metrics-bind-address"),
        "the error names the address and the flag:\n{stderr}"
    );
    sandbox.assert_no_pins("nothing may be loaded before the ports are bound");
}

/// A part of a Service that is not served is logged once, naming the Service, the part and
/// the reason (a warning for an invalid field), and again only when that changes.
#[test]
fn what_is_not_served_is_logged_once_per_change() {
    let sandbox = Sandbox::new("cp-skip-log");
    let manifests = one_endpoint_cluster(&sandbox, 25);
    let odd = "apiVersion: v1
kind: Service
metadata: {name: odd, namespace: default}
spec:
  clusterIP: 10.96.25.20
  ports: [{name: http, port: 80, protocol: TCP}, {name: big, port: 70000, protocol: TCP}]
";
    manifests.write("odd.yaml", odd);
    // A copy in another file, there from the start: said at the first read too.
    manifests.write("odd-again.yaml", odd);
    let slice = |endpoint: &str| {
        slice_yaml(
            "odd-1",
            "odd",
            8080,
            &[(endpoint, "node-a", "zone-a", "")],
            false,
        )
    };
    manifests.write("odd-slice.yaml", &slice("127.0.25.2"));
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    agent.wait_for_log("not served", 1);
    let line = agent
        .log()
        .lines()
        .find(|line| line.contains("not served"))
        .map(str::to_owned)
        .expect("the line");
    assert!(
        line.contains("WARN") && line.contains("default/odd") && line.contains("port big"),
        "a warning naming the Service and the part: {line}"
    );
    assert!(
        agent
            .log()
            .lines()
            .any(|line| line.contains("object defined twice")
                && line.contains("Service default/odd")
                && line.contains("odd.yaml")
                && line.contains("odd-again.yaml")),
        "the first read names the object defined twice and both files:\n{}",
        agent.log()
    );
    // A Service served in part counts under the reason of the part left out.
    eventually("the part counted", Duration::from_secs(10), || {
        let metrics = Command::new("curl")
            .args(["-sS", "-m", "5", "http://127.0.0.1:10249/metrics"])
            .output()
            .expect("prerequisite missing: curl");
        let metrics = String::from_utf8_lossy(&metrics.stdout).into_owned();
        match metrics.contains("socklb_skipped_services{reason=\"invalid\"} 1") {
            true => Ok(()),
            false => Err(metrics),
        }
    });
    // An endpoint change of the same Service: synced, not logged again.
    let syncs = agent.log().matches(" synced ").count();
    manifests.write("odd-slice.yaml", &slice("127.0.25.3"));
    agent.wait_for_log(" synced ", syncs + 1);
    let log = agent.stop();
    assert_eq!(log.matches("not served").count(), 1, "{log}");
}

/// One writer per pin directory: a second agent waits for the first to exit (a rolling
/// update's handover) and takes over, or gives up with an error while the first keeps
/// serving.
#[test]
fn a_second_agent_on_the_same_pins_waits_for_the_first_or_gives_up() {
    let sandbox = Sandbox::new("cp-one-writer");
    let (_servers, manifests, first) = serving(&sandbox, (26, 1), &[]);

    // Another ports pair, so that only the pin directory is shared.
    let second = |wait: &str| {
        let mut command = sandbox.agent_command(chart_agent_minimal(), &manifests.path);
        command
            .args(["--handover-wait", wait, "--min-sync-period", "0s"])
            .args(FREE_PORTS)
            .stderr(std::process::Stdio::piped());
        command
    };
    let (started, stderr) = run_to_exit(&mut second("300ms"), Duration::from_secs(20));
    assert!(
        !started && stderr.contains("another socklb agent still holds"),
        "the second agent must give up with a clear error:\n{stderr}"
    );
    wait_for_answers(&sandbox, &["127.0.26.1"]);

    // A handover: the new agent waits, the old one exits, the new one takes the pins.
    let mut next = KillOnDrop(second("20s").spawn().expect("start a second socklb"));
    let mut log = LogFollower::new(&mut next.0);
    log.wait_for("waiting for it to exit");
    first.stop();
    log.wait_for("datapath attached; ready");
    wait_for_answers(&sandbox, &["127.0.26.1"]);
}

#[test]
fn a_sigterm_at_any_moment_of_the_start_stops_the_agent_cleanly() {
    let sandbox = Sandbox::new("cp-early-stop");
    let manifests = one_endpoint_cluster(&sandbox, 27);
    let lock = dataplane::pin_lock_path(&sandbox.pin_dir);
    let start = |extra: &[&str]| {
        let mut command = sandbox.agent_command(chart_agent_minimal(), &manifests.path);
        command
            .args(FREE_PORTS)
            .args(extra)
            .stderr(std::process::Stdio::piped());
        unblock_signals_on_exec(&mut command);
        let mut agent = KillOnDrop(command.spawn().expect("start socklb"));
        let log = LogFollower::new(&mut agent.0);
        (agent, log)
    };
    // SIGTERM, then the exit status and the last line of the log.
    let stop = |mut agent: KillOnDrop, log: LogFollower| {
        let rest = log.rest();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(agent.0.id().cast_signed(), libc::SIGTERM) };
        let status = eventually("the agent to exit", Duration::from_secs(30), || {
            agent
                .0
                .try_wait()
                .expect("wait for socklb")
                .ok_or_else(|| "still running".to_owned())
        });
        let log = rest.join().expect("the log");
        (status, log.lines().last().unwrap_or_default().to_owned())
    };
    // Before the load (no line then: its lock taken), after it, ready: a pod deleted while
    // its agent starts.
    let moments = [
        ("its pin directory locked", None, "stopped"),
        (
            "its programs loaded",
            Some("programs verified and loaded"),
            "stopped",
        ),
        (
            "ready",
            Some("datapath attached; ready"),
            "programs stay attached",
        ),
    ];
    for (moment, line, said) in moments {
        let (agent, mut log) = start(&[]);
        match line {
            Some(line) => log.wait_for(line),
            None => eventually(moment, Duration::from_secs(30), || {
                lock.exists()
                    .then_some(())
                    .ok_or_else(|| "not yet".to_owned())
            }),
        }
        let (status, last) = stop(agent, log);
        assert!(
            status.success() && last.contains(said),
            "a SIGTERM with {moment} ended the agent with {status}, last saying: {last}"
        );
    }

    // A rolling update's new pod deleted while it waits for the old one: it ends at once,
    // and the old one serves on.
    let _server = NamedServer::numbered(27, 1);
    let serving = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    let (waiting, mut log) = start(&["--handover-wait", "1h"]);
    log.wait_for("waiting for it to exit");
    let (status, last) = stop(waiting, log);
    assert!(
        status.success() && last.contains("stopped while waiting for the other agent"),
        "{status}: {last}"
    );
    wait_for_answers(&sandbox, &["127.0.27.1"]);
    serving.stop();
}

/// `socklb explain -o json` over the manifests, as this node (node-a) sees them.
fn explain_json(manifests: &ManifestDir) -> serde_json::Value {
    let explained = stdout_of(explain_command(&manifests.path, "node-a").args(["-o", "json"]));
    serde_json::from_str(&explained).expect("explain JSON")
}

/// `(family, frontend address, backends)` of the internal frontends of `service` in an
/// explanation.
fn explained(explanation: &serde_json::Value, service: &str) -> Vec<(String, String, Vec<String>)> {
    let services = explanation["services"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let selection = services
        .iter()
        .find(|s| s["service"]["name"] == service)
        .unwrap_or_else(|| panic!("{service} not explained: {explanation}"));
    selection["frontends"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|f| f["frontend"]["scope"] == "internal")
        .map(|f| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (
                text(&f["family"]),
                text(&f["frontend"]["address"]),
                backends(&f["spec"]["backends"]),
            )
        })
        .collect()
}

/// Backends (address and port) the pinned maps hold for the frontend on `address`, port 80.
fn programmed(sandbox: &Sandbox, address: &str) -> Option<Vec<String>> {
    Some(backends(&sandbox.inspected_frontend(address)?["backends"]))
}

/// Backends of explain's or inspect's JSON as `address port`.
fn backends(list: &serde_json::Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .map(|b| format!("{} {}", b["address"], b["port"]).replace('"', ""))
        .collect()
}

/// An internal frontend as [`explained`] lists it: family, address, its one backend.
fn frontend(family: &str, address: &str, backend: &str) -> (String, String, Vec<String>) {
    (
        family.to_owned(),
        address.to_owned(),
        vec![backend.to_owned()],
    )
}

/// Waits until the maps hold `expected` for the frontend on `address` (`None`: no such
/// frontend).
fn wait_for_programmed(sandbox: &Sandbox, address: &str, expected: Option<&[&str]>) {
    let expected: Option<Vec<String>> =
        expected.map(|e| e.iter().map(|s| (*s).to_owned()).collect());
    let what = format!("{address}: {expected:?} in the maps");
    eventually(&what, Duration::from_secs(20), || {
        match programmed(sandbox, address) {
            got if got == expected => Ok(()),
            got => Err(format!("got {got:?}")),
        }
    });
}

/// A dual-stack Service is two frontend sets, one per family, each with its own family's
/// endpoints (explain shows them, the maps of each family hold them); made IPv4-only, its
/// IPv6 slice is skipped with its reason and nothing else changes.
#[test]
fn a_dual_stack_service_is_served_per_family_and_a_stray_ipv6_slice_is_skipped() {
    let sandbox = Sandbox::new("cp-dual");
    let _servers = NamedServer::numbered(26, 1);
    let manifests = ManifestDir::new(&sandbox);
    manifests.write(
        "node.yaml",
        &node_yaml("node-a", "zone-a", "192.168.26.1").replace(
            "address: 192.168.26.1}]",
            "address: 192.168.26.1}, {type: InternalIP, address: 'fd00:26::1'}]",
        ),
    );
    let v4_only = web_service();
    let dual_stack = v4_only.replace(
        "  clusterIPs: [10.96.1.10]\n",
        "  clusterIPs: [10.96.1.10, 'fd00:96::10']\n  ipFamilies: [IPv4, IPv6]\n  \
         ipFamilyPolicy: RequireDualStack\n",
    );
    manifests.write("web.yaml", &dual_stack);
    for (family, endpoint) in [("IPv4", "127.0.26.1"), ("IPv6", "fd00:26::11")] {
        let name = format!("web-v{}", &family[3..]);
        let slice = endpoint_slice(&name, "web", family, HTTP, &[(endpoint, "node-a")]);
        manifests.write(&format!("slice-v{}.yaml", &family[3..]), &slice);
    }
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    wait_for_answers(&sandbox, &["127.0.26.1"]);

    let explanation = explain_json(&manifests);
    let (v4, v6) = (
        frontend("IPv4", "10.96.1.10", "127.0.26.1 8080"),
        frontend("IPv6", "fd00:96::10", "fd00:26::11 8080"),
    );
    assert_eq!(
        explained(&explanation, "web"),
        [v4.clone(), v6],
        "{explanation}"
    );
    // What explain shows is what the agent programmed, each family in its own maps.
    wait_for_programmed(&sandbox, "10.96.1.10", Some(&["127.0.26.1 8080"]));
    wait_for_programmed(&sandbox, "fd00:96::10", Some(&["fd00:26::11 8080"]));
    let metrics = Command::new("curl")
        .args(["-sS", "-m", "5", "http://127.0.0.1:10249/metrics"])
        .output()
        .expect("prerequisite missing: curl");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    for family in ["ipv4", "ipv6"] {
        let series = format!("socklb_frontends{{family=\"{family}\",scope=\"internal\"}} 1");
        assert!(metrics.contains(&series), "{series} in:\n{metrics}");
    }

    // IPv4 only now: the IPv6 slice is skipped with its reason, the IPv6 frontend goes,
    // and the IPv4 one is as it was.
    let syncs = agent.log().matches("synced").count();
    manifests.write("web.yaml", &v4_only);
    wait_for_programmed(&sandbox, "fd00:96::10", None);
    agent.wait_for_log("synced", syncs + 1);
    wait_for_programmed(&sandbox, "10.96.1.10", Some(&["127.0.26.1 8080"]));
    wait_for_answers(&sandbox, &["127.0.26.1"]);
    let explanation = explain_json(&manifests);
    assert_eq!(explained(&explanation, "web"), [v4], "{explanation}");
    let web = &explanation["services"][0];
    assert_eq!(web["skipped"][0]["part"], "EndpointSlice web-v6", "{web}");
    assert_eq!(web["skipped"][0]["reason"], "family-not-served", "{web}");
    agent.wait_for_log("EndpointSlice web-v6", 1);
    agent.stop();

    // A name that matches nothing is an error naming it, not an empty table.
    let rows: [(&[&str], &str); 3] = [
        (
            &["--service", "default/nope"],
            "--service default/nope: no such Service",
        ),
        (&["--service", "web"], "expected NAMESPACE/NAME"),
        (
            &["--pod", "default/nope"],
            "--pod default/nope: no such pod on node node-a",
        ),
    ];
    for (flags, error) in rows {
        let output = explain_command(&manifests.path, "node-a")
            .args(flags)
            .output()
            .expect("run socklb explain");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(error),
            "{flags:?}: {output:?}"
        );
    }
}
