//! Which manifest files are being written, from the watch's events: a file being written
//! (`cmd > file` truncates it long before it is whole) is held back until its writer
//! closes it, and one that lost objects until it settled.
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
};

use notify::{
    EventKind,
    event::{AccessKind, AccessMode, CreateKind, ModifyKind, RenameMode},
};
use tokio::time::Instant;

use super::{
    manifests::is_manifest,
    timing::{HOLD_MAX, SETTLE},
};

/// What the directory's watch reports.
pub(super) type WatchEvent = notify::Result<notify::Event>;

/// Which files are being written, from inotify's events: a file whose data changed (or that
/// was created) and that no writer has closed since.
#[derive(Debug, Default)]
pub(super) struct Writers {
    /// By file: when its data last changed.
    open: HashMap<PathBuf, Instant>,
    /// By file, open or closed: when its data last changed.
    changed: HashMap<PathBuf, Instant>,
    /// Files held past HOLD_MAX that were read anyway (logged once).
    expired: HashSet<PathBuf>,
}

impl Writers {
    pub(super) fn note(&mut self, event: &WatchEvent, now: Instant) {
        let Ok(event) = event else {
            return;
        };
        for file in event.paths.iter().filter(|file| is_manifest(file)) {
            match event.kind {
                EventKind::Create(CreateKind::File | CreateKind::Any)
                | EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Any) => {
                    self.open.insert(file.clone(), now);
                    self.changed.insert(file.clone(), now);
                    self.expired.remove(file);
                }
                // Closed after writing, moved in complete, moved away or deleted.
                EventKind::Access(AccessKind::Close(AccessMode::Write))
                | EventKind::Modify(ModifyKind::Name(
                    RenameMode::To | RenameMode::From | RenameMode::Both,
                ))
                | EventKind::Remove(_) => {
                    self.open.remove(file);
                    self.expired.remove(file);
                    if matches!(event.kind, EventKind::Remove(_)) {
                        self.changed.remove(file);
                    }
                }
                _ => {}
            }
        }
    }

    /// Whether `file` has not changed for [`SETTLE`] at `now`.
    pub(super) fn settled(&self, file: &Path, now: Instant) -> bool {
        self.settled_at(file).is_none_or(|at| now >= at)
    }

    /// When `file` will have been unchanged for [`SETTLE`].
    pub(super) fn settled_at(&self, file: &Path) -> Option<Instant> {
        self.changed.get(file).map(|changed| *changed + SETTLE)
    }

    /// Whether `file` is held back at `now`.
    pub(super) fn writing(&self, file: &Path, now: Instant) -> bool {
        self.open
            .get(file)
            .is_some_and(|changed| now < *changed + HOLD_MAX)
    }

    /// Files still open but unchanged for HOLD_MAX that were not reported yet.
    pub(super) fn expired(&mut self, now: Instant) -> Vec<PathBuf> {
        let expired: Vec<PathBuf> = self
            .open
            .iter()
            .filter(|(file, changed)| now >= **changed + HOLD_MAX && !self.expired.contains(*file))
            .map(|(file, _)| file.clone())
            .collect();
        self.expired.extend(expired.iter().cloned());
        expired
    }

    /// When the next held file is read anyway.
    pub(super) fn due(&self) -> Option<Instant> {
        self.open
            .iter()
            .filter(|(file, _)| !self.expired.contains(*file))
            .map(|(_, changed)| *changed + HOLD_MAX)
            .min()
    }
}
