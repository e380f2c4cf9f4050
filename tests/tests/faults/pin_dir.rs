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
    time::Duration,
};

use socklb_tests::{
    Agent, FREE_PORTS, KillOnDrop, LogFollower, ManifestDir, NamedServer, Sandbox, assert_logged,
    bpftool, eventually, privileges::chart_agent_minimal, run_to_exit,
};

const NET: u8 = 44;

fn vip() -> SocketAddr {
    SocketAddr::from(([10, 96, NET, 10], 80))
}

fn cluster(sandbox: &Sandbox) -> ManifestDir {
    ManifestDir::web_with_one_endpoint(sandbox, NET, &vip().ip().to_string())
}

fn wait_for_answer(sandbox: &Sandbox, what: &str) {
    let expected = format!("127.0.{NET}.1");
    eventually(what, Duration::from_secs(20), || {
        match sandbox.answering(vip(), 10) {
            got if got.len() == 1 && got.contains(&expected) => Ok(()),
            got => Err(format!("got {got:?}")),
        }
    });
}

/// The agent as the chart runs it, with a short handover wait.
fn agent(sandbox: &Sandbox, manifests: &ManifestDir, handover_wait: &str) -> Command {
    let mut command = sandbox.agent_command(chart_agent_minimal(), &manifests.path);
    command
        .args(["--handover-wait", handover_wait, "--min-sync-period", "0s"])
        .args(FREE_PORTS);
    command
}

/// Runs an agent that must refuse to start; its stderr.
fn refused(mut agent: Command) -> String {
    let (started, stderr) = run_to_exit(&mut agent, Duration::from_secs(30));
    assert!(!started, "the agent started:\n{stderr}");
    stderr
}

/// What is attached to the sandbox's cgroup, as bpftool lists it.
fn attached(sandbox: &Sandbox) -> String {
    let cgroup = sandbox.cgroup.as_os_str();
    bpftool(&["cgroup".as_ref(), "show".as_ref(), cgroup])
        .trim()
        .to_owned()
}

/// The sandbox of `test`, the manifests of the node, and the pin directory made with
/// `mode` before any agent ran.
fn pin_dir_made(test: &str, mode: u32) -> (Sandbox, ManifestDir) {
    let sandbox = Sandbox::new(test);
    let manifests = cluster(&sandbox);
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(&sandbox.pin_dir)
        .expect("make the pin directory");
    (sandbox, manifests)
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

#[test]
fn a_pin_directory_of_another_user_is_refused_and_nothing_is_attached() {
    let (sandbox, manifests) = pin_dir_made("pin-dir-owner", 0o755);
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
    // As an agent leaves it: 0700, with its lock.
    let (sandbox, manifests) = pin_dir_made("pin-dir-held", 0o700);
    let lock = sandbox.pin_dir.join("lock");
    std::fs::DirBuilder::new()
        .mode(0o600)
        .create(&lock)
        .expect("make the lock");
    let holder = KillOnDrop(hold_lock(&sandbox, &lock, 0));

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
    let old_agent = KillOnDrop(hold_lock(&sandbox, &sandbox.pin_dir, 0));
    let mut next = KillOnDrop(
        agent(&sandbox, &manifests, "30s")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start socklb"),
    );
    let mut log = LogFollower::new(&mut next.0);
    log.wait_for("waiting for it to exit");
    wait_for_answer(&sandbox, "while the new agent waits");
    drop(old_agent);
    log.wait_for("datapath attached; ready");
    wait_for_answer(&sandbox, "the new agent serves");
    let mode = std::fs::metadata(&sandbox.pin_dir)
        .expect("the pin directory")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "made private: {mode:o}");
    drop(next);

    // Again from 0755, now with a process of another user on the old lock.
    std::fs::set_permissions(&sandbox.pin_dir, std::fs::Permissions::from_mode(0o755))
        .expect("chmod 0755");
    let _squatter = KillOnDrop(hold_lock(&sandbox, &sandbox.pin_dir, 65534));
    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--handover-wait", "30s"],
    );
    wait_for_answer(&sandbox, "with another user on the old lock");
    assert_logged(
        &agent.stop(),
        &["a process of another user holds a lock on the pin directory"],
        "the passed-over holder is logged",
    );
}
