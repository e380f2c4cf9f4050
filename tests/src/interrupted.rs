//! System calls made again when a signal interrupted them.
//!
//! A test process gets a signal it never asked for whenever a child of one of its threads
//! exits: SIGCHLD goes to the thread that spawned the child, and if that thread is spawning
//! another one at that moment (glibc's `posix_spawn` blocks every signal around its clone),
//! the kernel queues it for the whole process and wakes another thread to take it. Its
//! action is to be ignored, and the kernel makes most interrupted calls again, but not a
//! socket receive with a timeout (`SO_RCVTIMEO`, signal(7)): that one returns EINTR, which
//! a test would take for a missing answer (seen once in CI; perf's signal tracepoints
//! show a test binary's threads taking the SIGCHLDs of its tests' `ip`, `tc` and `sysctl`
//! runs).
use std::io;

/// `call`'s result, `call` made again for as long as a signal interrupts it. A receive
/// made again waits its whole timeout again.
pub fn uninterrupted<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match call() {
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Error, ErrorKind};

    use super::uninterrupted;

    #[test]
    fn an_interrupted_call_is_made_again_and_other_results_are_returned_as_they_are() {
        let mut results = vec![
            Ok(7),
            Err(Error::from(ErrorKind::Interrupted)),
            Err(Error::from(ErrorKind::Interrupted)),
        ];
        let mut calls = 0;
        let result = uninterrupted(|| {
            calls += 1;
            results.pop().expect("a result left")
        });
        assert_eq!((result.ok(), calls), (Some(7), 3));

        let timed_out = uninterrupted::<()>(|| Err(Error::from(ErrorKind::WouldBlock)));
        assert_eq!(timed_out.map_err(|e| e.kind()), Err(ErrorKind::WouldBlock));
    }
}
