//! Waiting for what happens asynchronously (an agent following an edit, the kernel
//! expiring a flow): a check repeated until it passes, and a failure that says what was
//! last seen when it never does.
use std::time::{Duration, Instant};

/// How long [`eventually`] sleeps between two checks.
const PAUSE: Duration = Duration::from_millis(20);

/// Repeats `check` until it returns Ok, and returns its value; after `timeout` the test
/// fails with `what` and the last error.
pub fn eventually<T>(what: &str, timeout: Duration, check: impl FnMut() -> Result<T, String>) -> T {
    eventually_showing(what, timeout, PAUSE, check, String::new)
}

/// [`eventually`] with a pause of `pause` between checks, whose failure also shows what
/// `context` says then (the agents' logs).
pub fn eventually_showing<T>(
    what: &str,
    timeout: Duration,
    pause: Duration,
    mut check: impl FnMut() -> Result<T, String>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(last) => assert!(
                Instant::now() < deadline,
                "{what}: still not so after {timeout:?}: {last}\n{}",
                context()
            ),
        }
        std::thread::sleep(pause);
    }
}
