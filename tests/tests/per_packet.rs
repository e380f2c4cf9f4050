//! The per-packet path: workloads on node1 whose sockets the socket hooks never see (a
//! VM, pod1's processes outside the served cgroup, a meshed pod's sidecar under
//! `--socket-lb-scope host`) reach ClusterIPs through the TC program on their host-side
//! device, which the agent finds by itself. On the LAN of `socklb_tests::lan`, both
//! families.
use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    process::Stdio,
};

use socklb_tests::{
    KillOnDrop, assert_logged, command_in_cgroup,
    family::Family,
    hold::Holder,
    hold_bin,
    lan::{Addresses, LanNode, VM, VM6, answers, servers_of},
    mesh_proxy_bin, run,
};

socklb_tests::for_each_family!(
    a_vm_reaches_cluster_ips_through_its_device,
    a_pod_that_is_its_own_backend_gets_an_answer,
    a_meshed_pod_s_sidecar_sees_the_service_address_under_host_scope,
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

/// A meshed pod (Istio's outbound capture): the pod's iptables REDIRECT every outbound TCP
/// connection to the sidecar on port 15001 but the sidecar's own (its uid, 1337, excluded as
/// Istio excludes it), and the sidecar connects to the original destination it reads with
/// `SO_ORIGINAL_DST`. App and sidecar are in the served cgroup. With `--socket-lb-scope
/// host` the app's socket keeps the Service address, so the sidecar sees the VIP, and its own
/// connection to the VIP reaches the backend through the per-packet path on the pod's
/// device. With `all` the socket hook rewrites the app's connect() before the REDIRECT: the
/// sidecar sees the backend (documented).
fn a_meshed_pod_s_sidecar_sees_the_service_address_under_host_scope(family: Family) {
    let node = LanNode::new(family, "pp-mesh", "m");
    let a = &node.a;
    let pod = &node.lan.pod1;
    let _server = node.tcp_server(2, 8080);
    node.write(
        "web.yaml",
        &a.exposed("web", 62)
            .port("http", 80, 8080, 30080, "TCP")
            .endpoints(&[a.pod2_endpoint()])
            .yaml(),
    );
    let tables = match family {
        Family::V4 => "iptables",
        Family::V6 => "ip6tables",
    };
    for rule in [
        "-t nat -A OUTPUT -p tcp -o lo -j RETURN",
        "-t nat -A OUTPUT -p tcp -m owner --uid-owner 1337 -j RETURN",
        "-t nat -A OUTPUT -p tcp -j REDIRECT --to-ports 15001",
    ] {
        run(pod.command(tables).args(rule.split(' ')));
    }
    let listen = match family {
        Family::V4 => "0.0.0.0:15001",
        Family::V6 => "[::]:15001",
    };
    let mut sidecar = command_in_cgroup(&node.sandbox.cgroup, "ip");
    sidecar
        .args([
            "netns", "exec", &pod.name, "setpriv", "--reuid", "1337", "--regid", "1337",
        ])
        .args(["--clear-groups"])
        .arg(mesh_proxy_bin())
        .arg(listen)
        .stdout(Stdio::piped());
    let mut sidecar = KillOnDrop(sidecar.spawn().expect("start the sidecar"));
    let mut ready = String::new();
    BufReader::new(sidecar.0.stdout.take().expect("sidecar stdout"))
        .read_line(&mut ready)
        .expect("the sidecar's first line");
    assert_eq!(ready.trim(), "listening", "the sidecar listens");

    let vip = Addresses::at(&family.vip(62).to_string(), 80);
    let backend = Addresses::at(&a.pod2.to_string(), 8080);
    let app = || {
        let mut command = command_in_cgroup(&node.sandbox.cgroup, "ip");
        command
            .args(["netns", "exec", &pod.name])
            .arg(hold_bin())
            .args(["tcp", &vip]);
        Holder::start("app", command).1
    };
    for (scope, sidecar_sees) in [("host", &vip), ("all", &backend)] {
        let agent = node.agent(&["--socket-lb-scope", scope]);
        let answer = app();
        let reply = answer.reply.as_deref().unwrap_or_else(|| {
            panic!(
                "scope {scope}: the app got no answer: {answer:?}\n{}",
                agent.log()
            )
        });
        let [destination, server, seen] = reply.splitn(3, ' ').collect::<Vec<_>>()[..] else {
            panic!("scope {scope}: unexpected answer {reply:?}");
        };
        assert_eq!(
            (destination, server),
            (sidecar_sees.as_str(), "pod2"),
            "scope {scope}: the sidecar's original destination, and the backend: {reply:?}"
        );
        let seen: SocketAddr = seen.parse().expect("the address pod2 saw");
        assert_eq!(
            seen.ip(),
            a.pod1,
            "pod2 sees the pod's own address: {reply:?}"
        );
        if scope == "host" {
            let counters = node.counters();
            assert!(counters.pod_flows >= 1, "the per-packet path: {counters:?}");
        }
        agent.stop();
    }
}
