//! The manifests directory under watch, followed by its path. inotify watches a directory,
//! not a path: a tool that updates a directory whole renames a new one over it (a `mv`
//! swap, `rsync` into a fresh copy), after which the watch sees only the old one. So the
//! path's identity is checked every [`RECHECK`] and the watch moved to the directory it
//! names now. A directory gone for a while (moved away, then back) is waited for, and its
//! objects stay as they were meanwhile.
use std::{
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use notify::{RecommendedWatcher, RecursiveMode, Watcher as _};

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

pub struct WatchedDir {
    path: PathBuf,
    watcher: RecommendedWatcher,
    watched: Identity,
}

impl WatchedDir {
    /// Watches the directory at `path` with `watcher`.
    pub fn new(path: &Path, mut watcher: RecommendedWatcher) -> Result<Self, notify::Error> {
        watcher.watch(path, RecursiveMode::NonRecursive)?;
        Ok(Self {
            path: path.to_owned(),
            watcher,
            watched: identity(path),
        })
    }

    /// Whether the path no longer names the directory under watch.
    pub fn moved(&self) -> bool {
        identity(&self.path) != self.watched
    }

    /// What the path names now; the watch follows it to another directory. An error leaves
    /// nothing watched, to be tried again at the next call.
    pub fn follow(&mut self) -> Result<Found, notify::Error> {
        let now = identity(&self.path);
        if now == self.watched {
            return Ok(if now.is_some() {
                Found::Watched
            } else {
                Found::Missing
            });
        }
        if self.watched.is_some() {
            // Already gone with the directory it was on, if that was removed.
            let _ = self.watcher.unwatch(&self.path);
            self.watched = None;
        }
        if now.is_none() {
            return Ok(Found::Missing);
        }
        self.watcher
            .watch(&self.path, RecursiveMode::NonRecursive)?;
        self.watched = now;
        Ok(Found::Replaced)
    }
}
