//! The clients' side of a test: the `socklb-probe` client's attempts (one JSON line each),
//! probes run in the background, and the checks and tallies over their attempts.
use std::{
    collections::{BTreeMap, BTreeSet},
    io::Read,
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread::JoinHandle,
};

use serde::Deserialize;

use crate::agent::target_bin;

/// Runs the probe `command` (its arguments given) to its end and returns its attempts.
pub(crate) fn probe_output(command: &mut Command) -> Vec<Attempt> {
    let output = command.output().expect("run socklb-probe");
    parse_attempts(&output.stdout, &output.stderr)
}

/// Starts the probe `command` (its arguments given) in the background.
pub(crate) fn spawn_probe(command: &mut Command) -> ProbeRun {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn socklb-probe");
    // Read as it writes: a full pipe would stop a long-running probe's attempts until the
    // test collects them.
    let stdout = drain(child.stdout.take().expect("probe stdout"));
    let stderr = drain(child.stderr.take().expect("probe stderr"));
    ProbeRun {
        child: Some(child),
        stdout: Some(stdout),
        stderr: Some(stderr),
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// A probe started in the background.
pub struct ProbeRun {
    child: Option<Child>,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl ProbeRun {
    /// Whether the probe is still making attempts.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    pub fn wait(mut self) -> Vec<Attempt> {
        self.finish(false)
    }

    /// Stops a probe that still runs (a looping client) and returns its attempts so far (it
    /// writes one line per attempt, so none is cut).
    pub fn stop(mut self) -> Vec<Attempt> {
        self.finish(true)
    }

    fn finish(&mut self, kill: bool) -> Vec<Attempt> {
        let mut child = self.child.take().expect("probe child");
        if kill {
            let _ = child.kill();
        }
        child.wait().expect("wait for socklb-probe");
        let collected = |pipe: Option<JoinHandle<Vec<u8>>>| {
            pipe.expect("probe pipe")
                .join()
                .expect("read socklb-probe's output")
        };
        let stdout = collected(self.stdout.take());
        let stderr = collected(self.stderr.take());
        parse_attempts(&stdout, &stderr)
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

/// The client saw `peer` (a VIP: translation is invisible to it) as the other end of every
/// one of `attempts`.
pub fn assert_peer(attempts: &[Attempt], peer: &str, what: &str) {
    for attempt in attempts {
        assert_eq!(attempt.peer.as_deref(), Some(peer), "{what}: {attempt:?}");
    }
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

pub(crate) fn parse_attempts(stdout: &[u8], stderr: &[u8]) -> Vec<Attempt> {
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
/// The `socklb-hold` client (its source: `src/bin/hold.rs`).
pub fn hold_bin() -> PathBuf {
    target_bin("socklb-hold", "SOCKLB_HOLD_BIN")
}

/// The service-mesh sidecar of the tests (`socklb-mesh-proxy`).
pub fn mesh_proxy_bin() -> PathBuf {
    target_bin("socklb-mesh-proxy", "SOCKLB_MESH_PROXY_BIN")
}

pub(crate) fn probe_bin() -> PathBuf {
    target_bin("socklb-probe", "SOCKLB_PROBE_BIN")
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
    pub fn possible(&self, attempt: &Attempt) -> BTreeSet<usize> {
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

/// Counts attempts per reply.
pub fn tally(attempts: &[Attempt]) -> BTreeMap<String, usize> {
    let mut tally = BTreeMap::new();
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
