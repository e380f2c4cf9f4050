//! What the file source says about its directory and files: once when a problem starts or
//! a file starts being held back, not at every read.
use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use tracing::{info, warn};

use super::{
    manifests::{BadObject, Held},
    timing::{DEBOUNCE, HOLD_MAX, SETTLE},
};
use crate::source::{Kind, watched_dir::RECHECK};

/// A problem with the directory itself: logged when it starts or changes, and when it ends.
/// Meanwhile the objects stay as they were, and the directory is tried every [`RECHECK`].
#[derive(Debug, Default)]
pub(super) struct Trouble(Option<String>);

impl Trouble {
    pub(super) fn report(&mut self, dir: &Path, problem: String) {
        if self.0.as_ref() == Some(&problem) {
            return;
        }
        warn!(
            dir = %dir.display(),
            %problem,
            "manifests directory not read: its objects stay as they were; tried again every \
             {RECHECK:?}"
        );
        self.0 = Some(problem);
    }

    pub(super) fn clear(&mut self, dir: &Path) {
        if self.0.take().is_some() {
            info!(dir = %dir.display(), "manifests directory read again");
        }
    }
}

/// One warning for a document that does not parse, saying what becomes of its object.
pub(super) fn log_bad_document(bad: &BadObject) {
    let error = &bad.document;
    match (&error.object, bad.kept) {
        (Some(_), true) => warn!(
            %error,
            "manifest document not applied; its object's last good state is kept until the \
             document is fixed or removed (the file's other objects are applied)"
        ),
        (None, true) => warn!(
            %error,
            "manifest document not applied, and its object cannot be named: for the objects \
             its file no longer holds, the last good state is kept until it is fixed (the \
             file's other objects are applied)"
        ),
        (Some((Kind::Service, namespace, name)), false) => warn!(
            %error,
            service = %format!("{namespace}/{name}"),
            "manifest document not read: the Service is not served until the document is \
             fixed (after an agent restart, what was programmed for it is removed); the \
             file's other objects are read"
        ),
        (Some(_), false) => warn!(
            %error,
            "manifest document not read: its object is left out until the document is fixed; \
             the file's other objects are read"
        ),
        (None, false) => warn!(
            %error,
            "manifest document not read, and what it holds cannot be named: it is left out \
             until it is fixed; the file's other objects are read"
        ),
    }
}

/// One line when a file starts being held back (not at every read while it is).
pub(super) fn log_held(held: &[(PathBuf, Held)], logged: &mut HashSet<PathBuf>) {
    logged.retain(|file| held.iter().any(|(h, _)| h == file));
    for (file, why) in held {
        if !logged.insert(file.clone()) {
            continue;
        }
        match why {
            Held::Writing => info!(
                file = %file.display(),
                "manifest is being written (changed, not closed yet): its objects stay as \
                 they were until the writer closes it, or for at most {HOLD_MAX:?} \
                 without a change"
            ),
            Held::Emptied => info!(
                file = %file.display(),
                "manifest emptied: its objects are deleted if it is still empty in {DEBOUNCE:?}"
            ),
            Held::Settling => info!(
                file = %file.display(),
                "manifest shorter than what is applied: applied once it has not changed \
                 for {SETTLE:?} (a file written with several opens, `> f` then `>> f`, is \
                 closed between its parts)"
            ),
        }
    }
}
