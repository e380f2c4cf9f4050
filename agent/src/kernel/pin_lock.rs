//! One writer per pin directory. Two agents on the same pins would rewrite each other's
//! entries (clients would reach both backend sets), so an agent holds an exclusive flock
//! for its lifetime on `lock`, an entry of the pin directory only the agent's user
//! can open (the directory is 0700: another user cannot take the lock and block every
//! restart). The kernel drops the lock when the process exits, however it exits. A new
//! agent waits a while for the old one to go, which is the handover of a rolling update
//! (the old pod terminates, then the new one starts); any other second agent gives up with
//! an error naming the holder.
//!
//! Agents before `lock` locked the pin directory itself. The agent takes that lock
//! too, so that an older agent (an upgrade, or a rollback to it) still waits for this one
//! and this one for it; a holder of the directory lock that runs as another user is not an
//! agent (it opened the directory while it was 0755) and is passed over with a warning.
use std::{
    fs::{self, File},
    io,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use nix::fcntl::{Flock, FlockArg};
use tracing::{info, warn};

use super::pins::lock_path;

/// How often a waiting agent tries the lock again.
const RETRY: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum PinLockError {
    #[error("cannot open {path} to lock the pin directory")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "another socklb agent still holds {path} ({holder}) after {}: only one agent \
         may write a pin directory; stop the other one, or give this one its own --bpffs",
        humantime::format_duration(*waited)
    )]
    Held {
        path: PathBuf,
        holder: Holder,
        waited: Duration,
    },
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A stop was asked for while another agent held the lock.
    #[error("stopped while waiting for the other agent to exit")]
    Stopped,
}

/// The process that holds a lock, as far as /proc shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    Process {
        pid: u32,
        name: Option<String>,
        uid: Option<u32>,
    },
    /// In another PID namespace (an agent in another pod), or gone meanwhile.
    Unknown,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Process { pid, name, uid } => {
                write!(f, "held by pid {pid}")?;
                if let Some(name) = name {
                    write!(f, " {name:?}")?;
                }
                if let Some(uid) = uid {
                    write!(f, ", uid {uid}")?;
                }
                Ok(())
            }
            Self::Unknown => f.write_str("its holder is not visible from this PID namespace"),
        }
    }
}

/// The lock on a pin directory; released when dropped or when the process exits.
#[derive(Debug)]
pub struct PinLock {
    _lock: Flock<File>,
    /// The older agents' lock on the directory itself, unless another user holds it.
    _directory: Option<Flock<File>>,
}

/// Locks `pin_dir` (which must exist, made by `prepare_pin_dir`), waiting up to `wait` for
/// an agent that holds it, unless `stop` says to give up.
pub fn lock(
    pin_dir: &Path,
    wait: Duration,
    stop: &dyn Fn() -> bool,
) -> Result<PinLock, PinLockError> {
    let deadline = Instant::now() + wait;
    let path = lock_path(pin_dir);
    match fs::DirBuilder::new().mode(0o600).create(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(PinLockError::Open { path, source }),
    }
    let lock = take(&path, (deadline, wait, stop), |_| false)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let agent = unsafe { libc::geteuid() };
    let directory = take(pin_dir, (deadline, wait, stop), |holder| match holder {
        Holder::Process {
            pid,
            name,
            uid: Some(uid),
        } if *uid != agent => {
            warn!(
                pin_dir = %pin_dir.display(),
                pid,
                name = name.as_deref().unwrap_or("?"),
                uid,
                "a process of another user holds a lock on the pin directory (it opened the \
                 directory while it was readable to all): not an agent, passed over; the \
                 lock socklb counts on is its own entry, taken"
            );
            true
        }
        _ => false,
    })?;
    Ok(PinLock {
        _lock: lock.ok_or_else(|| PinLockError::Lock {
            path,
            source: io::Error::other("the lock was passed over"),
        })?,
        _directory: directory,
    })
}

/// Takes the flock of `path`, waiting until `deadline` (`wait` from the start) while
/// another process holds it, unless `stop` says to give up; `None` if `pass_over` says
/// that holder does not count.
fn take(
    path: &Path,
    (deadline, wait, stop): (Instant, Duration, &dyn Fn() -> bool),
    pass_over: impl Fn(&Holder) -> bool,
) -> Result<Option<Flock<File>>, PinLockError> {
    let mut logged = false;
    loop {
        let file = File::open(path).map_err(|source| PinLockError::Open {
            path: path.to_owned(),
            source,
        })?;
        let identity = file.metadata().ok().map(|m| (m.dev(), m.ino()));
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(Some(lock)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                let holder = identity.map_or(Holder::Unknown, |(dev, ino)| holder(dev, ino));
                if pass_over(&holder) {
                    return Ok(None);
                }
                // A stop asked for is not a failure, even at the wait's last moment.
                if stop() {
                    return Err(PinLockError::Stopped);
                }
                if Instant::now() >= deadline {
                    return Err(PinLockError::Held {
                        path: path.to_owned(),
                        holder,
                        waited: wait,
                    });
                }
                if !logged {
                    info!(lock = %path.display(), %holder, wait = %humantime::format_duration(wait), "another agent holds the pin directory: waiting for it to exit");
                    logged = true;
                }
                std::thread::sleep(RETRY);
            }
            Err((_, errno)) => {
                return Err(PinLockError::Lock {
                    path: path.to_owned(),
                    source: io::Error::from(errno),
                });
            }
        }
    }
}

/// Who holds the flock of the file `(dev, ino)`, from /proc/locks.
fn holder(dev: u64, ino: u64) -> Holder {
    let Some(pid) = fs::read_to_string("/proc/locks")
        .ok()
        .and_then(|locks| flock_holder(&locks, libc::major(dev), libc::minor(dev), ino))
    else {
        return Holder::Unknown;
    };
    let process = Path::new("/proc").join(pid.to_string());
    Holder::Process {
        pid,
        name: fs::read_to_string(process.join("comm"))
            .ok()
            .map(|name| name.trim().to_owned()),
        uid: fs::metadata(&process).ok().map(|m| m.uid()),
    }
}

/// The pid that holds a flock on `(major, minor, ino)` in /proc/locks' text (lines such as
/// `1: FLOCK  ADVISORY  WRITE 1234 00:1f:4711 0 EOF`; waiters are marked `->`). Pid 0 is a
/// holder not visible from this PID namespace.
fn flock_holder(locks: &str, major: u32, minor: u32, ino: u64) -> Option<u32> {
    let wanted = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, "FLOCK", _, _, pid, file, ..] if *file == wanted => {
                pid.parse().ok().filter(|pid| *pid != 0)
            }
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_waits_then_fails_and_succeeds_once_the_first_is_gone() {
        let dir = std::env::temp_dir().join(format!("socklb-pin-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let never = || false;
        let first = lock(&dir, Duration::ZERO, &never).expect("the first lock");
        // A stop asked for ends the wait at once.
        let stopped = lock(&dir, Duration::from_secs(3600), &|| true);
        assert!(matches!(stopped, Err(PinLockError::Stopped)), "{stopped:?}");
        let refused = lock(&dir, Duration::from_millis(250), &never);
        let Err(PinLockError::Held { holder, .. }) = &refused else {
            panic!("{refused:?}");
        };
        assert_eq!(
            holder,
            &Holder::Process {
                pid: std::process::id(),
                name: std::fs::read_to_string("/proc/self/comm")
                    .ok()
                    .map(|name| name.trim().to_owned()),
                uid: std::fs::metadata("/proc/self").ok().map(|m| m.uid()),
            }
        );
        drop(first);
        let second = lock(&dir, Duration::ZERO, &never);
        assert!(second.is_ok(), "{second:?}");
        drop(second);
        std::fs::remove_dir(lock_path(&dir)).expect("remove the lock");
        std::fs::remove_dir(&dir).expect("remove the scratch directory");
    }

    #[test]
    fn the_holder_is_read_from_proc_locks() {
        let locks = "\
1: POSIX  ADVISORY  WRITE 77 00:1f:4711 0 EOF
2: FLOCK  ADVISORY  WRITE 0 00:20:4711 0 EOF
3: FLOCK  ADVISORY  WRITE 1234 00:1f:4711 0 EOF
3: -> FLOCK  ADVISORY  WRITE 99 00:1f:4711 0 EOF
4: FLOCK  ADVISORY  WRITE 555 103:02:4711 0 EOF
";
        // (major, minor, inode, holder)
        let rows = [
            (0, 0x1f, 4711, Some(1234)),
            (0, 0x20, 4711, None),
            (0x103, 2, 4711, Some(555)),
            (0, 0x1f, 4712, None),
        ];
        for (major, minor, ino, expected) in rows {
            assert_eq!(
                flock_holder(locks, major, minor, ino),
                expected,
                "{major}:{minor}:{ino}"
            );
        }
    }
}
