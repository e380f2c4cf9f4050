//! Harness for the privileged tests: a private network namespace and child cgroup per test,
//! real servers on loopback addresses inside that namespace, the real `socklb-probe` client
//! run inside the cgroup, and cleanup of everything in `Drop`, also when a test panics.
//!
//! A missing prerequisite (not root, no bpffs, no cgroup v2) fails the test with a message
//! naming it; nothing is skipped.
pub mod bench;
pub mod boom_server;
pub mod cluster;
pub mod echo;
pub mod fake_apiserver;
pub mod family;
pub mod forged;
pub mod hold;
pub mod lan;
pub mod netns;
pub mod privileges;
pub mod seccomp;
pub mod testbed;
use std::{
    ffi::CString,
    fs,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, UdpSocket},
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde::Deserialize;
use socklb_agent::dataplane::{
    self, BackendAddr, Capacities, Config, Dataplane, DataplaneError, Frontend, FrontendSpec,
    Protocol, Scope,
};

use crate::privileges::{ContainerPrivileges, chart_agent, chart_agent_minimal, chart_cleanup};

/// A test's private world. Dropping it detaches the programs, removes the pins, the cgroup
/// (after killing anything left in it) and returns the thread to its network namespace.
pub struct Sandbox {
    pub name: String,
    pub pin_dir: PathBuf,
    pub cgroup: PathBuf,
    original_netns: fs::File,
}

impl Sandbox {
    /// Enters a new network namespace (this thread and the threads and processes it starts)
    /// and creates a child cgroup and a pin directory named after the test.
    pub fn new(test: &str) -> Self {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "privileged test {test}: must run as root (use `./x test`)"
        );
        // Rendered now, so that a chart that does not render fails the test here, not in Drop.
        let _ = (chart_agent(), chart_agent_minimal(), chart_cleanup());
        let name = format!("socklb-test-{}-{test}", std::process::id());
        let original_netns =
            fs::File::open("/proc/thread-self/ns/net").expect("open /proc/thread-self/ns/net");
        // SAFETY: unshare affects only this thread's network namespace.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        );
        let sandbox = Self {
            pin_dir: PathBuf::from("/sys/fs/bpf").join(&name),
            cgroup: cgroup2_root().join(&name),
            name,
            original_netns,
        };
        run(Command::new("ip").args(["link", "set", "lo", "up"]));
        fs::create_dir(&sandbox.cgroup)
            .unwrap_or_else(|e| panic!("create cgroup {}: {e}", sandbox.cgroup.display()));
        sandbox
    }

    pub fn config(&self) -> Config {
        Config {
            pin_dir: self.pin_dir.clone(),
            cgroup: Some(self.cgroup.clone()),
            capacities: Capacities::default(),
            ..Config::default()
        }
    }

    /// Loads the datapath with this sandbox's pins; attached to its cgroup by `attach`.
    pub fn dataplane(&self) -> Dataplane {
        self.load(self.config()).expect("load the datapath")
    }

    /// Loads the datapath with exactly the agent container's capabilities, as the agent
    /// would.
    pub fn load(&self, config: Config) -> Result<Dataplane, DataplaneError> {
        chart_agent_minimal().within(|| Dataplane::load(config))
    }

    /// Loads the datapath, programs `desired` (every frontend must fit) and attaches it.
    pub fn programmed(&self, desired: &dataplane::Desired) -> Dataplane {
        let mut dataplane = self.dataplane();
        let report = dataplane.apply(desired).expect("apply");
        assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        self.attach(&mut dataplane);
        dataplane
    }

    /// Attaches the programs to this sandbox's cgroup with the agent container's
    /// capabilities.
    pub fn attach(&self, dataplane: &mut Dataplane) {
        chart_agent_minimal()
            .within(|| dataplane.attach())
            .expect("attach the programs");
    }

    /// `socklb run` as node-a on `manifests` in this sandbox, started as `privileges` say,
    /// for tests of how the agent starts or refuses to ([`Agent::start`] waits for ready).
    pub fn agent_command(&self, privileges: &ContainerPrivileges, manifests: &Path) -> Command {
        let mut command = privileges.command(agent_bin());
        command
            .arg("run")
            .args(file_source(manifests))
            .args(["--node-name", "node-a", "--bpffs"])
            .arg(&self.pin_dir)
            .arg("--cgroup-path")
            .arg(&self.cgroup);
        command
    }

    /// `socklb inspect -o json` as an operator runs it in the agent's container.
    pub fn inspect(&self) -> serde_json::Value {
        self.inspect_as(chart_agent_minimal())
    }

    /// `socklb inspect -o json` run with `privileges`.
    pub fn inspect_as(&self, privileges: &ContainerPrivileges) -> serde_json::Value {
        let output = privileges
            .command(agent_bin())
            .args(["inspect", "-o", "json", "--bpffs"])
            .arg(&self.pin_dir)
            .output()
            .expect("run socklb inspect");
        assert!(
            output.status.success(),
            "socklb inspect: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("socklb inspect's JSON")
    }

    /// A command that runs inside this sandbox's cgroup (and network namespace).
    pub fn in_cgroup(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        command_in_cgroup(&self.cgroup, program)
    }

    /// Runs the probe inside the cgroup and returns its attempts.
    pub fn probe(&self, mode: &str, target: SocketAddr, count: u32) -> Vec<Attempt> {
        let output = self
            .in_cgroup(probe_bin())
            .args([mode, &target.to_string(), &count.to_string()])
            .output()
            .expect("run socklb-probe");
        parse_attempts(&output.stdout, &output.stderr)
    }

    /// The servers that answered `count` connections to `target` from inside the cgroup,
    /// each by its name, a failure as "error: ERRNO".
    pub fn answering(&self, target: SocketAddr, count: u32) -> std::collections::BTreeSet<String> {
        self.probe("tcp", target, count)
            .into_iter()
            .map(|a| {
                a.reply
                    .unwrap_or_else(|| format!("error: {}", a.error.unwrap_or_default()))
            })
            .collect()
    }

    /// Runs the probe outside the cgroup (a process the datapath must not touch).
    pub fn probe_outside(&self, mode: &str, target: SocketAddr, count: u32) -> Vec<Attempt> {
        let output = Command::new(probe_bin())
            .args([mode, &target.to_string(), &count.to_string()])
            .output()
            .expect("run socklb-probe");
        parse_attempts(&output.stdout, &output.stderr)
    }

    /// Starts a probe in the cgroup in the background: `count` attempts, `pause_ms` apart.
    pub fn spawn_probe(
        &self,
        mode: &str,
        target: SocketAddr,
        count: u32,
        pause_ms: u32,
    ) -> ProbeRun {
        self.spawn_probe_until(mode, target, &count.to_string(), pause_ms)
    }

    /// Starts a probe in the cgroup in the background: attempts `pause_ms` apart for
    /// `duration` (whole seconds).
    pub fn spawn_probe_for(
        &self,
        mode: &str,
        target: SocketAddr,
        duration: Duration,
        pause_ms: u32,
    ) -> ProbeRun {
        let seconds = format!("{}s", duration.as_secs());
        self.spawn_probe_until(mode, target, &seconds, pause_ms)
    }

    fn spawn_probe_until(
        &self,
        mode: &str,
        target: SocketAddr,
        until: &str,
        pause_ms: u32,
    ) -> ProbeRun {
        let child = self
            .in_cgroup(probe_bin())
            .args([mode, &target.to_string(), until, &pause_ms.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn socklb-probe");
        ProbeRun { child: Some(child) }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // `socklb cleanup` as the chart's cleanup container runs it; should that fail, the
        // test's own process still removes everything.
        match chart_cleanup()
            .command(agent_bin())
            .arg("cleanup")
            .arg("--bpffs")
            .arg(&self.pin_dir)
            .output()
        {
            Ok(output) if output.status.success() => {}
            failed => {
                eprintln!("socklb cleanup of {}: {failed:?}", self.pin_dir.display());
                if let Err(e) = dataplane::cleanup(&self.pin_dir) {
                    eprintln!("cleanup of {}: {e}", self.pin_dir.display());
                }
            }
        }
        // Anything still in the cgroup (a probe of a failed test) is killed first.
        remove_cgroup(&self.cgroup);
        // SAFETY: setns with a namespace fd we opened; affects only this thread.
        unsafe { libc::setns(self.original_netns.as_raw_fd(), libc::CLONE_NEWNET) };
    }
}

/// A command whose process joins `cgroup` before it runs `program`.
pub fn command_in_cgroup(cgroup: &Path, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let procs = CString::new(cgroup.join("cgroup.procs").as_os_str().as_encoded_bytes())
        .expect("cgroup path without NUL");
    let mut command = Command::new(program);
    // SAFETY: only async-signal-safe calls (open, write, close) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if written != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

/// A probe started in the background.
pub struct ProbeRun {
    child: Option<Child>,
}

impl ProbeRun {
    /// Whether the probe is still making attempts.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    pub fn wait(mut self) -> Vec<Attempt> {
        let child = self.child.take().expect("probe child");
        let output = child.wait_with_output().expect("wait for socklb-probe");
        parse_attempts(&output.stdout, &output.stderr)
    }

    /// Stops a probe that still runs (a looping client) and returns its attempts so far (it
    /// writes one line per attempt, so none is cut).
    pub fn stop(mut self) -> Vec<Attempt> {
        let mut child = self.child.take().expect("probe child");
        let _ = child.kill();
        let output = child.wait_with_output().expect("wait for socklb-probe");
        parse_attempts(&output.stdout, &output.stderr)
    }
}

impl Drop for ProbeRun {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Fails with the first failed connect if any of `attempts` (of looping clients) failed.
pub fn assert_all_connected(attempts: &[Attempt], what: &str) {
    assert!(!attempts.is_empty(), "{what}: the client made no attempt");
    let failed: Vec<&Attempt> = attempts.iter().filter(|a| a.error.is_some()).collect();
    assert!(
        failed.is_empty(),
        "{what}: {} of {} connects failed, first: {:?}",
        failed.len(),
        attempts.len(),
        failed.first()
    );
}

/// Every attempt was answered by one of `backends`: none failed, none went untranslated.
pub fn assert_all_answered_by(attempts: &[Attempt], backends: &[&str], what: &str) {
    assert!(!attempts.is_empty(), "{what}: the clients made no attempt");
    let failed: Vec<&Attempt> = attempts
        .iter()
        .filter(|a| !a.reply.as_deref().is_some_and(|r| backends.contains(&r)))
        .collect();
    assert!(
        failed.is_empty(),
        "{what}: {} of {} connects failed or were not answered by {backends:?}: {:?}",
        failed.len(),
        attempts.len(),
        &failed[..failed.len().min(5)]
    );
}

/// One line of the probe's output.
#[derive(Debug, Clone, Deserialize)]
pub struct Attempt {
    pub started_ns: u64,
    pub finished_ns: u64,
    pub peer: Option<String>,
    pub reply: Option<String>,
    pub error: Option<String>,
}

fn parse_attempts(stdout: &[u8], stderr: &[u8]) -> Vec<Attempt> {
    let attempts: Vec<Attempt> = String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("probe line {line}: {e}")))
        .collect();
    assert!(
        !attempts.is_empty(),
        "socklb-probe printed nothing; stderr: {}",
        String::from_utf8_lossy(stderr)
    );
    attempts
}

/// The probe client; cargo builds this package's binaries before its integration tests.
/// The `socklb-hold` client (see [`hold`]).
pub fn hold_bin() -> PathBuf {
    target_bin("socklb-hold", "SOCKLB_HOLD_BIN")
}

fn probe_bin() -> PathBuf {
    target_bin("socklb-probe", "SOCKLB_PROBE_BIN")
}

/// The agent binary, built by `./x test` before the tests run.
pub fn agent_bin() -> PathBuf {
    target_bin("socklb", "SOCKLB_BIN")
}

/// A binary of the same target directory as the running one (tests run from
/// target/debug/deps, binaries from target/debug), unless `env` names one.
pub(crate) fn target_bin(name: &str, env: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("directory of the running binary");
    let candidates = [Some(dir), dir.parent()].map(|d| d.map(|d| d.join(name)));
    candidates
        .into_iter()
        .flatten()
        .find(|bin| bin.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found next to {}: `./x test` builds it (or set {env})",
                exe.display()
            )
        })
}

/// The cgroup v2 mount, as the agent finds it.
pub fn cgroup2_root() -> PathBuf {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    mountinfo
        .lines()
        .find_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            if fs.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            mount.split_whitespace().nth(4).map(PathBuf::from)
        })
        .expect("prerequisite missing: no cgroup v2 filesystem is mounted")
}

pub fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A real server thread that answers every TCP connection, or every UDP datagram, with its
/// name; stops when dropped.
/// Placeholder in a server's reply for the client address it saw.
const PEER: &str = "{peer}";

pub struct NamedServer {
    pub name: String,
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl NamedServer {
    pub fn tcp(name: &str, addr: SocketAddrV4) -> Self {
        Self::tcp_replying(name, addr, name)
    }

    /// Servers on 127.0.`net`.1..=`count`, port 8080, each answering its own address.
    pub fn numbered(net: u8, count: u8) -> Vec<Self> {
        (1..=count)
            .map(|i| {
                let addr = SocketAddrV4::new(Ipv4Addr::new(127, 0, net, i), 8080);
                Self::tcp(&addr.ip().to_string(), addr)
            })
            .collect()
    }

    /// A TCP server on an address of either family.
    pub fn tcp_at(name: &str, addr: SocketAddr) -> Self {
        Self::serve_tcp(name, addr, name)
    }

    /// A TCP server that answers every connection with `reply` (e.g. an HTTP response).
    pub fn tcp_replying(name: &str, addr: SocketAddrV4, reply: &str) -> Self {
        Self::serve_tcp(name, SocketAddr::V4(addr), reply)
    }

    /// A TCP server bound inside `netns` that answers `<name> <client address:port>`: which
    /// backend answered, and the source address it saw.
    pub fn tcp_in(netns: &netns::Netns, name: &str, addr: impl Into<SocketAddr>) -> Self {
        let addr = addr.into();
        let listener = netns.enter(|| {
            TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {}: {e}", netns.name))
        });
        Self::serve_listener(name, listener, &format!("{name} {PEER}"))
    }

    fn serve_tcp(name: &str, addr: SocketAddr, reply: &str) -> Self {
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        Self::serve_listener(name, listener, reply)
    }

    /// Serves `listener`; `{peer}` in `reply` becomes the client's address.
    fn serve_listener(name: &str, listener: TcpListener, reply: &str) -> Self {
        let addr = listener.local_addr().expect("listener address");
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let reply = reply.to_owned();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut stream, peer)) => {
                        let _ = stream.set_nonblocking(false);
                        // An HTTP client's request is read first: closing with unread
                        // data would reset the connection under the response.
                        if reply.starts_with("HTTP/") {
                            let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                            let _ = stream.read(&mut [0u8; 2048]);
                        }
                        let text = reply.replace(PEER, &peer.to_string());
                        let _ = stream.write_all(text.as_bytes());
                        // Half-close and drain until the client closes: closing with a
                        // request unread (curl's) would reset the connection under the reply.
                        let _ = stream.shutdown(std::net::Shutdown::Write);
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                        let mut sink = [0u8; 2048];
                        while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Self {
            name: name.to_owned(),
            addr,
            stop,
            thread: Some(thread),
        }
    }

    pub fn udp(name: &str, addr: SocketAddrV4) -> Self {
        Self::udp_at(name, SocketAddr::V4(addr))
    }

    /// A UDP server on an address of either family.
    pub fn udp_at(name: &str, addr: SocketAddr) -> Self {
        let socket = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        Self::serve_udp(name, socket, name)
    }

    /// A UDP server bound inside `netns` answering `<name> <client address:port>`.
    pub fn udp_in(netns: &netns::Netns, name: &str, addr: impl Into<SocketAddr>) -> Self {
        let addr = addr.into();
        let socket = netns.enter(|| {
            UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {}: {e}", netns.name))
        });
        Self::serve_udp(name, socket, &format!("{name} {PEER}"))
    }

    fn serve_udp(name: &str, socket: UdpSocket, reply: &str) -> Self {
        let addr = socket.local_addr().expect("socket address");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let reply = reply.to_owned();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buffer = [0u8; 512];
            while !stopping.load(Ordering::Relaxed) {
                if let Ok((_, from)) = socket.recv_from(&mut buffer) {
                    let text = reply.replace(PEER, &from.to_string());
                    let _ = socket.send_to(text.as_bytes(), from);
                }
            }
        });
        Self {
            name: name.to_owned(),
            addr,
            stop,
            thread: Some(thread),
        }
    }

    /// The server as a backend.
    pub fn backend(&self) -> BackendAddr {
        BackendAddr::local(self.addr.ip(), self.addr.port())
    }
}

impl Drop for NamedServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A dnsmasq process serving `name.test -> answer` on `addr`:53; killed when dropped.
pub struct Dnsmasq {
    child: Child,
}

impl Dnsmasq {
    pub fn start(listen: impl Into<IpAddr>, answer: Ipv4Addr) -> Self {
        let listen = listen.into();
        let mut child = Command::new("dnsmasq")
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--user=root",
                "--pid-file=",
                &format!("--listen-address={listen}"),
                "--port=53",
                &format!("--address=/who.test/{answer}"),
                "--log-facility=-",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("prerequisite missing: dnsmasq (apt-get install dnsmasq-base; ./x setup does)");
        // Ready once it logs that it started (it binds before logging).
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut log = String::new();
        loop {
            match lines.next() {
                Some(Ok(line)) => {
                    let started = line.contains("started");
                    log.push_str(&line);
                    log.push('\n');
                    if started {
                        break;
                    }
                }
                _ => panic!("dnsmasq on {listen} did not start: {log}"),
            }
        }
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self { child }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// TCP servers on `prefix.1` .. `prefix.count`, named b1 .. b`count`.
pub fn tcp_backends(prefix: [u8; 3], count: u8, port: u16) -> Vec<NamedServer> {
    named_servers(prefix, count, port, NamedServer::tcp)
}

/// UDP servers on `prefix.1` .. `prefix.count`, named b1 .. b`count`.
pub fn udp_backends(prefix: [u8; 3], count: u8, port: u16) -> Vec<NamedServer> {
    named_servers(prefix, count, port, NamedServer::udp)
}

fn named_servers(
    prefix: [u8; 3],
    count: u8,
    port: u16,
    serve: fn(&str, SocketAddrV4) -> NamedServer,
) -> Vec<NamedServer> {
    (1..=count)
        .map(|i| {
            let ip = Ipv4Addr::new(prefix[0], prefix[1], prefix[2], i);
            serve(&format!("b{i}"), SocketAddrV4::new(ip, port))
        })
        .collect()
}

/// A frontend whose backends are `servers`, without affinity, source ranges or Maglev.
pub fn spec<'a>(servers: impl IntoIterator<Item = &'a NamedServer>) -> FrontendSpec {
    FrontendSpec {
        backends: servers.into_iter().map(NamedServer::backend).collect(),
        affinity_timeout_seconds: None,
        source_ranges: None,
        maglev: false,
        no_endpoints: false,
    }
}

/// When each backend set was put in force, on the probes' clock: which sets an attempt may
/// have seen while the sets change under it.
#[derive(Debug, Default)]
pub struct SetChanges(Vec<(u64, u64, usize)>);

impl SetChanges {
    /// Starts with set `set` in force.
    pub fn new(set: usize) -> Self {
        Self(vec![(0, 0, set)])
    }

    /// Puts set `set` in force by running `apply`, and records when.
    pub fn change(&mut self, set: usize, apply: impl FnOnce()) {
        let started = monotonic_ns();
        apply();
        self.0.push((started, monotonic_ns(), set));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The sets that may have been in force while `attempt` ran: set k from the start of
    /// its apply until apply k+1 returned.
    pub fn possible(&self, attempt: &Attempt) -> std::collections::BTreeSet<usize> {
        self.0
            .iter()
            .enumerate()
            .filter(|&(k, &(apply_started, _, _))| {
                apply_started <= attempt.finished_ns
                    && self
                        .0
                        .get(k + 1)
                        .is_none_or(|&(_, returned, _)| returned >= attempt.started_ns)
            })
            .map(|(_, &(_, _, set))| set)
            .collect()
    }
}

/// A TCP frontend on a "cluster IP" that nothing else answers in the sandbox.
pub fn frontend(address: [u8; 4], port: u16, protocol: Protocol) -> Frontend {
    Frontend {
        address: Ipv4Addr::from(address).into(),
        port,
        protocol,
        scope: Scope::Internal,
    }
}

pub fn addr(frontend: &Frontend) -> SocketAddr {
    SocketAddr::from((frontend.address, frontend.port))
}

/// Counts attempts per reply.
pub fn tally(attempts: &[Attempt]) -> std::collections::BTreeMap<String, usize> {
    let mut tally = std::collections::BTreeMap::new();
    for attempt in attempts {
        let key = attempt
            .reply
            .clone()
            .or_else(|| attempt.error.clone().map(|e| format!("error: {e}")))
            .unwrap_or_default();
        *tally.entry(key).or_insert(0) += 1;
    }
    tally
}

/// A directory of manifests for the agent's file source; removed when dropped.
pub struct ManifestDir {
    pub path: PathBuf,
}

impl ManifestDir {
    pub fn new(sandbox: &Sandbox) -> Self {
        let path = std::env::temp_dir().join(format!("{}-manifests", sandbox.name));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create the manifests directory");
        Self { path }
    }

    /// Writes (or replaces) one manifest file atomically, as an editor or a sync tool would.
    pub fn write(&self, file: &str, yaml: &str) {
        let tmp = self.path.join(format!(".{file}.tmp"));
        fs::write(&tmp, yaml).expect("write a manifest");
        fs::rename(&tmp, self.path.join(file)).expect("move a manifest into place");
    }

    pub fn remove(&self, file: &str) {
        fs::remove_file(self.path.join(file)).expect("remove a manifest");
    }

    /// A Service and its EndpointSlice in one file, `<name>.yaml`.
    pub fn service(&self, name: &str, service: &str, slice: &str) {
        self.write(&format!("{name}.yaml"), &format!("{service}---\n{slice}"));
    }

    /// Service `name` (port 80 on `vip`, `default` namespace) with one EndpointSlice of two
    /// endpoints on port 8080, `first` on node-a and `second` on node-b: files `<name>.yaml`
    /// and `<name>-slice.yaml`.
    pub fn two_endpoint_service(&self, name: &str, vip: &str, first: &str, second: &str) {
        self.write(&format!("{name}.yaml"), &service_yaml(name, vip, 80, ""));
        self.write(
            &format!("{name}-slice.yaml"),
            &slice_yaml(
                &format!("{name}-1"),
                name,
                8080,
                &[
                    (first, "node-a", "zone-a", ""),
                    (second, "node-b", "zone-b", ""),
                ],
                false,
            ),
        );
    }
}

impl Drop for ManifestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A Node manifest: `name` in `zone`, with `address` as its InternalIP.
pub fn node_yaml(name: &str, zone: &str, address: &str) -> String {
    format!(
        "apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{topology.kubernetes.io/zone: {zone}, kubernetes.io/hostname: {name}}}
status:
  addresses: [{{type: InternalIP, address: {address}}}]
"
    )
}

/// A ClusterIP Service with one TCP port named http.
pub fn service_yaml(name: &str, cluster_ip: &str, port: u16, extra_spec: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {cluster_ip}
  clusterIPs: [{cluster_ip}]
  ports: [{{name: http, port: {port}, protocol: TCP}}]
{extra_spec}"
    )
}

/// `count` ClusterIP Services (`filler-N`, VIPs from 10.100.0.1) of `endpoints` endpoints
/// each on node2 (addresses from 10.200.0.0 that nobody connects to), in one manifest:
/// the load of a test that makes the maps grow.
pub fn filler_services(count: usize, endpoints: usize) -> String {
    let mut yaml = String::new();
    for i in 0..count {
        let name = format!("filler-{i}");
        let vip = format!("10.100.{}.{}", i / 250, i % 250 + 1);
        let addresses: Vec<String> = (0..endpoints)
            .map(|e| {
                let n = i * endpoints + e;
                format!("10.{}.{}.{}", 200 + n / 65_536, (n / 256) % 256, n % 256)
            })
            .collect();
        let endpoints: Vec<(&str, &str, &str, &str)> = addresses
            .iter()
            .map(|address| (address.as_str(), "node2", "z1", ""))
            .collect();
        yaml.push_str(&service_yaml(&name, &vip, 80, ""));
        yaml.push_str("---\n");
        yaml.push_str(&slice_yaml(
            &format!("{name}-1"),
            &name,
            8080,
            &endpoints,
            false,
        ));
        yaml.push_str("---\n");
    }
    yaml
}

/// An EndpointSlice of `service` whose endpoints are `(address, node, zone, conditions)`;
/// conditions is YAML like `{ready: false, serving: true, terminating: true}` or "".
pub fn slice_yaml(
    name: &str,
    service: &str,
    port: u16,
    endpoints: &[(&str, &str, &str, &str)],
    zone_hints: bool,
) -> String {
    let mut yaml = format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: default
  labels: {{kubernetes.io/service-name: {service}}}
addressType: IPv4
ports: [{{name: http, port: {port}, protocol: TCP}}]
endpoints:
"
    );
    for (address, node, zone, conditions) in endpoints {
        yaml.push_str(&format!(
            "- addresses: [{address}]\n  nodeName: {node}\n  zone: {zone}\n"
        ));
        if !conditions.is_empty() {
            yaml.push_str(&format!("  conditions: {conditions}\n"));
        }
        if zone_hints {
            yaml.push_str(&format!("  hints: {{forZones: [{{name: {zone}}}]}}\n"));
        }
    }
    yaml
}

/// `socklb run`'s arguments for the file source on `manifests`.
fn file_source(manifests: &Path) -> [&std::ffi::OsStr; 4] {
    [
        "--source".as_ref(),
        "file".as_ref(),
        "--manifests".as_ref(),
        manifests.as_os_str(),
    ]
}

/// `socklb run`'s arguments for the kube source on the API server of `kubeconfig`.
fn kube_source(kubeconfig: &Path) -> [&std::ffi::OsStr; 4] {
    [
        "--source".as_ref(),
        "kube".as_ref(),
        "--kubeconfig".as_ref(),
        kubeconfig.as_os_str(),
    ]
}

/// The real agent, `socklb run`, in the sandbox; killed if still running when dropped.
/// It programs every change at once (`--min-sync-period 0s`) unless `extra` sets the flag.
pub struct Agent {
    child: Option<Child>,
    pid: u32,
    started: Instant,
    /// Every log line, with when it was read.
    log: Arc<std::sync::Mutex<Vec<(Instant, String)>>>,
}

impl Agent {
    /// Starts the agent on `manifests` as node `node` and waits until it is ready.
    pub fn start(sandbox: &Sandbox, manifests: &Path, node: &str, extra: &[&str]) -> Self {
        let source = file_source(manifests);
        Self::spawn(sandbox, &source, node, extra)
    }

    /// Starts the agent on the API server of `kubeconfig` and waits until it is ready.
    pub fn start_kube(sandbox: &Sandbox, kubeconfig: &Path, node: &str, extra: &[&str]) -> Self {
        let source = kube_source(kubeconfig);
        Self::spawn(sandbox, &source, node, extra)
    }

    /// Starts the agent on `manifests` with its own pins and cgroup (a second node of a
    /// test); it runs in the network namespace of the calling thread.
    pub fn start_at(
        pin_dir: &Path,
        cgroup: &Path,
        manifests: &Path,
        node: &str,
        extra: &[&str],
    ) -> Self {
        let source = file_source(manifests);
        Self::spawn_at(pin_dir, cgroup, &source, node, extra)
    }

    /// Starts the agent on `manifests` as `privileges` say instead of the chart's defaults.
    pub fn start_as(
        privileges: &ContainerPrivileges,
        sandbox: &Sandbox,
        manifests: &Path,
        node: &str,
        extra: &[&str],
    ) -> Self {
        let source = file_source(manifests);
        Self::launch(
            privileges,
            &sandbox.pin_dir,
            &sandbox.cgroup,
            &source,
            node,
            extra,
        )
    }

    /// Starts the agent on the API server of `kubeconfig` with its own pins and cgroup (a
    /// second node of a test); it runs in the network namespace of the calling thread.
    pub fn start_kube_at(
        pin_dir: &Path,
        cgroup: &Path,
        kubeconfig: &Path,
        node: &str,
        extra: &[&str],
    ) -> Self {
        let source = kube_source(kubeconfig);
        Self::spawn_at(pin_dir, cgroup, &source, node, extra)
    }

    fn spawn(sandbox: &Sandbox, source: &[&std::ffi::OsStr], node: &str, extra: &[&str]) -> Self {
        Self::spawn_at(&sandbox.pin_dir, &sandbox.cgroup, source, node, extra)
    }

    fn spawn_at(
        pin_dir: &Path,
        cgroup: &Path,
        source: &[&std::ffi::OsStr],
        node: &str,
        extra: &[&str],
    ) -> Self {
        Self::launch(chart_agent_minimal(), pin_dir, cgroup, source, node, extra)
    }

    fn launch(
        privileges: &ContainerPrivileges,
        pin_dir: &Path,
        cgroup: &Path,
        source: &[&std::ffi::OsStr],
        node: &str,
        extra: &[&str],
    ) -> Self {
        let min_sync_period: &[&str] = if extra.contains(&"--min-sync-period") {
            &[]
        } else {
            &["--min-sync-period", "0s"]
        };
        // As the chart runs it: its user, capabilities and no_new_privs.
        let mut command = privileges.command(agent_bin());
        unblock_signals_on_exec(&mut command);
        let started = Instant::now();
        let mut child = command
            .arg("run")
            .args(source)
            .args(["--node-name", node, "--bpffs"])
            .arg(pin_dir)
            .arg("--cgroup-path")
            .arg(cgroup)
            .args(min_sync_period)
            .args(extra)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start socklb");
        // The log is read on a thread that keeps draining it after "ready".
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut ready = Some(ready_tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let is_ready = line.contains("ready");
                if let Ok(mut log) = sink.lock() {
                    log.push((Instant::now(), line));
                }
                if is_ready && let Some(tx) = ready.take() {
                    let _ = tx.send(true);
                }
            }
            if let Some(tx) = ready {
                let _ = tx.send(false);
            }
        });
        let agent = Self {
            pid: child.id(),
            child: Some(child),
            started,
            log,
        };
        let ready = ready_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or(false);
        assert!(ready, "the agent did not become ready:\n{}", agent.log());
        agent
    }

    pub fn log(&self) -> String {
        self.lines()
            .into_iter()
            .map(|(_, line)| line + "\n")
            .collect()
    }

    /// The log lines so far, each with when the harness read it (within microseconds of
    /// when the agent wrote it): with [`started`](Self::started), for benchmarks.
    pub fn lines(&self) -> Vec<(Instant, String)> {
        self.log.lock().map(|log| log.clone()).unwrap_or_default()
    }

    /// Just before the process was spawned.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The agent's process id, e.g. to read its CPU time and memory from /proc.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Waits until the log has `count` lines containing `text`.
    pub fn wait_for_log(&self, text: &str, count: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.log().matches(text).count() < count {
            assert!(
                std::time::Instant::now() < deadline,
                "no {count}x {text:?} in the agent log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, as Kubernetes stops a pod; the agent must exit cleanly.
    pub fn stop(mut self) -> String {
        let mut child = self.child.take().expect("agent child");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id().cast_signed(), libc::SIGTERM) };
        let status = child.wait().expect("wait for socklb");
        assert!(
            status.success(),
            "socklb exited with {status}:\n{}",
            self.log()
        );
        self.log()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// CLOCK_MONOTONIC in nanoseconds: comparable across processes (the probe's timestamps and
/// the test's).
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap_or(0)
}

/// Kernel, CPUs and date: absolute times only mean something next to these.
pub fn machine_context() -> String {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|release| release.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{date}, kernel {kernel}, {cpus} CPUs ({model})")
}

/// Spawned processes inherit the signal mask: a caller that blocks SIGTERM (a benchmark
/// does, to clean up on one thread of its own) must not block its children's.
pub fn unblock_signals_on_exec(command: &mut Command) {
    // SAFETY: only async-signal-safe calls (sigemptyset, pthread_sigmask) before exec.
    unsafe {
        command.pre_exec(|| {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and the threads it starts), so that a
/// benchmark can wait for them on a thread of its own and clean up; returns the set. A
/// spawned child inherits the mask: [`Agent`] clears it, so the agent still gets SIGTERM.
pub fn block_termination_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data and sigemptyset initializes it; pthread_sigmask only
    // changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// One "synced" line of the agent's log: what a sync did and how long it took, as the agent
/// timed it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncLine {
    pub full: bool,
    pub services: u64,
    pub writes: u64,
    pub took: Duration,
}

impl Agent {
    /// The syncs the agent logged between `from` and `to` (when the harness read the lines).
    pub fn syncs(&self, from: Instant, to: Instant) -> Vec<SyncLine> {
        self.lines()
            .iter()
            .filter(|(at, line)| (from..=to).contains(at) && line.contains(" synced "))
            .map(|(_, line)| {
                let field = |name: &str| {
                    line.split_whitespace()
                        .find_map(|word| word.strip_prefix(name)?.strip_prefix('='))
                        .unwrap_or_else(|| panic!("no {name}= in the sync line {line:?}"))
                };
                let number = |name: &str| {
                    field(name)
                        .parse()
                        .unwrap_or_else(|_| panic!("{name}= in {line:?}"))
                };
                SyncLine {
                    full: field("full") == "true",
                    services: number("services"),
                    writes: number("writes"),
                    took: parse_debug_duration(field("took"))
                        .unwrap_or_else(|| panic!("took= in {line:?}")),
                }
            })
            .collect()
    }
}

/// A `Duration`'s Debug text (`1.5ms`, `830.2µs`, `2.1s`, `950ns`).
pub fn parse_debug_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => number,
        "ms" => number / 1e3,
        "µs" | "us" => number / 1e6,
        "ns" => number / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

/// VmHWM (peak resident set) and VmRSS of a process, in KiB.
pub fn process_memory_kib(pid: u32) -> (u64, u64) {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {path}"))
    };
    (kib("VmHWM:"), kib("VmRSS:"))
}

/// SIGKILLs this process's children (an agent, clients, servers), found by their parent pid
/// in /proc: also one still starting, before the harness has handed out its pid. For the
/// signal-cleanup threads of benchmarks.
pub fn kill_children() {
    let me = std::process::id().to_string();
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Field 4, the parent pid, is the second after the parenthesized command name.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1));
        if parent == Some(me.as_str()) {
            // SAFETY: signalling a child of ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Removes a cgroup the harness made, after killing anything left in it; the kernel frees
/// a cgroup shortly after its last process exits, so removal is retried for a while.
pub fn remove_cgroup(cgroup: &Path) {
    let _ = fs::write(cgroup.join("cgroup.kill"), "1");
    for _ in 0..100 {
        match fs::remove_dir(cgroup) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// What a benchmark made and must remove if a signal ends it.
pub struct Leftovers {
    pub pin_dir: PathBuf,
    pub cgroup: PathBuf,
    /// Directories (manifests, scratch files) removed with everything in them.
    pub dirs: Vec<PathBuf>,
    /// Anything else, run after the child processes are killed (e.g. named namespaces).
    pub also: Option<Box<dyn FnOnce() + Send>>,
}

/// A signal would otherwise end a benchmark without its Drops: on SIGINT, SIGTERM or
/// SIGHUP (blocked in every thread by [`block_termination_signals`]) this kills the
/// process's children, removes `leftovers` and exits with 128 + the signal.
pub fn cleanup_on_signal(signals: libc::sigset_t, leftovers: Leftovers) {
    std::thread::spawn(move || {
        let mut signal = 0;
        // SAFETY: a valid signal set, blocked in every thread of this process.
        if unsafe { libc::sigwait(&signals, &mut signal) } != 0 {
            return;
        }
        eprintln!("signal {signal}: stopping child processes, removing pins, cgroup and files");
        kill_children();
        if let Some(also) = leftovers.also {
            also();
        }
        if let Err(e) = dataplane::cleanup(&leftovers.pin_dir) {
            eprintln!("cleanup of {}: {e}", leftovers.pin_dir.display());
        }
        remove_cgroup(&leftovers.cgroup);
        for dir in &leftovers.dirs {
            let _ = fs::remove_dir_all(dir);
        }
        std::process::exit(128 + signal);
    });
}
