//! The per-packet path: workloads on node1 whose sockets the socket hooks never see (a
//! VM, and pod1 itself: processes outside the served cgroup) reach ClusterIPs through the
//! TC program on their host-side device, which the agent finds by itself. On the LAN of
//! `socklb_tests::lan`, both families.
use socklb_tests::{
    family::Family,
    lan::{Addresses, LanNode, VM, VM6, answers, servers_of},
};

socklb_tests::for_each_family!(
    a_vm_reaches_cluster_ips_through_its_device,
    a_pod_that_is_its_own_backend_gets_an_answer,
);

fn a_vm_reaches_cluster_ips_through_its_device(family: Family) {
    let node = LanNode::new(family, "pp-vm", "v");
    let vm = node.lan.vm();
    let a = &node.a;
    let _servers = [node.tcp_servers(8080), node.udp_servers(5353)];
    node.write(
        "web.yaml",
        &a.exposed("web", 60)
            .port("http", 80, 8080, 30080, "TCP")
            .port("dns", 53, 5353, 30053, "UDP")
            .endpoints(&[a.pod1_endpoint(), a.pod2_endpoint()])
            .yaml(),
    );
    let agent = node.agent(&[]);
    assert!(
        agent
            .log()
            .contains(r#"program="socklb_tc_pod" device="vm1""#),
        "the per-packet path attaches to the VM's device without being told:\n{}",
        agent.log()
    );
    let vm_address = match family {
        Family::V4 => VM,
        Family::V6 => VM6,
    };
    let vip = family.vip(60).to_string();

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
        }
    }
    let counters = node.counters();
    assert!(counters.pod_flows >= 80, "{counters:?}");
    assert_eq!(counters.errors, 0, "{counters:?}");
}

fn a_pod_that_is_its_own_backend_gets_an_answer(family: Family) {
    let node = LanNode::new(family, "pp-hairpin", "h");
    let a = &node.a;
    let _servers = [node.tcp_server(1, 8080), node.udp_server(1, 5353)];
    node.write(
        "self.yaml",
        &a.exposed("self", 61)
            .port("http", 80, 8080, 30080, "TCP")
            .port("dns", 53, 5353, 30053, "UDP")
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
