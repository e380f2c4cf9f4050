//! `--socket-lb-scope`: whose sockets the socket hooks translate. With `all` (the default)
//! a pod's connect() to a ClusterIP reaches a backend as the host's does; with `host` the
//! pod's socket keeps the Service address (what a mesh's proxy reads as the original
//! destination, for whatever serves the pod's traffic instead) while the host's is still
//! translated.
//!
//! The world: the sandbox's namespace is the node (the agent, a host client, the backend on
//! an address of its loopback) and a pod namespace reaches it over a veth pair. The pod's
//! Service range is blackholed, so that an untranslated connect fails where it starts.
use std::{net::SocketAddrV4, process::Command};

use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox, command_in_cgroup, hold::Holder, hold_bin,
    netns::Netns, node_yaml, run, service_yaml, slice_yaml,
};

const BACKEND: &str = "10.204.0.1";
const VIP: &str = "10.96.0.94";

#[test]
fn host_scope_leaves_a_pods_sockets_on_the_service_address() {
    let sandbox = Sandbox::new("sockscope");
    run(Command::new("ip").args(["addr", "add", &format!("{BACKEND}/32"), "dev", "lo"]));
    let _backend = NamedServer::tcp(
        "b1",
        SocketAddrV4::new(BACKEND.parse().expect("address"), 8080),
    );
    let pod = Netns::new(&format!("sls-{}", std::process::id()));
    run(Command::new("ip").args([
        "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", &pod.name,
    ]));
    run(Command::new("ip").args(["addr", "add", "10.205.0.1/24", "dev", "pod0"]));
    run(Command::new("ip").args(["link", "set", "pod0", "up"]));
    pod.ip(&["addr", "add", "10.205.0.2/24", "dev", "eth0"]);
    pod.ip(&["link", "set", "eth0", "up"]);
    pod.ip(&["route", "add", "default", "via", "10.205.0.1"]);
    pod.ip(&["route", "add", "blackhole", "10.96.0.0/12"]);
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.30.1"));
    manifests.service(
        "web",
        &service_yaml("web", VIP, 80, ""),
        &slice_yaml(
            "web-1",
            "web",
            8080,
            &[(BACKEND, "node-a", "zone-a", "")],
            false,
        ),
    );
    let target = format!("{VIP}:80");
    let client = |in_pod: bool| {
        let mut command = if in_pod {
            let mut command = command_in_cgroup(&sandbox.cgroup, "ip");
            command.args(["netns", "exec", &pod.name]).arg(hold_bin());
            command
        } else {
            command_in_cgroup(&sandbox.cgroup, hold_bin())
        };
        command.args(["tcp", &target]);
        Holder::start(if in_pod { "pod client" } else { "host client" }, command).1
    };

    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    agent.wait_for_log("synced", 1);
    for in_pod in [false, true] {
        let first = client(in_pod);
        assert_eq!(
            first.reply.as_deref(),
            Some("b1"),
            "scope all: every namespace's sockets are translated (pod: {in_pod}): {first:?}"
        );
    }
    agent.stop();

    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--socket-lb-scope", "host"],
    );
    agent.wait_for_log("synced", 1);
    let host = client(false);
    assert_eq!(
        host.reply.as_deref(),
        Some("b1"),
        "the host's socket: {host:?}"
    );
    let in_pod = client(true);
    assert!(
        in_pod.reply.is_none() && in_pod.error.is_some(),
        "the pod's socket keeps the Service address (blackholed in the pod): {in_pod:?}\n{}",
        agent.log()
    );
}
