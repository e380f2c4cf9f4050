//! The per-packet path: workloads on node1 whose sockets the socket hooks never see (a
//! VM, pod1's processes outside the served cgroup, a meshed pod's sidecar under
//! `--socket-lb-scope host`) reach ClusterIPs through the TC program on their host-side
//! device, which the agent finds by itself. On the LAN of `socklb_tests::lan`, both
//! families.
use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader},
    net::{IpAddr, SocketAddr},
    process::Stdio,
    time::Duration,
};

use aya::maps::{Array, Map, MapData};
use socklb_abi::{
    FLOW_FILTER_READY, FRONTEND_FILTER_READY, POD_DEVICE_VETH, fold_ipv6, frontend_filter_slot,
    ipv6_words, map_names,
};
use socklb_tests::{
    Agent, KillOnDrop, assert_logged,
    clients::Attempt,
    command_in_cgroup, explain_command,
    family::Family,
    forged::{self, Capture, Flags},
    hold::Holder,
    hold_bin,
    lan::{Addresses, LanNode, VM, VM6, answers, cni_netfilter_rules, servers_of},
    mesh_proxy_bin,
    netns::{Netns, veth},
    privileges::chart_agent,
    run, stdout_of,
    test_run::ifindex,
    wait,
};

socklb_tests::for_each_family!(
    a_vm_reaches_cluster_ips_through_its_device,
    a_vm_s_flows_to_a_local_pod_bypass_the_node_s_netfilter_under_direct_delivery,
    a_vm_s_client_ip_affinity_holds_and_inspect_names_its_backend,
    a_pod_that_is_its_own_backend_gets_an_answer,
    a_refused_connection_closes_its_whole_flow,
    a_blocking_connect_to_a_service_without_endpoints_is_refused_at_its_first_syn,
    a_port_used_again_while_its_last_flow_closes_reaches_the_backend_chosen_again,
    a_meshed_pod_s_sidecar_sees_the_service_address_under_host_scope,
    a_pod_s_annotations_choose_its_path_under_the_default_scope,
    a_pod_whose_device_the_per_packet_path_does_not_serve_keeps_the_socket_path,
    a_meshed_pod_plugged_after_its_namespace_leaves_the_socket_hooks_at_once,
    a_pod_s_established_flow_survives_a_change_of_its_path,
    a_flow_goes_on_across_a_restart_and_the_upgrade_to_the_flow_filter,
    the_frontend_filter_follows_services_as_they_come_and_go,
    an_idle_flow_outlives_churn_as_the_agent_removes_expired_flows,
);

fn a_vm_reaches_cluster_ips_through_its_device(family: Family) {
    let node = LanNode::new(family, "pp-vm", "v");
    let vm = node.lan.vm();
    let a = &node.a;
    let _servers = [node.tcp_servers(8080), node.udp_servers(5353)];
    node.write(
        "web.yaml",
        &a.exposed("web", 60)
            .http_and_dns()
            .endpoints(&[a.pod1_endpoint(), a.pod2_endpoint()])
            .yaml(),
    );
    let agent = node.agent(&[]);
    assert_logged(
        &agent.log(),
        &[r#"program="socklb_tc_pod" device="vm1""#],
        "the per-packet path attaches to the VM's device without being told",
    );
    let vm_address = match family {
        Family::V4 => VM,
        Family::V6 => VM6,
    };
    let vip = family.vip(60).to_string();

    // (protocol, the client's address and port as the server saw it): one flow each (a UDP
    // client port used twice is one flow).
    let mut flows = BTreeSet::new();
    for (mode, port) in [("tcp", 80), ("udp", 53)] {
        let frontend = Addresses::at(&vip, port);
        let attempts = vm.probe(mode, &frontend, 40);
        for attempt in &attempts {
            assert_eq!(
                attempt.peer.as_deref(),
                Some(frontend.as_str()),
                "{mode}: the VM sees the ClusterIP answer: {attempt:?}"
            );
        }
        assert_eq!(
            servers_of(&attempts),
            ["pod1", "pod2"],
            "{mode}: the local and the remote backend both serve"
        );
        for (server, seen) in answers(&attempts) {
            assert_eq!(
                seen.ip().to_string(),
                vm_address,
                "{mode}: {server} sees the VM's own address (pod addresses route, no SNAT)"
            );
            flows.insert((mode, seen));
        }
    }
    let counters = node.counters();
    assert!(
        counters.pod_flows >= flows.len() as u64,
        "{} flows: {counters:?}",
        flows.len()
    );
    assert_eq!(counters.errors, 0, "{counters:?}");
    let seen = node.sandbox.inspect();
    assert_eq!(
        seen["external_devices"],
        serde_json::json!(["eth0"]),
        "{seen}"
    );
    assert_eq!(
        seen["pod_devices"],
        serde_json::json!(["pod1", "vm1"]),
        "inspect shows the devices of the per-packet path: {seen}"
    );
    assert_eq!(seen["pod_delivery"], "kernel", "the default: {seen}");
}

/// Under `--pod-delivery direct` a VM's flows to a pod of its node are redirected both ways
/// past the node's routing and netfilter (a CNI's rules, which drop what conntrack finds
/// INVALID, included): rules counting the packets to and from the pod's address see none
/// of theirs, where they see the VM's connection to the pod's own address. Flows to the
/// remote pod take the kernel's path as ever; the VM sees the ClusterIP answer both ways.
/// A flow made direct goes on after a restart with `--pod-delivery kernel`, both its
/// directions then through the kernel's path.
fn a_vm_s_flows_to_a_local_pod_bypass_the_node_s_netfilter_under_direct_delivery(family: Family) {
    let node = LanNode::new(family, "pp-direct", "k");
    let vm = node.lan.vm();
    let a = &node.a;
    let _servers = [node.tcp_servers(8080), node.udp_servers(5353)];
    node.write(
        "web.yaml",
        &a.exposed("web", 61)
            .http_and_dns()
            .endpoints(&[a.pod1_endpoint(), a.pod2_endpoint()])
            .yaml(),
    );
    node.write(
        "held.yaml",
        &a.exposed("held", 62)
            .port("dns", 53, 5353, 30062, "UDP")
            .endpoints(&[a.pod1_endpoint()])
            .yaml(),
    );
    cni_netfilter_rules(family);
    let to_pod1 = Counted::packets(family, "-d", a.pod1);
    let from_pod1 = Counted::packets(family, "-s", a.pod1);
    let agent = node.agent(&["--pod-delivery", "direct"]);
    let vm_address = match family {
        Family::V4 => VM,
        Family::V6 => VM6,
    };
    let vip = family.vip(61).to_string();
    for (mode, port) in [("tcp", 80), ("udp", 53)] {
        let frontend = Addresses::at(&vip, port);
        let attempts = vm.probe(mode, &frontend, 40);
        for attempt in &attempts {
            assert_eq!(
                attempt.peer.as_deref(),
                Some(frontend.as_str()),
                "{mode}: the VM sees the ClusterIP answer: {attempt:?}"
            );
        }
        for (server, seen) in answers(&attempts) {
            assert_eq!(seen.ip().to_string(), vm_address, "{mode}: {server}");
        }
        assert_eq!(
            servers_of(&attempts),
            ["pod1", "pod2"],
            "{mode}: the local and the remote backend both serve"
        );
    }
    let held_vip = Addresses::at(&family.vip(62).to_string(), 53);
    let mut command = vm.command(hold_bin());
    command.args(["udp", &held_vip]);
    let (mut held, first) = Holder::start("the VM's UDP client", command);
    let answered_by_pod1 = |held: &socklb_tests::hold::Held, case: &str| {
        let reply = held.reply.as_deref().unwrap_or_default();
        assert!(
            reply.starts_with("pod1 ") && held.peer.as_deref() == Some(held_vip.as_str()),
            "{case}: {held:?}"
        );
    };
    answered_by_pod1(&first, "made direct");
    assert_eq!(
        (to_pod1.count(), from_pod1.count()),
        (0, 0),
        "no packet of the flows to the local pod crossed the node's netfilter, either way"
    );
    let veth = POD_DEVICE_VETH;
    assert_eq!(
        pod_devices(&node),
        BTreeMap::from([(ifindex("pod1"), veth), (ifindex("vm1"), veth)]),
        "the agent lists the served pod devices, veths both"
    );
    let seen = node.sandbox.inspect();
    assert_eq!(seen["pod_delivery"], "direct", "{seen}");
    let pod1 = Addresses::at(&a.pod1.to_string(), 5353);
    let flows = seen["conntrack"].as_array().expect("conntrack");
    assert!(
        flows
            .iter()
            .any(|flow| flow["rewritten_to"] == pod1.as_str() && flow["direct"] == true),
        "inspect marks the UDP flows to the local pod direct: {flows:?}"
    );
    let direct = vm.probe("tcp", &Addresses::at(&a.pod1.to_string(), 8080), 1);
    assert_eq!(servers_of(&direct), ["pod1"], "{direct:?}");
    assert!(
        to_pod1.count() > 0 && from_pod1.count() > 0,
        "the counting rules see a connection to the pod's own address"
    );
    let counters = node.counters();
    assert_eq!(counters.errors, 0, "{counters:?}");
    assert_eq!(counters.rewrite_failed, 0, "{counters:?}");

    agent.stop();
    let seen_by_netfilter = (to_pod1.count(), from_pod1.count());
    let _agent = node.agent(&["--pod-delivery", "kernel"]);
    let again = held.ask("ping");
    answered_by_pod1(&again, "after a restart with --pod-delivery kernel");
    assert!(!again.reconnected, "the same connection: {again:?}");
    assert!(
        to_pod1.count() > seen_by_netfilter.0 && from_pod1.count() > seen_by_netfilter.1,
        "both its directions now cross the node's netfilter"
    );
}

/// The served pod devices in the pinned `socklb_podif_v1`, with their flags.
fn pod_devices(node: &LanNode) -> BTreeMap<u32, u8> {
    let pin = node.sandbox.pin_dir.join(map_names::POD_DEVICES);
    let map = MapData::from_pin(&pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
    let map: aya::maps::HashMap<_, u32, u8> =
        Map::HashMap(map).try_into().expect("the pod devices' map");
    map.iter().map(|entry| entry.expect("an entry")).collect()
}

/// A rule in node1's FORWARD chain (mangle table) that counts the packets to (`-d`) or from
/// (`-s`) one address.
struct Counted {
    save: &'static str,
    rule: String,
}

impl Counted {
    fn packets(family: Family, side: &str, address: IpAddr) -> Self {
        let (tool, save, prefix) = match family {
            Family::V4 => ("iptables", "iptables-save", 32),
            Family::V6 => ("ip6tables", "ip6tables-save", 128),
        };
        let rule = format!("-A FORWARD {side} {address}/{prefix}");
        // In node1, the namespace of this thread; it goes with it.
        run(std::process::Command::new(tool)
            .args(["-t", "mangle"])
            .args(rule.split(' ')));
        Self { save, rule }
    }

    /// Packets counted so far (`iptables-save -c`: `[packets:bytes] rule`).
    fn count(&self) -> u64 {
        let saved = stdout_of(std::process::Command::new(self.save).args(["-c", "-t", "mangle"]));
        saved
            .lines()
            .find_map(|line| {
                let (counts, rule) = line.split_once("] ")?;
                (rule == self.rule).then(|| counts.trim_start_matches('[').split(':').next())?
            })
            .and_then(|packets| packets.parse().ok())
            .unwrap_or_else(|| panic!("no counter for `{}` in:\n{saved}", self.rule))
    }
}

/// A VM's connections to a ClusterIP with `sessionAffinity: ClientIP` stick to one backend
/// (the per-packet path keys its affinity by the client's address), and `socklb inspect`
/// names that backend for the VM's address.
fn a_vm_s_client_ip_affinity_holds_and_inspect_names_its_backend(family: Family) {
    let node = LanNode::new(family, "pp-sticky", "y");
    let vm = node.lan.vm();
    let a = &node.a;
    let _servers = node.tcp_servers(8080);
    node.write(
        "sticky.yaml",
        &a.exposed("sticky", 66)
            .port("http", 80, 8080, 30066, "TCP")
            .spec("sessionAffinity: ClientIP")
            .endpoints(&[a.pod1_endpoint(), a.pod2_endpoint()])
            .yaml(),
    );
    let _agent = node.agent(&[]);
    let frontend = Addresses::at(&family.vip(66).to_string(), 80);
    let attempts = vm.probe("tcp", &frontend, 20);
    let servers = servers_of(&attempts);
    let [server] = servers.as_slice() else {
        panic!("every connection of one client goes to one backend: {attempts:?}");
    };
    let backend = if server == "pod1" { a.pod1 } else { a.pod2 };
    let vm_address = match family {
        Family::V4 => VM,
        Family::V6 => VM6,
    };
    let seen = node.sandbox.inspect();
    let entry = seen["affinity"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|entry| entry["client"] == vm_address)
        .unwrap_or_else(|| panic!("inspect shows the VM's affinity entry: {seen}"));
    assert_eq!(
        (
            entry["backend"]["address"].as_str(),
            entry["backend"]["port"].as_u64()
        ),
        (Some(backend.to_string().as_str()), Some(8080)),
        "inspect names the backend the VM sticks to: {entry}"
    );
}

fn a_pod_that_is_its_own_backend_gets_an_answer(family: Family) {
    let node = LanNode::new(family, "pp-hairpin", "h");
    let a = &node.a;
    let _servers = [node.tcp_server(1, 8080), node.udp_server(1, 5353)];
    node.write(
        "self.yaml",
        &a.exposed("self", 61)
            .http_and_dns()
            .endpoints(&[a.pod1_endpoint()])
            .yaml(),
    );
    let _agent = node.agent(&[]);
    let vip = family.vip(61).to_string();
    for (mode, port) in [("tcp", 80), ("udp", 53)] {
        let frontend = Addresses::at(&vip, port);
        let attempts = node.lan.pod1.probe(mode, &frontend, 10);
        for (attempt, (server, seen)) in attempts.iter().zip(answers(&attempts)) {
            assert_eq!(
                attempt.peer.as_deref(),
                Some(frontend.as_str()),
                "{mode}: {attempt:?}"
            );
            assert_eq!(server, "pod1");
            assert_eq!(
                seen.ip().to_string(),
                a.node1,
                "{mode}: a pod reaching itself is SNATed to the node, as kube-proxy masquerades it"
            );
        }
    }
}

/// A client that connects from one port, in any family: prints `refused`, or the peer's
/// address and the server's answer.
const CONNECT_FROM_PORT: &str = r#"
import socket, sys
address, port, local = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", local))
s.settimeout(10)
try:
    s.connect((address, port))
except ConnectionRefusedError:
    print("refused")
    sys.exit(0)
print(s.getpeername()[0], s.recv(100).decode().strip())
"#;

/// A blocking connect() and the client's TCP counters around it: prints `refused` (or
/// `connected`), then how much each counter moved. Guarded by an alarm, so that a client
/// never answered fails instead of hanging.
const BLOCKING_CONNECT: &str = r#"
import signal, socket, sys
def counters():
    values = {}
    for table in ("/proc/net/snmp", "/proc/net/netstat"):
        lines = open(table).read().splitlines()
        for names, numbers in zip(lines[::2], lines[1::2]):
            prefix = names.split(":")[0]
            for name, number in zip(names.split()[1:], numbers.split()[1:]):
                values[prefix + name] = int(number)
    return values
watched = ["TcpExtTCPSynRetrans", "TcpRetransSegs", "TcpExtLockDroppedIcmps", "TcpInCsumErrors"]
def no_answer(*_):
    sys.exit("no answer to the blocking connect() within 10 s")
signal.signal(signal.SIGALRM, no_answer)
address, port = sys.argv[1], int(sys.argv[2])
before = counters()
s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
signal.alarm(10)
try:
    s.connect((address, port))
    print("connected")
except ConnectionRefusedError:
    print("refused")
signal.alarm(0)
after = counters()
print(" ".join(f"{name}={after[name] - before[name]}" for name in watched))
"#;

/// A TCP client of a Service without endpoints is refused with a reset, not kube-proxy's
/// ICMP port unreachable: the answer to a SYN the VM's kernel sends is made and delivered
/// in the softirq of the SYN's own transmit, while a blocking connect() still holds the
/// socket lock, and Linux drops an ICMP error then (`TcpExtLockDroppedIcmps`): only the SYN
/// sent again a second later would be refused. A reset waits in the socket's backlog, so the
/// first SYN is refused: no SYN is sent again. The reset itself: RST|ACK from the VIP,
/// sequence 0, acknowledging the SYN, no options, a valid checksum both when the client's
/// checksum was left to its device (a socket's SYN) and when it was whole (a forged one).
fn a_blocking_connect_to_a_service_without_endpoints_is_refused_at_its_first_syn(family: Family) {
    let node = LanNode::new(family, "pp-reset", "z");
    let vm = node.lan.vm();
    let a = &node.a;
    node.write(
        "empty.yaml",
        &a.exposed("empty", 64).http_and_dns().service_yaml(),
    );
    let _agent = node.agent(&[]);
    let vip = family.vip(64).to_string();
    let before = node.counters();

    let output = stdout_of(
        vm.command("python3")
            .args(["-c", BLOCKING_CONNECT, &vip, "80"]),
    );
    let mut lines = output.lines();
    assert_eq!(lines.next(), Some("refused"), "{output}");
    assert_eq!(
        lines.next(),
        Some("TcpExtTCPSynRetrans=0 TcpRetransSegs=0 TcpExtLockDroppedIcmps=0 TcpInCsumErrors=0"),
        "the first SYN was refused: none sent again, no answer dropped"
    );

    let frontend = SocketAddr::new(vip.parse().expect("VIP"), 80);
    let client = SocketAddr::new(vm_address(family), 40125);
    let reset = vm.enter(|| {
        let capture = Capture::start();
        forged::send(client, frontend, 1000, Flags::Syn);
        capture.segment(frontend, client)
    });
    assert_eq!(
        reset,
        forged::Segment {
            sequence: 0,
            acknowledgment: 1001,
            syn: false,
            ack: true,
            rst: true,
            fin: false,
            header_len: 20,
            payload_len: 0,
            checksum_valid: true,
        },
        "the reset to a forged SYN (its checksum whole)"
    );
    let after = node.counters();
    assert_eq!(
        after.pod_no_backend,
        before.pod_no_backend + 2,
        "both refusals were socklb's: {after:?}"
    );
}

/// A backend's RST to a flow's SYN closes both of the flow's entries, as netfilter closes
/// the whole connection: a forward entry left open (a pod's flow is made in the main table,
/// with the established timeout once answered) would keep its backend for the client's
/// next connection from that port for hours, while no reply entry translates the answers.
fn a_refused_connection_closes_its_whole_flow(family: Family) {
    let node = LanNode::new(family, "pp-refused", "r");
    let vm = node.lan.vm();
    let a = &node.a;
    node.write(
        "web.yaml",
        &a.exposed("web", 62)
            .http_and_dns()
            .endpoints(&[a.pod1_endpoint()])
            .yaml(),
    );
    let _agent = node.agent(&[]);
    let vip = family.vip(62).to_string();
    let connect = || connect_from_port(&vm, &vip, 40123);
    assert_eq!(connect(), "refused", "nothing listens on pod1's port yet");
    let client = SocketAddr::new(vm_address(family), 40123);
    let flow = flow_entries(&node, client);
    assert_eq!(flow.len(), 2, "the flow's two entries: {flow:?}");
    for entry in &flow {
        assert_eq!(
            entry["closing"], true,
            "the backend's RST closed both directions: {entry}"
        );
    }

    let _server = node.tcp_server(1, 8080);
    let answer = connect();
    assert_eq!(
        answer,
        format!("{vip} pod1 {client}"),
        "the client's next connection from the port reaches the backend and sees the VIP"
    );
}

/// A client that opens connections fast uses its ports again while the last flow from the
/// port is still closing in conntrack. The next connection from the port is a new flow, to
/// the backend chosen again: its answers come from the VIP, and none of the old flow's
/// entries is left to translate them. (A new flow to the same backend takes the old
/// entries over in place; one to another backend has them removed first.)
fn a_port_used_again_while_its_last_flow_closes_reaches_the_backend_chosen_again(family: Family) {
    let node = LanNode::new(family, "pp-port-again", "u");
    let vm = node.lan.vm();
    let a = &node.a;
    let _servers = node.tcp_servers(8080);
    let web = |endpoints: &[(String, &str)]| {
        a.exposed("web", 63)
            .http_and_dns()
            .endpoints(endpoints)
            .yaml()
    };
    node.write("web.yaml", &web(&[a.pod1_endpoint()]));
    let agent = node.agent(&[]);
    let vip = family.vip(63).to_string();
    let connect = || connect_from_port(&vm, &vip, 40124);
    let client = SocketAddr::new(vm_address(family), 40124);
    for attempt in ["first", "second"] {
        assert_eq!(
            connect(),
            format!("{vip} pod1 {client}"),
            "the {attempt} connection from the port"
        );
    }
    let pod = |entry: &serde_json::Value, address: IpAddr| {
        [&entry["from"], &entry["rewritten_to"]].iter().any(|seen| {
            seen.as_str()
                .and_then(|seen| seen.parse::<SocketAddr>().ok())
                .is_some_and(|seen| seen.ip() == address)
        })
    };
    // Closing once over (FINs both ways): what the next connection from the port meets.
    let flow = flow_entries(&node, client);
    assert!(
        flow.len() == 2
            && flow
                .iter()
                .all(|entry| pod(entry, a.pod1) && entry["closing"] == true),
        "one flow to pod1 from the port, closing: {flow:?}"
    );

    node.write("web.yaml", &web(&[a.pod2_endpoint()]));
    agent.wait_for_log("synced", 2);
    assert_eq!(
        connect(),
        format!("{vip} pod2 {client}"),
        "the connection after pod1 left the Service"
    );
    let flow = flow_entries(&node, client);
    assert!(
        flow.len() == 2 && flow.iter().all(|entry| pod(entry, a.pod2)),
        "only the new flow's entries, to pod2: {flow:?}"
    );
    assert_eq!(
        node.counters().flow_races,
        0,
        "no SYN was dropped as another CPU's flow"
    );
}

/// The agent removes conntrack entries past their timeout (its conntrack GC). Left in
/// place, they fill the table, and each new flow then makes the LRU evict the entry used
/// longest ago: a live flow idle since before the churn goes before the dead flows that
/// ended after it. Here the table holds 1,024 entries; the VM's UDP flow (timeout 1 h)
/// stays idle while it makes 3 x 200 TCP connections (1,200 entries, closing for 1 s), and
/// each batch's entries must be gone before the next: the idle flow's entries stay and its
/// next datagram follows them. A batch and the idle flow leave room for the 128 free
/// entries the LRU keeps per CPU. Without the GC, the first wait fails; without the
/// waits, the idle flow is evicted.
fn an_idle_flow_outlives_churn_as_the_agent_removes_expired_flows(family: Family) {
    const BATCH: u32 = 200;
    let node = LanNode::new(family, "pp-gc", "w");
    let vm = node.lan.vm();
    let a = &node.a;
    let _servers = [node.tcp_server(1, 8080), node.udp_server(1, 5353)];
    node.write(
        "web.yaml",
        &a.exposed("web", 66)
            .http_and_dns()
            .endpoints(&[a.pod1_endpoint()])
            .yaml(),
    );
    // The IPv6 table gets half of the flag.
    let capacity = match family {
        Family::V4 => "1024",
        Family::V6 => "2048",
    };
    let _agent = node.agent(&[
        "--max-conntrack-entries",
        capacity,
        "--conntrack-tcp-timeout-close",
        "1s",
        "--conntrack-udp-timeout",
        "1h",
    ]);
    let vip = family.vip(66).to_string();
    let mut command = vm.command(hold_bin());
    command.args(["udp", &Addresses::at(&vip, 53)]);
    let (mut idle, first) = Holder::start("the VM's idle UDP flow", command);
    let client: SocketAddr = first
        .reply
        .as_deref()
        .and_then(|reply| reply.strip_prefix("pod1 "))
        .and_then(|client| client.parse().ok())
        .unwrap_or_else(|| panic!("pod1 answers the idle flow with its client: {first:?}"));
    assert_eq!(
        flow_entries(&node, client).len(),
        2,
        "the idle flow's entries"
    );

    for batch in 1..=3 {
        let attempts = vm.probe("tcp", &Addresses::at(&vip, 80), BATCH);
        assert_eq!(
            servers_of(&attempts),
            ["pod1"],
            "batch {batch}: {attempts:?}"
        );
        wait::eventually_showing(
            &format!("batch {batch}'s expired entries removed by the agent"),
            Duration::from_secs(20),
            Duration::from_millis(250),
            || {
                let left = node.sandbox.inspect()["conntrack"]
                    .as_array()
                    .map_or(0, Vec::len);
                if left <= 2 {
                    Ok(())
                } else {
                    Err(format!("{left} entries"))
                }
            },
            String::new,
        );
    }
    let flow = flow_entries(&node, client);
    assert_eq!(flow.len(), 2, "the idle flow kept its entries: {flow:?}");
    let again = idle.ask("ping");
    assert_eq!(
        again.reply.as_deref(),
        Some(format!("pod1 {client}").as_str()),
        "the idle flow's next datagram: {again:?}"
    );
    assert_eq!(
        node.counters().pod_flows,
        1 + 3 * u64::from(BATCH),
        "no flow made again"
    );
}

/// A connection from the VM to `vip` port 80 from its port `local`
/// ([`CONNECT_FROM_PORT`]): `refused`, or the peer's address and the server's answer.
fn connect_from_port(vm: &Netns, vip: &str, local: u16) -> String {
    stdout_of(
        vm.command("python3")
            .args(["-c", CONNECT_FROM_PORT, vip, "80", &local.to_string()]),
    )
    .trim()
    .to_owned()
}

/// The VM's address in `family`.
fn vm_address(family: Family) -> IpAddr {
    match family {
        Family::V4 => VM,
        Family::V6 => VM6,
    }
    .parse()
    .expect("VM address")
}

/// The conntrack entries (both directions) of the flows of `client`, as `socklb inspect`
/// shows them.
fn flow_entries(node: &LanNode, client: SocketAddr) -> Vec<serde_json::Value> {
    let inspection = node.sandbox.inspect();
    inspection["conntrack"]
        .as_array()
        .expect("conntrack entries")
        .iter()
        .filter(|entry| {
            [&entry["from"], &entry["rewritten_to"]]
                .iter()
                .any(|address| address.as_str() == Some(client.to_string().as_str()))
        })
        .cloned()
        .collect()
}

/// A meshed pod1 (Istio's outbound capture): the pod's iptables REDIRECT every outbound TCP
/// connection to the sidecar on port 15001 but the sidecar's own (its uid, 1337, excluded as
/// Istio excludes it), and the sidecar connects to the original destination it reads with
/// `SO_ORIGINAL_DST`. App and sidecar run in the served cgroup. Service `web` on
/// [`Family::vip`]`(host)` is served by pod2.
struct Mesh<'a> {
    node: &'a LanNode,
    vip: String,
    _sidecar: KillOnDrop,
}

impl<'a> Mesh<'a> {
    fn new(node: &'a LanNode, host: u8) -> Self {
        let (a, pod) = (&node.a, &node.lan.pod1);
        node.expose_pod2("web", host, ("http", 80, 8080, 30080, "TCP"));
        let (tables, listen) = match a.family {
            Family::V4 => ("iptables", "0.0.0.0:15001"),
            Family::V6 => ("ip6tables", "[::]:15001"),
        };
        for rule in [
            "-t nat -A OUTPUT -p tcp -o lo -j RETURN",
            "-t nat -A OUTPUT -p tcp -m owner --uid-owner 1337 -j RETURN",
            "-t nat -A OUTPUT -p tcp -j REDIRECT --to-ports 15001",
        ] {
            run(pod.command(tables).args(rule.split(' ')));
        }
        let mut sidecar = command_in_cgroup(&node.sandbox.cgroup, "ip");
        sidecar
            .args(["netns", "exec", &pod.name, "setpriv", "--reuid", "1337"])
            .args(["--regid", "1337", "--clear-groups"])
            .arg(mesh_proxy_bin())
            .arg(listen)
            .stdout(Stdio::piped());
        let mut sidecar = KillOnDrop(sidecar.spawn().expect("start the sidecar"));
        let mut ready = String::new();
        BufReader::new(sidecar.0.stdout.take().expect("sidecar stdout"))
            .read_line(&mut ready)
            .expect("the sidecar's first line");
        assert_eq!(ready.trim(), "listening", "the sidecar listens");
        Self {
            node,
            vip: Addresses::at(&a.family.vip(host).to_string(), 80),
            _sidecar: sidecar,
        }
    }

    /// The original destination the sidecar saw for one connection of the app to the VIP,
    /// after checking that pod2 answered and saw the pod's own address.
    fn sidecar_sees(&self, agent: &Agent, case: &str) -> String {
        let mut command = command_in_cgroup(&self.node.sandbox.cgroup, "ip");
        command
            .args(["netns", "exec", &self.node.lan.pod1.name])
            .arg(hold_bin())
            .args(["tcp", &self.vip]);
        let answer = Holder::start("app", command).1;
        let reply = answer.reply.as_deref().unwrap_or_else(|| {
            panic!("{case}: the app got no answer: {answer:?}\n{}", agent.log())
        });
        let [destination, server, seen] = reply.splitn(3, ' ').collect::<Vec<_>>()[..] else {
            panic!("{case}: unexpected answer {reply:?}");
        };
        assert_eq!(server, "pod2", "{case}: {reply:?}");
        let seen: SocketAddr = seen.parse().expect("the address pod2 saw");
        assert_eq!(
            seen.ip(),
            self.node.a.pod1,
            "{case}: pod2 sees the pod's own address"
        );
        destination.to_owned()
    }

    fn backend(&self) -> String {
        Addresses::at(&self.node.a.pod2.to_string(), 8080)
    }

    /// Why `socklb explain` says pod `default/app` takes its path, and the path `socklb
    /// inspect` finds serving pod1's namespace on the node.
    fn paths(&self) -> (String, String) {
        let explained = stdout_of(explain_command(&self.node.manifests.path, "node1").args([
            "--pod",
            "default/app",
            "-o",
            "json",
        ]));
        let explained: serde_json::Value =
            serde_json::from_str(&explained).expect("socklb explain's JSON");
        let reason = explained["pods"][0]["reason"].as_str().unwrap_or_default();
        let path = self
            .node
            .sandbox
            .inspected_pod_path(&self.node.lan.pod1.name);
        (reason.to_owned(), path)
    }
}

/// With `--socket-lb-scope host` the app's socket keeps the Service address, so the sidecar
/// sees the VIP, and its own connection to the VIP reaches the backend through the
/// per-packet path on the pod's device. With `all` the socket hook rewrites the app's
/// connect() before the REDIRECT: the sidecar sees the backend (documented).
fn a_meshed_pod_s_sidecar_sees_the_service_address_under_host_scope(family: Family) {
    let node = LanNode::new(family, "pp-mesh", "m");
    let _server = node.tcp_server(2, 8080);
    let mesh = Mesh::new(&node, 62);
    for (scope, sidecar_sees) in [("host", mesh.vip.clone()), ("all", mesh.backend())] {
        let agent = node.agent(&["--socket-lb-scope", scope]);
        assert_eq!(
            mesh.sidecar_sees(&agent, scope),
            sidecar_sees,
            "scope {scope}: the sidecar's original destination"
        );
        if scope == "host" {
            let counters = node.counters();
            assert!(counters.pod_flows >= 1, "the per-packet path: {counters:?}");
        }
        agent.stop();
    }
}

/// Under the default scope (`pods`, with the chart's capabilities), the pod's Pod object
/// decides: its Istio sidecar annotation alone, or `socklb.io/socket-lb: "off"`, keeps its
/// sockets on the Service address (the sidecar sees the VIP; the per-packet path serves
/// it), and without them its sockets are translated at connect() (the sidecar sees the
/// backend). Each change takes effect for the next connection, without a restart.
fn a_pod_s_annotations_choose_its_path_under_the_default_scope(family: Family) {
    let node = LanNode::new(family, "pp-annot", "a");
    let _server = node.tcp_server(2, 8080);
    let mesh = Mesh::new(&node, 63);
    let backend = mesh.backend();
    // (the pod's annotations, what its sidecar sees, explain's reason, inspect's path)
    let cases = [
        (
            "sidecar.istio.io/status: '{}'",
            mesh.vip.as_str(),
            "per-packet-istio",
            "per-packet",
        ),
        ("", backend.as_str(), "socket", "socket"),
        (
            "socklb.io/socket-lb: \"off\"",
            mesh.vip.as_str(),
            "per-packet-by-annotation",
            "per-packet",
        ),
    ];
    node.write("pod.yaml", &app_pod(&node, cases[0].0));
    let agent = node.agent_as(chart_agent(), &[]);
    for (change, (annotations, sees, reason, path)) in cases.into_iter().enumerate() {
        if change > 0 {
            node.write("pod.yaml", &app_pod(&node, annotations));
        }
        agent.wait_for_log("served by the per-packet path", change + 1);
        assert_eq!(
            mesh.sidecar_sees(&agent, annotations),
            sees,
            "{{{annotations}}}: the sidecar's original destination"
        );
        assert_eq!(
            mesh.paths(),
            (reason.to_owned(), path.to_owned()),
            "{{{annotations}}}: explain's reason and inspect's path"
        );
    }
    // A value socklb does not know is warned about once, not again when every pod is
    // listed again (here: a pod defined in two files, which has the file source list
    // everything; its copy in the later file wins and moves it to another reason).
    const UNKNOWN: &str = "is neither on nor off";
    node.write("pod.yaml", &app_pod(&node, "socklb.io/socket-lb: \"no\""));
    agent.wait_for_log(UNKNOWN, 1);
    agent.wait_for_log("served by the per-packet path", 4);
    let address = node.a.pod1.to_string();
    node.write(
        "pod2.yaml",
        &pod_yaml("app2", &address, "socklb.io/socket-lb: \"off\""),
    );
    agent.wait_for_log("served by the per-packet path", 5);
    node.write(
        "pod3.yaml",
        &pod_yaml("app2", &address, "sidecar.istio.io/status: '{}'"),
    );
    agent.wait_for_log("per-packet-istio", 2);
    assert_eq!(agent.log().matches(UNKNOWN).count(), 1, "{}", agent.log());
}

/// A pod the per-packet path would serve (`socklb.io/socket-lb: "off"`) whose device does
/// not carry its programs (`--pod-devices none`) keeps the socket path, with a warning:
/// left out of the socket hooks, its connections to Services would not be translated.
fn a_pod_whose_device_the_per_packet_path_does_not_serve_keeps_the_socket_path(family: Family) {
    let node = LanNode::new(family, "pp-nodev", "d");
    let _server = node.tcp_server(2, 8080);
    let mesh = Mesh::new(&node, 64);
    node.write("pod.yaml", &app_pod(&node, "socklb.io/socket-lb: \"off\""));
    let agent = node.agent_as(chart_agent(), &["--pod-devices", "none"]);
    agent.wait_for_log("no device of theirs carries its programs", 1);
    assert_eq!(
        mesh.sidecar_sees(&agent, "--pod-devices none"),
        mesh.backend(),
        "translated at connect(): the sidecar's original destination"
    );
    assert_eq!(
        mesh.paths(),
        ("per-packet-by-annotation".to_owned(), "socket".to_owned()),
        "explain's reason and inspect's path"
    );
    // A pod whose address no namespace of the node holds (its podIPs wrong, or its
    // namespace pinned where the runtime's are not) is named too: its namespace, if here,
    // is not told from others'.
    let nowhere = match family {
        Family::V4 => "10.244.9.99",
        Family::V6 => "fd00:244:9::99",
    };
    node.write(
        "ghost.yaml",
        &pod_yaml("ghost", nowhere, "socklb.io/socket-lb: \"off\""),
    );
    const UNFOUND: &str = "no network namespace pinned on this node";
    agent.wait_for_log(UNFOUND, 1);
    let log = agent.log();
    let line = log
        .lines()
        .find(|line| line.contains(UNFOUND))
        .unwrap_or_default();
    assert!(
        line.contains("default/ghost") && !line.contains("default/app"),
        "the warning names the pod whose address no namespace holds, and only it: {line}"
    );
}

/// A meshed pod whose namespace the agent found before the CNI gave it its address (its
/// device comes first) leaves the socket hooks as soon as the address is there, not at the
/// next sync: meanwhile its sidecar would see backends.
fn a_meshed_pod_plugged_after_its_namespace_leaves_the_socket_hooks_at_once(family: Family) {
    let node = LanNode::new(family, "pp-late", "l");
    let address = match family {
        Family::V4 => "10.244.4.10/24",
        Family::V6 => "fd00:244:4::10/64",
    };
    let ip = address.split('/').next().expect("the address");
    node.write(
        "pod.yaml",
        &pod_yaml("late", ip, "sidecar.istio.io/status: '{}'"),
    );
    let agent = node.agent_as(chart_agent(), &["--sync-period", "120s"]);
    let found = agent
        .log()
        .matches("pods' network namespaces found")
        .count();
    let late = Netns::new(&format!("{}-late", node.lan.pod1.name));
    socklb_tests::lan::here(&veth("late1", "eth0", &late.name));
    socklb_tests::lan::here(&["link", "set", "late1", "up"]);
    late.ip(&["link", "set", "eth0", "up"]);
    // The agent read the namespace, addressless, when the devices came up; the address
    // comes later, which no link of the node's says.
    agent.wait_for_log("pods' network namespaces found", found + 1);
    assert_eq!(node.sandbox.inspected_pod_path(&late.name), "socket");
    late.ip(&["addr", "add", address, "dev", "eth0"]);
    wait::eventually(
        "the meshed pod leaves the socket hooks",
        Duration::from_secs(10),
        || match node.sandbox.inspected_pod_path(&late.name) {
            path if path == "per-packet" => Ok(()),
            path => Err(path),
        },
    );
}

/// A pod's connected UDP socket keeps working while its path changes under it, both ways:
/// made through the per-packet path (`socklb.io/socket-lb: "off"`), its datagrams keep the
/// VIP and their flow when the pod moves to the socket path; made at connect() by the
/// socket path, they carry the backend, which the per-packet path leaves alone.
fn a_pod_s_established_flow_survives_a_change_of_its_path(family: Family) {
    let node = LanNode::new(family, "pp-change", "p");
    let _servers = node.udp_servers(5353);
    node.expose_pod2("dns", 64, ("dns", 53, 5353, 30053, "UDP"));
    let pod = |annotations: &str| app_pod(&node, annotations);
    let vip = Addresses::at(&family.vip(64).to_string(), 53);
    let hold = || {
        let mut command = command_in_cgroup(&node.sandbox.cgroup, "ip");
        command
            .args(["netns", "exec", &node.lan.pod1.name])
            .arg(hold_bin())
            .args(["udp", &vip]);
        Holder::start("pod1's UDP client", command)
    };
    let answered_by_pod2 = |held: &socklb_tests::hold::Held, case: &str| {
        let reply = held.reply.as_deref().unwrap_or_default();
        assert!(
            reply.starts_with("pod2 ") && held.peer.as_deref() == Some(vip.as_str()),
            "{case}: {held:?}"
        );
    };

    node.write("pod.yaml", &pod("socklb.io/socket-lb: \"off\""));
    let agent = node.agent_as(chart_agent(), &[]);
    agent.wait_for_log("served by the per-packet path", 1);
    let (mut per_packet, first) = hold();
    answered_by_pod2(&first, "made per packet");
    let flows = node.counters().pod_flows;
    assert!(flows >= 1, "the per-packet path served it");

    node.write("pod.yaml", &pod(""));
    agent.wait_for_log("served by the per-packet path", 2);
    answered_by_pod2(&per_packet.ask("ping"), "per packet, after the move");
    let (mut socket, first) = hold();
    answered_by_pod2(&first, "made at connect()");
    assert_eq!(
        node.counters().pod_flows,
        flows,
        "the new socket was translated at connect(), not per packet"
    );

    node.write("pod.yaml", &pod("socklb.io/socket-lb: \"off\""));
    agent.wait_for_log("served by the per-packet path", 3);
    answered_by_pod2(
        &socket.ask("ping"),
        "made at connect(), after the move back",
    );
    answered_by_pod2(&per_packet.ask("ping"), "per packet, after the move back");
}

/// A flow keeps its entries across agent restarts, which rebuild the flow filter from the
/// tables: a plain restart (the filter cleared and rebuilt), and an upgrade from a version
/// before the filter (the flow is in conntrack, no filter is pinned). The new agent marks
/// what the tables hold before the programs trust the filter, so the flow's next datagram
/// follows it instead of making a new one.
fn a_flow_goes_on_across_a_restart_and_the_upgrade_to_the_flow_filter(family: Family) {
    let node = LanNode::new(family, "pp-filter", "f");
    let _servers = node.udp_servers(5353);
    node.expose_pod2("dns", 64, ("dns", 53, 5353, 30053, "UDP"));
    node.write("pod.yaml", &app_pod(&node, "socklb.io/socket-lb: \"off\""));
    let vip = Addresses::at(&family.vip(64).to_string(), 53);
    let answered_by_pod2 = |held: &socklb_tests::hold::Held, case: &str| {
        let reply = held.reply.as_deref().unwrap_or_default();
        assert!(
            reply.starts_with("pod2 ") && held.peer.as_deref() == Some(vip.as_str()),
            "{case}: {held:?}"
        );
    };
    let agent = node.agent_as(chart_agent(), &[]);
    agent.wait_for_log("served by the per-packet path", 1);
    let mut command = command_in_cgroup(&node.sandbox.cgroup, "ip");
    command
        .args(["netns", "exec", &node.lan.pod1.name])
        .arg(hold_bin())
        .args(["udp", &vip]);
    let (mut held, first) = Holder::start("pod1's UDP client", command);
    answered_by_pod2(&first, "before the upgrade");
    assert_eq!(flow_filter_ready(&node), 1, "the agent trusts its filter");
    agent.stop();
    let flows = node.counters().pod_flows;
    let agent = node.agent_as(chart_agent(), &[]);
    agent.wait_for_log("datapath attached; ready", 1);
    answered_by_pod2(&held.ask("ping"), "after a restart");
    assert_eq!(
        node.counters().pod_flows,
        flows,
        "after a restart, the datagram followed its flow: no new flow was made"
    );
    agent.stop();

    let pin = node.sandbox.pin_dir.join(map_names::FLOW_FILTER);
    std::fs::remove_file(&pin).unwrap_or_else(|e| panic!("remove {}: {e}", pin.display()));
    let flows = node.counters().pod_flows;
    let agent = node.agent_as(chart_agent(), &[]);
    agent.wait_for_log("datapath attached; ready", 1);
    assert_eq!(
        flow_filter_ready(&node),
        1,
        "the new filter is trusted once seeded"
    );
    answered_by_pod2(&held.ask("ping"), "after the upgrade");
    assert_eq!(
        node.counters().pod_flows,
        flows,
        "the datagram followed its flow: no new flow was made"
    );
}

/// The frontend filter (README, "The frontend filter"): a Service added while the agent
/// runs is marked before its master entry is written, so its first packets from the VM
/// are translated; one removed keeps its slot (a stale mark costs only a lookup) until a
/// full sync rebuilds the filter, here a restart's; the others keep theirs and keep being
/// served.
fn the_frontend_filter_follows_services_as_they_come_and_go(family: Family) {
    let node = LanNode::new(family, "pp-fef", "e");
    let vm = node.lan.vm();
    let a = &node.a;
    let _servers = [node.tcp_servers(8080), node.udp_servers(5353)];
    let service = |name: &str, host: u8| {
        a.exposed(name, host)
            .http_and_dns()
            .endpoints(&[a.pod1_endpoint(), a.pod2_endpoint()])
            .yaml()
    };
    node.write("web.yaml", &service("web", 60));
    let agent = node.agent(&[]);
    let (web, late) = (family.vip(60), family.vip(61));
    assert_eq!(
        frontend_filter_word(&node, FRONTEND_FILTER_READY),
        1,
        "trusted once the first sync marked every frontend"
    );
    assert_ne!(
        frontend_slot(web, 80, 6),
        frontend_slot(late, 80, 6),
        "the test needs two slots"
    );
    assert!(marked(&node, web, 80, 6) && marked(&node, web, 53, 17));
    assert!(!marked(&node, late, 80, 6), "no Service on {late} yet");
    let seen = node.sandbox.inspect();
    assert_eq!(seen["frontend_filter"]["ready"], true, "{seen}");
    assert!(
        seen["frontend_filter"]["marked"].as_u64() >= Some(2),
        "inspect counts the marked slots: {seen}"
    );

    // An incremental sync (the next full sync is an hour away) marks the new frontends.
    node.write("late.yaml", &service("late", 61));
    wait::eventually("the new Service's slot", Duration::from_secs(10), || {
        marked(&node, late, 80, 6)
            .then_some(())
            .ok_or_else(|| "not marked".to_owned())
    });
    for (mode, port) in [("tcp", 80), ("udp", 53)] {
        let frontend = Addresses::at(&late.to_string(), port);
        assert_served(&vm.probe(mode, &frontend, 6), &frontend);
    }

    let syncs = agent.log().matches("synced").count();
    node.manifests.remove("late.yaml");
    agent.wait_for_log("synced", syncs + 1);
    assert!(
        marked(&node, late, 80, 6),
        "a removed frontend's mark stays until the next full sync"
    );
    agent.stop();
    let _agent = node.agent(&[]);
    assert!(
        !marked(&node, late, 80, 6),
        "a restart's first sync rebuilt the filter without the removed Service"
    );
    assert!(
        marked(&node, web, 80, 6),
        "the other Service keeps its slot"
    );
    let frontend = Addresses::at(&web.to_string(), 80);
    assert_served(&vm.probe("tcp", &frontend, 6), &frontend);
}

/// The slot of a frontend (port in host order) as the programs compute it from a packet.
fn frontend_slot(address: IpAddr, port: u16, protocol: u8) -> (u32, u64) {
    let folded = match address {
        IpAddr::V4(address) => u32::from_ne_bytes(address.octets()),
        IpAddr::V6(address) => fold_ipv6(&ipv6_words(address.octets())),
    };
    let slot = frontend_filter_slot(folded, port.to_be(), protocol);
    (slot.word, slot.bit)
}

/// Whether the pinned frontend filter marks the frontend.
fn marked(node: &LanNode, address: IpAddr, port: u16, protocol: u8) -> bool {
    let (word, bit) = frontend_slot(address, port, protocol);
    frontend_filter_word(node, word) & bit != 0
}

/// A word of the pinned frontend filter.
fn frontend_filter_word(node: &LanNode, word: u32) -> u64 {
    let pin = node.sandbox.pin_dir.join(map_names::FRONTEND_FILTER);
    let map = MapData::from_pin(&pin).unwrap_or_else(|e| panic!("open {}: {e}", pin.display()));
    let filter: Array<MapData, u64> = Map::Array(map).try_into().expect("an array map");
    filter.get(&word, 0).expect("a word of the filter")
}

/// Every attempt answered by a backend, through the frontend.
fn assert_served(attempts: &[Attempt], frontend: &str) {
    for attempt in attempts {
        assert_eq!(
            attempt.peer.as_deref(),
            Some(frontend),
            "the VM sees the frontend answer: {attempt:?}"
        );
    }
    assert_eq!(answers(attempts).len(), attempts.len(), "{attempts:?}");
}

/// The flow filter's ready word, as pinned.
fn flow_filter_ready(node: &LanNode) -> u64 {
    let pin = node.sandbox.pin_dir.join(map_names::FLOW_FILTER);
    let map = MapData::from_pin(&pin).unwrap_or_else(|e| panic!("open {}: {e}", pin.display()));
    let filter: Array<MapData, u64> = Map::Array(map).try_into().expect("an array map");
    filter.get(&FLOW_FILTER_READY, 0).expect("the ready word")
}

/// Pod `default/app` of node1 on pod1's address, with `annotations` (a YAML flow mapping's
/// insides).
fn app_pod(node: &LanNode, annotations: &str) -> String {
    pod_yaml("app", &node.a.pod1.to_string(), annotations)
}

fn pod_yaml(name: &str, ip: &str, annotations: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  \
         annotations: {{{annotations}}}\nspec:\n  nodeName: node1\n  containers: [{{name: app, \
         image: app}}]\nstatus:\n  podIPs: [{{ip: \"{ip}\"}}]\n"
    )
}
