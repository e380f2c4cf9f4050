//! The pin directory as a local user could tamper with it: made first by another user (a
//! bpffs mounted 1777 allows it), or its lock held by a process that is not an agent. The
//! agent refuses the first and names the holder of the second, attaching nothing; and a pin
//! directory of an earlier agent (0755, the directory itself locked) is still taken over
//! without a gap in service, made 0700.
use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox, node_yaml, privileges::chart_agent_minimal,
    service_yaml, slice_yaml,
};

const NET: u8 = 44;

fn vip() -> SocketAddr {
    SocketAddr::from(([10, 96, NET, 10], 80))
}

fn cluster(sandbox: &Sandbox) -> ManifestDir {
    let manifests = ManifestDir::new(sandbox);
    manifests.write(
        "node.yaml",
        &node_yaml("node-a", "zone-a", &format!("192.168.{NET}.1")),
    );
    manifests.write(
        "web.yaml",
        &service_yaml("web", &vip().ip().to_string(), 80, ""),
    );
    let endpoint = format!("127.0.{NET}.1");
    manifests.write(
        "slice.yaml",
        &slice_yaml(
            "web-1",
            "web",
            8080,
            &[(&endpoint, "node-a", "zone-a", "")],
            false,
        ),
    );
    manifests
}

fn wait_for_answer(sandbox: &Sandbox, what: &str) {
    let expected = format!("127.0.{NET}.1");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = sandbox.answering(vip(), 10);
        if got.len() == 1 && got.contains(&expected) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: got {got:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The agent as the chart runs it, with a short handover wait; its stderr piped.
fn agent(sandbox: &Sandbox, manifests: &ManifestDir, handover_wait: &str) -> Child {
    sandbox
        .agent_command(chart_agent_minimal(), &manifests.path)
        .args(["--handover-wait", handover_wait, "--min-sync-period", "0s"])
        .args(["--healthz-bind-address", "127.0.0.1:0"])
        .args(["--metrics-bind-address", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start socklb")
}

/// Waits for an agent that must refuse to start; its stderr.
fn refused(mut child: Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait for socklb").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("socklb's output");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "the agent started:\n{stderr}");
    stderr
}

/// What is attached to the sandbox's cgroup, as bpftool lists it.
fn attached(sandbox: &Sandbox) -> String {
    let output = Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(&sandbox.cgroup)
        .output()
        .expect("prerequisite missing: bpftool");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the pin directory")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// `flock -x` on `path` by a process of the sandbox's cgroup (killed with it) running as
/// `user`, once it holds the lock. The holder's pid is the child's (`--no-fork`).
fn hold_lock(sandbox: &Sandbox, path: &Path, user: u32) -> Child {
    let mut command = sandbox.in_cgroup("setpriv");
    command
        .arg(format!("--reuid={user}"))
        .arg(format!("--regid={user}"))
        .args(["--clear-groups", "flock", "--no-fork", "-x"])
        .arg(path)
        .args(["sh", "-c", "echo locked; exec sleep 600"])
        .stdout(Stdio::piped());
    let mut holder = command
        .spawn()
        .expect("prerequisite missing: setpriv and flock (util-linux)");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the holder's output");
    assert_eq!(line.trim(), "locked", "the holder did not take the lock");
    holder
}

/// Kills and reaps a lock holder, also when the test fails.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_pin_directory_of_another_user_is_refused_and_nothing_is_attached() {
    let sandbox = Sandbox::new("pin-dir-owner");
    let manifests = cluster(&sandbox);
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&sandbox.pin_dir)
        .expect("make the pin directory");
    std::os::unix::fs::chown(&sandbox.pin_dir, Some(65534), Some(65534))
        .expect("give the pin directory to nobody");
    /// Back to root, so that the sandbox's cleanup removes it.
    struct Owned<'a>(&'a Path);
    impl Drop for Owned<'_> {
        fn drop(&mut self) {
            let _ = std::os::unix::fs::chown(self.0, Some(0), Some(0));
        }
    }
    let _owned = Owned(&sandbox.pin_dir);

    let stderr = refused(agent(&sandbox, &manifests, "1s"));
    assert!(
        stderr.contains("is owned by uid 65534, not by this agent (uid 0)")
            && stderr.contains("--bpffs"),
        "the error names the owner and the way out:\n{stderr}"
    );
    assert_eq!(
        entries(&sandbox.pin_dir),
        Vec::<String>::new(),
        "nothing pinned"
    );
    assert_eq!(attached(&sandbox), "", "nothing attached");
}

#[test]
fn a_lock_held_by_another_process_is_refused_naming_it_and_nothing_is_attached() {
    let sandbox = Sandbox::new("pin-dir-held");
    let manifests = cluster(&sandbox);
    // As an agent leaves it: 0700, with its lock.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&sandbox.pin_dir)
        .expect("make the pin directory");
    let lock = sandbox.pin_dir.join("lock");
    std::fs::DirBuilder::new()
        .mode(0o600)
        .create(&lock)
        .expect("make the lock");
    let holder = Holder(hold_lock(&sandbox, &lock, 0));

    let stderr = refused(agent(&sandbox, &manifests, "1s"));
    assert!(
        stderr.contains("another socklb agent still holds")
            && stderr.contains(&format!("held by pid {} \"sleep\"", holder.0.id())),
        "the error names the holder:\n{stderr}"
    );
    assert_eq!(entries(&sandbox.pin_dir), ["lock"], "nothing pinned");
    assert_eq!(attached(&sandbox), "", "nothing attached");
}

/// An upgrade: the pins of an agent of the earlier version, whose directory is 0755 and
/// locked as a directory (here by the old agent's stand-in while the old programs keep
/// serving). The new agent waits for it like for any older agent, then serves, and the
/// directory is 0700. A process of another user holding that old lock (it opened the
/// directory while it was 0755) is no agent: passed over, it blocks nothing.
#[test]
fn an_earlier_agents_pin_directory_is_taken_over_and_made_private() {
    let sandbox = Sandbox::new("pin-dir-upgrade");
    let _servers = NamedServer::numbered(NET, 1);
    let manifests = cluster(&sandbox);
    let old = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    wait_for_answer(&sandbox, "the old agent serves");
    old.stop();
    // The old version's layout: no lock entry, 0755, the directory locked by its agent.
    std::fs::remove_dir(sandbox.pin_dir.join("lock")).expect("remove the lock");
    std::fs::set_permissions(&sandbox.pin_dir, std::fs::Permissions::from_mode(0o755))
        .expect("chmod 0755");
    let old_agent = Holder(hold_lock(&sandbox, &sandbox.pin_dir, 0));
    let mut next = agent(&sandbox, &manifests, "30s");
    let mut lines = BufReader::new(next.stderr.take().expect("stderr")).lines();
    let mut wait_for = |text: &str| {
        for line in lines.by_ref() {
            if line.expect("the new agent's log").contains(text) {
                return;
            }
        }
        panic!("the new agent exited before logging {text:?}");
    };
    wait_for("waiting for it to exit");
    wait_for_answer(&sandbox, "while the new agent waits");
    drop(old_agent);
    wait_for("datapath attached; ready");
    wait_for_answer(&sandbox, "the new agent serves");
    let mode = std::fs::metadata(&sandbox.pin_dir)
        .expect("the pin directory")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "made private: {mode:o}");
    let _ = next.kill();
    let _ = next.wait();

    // Again from 0755, now with a process of another user on the old lock.
    std::fs::set_permissions(&sandbox.pin_dir, std::fs::Permissions::from_mode(0o755))
        .expect("chmod 0755");
    let _squatter = Holder(hold_lock(&sandbox, &sandbox.pin_dir, 65534));
    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--handover-wait", "30s"],
    );
    wait_for_answer(&sandbox, "with another user on the old lock");
    let log = agent.stop();
    assert!(
        log.contains("a process of another user holds a lock on the pin directory"),
        "the passed-over holder is logged:\n{log}"
    );
}
