//! Network namespaces held by file descriptors only: they, their rules, conntrack tables
//! and veth pairs disappear with this process however it ends. Commands run inside them.
use std::{
    fs::File,
    io,
    os::{
        fd::{AsRawFd as _, RawFd},
        unix::process::CommandExt as _,
    },
    process::Command,
    ptr,
};

use anyhow::{Context as _, ensure};

/// A new network namespace, alive as long as the returned file (or a process in it) is.
pub fn new_netns() -> anyhow::Result<File> {
    std::thread::spawn(|| -> anyhow::Result<File> {
        // SAFETY: unshare affects only this short-lived thread.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error())
                .context("unshare(CLONE_NEWNET): creating network namespaces needs root");
        }
        let netns = File::open("/proc/thread-self/ns/net").context("open the new namespace")?;
        Ok(netns)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the namespace thread panicked"))?
}

/// Moves the calling thread into `netns`.
pub fn enter(netns: &File) -> anyhow::Result<()> {
    // SAFETY: setns with a namespace fd we hold; affects only this thread.
    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error()).context("setns into a benchmark namespace");
    }
    Ok(())
}

/// A command that runs in `netns`, killed if this process dies, with the signals this
/// process blocks (for its cleanup thread) unblocked again.
pub fn in_netns(netns: &File, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let fd: RawFd = netns.as_raw_fd();
    let mut command = Command::new(program);
    // SAFETY: only async-signal-safe calls (setns, prctl, sigemptyset, pthread_sigmask)
    // between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, ptr::null_mut());
            Ok(())
        });
    }
    command
}

pub fn run_in(netns: &File, program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = in_netns(netns, program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program}: is it installed? (`cargo xtask setup`)"))?;
    ensure!(
        output.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// A path that opens what `file` is open on, also for another process (a namespace this
/// process holds only by its descriptor).
pub fn fd_path(file: &File) -> String {
    format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd())
}

/// One end of a veth pair: its namespace, device name and address (with prefix length).
pub struct End<'a> {
    pub netns: &'a File,
    pub device: &'a str,
    pub address: &'a str,
}

/// A veth pair between two namespaces, addressed and up.
pub fn veth(here: &End<'_>, there: &End<'_>) -> anyhow::Result<()> {
    let there_ns = fd_path(there.netns);
    run_in(
        here.netns,
        "ip",
        &[
            "link",
            "add",
            here.device,
            "type",
            "veth",
            "peer",
            "name",
            there.device,
            "netns",
            &there_ns,
        ],
    )?;
    for end in [here, there] {
        run_in(
            end.netns,
            "ip",
            &["addr", "add", end.address, "dev", end.device],
        )?;
        run_in(end.netns, "ip", &["link", "set", end.device, "up"])?;
    }
    Ok(())
}
