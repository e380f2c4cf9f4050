//! Drives `socklb-hold` (a client holding one connected socket) from a test: commands in,
//! one JSON line out per command, each awaited with a deadline.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use serde::Deserialize;

/// One line of `socklb-hold`.
#[derive(Debug, Deserialize)]
pub struct Held {
    pub event: String,
    pub reply: Option<String>,
    pub error: Option<String>,
    pub peer: Option<String>,
    pub reconnected: bool,
}

/// A running `socklb-hold`, killed when dropped.
pub struct Holder {
    pub what: String,
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

/// How long a line may take: a `wait` blocks up to 30 s in the client, more than any
/// sweep should take.
const LINE_DEADLINE: Duration = Duration::from_secs(40);

impl Holder {
    /// Starts `command` (a `socklb-hold` command line, e.g. inside a cgroup and a
    /// namespace) and returns it with its first line (the connect and first exchange).
    pub fn start(what: &str, mut command: Command) -> (Self, Held) {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start socklb-hold ({what}): {e}"));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut holder = Self {
            what: what.to_owned(),
            child,
            stdin,
            lines,
        };
        let first = holder.line();
        (holder, first)
    }

    /// Sends a command (`wait`, `ping`) without waiting for its line.
    pub fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("command {command} to {}: {e}", self.what));
    }

    /// The next line, within the deadline.
    pub fn line(&mut self) -> Held {
        let line = self
            .lines
            .recv_timeout(LINE_DEADLINE)
            .unwrap_or_else(|e| panic!("{}: no line from socklb-hold: {e}", self.what));
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("{}: bad line {line:?}: {e}", self.what))
    }

    /// The client's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `command` and returns its line.
    pub fn ask(&mut self, command: &str) -> Held {
        self.send(command);
        self.line()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
