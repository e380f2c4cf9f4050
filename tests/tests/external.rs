//! Traffic from outside the node (TC programs), end to end through the real agent, on the
//! LAN of `socklb_tests::lan`. The scenarios of both families run once per family
//! (`v4::*`, `v6::*`) from one body.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    process::{Command, Output},
    time::Duration,
};

use socklb_abi::program_names;
use socklb_agent::inspect::{self, CountersView};
use socklb_tests::{
    Agent, FREE_PORTS, KillOnDrop, ManifestDir, Sandbox, Source, assert_logged, eventually,
    family::Family,
    frames,
    interrupted::uninterrupted,
    lan::{Addresses, LanNode, cni_netfilter_rules, here, servers_of},
    node_yaml, raw_socket, run,
    test_run::{TC_ACT_SHOT, TestRun, ifindex},
};

socklb_tests::for_each_family!(
    nodeport_lb_ip_and_external_ip_reach_local_and_remote_backends,
    external_traffic_policy_local_keeps_the_source_and_drops_without_a_local_endpoint,
    client_ip_affinity_holds_for_clients_outside_the_node,
    load_balancer_source_ranges_admit_listed_clients_only,
    with_maglev_every_node_sends_a_flow_to_the_same_backend,
    a_cni_s_netfilter_rules_leave_every_external_path_working,
    a_client_port_used_again_through_another_frontend_of_the_same_backend_reaches_it,
    a_client_routed_to_the_service_cidr_reaches_cluster_ips_with_the_flag,
    an_unconfirmed_flow_keeps_its_backend_across_a_restart,
    every_rewrite_keeps_a_nic_s_full_checksum_right,
);

/// One request with curl from the LAN's client (the servers answer without HTTP headers);
/// `options` go before the URL.
fn curl(node: &LanNode, options: &[&str], url: &str) -> Output {
    let mut args = vec!["--silent", "--show-error", "--http0.9", "--max-time", "5"];
    args.extend(options);
    args.push(url);
    node.lan.client.output("curl", &args)
}

fn nodeport_lb_ip_and_external_ip_reach_local_and_remote_backends(family: Family) {
    let node = LanNode::new(family, "ext-cluster", "c");
    let LanNode {
        a, lan, sandbox, ..
    } = &node;
    let _servers = [node.tcp_servers(8080), node.udp_servers(5353)];
    node.write(
        "web.yaml",
        &a.exposed("web", 50)
            .http_and_dns()
            .load_balancer()
            .external_ips(&[a.external_ip])
            .endpoints(&[a.pod1_endpoint(), a.pod2_endpoint()])
            .yaml(),
    );
    let agent = node.agent(&[]);
    assert_logged(
        &agent.log(),
        &[r#"program="socklb_tc_in" device="eth0" mode=Tcx"#],
        "the TC programs attach to the device holding the node's address",
    );

    let nodeport = Addresses::at(a.node1, 30080);
    node.assert_both_pods_serve("tcp", &nodeport, 40);

    for frontend in [Addresses::at(a.lb_ip, 80), Addresses::at(a.external_ip, 80)] {
        let attempts = lan.client.probe("tcp", &frontend, 20);
        a.assert_translated(&attempts, &frontend);
    }

    // A real HTTP client; the servers answer without HTTP headers.
    let output = curl(&node, &[], &format!("http://{nodeport}/"));
    let body = String::from_utf8_lossy(&output.stdout);
    assert!(
        body.starts_with("pod1 ") || body.starts_with("pod2 "),
        "curl through the NodePort: {body:?} {}",
        String::from_utf8_lossy(&output.stderr)
    );

    // UDP: every datagram's answer comes back from the frontend.
    node.assert_both_pods_serve("udp", &Addresses::at(a.node1, 30053), 30);

    let seen = inspect::inspect(&sandbox.pin_dir, None).expect("inspect");
    // Shown with --nocapture: the samples of docs/operations.md.
    println!("{}", inspect::table(&seen));
    let conntrack = match family {
        Family::V4 => socklb_abi::map_names::CONNTRACK,
        Family::V6 => socklb_abi::map_names::CONNTRACK6,
    };
    let dump = Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(sandbox.pin_dir.join(conntrack))
        .output()
        .expect("prerequisite missing: bpftool (./x setup installs it)");
    let dump = String::from_utf8_lossy(&dump.stdout);
    println!("{dump}");
    assert!(
        seen.conntrack
            .iter()
            .any(|c| c.snat && c.direction == "forward"),
        "inspect lists SNATed flows"
    );
    assert!(
        dump.contains("\"destination_port\""),
        "bpftool shows the conntrack entries by field: {dump}"
    );
    assert!(seen.counters.external_flows >= 110, "{:?}", seen.counters);
    assert_eq!(seen.counters.errors, 0, "{:?}", seen.counters);
}

/// A client outside the cluster whose router sends the Service CIDR to node1 (a BGP
/// advertisement): with `--cluster-ips-from-outside` it reaches a ClusterIP as a NodePort
/// (a local backend sees it, a remote one sees node1); without the flag the ClusterIP is not
/// served from outside, and nothing answers.
fn a_client_routed_to_the_service_cidr_reaches_cluster_ips_with_the_flag(family: Family) {
    let node = LanNode::new(family, "ext-cip", "r");
    let _servers = node.tcp_servers(8080);
    node.write(
        "web.yaml",
        &node
            .a
            .exposed("web", 52)
            .port("http", 80, 8080, 30080, "TCP")
            .endpoints(&[node.a.pod1_endpoint(), node.a.pod2_endpoint()])
            .yaml(),
    );
    node.lan.route_service_cidrs_to_node1();
    let vip = Addresses::at(&family.vip(52).to_string(), 80);

    let agent = node.agent(&[]);
    let attempts = node.lan.client.probe("tcp", &vip, 1);
    assert!(
        attempts.iter().all(|attempt| attempt.reply.is_none()),
        "without the flag no backend answers a client outside: {attempts:?}"
    );
    assert_eq!(node.counters().external_flows, 0, "no flow from outside");
    agent.stop();

    let _agent = node.agent(&["--cluster-ips-from-outside"]);
    node.assert_both_pods_serve("tcp", &vip, 40);
    assert!(node.counters().external_flows >= 40);
}

fn external_traffic_policy_local_keeps_the_source_and_drops_without_a_local_endpoint(
    family: Family,
) {
    let node = LanNode::new(family, "ext-local", "l");
    let LanNode { a, lan, .. } = &node;
    let _servers = node.tcp_servers(8080);
    let local = |name: &str, host: u8, node_port: u16, endpoints: &[(String, &str)]| {
        a.exposed(name, host)
            .port("http", 80, 8080, node_port, "TCP")
            .spec("externalTrafficPolicy: Local")
            .endpoints(endpoints)
            .yaml()
    };
    node.write(
        "local.yaml",
        &local("local", 60, 30081, &[a.pod1_endpoint(), a.pod2_endpoint()]),
    );
    node.write(
        "elsewhere.yaml",
        &local("elsewhere", 61, 30082, &[a.pod2_endpoint()]),
    );
    let _agent = node.agent(&[]);

    let attempts = lan.client.probe("tcp", &Addresses::at(a.node1, 30081), 20);
    for (server, seen) in socklb_tests::lan::answers(&attempts) {
        assert_eq!(server, "pod1", "only the local endpoint serves");
        assert_eq!(
            seen.ip().to_string(),
            a.client,
            "the client's address reaches the pod"
        );
    }

    let elsewhere = Addresses::at(a.node1, 30082);
    let dropped = |c: &CountersView| c.external_no_backend;
    unanswered_and_counted(&node, &elsewhere, dropped, "no local endpoint: dropped");
}

/// A connection from the client to `frontend` gets no answer, and `counter` of socklb's
/// rose: socklb did `what`.
fn unanswered_and_counted(
    node: &LanNode,
    frontend: &str,
    counter: fn(&CountersView) -> u64,
    what: &str,
) {
    let before = node.counters();
    let attempts = node.lan.client.probe("tcp", frontend, 1);
    assert!(attempts[0].reply.is_none(), "{what}: {attempts:?}");
    let after = node.counters();
    assert!(
        counter(&after) > counter(&before),
        "{what} by socklb: {before:?} -> {after:?}"
    );
}

#[test]
fn a_long_flow_survives_backend_changes_and_new_flows_follow_the_new_set() {
    let node = LanNode::new(Family::V4, "ext-long", "f");
    let LanNode { a, lan, .. } = &node;
    let _servers = node.tcp_servers(8080);
    let _iperf_server = KillOnDrop(
        lan.pod1
            .command("iperf3")
            .args(["--server", "--one-off", "--port", "5201"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("prerequisite missing: iperf3 (./x setup installs it)"),
    );
    let bulk = |endpoints: &[(String, &str)]| {
        a.exposed("bulk", 70)
            .port("http", 80, 8080, 30090, "TCP")
            .port("bulk", 5201, 5201, 30091, "TCP")
            .endpoints(endpoints)
            .yaml()
    };
    node.write("svc.yaml", &bulk(&[a.pod1_endpoint()]));
    let agent = node.agent(&[]);

    // iperf3 (control and data connections) to pod1 for 4 s, while pod2 joins and then
    // pod1 leaves the service.
    let client = lan
        .client
        .command("iperf3")
        .args([
            "--client", a.node1, "--port", "30091", "--time", "4", "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start iperf3");
    std::thread::sleep(Duration::from_millis(1200));
    node.write("svc.yaml", &bulk(&[a.pod1_endpoint(), a.pod2_endpoint()]));
    agent.wait_for_log("synced", 2);
    std::thread::sleep(Duration::from_millis(800));
    node.write("svc.yaml", &bulk(&[a.pod2_endpoint()]));
    agent.wait_for_log("synced", 3);

    // New connections reach only the remaining backend.
    let http = Addresses::at(a.node1, 30090);
    eventually(
        "new flows follow the new set",
        Duration::from_secs(10),
        || match servers_of(&lan.client.probe("tcp", &http, 10)) {
            servers if servers == ["pod2"] => Ok(()),
            servers => Err(format!("answered by {servers:?}")),
        },
    );

    let output = client.wait_with_output().expect("iperf3 client");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the long flow to pod1 was cut when pod1 left the service:\n{report}"
    );
    let json: serde_json::Value = serde_json::from_str(&report).expect("iperf3 --json");
    let received = json["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    assert!(received > 0, "iperf3 moved no data: {report}");
}

/// One datagram from `socket` to `frontend` and its answer, which must come from the
/// frontend: the name of the server that answered.
fn ask(socket: &std::net::UdpSocket, frontend: SocketAddr) -> Result<String, String> {
    socket.send_to(b"ping", frontend).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = uninterrupted(|| socket.recv_from(&mut buffer))
        .map_err(|e| format!("no answer through {frontend}: {e}"))?;
    assert_eq!(from, frontend, "the answer comes from the frontend");
    let reply = String::from_utf8_lossy(&buffer[..len]).into_owned();
    Ok(reply.split(' ').next().unwrap_or_default().to_owned())
}

#[test]
fn udp_without_checksum_passes_and_a_udp_flow_moves_when_its_backend_goes() {
    let node = LanNode::new(Family::V4, "ext-udp", "u");
    let LanNode { a, lan, .. } = &node;
    let _servers = node.udp_servers(5353);
    let dns = |endpoints: &[(String, &str)]| {
        a.exposed("dns", 95)
            .port("dns", 53, 5353, 30053, "UDP")
            .endpoints(endpoints)
            .yaml()
    };
    node.write("dns.yaml", &dns(&[a.pod1_endpoint(), a.pod2_endpoint()]));
    let agent = node.agent(&[]);

    // One client socket, one flow, sending datagrams without a UDP checksum (SO_NO_CHECK):
    // the checksum must stay 0 through the rewrite, or the pod's kernel drops them.
    let socket = lan.client.enter(|| {
        let socket = std::net::UdpSocket::bind((a.client, 40100)).expect("bind the client");
        let on: libc::c_int = 1;
        raw_socket::set_option(&socket, libc::SOL_SOCKET, libc::SO_NO_CHECK, &on)
            .expect("SO_NO_CHECK");
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        socket
    });
    let frontend: SocketAddr = Addresses::at(a.node1, 30053).parse().expect("address");
    let ask = || ask(&socket, frontend).expect("an answer to a datagram without checksum");
    let first = ask();
    for _ in 0..5 {
        assert_eq!(ask(), first, "a UDP flow keeps its backend");
    }

    // Its backend leaves the Service: the flow's next datagram goes to the other one.
    let (remaining, other) = if first == "pod1" {
        (a.pod2_endpoint(), "pod2")
    } else {
        (a.pod1_endpoint(), "pod1")
    };
    node.write("dns.yaml", &dns(&[remaining]));
    agent.wait_for_log("synced", 2);
    eventually(
        "the UDP flow moves off the removed backend",
        Duration::from_secs(10),
        || match ask() {
            server if server == other => Ok(()),
            server => Err(format!("still answered by {server}")),
        },
    );
}

fn client_ip_affinity_holds_for_clients_outside_the_node(family: Family) {
    let node = LanNode::new(family, "ext-sticky", "a");
    let LanNode {
        a, lan, sandbox, ..
    } = &node;
    let _servers = node.tcp_servers(8080);
    node.write(
        "sticky.yaml",
        &a.exposed("sticky", 97)
            .port("http", 80, 8080, 30097, "TCP")
            .spec("sessionAffinity: ClientIP")
            .endpoints(&[a.pod1_endpoint(), a.pod2_endpoint()])
            .yaml(),
    );
    let _agent = node.agent(&[]);

    let nodeport = Addresses::at(a.node1, 30097);
    let attempts = lan.client.probe("tcp", &nodeport, 20);
    a.assert_translated(&attempts, &nodeport);
    assert_eq!(
        servers_of(&attempts).len(),
        1,
        "every connection of one client goes to one backend: {attempts:?}"
    );
    let shown = inspect::inspect(&sandbox.pin_dir, None).expect("inspect");
    assert!(
        shown
            .affinity
            .iter()
            .any(|e| e.client.map(|c| c.to_string()).as_deref() == Some(a.client)),
        "inspect shows the client's affinity entry: {:?}",
        shown.affinity
    );
    assert!(shown.counters.affinity_hits >= 19, "{:?}", shown.counters);
}

fn load_balancer_source_ranges_admit_listed_clients_only(family: Family) {
    let node = LanNode::new(family, "ext-ranges", "s");
    let LanNode {
        a, lan, sandbox, ..
    } = &node;
    let _server = node.tcp_server(1, 8080);
    let guarded = |name: &str, port: u16, node_port: u16, ranges: &[&str]| {
        let ranges: Vec<String> = ranges.iter().map(|range| format!("\"{range}\"")).collect();
        a.exposed(name, (port - 70) as u8)
            .port("http", port, 8080, node_port, "TCP")
            .load_balancer()
            .spec(&format!(
                "loadBalancerSourceRanges: [{}]",
                ranges.join(", ")
            ))
            .endpoints(&[a.pod1_endpoint()])
            .yaml()
    };
    node.write("open.yaml", &guarded("open", 80, 30110, &[a.client_range]));
    node.write(
        "closed.yaml",
        &guarded("closed", 81, 30111, &[a.other_clients]),
    );
    let agent = node.agent(&[]);

    assert_source_ranges_enforced(&node, 5);
    let shown = inspect::inspect(&sandbox.pin_dir, Some(a.lb_ip.parse().expect("address")))
        .expect("inspect");
    assert!(
        shown
            .frontends
            .iter()
            .any(|f| f.source_ranges.as_deref() == Some(&[a.other_clients.to_owned()][..])),
        "inspect shows the ranges: {:?}",
        shown.frontends
    );

    // The ranges guard the LoadBalancer IP only, as in kube-proxy: the NodePort is open.
    let node_port = Addresses::at(a.node1, 30111);
    a.assert_translated(&lan.client.probe("tcp", &node_port, 3), &node_port);

    // Widening the ranges lets the client in.
    node.write(
        "closed.yaml",
        &guarded("closed", 81, 30111, &[a.other_clients, a.client_range]),
    );
    agent.wait_for_log("synced", 2);
    let closed = Addresses::at(a.lb_ip, 81);
    eventually(
        "the widened ranges admit the client",
        Duration::from_secs(10),
        || {
            let attempts = lan.client.probe("tcp", &closed, 1);
            match attempts[0].reply {
                Some(_) => {
                    a.assert_translated(&attempts, &closed);
                    Ok(())
                }
                None => Err("still denied after the change".to_owned()),
            }
        },
    );
}

/// node2's agent: its pins and a cgroup nested in the sandbox's, removed before the
/// sandbox goes.
struct SecondNode {
    pin_dir: std::path::PathBuf,
    cgroup: std::path::PathBuf,
}

impl SecondNode {
    fn new(sandbox: &Sandbox) -> Self {
        let node = Self {
            pin_dir: sandbox
                .pin_dir
                .with_file_name(format!("{}-node2", sandbox.name)),
            cgroup: sandbox.cgroup.join("node2"),
        };
        std::fs::create_dir(&node.cgroup).expect("create node2's cgroup");
        node
    }
}

impl Drop for SecondNode {
    fn drop(&mut self) {
        if let Err(e) = socklb_agent::dataplane::cleanup(&self.pin_dir) {
            eprintln!("cleanup of {}: {e}", self.pin_dir.display());
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// The LoadBalancer IP's port 80 admits the client (`probes` attempts, all translated) and
/// its port 81, whose ranges leave the client out, denies it in socklb (counted).
fn assert_source_ranges_enforced(node: &LanNode, probes: u32) {
    let LanNode { a, lan, .. } = node;
    let open = Addresses::at(a.lb_ip, 80);
    a.assert_translated(&lan.client.probe("tcp", &open, probes), &open);
    let closed = Addresses::at(a.lb_ip, 81);
    let denied = |c: &CountersView| c.external_denied;
    unanswered_and_counted(node, &closed, denied, "outside the ranges: denied");
}

fn with_maglev_every_node_sends_a_flow_to_the_same_backend(family: Family) {
    let node = LanNode::new(family, "ext-maglev", "m");
    let LanNode {
        a,
        lan,
        sandbox,
        manifests,
    } = &node;
    let second = SecondNode::new(sandbox);
    let _servers = node.udp_servers(5353);
    node.write(
        "dns.yaml",
        &a.exposed("dns", 90)
            .port("dns", 53, 5353, 30053, "UDP")
            .annotation("socklb.io/lb-algorithm", "maglev")
            .endpoints(&[a.pod1_endpoint(), a.pod2_endpoint()])
            .yaml(),
    );
    let _node1 = node.agent(&[]);
    let _node2 = lan.node2.enter(|| {
        let state = (second.pin_dir.as_path(), second.cgroup.as_path());
        Agent::start_at(state, Source::File(&manifests.path), "node2", &FREE_PORTS)
    });

    // The same flows (client address and port) through either node.
    let client: IpAddr = a.client.parse().expect("address");
    let chosen: Vec<(u16, String, String)> = lan.client.enter(|| {
        (40000..40020)
            .map(|port| {
                let socket = std::net::UdpSocket::bind((client, port)).expect("bind the client");
                socket
                    .set_read_timeout(Some(Duration::from_secs(3)))
                    .expect("timeout");
                let ask = |node: &str| {
                    let frontend = Addresses::at(node, 30053).parse().expect("address");
                    ask(&socket, frontend).unwrap_or_else(|e| panic!("from port {port}: {e}"))
                };
                (port, ask(a.node1), ask(a.node2))
            })
            .collect()
    });
    for (port, through_node1, through_node2) in &chosen {
        assert_eq!(
            through_node1, through_node2,
            "the flow from port {port} reached different backends: {chosen:?}"
        );
    }
    let mut backends: Vec<&String> = chosen.iter().map(|(_, b, _)| b).collect();
    backends.sort();
    backends.dedup();
    assert_eq!(
        backends,
        ["pod1", "pod2"],
        "flows spread over both backends"
    );
    let shown = inspect::inspect(&sandbox.pin_dir, None).expect("inspect");
    assert!(
        shown.frontends.iter().any(|f| f.maglev),
        "inspect shows Maglev"
    );
}

#[test]
fn tcx_programs_stay_attached_across_an_agent_restart() {
    restart_keeps_translating("tcx", "x");
}

#[test]
fn netlink_filters_stay_attached_across_an_agent_restart_and_are_replaced_not_added() {
    restart_keeps_translating("netlink", "nl");
}

/// An agent stops (its TC programs stay), traffic from outside is still translated, a new
/// agent takes the programs over without duplicating them, and cleanup removes them.
fn restart_keeps_translating(mode: &str, tag: &str) {
    let node = LanNode::new(Family::V4, &format!("ext-restart-{mode}"), tag);
    let LanNode {
        a, lan, sandbox, ..
    } = &node;
    let _server = node.tcp_server(1, 8080);
    node.write(
        "svc.yaml",
        &a.exposed("web", 80)
            .port("http", 80, 8080, 30100, "TCP")
            .endpoints(&[a.pod1_endpoint()])
            .yaml(),
    );
    let nodeport = Addresses::at(a.node1, 30100);
    let flags = ["--devices", "eth0", "--tc-attach-mode", mode];
    let agent = node.agent(&flags);
    agent.stop();
    let attempts = lan.client.probe("tcp", &nodeport, 5);
    a.assert_translated(&attempts, &nodeport);

    let agent = node.agent(&flags);
    assert!(
        agent.log().contains("Replaced"),
        "the new agent takes over the programs:\n{}",
        agent.log()
    );
    let attempts = lan.client.probe("tcp", &nodeport, 5);
    a.assert_translated(&attempts, &nodeport);
    assert_eq!(
        attached(mode, sandbox),
        2,
        "one ingress and one egress program"
    );
    drop(agent);

    socklb_agent::dataplane::cleanup(&sandbox.pin_dir).expect("cleanup");
    assert_eq!(
        attached(mode, sandbox),
        0,
        "cleanup detaches the TC programs"
    );
}

/// socklb's TC programs on eth0: netlink filters as `tc` lists them, or TCX link pins.
fn attached(mode: &str, sandbox: &Sandbox) -> usize {
    if mode == "netlink" {
        socklb_tests::tc_filters("eth0")
    } else {
        std::fs::read_dir(sandbox.pin_dir.join("links"))
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().contains("@eth0"))
                    .count()
            })
            .unwrap_or(0)
    }
}

fn a_cni_s_netfilter_rules_leave_every_external_path_working(family: Family) {
    let node = LanNode::new(family, "ext-cni", "n");
    let LanNode { a, lan, .. } = &node;
    cni_netfilter_rules(family);
    let _servers = [node.tcp_servers(8080), node.udp_servers(5353)];
    // (Service, its endpoint, NodePorts TCP and UDP, externalTrafficPolicy)
    let services = [
        ("local", a.pod1_endpoint(), 30090, 30055, "Cluster"),
        ("remote", a.pod2_endpoint(), 30091, 30056, "Cluster"),
        ("etplocal", a.pod1_endpoint(), 30092, 30057, "Local"),
    ];
    for (i, (name, endpoint, tcp, udp, policy)) in services.iter().enumerate() {
        let service = a
            .exposed(name, 110 + i as u8)
            .port("http", 80, 8080, *tcp, "TCP")
            .port("dns", 53, 5353, *udp, "UDP")
            .spec(&format!("externalTrafficPolicy: {policy}"))
            .external_ips(&[if i == 0 {
                a.external_ip
            } else {
                a.external_ip2
            }])
            .endpoints(std::slice::from_ref(endpoint));
        // Only the first has the LoadBalancer IP.
        let service = if i == 0 {
            service.load_balancer()
        } else {
            service.pending_load_balancer()
        };
        node.write(&format!("{name}.yaml"), &service.yaml());
    }
    let _agent = node.agent(&[]);

    let mut frontends: Vec<(&str, String)> = services
        .iter()
        .flat_map(|(_, _, tcp, udp, _)| {
            [
                ("tcp", Addresses::at(a.node1, *tcp)),
                ("udp", Addresses::at(a.node1, *udp)),
            ]
        })
        .collect();
    // The local backend behind a LoadBalancer IP and an externalIP too.
    frontends.extend([
        ("tcp", Addresses::at(a.lb_ip, 80)),
        ("udp", Addresses::at(a.lb_ip, 53)),
        ("tcp", Addresses::at(a.external_ip, 80)),
    ]);
    for (i, (mode, address)) in frontends.iter().enumerate() {
        // UDP to each frontend from a source port of its own: without SNAT, two frontends
        // of one backend give a client port's flows one reply key, which a live UDP flow
        // keeps (the new one's answers come back as the other frontend's, as with
        // netfilter). Random ports met by chance now and then.
        let attempts = if *mode == "udp" {
            let source_port = 20_000 + u16::try_from(i).expect("a few frontends");
            lan.client.probe_from(mode, address, 5, source_port)
        } else {
            lan.client.probe(mode, address, 5)
        };
        let failed = attempts.iter().filter(|a| a.reply.is_none()).count();
        assert_eq!(
            failed, 0,
            "{mode} {address}: {failed} of 5 failed: {attempts:?}"
        );
        // The client sees the frontend; a local pod sees the client, a remote one the node.
        a.assert_translated(&attempts, address);
    }
    assert_eq!(node.counters().errors, 0);

    // A NetworkPolicy-like rule on the local pod's device sees the client's address, so it
    // applies to traffic from outside as well.
    let (tool, reset) = match family {
        Family::V4 => ("iptables", "tcp-reset"),
        Family::V6 => ("ip6tables", "tcp-reset"),
    };
    run(Command::new(tool).args([
        "-I",
        "FORWARD",
        "-o",
        "pod1",
        "-s",
        a.client,
        "-p",
        "tcp",
        "-j",
        "REJECT",
        "--reject-with",
        reset,
    ]));
    let attempts = lan.client.probe("tcp", &Addresses::at(a.node1, 30090), 3);
    assert!(
        attempts.iter().all(|a| a.reply.is_none()),
        "a FORWARD rule against the client on pod1's device must hold: {attempts:?}"
    );
    let remote = Addresses::at(a.node1, 30091);
    a.assert_translated(&lan.client.probe("tcp", &remote, 3), &remote);
}

/// A local backend sees the client's own address and port, so two frontends of one
/// backend give their flows from one client port the same reply key: once the first flow
/// closed, the second (the client's port used again, as clients do) must get the key, and
/// its answers must come back from its own frontend.
fn a_client_port_used_again_through_another_frontend_of_the_same_backend_reaches_it(
    family: Family,
) {
    let node = LanNode::new(family, "ext-reuse", "r");
    let a = &node.a;
    let _server = node.tcp_server(1, 8080);
    node.write(
        "web.yaml",
        &a.exposed("web", 60)
            .port("http", 80, 8080, 30080, "TCP")
            .external_ips(&[a.external_ip])
            .endpoints(&[a.pod1_endpoint()])
            .yaml(),
    );
    let _agent = node.agent(&[]);

    // curl binds the client port; the server closes first, so the backend holds the old
    // connection in TIME_WAIT and the client nothing.
    let client_port = "40400";
    for frontend in [
        Addresses::at(a.node1, 30080),
        Addresses::at(a.external_ip, 80),
    ] {
        let output = curl(
            &node,
            &["--local-port", client_port],
            &format!("http://{frontend}/"),
        );
        let body = String::from_utf8_lossy(&output.stdout);
        let client = Addresses::at(a.client, 40400);
        assert_eq!(
            body,
            format!("pod1 {client}"),
            "from client port {client_port} through {frontend}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    assert_eq!(node.counters().errors, 0);
}

/// A flow from outside waits in the unconfirmed table until its backend answers, and its
/// packets are looked for there only if the flow filter marks its frontend as having
/// unconfirmed flows: the programs mark it as they make the flow, and an agent's start,
/// which rebuilds the filter from the tables, must mark it too. Else the flow's next
/// datagram misses its entries, makes the flow again and is dropped as raced. The backend
/// has no server on the port: its port-unreachable error, translated back, tells the
/// client (a connected socket) that its datagram arrived.
fn an_unconfirmed_flow_keeps_its_backend_across_a_restart(family: Family) {
    let node = LanNode::new(family, "ext-unconfirmed", "q");
    let a = &node.a;
    node.write(
        "quiet.yaml",
        &a.exposed("quiet", 97)
            .port("dns", 53, 5999, 30097, "UDP")
            .endpoints(&[a.pod1_endpoint()])
            .yaml(),
    );
    let agent = node.agent(&[]);
    let frontend: SocketAddr = Addresses::at(a.node1, 30097).parse().expect("address");
    let client: SocketAddr = Addresses::at(a.client, 40600).parse().expect("address");
    let socket = node.lan.client.enter(|| {
        let socket = std::net::UdpSocket::bind(client).expect("bind the client");
        socket.connect(frontend).expect("connect the client");
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        socket
    });
    let refused = |case: &str| {
        socket.send(b"ping").expect("send");
        let error = uninterrupted(|| socket.recv(&mut [0; 64]))
            .expect_err("no server answers on the backend's port");
        assert_eq!(
            error.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{case}: the backend's port-unreachable error, translated back: {error}"
        );
    };
    refused("the first datagram");
    // The flow's next datagram finds its entries: the programs marked the frontend.
    let flows = node.counters().external_flows;
    refused("the second datagram");
    let unconfirmed = |case: &str| {
        let inspection = node.sandbox.inspect();
        let filter = &inspection["flow_filter"];
        assert!(
            filter["ready"] == true && filter["unconfirmed"].as_u64() >= Some(1),
            "{case}: a trusted filter with the frontend's unconfirmed slot marked: {filter}"
        );
        let forward: Vec<_> = inspection["conntrack"]
            .as_array()
            .expect("conntrack entries")
            .iter()
            .filter(|entry| {
                entry["direction"] == "forward" && entry["from"] == client.to_string().as_str()
            })
            .cloned()
            .collect();
        assert!(
            forward.len() == 1 && forward[0]["confirmed"] == false,
            "{case}: one unconfirmed flow from the client: {forward:?}"
        );
    };
    unconfirmed("before the restart");
    let followed = |case: &str| {
        let counters = node.counters();
        assert_eq!(
            (counters.external_flows, counters.flow_races),
            (flows, 0),
            "{case}: the datagram followed its flow: none made again, none dropped as raced"
        );
    };
    followed("before the restart");
    drop(agent);

    let _agent = node.agent(&[]);
    refused("the datagram after the restart");
    unconfirmed("after the restart");
    followed("after the restart");
}

/// A node device eth0 holding `addresses` in this thread's namespace (this kernel has no
/// dummy devices: a veth pair, both ends here).
fn node_device(addresses: &[&str]) {
    let veth: Vec<&str> = "link add eth0 type veth peer name eth0-peer"
        .split(' ')
        .collect();
    here(&veth);
    for address in addresses {
        here(&["addr", "add", address, "dev", "eth0"]);
    }
    here(&["link", "set", "eth0", "up"]);
}

/// External traffic reaches pods only through forwarding; a node without it is named.
#[test]
fn the_agent_warns_when_the_node_does_not_forward_ipv4() {
    let sandbox = Sandbox::new("no-forwarding");
    node_device(&["192.168.90.1/24"]);
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "z1", "192.168.90.1"));
    let warning = "net.ipv4.ip_forward is 0";
    for forwarding in ["1", "0"] {
        run(Command::new("sysctl").args(["-qw", &format!("net.ipv4.ip_forward={forwarding}")]));
        let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
        agent.wait_for_log("program attached", 2);
        let log = agent.stop();
        assert_eq!(
            log.contains(warning),
            forwarding == "0",
            "with ip_forward={forwarding}, the warning must appear exactly when it is off:\n{log}"
        );
    }
}

/// The SNAT address is an InternalIP this node holds, and a change of the Node's addresses is
/// applied by the next incremental sync (the full resync is an hour away here).
#[test]
fn the_snat_address_follows_the_node_s_internal_ip_at_the_next_sync() {
    let sandbox = Sandbox::new("snat-address");
    node_device(&["192.168.91.1/24", "192.168.91.2/24"]);
    let node = |addresses: &str| {
        format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-a\nstatus:\n  addresses: \
             [{addresses}]\n"
        )
    };
    let manifests = ManifestDir::new(&sandbox);
    // An ExternalIP listed first that no device holds (a cloud NAT's), then the InternalIP.
    manifests.write(
        "node.yaml",
        &node(
            "{type: ExternalIP, address: 203.0.113.9}, {type: InternalIP, address: 192.168.91.1}",
        ),
    );
    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--sync-period", "1h"],
    );
    assert_eq!(snat_address(&sandbox), Some(Ipv4Addr::new(192, 168, 91, 1)));

    manifests.write(
        "node.yaml",
        &node(
            "{type: ExternalIP, address: 203.0.113.9}, {type: InternalIP, address: 192.168.91.2}",
        ),
    );
    eventually(
        "the new InternalIP programmed by an incremental sync",
        Duration::from_secs(10),
        || match snat_address(&sandbox) {
            Some(address) if address == Ipv4Addr::new(192, 168, 91, 2) => Ok(()),
            other => Err(format!("SNAT address {other:?}:\n{}", agent.log())),
        },
    );
    let log = agent.stop();
    assert_eq!(
        log.matches("full=true").count(),
        1,
        "only the first sync may be a full one:\n{log}"
    );
}

/// The SNAT address in the pinned node map (`None`: none programmed).
fn snat_address(sandbox: &Sandbox) -> Option<Ipv4Addr> {
    let map = aya::maps::Map::Array(
        aya::maps::MapData::from_pin(sandbox.pin_dir.join(socklb_abi::map_names::NODE))
            .expect("open the node map"),
    );
    let map: aya::maps::Array<_, socklb_abi::NodeConfig> = map.try_into().expect("node map");
    let config = map.get(&0, 0).expect("the node settings");
    (config.snat_address != 0).then(|| Ipv4Addr::from(u32::from_be(config.snat_address)))
}

/// The TC programs alone, for both families: the datapath loaded and programmed through
/// the library (not the control plane), attached to node1's device, and traffic from the
/// client on the LAN. NodePort flows to a local and to a remote backend (SNAT),
/// loadBalancerSourceRanges, and for IPv6 an extension header on the way and ICMPv6 with
/// neighbour discovery to the node.
mod programs {
    use std::{
        net::{IpAddr, SocketAddr},
        time::Duration,
    };

    use socklb_agent::dataplane::{
        BackendAddr, ConntrackTimeouts, Desired, DeviceRole, Frontend, FrontendSpec, NodeSettings,
        Protocol, Scope, TcMode,
    };
    use socklb_tests::{
        Sandbox, eventually,
        family::Family,
        interrupted::uninterrupted,
        lan::{Addresses, LanNode, counters},
        raw_socket,
    };

    fn ip(address: &str) -> IpAddr {
        address.parse().expect("address")
    }

    fn external(address: &str, port: u16, protocol: Protocol) -> Frontend {
        Frontend {
            address: ip(address),
            port,
            protocol,
            scope: Scope::External,
        }
    }

    fn spec(backends: Vec<BackendAddr>, ranges: Option<&str>) -> FrontendSpec {
        FrontendSpec {
            backends,
            source_ranges: ranges.map(|range| vec![range.parse().expect("CIDR")]),
            ..FrontendSpec::default()
        }
    }

    socklb_tests::for_each_family!(translate_nodeport_flows);

    fn translate_nodeport_flows(family: Family) {
        let node = LanNode::new(family, "ext-prog", "p");
        let LanNode {
            a, lan, sandbox, ..
        } = &node;
        let _servers = [
            node.tcp_server(1, 8080),
            node.tcp_server(2, 8080),
            node.udp_server(1, 5353),
        ];
        let pod1 = BackendAddr {
            address: a.pod1,
            port: 8080,
            remote: false,
        };
        let pod2 = BackendAddr {
            address: a.pod2,
            port: 8080,
            remote: true,
        };
        let mut desired = Desired::default();
        desired.insert(
            external(a.node1, 30080, Protocol::Tcp),
            spec(vec![pod1, pod2], None),
        );
        desired.insert(
            external(a.node1, 30053, Protocol::Udp),
            spec(vec![BackendAddr { port: 5353, ..pod1 }], None),
        );
        desired.insert(
            external(a.lb_ip, 80, Protocol::Tcp),
            spec(vec![pod1], Some(a.client_range)),
        );
        desired.insert(
            external(a.lb_ip, 81, Protocol::Tcp),
            spec(vec![pod1], Some(a.other_clients)),
        );
        let mut dataplane = sandbox.dataplane();
        let report = dataplane.apply(&desired).expect("apply");
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        dataplane
            .set_node(&NodeSettings {
                snat_address: Some(socklb_tests::lan::NODE1.parse().expect("address")),
                snat_address6: Some(socklb_tests::lan::lan6::NODE1.parse().expect("address")),
                snat_ports: 61000..=65535,
                conntrack_timeouts: ConntrackTimeouts::default(),
            })
            .expect("node settings");
        dataplane
            .attach_tc(
                &[("eth0".to_owned(), DeviceRole::External)],
                &[],
                TcMode::Auto,
            )
            .expect("attach the TC programs");

        // NodePort: a local backend keeps the client's address, a remote one sees node1's.
        node.assert_both_pods_serve("tcp", &Addresses::at(a.node1, 30080), 30);

        // UDP through the NodePort, each answer from the frontend.
        let udp = Addresses::at(a.node1, 30053);
        a.assert_translated(&lan.client.probe("udp", &udp, 5), &udp);

        // loadBalancerSourceRanges of the client's family.
        super::assert_source_ranges_enforced(&node, 3);

        if family == Family::V6 {
            extension_header_is_walked(lan, a);
            too_many_extension_headers_pass_counted(lan, a, sandbox);
            icmpv6_and_neighbour_discovery_pass(lan, a);
        }
        assert_eq!(node.counters().errors, 0, "{:?}", node.counters());
        drop(dataplane);
    }

    /// A UDP datagram carrying a Destination Options header (IPV6_DSTOPTS) is translated:
    /// the programs walk the header to the UDP one, and the answer comes back from the
    /// frontend.
    fn extension_header_is_walked(lan: &socklb_tests::lan::Lan, a: &Addresses) {
        let before = lan.client.enter(|| {
            let socket = std::net::UdpSocket::bind((ip(a.client), 0)).expect("bind");
            // Next header and length (filled by the kernel), then PadN over 4 bytes.
            let options: [u8; 8] = [0, 0, 1, 4, 0, 0, 0, 0];
            raw_socket::set_option(&socket, libc::IPPROTO_IPV6, libc::IPV6_DSTOPTS, &options)
                .expect("IPV6_DSTOPTS");
            socket
                .set_read_timeout(Some(Duration::from_secs(3)))
                .expect("timeout");
            let frontend: SocketAddr = Addresses::at(a.node1, 30053).parse().expect("address");
            socket.send_to(b"ping", frontend).expect("send");
            let mut buffer = [0u8; 128];
            let (len, from) = uninterrupted(|| socket.recv_from(&mut buffer))
                .expect("an answer to a datagram with a destination options header");
            assert_eq!(from, frontend, "the answer comes from the frontend");
            String::from_utf8_lossy(&buffer[..len]).into_owned()
        });
        assert!(before.starts_with("pod1 "), "answered by {before:?}");
    }

    /// A datagram to the UDP NodePort behind five Destination Options headers, one more
    /// than the programs walk, is passed untranslated and counted (sent whole, headers and
    /// all, over a raw socket).
    fn too_many_extension_headers_pass_counted(
        lan: &socklb_tests::lan::Lan,
        a: &Addresses,
        sandbox: &Sandbox,
    ) {
        let (IpAddr::V6(client), IpAddr::V6(node1)) = (ip(a.client), ip(a.node1)) else {
            panic!("IPv6 addresses expected");
        };
        const HEADERS: u8 = 5;
        let mut packet = Vec::new();
        // IPv6 header: version 6, payload length, next header (destination options), hop
        // limit, source, destination.
        let payload = u16::from(HEADERS) * 8 + 8 + 4;
        packet.extend_from_slice(&[0x60, 0, 0, 0]);
        packet.extend_from_slice(&payload.to_be_bytes());
        packet.extend_from_slice(&[60, 64]);
        packet.extend_from_slice(&client.octets());
        packet.extend_from_slice(&node1.octets());
        for i in 0..HEADERS {
            let next = if i + 1 == HEADERS { 17 } else { 60 };
            // Next header, length 0 (8 bytes), PadN over the 4 bytes left.
            packet.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
        }
        // UDP to the NodePort (no checksum: the datagram is not meant to be delivered).
        packet.extend_from_slice(&40000u16.to_be_bytes());
        packet.extend_from_slice(&30053u16.to_be_bytes());
        packet.extend_from_slice(&12u16.to_be_bytes());
        packet.extend_from_slice(&[0, 0]);
        packet.extend_from_slice(b"ping");
        let before = counters(sandbox);
        lan.client.enter(|| {
            let socket = raw_socket::open(libc::AF_INET6, libc::IPPROTO_RAW);
            let sent = raw_socket::send_to(&socket, &packet, node1.into());
            assert_eq!(sent.as_ref().ok(), Some(&packet.len()), "send: {sent:?}");
        });
        eventually(
            &format!("the packet with {HEADERS} extension headers counted"),
            Duration::from_secs(5),
            || match counters(sandbox).ipv6_headers_unwalked {
                now if now > before.ipv6_headers_unwalked => Ok(()),
                now => Err(format!("ipv6_headers_unwalked {now}")),
            },
        );
    }

    /// Echo requests to node1 are answered, also after the client forgot node1's link-layer
    /// address (neighbour solicitation and advertisement cross the programs too).
    fn icmpv6_and_neighbour_discovery_pass(lan: &socklb_tests::lan::Lan, a: &Addresses) {
        lan.client.ip(&["-6", "neigh", "flush", "dev", "eth0"]);
        let IpAddr::V6(node1) = ip(a.node1) else {
            panic!("{} is not IPv6", a.node1);
        };
        lan.client.enter(|| echo(node1));
        let neighbours = lan
            .client
            .output("ip", &["-6", "neigh", "show", "dev", "eth0"]);
        let neighbours = String::from_utf8_lossy(&neighbours.stdout);
        assert!(
            neighbours.contains(a.node1),
            "the client resolved node1 again: {neighbours}"
        );
    }

    /// One ICMPv6 echo request to `target` over a raw socket, and its reply.
    fn echo(target: std::net::Ipv6Addr) {
        let socket = raw_socket::open(libc::AF_INET6, libc::IPPROTO_ICMPV6);
        raw_socket::set_receive_timeout(&socket, Duration::from_secs(1)).expect("SO_RCVTIMEO");
        // Echo request (type 128), identifier 0x5eb1, sequence 1; the kernel fills in the
        // checksum of ICMPv6 raw sockets.
        let request: [u8; 12] = [128, 0, 0, 0, 0x5e, 0xb1, 0, 1, b's', b'l', b'b', b'6'];
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let sent = raw_socket::send_to(&socket, &request, target.into());
            assert_eq!(
                sent.as_ref().ok(),
                Some(&12),
                "send the echo request: {sent:?}"
            );
            let mut reply = [0u8; 128];
            let len = raw_socket::receive(&socket, &mut reply, 0).unwrap_or(0);
            // Echo reply (129) with our identifier; other ICMPv6 (neighbour discovery) is
            // skipped.
            if len >= 8 && reply[0] == 129 && reply[4..6] == [0x5e, 0xb1] {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no echo reply from {target} with the programs attached"
            );
        }
    }
}

/// A NIC that hands the stack each packet's full sum (`CHECKSUM_COMPLETE`: mlx5 and many
/// others) finds `skb->csum` still the sum of the packet after each of socklb's rewrites:
/// a NodePort's to a local backend (TCP and UDP) and a router's Packet Too Big about its
/// answer, a NodePort's to a remote backend (SNAT, the hop limit taken down, forwarded by
/// redirect) and its answer, a ClusterIP's from a pod (the per-packet path) and its
/// answer. Each packet goes through the attached program in the kernel's test harness,
/// which fails the run if the sum is left wrong (a real node would log "hw csum failure"
/// and checksum every such packet again in software); the packet it made has right
/// checksums and the translated addresses.
fn every_rewrite_keeps_a_nic_s_full_checksum_right(family: Family) {
    let node = LanNode::new(family, "ext-sum", "s");
    let a = &node.a;
    let exposed = |name: &str, host: u8, node_port: u16, endpoint: (String, &str)| {
        a.exposed(name, host)
            .port("http", 80, 8080, node_port, "TCP")
            .port("dns", 53, 5353, node_port + 10, "UDP")
            .endpoints(&[endpoint])
            .yaml()
    };
    node.write(
        "local.yaml",
        &exposed("local", 70, 30120, a.pod1_endpoint()),
    );
    node.write(
        "remote.yaml",
        &exposed("remote", 71, 30121, a.pod2_endpoint()),
    );
    let _agent = node.agent(&[]);
    let pins = &node.sandbox.pin_dir;
    let program = |name: &str, device: &str| {
        let program = TestRun::of_link(pins, name, device)
            .unwrap_or_else(|e| panic!("{name} on {device}: {e:#}"));
        (program, ifindex(device))
    };
    let external = program(program_names::TC_INGRESS, "eth0");
    let pod = program(program_names::TC_POD, "pod1");
    let egress = program(program_names::TC_EGRESS, "pod1");

    let at = |address: &str, port: u16| SocketAddr::new(address.parse().expect("address"), port);
    let client = at(a.client, 40_001);
    let pod1 = SocketAddr::new(a.pod1, 40_002);
    let pod2 = SocketAddr::new(a.pod2, 8080);
    let vip = SocketAddr::new(family.vip(71), 80);
    // `frame` through `program`: the frame it made, checked not dropped.
    let run = |what: &str, (program, ifindex): &(TestRun, u32), frame: Vec<u8>| {
        let ran = program
            .run_with_full_sum(&frame, *ifindex)
            .unwrap_or_else(|e| {
                panic!("{what}: the run failed (EBADMSG: skb->csum left wrong): {e}")
            });
        assert_ne!(ran.verdict, TC_ACT_SHOT, "{what}: dropped");
        ran.frame
    };
    // A SYN `from` → `to` (if `answer`, the SYN-ACK) through `program`: where it goes after.
    let rewrite = |what: &str, program, from, to, answer| {
        let frame = run(what, program, frames::tcp(from, to, answer));
        frames::checked_addresses(&frame, what)
    };

    let local_nodeport = at(a.node1, 30120);
    let local_backend = SocketAddr::new(a.pod1, 8080);
    let local = rewrite(
        "a NodePort to a local backend",
        &external,
        client,
        local_nodeport,
        false,
    );
    assert_eq!(local, (client, local_backend));
    let dns = run(
        "a UDP NodePort",
        &external,
        frames::udp(client, at(a.node1, 30130)),
    );
    assert_eq!(
        frames::checked_addresses(&dns, "a UDP NodePort"),
        (client, SocketAddr::new(a.pod1, 5353))
    );
    // A router on the way back, of a smaller MTU, about the backend's answer as it left.
    let too_big = frames::too_big(a.node2, local_nodeport, client);
    let frame = run("Packet Too Big", &external, too_big);
    assert_eq!(
        frames::checked_icmp(&frame),
        (a.pod1, (local_backend, client)),
        "Packet Too Big goes to the backend, about its own answer"
    );
    let nodeport = at(a.node1, 30121);
    let (snat, backend) = rewrite(
        "a NodePort to a remote backend",
        &external,
        client,
        nodeport,
        false,
    );
    assert_eq!(
        (snat.ip(), backend),
        (nodeport.ip(), pod2),
        "SNAT to the node, to pod2"
    );
    let answer = rewrite("the remote backend's answer", &external, pod2, snat, true);
    assert_eq!(answer, (nodeport, client));
    let per_packet = rewrite("a pod's ClusterIP", &pod, pod1, vip, false);
    assert_eq!(per_packet, (pod1, pod2));
    let answer = rewrite("the backend's answer to the pod", &egress, pod2, pod1, true);
    assert_eq!(answer, (vip, pod1));
}
