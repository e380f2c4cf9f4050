//! The manifests directory under watch, followed by its path. inotify watches a directory,
//! not a path: a tool that updates a directory whole renames a new one over it (a `mv`
//! swap, `rsync` into a fresh copy), after which the watch sees only the old one. So the
//! path's identity is checked every [`RECHECK`] and the watch moved to the directory it
//! names now. A directory removed (whose watch the kernel drops with it) is watched again
//! whatever its successor's identity: a directory made at once in its place may get its
//! inode number. A directory gone for a while (moved away, then back) is waited for, and
//! its objects stay as they were meanwhile.
use std::{
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};

/// How often the path is checked for another directory, or for none.
pub const RECHECK: Duration = Duration::from_secs(2);

/// Which directory a path names: its device and inode, none if there is none.
type Identity = Option<(u64, u64)>;

fn identity(path: &Path) -> Identity {
    fs::metadata(path)
        .ok()
        .filter(fs::Metadata::is_dir)
        .map(|meta| (meta.dev(), meta.ino()))
}

/// What the path names, against what is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The directory under watch.
    Watched,
    /// Another directory (or the one that was gone, back), watched from now on.
    Replaced,
    /// No directory.
    Missing,
}

/// Set by the watcher's event handler when the watched directory itself was removed.
#[derive(Clone, Debug, Default)]
pub struct Removed(Arc<AtomicBool>);

impl Removed {
    /// Notes `event` if it says that the directory at `path` itself was removed.
    pub fn note(&self, event: &notify::Event, path: &Path) {
        if matches!(event.kind, EventKind::Remove(_)) && event.paths.iter().any(|p| p == path) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

pub struct WatchedDir {
    path: PathBuf,
    watcher: RecommendedWatcher,
    watched: Identity,
    removed: Removed,
}

impl WatchedDir {
    /// Watches the directory at `path` with `watcher`, whose event handler notes into
    /// `removed`.
    pub fn new(
        path: &Path,
        mut watcher: RecommendedWatcher,
        removed: Removed,
    ) -> Result<Self, notify::Error> {
        // Before the watch: a directory renamed over the path in between is then found
        // moved at the next check, not taken for the one watched.
        let watched = identity(path);
        watcher.watch(path, RecursiveMode::NonRecursive)?;
        Ok(Self {
            path: path.to_owned(),
            watcher,
            watched,
            removed,
        })
    }

    /// Whether the path no longer names the directory under watch.
    pub fn moved(&self) -> bool {
        self.removed.0.load(Ordering::Relaxed) || identity(&self.path) != self.watched
    }

    /// What the path names now; the watch follows it to another directory. An error leaves
    /// nothing watched, to be tried again at the next call.
    pub fn follow(&mut self) -> Result<Found, notify::Error> {
        if self.removed.0.swap(false, Ordering::Relaxed) {
            // Its watch went with it: whatever is there now is another directory.
            self.watched = None;
        }
        let now = identity(&self.path);
        if now == self.watched {
            return Ok(if now.is_some() {
                Found::Watched
            } else {
                Found::Missing
            });
        }
        // Already gone with the directory it was on, if that was removed.
        let _ = self.watcher.unwatch(&self.path);
        self.watched = None;
        if now.is_none() {
            return Ok(Found::Missing);
        }
        self.watcher
            .watch(&self.path, RecursiveMode::NonRecursive)?;
        self.watched = now;
        Ok(Found::Replaced)
    }
}
