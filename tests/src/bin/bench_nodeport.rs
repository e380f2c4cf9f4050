//! `cargo xtask bench nodeport`: traffic from outside the node through a NodePort, socklb's
//! TC programs against kube-proxy's iptables and nftables rules, and the direct path as the
//! floor, measured in one run with the peers interleaved.
//!
//! Each peer gets its own world of three network namespaces: an external client, a node
//! that translates (or, for "direct", only routes), and a pod behind the node. Same
//! addresses in every world, so that the only difference is what the node runs:
//!
//! - socklb: the agent (file source) with its TC programs on the node's eth0;
//! - iptables: the nat-table rules kube-proxy's iptables mode writes for the Service
//!   (KUBE-SERVICES with `--services` ClusterIP rules ahead of the KUBE-NODEPORTS jump,
//!   KUBE-EXT/KUBE-SVL/KUBE-SEP chains, DNAT), loaded with `iptables-restore`;
//! - nftables: kube-proxy's nftables mode (table `kube-proxy`: `service-ips` and
//!   `service-nodeports` verdict maps, per-service `numgen` chains, per-endpoint DNAT
//!   chains), loaded with `nft -f`;
//! - direct: the client connects to the pod's address, routed by the node.
//!
//! The Service has `externalTrafficPolicy: Local`, so every peer does the same work per
//! flow (DNAT to a local pod, the client address kept; kube-proxy would masquerade with
//! `Cluster`, socklb would not for a local pod).
//!
//! Measured: connection setup (connect, first byte, close) p50/p99 per peer; iperf3
//! throughput of one TCP stream per peer; socklb's TC programs' run time per packet (BPF
//! stats). Prints a markdown report.
use std::{
    io::Read as _,
    net::{SocketAddrV4, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use aya::programs::{
    links::{FdLink, PinnedLink},
    loaded_programs,
};
use socklb_abi::program_names;
use socklb_tests::{Agent, netns::Netns, node_yaml};

const CLIENT: &str = "10.88.0.2";
const NODE: &str = "10.88.0.1";
const POD: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 244, 1, 10);
const NODE_PORT: u16 = 30080;
const IPERF_NODE_PORT: u16 = 30201;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    Direct,
    Socklb,
    Iptables,
    Nftables,
}

const PEERS: [Peer; 4] = [Peer::Direct, Peer::Socklb, Peer::Iptables, Peer::Nftables];

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Socklb => "socklb",
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
        }
    }

    /// Where the client connects: the pod itself, or the NodePort.
    fn target(self, pod_port: u16, node_port: u16) -> SocketAddrV4 {
        match self {
            Self::Direct => SocketAddrV4::new(POD, pod_port),
            _ => SocketAddrV4::new(NODE.parse().expect("address"), node_port),
        }
    }
}

struct Options {
    connections: u32,
    rounds: u32,
    services: u32,
    seconds: u32,
}

fn options() -> Options {
    let mut options = Options {
        connections: 2000,
        rounds: 5,
        services: 1000,
        seconds: 3,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let [flag, value] = pair else {
            fail(&format!("{pair:?}: expected --flag VALUE"));
        };
        let value: u32 = value
            .parse()
            .unwrap_or_else(|_| fail(&format!("{flag} {value}: not a number")));
        match flag.as_str() {
            "--connections" => options.connections = value,
            "--rounds" => options.rounds = value,
            "--services" => options.services = value,
            "--seconds" => options.seconds = value,
            other => fail(&format!("unknown flag {other}")),
        }
    }
    options
}

/// Panics, so that the namespaces, servers and pins made so far are removed on the way out.
fn fail(message: &str) -> ! {
    panic!("socklb-bench-nodeport: {message}");
}

/// One peer's namespaces and what runs in them; dropped in field order.
struct World {
    peer: Peer,
    _agent: Option<Agent>,
    _iperf: KillOnDrop,
    _server: std::thread::JoinHandle<()>,
    client: Netns,
    _pod: Netns,
    _node: Netns,
}

fn world(peer: Peer, options: &Options, pins: &Pins) -> World {
    let prefix = format!("slbnp{}{}", std::process::id(), &peer.name()[..3]);
    let client = Netns::new(&format!("{prefix}-client"));
    let node = Netns::new(&format!("{prefix}-node"));
    let pod = Netns::new(&format!("{prefix}-pod"));
    client.ip(&[
        "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &node.name,
    ]);
    client.ip(&["addr", "add", &format!("{CLIENT}/24"), "dev", "eth0"]);
    client.ip(&["link", "set", "eth0", "up"]);
    client.ip(&["route", "add", "10.244.1.0/24", "via", NODE]);
    node.ip(&["addr", "add", &format!("{NODE}/24"), "dev", "eth0"]);
    node.ip(&["link", "set", "eth0", "up"]);
    node.sysctl("net.ipv4.ip_forward=1");
    node.ip(&[
        "link", "add", "pod1", "type", "veth", "peer", "name", "eth0", "netns", &pod.name,
    ]);
    node.ip(&["addr", "add", "10.244.1.1/24", "dev", "pod1"]);
    node.ip(&["link", "set", "pod1", "up"]);
    pod.ip(&["addr", "add", &format!("{POD}/24"), "dev", "eth0"]);
    pod.ip(&["link", "set", "eth0", "up"]);
    pod.ip(&["route", "add", "default", "via", "10.244.1.1"]);

    let server = byte_server(&pod, SocketAddrV4::new(POD, 8080));
    let iperf = pod
        .command("iperf3")
        .args(["--server", "--port", "5201"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| fail(&format!("start iperf3 (apt install iperf3): {e}")));
    let agent = match peer {
        Peer::Direct => None,
        Peer::Socklb => Some(node.enter(|| {
            Agent::start_at(
                &pins.pin_dir,
                &pins.cgroup,
                &pins.manifests,
                "node1",
                &["--healthz-bind-address", "127.0.0.1:0"],
            )
        })),
        Peer::Iptables => {
            load(&node, "iptables-restore", &iptables_rules(options.services));
            None
        }
        Peer::Nftables => {
            load(&node, "nft", &nftables_rules(options.services));
            None
        }
    };
    World {
        peer,
        _agent: agent,
        _iperf: KillOnDrop(iperf),
        _server: server,
        client,
        _pod: pod,
        _node: node,
    }
}

/// A server that answers every connection with one byte at once: blocking accept, so
/// that nothing but the network path is measured. Lives until the process exits.
fn byte_server(pod: &Netns, address: SocketAddrV4) -> std::thread::JoinHandle<()> {
    // The client connects one at a time: the default backlog is plenty.
    let listener = pod.enter(|| {
        std::net::TcpListener::bind(address)
            .unwrap_or_else(|e| fail(&format!("bind {address}: {e}")))
    });
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            use std::io::Write as _;
            let _ = stream.write_all(b"x");
        }
    })
}

/// Feeds `rules` to `iptables-restore` or `nft -f -` inside the node namespace.
fn load(node: &Netns, program: &str, rules: &str) {
    use std::io::Write as _;
    let mut command = node.command(program);
    if program == "nft" {
        command.args(["-f", "-"]);
    }
    let mut child = command.stdin(Stdio::piped()).spawn().unwrap_or_else(|e| {
        fail(&format!(
            "run {program} (apt install iptables nftables): {e}"
        ))
    });
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(rules.as_bytes())
        .expect("write the rules");
    let status = child.wait().expect("wait for the rule loader");
    if !status.success() {
        fail(&format!("{program} rejected the rules"));
    }
}

/// The ClusterIP of filler service `i` (10.96.0.0/16 from .1 on, skipping .0 octets).
fn cluster_ip(i: u32) -> String {
    let n = i + 256;
    format!("10.96.{}.{}", (n / 250) % 250, n % 250 + 1)
}

/// kube-proxy's iptables-mode nat rules for `fillers` ClusterIP services and the measured
/// NodePort Service (externalTrafficPolicy Local, one local endpoint), as
/// `pkg/proxy/iptables/proxier.go` writes them.
fn iptables_rules(fillers: u32) -> String {
    let mut rules = String::from(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         :POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n\
         :KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-EXT-WEB - [0:0]\n\
         :KUBE-SVC-WEB - [0:0]\n:KUBE-SVL-WEB - [0:0]\n:KUBE-SEP-WEB1 - [0:0]\n",
    );
    for i in 0..fillers {
        rules.push_str(&format!(":KUBE-SVC-F{i} - [0:0]\n:KUBE-SEP-F{i} - [0:0]\n"));
    }
    rules.push_str(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n",
    );
    for i in 0..fillers {
        let ip = cluster_ip(i);
        rules.push_str(&format!(
            "-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment \"default/f{i}:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-F{i}\n\
             -A KUBE-SVC-F{i} -m comment --comment \"default/f{i}:http -> 10.245.0.1:8080\" -j KUBE-SEP-F{i}\n\
             -A KUBE-SEP-F{i} -s 10.245.0.1/32 -m comment --comment \"default/f{i}:http\" -j KUBE-MARK-MASQ\n\
             -A KUBE-SEP-F{i} -p tcp -m comment --comment \"default/f{i}:http\" -m tcp -j DNAT --to-destination 10.245.0.1:8080\n"
        ));
    }
    rules.push_str(&format!(
        "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/web:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-WEB\n\
         -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
         -A KUBE-NODEPORTS -p tcp -m comment --comment \"default/web:http\" -m tcp --dport {NODE_PORT} -j KUBE-EXT-WEB\n\
         -A KUBE-NODEPORTS -p tcp -m comment --comment \"default/web:iperf\" -m tcp --dport {IPERF_NODE_PORT} -j KUBE-EXT-WEB\n\
         -A KUBE-EXT-WEB -s 10.244.0.0/16 -m comment --comment \"pod traffic for default/web:http external destinations\" -j KUBE-SVC-WEB\n\
         -A KUBE-EXT-WEB -j KUBE-SVL-WEB\n\
         -A KUBE-SVC-WEB -m comment --comment \"default/web:http -> {POD}:8080\" -j KUBE-SEP-WEB1\n\
         -A KUBE-SVL-WEB -m comment --comment \"default/web:http -> {POD}:8080\" -j KUBE-SEP-WEB1\n\
         -A KUBE-SEP-WEB1 -s {POD}/32 -m comment --comment \"default/web:http\" -j KUBE-MARK-MASQ\n\
         -A KUBE-SEP-WEB1 -p tcp -m comment --comment \"default/web:http\" -m tcp --dport {NODE_PORT} -j DNAT --to-destination {POD}:8080\n\
         -A KUBE-SEP-WEB1 -p tcp -m comment --comment \"default/web:iperf\" -m tcp --dport {IPERF_NODE_PORT} -j DNAT --to-destination {POD}:5201\n\
         COMMIT\n"
    ));
    rules
}

/// kube-proxy's nftables-mode table for the same services (`pkg/proxy/nftables/proxier.go`).
fn nftables_rules(fillers: u32) -> String {
    let mut service_ips = vec!["10.96.0.10 . tcp . 80 : goto service-web".to_owned()];
    let mut chains = String::new();
    for i in 0..fillers {
        service_ips.push(format!("{} . tcp . 80 : goto service-f{i}", cluster_ip(i)));
        chains.push_str(&format!(
            "  chain service-f{i} {{\n    numgen random mod 1 vmap {{ 0 : goto endpoint-f{i} }}\n  }}\n\
             \x20 chain endpoint-f{i} {{\n    ip saddr 10.245.0.1 jump mark-for-masquerade\n    \
             meta l4proto tcp dnat to 10.245.0.1:8080\n  }}\n"
        ));
    }
    format!(
        "table ip kube-proxy {{
  map service-ips {{
    type ipv4_addr . inet_proto . inet_service : verdict
    elements = {{ {} }}
  }}
  map service-nodeports {{
    type inet_proto . inet_service : verdict
    elements = {{ tcp . {NODE_PORT} : goto external-web, tcp . {IPERF_NODE_PORT} : goto external-web }}
  }}
  chain mark-for-masquerade {{
    meta mark set meta mark or 0x4000
  }}
  chain masquerading {{
    meta mark & 0x4000 == 0 return
    meta mark set meta mark xor 0x4000
    masquerade fully-random
  }}
  chain services {{
    ip daddr . meta l4proto . th dport vmap @service-ips
    fib daddr type local meta l4proto . th dport vmap @service-nodeports
  }}
  chain nat-prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    jump services
  }}
  chain nat-output {{
    type nat hook output priority -100; policy accept;
    jump services
  }}
  chain nat-postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    jump masquerading
  }}
  chain service-web {{
    numgen random mod 1 vmap {{ 0 : goto endpoint-web1 }}
  }}
  chain external-web {{
    ip saddr 10.244.0.0/16 goto service-web
    goto service-web-local
  }}
  chain service-web-local {{
    numgen random mod 1 vmap {{ 0 : goto endpoint-web1 }}
  }}
  chain endpoint-web1 {{
    ip saddr {POD} jump mark-for-masquerade
    tcp dport {NODE_PORT} dnat to {POD}:8080
    tcp dport {IPERF_NODE_PORT} dnat to {POD}:5201
  }}
{chains}}}
",
        service_ips.join(", ")
    )
}

/// socklb's pins, cgroup and manifests; removed when dropped.
struct Pins {
    pin_dir: PathBuf,
    cgroup: PathBuf,
    manifests: PathBuf,
}

impl Pins {
    fn new(fillers: u32) -> Self {
        let name = format!("socklb-bench-nodeport-{}", std::process::id());
        let pins = Self {
            pin_dir: PathBuf::from("/sys/fs/bpf").join(&name),
            cgroup: socklb_tests::cgroup2_root().join(&name),
            manifests: std::env::temp_dir().join(&name),
        };
        std::fs::create_dir_all(&pins.cgroup).expect("create the benchmark's cgroup");
        std::fs::create_dir_all(&pins.manifests).expect("create the manifests directory");
        let mut yaml = node_yaml("node1", "z1", NODE);
        yaml.push_str(&format!(
            "---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: default}}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports:
  - {{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}
  - {{name: iperf, port: 5201, targetPort: 5201, nodePort: {IPERF_NODE_PORT}, protocol: TCP}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: default, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}, {{name: iperf, port: 5201, protocol: TCP}}]
endpoints:
- addresses: [{POD}]
  nodeName: node1
"
        ));
        for i in 0..fillers {
            yaml.push_str(&format!(
                "---
apiVersion: v1
kind: Service
metadata: {{name: f{i}, namespace: default}}
spec:
  clusterIP: {ip}
  clusterIPs: [{ip}]
  ports: [{{name: http, port: 80, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: f{i}-1, namespace: default, labels: {{kubernetes.io/service-name: f{i}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
- addresses: [10.245.0.1]
  nodeName: node1
",
                ip = cluster_ip(i)
            ));
        }
        std::fs::write(pins.manifests.join("cluster.yaml"), yaml).expect("write the manifests");
        pins
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        remove_pins(&self.pin_dir, &self.cgroup, &self.manifests);
    }
}

fn remove_pins(pin_dir: &Path, cgroup: &Path, manifests: &Path) {
    if let Err(e) = socklb_agent::dataplane::cleanup(pin_dir) {
        eprintln!("cleanup of {}: {e}", pin_dir.display());
    }
    socklb_tests::remove_cgroup(cgroup);
    let _ = std::fs::remove_dir_all(manifests);
}

/// The named namespaces of this run (a signal skips their Drops), with what runs in them.
fn remove_namespaces() {
    let prefix = format!("slbnp{}", std::process::id());
    let Ok(output) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if name.starts_with(&prefix) {
            if let Ok(pids) = Command::new("ip").args(["netns", "pids", name]).output() {
                for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// connect, first byte, close, `count` times; nanoseconds each.
fn connection_times(client: &Netns, target: SocketAddrV4, count: u32) -> Vec<u64> {
    client.enter(|| {
        (0..count)
            .map(|_| {
                let started = Instant::now();
                let mut stream = TcpStream::connect_timeout(&target.into(), Duration::from_secs(5))
                    .unwrap_or_else(|e| fail(&format!("connect {target}: {e}")));
                let mut byte = [0u8; 1];
                stream
                    .read_exact(&mut byte)
                    .unwrap_or_else(|e| fail(&format!("read from {target}: {e}")));
                drop(stream);
                u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX)
            })
            .collect()
    })
}

/// One iperf3 run: Gbit/s received, and the sender's host CPU %.
fn iperf(client: &Netns, target: SocketAddrV4, seconds: u32) -> (f64, f64) {
    let output = client
        .command("iperf3")
        .args([
            "--client",
            &target.ip().to_string(),
            "--port",
            &target.port().to_string(),
            "--time",
            &seconds.to_string(),
            "--json",
        ])
        .output()
        .unwrap_or_else(|e| fail(&format!("run iperf3: {e}")));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| fail(&format!("iperf3 --json to {target}: {e}")));
    let bits = json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| fail(&format!("iperf3 to {target} failed: {json}")));
    let cpu = json["end"]["cpu_utilization_percent"]["host_total"]
        .as_f64()
        .unwrap_or(0.0);
    (bits / 1e9, cpu)
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Run time and run count, summed, of the TC programs socklb pinned links for on eth0.
fn tc_run_time(pin_dir: &Path) -> (u64, u64) {
    let ids: Vec<u32> = program_names::TC
        .iter()
        .map(|program| {
            let pin = socklb_agent::dataplane::link_pin(pin_dir, &format!("{program}@eth0"));
            let link = PinnedLink::from_pin(&pin)
                .unwrap_or_else(|e| fail(&format!("open the link pin {}: {e}", pin.display())));
            FdLink::from(link)
                .info()
                .unwrap_or_else(|e| fail(&format!("read the link {}: {e}", pin.display())))
                .program_id()
        })
        .collect();
    let mut total = (0, 0);
    for info in loaded_programs().flatten() {
        if ids.contains(&info.id()) {
            total.0 += u64::try_from(info.run_time().as_nanos()).unwrap_or(0);
            total.1 += info.run_count();
        }
    }
    total
}

fn main() {
    let options = options();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        fail("creates network namespaces, rules and BPF programs: run it as root");
    }
    for tool in ["iperf3", "iptables-restore", "nft", "bpftool"] {
        if which::which(tool).is_err() {
            fail(&format!(
                "{tool} is missing: `cargo xtask setup` installs it (apt: iperf3 iptables nftables bpftool)"
            ));
        }
    }
    let signals = socklb_tests::block_termination_signals();
    let machine = socklb_tests::machine_context();
    let pins = Pins::new(options.services);
    socklb_tests::cleanup_on_signal(
        signals,
        socklb_tests::Leftovers {
            pin_dir: pins.pin_dir.clone(),
            cgroup: pins.cgroup.clone(),
            dirs: vec![pins.manifests.clone()],
            also: Some(Box::new(remove_namespaces)),
        },
    );
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .unwrap_or_else(|e| fail(&format!("enable BPF run-time stats: {e}")));

    eprintln!(
        "building the four worlds ({} filler services)",
        options.services
    );
    let worlds: Vec<World> = PEERS
        .iter()
        .map(|peer| world(*peer, &options, &pins))
        .collect();
    // Warm up every path (ARP, conntrack, caches) and check that each answers.
    for world in &worlds {
        connection_times(&world.client, world.peer.target(8080, NODE_PORT), 50);
    }

    let mut times: Vec<Vec<u64>> = vec![Vec::new(); worlds.len()];
    let tc_before = tc_run_time(&pins.pin_dir);
    let mut tc_packets_during_latency = (0, 0);
    for round in 0..options.rounds {
        // Rotate the order every round so that no peer always runs first.
        for offset in 0..worlds.len() {
            let index = (offset + round as usize) % worlds.len();
            let world = &worlds[index];
            let before = (world.peer == Peer::Socklb).then(|| tc_run_time(&pins.pin_dir));
            let target = world.peer.target(8080, NODE_PORT);
            times[index].extend(connection_times(&world.client, target, options.connections));
            if let Some(before) = before {
                let after = tc_run_time(&pins.pin_dir);
                tc_packets_during_latency.0 += after.0 - before.0;
                tc_packets_during_latency.1 += after.1 - before.1;
            }
        }
        eprintln!("latency round {} of {} done", round + 1, options.rounds);
    }

    let mut throughput: Vec<(f64, f64, u32)> = vec![(0.0, 0.0, 0); worlds.len()];
    for round in 0..2 {
        for offset in 0..worlds.len() {
            let index = (offset + round) % worlds.len();
            let world = &worlds[index];
            let (gbits, cpu) = iperf(
                &world.client,
                world.peer.target(5201, IPERF_NODE_PORT),
                options.seconds,
            );
            throughput[index].0 += gbits;
            throughput[index].1 += cpu;
            throughput[index].2 += 1;
        }
    }
    let tc_after = tc_run_time(&pins.pin_dir);

    let p50: Vec<f64> = times
        .iter_mut()
        .map(|t| {
            t.sort_unstable();
            percentile(t, 0.5)
        })
        .collect();
    let p99: Vec<f64> = times.iter().map(|t| percentile(t, 0.99)).collect();
    let direct = 0;
    println!("## NodePort from outside: socklb TC vs kube-proxy iptables and nftables\n");
    println!("{machine}\n");
    println!(
        "One TCP Service, `externalTrafficPolicy: Local`, one local pod; {} ClusterIP services \
         ahead of it in kube-proxy's rules; {} rounds x {} connections per peer, peers \
         interleaved; iperf3 2 x {} s per peer.\n",
        options.services, options.rounds, options.connections, options.seconds
    );
    println!(
        "| path | connect+first byte+close p50 (µs) | p99 (µs) | p50 / direct | iperf3 Gbit/s | sender CPU % |"
    );
    println!("|---|---|---|---|---|---|");
    for (index, world) in worlds.iter().enumerate() {
        let (gbits, cpu, runs) = throughput[index];
        let runs = f64::from(runs.max(1));
        println!(
            "| {} | {:.1} | {:.1} | {:.3} | {:.2} | {:.0} |",
            world.peer.name(),
            p50[index],
            p99[index],
            p50[index] / p50[direct],
            gbits / runs,
            cpu / runs
        );
    }
    let ratio = |peer: Peer| {
        let index = PEERS.iter().position(|p| *p == peer).expect("peer");
        p50[1] / p50[index]
    };
    println!(
        "\nsocklb / iptables p50: {:.3}; socklb / nftables p50: {:.3}",
        ratio(Peer::Iptables),
        ratio(Peer::Nftables)
    );
    let per_packet = |(ns, runs): (u64, u64)| {
        if runs == 0 {
            0.0
        } else {
            ns as f64 / runs as f64
        }
    };
    println!(
        "socklb TC programs: {:.0} ns per packet during the connection rounds ({} packets), \
         {:.0} ns per packet over the whole run",
        per_packet(tc_packets_during_latency),
        tc_packets_during_latency.1,
        per_packet((tc_after.0 - tc_before.0, tc_after.1 - tc_before.1)),
    );
    drop(worlds);
}
