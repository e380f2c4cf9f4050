//! Processes the tests run: commands that must succeed, commands expected to stop on their
//! own (an agent that refuses to start), and children that must not outlive the test.
use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// Runs `command`, failing the test with its standard error if it does not succeed.
pub fn run(command: &mut Command) {
    stdout_of(command);
}

/// Runs `command` and returns its standard output, failing the test with its standard
/// error if it cannot start or does not succeed.
pub fn stdout_of(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `command`, a process expected to stop by itself (an agent that refuses to start),
/// and returns whether it succeeded and its standard error. One that still runs after
/// `timeout` is killed, so that the test fails on what it printed instead of hanging.
pub fn run_to_exit(command: &mut Command, timeout: Duration) -> (bool, String) {
    let mut child = command
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    let deadline = Instant::now() + timeout;
    while child.try_wait().expect("wait for the child").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("the child's output");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A child process (a server, a client, a socket holder) killed and reaped when dropped,
/// also when the test panics.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
