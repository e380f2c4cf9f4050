//! Conntrack (upstream `conntrack.go`): a UDP flow from one source port keeps reaching the
//! Service as its server pod is replaced or its endpoint becomes ready, and a TCP client
//! answers a server's out-of-window segment with an ACK, not a RST, through a cluster IP and
//! through a NodePort.
use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddrV4},
};

use socklb_tests::{
    Dnsmasq,
    boom_server::{BoomServer, Reaction},
    cluster::{ServiceBuilder, endpoint, not_ready, service, slice},
    testbed::{At, Pod, PodPath, Testbed},
};

use crate::scenario::{ONE, TWO, at, vip, wait_for};

socklb_tests::for_each_pod_path!(
    should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_nodeport_service,
    should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service,
    should_be_able_to_preserve_udp_traffic_when_initial_unready_endpoints_get_ready,
    should_drop_invalid_conntrack_entries,
);

/// dig from `at`, always from source port 12345 (one flow to conntrack, as upstream's
/// `nc -p 12345`): the address the DNS server answered, or dig's complaint.
fn dig_from_fixed_port(tb: &Testbed, at: At, source: Ipv4Addr, server: SocketAddrV4) -> String {
    let output = tb
        .command(at, "dig")
        .args([
            "-b",
            &format!("{source}#12345"),
            &format!("@{}", server.ip()),
            "-p",
            &server.port().to_string(),
            "who.test",
            "A",
            "+short",
            "+time=1",
            "+tries=1",
        ])
        .output()
        .expect("prerequisite missing: dig (apt-get install bind9-dnsutils; ./x setup does)");
    let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if text.is_empty() {
        format!(
            "no answer: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
    } else {
        text
    }
}

/// A DNS server (dnsmasq) in `pod` answering `who.test` with `answer`.
fn dns_server(pod: &Pod, answer: Ipv4Addr) -> Dnsmasq {
    pod.netns.enter(|| Dnsmasq::start(pod.ip, answer))
}

/// Service svc-udp (`service`, port udp 53) is created; a client sends UDP from one
/// source port to `target` the whole time while the server pod behind it is replaced (a
/// second one added, the first deleted); the client's datagrams reach the new one.
fn udp_through_server_cycle(
    tb: &Testbed,
    service: ServiceBuilder,
    (client, servers): (&Pod, [&Pod; 2]),
    target: SocketAddrV4,
) {
    let answers = [Ipv4Addr::new(192, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 2)];
    let endpoints = |pods: &[&Pod]| tb.set_endpoints("svc-udp", ("udp", 53, "UDP"), pods);
    let dig = || dig_from_fixed_port(tb, At::Pod(client), client.ip, target);
    let first = dns_server(servers[0], answers[0]);
    tb.serve(service, ("udp", 53, "UDP"), &[servers[0]]);
    tb.eventually("the client reaches server 1", || match dig() {
        answer if answer == answers[0].to_string() => Ok(()),
        other => Err(other),
    });

    let _second = dns_server(servers[1], answers[1]);
    endpoints(&[servers[0], servers[1]]);
    endpoints(&[servers[1]]);
    drop(first);
    tb.eventually("the same flow reaches server 2", || match dig() {
        answer if answer == answers[1].to_string() => Ok(()),
        other => Err(other),
    });
    for _ in 0..3 {
        assert_eq!(dig(), answers[1].to_string());
    }
}

fn should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_nodeport_service(
    path: PodPath,
) {
    // The client pod on node2 sends to node1's NodePort; the servers run on node1.
    let tb = Testbed::new("udpcyclenp", path, [2, 1], &[ONE, TWO]);
    let svc = service("svc-udp", vip(100)).node_port("udp", 53, "UDP", 30053);
    let pods = (tb.pod(TWO, 0), [tb.pod(ONE, 0), tb.pod(ONE, 1)]);
    udp_through_server_cycle(&tb, svc, pods, at(ONE.address(), 30053));
}

fn should_be_able_to_preserve_udp_traffic_when_server_pod_cycles_for_a_clusterip_service(
    path: PodPath,
) {
    // The client pod on node1, the servers on node2.
    let tb = Testbed::new("udpcyclecip", path, [1, 2], &[ONE, TWO]);
    let svc = service("svc-udp", vip(101)).port("udp", 53, "UDP");
    let pods = (tb.pod(ONE, 0), [tb.pod(TWO, 0), tb.pod(TWO, 1)]);
    udp_through_server_cycle(&tb, svc, pods, at(vip(101), 53));
}

fn should_be_able_to_preserve_udp_traffic_when_initial_unready_endpoints_get_ready(path: PodPath) {
    let tb = Testbed::new("udpunready", path, [1, 1], &[ONE, TWO]);
    let (client, server) = (tb.pod(ONE, 0), tb.pod(TWO, 0));
    let answer = Ipv4Addr::new(192, 0, 2, 3);
    let _dns = dns_server(server, answer);
    tb.api
        .apply(&service("svc-udp", vip(102)).port("udp", 53, "UDP").build());
    let endpoints = |e| {
        slice("svc-udp-1", "svc-udp")
            .port("udp", 53, "UDP")
            .endpoint(e)
            .build()
    };
    // The pod exists (its address is in the slice) but is not ready: its init container runs.
    tb.api
        .apply(&endpoints(not_ready(endpoint(server.ip, "node2"))));
    let target = at(vip(102), 53);
    let dig = || dig_from_fixed_port(&tb, At::Pod(client), client.ip, target);
    tb.eventually("not ready: refused", || match dig() {
        answer if answer.contains("refused") => Ok(()),
        other => Err(other),
    });
    tb.api.apply(&endpoints(endpoint(server.ip, "node2")));
    tb.eventually("ready: the same flow is answered", || match dig() {
        got if got == answer.to_string() => Ok(()),
        other => Err(other),
    });
    for _ in 0..3 {
        assert_eq!(dig(), answer.to_string());
    }
}

fn should_drop_invalid_conntrack_entries(path: PodPath) {
    let tb = Testbed::new("invalid", path, [1, 1], &[ONE, TWO]);
    let server = tb.pod(ONE, 0);
    let boom = BoomServer::start(&server.netns, at(server.ip, 9000));
    let svc = service("boom-server", vip(103)).node_port("tcp", 9000, "TCP", 30900);
    tb.serve(svc, ("tcp", 9000, "TCP"), &[server]);
    // A client pod on the other node through the cluster IP (its node's pod path), and the
    // outside client through the NodePort (TC): every connection gets an out-of-window
    // segment from the server, and must answer it with an ACK, not a RST.
    let client = tb.pod(TWO, 0);
    for (from, target) in [
        (At::Pod(client), at(vip(103), 9000)),
        (At::Outside, at(ONE.address(), 30900)),
    ] {
        wait_for(&tb, from, "tcp", target, &["boom-server"]);
        for attempt in tb.probe(from, "tcp", target, 5) {
            assert_eq!(
                attempt.reply.as_deref(),
                Some("boom-server Ack"),
                "{target}: {attempt:?}"
            );
        }
    }
    let reactions = boom.reactions();
    let clients: BTreeSet<Ipv4Addr> = reactions.iter().map(|(peer, _)| *peer.ip()).collect();
    assert_eq!(
        clients,
        BTreeSet::from([client.ip, socklb_tests::testbed::CLIENT])
    );
    for (peer, reaction) in &reactions {
        assert_eq!(*reaction, Reaction::Ack, "the client at {peer}");
    }
}
