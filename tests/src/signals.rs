//! What a benchmark needs to end cleanly on a signal: termination signals blocked and
//! waited for on a thread of its own, its child processes killed, what it made removed.
use std::{fs, os::unix::process::CommandExt as _, path::PathBuf, process::Command};

use socklb_agent::dataplane;

use crate::sandbox::remove_cgroup;

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
/// spawned child inherits the mask: [`crate::agent::Agent`] clears it, so the agent still gets SIGTERM.
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

/// SIGKILLs this process's children (an agent, clients, servers), found by their parent pid
/// in /proc: also one still starting, before the harness has handed out its pid; and reaps
/// them. For the signal-cleanup threads of benchmarks.
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
            // SAFETY: signalling a child of ours, then reaping it: gone, it holds no lock
            // (an agent's on its pin directory, which cleanup waits for) and no file.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
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
