//! A small cluster on one machine, for end-to-end tests of what Kubernetes users expect of
//! Services: two nodes, pods and a client outside the cluster as network namespaces on one
//! LAN, the fake API server, and the real agent (`socklb run --source kube`) on the nodes.
//!
//! ```text
//!   client 10.77.0.10 ─┐
//!   node1  10.77.0.1  ─┼─ switch (bridge)   node1: the Sandbox's namespace (the test's thread)
//!   node2  10.77.0.2  ─┘                    node2: a namespace
//!   pods: 10.244.<node>.<10 + i> on their node's bridge cbr0 (10.244.<node>.1)
//! ```
//!
//! Each node forwards and routes the other's pod subnet through it. A process "in a pod" or
//! "on a node" (hostNetwork) runs in that node's cgroup, where that node's agent attached its
//! programs; the outside client's processes run in no such cgroup. Pods reach Services over
//! one of two paths, chosen per test ([`PodPath`]): the socket hooks, or the per-packet path
//! on their node's side of their veth. Either way a destination socklb did not translate
//! never leaves the machine: the service CIDR and the documentation range used for
//! externalIPs end in a route that stops it ([`PodPath::not_served`] says what the client
//! gets). The fake API server listens on every address of node1, so node2's agent reaches it
//! over the LAN. Everything is removed in Drop, also when a test panics.
use std::{
    ffi::OsStr,
    fs,
    net::{Ipv4Addr, SocketAddrV4},
    path::PathBuf,
    process::{Command, Output, Stdio},
    time::Duration,
};

use socklb_agent::inspect::{self, Inspection};

use crate::{
    Agent, Attempt, ManifestDir, NamedServer, Sandbox,
    agent::Source,
    cgroup2_root,
    clients::{probe_bin, probe_output},
    cluster,
    cluster::ServiceBuilder,
    command_in_cgroup,
    fake_apiserver::FakeApiServer,
    netns::{Netns, veth},
    remove_cgroup, run,
    wait::eventually_showing,
};

/// Service cluster IPs are taken from here.
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
/// Documentation addresses (RFC 5737) used as externalIPs assigned to no node.
pub const EXTERNAL_CIDR: &str = "203.0.113.0/24";
/// The client outside the cluster.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 10);
/// How long a test waits for the agents to follow a change of the API objects.
pub const CONVERGE: Duration = Duration::from_secs(20);

/// The path that translates a pod's connections to Services; hostNetwork clients always
/// take the socket hooks, the outside client the external TC path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPath {
    /// The socket hooks, at connect() and sendmsg() (the agent's default scope): a pod's
    /// packets carry the backend already. Every namespace blackholes the service CIDR, so
    /// an untranslated destination fails at once with EINVAL.
    SocketLb,
    /// The per-packet path (`--socket-lb-scope host`): a pod's packets leave it with the
    /// Service address, and `socklb_tc_pod` on its node's side of the veth translates them.
    /// Pods route the service CIDR to their node like any address; the nodes end it in an
    /// `unreachable` route instead of a blackhole (which would drop a forwarded packet
    /// silently), so an untranslated destination fails with EHOSTUNREACH: at once on the
    /// node, and in a pod once the node answers it (the kernel answers each source about
    /// once a second, `net.ipv4.route.error_cost`, so a TCP connect fails with its SYN's
    /// first retransmission).
    PerPacket,
}

impl PodPath {
    /// The agent's flags for this path.
    fn agent_flags(self) -> &'static [&'static str] {
        match self {
            Self::SocketLb => &[],
            Self::PerPacket => &["--socket-lb-scope", "host"],
        }
    }

    /// What ends the service CIDR and the externalIP range on a node.
    fn node_route(self) -> &'static str {
        match self {
            Self::SocketLb => "blackhole",
            Self::PerPacket => "unreachable",
        }
    }

    /// The error (the probe's name for it) a client at `at` gets for a destination socklb
    /// did not translate: where its packet is stopped, a blackhole (EINVAL) or an
    /// unreachable route (EHOSTUNREACH).
    pub fn not_served(self, at: At) -> &'static str {
        match (self, at) {
            (Self::PerPacket, At::Pod(_) | At::Host(_)) => "EHOSTUNREACH",
            _ => "EINVAL",
        }
    }
}

/// Runs each scenario (a fn of the calling module taking a [`PodPath`]) once per path, as
/// the tests `socket_lb::<scenario>` and `per_packet::<scenario>`.
#[macro_export]
macro_rules! for_each_pod_path {
    ($($scenario:ident),* $(,)?) => {
        $crate::for_each_case!(
            [
                socket_lb => $crate::testbed::PodPath::SocketLb,
                per_packet => $crate::testbed::PodPath::PerPacket,
            ],
            [$($scenario),*]
        );
    };
}

/// One of the two nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeId {
    One,
    Two,
}

impl NodeId {
    fn number(self) -> u8 {
        match self {
            Self::One => 1,
            Self::Two => 2,
        }
    }

    /// The Node's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::One => "node1",
            Self::Two => "node2",
        }
    }

    /// The Node's InternalIP, on the LAN.
    pub fn address(self) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, self.number())
    }

    /// The zone of the Node as the testbed creates it.
    pub fn zone(self) -> &'static str {
        match self {
            Self::One => "zone-a",
            Self::Two => "zone-b",
        }
    }

    fn pod_gateway(self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.number(), 1)
    }

    fn other(self) -> Self {
        match self {
            Self::One => Self::Two,
            Self::Two => Self::One,
        }
    }
}

/// A pod: a network namespace on a node's pod bridge.
pub struct Pod {
    pub name: String,
    pub node: NodeId,
    pub ip: Ipv4Addr,
    pub netns: Netns,
}

/// Where a client process runs.
#[derive(Clone, Copy)]
pub enum At<'a> {
    /// In a pod (its network namespace and its node's cgroup).
    Pod(&'a Pod),
    /// On a node: a hostNetwork pod or a host process (the node's namespace and cgroup).
    Host(NodeId),
    /// On the client outside the cluster.
    Outside,
}

/// The second node's pins and cgroup; removed after its agent has stopped.
struct SecondNode {
    pin_dir: PathBuf,
    cgroup: PathBuf,
}

impl Drop for SecondNode {
    fn drop(&mut self) {
        if self.pin_dir.exists()
            && let Err(e) = socklb_agent::dataplane::cleanup(&self.pin_dir)
        {
            eprintln!("cleanup of {}: {e}", self.pin_dir.display());
        }
        remove_cgroup(&self.cgroup);
    }
}

/// The cluster. Fields drop in order: agents, API server, second node's state, namespaces,
/// then the sandbox (pins, cgroup, and the thread back in its namespace).
pub struct Testbed {
    /// The path that serves the pods.
    pub path: PodPath,
    agents: Vec<(NodeId, Agent)>,
    pub api: FakeApiServer,
    second: SecondNode,
    pods: Vec<Pod>,
    pub client: Netns,
    node2: Netns,
    _switch: Netns,
    _files: ManifestDir,
    pub sandbox: Sandbox,
}

impl Testbed {
    /// Builds the cluster for test `tag` (short, unique among the scenarios of the suite;
    /// the path is added to it) with `pods[0]` pods on node1 and `pods[1]` on node2, whose
    /// connections to Services take `path`, creates both Nodes in the API, and starts the
    /// agent on each node of `agents`.
    pub fn new(tag: &str, path: PodPath, pods: [usize; 2], agents: &[NodeId]) -> Self {
        let tag = match path {
            PodPath::SocketLb => format!("{tag}-s"),
            PodPath::PerPacket => format!("{tag}-p"),
        };
        let sandbox = Sandbox::new(&format!("e2e-{tag}"));
        let prefix = format!("slb{}{tag}", std::process::id());
        let switch = Netns::new(&format!("{prefix}-sw"));
        switch.ip(&["link", "add", "br0", "type", "bridge"]);
        switch.ip(&["link", "set", "br0", "up"]);

        // node1: this thread's namespace.
        here(&veth("eth0", "p-node1", &switch.name));
        switch.ip(&["link", "set", "p-node1", "master", "br0", "up"]);
        here(&["addr", "add", "10.77.0.1/24", "dev", "eth0"]);
        here(&["link", "set", "eth0", "up"]);
        run(Command::new("sysctl").args(["-qw", "net.ipv4.ip_forward=1"]));

        let plug = |port: &str, host: &Netns, address: Ipv4Addr| {
            switch.ip(&veth(port, "eth0", &host.name));
            switch.ip(&["link", "set", port, "master", "br0", "up"]);
            host.ip(&["addr", "add", &format!("{address}/24"), "dev", "eth0"]);
            host.ip(&["link", "set", "eth0", "up"]);
        };
        let node2 = Netns::new(&format!("{prefix}-node2"));
        plug("p-node2", &node2, NodeId::Two.address());
        node2.sysctl("net.ipv4.ip_forward=1");
        let client = Netns::new(&format!("{prefix}-client"));
        plug("p-client", &client, CLIENT);

        // Pod bridges, and each node's route to the other's pods.
        for node in [NodeId::One, NodeId::Two] {
            let on = |args: &[&str]| on_node(&node2, node, args);
            on(&["link", "add", "cbr0", "type", "bridge"]);
            on(&[
                "addr",
                "add",
                &format!("{}/24", node.pod_gateway()),
                "dev",
                "cbr0",
            ]);
            on(&["link", "set", "cbr0", "up"]);
            let other = node.other();
            on(&[
                "route",
                "add",
                &format!("10.244.{}.0/24", other.number()),
                "via",
                &other.address().to_string(),
            ]);
            stop_untranslated(path.node_route(), |args| on(args));
        }
        if path == PodPath::PerPacket {
            // The ICMP limit per destination spends the same tokens as the routing's limit
            // on unreachable errors per source (one a second): with both, most of a pod's
            // SYNs to an untranslated address would go unanswered, and its connect time out.
            let unlimited = "net.ipv4.icmp_ratelimit=0";
            run(Command::new("sysctl").args(["-qw", unlimited]));
            node2.sysctl(unlimited);
        }
        stop_untranslated("blackhole", |args| client.ip(args));

        let mut all_pods = Vec::new();
        for (node, count) in [(NodeId::One, pods[0]), (NodeId::Two, pods[1])] {
            for i in 0..count {
                let index = u8::try_from(i).expect("fewer than 200 pods");
                let name = format!("pod{}{}", node.number(), i + 1);
                let netns = Netns::new(&format!("{prefix}-{name}"));
                let port = format!("v{name}");
                on_node(&node2, node, &veth(&port, "eth0", &netns.name));
                on_node(
                    &node2,
                    node,
                    &["link", "set", &port, "master", "cbr0", "up"],
                );
                let ip = Ipv4Addr::new(10, 244, node.number(), 10 + index);
                netns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
                netns.ip(&["link", "set", "eth0", "up"]);
                netns.ip(&[
                    "route",
                    "add",
                    "default",
                    "via",
                    &node.pod_gateway().to_string(),
                ]);
                if path == PodPath::SocketLb {
                    stop_untranslated("blackhole", |args| netns.ip(args));
                }
                all_pods.push(Pod {
                    name,
                    node,
                    ip,
                    netns,
                });
            }
        }

        let second = SecondNode {
            pin_dir: sandbox
                .pin_dir
                .with_file_name(format!("{}-node2", sandbox.name)),
            cgroup: cgroup2_root().join(format!("{}-node2", sandbox.name)),
        };
        fs::create_dir(&second.cgroup)
            .unwrap_or_else(|e| panic!("create cgroup {}: {e}", second.cgroup.display()));

        // Listens inside node1's namespace (this thread's), on every address of it.
        let api = FakeApiServer::start_on(Ipv4Addr::UNSPECIFIED);
        for node in [NodeId::One, NodeId::Two] {
            api.apply(&cluster::node(node.name(), node.zone(), node.address()));
        }
        let files = ManifestDir::new(&sandbox);
        let kubeconfig = |node: NodeId| {
            let server = match node {
                NodeId::One => Ipv4Addr::LOCALHOST,
                NodeId::Two => NodeId::One.address(),
            };
            let path = files.path.join(format!("kubeconfig-{}", node.name()));
            let url = format!("http://{server}:{}", api.port());
            fs::write(&path, cluster::kubeconfig(&url)).expect("write a kubeconfig");
            path
        };
        let (kubeconfig1, kubeconfig2) = (kubeconfig(NodeId::One), kubeconfig(NodeId::Two));

        // Both agents start at once; each waits for its first full sync.
        let flags = path.agent_flags();
        let agents = std::thread::scope(|scope| {
            let started: Vec<_> = agents
                .iter()
                .map(|&node| {
                    let (sandbox, second, node2) = (&sandbox, &second, &node2);
                    let (kubeconfig1, kubeconfig2) = (&kubeconfig1, &kubeconfig2);
                    // A new thread starts in the namespace of this one: node1's.
                    scope.spawn(move || {
                        let agent = match node {
                            NodeId::One => Agent::start_kube(sandbox, kubeconfig1, "node1", flags),
                            NodeId::Two => node2.enter(|| {
                                let state = (second.pin_dir.as_path(), second.cgroup.as_path());
                                Agent::start_at(state, Source::Kube(kubeconfig2), "node2", flags)
                            }),
                        };
                        (node, agent)
                    })
                })
                .collect();
            started
                .into_iter()
                .map(|thread| thread.join().expect("an agent failed to start"))
                .collect()
        });

        Self {
            path,
            agents,
            api,
            second,
            pods: all_pods,
            client,
            node2,
            _switch: switch,
            _files: files,
            sandbox,
        }
    }

    /// The `index`th pod (from 0) on `node`.
    pub fn pod(&self, node: NodeId, index: usize) -> &Pod {
        self.pods
            .iter()
            .filter(|pod| pod.node == node)
            .nth(index)
            .unwrap_or_else(|| panic!("no pod {index} on {}", node.name()))
    }

    /// The agent of `node`, e.g. for its log.
    pub fn agent(&self, node: NodeId) -> &Agent {
        self.agents
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, agent)| agent)
            .unwrap_or_else(|| panic!("no agent runs on {}", node.name()))
    }

    /// The agents' logs, for failure messages.
    pub fn logs(&self) -> String {
        self.agents
            .iter()
            .map(|(node, agent)| format!("--- agent of {}:\n{}", node.name(), agent.log()))
            .collect()
    }

    fn cgroup(&self, node: NodeId) -> &std::path::Path {
        match node {
            NodeId::One => &self.sandbox.cgroup,
            NodeId::Two => &self.second.cgroup,
        }
    }

    fn pin_dir(&self, node: NodeId) -> &std::path::Path {
        match node {
            NodeId::One => &self.sandbox.pin_dir,
            NodeId::Two => &self.second.pin_dir,
        }
    }

    /// A command that runs `program` at `at`. Call it from the test's thread (node1's
    /// namespace).
    pub fn command(&self, at: At, program: impl AsRef<OsStr>) -> Command {
        let (netns, node) = match at {
            At::Pod(pod) => (Some(&pod.netns), Some(pod.node)),
            At::Host(NodeId::One) => (None, Some(NodeId::One)),
            At::Host(NodeId::Two) => (Some(&self.node2), Some(NodeId::Two)),
            At::Outside => (Some(&self.client), None),
        };
        let Some(netns) = netns else {
            return command_in_cgroup(self.cgroup(NodeId::One), program);
        };
        let mut command = match node {
            Some(node) => command_in_cgroup(self.cgroup(node), "ip"),
            None => Command::new("ip"),
        };
        command
            .args(["netns", "exec", &netns.name])
            .arg(program.as_ref());
        command
    }

    /// The probe client at `at`: `count` attempts of `mode` (tcp, udp, udp-connected).
    pub fn probe(&self, at: At, mode: &str, target: SocketAddrV4, count: u32) -> Vec<Attempt> {
        self.probe_with(at, mode, target, &[count, 0])
    }

    /// The probe with its optional arguments: count, pause in ms, source port.
    pub fn probe_with(
        &self,
        at: At,
        mode: &str,
        target: SocketAddrV4,
        options: &[u32],
    ) -> Vec<Attempt> {
        probe_output(
            self.command(at, probe_bin())
                .args([mode, &target.to_string()])
                .args(options.iter().map(u32::to_string)),
        )
    }

    /// One HTTP request with curl, a real client, at `at` (the test servers answer without
    /// headers: HTTP/0.9): the body, or curl's error.
    pub fn curl(&self, at: At, target: SocketAddrV4) -> Result<String, String> {
        let output = self
            .curl_command(at, target)
            .output()
            .expect("prerequisite missing: curl (apt-get install curl; ./x setup does)");
        curl_result(&output)
    }

    /// `count` requests as [`curl`](Self::curl) makes them, all at once (requests that time
    /// out take their 2 s together): their results.
    pub fn curl_at_once(
        &self,
        at: At,
        target: SocketAddrV4,
        count: usize,
    ) -> Vec<Result<String, String>> {
        let children: Vec<_> = (0..count)
            .map(|_| {
                self.curl_command(at, target)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("prerequisite missing: curl (apt-get install curl; ./x setup does)")
            })
            .collect();
        children
            .into_iter()
            .map(|child| curl_result(&child.wait_with_output().expect("wait for curl")))
            .collect()
    }

    fn curl_command(&self, at: At, target: SocketAddrV4) -> Command {
        let mut command = self.command(at, "curl");
        command
            .args(["--silent", "--show-error", "--http0.9", "--max-time", "2"])
            .arg(format!("http://{target}/"));
        command
    }

    /// A TCP server in `pod` on `port` answering `<pod name> <client address:port>`.
    pub fn tcp_server(&self, pod: &Pod, port: u16) -> NamedServer {
        NamedServer::tcp_in(&pod.netns, &pod.name, SocketAddrV4::new(pod.ip, port))
    }

    /// A UDP server in `pod` on `port` answering `<pod name> <client address:port>`.
    pub fn udp_server(&self, pod: &Pod, port: u16) -> NamedServer {
        NamedServer::udp_in(&pod.netns, &pod.name, SocketAddrV4::new(pod.ip, port))
    }

    /// Creates `service` and its endpoints ([`set_endpoints`](Self::set_endpoints)).
    pub fn serve(&self, service: ServiceBuilder, port: (&str, u16, &str), pods: &[&Pod]) {
        let service = service.build();
        let name = service.metadata.name.clone().unwrap_or_default();
        self.api.apply(&service);
        self.set_endpoints(&name, port, pods);
    }

    /// Creates or replaces the EndpointSlice `<service>-1` as the EndpointSlice controller
    /// keeps it: one port (name, target port, protocol), and `pods` as its endpoints, each
    /// on its node.
    pub fn set_endpoints(&self, service: &str, port: (&str, u16, &str), pods: &[&Pod]) {
        self.set_slice(&format!("{service}-1"), service, port, pods);
    }

    /// Creates or replaces EndpointSlice `name` of `service` (one of several, as a
    /// controller splits them by port, or a user writes them): [`set_endpoints`]'s.
    ///
    /// [`set_endpoints`]: Self::set_endpoints
    pub fn set_slice(&self, name: &str, service: &str, port: (&str, u16, &str), pods: &[&Pod]) {
        let (port_name, target, protocol) = port;
        self.api.apply(
            &cluster::slice(name, service)
                .port(port_name, target, protocol)
                .endpoints(
                    pods.iter()
                        .map(|pod| cluster::endpoint(pod.ip, pod.node.name())),
                )
                .build(),
        );
    }

    /// What `node`'s maps hold (for one address, if given), read from its pins.
    pub fn inspect(&self, node: NodeId, only: Option<Ipv4Addr>) -> Inspection {
        inspect::inspect(self.pin_dir(node), only.map(Into::into))
            .unwrap_or_else(|e| panic!("inspect {}: {e}", node.name()))
    }

    /// Makes `change` (of Services or EndpointSlices, through [`api`](Self::api)) and waits
    /// until every agent has programmed it: kube-proxy's change counters rose (the agent
    /// received the change) and nothing is pending (a sync took it).
    pub fn synced(&self, change: impl FnOnce()) {
        let before: Vec<(NodeId, u64)> = self
            .agents
            .iter()
            .map(|(node, _)| (*node, self.changes(*node).0))
            .collect();
        change();
        for (node, total) in before {
            self.eventually(&format!("{} synced the change", node.name()), || match self
                .changes(node)
            {
                (now, 0) if now > total => Ok(()),
                (now, pending) => Err(format!("{now} changes, {pending} pending")),
            });
        }
    }

    /// Service and endpoint changes received and pending, from `node`'s agent's metrics.
    fn changes(&self, node: NodeId) -> (u64, u64) {
        let mut curl = match node {
            NodeId::One => Command::new("curl"),
            NodeId::Two => self.node2.command("curl"),
        };
        let output = curl
            .args(["-sS", "-m", "2", "http://127.0.0.1:10249/metrics"])
            .output()
            .expect("prerequisite missing: curl");
        let text = String::from_utf8_lossy(&output.stdout);
        let value = |name: &str| -> u64 {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {}'s metrics:\n{text}", node.name()))
        };
        let prefix = "kubeproxy_sync_proxy_rules";
        (
            value(&format!("{prefix}_service_changes_total"))
                + value(&format!("{prefix}_endpoint_changes_total")),
            value(&format!("{prefix}_service_changes_pending"))
                + value(&format!("{prefix}_endpoint_changes_pending")),
        )
    }

    /// Waits until `check` returns Ok (the agents follow API changes asynchronously),
    /// failing with its last error and the agents' logs after [`CONVERGE`].
    pub fn eventually<T>(&self, what: &str, check: impl FnMut() -> Result<T, String>) -> T {
        let pause = Duration::from_millis(50);
        eventually_showing(what, CONVERGE, pause, check, || self.logs())
    }
}

/// curl's body, or its error.
fn curl_result(output: &Output) -> Result<String, String> {
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
    }
}

/// `ip <args>` in node1, the namespace of the test's thread.
fn here(args: &[&str]) {
    run(Command::new("ip").args(args));
}

fn on_node(node2: &Netns, node: NodeId, args: &[&str]) {
    match node {
        NodeId::One => here(args),
        NodeId::Two => node2.ip(args),
    }
}

/// Routes of `kind` (blackhole, unreachable) for the service CIDR and the externalIP range,
/// through `ip`.
fn stop_untranslated(kind: &str, ip: impl Fn(&[&str])) {
    for cidr in [SERVICE_CIDR, EXTERNAL_CIDR] {
        ip(&["route", "add", kind, cidr]);
    }
}
