//! Named network namespaces for tests that need several hosts (a client, nodes, pods):
//! created with `ip netns add`, removed in `Drop` with every process still inside killed.
use std::{
    fs,
    net::{SocketAddr, TcpListener, UdpSocket},
    os::fd::AsRawFd as _,
    path::PathBuf,
    process::{Command, Output},
    time::Duration,
};

use crate::{
    clients::{Attempt, ProbeRun, probe_bin, probe_output, spawn_probe},
    process::run,
};

pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A new namespace with loopback up; `name` must be unique on the machine (prefix it
    /// with the test's name and process id).
    pub fn new(name: &str) -> Self {
        run(Command::new("ip").args(["netns", "add", name]));
        let netns = Self {
            name: name.to_owned(),
        };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    /// Runs `ip -n <name> <args>`, panicking with its output if it fails.
    pub fn ip<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) {
        run(Command::new("ip").args(["-n", &self.name]).args(args));
    }

    /// Sets a sysctl inside the namespace, e.g. `net.ipv4.ip_forward=1`.
    pub fn sysctl(&self, setting: &str) {
        run(self.command("sysctl").args(["-qw", setting]));
    }

    /// A command that runs inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name]).arg(program);
        command
    }

    /// Runs `program args` inside the namespace and returns its output, whatever its status.
    pub fn output(&self, program: &str, args: &[&str]) -> Output {
        self.command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run {program} in {}: {e}", self.name))
    }

    /// Runs the probe client inside the namespace: `count` attempts of `mode` to `target`.
    pub fn probe(&self, mode: &str, target: &str, count: u32) -> Vec<Attempt> {
        probe_output(
            self.command(probe_bin())
                .args([mode, target, &count.to_string()]),
        )
    }

    /// As [`Self::probe`], every attempt's socket bound to `source_port` (one flow to
    /// conntrack, as `nc -p` makes).
    pub fn probe_from(
        &self,
        mode: &str,
        target: &str,
        count: u32,
        source_port: u16,
    ) -> Vec<Attempt> {
        probe_output(self.command(probe_bin()).args([
            mode,
            target,
            &count.to_string(),
            "0",
            &source_port.to_string(),
        ]))
    }

    /// Starts the probe client inside the namespace in the background: attempts of `mode` to
    /// `target`, `pause_ms` apart, for `duration` (whole seconds) or until stopped.
    pub fn spawn_probe_for(
        &self,
        mode: &str,
        target: &str,
        duration: Duration,
        pause_ms: u32,
    ) -> ProbeRun {
        spawn_probe(
            self.command(probe_bin())
                .args([mode, target])
                .arg(format!("{}s", duration.as_secs()))
                .arg(pause_ms.to_string()),
        )
    }

    /// Runs `f` on a thread inside the namespace: sockets it creates live there (and keep
    /// living there when handed back).
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = self.path();
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file = fs::File::open(&path)
                        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
                    // SAFETY: setns with a namespace fd we opened; affects only this thread,
                    // which ends when `f` returns.
                    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                    assert_eq!(rc, 0, "setns {}", path.display());
                    f()
                })
                .join()
                .expect("thread inside the namespace panicked")
        })
    }

    /// A TCP listener bound to `addr` inside the namespace.
    pub fn tcp_listener(&self, addr: SocketAddr) -> TcpListener {
        self.enter(|| {
            TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {}: {e}", self.name))
        })
    }

    /// A UDP socket bound to `addr` inside the namespace, whose reads give up after
    /// `read_timeout` (a server's loop checks whether to stop that often).
    pub fn udp_socket(&self, addr: SocketAddr, read_timeout: Duration) -> UdpSocket {
        let socket = self.enter(|| {
            UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {}: {e}", self.name))
        });
        socket
            .set_read_timeout(Some(read_timeout))
            .expect("a read timeout");
        socket
    }

    fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
}

/// `ip` arguments that add a veth pair: `device` where `ip` runs, and its peer `peer` in
/// the namespace `peer_netns`.
pub fn veth<'a>(device: &'a str, peer: &'a str, peer_netns: &'a str) -> [&'a str; 10] {
    [
        "link", "add", device, "type", "veth", "peer", "name", peer, "netns", peer_netns,
    ]
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Processes left inside (servers of a failed test) would keep the namespace alive.
        if let Ok(output) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&output.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: plain kill of a process inside our own namespace.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
