//! The test's private world: a network namespace of its own for the test's thread, a child
//! cgroup, a pin directory, and the datapath loaded and attached there with the agent
//! container's capabilities. Everything is removed in `Drop`, also when the test panics.
use std::{
    collections::BTreeSet,
    ffi::{CString, OsStr},
    fs,
    net::SocketAddr,
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use socklb_agent::dataplane::{self, Capacities, Config, Dataplane, DataplaneError};

use crate::{
    agent::{Source, agent_bin},
    clients::{Attempt, ProbeRun, probe_bin, probe_output, spawn_probe},
    privileges::{ContainerPrivileges, chart_agent, chart_agent_minimal, chart_cleanup},
    process::{run, stdout_of},
};

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

    /// Loads the datapath with this sandbox's pins and `capacities` instead of the default
    /// ones (a small map to fill, a larger one to grow into).
    pub fn load_with(&self, capacities: Capacities) -> Result<Dataplane, DataplaneError> {
        self.load(Config {
            capacities,
            ..self.config()
        })
    }

    /// Loads the datapath with the agent container's least capabilities (the chart's
    /// `closeSocketsInPods=false`), as such an agent would.
    pub fn load(&self, config: Config) -> Result<Dataplane, DataplaneError> {
        chart_agent_minimal().within(|| Dataplane::load(config))
    }

    /// Asserts that the pin directory does not exist; `why` says why it must not.
    pub fn assert_no_pins(&self, why: &str) {
        let left: Vec<_> = fs::read_dir(&self.pin_dir)
            .map(|entries| entries.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            !self.pin_dir.exists(),
            "{why}; {} holds {left:?}",
            self.pin_dir.display()
        );
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
    /// for tests of how the agent starts or refuses to (`Agent::start` waits for ready).
    pub fn agent_command(&self, privileges: &ContainerPrivileges, manifests: &Path) -> Command {
        let mut command = privileges.command(agent_bin());
        command
            .arg("run")
            .args(Source::File(manifests).args())
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

    /// The internal frontend on `address` as [`Self::inspect`] shows it, if the maps hold
    /// one.
    pub fn inspected_frontend(&self, address: &str) -> Option<serde_json::Value> {
        let inspection = self.inspect();
        inspection["frontends"]
            .as_array()?
            .iter()
            .find(|f| f["frontend"]["address"] == address && f["frontend"]["scope"] == "internal")
            .cloned()
    }

    /// The path `socklb inspect` (run as root: it enters the pods' network namespaces) finds
    /// serving the network namespace pinned as `name`: by its name, as other tests' pods may
    /// hold the same address.
    pub fn inspected_pod_path(&self, name: &str) -> String {
        let inspected: serde_json::Value =
            serde_json::from_str(&self.socklb(&["inspect", "-o", "json"]))
                .expect("socklb inspect's JSON");
        let pinned = format!("/run/netns/{name}");
        inspected["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|pod| pod["namespace"] == pinned.as_str())
            .map(|pod| pod["path"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_else(|| panic!("inspect shows no namespace {pinned}: {inspected}"))
    }

    /// `socklb inspect -o json` run with `privileges`.
    pub fn inspect_as(&self, privileges: &ContainerPrivileges) -> serde_json::Value {
        let output = stdout_of(
            privileges
                .command(agent_bin())
                .args(["inspect", "-o", "json", "--bpffs"])
                .arg(&self.pin_dir),
        );
        serde_json::from_str(&output).expect("socklb inspect's JSON")
    }

    /// `socklb <args> --bpffs <this sandbox's pins>` run as root (inspect, cleanup), which
    /// must succeed: its output.
    pub fn socklb(&self, args: &[&str]) -> String {
        stdout_of(
            Command::new(agent_bin())
                .args(args)
                .arg("--bpffs")
                .arg(&self.pin_dir),
        )
    }

    /// A command that runs inside this sandbox's cgroup (and network namespace).
    pub fn in_cgroup(&self, program: impl AsRef<OsStr>) -> Command {
        command_in_cgroup(&self.cgroup, program)
    }

    /// Runs the probe inside the cgroup and returns its attempts.
    pub fn probe(&self, mode: &str, target: SocketAddr, count: u32) -> Vec<Attempt> {
        probe_output(self.in_cgroup(probe_bin()).args([
            mode,
            &target.to_string(),
            &count.to_string(),
        ]))
    }

    /// The servers that answered `count` connections to `target` from inside the cgroup,
    /// each by its name, a failure as "error: ERRNO".
    pub fn answering(&self, target: SocketAddr, count: u32) -> BTreeSet<String> {
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
        probe_output(Command::new(probe_bin()).args([
            mode,
            &target.to_string(),
            &count.to_string(),
        ]))
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
        spawn_probe(self.in_cgroup(probe_bin()).args([
            mode,
            &target.to_string(),
            until,
            &pause_ms.to_string(),
        ]))
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
pub fn command_in_cgroup(cgroup: &Path, program: impl AsRef<OsStr>) -> Command {
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
