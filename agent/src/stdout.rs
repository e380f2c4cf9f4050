//! Standard output as the Unix tools write it: `socklb inspect | head` ends quietly when
//! `head` goes away, like `cat`, `bpftool` and `kubectl`, instead of panicking.
//!
//! Rust ignores SIGPIPE, so a write to a pipe whose reader is gone fails with EPIPE (and
//! `println!` panics on it). The commands write through [`print()`], which turns EPIPE into
//! [`StdoutError::ReaderGone`]; the command then unwinds normally (a trace session gives its
//! lease back on the way) and [`die_of_sigpipe`] ends the process as the kernel would have
//! ended a C tool: killed by SIGPIPE, no message, status 141 in the shell. Dying of the
//! signal rather than exiting with some code keeps `set -o pipefail` scripts and process
//! supervisors seeing what they see from every other tool in the pipe.
use std::{
    io::{self, Write as _},
    os::fd::AsRawFd as _,
    process::ExitCode,
    time::Duration,
};

#[derive(Debug, thiserror::Error)]
pub enum StdoutError {
    /// The pipe's reader exited (EPIPE): not an error to report.
    #[error("standard output's reader went away")]
    ReaderGone,
    #[error("cannot write to standard output (a full disk, or a closed terminal?)")]
    Write(#[source] io::Error),
}

impl From<io::Error> for StdoutError {
    fn from(error: io::Error) -> Self {
        if error.kind() == io::ErrorKind::BrokenPipe {
            Self::ReaderGone
        } else {
            Self::Write(error)
        }
    }
}

/// Writes `text` to standard output and flushes it.
pub fn print(text: &str) -> Result<(), StdoutError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// Writes `text` and a newline to standard output.
pub fn println(text: &str) -> Result<(), StdoutError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// Whether `error` (or one of its causes) is standard output's reader going away. Only
/// that: a broken pipe elsewhere (a socket, a netlink peer) is an error to report.
pub fn is_reader_gone(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<StdoutError>(),
            Some(StdoutError::ReaderGone)
        )
    })
}

/// A note for the operator on standard error. Unlike `eprintln!`, never panics: with
/// `2>&1 | head` standard error's reader goes away too.
pub fn note(text: &str) {
    let _ = writeln!(io::stderr(), "{text}");
}

/// Whether standard output is a pipe or socket whose reader has gone (poll reports POLLERR
/// or POLLHUP on it), so that a command that prints rarely (`socklb trace` with little
/// traffic) notices at once, not at its next write. A terminal or a file never is.
pub fn reader_gone_now() -> bool {
    let mut fd = libc::pollfd {
        fd: io::stdout().as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let ready = unsafe { libc::poll(&raw mut fd, 1, 0) };
    ready > 0 && fd.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

/// Resolves once standard output's reader has gone (checked every 100 ms).
pub async fn reader_gone() {
    let mut check = tokio::time::interval(Duration::from_millis(100));
    loop {
        check.tick().await;
        if reader_gone_now() {
            return;
        }
    }
}

/// Ends the process as a write to a closed pipe ends a C program: killed by SIGPIPE. Only
/// returns (with status 141, the shell's number for it) if the signal could not be raised.
pub fn die_of_sigpipe() -> ExitCode {
    // SAFETY: restoring the default action of one signal and raising it; nothing is left
    // to run that needs the Rust runtime's state (the command has unwound).
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    ExitCode::from(141)
}
