//! The real agent, `socklb run`, started as the Helm chart runs it, its log read as it
//! writes it, and the binaries of this target directory that the tests run.
use std::{
    ffi::OsStr,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, ChildStderr, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::{
    privileges::{ContainerPrivileges, chart_agent_minimal},
    sandbox::Sandbox,
    signals::unblock_signals_on_exec,
};

/// The agent binary, built by `./x test` before the tests run.
pub fn agent_bin() -> PathBuf {
    target_bin("socklb", "SOCKLB_BIN")
}

/// The log of an agent started by a test's own command (its stderr piped), read line by
/// line as the agent writes it.
pub struct LogFollower(std::io::Lines<BufReader<ChildStderr>>);

impl LogFollower {
    /// Takes over the stderr of `agent`.
    pub fn new(agent: &mut Child) -> Self {
        Self(BufReader::new(agent.stderr.take().expect("the agent's stderr, piped")).lines())
    }

    /// The rest of the log, read on a thread (the agent never blocks on a full pipe), whole
    /// once the agent has exited.
    pub fn rest(self) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            self.0
                .map_while(Result::ok)
                .map(|line| line + "\n")
                .collect()
        })
    }

    /// Reads the log until a line that contains `text`; fails if the agent exits first.
    pub fn wait_for(&mut self, text: &str) {
        for line in self.0.by_ref() {
            if line.expect("the agent's log").contains(text) {
                return;
            }
        }
        panic!("the agent exited before logging {text:?}");
    }
}

/// Flags that bind the agent's health and metrics servers to any free port: for a second
/// agent beside another, or one expected to stop at start.
pub const FREE_PORTS: [&str; 4] = [
    "--healthz-bind-address",
    "127.0.0.1:0",
    "--metrics-bind-address",
    "127.0.0.1:0",
];

/// Fails unless `log` (an agent's) holds every one of `parts`, saying `what` it should
/// have shown.
pub fn assert_logged(log: &str, parts: &[&str], what: &str) {
    assert!(
        parts.iter().all(|part| log.contains(part)),
        "{what} ({parts:?}):\n{log}"
    );
}

/// `socklb explain` over the manifests in `manifests`, as node `node` sees them; add an
/// output format or a Service filter.
pub fn explain_command(manifests: &Path, node: &str) -> Command {
    let mut command = Command::new(agent_bin());
    command
        .args([
            "explain",
            "--source",
            "file",
            "--node-name",
            node,
            "--manifests",
        ])
        .arg(manifests);
    command
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

/// Where an agent reads the cluster state.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// The file source, on a manifests directory.
    File(&'a Path),
    /// The kube source, on the API server of a kubeconfig.
    Kube(&'a Path),
}

impl<'a> Source<'a> {
    /// `socklb run`'s arguments for this source.
    pub(crate) fn args(self) -> [&'a OsStr; 4] {
        let (source, flag, path) = match self {
            Self::File(manifests) => ("file", "--manifests", manifests),
            Self::Kube(kubeconfig) => ("kube", "--kubeconfig", kubeconfig),
        };
        [
            "--source".as_ref(),
            source.as_ref(),
            flag.as_ref(),
            path.as_os_str(),
        ]
    }
}

/// The real agent, `socklb run`, in the sandbox; killed if still running when dropped.
/// It programs every change at once (`--min-sync-period 0s`) unless `extra` sets the flag.
pub struct Agent {
    child: Option<Child>,
    pid: u32,
    started: Instant,
    /// Every log line, with when it was read.
    log: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Agent {
    /// Starts the agent on `manifests` as node `node` and waits until it is ready.
    pub fn start(sandbox: &Sandbox, manifests: &Path, node: &str, extra: &[&str]) -> Self {
        Self::start_as(chart_agent_minimal(), sandbox, manifests, node, extra)
    }

    /// Starts node-a's agent on `manifests` after a moment with none (the pinned links keep
    /// the programs attached meanwhile), as after a restart, and waits for its first sync.
    pub fn start_after_a_gap(sandbox: &Sandbox, manifests: &Path) -> Self {
        std::thread::sleep(Duration::from_millis(300));
        let agent = Self::start(sandbox, manifests, "node-a", &[]);
        agent.wait_for_log("synced", 1);
        agent
    }

    /// Starts the agent on the API server of `kubeconfig` and waits until it is ready.
    pub fn start_kube(sandbox: &Sandbox, kubeconfig: &Path, node: &str, extra: &[&str]) -> Self {
        let state = (sandbox.pin_dir.as_path(), sandbox.cgroup.as_path());
        Self::start_at(state, Source::Kube(kubeconfig), node, extra)
    }

    /// Starts the agent on `source` with its own pins and cgroup `state` (a second node of
    /// a test); it runs in the network namespace of the calling thread.
    pub fn start_at(state: (&Path, &Path), source: Source, node: &str, extra: &[&str]) -> Self {
        Self::start_with(chart_agent_minimal(), state, source, node, extra)
    }

    /// Starts the agent on `manifests` as `privileges` say instead of the chart's defaults.
    pub fn start_as(
        privileges: &ContainerPrivileges,
        sandbox: &Sandbox,
        manifests: &Path,
        node: &str,
        extra: &[&str],
    ) -> Self {
        let state = (sandbox.pin_dir.as_path(), sandbox.cgroup.as_path());
        Self::start_with(privileges, state, Source::File(manifests), node, extra)
    }

    /// Starts `socklb run` with its pins and cgroup `state`, on `source`, as `privileges`
    /// say, and waits until it is ready; it runs in the network namespace of the calling
    /// thread.
    pub fn start_with(
        privileges: &ContainerPrivileges,
        state: (&Path, &Path),
        source: Source,
        node: &str,
        extra: &[&str],
    ) -> Self {
        Self::start_binary(&agent_bin(), privileges, state, source, node, extra)
    }

    /// [`start_with`](Self::start_with) for the agent binary at `binary` (a benchmark
    /// comparing two builds).
    pub fn start_binary(
        binary: &Path,
        privileges: &ContainerPrivileges,
        state: (&Path, &Path),
        source: Source,
        node: &str,
        extra: &[&str],
    ) -> Self {
        let (agent, ready) = Self::spawn(binary, privileges, state, source, node, extra);
        let ready = ready.recv_timeout(Duration::from_secs(60)).unwrap_or(false);
        assert!(ready, "the agent did not become ready:\n{}", agent.log());
        agent
    }

    /// Starts the agent on the kube source of `kubeconfig` as the chart runs it, without
    /// waiting until it is ready (its API server may be out of reach).
    pub fn spawn_kube(sandbox: &Sandbox, kubeconfig: &Path, node: &str, extra: &[&str]) -> Self {
        let state = (sandbox.pin_dir.as_path(), sandbox.cgroup.as_path());
        let source = Source::Kube(kubeconfig);
        Self::spawn(
            &agent_bin(),
            chart_agent_minimal(),
            state,
            source,
            node,
            extra,
        )
        .0
    }

    /// The agent started, and what says once whether it became ready (`false`: it exited
    /// before).
    fn spawn(
        binary: &Path,
        privileges: &ContainerPrivileges,
        (pin_dir, cgroup): (&Path, &Path),
        source: Source,
        node: &str,
        extra: &[&str],
    ) -> (Self, std::sync::mpsc::Receiver<bool>) {
        let min_sync_period: &[&str] = if extra.contains(&"--min-sync-period") {
            &[]
        } else {
            &["--min-sync-period", "0s"]
        };
        // As the chart runs it: its user, capabilities and no_new_privs.
        let mut command = privileges.command(binary);
        unblock_signals_on_exec(&mut command);
        let started = Instant::now();
        let mut child = command
            .arg("run")
            .args(source.args())
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
        let log = Arc::new(Mutex::new(Vec::new()));
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
        (agent, ready_rx)
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
        self.wait_for_log_within(text, count, Duration::from_secs(30));
    }

    /// [`Self::wait_for_log`] with a deadline of `within` (a large change: parsing and
    /// programming tens of thousands of objects in a debug build on a busy machine).
    pub fn wait_for_log_within(&self, text: &str, count: usize, within: Duration) {
        let deadline = std::time::Instant::now() + within;
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

    /// How long the kernel took over the agent's programs, as the agent logged it
    /// (`programs verified and loaded by the kernel took=`), once it has. On a fresh node
    /// that is inside the first sync, which waits for it.
    pub fn verifier_took(&self) -> Option<Duration> {
        self.lines()
            .iter()
            .find(|(_, line)| line.contains("programs verified and loaded by the kernel"))
            .and_then(|(_, line)| {
                let took = line
                    .split_whitespace()
                    .find_map(|word| word.strip_prefix("took="))?;
                parse_debug_duration(took)
            })
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
