//! Sockets still connected to a backend that left its Service are closed by the agent, in
//! every network namespace: connected UDP always, TCP with
//! `--destroy-tcp-on-backend-removal`; sockets socklb did not translate, and those of other
//! frontends, are left alone.
//!
//! The world: the sandbox's namespace is the node (the agent, a host client, the backends
//! on addresses of its loopback), and three pod namespaces reach it over veth pairs. The
//! clients are `socklb-hold` processes in the sandbox's cgroup, each holding one socket.
//! The agent runs with the chart's capabilities plus PERFMON (to load the socket iterators)
//! and SYS_ADMIN (to enter the pods' namespaces).
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::maps::{Map, MapData, MapError, SkStorage};
use socklb_abi::{SocketRecord, map_names};
use socklb_agent::{
    dataplane::{Desired, Protocol},
    metrics::Metrics,
    sweep::{Requested, Sweeper},
};
use socklb_tests::{
    Agent, Dnsmasq, ManifestDir, NamedServer, Sandbox, assert_logged, command_in_cgroup,
    endpoint_slice,
    family::Family,
    hold::Holder,
    hold_bin,
    netns::Netns,
    node_yaml,
    privileges::{ContainerPrivileges, chart_agent, chart_agent_minimal},
    run, spec,
};

const PODS: u8 = 3;
const BACKEND_1: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
const BACKEND_2: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 2);
const DNS_VIP: &str = "10.96.0.53";
const OTHER_VIP: &str = "10.96.0.54";
const WEB_VIP: &str = "10.96.0.80";
/// Longest wait for a client to see what the test expects.
const DEADLINE: Duration = Duration::from_secs(15);

/// The node and its pods.
struct World {
    manifests: ManifestDir,
    pods: Vec<Netns>,
    // Dropped last: the namespace the others live in.
    sandbox: Sandbox,
}

impl World {
    fn new(test: &str) -> Self {
        let sandbox = Sandbox::new(test);
        for backend in [BACKEND_1, BACKEND_2] {
            run(Command::new("ip").args(["addr", "add", &format!("{backend}/32"), "dev", "lo"]));
        }
        let pods = (0..PODS)
            .map(|i| {
                let pod = Netns::new(&format!("sld-{}-{test}-{i}", std::process::id()));
                let host_side = format!("pod{i}");
                run(Command::new("ip").args([
                    "link", "add", &host_side, "type", "veth", "peer", "name", "eth0", "netns",
                    &pod.name,
                ]));
                run(Command::new("ip").args([
                    "addr",
                    "add",
                    &format!("10.200.{i}.1/24"),
                    "dev",
                    &host_side,
                ]));
                run(Command::new("ip").args(["link", "set", &host_side, "up"]));
                pod.ip(&["addr", "add", &format!("10.200.{i}.2/24"), "dev", "eth0"]);
                pod.ip(&["link", "set", "eth0", "up"]);
                pod.ip(&["route", "add", "default", "via", &format!("10.200.{i}.1")]);
                pod
            })
            .collect();
        let manifests = ManifestDir::new(&sandbox);
        manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.30.1"));
        Self {
            manifests,
            pods,
            sandbox,
        }
    }

    /// The agent as the chart's defaults run it (closeSocketsInPods: SYS_ADMIN, which
    /// lets the iterators load too), in `mode`.
    fn agent(&self, mode: &str, extra: &[&str]) -> Agent {
        let privileges = match mode {
            // The mode is asked for: auto would pick the iterators.
            "bpf-iterator" | "netlink" => chart_agent(),
            other => panic!("no mode {other}"),
        };
        let mut args = vec!["--socket-destroy-mode", mode];
        args.extend(extra);
        self.agent_as(privileges, mode, &args)
    }

    fn agent_as(&self, privileges: &ContainerPrivileges, mode: &str, extra: &[&str]) -> Agent {
        let agent = Agent::start_as(
            privileges,
            &self.sandbox,
            &self.manifests.path,
            "node-a",
            extra,
        );
        assert!(
            agent.log().contains(&format!("mode={mode} tcp=")),
            "the agent did not pick the {mode} mode:\n{}",
            agent.log()
        );
        agent
    }

    /// Service `name` on `vip:port` whose endpoints (on node-a) are `backends` at
    /// `target_port`.
    fn service(
        &self,
        name: &str,
        vip: &str,
        port: u16,
        protocol: &str,
        target_port: u16,
        backends: &[Ipv4Addr],
    ) {
        self.manifests.write(
            &format!("{name}.yaml"),
            &format!(
                "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {vip}
  clusterIPs: [{vip}]
  ports: [{{name: p, port: {port}, protocol: {protocol}}}]
"
            ),
        );
        self.endpoints(name, protocol, target_port, backends);
    }

    /// Replaces the endpoints of Service `name`.
    fn endpoints(&self, name: &str, protocol: &str, port: u16, backends: &[Ipv4Addr]) {
        self.manifests.write(
            &format!("{name}-slice.yaml"),
            &slice(name, protocol, port, backends),
        );
    }
    /// A client on the node (the host's namespace), holding a socket to `target`.
    fn host_client(&self, mode: &str, target: &str) -> (Holder, socklb_tests::hold::Held) {
        let mut command = command_in_cgroup(&self.sandbox.cgroup, hold_bin());
        command.args([mode, target]);
        Holder::start(&format!("host {mode} client of {target}"), command)
    }

    /// A client in pod `i`, holding a socket to `target`.
    fn pod_client(&self, i: usize, mode: &str, target: &str) -> (Holder, socklb_tests::hold::Held) {
        let mut command = command_in_cgroup(&self.sandbox.cgroup, "ip");
        command
            .args(["netns", "exec", &self.pods[i].name])
            .arg(hold_bin())
            .args([mode, target]);
        Holder::start(&format!("pod {i} {mode} client of {target}"), command)
    }

    /// Every client: the host's, then one per pod.
    fn clients(&self, mode: &str, target: &str) -> Vec<Holder> {
        let mut clients = Vec::new();
        for i in 0..=self.pods.len() {
            let (client, first) = if i == 0 {
                self.host_client(mode, target)
            } else {
                self.pod_client(i - 1, mode, target)
            };
            assert_eq!(
                first.reply.as_deref(),
                Some("b1"),
                "{}: the first exchange: {first:?}",
                client.what
            );
            clients.push(client);
        }
        clients
    }
}

/// Each scenario as one test per sweep mode, `bpf_iterator::<scenario>` and
/// `netlink::<scenario>`, each calling `<scenario>(tag, mode)` with the tag that names its
/// namespaces (`-nl` added for netlink, so that both run side by side).
macro_rules! for_each_mode {
    ($($scenario:ident($tag:literal)),* $(,)?) => {
        mod bpf_iterator {
            $(#[test]
            fn $scenario() {
                super::$scenario($tag, "bpf-iterator");
            })*
        }
        mod netlink {
            $(#[test]
            fn $scenario() {
                super::$scenario(concat!($tag, "-nl"), "netlink");
            })*
        }
    };
}

for_each_mode!(
    connected_udp_clients_in_every_namespace_fail_and_reconnect_to_the_new_backend("dst-udp"),
    an_ipv6_socket_connected_to_the_ipv4_mapped_vip_is_closed_too("dst-mapped"),
    sockets_connected_straight_to_the_backend_or_through_another_frontend_survive("dst-coll"),
    with_the_flag_an_idle_tcp_connection_to_a_removed_backend_is_reset("dst-tcp-on"),
);

/// The EndpointSlice of Service `name` with `backends` (on node-a) at `port`.
fn slice(name: &str, protocol: &str, port: u16, backends: &[Ipv4Addr]) -> String {
    let endpoints: Vec<(String, &str)> = backends
        .iter()
        .map(|backend| (backend.to_string(), "node-a"))
        .collect();
    let port = ("p", port, protocol);
    endpoint_slice(&format!("{name}-1"), name, "IPv4", port, &endpoints)
}

fn udp_servers(port: u16) -> [NamedServer; 2] {
    [
        NamedServer::udp("b1", SocketAddrV4::new(BACKEND_1, port)),
        NamedServer::udp("b2", SocketAddrV4::new(BACKEND_2, port)),
    ]
}

fn connected_udp_clients_in_every_namespace_fail_and_reconnect_to_the_new_backend(
    test: &str,
    mode: &str,
) {
    let world = World::new(test);
    let _servers = udp_servers(5353);
    world.service("dns", DNS_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    let agent = world.agent(mode, &[]);
    let target = format!("{DNS_VIP}:53");
    let mut clients = world.clients("udp", &target);
    // Each client idles in recv() on its socket, as a resolver waiting for an answer.
    for client in &mut clients {
        client.send("wait");
    }

    // b1 leaves (it keeps running: only the Service lost it).
    world.endpoints("dns", "UDP", 5353, &[BACKEND_2]);
    for client in &mut clients {
        let line = client.line();
        assert_eq!(
            line.error.as_deref(),
            Some("ECONNABORTED"),
            "{}: its socket to the removed backend was not closed: {line:?}\n{}",
            client.what,
            agent.log()
        );
    }
    // New sockets reach the new backend, from the host and from a pod.
    let (_, host) = world.host_client("udp", &target);
    let (_, pod) = world.pod_client(PODS as usize - 1, "udp", &target);
    assert_eq!(host.reply.as_deref(), Some("b2"), "{host:?}");
    assert_eq!(pod.reply.as_deref(), Some("b2"), "{pod:?}");
    assert_logged(
        &agent.log(),
        &["closed the sockets of removed backends", "udp=4"],
        "one sweep closing the four sockets should be logged",
    );
}

#[test]
fn a_socket_older_than_the_socket_rings_memory_is_still_closed() {
    let world = World::new("dst-forgotten");
    let _servers = udp_servers(5353);
    world.service("dns", DNS_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    world.service("other", OTHER_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    // A ring of 64 slots, which the 200 newer sockets below overwrite entirely.
    let agent = world.agent("bpf-iterator", &["--max-reverse-entries", "64"]);
    let target = format!("{DNS_VIP}:53");
    let (mut old, first) = world.host_client("udp", &target);
    assert_eq!(first.reply.as_deref(), Some("b1"), "{first:?}");
    let mut newer = command_in_cgroup(&world.sandbox.cgroup, hold_bin());
    newer.args(["many-udp", &format!("{OTHER_VIP}:53"), "200"]);
    let (_newer, held) = Holder::start("200 newer sockets", newer);
    assert_eq!(held.reply.as_deref(), Some("200"), "{held:?}");
    old.send("wait");

    world.endpoints("dns", "UDP", 5353, &[BACKEND_2]);
    let line = old.line();
    assert_eq!(
        line.error.as_deref(),
        Some("ECONNABORTED"),
        "the socket's own record outlives its ring slot: {line:?}\n{}",
        agent.log()
    );
}

/// Socket records are charged to the agent's memory and any pod creates them, so they are
/// bounded (`--max-socket-records`): sockets past the bound are still translated, hold no
/// record (looked up in the kernel's own storage, socket by socket), and are still closed
/// through the socket ring; records are counted back as their sockets close.
#[test]
fn socket_records_stop_at_their_bound_and_sockets_past_it_are_still_served() {
    const BOUND: usize = 100;
    const MANY: usize = 300;
    let world = World::new("dst-bound");
    let _servers = udp_servers(5353);
    world.service("dns", DNS_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    world.service("other", OTHER_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    let agent = world.agent(
        "bpf-iterator",
        &["--max-socket-records", &BOUND.to_string()],
    );
    let (_first, held) = world.host_client("udp", &format!("{OTHER_VIP}:53"));
    assert_eq!(held.reply.as_deref(), Some("b1"), "{held:?}");

    let mut many = command_in_cgroup(&world.sandbox.cgroup, hold_bin());
    many.args(["many-udp", &format!("{OTHER_VIP}:53"), &MANY.to_string()]);
    let (many, held) = Holder::start("many sockets", many);
    assert_eq!(
        held.reply.as_deref(),
        Some(MANY.to_string().as_str()),
        "{held:?}"
    );
    let recorded = recorded_sockets(&world.sandbox, many.pid());
    assert_eq!(
        recorded,
        (BOUND - 1, MANY),
        "(sockets with a record, sockets) of the client past the bound"
    );
    let ss = Command::new("ss")
        .args(["-Hun", "dst", &format!("{BACKEND_1}:5353")])
        .output()
        .expect("run ss");
    let connected = String::from_utf8_lossy(&ss.stdout).lines().count();
    assert_eq!(
        connected,
        MANY + 1,
        "every socket is translated to the backend"
    );
    let inspection = world.sandbox.inspect();
    assert_eq!(inspection["socket_records"], BOUND, "{inspection}");
    assert_eq!(
        inspection["counters"]["socket_records_full"],
        MANY + 1 - BOUND,
        "{inspection}"
    );

    // Past the bound, a socket is closed through its ring slot when its backend leaves.
    let (mut unrecorded, held) = world.host_client("udp", &format!("{DNS_VIP}:53"));
    assert_eq!(held.reply.as_deref(), Some("b1"), "{held:?}");
    unrecorded.send("wait");
    world.endpoints("dns", "UDP", 5353, &[BACKEND_2]);
    let line = unrecorded.line();
    assert_eq!(
        line.error.as_deref(),
        Some("ECONNABORTED"),
        "a socket past the bound is closed through the ring: {line:?}\n{}",
        agent.log()
    );

    // Closed sockets give their records back.
    drop(many);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let live = world.sandbox.inspect()["socket_records"].as_u64();
        if live == Some(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the records of closed sockets are still counted: {live:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut again = command_in_cgroup(&world.sandbox.cgroup, hold_bin());
    again.args(["many-udp", &format!("{OTHER_VIP}:53"), "50"]);
    let (again, held) = Holder::start("sockets after the release", again);
    assert_eq!(held.reply.as_deref(), Some("50"), "{held:?}");
    assert_eq!(
        recorded_sockets(&world.sandbox, again.pid()),
        (50, 50),
        "room again below the bound"
    );
}

/// (sockets with a record, sockets) among the open sockets of process `pid`: each socket is
/// taken over with pidfd_getfd and looked up in the pinned socket-record storage.
fn recorded_sockets(sandbox: &Sandbox, pid: u32) -> (usize, usize) {
    let pin = sandbox.pin_dir.join(map_names::SOCKET_RECORDS);
    let data = MapData::from_pin(&pin).unwrap_or_else(|e| panic!("open {}: {e}", pin.display()));
    let records: SkStorage<MapData, SocketRecord> =
        SkStorage::try_from(Map::SkStorage(data)).expect("a socket storage map");
    // SAFETY: pidfd_open has no memory arguments.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    assert!(
        pidfd >= 0,
        "pidfd_open {pid}: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: a new descriptor nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    let (mut recorded, mut sockets) = (0, 0);
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the client's fds") {
        let entry = entry.expect("an fd entry");
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        let Some(number) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if !is_socket {
            continue;
        }
        // SAFETY: pidfd_getfd copies a descriptor of the traced process; no memory arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), number, 0) };
        assert!(
            fd >= 0,
            "pidfd_getfd {number}: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: a new descriptor nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        sockets += 1;
        match records.get(&socket, 0) {
            Ok(_) => recorded += 1,
            Err(MapError::KeyNotFound) => {}
            Err(e) => panic!("look up the record of socket {number}: {e}"),
        }
    }
    (recorded, sockets)
}

/// A dual-stack client (Java's default, for one) reaches an IPv4 Service through
/// `::ffff:VIP` on an AF_INET6 socket; connect6 translates it as connect4 would.
fn an_ipv6_socket_connected_to_the_ipv4_mapped_vip_is_closed_too(test: &str, mode: &str) {
    let world = World::new(test);
    let _servers = udp_servers(5353);
    world.service("dns", DNS_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    let agent = world.agent(mode, &[]);
    let (mut mapped, first) = world.host_client("udp", &format!("[::ffff:{DNS_VIP}]:53"));
    assert_eq!(first.reply.as_deref(), Some("b1"), "{first:?}");
    assert_eq!(
        first.peer.as_deref(),
        Some(format!("[::ffff:{DNS_VIP}]:53").as_str()),
        "getpeername shows the mapped VIP: {first:?}"
    );
    mapped.send("wait");
    world.endpoints("dns", "UDP", 5353, &[BACKEND_2]);
    let line = mapped.line();
    assert_eq!(
        line.error.as_deref(),
        Some("ECONNABORTED"),
        "{line:?}\n{}",
        agent.log()
    );
    let (_, fresh) = world.host_client("udp", &format!("[::ffff:{DNS_VIP}]:53"));
    assert_eq!(fresh.reply.as_deref(), Some("b2"), "{fresh:?}");
}

fn sockets_connected_straight_to_the_backend_or_through_another_frontend_survive(
    test: &str,
    mode: &str,
) {
    let world = World::new(test);
    let _servers = udp_servers(5353);
    world.service("dns", DNS_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    // Another frontend with the same backend, which keeps it.
    world.service("other", OTHER_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    let agent = world.agent(mode, &[]);
    let (mut through_dns, _) = world.host_client("udp", &format!("{DNS_VIP}:53"));
    let direct = format!("{BACKEND_1}:5353");
    let other = format!("{OTHER_VIP}:53");
    let mut survivors = vec![
        world.host_client("udp", &direct),
        world.pod_client(0, "udp", &direct),
        world.host_client("udp", &other),
        world.pod_client(1, "udp", &other),
    ];
    for (client, first) in &survivors {
        assert_eq!(
            first.reply.as_deref(),
            Some("b1"),
            "{}: {first:?}",
            client.what
        );
    }
    through_dns.send("wait");

    world.endpoints("dns", "UDP", 5353, &[BACKEND_2]);
    // The sweep happened: the socket of the removed pair was closed...
    let line = through_dns.line();
    assert_eq!(
        line.error.as_deref(),
        Some("ECONNABORTED"),
        "{line:?}\n{}",
        agent.log()
    );
    // ... and nothing else was.
    for (client, _) in &mut survivors {
        let line = client.ask("ping");
        assert_eq!(
            (line.reply.as_deref(), line.error.as_deref()),
            (Some("b1"), None),
            "{}: closed although socklb did not translate it to the removed pair",
            client.what
        );
    }
}

#[test]
fn a_resolver_recovers_when_its_dns_server_is_replaced() {
    let world = World::new("dst-dns");
    let _first = Dnsmasq::start(BACKEND_1, Ipv4Addr::new(10, 0, 0, 1));
    world.service("dns", DNS_VIP, 53, "UDP", 53, &[BACKEND_1]);
    let agent = world.agent("bpf-iterator", &[]);
    let (mut resolver, first) = world.pod_client(0, "dns", &format!("{DNS_VIP}:53"));
    assert_eq!(first.reply.as_deref(), Some("10.0.0.1"), "{first:?}");

    // A new dnsmasq at a new address replaces the first, which keeps running.
    let _second = Dnsmasq::start(BACKEND_2, Ipv4Addr::new(10, 0, 0, 2));
    world.endpoints("dns", "UDP", 53, &[BACKEND_2]);
    let started = Instant::now();
    let answer = loop {
        let line = resolver.ask("ping");
        if line.reply.as_deref() == Some("10.0.0.2") || started.elapsed() > DEADLINE {
            break line;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        (answer.reply.as_deref(), answer.reconnected),
        (Some("10.0.0.2"), true),
        "the resolver's socket should fail once and its new socket reach the new server: \
         {answer:?}\n{}",
        agent.log()
    );
}

/// A TCP server that keeps every connection open and answers each line with its name.
struct HoldingServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HoldingServer {
    fn new(name: &str, addr: SocketAddrV4) -> Self {
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let name = name.to_owned();
        let thread = std::thread::spawn(move || {
            let mut connections = Vec::new();
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let name = name.clone();
                        let _ = stream.set_nonblocking(false);
                        connections.push(std::thread::spawn(move || {
                            let mut writer = stream.try_clone().expect("clone stream");
                            let _ = writeln!(writer, "{name}");
                            for line in BufReader::new(stream).lines() {
                                if line.is_err() || writeln!(writer, "{name}").is_err() {
                                    break;
                                }
                            }
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HoldingServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A TCP connection to b1 through the web Service, b1 then replaced by b2; returns the
/// agent, the world and the client idle on its connection.
fn tcp_world(test: &str, mode: &str, extra: &[&str]) -> (World, Agent, Holder, [HoldingServer; 2]) {
    let world = World::new(test);
    let servers = [
        HoldingServer::new("b1", SocketAddrV4::new(BACKEND_1, 8080)),
        HoldingServer::new("b2", SocketAddrV4::new(BACKEND_2, 8080)),
    ];
    world.service("web", WEB_VIP, 80, "TCP", 8080, &[BACKEND_1]);
    let agent = world.agent(mode, extra);
    let (client, first) = world.pod_client(0, "tcp", &format!("{WEB_VIP}:80"));
    assert_eq!(first.reply.as_deref(), Some("b1"), "{first:?}");
    (world, agent, client, servers)
}

fn with_the_flag_an_idle_tcp_connection_to_a_removed_backend_is_reset(test: &str, mode: &str) {
    let (world, agent, mut client, _servers) =
        tcp_world(test, mode, &["--destroy-tcp-on-backend-removal"]);
    client.send("wait");
    world.endpoints("web", "TCP", 8080, &[BACKEND_2]);
    let line = client.line();
    assert_eq!(
        line.error.as_deref(),
        Some("ECONNABORTED"),
        "the connection to the removed backend was not closed: {line:?}\n{}",
        agent.log()
    );
    let (_, fresh) = world.pod_client(1, "tcp", &format!("{WEB_VIP}:80"));
    assert_eq!(fresh.reply.as_deref(), Some("b2"), "{fresh:?}");
}

#[test]
fn without_the_flag_tcp_connections_to_a_removed_backend_drain() {
    let (world, agent, mut client, _servers) = tcp_world("dst-tcp-off", "bpf-iterator", &[]);
    world.endpoints("web", "TCP", 8080, &[BACKEND_2]);
    // Synced once a new connection reaches b2.
    let started = Instant::now();
    loop {
        let (_, fresh) = world.host_client("tcp", &format!("{WEB_VIP}:80"));
        if fresh.reply.as_deref() == Some("b2") {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "b2 never answered: {fresh:?}\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let line = client.ask("ping");
    assert_eq!(
        (line.reply.as_deref(), line.error.as_deref()),
        (Some("b1"), None),
        "the connection should stay with its backend: {line:?}\n{}",
        agent.log()
    );
    assert!(
        !agent
            .log()
            .contains("closed the sockets of removed backends"),
        "no sweep without UDP removals and without the flag:\n{}",
        agent.log()
    );
}

#[test]
fn at_the_strict_minimum_capabilities_only_the_agents_namespace_is_swept() {
    let world = World::new("dst-default");
    let _servers = udp_servers(5353);
    world.service("dns", DNS_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    // closeSocketsInPods=false: BPF and NET_ADMIN, no PERFMON for the iterators, no
    // SYS_ADMIN for setns.
    let agent = world.agent_as(chart_agent_minimal(), "netlink", &[]);
    let target = format!("{DNS_VIP}:53");
    let (mut host, first) = world.host_client("udp", &target);
    assert_eq!(first.reply.as_deref(), Some("b1"), "{first:?}");
    let (mut pod, first) = world.pod_client(0, "udp", &target);
    assert_eq!(first.reply.as_deref(), Some("b1"), "{first:?}");
    host.send("wait");

    world.endpoints("dns", "UDP", 5353, &[BACKEND_2]);
    let line = host.line();
    assert_eq!(
        line.error.as_deref(),
        Some("ECONNABORTED"),
        "{line:?}\n{}",
        agent.log()
    );
    agent.wait_for_log("SYS_ADMIN", 1);
    let line = pod.ask("ping");
    assert_eq!(
        line.reply.as_deref(),
        Some("b1"),
        "the pod's socket is out of reach without SYS_ADMIN: {line:?}"
    );
}

#[test]
fn a_backend_removed_by_a_sync_that_then_fails_still_has_its_sockets_closed() {
    let world = World::new("dst-failed-sync");
    let _servers = udp_servers(5353);
    world.service("dns", DNS_VIP, 53, "UDP", 5353, &[BACKEND_1]);
    // Room for no Maglev table (each takes --maglev-table-size entries): from the moment a
    // Maglev Service exists, every sync fails after the service map is written.
    let agent = world.agent("netlink", &["--max-maglev-entries", "64"]);
    let target = format!("{DNS_VIP}:53");
    let (mut host, first) = world.host_client("udp", &target);
    assert_eq!(first.reply.as_deref(), Some("b1"), "{first:?}");
    host.send("wait");

    // One file, so one sync: b1 leaves the DNS Service, and a Maglev Service arrives.
    let before = agent.log().len();
    world.manifests.write(
        "dns-slice.yaml",
        &format!(
            "{}---
apiVersion: v1
kind: Service
metadata:
  name: maglev
  namespace: default
  annotations: {{socklb.io/lb-algorithm: maglev}}
spec:
  clusterIP: 10.96.0.90
  clusterIPs: [10.96.0.90]
  externalIPs: [192.0.2.90]
  ports: [{{name: p, port: 80, protocol: TCP}}]
---
{}",
            slice("dns", "UDP", 5353, &[BACKEND_2]),
            slice("maglev", "TCP", 8080, &[BACKEND_1])
        ),
    );
    let line = host.line();
    assert_eq!(
        line.error.as_deref(),
        Some("ECONNABORTED"),
        "the sync that removed b1 failed (Maglev), and the socket must be closed anyway: \
         {line:?}\n{}",
        agent.log()
    );
    // A sync from before the change may still be logged after `before`: only what follows
    // the first failure counts.
    agent.wait_for_log("sync failed", 1);
    let log = agent.log();
    let failed = before + log[before..].find("sync failed").expect("waited for");
    assert!(
        !log[failed..].contains("synced full="),
        "every sync after the change should have failed:\n{log}"
    );
}

#[test]
fn the_iterators_read_cookies_without_handing_them_out() {
    // Where the kernel keeps a socket's cookie, from its BTF: 0 would make the iterators
    // fall back to the helper, which gives every socket it visits a cookie.
    let offset = socklb_agent::dataplane::skc_cookie_offset();
    assert!(
        offset > 0 && offset.is_multiple_of(8),
        "skc_cookie not found in struct sock_common of /sys/kernel/btf/vmlinux: {offset}"
    );
}

socklb_tests::for_each_family!(
    the_iterators_close_a_connected_udp_socket_whose_backend_left,
    netlink_closes_a_connected_udp_socket_whose_backend_left,
);

fn the_iterators_close_a_connected_udp_socket_whose_backend_left(family: Family) {
    a_connected_udp_socket_whose_backend_left_is_closed(family, Requested::BpfIterator, "it");
}

fn netlink_closes_a_connected_udp_socket_whose_backend_left(family: Family) {
    a_connected_udp_socket_whose_backend_left_is_closed(family, Requested::Netlink, "nl");
}

/// A sweep of each family's sockets in `mode`, driven through the agent's library (the
/// datapath, its apply report and the sweeper) rather than a running agent.
fn a_connected_udp_socket_whose_backend_left_is_closed(family: Family, mode: Requested, tag: &str) {
    let sandbox = Sandbox::new(&format!("dst-{tag}{}", family.tag()));
    let servers = family.udp_servers(&sandbox, 1, 2, 5353);
    let vip = family.frontend(53, 53, Protocol::Udp);
    // The chart's defaults (closeSocketsInPods), with which the iterators load.
    let mut dataplane = chart_agent()
        .within(|| socklb_agent::dataplane::Dataplane::load(sandbox.config()))
        .expect("load the datapath");
    let mut desired = Desired::default();
    desired.insert(vip, spec(&servers[..1]));
    dataplane.apply(&desired).expect("apply");
    sandbox.attach(&mut dataplane);
    let sweeper = Sweeper::start(
        dataplane.take_destroy_programs(),
        &sandbox.pin_dir,
        mode,
        false,
        Arc::new(Metrics::new()),
    )
    .expect("the sweeper starts with the chart's capabilities");

    let target = SocketAddr::new(vip.address, vip.port).to_string();
    let mut command = command_in_cgroup(&sandbox.cgroup, hold_bin());
    command.args(["udp", &target]);
    let (mut client, first) = Holder::start(&format!("udp client of {target}"), command);
    assert_eq!(first.reply.as_deref(), Some("u1"), "{first:?}");
    // A socket straight to the backend is no business of the sweep.
    let mut command = command_in_cgroup(&sandbox.cgroup, hold_bin());
    command.args(["udp", &servers[0].addr.to_string()]);
    let (mut direct, first) = Holder::start("direct udp client", command);
    assert_eq!(first.reply.as_deref(), Some("u1"), "{first:?}");
    client.send("wait");

    desired.insert(vip, spec(&servers[1..]));
    let report = dataplane.apply(&desired).expect("apply");
    assert_eq!(report.gone.len(), 1, "{:?}", report.gone);
    sweeper.sweep(&report.gone, |queued| dataplane.still_gone(queued));
    let line = client.line();
    assert_eq!(line.error.as_deref(), Some("ECONNABORTED"), "{line:?}");
    let line = direct.ask("ping");
    assert_eq!(line.reply.as_deref(), Some("u1"), "{line:?}");
}
