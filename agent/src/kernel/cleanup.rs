//! `socklb cleanup`: detaching the programs and removing socklb's pins, and nothing else.
//!
//! The agent never does this on exit (pinned programs stay attached, so that a restart does
//! not interrupt service); removal is explicit, and refused while an agent runs on the pin
//! directory (its lock is held): it would go on reporting ready over a node it no longer
//! serves. What another instance attached, at its own pin directory or netlink handle, stays.
use std::{
    fs, io,
    path::{Path, PathBuf},
    time::Duration,
};

use aya::programs::links::PinnedLink;
use socklb_abi::{map_names, program_names};
use tracing::warn;

use super::{
    attach::tc,
    carry, host,
    load::remove_staging,
    pin_lock::{self, PinLock, PinLockError},
    pins,
};

/// Removes the link pinned at `path`, if there is one, and returns once its program is
/// detached. The pin is the link's last holder but one: our own fd, whose close releases
/// the link at once. Dropping the pin alone would leave the detach to a kernel work queue,
/// so that programs could still run for a while after `cleanup` returned.
fn unpin_link(path: &Path) -> io::Result<bool> {
    let link = match PinnedLink::from_pin(path) {
        Ok(link) => link,
        Err(_) if !path.exists() => return Ok(false),
        Err(e) => {
            // Not a link (or not readable as one): removing the pin is all there is to do.
            warn!(pin = %path.display(), error = %e, "not opened as a link; removing the pin");
            return match fs::remove_file(path) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
            };
        }
    };
    let held = link
        .unpin()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    drop(held);
    Ok(true)
}

/// The pin directory's lock, or an error naming the agent that holds it (the lock taken
/// without waiting). Nothing to lock where there is no pin directory.
fn lock_out_agents(pin_dir: &Path) -> io::Result<Option<PinLock>> {
    if !pin_dir.is_dir() {
        return Ok(None);
    }
    match pin_lock::lock(pin_dir, Duration::ZERO, &|| false) {
        Ok(lock) => Ok(Some(lock)),
        Err(PinLockError::Held { holder, .. }) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "a socklb agent is running on {} ({holder}): stop it first (delete its \
                 DaemonSet, or stop its service), then run cleanup again; cleanup would \
                 detach the programs it serves the node with (--force does, from inside \
                 its pod)",
                pin_dir.display()
            ),
        )),
        Err(e) => Err(io::Error::other(e)),
    }
}

/// What `cleanup` removed.
#[derive(Debug, Default)]
pub struct Cleanup {
    pub removed: Vec<PathBuf>,
}

/// Detaches the programs (by removing their link pins, and the netlink TC filters recorded
/// under `pin_dir` on kernels without TCX) and removes socklb's pinned maps and directories
/// under `pin_dir`; nothing it did not create, nothing another instance attached.
pub fn cleanup(pin_dir: &Path) -> io::Result<Cleanup> {
    cleanup_with(pin_dir, RunningAgent::Refuse)
}

/// What cleanup does about an agent that runs on the pin directory (holds its lock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunningAgent {
    /// Refuses, naming it.
    Refuse,
    /// Removes its pins all the same (`socklb cleanup --force`, from inside its pod).
    Ignore,
}

/// [`cleanup`], or with `RunningAgent::Ignore` also under a running agent.
pub fn cleanup_with(pin_dir: &Path, running: RunningAgent) -> io::Result<Cleanup> {
    let mut cleanup = Cleanup::default();
    // Held until the end, so that no agent starts on the pins while they go.
    let _lock = match running {
        RunningAgent::Refuse => lock_out_agents(pin_dir)?,
        RunningAgent::Ignore => None,
    };
    // Maps of a growth an agent did not finish.
    remove_staging(pin_dir);
    // Maps a start replaced and had not finished carrying over.
    carry::finish(pin_dir);
    let links = program_names::SOCK_ADDR
        .iter()
        .chain([&program_names::SOCK_RELEASE])
        .map(|name| pins::link_pin(pin_dir, name));
    let tc_links = tc::tc_pins(pin_dir)
        .map_err(io::Error::other)?
        .into_iter()
        .map(|(path, _)| path);
    for path in links.chain(tc_links) {
        if unpin_link(&path)? {
            cleanup.removed.push(path);
        }
    }
    let maps = map_names::ALL
        .iter()
        .chain(&map_names::RETIRED)
        .map(|name| pins::map_pin(pin_dir, name))
        .chain(pins::other_layout_maps(pin_dir));
    for path in maps {
        match fs::remove_file(&path) {
            Ok(()) => cleanup.removed.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }
    cleanup.removed.extend(
        tc::detach_netlink_filters(pin_dir)?
            .into_iter()
            .map(PathBuf::from),
    );
    // A mount (a pin directory from before the agent refused one) stays: it is not ours.
    let mount = fs::metadata(pin_dir).is_ok_and(|metadata| host::is_mount_root(pin_dir, &metadata));
    let dirs = [
        pins::links_dir(pin_dir),
        pins::trace_lease_dir(pin_dir),
        pins::lock_path(pin_dir),
    ];
    for dir in dirs.into_iter().chain((!mount).then(|| pin_dir.to_owned())) {
        // Only if empty: anything else in there is not ours.
        match fs::remove_dir(&dir) {
            Ok(()) => cleanup.removed.push(dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                warn!(dir = %dir.display(), "not removed: it holds files socklb did not create");
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
        }
    }
    Ok(cleanup)
}
