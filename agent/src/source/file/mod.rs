//! The `file` source: a directory of YAML (or JSON) manifests holding Services,
//! EndpointSlices, Nodes, Pods and Namespaces, for demos, tests and clusters without an API
//! server to ask.
//!
//! Only the files whose text changed are parsed, and sent as changes (see
//! [`manifests::Reload`]), so a change costs the changed file, not the directory; README,
//! "The control plane", has the rest. A file being written (`cmd > file` truncates it long
//! before it is whole) keeps its objects until the writer closes it or [`HOLD_MAX`] passes,
//! and one that lost objects waits [`timing::SETTLE`]: docs/operations.md, "A manifest
//! written slowly". The directory is followed by its path (`watched_dir`), and one that
//! cannot be read keeps its objects.
//!
//! - [`manifests`]: the directory's objects, read file by file, and what changed;
//! - [`writers`]: which files are being written, from the watch's events;
//! - [`logs`]: what is said about the directory and its files;
//! - [`timing`]: how long it waits, and for what; [`error`]: what stops it reading;
//! - here: the watch loop that reads the directory after every burst of changes.
mod error;
mod logs;
mod manifests;
#[cfg(test)]
mod tests;
mod timing;
mod writers;

use std::{collections::HashSet, path::PathBuf};

use notify::{
    EventKind,
    event::{AccessKind, AccessMode},
};
use tokio::{sync::mpsc, time::Instant};
use tracing::{info, warn};

pub use self::error::FileSourceError;
use self::{
    logs::{Trouble, log_bad_document, log_held},
    manifests::{Held, Manifests},
    timing::{DEBOUNCE, DEBOUNCE_MAX, HOLD_MAX},
    writers::{WatchEvent, Writers},
};
pub use super::manifest::{BadDocument, ManifestError, parse};
use super::{
    Event,
    watched_dir::{Found, RECHECK, Removed, WatchedDir},
};

/// Watches a manifests directory and sends its state as events.
pub struct FileSource {
    dir: PathBuf,
}

impl FileSource {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Sends the directory's objects now and after every change, until the receiver is
    /// dropped.
    pub async fn run(self, events: mpsc::Sender<Event>) -> Result<(), FileSourceError> {
        let (changed_tx, mut changed_rx) = mpsc::unbounded_channel();
        let removed = Removed::default();
        let (noted, dir) = (removed.clone(), self.dir.clone());
        let watcher = notify::recommended_watcher(move |event: WatchEvent| {
            if let Ok(event) = &event {
                noted.note(event, &dir);
            }
            // Reading the files is an event too (inotify reports opens and closes): only
            // changes of their content or of the directory's entries count, and the end
            // of a write.
            let closed_after_write = |kind: &EventKind| {
                matches!(
                    kind,
                    EventKind::Access(AccessKind::Close(AccessMode::Write))
                )
            };
            if event.as_ref().is_ok_and(|e| {
                (e.kind.is_access() && !closed_after_write(&e.kind)) || e.kind.is_other()
            }) {
                return;
            }
            let _ = changed_tx.send(event);
        });
        let mut dir = watcher
            .and_then(|watcher| WatchedDir::new(&self.dir, watcher, removed))
            .map_err(|source| FileSourceError::Watch {
                path: self.dir.clone(),
                source,
            })?;

        let mut manifests = Manifests::default();
        let mut writers = Writers::default();
        let mut logged: HashSet<PathBuf> = HashSet::new();
        let mut trouble = Trouble::default();
        loop {
            let problem = match dir.follow() {
                Ok(Found::Watched) => None,
                Ok(Found::Replaced) => {
                    info!(
                        dir = %self.dir.display(),
                        "manifests directory replaced (another one renamed over it, or it is \
                         back): watching the one there now"
                    );
                    None
                }
                Ok(Found::Missing) => Some("no directory there".to_owned()),
                Err(error) => Some(format!("cannot watch it: {error}")),
            };
            if let Some(problem) = problem {
                trouble.report(&self.dir, problem);
                tokio::time::sleep(RECHECK).await;
                continue;
            }
            // What happened up to now, so that a file truncated a moment ago counts as being
            // written.
            while let Ok(event) = changed_rx.try_recv() {
                writers.note(&event, Instant::now());
            }
            let now = Instant::now();
            let reload = if manifests.read_before {
                manifests.reload_settling(
                    &self.dir,
                    |file| writers.writing(file, now),
                    |file| writers.settled(file, now),
                )
            } else {
                match manifests.first_read(&self.dir, |file| writers.writing(file, now)) {
                    Ok(mut read) => {
                        while let Some(batch) = manifests.read_next(&mut read) {
                            for event in batch {
                                if events.send(event).await.is_err() {
                                    return Ok(());
                                }
                            }
                        }
                        Ok(read.finish())
                    }
                    Err(error) => Err(error),
                }
            };
            let reload = match reload {
                Ok(reload) => reload,
                Err(error) => {
                    trouble.report(&self.dir, format!("{:#}", anyhow::Error::from(error)));
                    tokio::time::sleep(RECHECK).await;
                    continue;
                }
            };
            trouble.clear(&self.dir);
            for error in reload.errors {
                if manifests.holds(&error.file) {
                    warn!(%error, "manifest not applied; its last good state is kept");
                } else {
                    // Never read whole (at `explain`'s or the agent's first read, or made
                    // broken): nothing of it is served.
                    warn!(%error, "manifest not read; its objects are left out until it is fixed");
                }
            }
            for bad in &reload.bad_documents {
                log_bad_document(bad);
            }
            log_held(&reload.held, &mut logged);
            for file in writers.expired(now) {
                warn!(
                    file = %file.display(),
                    "manifest still open for writing but unchanged for {HOLD_MAX:?}: read as it is"
                );
            }
            info!(dir = %self.dir.display(), "manifests read");
            for event in reload.events {
                if events.send(event).await.is_err() {
                    return Ok(());
                }
            }
            // Wait for a change (or until a held file is due, or the path names another
            // directory), then for the burst of changes to end, at most DEBOUNCE_MAX.
            let emptied = reload
                .held
                .iter()
                .any(|(_, held)| *held == Held::Emptied)
                .then(|| Instant::now() + DEBOUNCE);
            let settling = reload
                .held
                .iter()
                .filter(|(_, held)| *held == Held::Settling)
                .filter_map(|(file, _)| writers.settled_at(file))
                .min();
            let due = [emptied, settling, writers.due()]
                .into_iter()
                .flatten()
                .min();
            let first = loop {
                let recheck = Instant::now() + RECHECK;
                let until = due.map_or(recheck, |due| due.min(recheck));
                match tokio::time::timeout_at(until, changed_rx.recv()).await {
                    Ok(event) => break event.map(Some),
                    Err(_) if due.is_some_and(|due| Instant::now() >= due) || dir.moved() => {
                        break Some(None);
                    }
                    Err(_) => {}
                }
            };
            let Some(first) = first else {
                return Ok(());
            };
            // A due file or another directory: read again now.
            let Some(first) = first else {
                continue;
            };
            writers.note(&first, Instant::now());
            if !settle(&mut changed_rx, &mut writers).await {
                return Ok(());
            }
        }
    }
}

/// Waits for the end of a burst of changes: until none came for [`DEBOUNCE`], or
/// [`DEBOUNCE_MAX`] after the call, whichever is first. False when the watcher is gone.
async fn settle(changed: &mut mpsc::UnboundedReceiver<WatchEvent>, writers: &mut Writers) -> bool {
    let cap = Instant::now() + DEBOUNCE_MAX;
    loop {
        let quiet = (Instant::now() + DEBOUNCE).min(cap);
        match tokio::time::timeout_at(quiet, changed.recv()).await {
            Ok(Some(event)) => writers.note(&event, Instant::now()),
            Ok(None) => return false,
            Err(_) => return true,
        }
    }
}
