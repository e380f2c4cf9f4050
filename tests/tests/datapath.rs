//! The socket datapath on the real kernel: programs loaded and attached to a test cgroup,
//! real servers and clients in a private network namespace. The scenarios of the
//! translation itself run once per address family (`v4::*`, `v6::*`) from one body.
use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    process::Command,
    time::Duration,
};

use socklb_abi::{ServiceEntry, ServiceKey, map_names};
use socklb_agent::dataplane::{
    BackendAddr, Capacities, Config, Dataplane, DataplaneError, Desired, Frontend, FrontendSpec,
    Protocol, Scope, lock_pin_dir,
};
use socklb_tests::{
    Agent, Dnsmasq, ManifestDir, NamedServer, Sandbox, TwoBackendWeb, addr, agent_bin, assert_peer,
    bpftool, endpoint_slice, family::Family, frontend, node_yaml, service_yaml, spec, tally,
    tcp_backends, wait::eventually,
};

socklb_tests::for_each_family!(
    tcp_spreads_over_backends_and_getpeername_shows_the_vip,
    a_reused_socket_slot_never_shows_another_sockets_vip,
    dns_through_a_vip_reaches_real_dnsmasq_servers_and_replies_come_from_the_vip,
    udp_replies_appear_from_the_vip_connected_or_not,
    a_frontend_without_backends_refuses_like_kube_proxy,
    a_process_outside_the_cgroup_is_not_translated,
    session_affinity_sticks_within_the_timeout_and_reselects_after,
    the_real_agent_serves_a_service_of_the_family_from_manifests,
    a_familys_maps_grow_with_its_own_frontends_only,
);

fn tcp_spreads_over_backends_and_getpeername_shows_the_vip(family: Family) {
    let sandbox = Sandbox::new(&format!("tcp{}", family.tag()));
    let servers = family.tcp_servers(&sandbox, 1, 3, 8080);
    let vip = family.frontend(10, 80, Protocol::Tcp);
    let dataplane = serve(&sandbox, vip, &servers);

    let attempts = sandbox.probe("tcp", addr(&vip), 300);
    let tally = tally(&attempts);
    assert_eq!(tally.values().sum::<usize>(), 300);
    // Each share within about five standard deviations of 100 (binomial n=300, p=1/3).
    for server in &servers {
        let share = tally.get(&server.name).copied().unwrap_or(0);
        assert!(
            (59..=141).contains(&share),
            "share of {}: {share}; all: {tally:?}",
            server.name
        );
    }
    assert_peer(&attempts, &addr(&vip).to_string(), "the VIP is shown");

    // A direct connection to a backend is neither rewritten nor shown as the VIP.
    let direct = sandbox.probe("tcp", servers[1].addr, 20);
    for attempt in &direct {
        assert_eq!(attempt.reply.as_deref(), Some("b2"), "{attempt:?}");
        assert_eq!(
            attempt.peer,
            Some(servers[1].addr.to_string()),
            "{attempt:?}"
        );
    }

    let mut translated = 300;
    if family == Family::V4 {
        // A dual-stack (AF_INET6) socket talking to the IPv4-mapped VIP is served by the
        // IPv4 maps.
        let mapped: SocketAddr = "[::ffff:10.96.0.10]:80".parse().expect("address");
        let attempts = sandbox.probe("tcp", mapped, 30);
        assert_eq!(attempts.len(), 30);
        for attempt in &attempts {
            assert!(
                attempt.reply.as_deref().is_some_and(|r| r.starts_with('b')),
                "{attempt:?}"
            );
            assert_eq!(
                attempt.peer.as_deref(),
                Some("[::ffff:10.96.0.10]:80"),
                "{attempt:?}"
            );
        }
        translated += 30;
        // An IPv6 destination that is no frontend passes through connect6 untouched.
        let v6 = NamedServer::tcp_at("v6", "[::1]:8080".parse().expect("address"));
        for attempt in sandbox.probe("tcp", v6.addr, 3) {
            assert_eq!(attempt.reply.as_deref(), Some("v6"), "{attempt:?}");
        }
    }

    let counters = dataplane.counters().expect("counters");
    assert!(counters.translated >= translated, "{counters:?}");
    assert!(counters.reverse_translated >= 300, "{counters:?}");
    assert_eq!(counters.errors, 0, "{counters:?}");
}

fn a_reused_socket_slot_never_shows_another_sockets_vip(family: Family) {
    let sandbox = Sandbox::new(&format!("ring{}", family.tag()));
    let server = NamedServer::tcp_at("b1", SocketAddr::new(family.local(&sandbox, 1, 41), 8080));
    // Two VIPs on the same backend, and a socket ring of one slot: every connect() takes
    // the slot of the one before, so only the cookie tells the sockets apart.
    let vips = [
        family.frontend(41, 80, Protocol::Tcp),
        family.frontend(42, 80, Protocol::Tcp),
    ];
    let capacities = Capacities {
        reverse: 1,
        ..Capacities::default()
    };
    let mut dataplane = sandbox.load_with(capacities).expect("load");
    let mut desired = Desired::default();
    for vip in vips {
        desired.insert(vip, spec(std::slice::from_ref(&server)));
    }
    dataplane.apply(&desired).expect("apply");
    sandbox.attach(&mut dataplane);

    let runs: Vec<_> = [addr(&vips[0]), addr(&vips[1]), server.addr]
        .into_iter()
        .map(|target| (target, sandbox.spawn_probe("tcp", target, 300, 0)))
        .collect();
    for (target, run) in runs {
        let attempts = run.wait();
        assert_eq!(attempts.len(), 300, "{target}");
        let peers: BTreeSet<String> = attempts
            .iter()
            .map(|attempt| {
                attempt
                    .peer
                    .clone()
                    .unwrap_or_else(|| format!("{attempt:?}"))
            })
            .collect();
        // Its own VIP, or (once another socket took the slot) the backend; never the other
        // VIP, and a direct connection never a VIP at all.
        let allowed = BTreeSet::from([target.to_string(), server.addr.to_string()]);
        assert!(peers.is_subset(&allowed), "{target}: {peers:?}");
    }
    let counters = dataplane.counters().expect("counters");
    assert_eq!(counters.translated, 600, "{counters:?}");
    assert!(counters.reverse_translated > 0, "{counters:?}");
    assert_eq!(counters.errors, 0, "{counters:?}");
}

fn dns_through_a_vip_reaches_real_dnsmasq_servers_and_replies_come_from_the_vip(family: Family) {
    let sandbox = Sandbox::new(&format!("dns{}", family.tag()));
    let listen: Vec<_> = (1..=2).map(|i| family.local(&sandbox, 2, i)).collect();
    let servers = [
        Dnsmasq::start(listen[0], Ipv4Addr::new(192, 0, 2, 1)),
        Dnsmasq::start(listen[1], Ipv4Addr::new(192, 0, 2, 2)),
    ];
    let vip = family.frontend(53, 53, Protocol::Udp);
    let mut desired = Desired::default();
    desired.insert(
        vip,
        FrontendSpec {
            backends: listen
                .iter()
                .map(|&address| BackendAddr::local(address, 53))
                .collect(),
            affinity_timeout_seconds: None,
            source_ranges: None,
            maglev: false,
            no_endpoints: false,
        },
    );
    let _dataplane = sandbox.programmed(&desired);

    let mut answers = BTreeSet::new();
    for _ in 0..20 {
        // dig checks that the reply comes from the address it asked: without the
        // recvmsg translation it would discard the backend's reply and time out.
        let output = sandbox
            .in_cgroup("dig")
            .arg(format!("@{}", vip.address))
            .args([
                "who.test", "A", "+time=2", "+tries=1", "+noall", "+answer", "+stats",
            ])
            .output()
            .expect("prerequisite missing: dig (apt-get install bind9-dnsutils; ./x setup does)");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "dig failed: {text}");
        assert!(
            text.contains(&format!("SERVER: {}#53", vip.address)),
            "{text}"
        );
        let answer = text
            .lines()
            .find(|line| line.starts_with("who.test."))
            .and_then(|line| line.split_whitespace().last())
            .unwrap_or_else(|| panic!("no answer in: {text}"))
            .to_owned();
        answers.insert(answer);
    }
    // Both real servers answered (each dig uses a new socket: P(all one) = 2 * 2^-20).
    assert_eq!(
        answers,
        BTreeSet::from(["192.0.2.1".to_owned(), "192.0.2.2".to_owned()])
    );
    drop(servers);
}

fn udp_replies_appear_from_the_vip_connected_or_not(family: Family) {
    let sandbox = Sandbox::new(&format!("udp{}", family.tag()));
    let servers = family.udp_servers(&sandbox, 3, 2, 9000);
    let vip = family.frontend(20, 90, Protocol::Udp);
    let _dataplane = serve(&sandbox, vip, &servers);

    let shown = addr(&vip).to_string();
    let mut cases = vec![
        ("udp", addr(&vip), shown.clone()),
        ("udp-connected", addr(&vip), shown),
    ];
    if family == Family::V4 {
        // Dual-stack sockets to the IPv4-mapped VIP (sendmsg6/recvmsg6/connect6).
        let mapped: SocketAddr = "[::ffff:10.96.0.20]:90".parse().expect("address");
        cases.push(("udp", mapped, mapped.to_string()));
        cases.push(("udp-connected", mapped, mapped.to_string()));
    }
    for (mode, target, peer) in cases {
        let attempts = sandbox.probe(mode, target, 40);
        let tally = tally(&attempts);
        assert!(
            tally.contains_key("u1") && tally.contains_key("u2"),
            "{mode} {target}: both backends should answer some sockets: {tally:?}"
        );
        assert_peer(&attempts, &peer, &format!("{mode} {target}"));
    }
    // Direct datagrams to a backend keep the backend as their source.
    for attempt in sandbox.probe("udp", servers[0].addr, 5) {
        assert_eq!(
            attempt.peer,
            Some(servers[0].addr.to_string()),
            "{attempt:?}"
        );
    }
}

fn a_frontend_without_backends_refuses_like_kube_proxy(family: Family) {
    let sandbox = Sandbox::new(&format!("refuse{}", family.tag()));
    let tcp = family.frontend(30, 80, Protocol::Tcp);
    let udp = family.frontend(30, 53, Protocol::Udp);
    let mut desired = Desired::default();
    desired.insert(tcp, FrontendSpec::default());
    desired.insert(udp, FrontendSpec::default());
    let dataplane = sandbox.programmed(&desired);

    for (mode, target) in [
        ("tcp", addr(&tcp)),
        ("udp", addr(&udp)),
        ("udp-connected", addr(&udp)),
    ] {
        for attempt in sandbox.probe(mode, target, 3) {
            assert_eq!(
                attempt.error.as_deref(),
                Some("ECONNREFUSED"),
                "{mode}: {attempt:?}"
            );
        }
    }
    assert!(dataplane.counters().expect("counters").no_backend >= 9);
}

fn a_process_outside_the_cgroup_is_not_translated(family: Family) {
    let sandbox = Sandbox::new(&format!("outside{}", family.tag()));
    let servers = family.tcp_servers(&sandbox, 4, 1, 8080);
    // The frontend address is itself served, untranslated, by another server.
    let direct = NamedServer::tcp_at("direct", SocketAddr::new(family.local(&sandbox, 9, 9), 80));
    let vip = Frontend {
        address: direct.addr.ip(),
        port: 80,
        protocol: Protocol::Tcp,
        scope: Scope::Internal,
    };
    let _dataplane = serve(&sandbox, vip, &servers);

    let inside = tally(&sandbox.probe("tcp", addr(&vip), 10));
    assert_eq!(inside.get("b1"), Some(&10), "{inside:?}");
    let outside = tally(&sandbox.probe_outside("tcp", addr(&vip), 10));
    assert_eq!(outside.get("direct"), Some(&10), "{outside:?}");
}

fn session_affinity_sticks_within_the_timeout_and_reselects_after(family: Family) {
    let sandbox = Sandbox::new(&format!("affinity{}", family.tag()));
    let servers = family.tcp_servers(&sandbox, 5, 3, 8080);
    let vip = family.frontend(40, 80, Protocol::Tcp);
    let mut desired = Desired::default();
    desired.insert(
        vip,
        FrontendSpec {
            affinity_timeout_seconds: Some(1),
            source_ranges: None,
            maglev: false,
            ..spec(&servers)
        },
    );
    let dataplane = sandbox.programmed(&desired);

    // After each expiry a fresh draw over three backends: rounds go on until a second
    // backend shows. All 20 on one backend by chance has p = 3^-19 (8 rounds gave 1 in
    // 2,187, and CI once hit it).
    const ROUNDS: usize = 20;
    let mut chosen = BTreeSet::new();
    let mut rounds = 0;
    let mut last = String::new();
    while chosen.len() < 2 && rounds < ROUNDS {
        if rounds > 0 {
            std::thread::sleep(Duration::from_millis(1300));
        }
        // Every probe process shares the sandbox's network namespace: one client.
        let tally = tally(&sandbox.probe("tcp", addr(&vip), 15));
        assert_eq!(tally.len(), 1, "round {rounds}: not sticky: {tally:?}");
        last.clone_from(tally.keys().next().expect("one backend"));
        chosen.extend(tally.into_keys());
        rounds += 1;
    }
    // `socklb inspect` names the backend the client sticks to.
    let inspection = sandbox.inspect();
    let server = servers
        .iter()
        .find(|server| server.name == last)
        .expect("the last round's server");
    let entry = &inspection["affinity"][0];
    assert_eq!(
        (
            entry["backend"]["address"].as_str(),
            entry["backend"]["port"].as_u64()
        ),
        (
            Some(server.addr.ip().to_string().as_str()),
            Some(u64::from(server.addr.port()))
        ),
        "{inspection}"
    );
    assert!(entry["idle_seconds"].as_u64() <= Some(1), "{inspection}");
    assert_eq!(entry["expired"].as_bool(), Some(false), "{inspection}");
    // Past the timeout, inspect says the entry no longer holds the client.
    eventually(
        "inspect marks the entry expired",
        Duration::from_secs(10),
        || {
            let inspection = sandbox.inspect();
            (inspection["affinity"][0]["expired"].as_bool() == Some(true))
                .then_some(())
                .ok_or_else(|| inspection.to_string())
        },
    );
    assert!(
        chosen.len() >= 2,
        "never re-selected after the timeout in {ROUNDS} rounds: {chosen:?}"
    );
    // The first connection of each round draws; the other 14 are affinity hits.
    let hits = dataplane.counters().expect("counters").affinity_hits;
    assert!(
        hits >= rounds as u64 * 14,
        "{hits} affinity hits in {rounds} rounds"
    );
}

/// Each family's service and backend maps grow with that family's frontends: 700 Services
/// of 10 endpoints (7,700 service entries, 7,000 backends) grow this family's maps past
/// their starting sizes (8,192 and 4,096 entries), while the other family's stay there.
fn a_familys_maps_grow_with_its_own_frontends_only(family: Family) {
    let sandbox = Sandbox::new(&format!("grow{}", family.tag()));
    let servers = family.tcp_servers(&sandbox, 14, 2, 8080);
    let vip = family.frontend(0x70, 80, Protocol::Tcp);
    let mut desired = Desired::default();
    desired.insert(vip, spec(&servers));
    // Addresses nobody connects to: frontends in 10.97/16 or fd00:97::/64, backends in
    // 10.98/16 or fd00:98::/64.
    let address = |prefix: u8, index: u32| -> std::net::IpAddr {
        match family {
            Family::V4 => {
                let [_, _, high, low] = index.to_be_bytes();
                Ipv4Addr::new(10, prefix, high, low).into()
            }
            Family::V6 => {
                let net = 0xfd00_0000 | u128::from(prefix) << 16;
                std::net::Ipv6Addr::from(net << 96 | u128::from(index)).into()
            }
        }
    };
    for service in 0..700 {
        let frontend = Frontend {
            address: address(97, service),
            ..vip
        };
        let backends = (0..10)
            .map(|endpoint| BackendAddr::local(address(98, service * 10 + endpoint), 8080))
            .collect();
        desired.insert(
            frontend,
            FrontendSpec {
                backends,
                ..spec(&servers)
            },
        );
    }
    let _dataplane = sandbox.programmed(&desired);

    let size = |name: &str| {
        aya::maps::MapInfo::from_pin(sandbox.pin_dir.join(name))
            .unwrap_or_else(|e| panic!("map info of {name}: {e}"))
            .max_entries()
    };
    let (ours, theirs) = match family {
        Family::V4 => (
            [map_names::SERVICES, map_names::BACKENDS],
            [map_names::SERVICES6, map_names::BACKENDS6],
        ),
        Family::V6 => (
            [map_names::SERVICES6, map_names::BACKENDS6],
            [map_names::SERVICES, map_names::BACKENDS],
        ),
    };
    // A service map starts at 4,096 master entries (for 8,192 service entries).
    assert!(size(ours[0]) > 4_096, "{}: {}", ours[0], size(ours[0]));
    assert!(size(ours[1]) > 4_096, "{}: {}", ours[1], size(ours[1]));
    assert_eq!(size(theirs[0]), 4_096, "{} grew", theirs[0]);
    assert_eq!(size(theirs[1]), 4_096, "{} grew", theirs[1]);
    let answered = tally(&sandbox.probe("tcp", addr(&vip), 10));
    assert_eq!(answered.values().sum::<usize>(), 10, "{answered:?}");
    assert!(
        answered
            .keys()
            .all(|server| server == "b1" || server == "b2"),
        "{answered:?}"
    );
}

/// The whole path for one family: a Service (`ipFamilies` of that family) and its
/// EndpointSlice (`addressType` of that family) read by `socklb run` from manifests, then
/// real connections to the ClusterIP.
fn the_real_agent_serves_a_service_of_the_family_from_manifests(family: Family) {
    let sandbox = Sandbox::new(&format!("agent{}", family.tag()));
    let servers = family.tcp_servers(&sandbox, 13, 2, 8080);
    let vip = family.frontend(0x60, 80, Protocol::Tcp);
    let kind = match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    };
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.77.1"));
    let endpoints: Vec<(String, &str)> = servers
        .iter()
        .map(|server| (server.addr.ip().to_string(), "node-a"))
        .collect();
    manifests.service(
        "web",
        &service_yaml(
            "web",
            &vip.address.to_string(),
            80,
            &format!("  ipFamilies: [{kind}]\n"),
        ),
        &endpoint_slice("web-1", "web", kind, ("http", 8080, "TCP"), &endpoints),
    );
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);

    let attempts = sandbox.probe("tcp", addr(&vip), 40);
    let tally = tally(&attempts);
    assert!(
        tally.contains_key("b1") && tally.contains_key("b2") && tally.len() == 2,
        "{tally:?}\n{}",
        agent.log()
    );
    assert_peer(&attempts, &addr(&vip).to_string(), "the VIP is shown");
}

/// One dual-stack Service (`ipFamilies: [IPv4, IPv6]`, a ClusterIP of each family, an
/// EndpointSlice of each family) through `socklb run`: IPv4 clients reach only the IPv4
/// endpoints, IPv6 clients only the IPv6 ones, and each sees its own family's VIP.
#[test]
fn a_dual_stack_service_sends_each_family_to_its_own_endpoints() {
    let sandbox = Sandbox::new("dual-stack");
    let servers: Vec<NamedServer> = [(Family::V4, "v4-"), (Family::V6, "v6-")]
        .into_iter()
        .flat_map(|(family, prefix)| {
            let sandbox = &sandbox;
            (1..=2).map(move |host| {
                let address = SocketAddr::new(family.local(sandbox, 14, host), 8080);
                NamedServer::tcp_at(&format!("{prefix}{host}"), address)
            })
        })
        .collect();
    let (vip4, vip6) = (
        Family::V4.frontend(0x61, 80, Protocol::Tcp),
        Family::V6.frontend(0x61, 80, Protocol::Tcp),
    );
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.77.1"));
    let slice = |family: &str, addresses: &[&NamedServer]| {
        let endpoints: Vec<(String, &str)> = addresses
            .iter()
            .map(|s| (s.addr.ip().to_string(), "node-a"))
            .collect();
        let name = format!("web-{family}");
        endpoint_slice(&name, "web", family, ("http", 8080, "TCP"), &endpoints)
    };
    let (v4, v6): (Vec<&NamedServer>, Vec<&NamedServer>) =
        servers.iter().partition(|s| s.addr.is_ipv4());
    manifests.service(
        "web",
        &format!(
            "apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: \"{a}\"
  clusterIPs: [\"{a}\", \"{b}\"]
  ports: [{{name: http, port: 80, protocol: TCP}}]
",
            a = vip4.address,
            b = vip6.address
        ),
        &format!("{}---\n{}", slice("IPv4", &v4), slice("IPv6", &v6)),
    );
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);

    for (vip, prefix) in [(vip4, "v4-"), (vip6, "v6-")] {
        let attempts = sandbox.probe("tcp", addr(&vip), 40);
        let tally = tally(&attempts);
        assert!(
            tally.len() == 2 && tally.keys().all(|name| name.starts_with(prefix)),
            "{vip}: {tally:?}\n{}",
            agent.log()
        );
        assert_peer(
            &attempts,
            &addr(&vip).to_string(),
            "the family's VIP is shown",
        );
    }
}

#[test]
fn agent_restart_keeps_translating_and_adopts_the_pinned_state() {
    let sandbox = Sandbox::new("restart");
    let TwoBackendWeb { manifests, vip, .. } = &TwoBackendWeb::new(&sandbox, 7, 60);
    let vip = *vip;

    let first = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    let entries_before = service_entries(&sandbox);
    let client = sandbox.spawn_probe("tcp", vip, 400, 5);
    std::thread::sleep(Duration::from_millis(300));
    first.stop();
    let second = Agent::start_after_a_gap(&sandbox, &manifests.path);
    let log = second.log();
    assert!(
        log.contains("full=true services=1 writes=0"),
        "the new agent rewrote adopted state: {log}"
    );
    assert!(
        log.contains("Replaced"),
        "the new agent did not replace the programs in place: {log}"
    );
    let attempts = client.wait();
    second.stop();

    assert_eq!(attempts.len(), 400);
    for attempt in &attempts {
        let reply = attempt.reply.as_deref().unwrap_or_default();
        assert!(
            reply == "b1" || reply == "b2",
            "untranslated or failed: {attempt:?}"
        );
    }
    assert_eq!(
        service_entries(&sandbox),
        entries_before,
        "state duplicated"
    );
    // Exactly one program per hook on the cgroup: replaced, not added.
    let output = Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(&sandbox.cgroup)
        .output()
        .expect("prerequisite missing: bpftool (./x setup installs it)");
    let text = String::from_utf8_lossy(&output.stdout);
    for program in socklb_abi::program_names::SOCK_ADDR {
        let attached = text
            .lines()
            .filter(|l| l.split_whitespace().any(|w| w == program))
            .count();
        assert_eq!(attached, 1, "{program} attached {attached} times:\n{text}");
    }
}

#[test]
fn cleanup_detaches_the_programs_and_removes_only_socklb_pins() {
    let sandbox = Sandbox::new("cleanup");
    let servers = tcp_backends([127, 0, 12], 1, 8080);
    // The VIP is also served untranslated, so that "not translated" is visible.
    let _direct = NamedServer::tcp(
        "direct",
        SocketAddrV4::new(Ipv4Addr::new(127, 0, 12, 99), 80),
    );
    let vip = frontend([127, 0, 12, 99], 80, Protocol::Tcp);
    drop(serve(&sandbox, vip, &servers));
    assert_eq!(
        tally(&sandbox.probe("tcp", addr(&vip), 3)).get("b1"),
        Some(&3)
    );

    // Something in the pin directory that socklb did not create; removed again even when
    // an assertion below fails, so that the sandbox can remove the pin directory.
    let foreign = RemovedOnDrop(sandbox.pin_dir.join("not-socklb"));
    std::fs::create_dir(&foreign.0).expect("create a foreign directory on bpffs");

    // While an agent holds the pin directory (this process, as the agent would), cleanup
    // refuses, names the holder and leaves the node served.
    let lock =
        lock_pin_dir(&sandbox.pin_dir, Duration::ZERO, &|| false).expect("lock the pin directory");
    let refused = Command::new(agent_bin())
        .args(["cleanup", "--bpffs"])
        .arg(&sandbox.pin_dir)
        .output()
        .expect("run socklb cleanup");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    let pid = std::process::id();
    assert!(
        !refused.status.success()
            && stderr.contains("a socklb agent is running")
            && stderr.contains(&format!("pid {pid}"))
            && stderr.contains("stop it first"),
        "cleanup while the lock is held: {refused:?}"
    );
    assert_eq!(
        tally(&sandbox.probe("tcp", addr(&vip), 3)).get("b1"),
        Some(&3),
        "a refused cleanup leaves the programs attached"
    );
    // --force (run in the agent's own pod) removes them all the same.
    sandbox.socklb(&["cleanup", "--force"]);
    drop(lock);

    assert_eq!(
        tally(&sandbox.probe("tcp", addr(&vip), 3)).get("direct"),
        Some(&3)
    );
    let left: Vec<_> = std::fs::read_dir(&sandbox.pin_dir)
        .expect("the pin directory stays: it is not empty")
        .map(|entry| entry.expect("entry").file_name())
        .collect();
    assert_eq!(left, ["not-socklb"]);
    drop(foreign);
    let attached = Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(&sandbox.cgroup)
        .output()
        .expect("prerequisite missing: bpftool");
    assert!(
        !String::from_utf8_lossy(&attached.stdout).contains("socklb_"),
        "programs still attached: {}",
        String::from_utf8_lossy(&attached.stdout)
    );
}

#[test]
fn bpftool_map_dump_shows_named_fields() {
    let sandbox = Sandbox::new("bpftool");
    let vip = frontend([10, 96, 0, 70], 80, Protocol::Tcp);
    let mut desired = Desired::default();
    desired.insert(
        vip,
        FrontendSpec {
            backends: vec![socklb_agent::dataplane::BackendAddr::local(
                Ipv4Addr::new(127, 0, 8, 1),
                8080,
            )],
            affinity_timeout_seconds: Some(30),
            source_ranges: None,
            maglev: false,
            no_endpoints: false,
        },
    );
    let _dataplane = sandbox.programmed(&desired);
    let dump = |map: &str| {
        let pinned = sandbox.pin_dir.join(map);
        bpftool(&[
            "map".as_ref(),
            "dump".as_ref(),
            "pinned".as_ref(),
            pinned.as_os_str(),
        ])
    };
    let services = dump(map_names::SERVICES);
    for field in [
        "\"address\"",
        "\"port\"",
        "\"slot\"",
        "\"count\": 1",
        "\"service_id\"",
        "\"affinity_timeout_s\": 30",
        "\"first_slot\"",
        "\"slot_room\": 1",
    ] {
        assert!(services.contains(field), "{field} missing in:\n{services}");
    }
    // The slot array holds backend ids, two slots an entry: the one backend's is 1.
    let slots = dump(map_names::SLOTS);
    assert!(
        slots.contains("\"value\": [1,0") || slots.contains("\"value\": [0,1"),
        "{slots}"
    );
    let backends = dump(map_names::BACKENDS);
    assert!(backends.contains("\"protocol\": 6"), "{backends}");
}

#[test]
fn a_full_map_refuses_only_the_frontend_that_does_not_fit() {
    let sandbox = Sandbox::new("full");
    let servers = tcp_backends([127, 0, 10], 3, 8080);
    let small = frontend([10, 96, 0, 80], 80, Protocol::Tcp);
    let big = frontend([10, 96, 0, 81], 80, Protocol::Tcp);
    let mut dataplane = load_with_service_entries(&sandbox, 5);
    let mut desired = Desired::default();
    desired.insert(small, spec(&servers[..1]));
    dataplane.apply(&desired).expect("apply");
    sandbox.attach(&mut dataplane);

    desired.insert(big, spec(&servers));
    let report = dataplane.apply(&desired).expect("apply");
    assert_eq!(report.rejected.len(), 1);
    let message = report.rejected[0].to_string();
    assert!(
        message.contains(map_names::SERVICES) && message.contains("--max-service-entries"),
        "{message}"
    );
    assert!(message.contains("refused until it fits"), "{message}");
    // The frontend that fit keeps working; the other is not half-written: it has only its
    // master entry, without backends, so connecting is refused, not left untranslated.
    assert_eq!(
        tally(&sandbox.probe("tcp", addr(&small), 5)).get("b1"),
        Some(&5)
    );
    assert_eq!(
        tally(&sandbox.probe("tcp", addr(&big), 3)).get("error: ECONNREFUSED"),
        Some(&3)
    );
    assert_eq!(service_entries(&sandbox), 3);
}

#[test]
fn a_pinned_map_with_another_capacity_is_replaced_not_reused() {
    let sandbox = Sandbox::new("relayout");
    let servers = tcp_backends([127, 0, 11], 1, 8080);
    let vip = frontend([10, 96, 0, 90], 80, Protocol::Tcp);
    let mut desired = Desired::default();
    desired.insert(vip, spec(&servers));
    drop(sandbox.programmed(&desired));

    let mut dataplane = load_with_service_entries(&sandbox, 1024);
    let report = dataplane.apply(&desired).expect("apply");
    assert!(report.writes > 0, "the new map must be programmed");
    sandbox.attach(&mut dataplane);
    let info =
        aya::maps::MapInfo::from_pin(sandbox.pin_dir.join(map_names::SERVICES)).expect("map info");
    // A master entry per two service entries, at least (a frontend's least).
    assert_eq!(info.max_entries(), 512);
    assert_eq!(
        tally(&sandbox.probe("tcp", addr(&vip), 5)).get("b1"),
        Some(&5)
    );
}

#[test]
fn an_older_agents_service_map_gives_its_frontends_the_room_first() {
    let sandbox = Sandbox::new("retired");
    let servers = tcp_backends([127, 0, 12], 1, 8080);
    // In frontend order `first` comes before `serving`; room for one of them only.
    let first = frontend([10, 96, 0, 91], 80, Protocol::Tcp);
    let serving = frontend([10, 96, 0, 92], 80, Protocol::Tcp);
    // The service map an older agent pinned, under its layout's name (its slots in the same
    // map, 24-byte values), holding `serving`.
    std::fs::create_dir_all(&sandbox.pin_dir).expect("create the pin directory");
    let name = map_names::RETIRED_SERVICES[1];
    let old = sandbox.pin_dir.join(name);
    create_pinned_map(&old, name, &["hash", "12", "24", "16"], 0);
    let mut older: aya::maps::HashMap<_, ServiceKey, [u8; 24]> =
        aya::maps::Map::HashMap(aya::maps::MapData::from_pin(&old).expect("open the old map"))
            .try_into()
            .expect("the old service map");
    older
        .insert(&internal_tcp_key(serving, 0), &[0; 24], 0)
        .expect("write the old map");

    let mut dataplane = load_with_service_entries(&sandbox, 2);
    let mut desired = Desired::default();
    desired.insert(first, spec(&servers));
    desired.insert(serving, spec(&servers));
    let report = dataplane.apply(&desired).expect("apply");
    sandbox.attach(&mut dataplane);
    let rejected: Vec<_> = report.rejected.iter().map(|r| r.frontend()).collect();
    assert_eq!(rejected, [first], "{:?}", report.rejected);
    assert!(
        !old.exists(),
        "the older agent's service map is still pinned"
    );
    assert_eq!(
        tally(&sandbox.probe("tcp", addr(&serving), 5)).get("b1"),
        Some(&5)
    );
}

/// A map an older agent pinned at `path`, made by bpftool: `[type, key size, value size,
/// entries]` and its map flags.
fn create_pinned_map(path: &std::path::Path, name: &str, layout: &[&str; 4], flags: u32) {
    let [kind, key, value, entries] = layout;
    socklb_tests::run(
        Command::new("bpftool")
            .args(["map", "create"])
            .arg(path)
            .args(["type", kind, "key", key, "value", value, "entries", entries])
            .args(["name", name, "flags", &flags.to_string()]),
    );
}

/// An older agent's flow filter of another layout: its programs keep it until the new
/// ones replace them, and the new ones no longer mark it, so the new agent makes it
/// distrusted (every packet looked up) before it unpins it.
#[test]
fn an_older_agents_flow_filter_is_distrusted_before_its_pin_goes() {
    let sandbox = Sandbox::new("oldctf");
    std::fs::create_dir_all(&sandbox.pin_dir).expect("create the pin directory");
    let name = map_names::RETIRED_FLOW_FILTERS[0];
    let old = sandbox.pin_dir.join(name);
    // An mmapable array (BPF_F_MMAPABLE) of 8,193 words, as the older agent pinned it.
    create_pinned_map(&old, name, &["array", "4", "8", "8193"], 1024);
    let mut older: aya::maps::Array<_, u64> =
        aya::maps::Map::Array(aya::maps::MapData::from_pin(&old).expect("open the old filter"))
            .try_into()
            .expect("the old filter");
    older.set(0, &1, 0).expect("trust the old filter");

    drop(sandbox.programmed(&Desired::default()));
    assert!(
        !old.exists(),
        "the older agent's flow filter is still pinned"
    );
    assert_eq!(
        older.get(&0, 0).expect("the old filter's ready word"),
        0,
        "the older programs must look up every packet until they are replaced"
    );
}

#[test]
fn an_older_agents_service_and_backend_maps_give_way_to_the_slot_array_and_its_frontend_serves() {
    let sandbox = Sandbox::new("oldsvc");
    let servers = tcp_backends([127, 0, 13], 1, 8080);
    let vip = frontend([10, 96, 0, 93], 80, Protocol::Tcp);
    let mut desired = Desired::default();
    desired.insert(vip, spec(&servers));
    let pinned = |name: &str| {
        aya::maps::MapData::from_pin(sandbox.pin_dir.join(name)).expect("open a pinned map")
    };
    let create = |name: &str, key: &str, value: &str| {
        create_pinned_map(
            &sandbox.pin_dir.join(name),
            name,
            &["hash", key, value, "16"],
            0,
        );
    };

    // An older agent's maps: the frontend's master and its slot in one hash map (24-byte
    // values), its backend under id 7 (ids only grew then) in a backend hash map, and
    // neither the slot array nor the backend array.
    drop(sandbox.programmed(&desired));
    let backend = aya::maps::Array::<_, socklb_abi::Backend>::try_from(aya::maps::Map::Array(
        pinned(map_names::BACKENDS),
    ))
    .expect("the backend array")
    .get(&1, 0)
    .expect("backend 1");
    for name in [map_names::SERVICES, map_names::SLOTS, map_names::BACKENDS] {
        std::fs::remove_file(sandbox.pin_dir.join(name)).expect("unpin a map of this layout");
    }
    let (old_services, old_backends) = (map_names::RETIRED_SERVICES[1], "socklb_be_v2");
    create(old_services, "12", "24");
    create(old_backends, "4", "8");
    let mut services: aya::maps::HashMap<_, ServiceKey, [u8; 24]> =
        aya::maps::Map::HashMap(pinned(old_services))
            .try_into()
            .expect("the old service map");
    // The old value: backend id 7 at offset 0 (a slot), count 1 at offset 10 (the master).
    let mut slot = [0; 24];
    slot[..4].copy_from_slice(&7u32.to_ne_bytes());
    let mut master = [0; 24];
    master[10..12].copy_from_slice(&1u16.to_ne_bytes());
    services
        .insert(&internal_tcp_key(vip, 0), &master, 0)
        .expect("write the old master");
    services
        .insert(&internal_tcp_key(vip, 1), &slot, 0)
        .expect("write the old slot");
    let mut backends: aya::maps::HashMap<_, u32, socklb_abi::Backend> =
        aya::maps::Map::HashMap(pinned(old_backends))
            .try_into()
            .expect("the old backend map");
    backends
        .insert(&7, &backend, 0)
        .expect("write the old backend");

    // The new agent: the master names a range of the slot array, whose slot names the
    // backend under a new, dense id in the new array; the older maps are unpinned.
    let _dataplane = sandbox.programmed(&desired);
    for name in [old_services, old_backends] {
        assert!(
            !sandbox.pin_dir.join(name).exists(),
            "the older agent's {name} is still pinned"
        );
    }
    let services: aya::maps::HashMap<_, ServiceKey, ServiceEntry> =
        aya::maps::Map::HashMap(pinned(map_names::SERVICES))
            .try_into()
            .expect("the service map");
    let master = services
        .get(&internal_tcp_key(vip, 0), 0)
        .expect("the master");
    assert_eq!((master.count, master.slot_room), (1, 1), "{master:?}");
    let slots: aya::maps::Array<_, socklb_abi::SlotPair> =
        aya::maps::Map::Array(pinned(map_names::SLOTS))
            .try_into()
            .expect("the slot array");
    let pair = slots.get(&(master.first_slot / 2), 0).expect("slot 1");
    assert_eq!(pair[master.first_slot as usize % 2], 1);
    assert_eq!(
        aya::maps::Array::<_, socklb_abi::Backend>::try_from(aya::maps::Map::Array(pinned(
            map_names::BACKENDS
        )))
        .expect("the backend array")
        .get(&1, 0)
        .expect("backend 1"),
        backend
    );
    assert_eq!(
        tally(&sandbox.probe("tcp", addr(&vip), 5)).get("b1"),
        Some(&5)
    );
}

#[test]
fn a_pin_directory_outside_bpffs_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("socklb-test-{}-nobpffs", std::process::id()));
    let error = Dataplane::load(Config {
        pin_dir: dir.clone(),
        ..Config::default()
    })
    .err()
    .expect("loading with pins outside bpffs must fail");
    assert!(matches!(error, DataplaneError::Host(_)), "{error:?}");
    // The fix is another --bpffs, not a bpffs mounted over the temporary directory.
    let message = error.to_string();
    assert!(
        message.contains("is not on a bpffs")
            && message.contains("--bpffs")
            && !message.contains("mount -t bpf"),
        "{message}"
    );
    assert!(!dir.exists(), "nothing may be created when the check fails");
}

/// A bpffs mounted by the test on a directory of its own, unmounted and removed on drop.
struct OwnBpffs(std::path::PathBuf);

impl OwnBpffs {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("socklb-test-{}-bpffs", std::process::id()));
        std::fs::create_dir(&dir).expect("the mount point");
        let mounted = Self(dir);
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpf"])
            .arg(&mounted.0)
            .status()
            .expect("mount");
        assert!(status.success(), "mount -t bpf on {}", mounted.0.display());
        mounted
    }
}

impl Drop for OwnBpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A pin directory that is not socklb's alone (a bpffs mount, which other programs share
/// as they share /sys/fs/bpf, or a directory holding another program's pins) is refused
/// with the fix, and left as it was: the agent made such a directory private to itself.
#[test]
fn a_pin_directory_that_is_not_socklbs_alone_is_refused_and_left_as_it_was() {
    use std::os::unix::fs::PermissionsExt as _;
    let bpffs = OwnBpffs::new();
    let mode = |path: &std::path::Path| {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o7777
    };
    std::fs::set_permissions(&bpffs.0, std::fs::Permissions::from_mode(0o1777))
        .expect("chmod the mount");
    let shared = bpffs.0.join("tc");
    std::fs::create_dir_all(shared.join("globals")).expect("another program's directory");
    for (pin_dir, refusal) in [
        (&bpffs.0, "is a bpffs mount itself"),
        (&shared, "holds what socklb did not pin (globals)"),
    ] {
        let entries = || {
            let mut entries: Vec<_> = std::fs::read_dir(pin_dir)
                .expect("read the directory")
                .filter_map(Result::ok)
                .map(|entry| entry.file_name())
                .collect();
            entries.sort();
            entries
        };
        let before = (mode(pin_dir), entries());
        let error = Dataplane::load(Config {
            pin_dir: pin_dir.clone(),
            ..Config::default()
        })
        .err()
        .expect("a pin directory not socklb's alone must be refused");
        let message = error.to_string();
        assert!(
            message.contains(refusal) && message.contains("--bpffs"),
            "{message}"
        );
        assert_eq!(
            (mode(pin_dir), entries()),
            before,
            "{}: its mode or entries changed",
            pin_dir.display()
        );
    }
}

#[test]
fn a_cgroup_path_outside_cgroup_v2_is_a_clear_error() {
    let sandbox = Sandbox::new("nocgroup");
    let error = sandbox
        .load(Config {
            cgroup: Some(std::env::temp_dir()),
            ..sandbox.config()
        })
        .err()
        .expect("a non-cgroup2 directory must be refused");
    let message = error.to_string();
    assert!(
        message.contains("not a cgroup v2 directory") && message.contains("--cgroup-path"),
        "{message}"
    );
    sandbox.assert_no_pins("nothing may be pinned when the check fails");
}

/// Loads and attaches the datapath with one frontend, `vip` over `servers`.
fn serve(sandbox: &Sandbox, vip: Frontend, servers: &[NamedServer]) -> Dataplane {
    let mut desired = Desired::default();
    desired.insert(vip, spec(servers));
    sandbox.programmed(&desired)
}

/// The service-map key of `slot` of an IPv4 TCP ClusterIP `frontend`.
fn internal_tcp_key(frontend: Frontend, slot: u16) -> ServiceKey {
    let std::net::IpAddr::V4(address) = frontend.address else {
        panic!("the frontend is IPv4");
    };
    ServiceKey {
        address: u32::from(address).to_be(),
        port: frontend.port.to_be(),
        protocol: socklb_abi::PROTO_TCP,
        scope: socklb_abi::SCOPE_INTERNAL,
        slot,
        pad: 0,
    }
}

/// Loads the datapath (not attached) with room for `service_entries` service map entries.
fn load_with_service_entries(sandbox: &Sandbox, service_entries: u32) -> Dataplane {
    let capacities = Capacities {
        service_entries,
        ..Capacities::default()
    };
    sandbox
        .load_with(capacities)
        .unwrap_or_else(|e| panic!("load with {service_entries} service entries: {e}"))
}

/// Master entries and the slots they count: the service-map entries the agent accounts for.
fn service_entries(sandbox: &Sandbox) -> usize {
    let map = aya::maps::Map::HashMap(
        aya::maps::MapData::from_pin(sandbox.pin_dir.join(map_names::SERVICES))
            .expect("open service map"),
    );
    let map: aya::maps::HashMap<_, socklb_abi::ServiceKey, socklb_abi::ServiceEntry> =
        map.try_into().expect("service map");
    map.iter()
        .map(|entry| 1 + usize::from(entry.expect("a master entry").1.count))
        .sum()
}

/// A directory the test made, removed when the test ends however it ends.
struct RemovedOnDrop(std::path::PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}
