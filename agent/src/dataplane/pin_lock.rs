//! One writer per pin directory. Two agents on the same pins would rewrite each other's
//! entries (clients would reach both backend sets), so an agent holds an exclusive flock on
//! the pin directory for its lifetime. The kernel drops the lock when the process exits,
//! however it exits. A new agent waits a while for the old one to go, which is the handover
//! of a rolling update (the old pod terminates, then the new one starts); any other second
//! agent gives up with an error.
use std::{
    fs::File,
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::fcntl::{Flock, FlockArg};
use tracing::info;

/// How often a waiting agent tries the lock again.
const RETRY: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum PinLockError {
    #[error("cannot open the pin directory {path} to lock it")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "another socklb agent still holds {path} after {waited:?}: only one agent may write a \
         pin directory; stop the other one, or give this one its own --bpffs"
    )]
    Held { path: PathBuf, waited: Duration },
    #[error("cannot lock the pin directory {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The lock on a pin directory; released when dropped or when the process exits.
#[derive(Debug)]
pub struct PinLock {
    _lock: Flock<File>,
}

/// Locks `pin_dir` (which must exist), waiting up to `wait` for an agent that holds it.
pub fn lock(pin_dir: &Path, wait: Duration) -> Result<PinLock, PinLockError> {
    let started = Instant::now();
    let mut logged = false;
    loop {
        let dir = File::open(pin_dir).map_err(|source| PinLockError::Open {
            path: pin_dir.to_owned(),
            source,
        })?;
        match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(PinLock { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                if started.elapsed() >= wait {
                    return Err(PinLockError::Held {
                        path: pin_dir.to_owned(),
                        waited: wait,
                    });
                }
                if !logged {
                    info!(pin_dir = %pin_dir.display(), ?wait, "another agent holds the pin directory: waiting for it to exit");
                    logged = true;
                }
                std::thread::sleep(RETRY);
            }
            Err((_, errno)) => {
                return Err(PinLockError::Lock {
                    path: pin_dir.to_owned(),
                    source: io::Error::from(errno),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_waits_then_fails_and_succeeds_once_the_first_is_gone() {
        let dir = std::env::temp_dir().join(format!("socklb-pin-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let first = lock(&dir, Duration::ZERO).expect("the first lock");
        let refused = lock(&dir, Duration::from_millis(250));
        assert!(
            matches!(refused, Err(PinLockError::Held { .. })),
            "{refused:?}"
        );
        drop(first);
        let second = lock(&dir, Duration::ZERO);
        assert!(second.is_ok(), "{second:?}");
        drop(second);
        std::fs::remove_dir(&dir).expect("remove the scratch directory");
    }
}
