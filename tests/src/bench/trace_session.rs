//! A `socklb trace -o json` session that runs while a benchmark measures, its events
//! discarded: what a running session costs the programs (`--trace on`).
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
};

/// A running session; [`TraceSession::stop`] ends it and prints what it saw, and so does
/// dropping it (a benchmark that failed half way).
pub struct TraceSession(Child);

impl TraceSession {
    /// Starts a session on the datapath pinned at `pin_dir`, with `flags` added (e.g.
    /// `--packets`), and waits until it traces.
    pub fn start(pin_dir: &Path, flags: &[&str]) -> Self {
        let mut command = Command::new(crate::agent_bin());
        crate::unblock_signals_on_exec(&mut command);
        let mut child = command
            .args(["trace", "-o", "json", "--bpffs"])
            .arg(pin_dir)
            .args(flags)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start socklb trace");
        let stderr = child.stderr.take().expect("the trace's stderr");
        let mut lines = BufReader::new(stderr).lines();
        let ready = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(
            ready.contains("tracing"),
            "the trace did not start: {ready}"
        );
        // The summary line (events shown and lost) when it ends.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                eprintln!("trace: {line}");
            }
        });
        Self(child)
    }

    /// SIGTERM: the session gives its lease back and prints what it saw.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for TraceSession {
    fn drop(&mut self) {
        // SAFETY: signalling our own child, not yet waited for.
        unsafe { libc::kill(self.0.id().cast_signed(), libc::SIGTERM) };
        let _ = self.0.wait();
    }
}
