//! `--socket-lb-scope`: whose sockets the socket hooks translate. With `all` a pod's
//! connect() to a ClusterIP reaches a backend as the host's does; with `host` the pod's
//! socket keeps the Service address (what a mesh's proxy reads as the original
//! destination; the per-packet path serves it, see `per_packet.rs`) while the host's is
//! still translated; with `pods` (the default) the host's and the pods' are translated, and
//! a namespace made inside a pod (a nested cluster) keeps its own ClusterIPs.
//!
//! The world: the sandbox's namespace is the node (the agent, a host client, the backend on
//! an address of its loopback) and a pod namespace reaches it over a veth pair. The pod's
//! Service range is blackholed, so that an untranslated connect fails where it starts.
use std::{
    fs::File,
    net::SocketAddrV4,
    os::fd::AsRawFd as _,
    process::{Command, Stdio},
    time::Duration,
};

use socklb_tests::{
    Agent, KillOnDrop, ManifestDir, NamedServer, Sandbox, agent_bin, command_in_cgroup,
    hold::Holder,
    hold_bin,
    netns::Netns,
    node_yaml,
    privileges::{ContainerPrivileges, chart_agent, chart_agent_minimal},
    run, service_yaml, slice_yaml, stdout_of,
};

const BACKEND: &str = "10.204.0.1";
const VIP: &str = "10.96.0.94";

/// The node (the sandbox), its backend, a pod, and the manifests of one Service on [`VIP`]
/// served by the backend.
struct World {
    pod: Netns,
    manifests: ManifestDir,
    _backend: NamedServer,
    sandbox: Sandbox,
}

impl World {
    fn new(name: &str) -> Self {
        let sandbox = Sandbox::new(name);
        run(Command::new("ip").args(["addr", "add", &format!("{BACKEND}/32"), "dev", "lo"]));
        let backend = NamedServer::tcp(
            "b1",
            SocketAddrV4::new(BACKEND.parse().expect("address"), 8080),
        );
        let pod = Netns::new(&format!("{name}-{}", std::process::id()));
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
        Self {
            pod,
            manifests,
            _backend: backend,
            sandbox,
        }
    }

    /// The agent with `privileges` and `flags`, once it has synced.
    fn agent(&self, privileges: &ContainerPrivileges, flags: &[&str]) -> Agent {
        let agent = Agent::start_as(
            privileges,
            &self.sandbox,
            &self.manifests.path,
            "node-a",
            flags,
        );
        agent.wait_for_log("synced", 1);
        agent
    }

    /// The first answer of a TCP client to the VIP, in the served cgroup: on the host, in
    /// the pod, or run by `nsenter` with `enter`'s arguments.
    fn client(&self, place: Place) -> Option<String> {
        let target = format!("{VIP}:80");
        let mut command = match place {
            Place::Host => command_in_cgroup(&self.sandbox.cgroup, hold_bin()),
            Place::Pod => {
                let mut command = command_in_cgroup(&self.sandbox.cgroup, "ip");
                command
                    .args(["netns", "exec", &self.pod.name])
                    .arg(hold_bin());
                command
            }
            Place::Nested(pid) => {
                let mut command = command_in_cgroup(&self.sandbox.cgroup, "nsenter");
                command
                    .arg(format!("--net=/proc/{pid}/ns/net"))
                    .arg(hold_bin());
                command
            }
        };
        command.args(["tcp", &target]);
        Holder::start("client", command).1.reply
    }
}

#[derive(Clone, Copy, Debug)]
enum Place {
    Host,
    Pod,
    /// The network namespace of this process.
    Nested(u32),
}

#[test]
fn host_scope_leaves_a_pods_sockets_on_the_service_address() {
    let world = World::new("sockscope");
    // A `pods` agent before lists the pod's namespace for the socket hooks.
    let agent = world.agent(chart_agent(), &["--socket-lb-scope", "pods"]);
    assert_eq!(
        world.sandbox.inspected_pod_path(&world.pod.name),
        "socket",
        "{}",
        agent.log()
    );
    agent.stop();
    let agent = world.agent(chart_agent_minimal(), &["--socket-lb-scope", "all"]);
    for place in [Place::Host, Place::Pod] {
        assert_eq!(
            world.client(place).as_deref(),
            Some("b1"),
            "scope all: every namespace's sockets are translated ({place:?})\n{}",
            agent.log()
        );
    }
    assert_eq!(world.sandbox.inspect()["socket_lb_scope"], "all");
    assert_eq!(
        world.sandbox.inspected_pod_path(&world.pod.name),
        "socket",
        "scope all: inspect says the socket hooks serve the pod, listed or not"
    );
    agent.stop();

    let agent = world.agent(chart_agent_minimal(), &["--socket-lb-scope", "host"]);
    assert_eq!(
        world.client(Place::Host).as_deref(),
        Some("b1"),
        "the host's socket"
    );
    assert_eq!(
        world.client(Place::Pod),
        None,
        "the pod's socket keeps the Service address (blackholed in the pod)\n{}",
        agent.log()
    );
    // The `pods` agent's list is gone: inspect shows the pod on its device's path.
    assert_eq!(world.sandbox.inspect()["socket_lb_scope"], "host");
    assert_eq!(
        world.sandbox.inspected_pod_path(&world.pod.name),
        "per-packet",
        "{}",
        agent.log()
    );
    // From another network namespace the devices are not the agent's: inspect says so
    // rather than showing every pod served by neither path.
    let elsewhere: serde_json::Value = serde_json::from_str(&stdout_of(
        // Not `ip netns exec`, whose /sys of its own hides bpffs.
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", world.pod.name))
            .arg(agent_bin())
            .args(["inspect", "-o", "json", "--bpffs"])
            .arg(&world.sandbox.pin_dir),
    ))
    .expect("inspect's JSON");
    assert_eq!(elsewhere["pods"], serde_json::json!([]), "{elsewhere}");
    let why = elsewhere["pods_unreadable"].as_str().unwrap_or_default();
    assert!(
        why.contains("not in the agent's network namespace"),
        "inspect from the pod's namespace: {elsewhere}"
    );
}

/// A nested cluster (kind in a pod): a network namespace made by a process of the served
/// cgroup, pinned nowhere on the node, whose own ClusterIP is the outer cluster's VIP. With
/// the chart's capabilities and the default scope, the pod's connect() is translated and
/// the nested one's is not: it reaches the inner server. Under `all` the socket hook
/// rewrites it to the outer backend, which the nested namespace cannot reach.
#[test]
fn the_default_scope_leaves_a_nested_cluster_s_cluster_ips_alone() {
    let world = World::new("nestscope");
    let mut nested = command_in_cgroup(&world.sandbox.cgroup, "unshare");
    nested.args(["--net", "sleep", "600"]).stdin(Stdio::null());
    let nested = KillOnDrop(nested.spawn().expect("unshare --net"));
    let pid = nested.0.id();
    let namespace = format!("/proc/{pid}/ns/net");
    // `unshare` has made its namespace once its process is in another than this thread.
    socklb_tests::eventually("the nested namespace", Duration::from_secs(5), || {
        let ours = std::fs::read_link("/proc/thread-self/ns/net").map_err(|e| e.to_string())?;
        match std::fs::read_link(&namespace) {
            Ok(theirs) if theirs != ours => Ok(()),
            other => Err(format!("{namespace}: {other:?}")),
        }
    });
    let inside = |args: &[&str]| {
        run(Command::new("nsenter")
            .arg(format!("--net={namespace}"))
            .args(args))
    };
    inside(&["ip", "link", "set", "lo", "up"]);
    inside(&["ip", "addr", "add", &format!("{VIP}/32"), "dev", "lo"]);
    let _inner = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = File::open(&namespace).expect("open the nested namespace");
                // SAFETY: setns with a namespace fd we opened; affects only this thread.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns into the nested namespace");
                NamedServer::tcp("inner", SocketAddrV4::new(VIP.parse().expect("VIP"), 80))
            })
            .join()
            .expect("the inner server")
    });

    let agent = world.agent(chart_agent(), &[]);
    agent.wait_for_log("pods' network namespaces found", 1);
    for (place, answer) in [
        (Place::Host, Some("b1")),
        (Place::Pod, Some("b1")),
        (Place::Nested(pid), Some("inner")),
    ] {
        assert_eq!(
            world.client(place).as_deref(),
            answer,
            "default scope: the host's and the pods' sockets are translated, the nested \
             cluster's keep their address ({place:?})\n{}",
            agent.log()
        );
    }
    let pod_namespaces = &world.sandbox.inspect()["pod_namespaces"];
    assert!(
        pod_namespaces.as_u64() >= Some(1),
        "inspect counts the pods' namespaces in scope: {pod_namespaces}"
    );
    agent.stop();

    let agent = world.agent(chart_agent(), &["--socket-lb-scope", "all"]);
    assert_eq!(
        world.client(Place::Nested(pid)),
        None,
        "scope all: the nested cluster's connect() is rewritten to the outer backend\n{}",
        agent.log()
    );
}
