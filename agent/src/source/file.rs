//! The `file` source: a directory of YAML (or JSON) manifests holding Services,
//! EndpointSlices, Nodes, Pods and Namespaces, for demos, tests and clusters without an API
//! server to ask.
//!
//! Only the files whose text changed are parsed, and sent as changes (see [`Reload`]), so
//! a change costs the changed file, not the directory; README, "The control plane", has
//! the rest. A file being written (`cmd > file` truncates it long before it is whole)
//! keeps its objects until the writer closes it or [`HOLD_MAX`] passes, and one that lost
//! objects waits [`SETTLE`]: docs/operations.md, "A manifest written slowly". The directory
//! is followed by its path (`watched_dir`), and one that cannot be read keeps its objects.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::{
    api::{
        core::v1::{Namespace, Node, Pod, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use notify::{
    EventKind,
    event::{AccessKind, AccessMode, CreateKind, ModifyKind, RenameMode},
};
use tokio::{sync::mpsc, time::Instant};
use tracing::{info, warn};

pub use super::manifest::{BadDocument, ManifestError, parse};
use super::{
    Event, Kind, Object,
    last_good::LastGood,
    manifest::Read,
    object_ids::{self, ObjectId, ObjectIds, Seen, object_id},
    read_ahead::{self, ReadAhead},
    watched_dir::{Found, RECHECK, Removed, WatchedDir},
};

/// A burst of changes is read once it has been quiet this long...
const DEBOUNCE: Duration = Duration::from_millis(50);

/// ...or this long after its first change, so that edits every few milliseconds cannot hold
/// every other change back.
const DEBOUNCE_MAX: Duration = Duration::from_millis(200);

/// A file still open for writing is read anyway once it has not changed for this long (a
/// writer that keeps its file open).
const HOLD_MAX: Duration = Duration::from_secs(10);

/// A file whose new text loses objects, or is much shorter than the text applied (it may
/// lose endpoints), is applied only once it has not changed for this long: a file written with
/// several opens (`> f`, then `>> f`) is closed between its parts, and its first part alone
/// would take away what the later parts hold.
const SETTLE: Duration = Duration::from_secs(2);

/// Bytes a file may shrink by without waiting for [`SETTLE`]: an edited address or port
/// (an endpoint replaced), which must not be slowed down.
const SHRINK_MARGIN: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum FileSourceError {
    #[error("cannot read the manifests directory {path}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch the manifests directory {path}")]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// The manifests of a directory. Each file's last text read is kept (text is a few times
/// smaller than the parsed objects), so that a file that no longer parses contributes its
/// last good objects, and so that a re-read parses only the files whose text changed. Each
/// document is read on its own: an object whose document no longer reads keeps its last
/// good state (kept apart from the text, as JSON) while the file's other objects take
/// their new one.
#[derive(Debug, Default)]
pub struct Manifests {
    files: BTreeMap<PathBuf, ManifestFile>,
    /// The directory was read before: later reads send only what changed.
    read_before: bool,
    /// Files that held objects and were found empty by the last read: deleted if the next
    /// read finds them still empty.
    emptied: HashSet<PathBuf>,
    /// The text of each file that did not parse, or had documents that did not, as last
    /// read: said once, not again at every read of the directory until it changes.
    broken: BTreeMap<PathBuf, Broken>,
}

/// A text that did not parse, whole or in part.
#[derive(Debug)]
struct Broken {
    text: LastGood,
    /// Not a document of it parsed: it is not read again while it stays the same.
    whole: bool,
}

/// A file's last text that parsed (whole or in part) and which objects it holds.
#[derive(Debug)]
struct ManifestFile {
    text: LastGood,
    /// Its objects: those of the text's documents that read, and those kept.
    ids: ObjectIds,
    /// The objects whose documents in `text` do not read and that read before: their last
    /// good state, as JSON objects one after another (`None`: none).
    kept: Option<LastGood>,
}

impl ManifestFile {
    /// The objects it holds and `now` does not (every one for an empty `now`), named from
    /// its last good text: only a file that lost objects parses that again.
    fn lost(&self, file: &Path, now: &ObjectIds) -> Vec<ObjectId> {
        if self.ids.all_in(now) {
            return Vec::new();
        }
        object_ids::lost(&self.objects(file), now)
    }

    /// Its objects, parsed again: its text's, then those kept.
    fn objects(&self, file: &Path) -> Vec<Object> {
        let mut objects = parse_last_good(file, &self.text.text());
        if let Some(kept) = &self.kept {
            objects.extend(parse_last_good(file, &kept.text()));
        }
        objects
    }

    /// Of its objects, those that `read` no longer holds and whose documents in it do not
    /// read: each keeps its last good state. A document whose object cannot be named keeps
    /// every object the file lost (which one it was is not known).
    fn to_keep(&self, file: &Path, read: &Read) -> Vec<Object> {
        if read.bad.is_empty() {
            return Vec::new();
        }
        let now = ObjectIds::of(&read.objects);
        if self.ids.all_in(&now) {
            return Vec::new();
        }
        let unnamed = read.bad.iter().any(|bad| bad.object.is_none());
        let mut kept: Vec<Object> = Vec::new();
        for object in self.objects(file) {
            let id = object_id(&object);
            if now.contains(&id)
                || !(unnamed || read.bad.iter().any(|bad| bad.object.as_ref() == Some(&id)))
            {
                continue;
            }
            // A later copy wins, as in the state.
            kept.retain(|held| object_id(held) != id);
            kept.push(object);
        }
        kept
    }
}

/// Objects kept at their last good state, as text [`parse_last_good`] reads again.
fn kept_text(objects: &[Object]) -> Option<LastGood> {
    if objects.is_empty() {
        return None;
    }
    let json: Vec<String> = objects
        .iter()
        .filter_map(|object| {
            match object {
                Object::Service(service) => serde_json::to_string(service),
                Object::EndpointSlice(slice) => serde_json::to_string(slice),
                Object::Node(node) => serde_json::to_string(node),
                Object::Pod(pod) => serde_json::to_string(pod),
                Object::Namespace(namespace) => serde_json::to_string(namespace),
            }
            .ok()
        })
        .collect();
    Some(LastGood::new(&json.join("\n")))
}

/// One read of the directory.
#[derive(Debug)]
pub struct Reload {
    /// The first read (the agent's is [`Manifests::first_read`]), or a read after which an
    /// object is defined in two places: one `Reset` per kind with every object of the
    /// directory. Otherwise the objects that the
    /// changed files lost, as deleted, then every object they hold, as applied.
    pub events: Vec<Event>,
    /// Files that did not parse (their last good objects, if any, are kept).
    pub errors: Vec<ManifestError>,
    /// Documents that did not parse, in files whose other documents did.
    pub bad_documents: Vec<BadObject>,
    /// Files not read this time, whose objects stay as they were.
    pub held: Vec<(PathBuf, Held)>,
}

/// A document that did not parse, and what became of its object.
#[derive(Debug)]
pub struct BadObject {
    pub document: BadDocument,
    /// Its object (or, for a document that cannot be named, the objects its file lost) read
    /// before: kept at its last good state. Otherwise it is left out (at a first read, or
    /// a new object).
    pub kept: bool,
}

/// Why a file was not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Written to and not yet closed.
    Writing,
    /// Found empty though it held objects: read again before they are deleted.
    Emptied,
    /// Lost objects or much of its text, and changed less than [`SETTLE`] ago: perhaps
    /// the first part of a file written with several opens.
    Settling,
}

/// A file whose text changed in this read.
struct Changed {
    file: PathBuf,
    /// What it held and holds no more.
    lost: Vec<ObjectId>,
    /// What it holds now.
    new: Vec<Object>,
    /// What it holds still, at its last good state: objects whose documents do not read.
    kept: Vec<Object>,
    /// Whether it holds an object twice.
    repeats: bool,
}

impl Manifests {
    /// Whether `file` parsed at some read: its last good objects are served.
    pub fn holds(&self, file: &Path) -> bool {
        self.files.contains_key(file)
    }

    /// Reads the directory again.
    pub fn reload(&mut self, dir: &Path) -> Result<Reload, FileSourceError> {
        self.reload_except(dir, |_| false)
    }

    /// Reads the directory again, except the files `writing` says are being written.
    pub fn reload_except(
        &mut self,
        dir: &Path,
        writing: impl Fn(&Path) -> bool,
    ) -> Result<Reload, FileSourceError> {
        self.reload_settling(dir, writing, |_| true)
    }

    /// Reads the directory again, except the files `writing` says are being written, and
    /// the files that became shorter unless `settled` says they have not changed for a while.
    pub fn reload_settling(
        &mut self,
        dir: &Path,
        writing: impl Fn(&Path) -> bool,
        settled: impl Fn(&Path) -> bool,
    ) -> Result<Reload, FileSourceError> {
        let listed = list_manifests(dir)?;
        let mut errors = Vec::new();
        let mut bad_documents = Vec::new();
        let mut held = Vec::new();
        let mut changed = Vec::new();
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|file| !listed.contains(*file))
            .cloned()
            .collect();
        for file in gone {
            if let Some(old) = self.files.remove(&file) {
                changed.push(Changed {
                    lost: old.lost(&file, &ObjectIds::default()),
                    new: Vec::new(),
                    kept: Vec::new(),
                    repeats: false,
                    file,
                });
            }
        }
        let emptied = std::mem::take(&mut self.emptied);
        self.broken.retain(|file, _| listed.contains(file));
        for file in listed {
            if writing(&file) {
                if emptied.contains(&file) {
                    self.emptied.insert(file.clone());
                }
                held.push((file, Held::Writing));
                continue;
            }
            let text = match read_text(&file) {
                Ok(text) => text,
                Err(error) => {
                    errors.push(error);
                    continue;
                }
            };
            if self.files.get(&file).is_some_and(|old| old.text.is(&text))
                || self
                    .broken
                    .get(&file)
                    .is_some_and(|broken| broken.whole && broken.text.is(&text))
            {
                continue;
            }
            let held_objects = self.files.get(&file).is_some_and(|old| !old.ids.is_empty());
            if held_objects && text.trim().is_empty() && !emptied.contains(&file) {
                self.emptied.insert(file.clone());
                held.push((file, Held::Emptied));
                continue;
            }
            let read = match read_noting(&file, &text) {
                Ok(read) => read,
                Err(error) => {
                    let text = LastGood::new(&text);
                    self.broken
                        .insert(file.clone(), Broken { text, whole: true });
                    errors.push(error);
                    continue;
                }
            };
            let kept = self
                .files
                .get(&file)
                .map(|old| old.to_keep(&file, &read))
                .unwrap_or_default();
            // Said once for a text (a file held back is read again).
            if read.bad.is_empty() {
                self.broken.remove(&file);
            } else if !self
                .broken
                .get(&file)
                .is_some_and(|broken| broken.text.is(&text))
            {
                let text = LastGood::new(&text);
                self.broken
                    .insert(file.clone(), Broken { text, whole: false });
                bad_documents.extend(said(read.bad, &kept));
            }
            let new = read.objects;
            let ids = ObjectIds::of_both(&new, &kept);
            let repeats = ids.len() < new.len() + kept.len();
            let lost: Vec<ObjectId> = self
                .files
                .get(&file)
                .map(|old| old.lost(&file, &ids))
                .unwrap_or_default();
            // Perhaps the first part of a file written with several opens: it lost objects,
            // or more text than an edited address or port accounts for.
            let shrank = self
                .files
                .get(&file)
                .is_some_and(|old| old.text.len() > text.len() + SHRINK_MARGIN);
            if held_objects && (!lost.is_empty() || shrank) && !settled(&file) {
                if emptied.contains(&file) {
                    self.emptied.insert(file.clone());
                }
                held.push((file, Held::Settling));
                continue;
            }
            let file_state = ManifestFile {
                text: LastGood::new(&text),
                ids,
                kept: kept_text(&kept),
            };
            self.files.insert(file.clone(), file_state);
            changed.push(Changed {
                file,
                lost,
                new,
                kept,
                repeats,
            });
        }

        let events = if self.read_before && self.each_object_in_one_place(&changed) {
            differences(changed)
        } else {
            self.read_before = true;
            self.everything(changed)
        };
        Ok(Reload {
            events,
            errors,
            bad_documents,
            held,
        })
    }

    /// Whether no object of a changed file is defined twice (in that file or in another):
    /// then the changed files' differences are the directory's. Otherwise which copy wins
    /// depends on every file, and only a `Reset` of everything says it.
    fn each_object_in_one_place(&self, changed: &[Changed]) -> bool {
        changed.iter().all(|change| {
            !change.repeats
                && change
                    .lost
                    .iter()
                    .cloned()
                    .chain(change.new.iter().chain(&change.kept).map(object_id))
                    .all(|id| {
                        self.files
                            .iter()
                            .all(|(file, held)| *file == change.file || !held.ids.contains(&id))
                    })
        })
    }

    /// One `Reset` per kind with every file's objects, in file order (the changed files'
    /// are parsed already).
    fn everything(&self, changed: Vec<Changed>) -> Vec<Event> {
        let mut parsed: HashMap<PathBuf, Vec<Object>> = changed
            .into_iter()
            .map(|change| {
                let mut objects = change.new;
                objects.extend(change.kept);
                (change.file, objects)
            })
            .collect();
        let mut by_kind = [
            (Kind::Node, Vec::new()),
            (Kind::Service, Vec::new()),
            (Kind::EndpointSlice, Vec::new()),
            (Kind::Namespace, Vec::new()),
            (Kind::Pod, Vec::new()),
        ];
        // Where each object was seen first: a later copy wins, and says so.
        let mut first_seen: HashMap<ObjectId, &Path> = HashMap::new();
        for (file, held) in &self.files {
            let objects = parsed.remove(file).unwrap_or_else(|| held.objects(file));
            for object in objects {
                let id = object_id(&object);
                if let Some(first) = first_seen.insert(id.clone(), file) {
                    warn_defined_twice(&id, first, file);
                }
                let kind = object.kind();
                if let Some((_, list)) = by_kind.iter_mut().find(|(k, _)| *k == kind) {
                    list.push(object);
                }
            }
        }
        by_kind
            .into_iter()
            .map(|(kind, objects)| Event::Reset(kind, objects))
            .collect()
    }
}

fn warn_defined_twice((kind, namespace, name): &ObjectId, first: &Path, used: &Path) {
    warn!(
        object = %format!("{kind:?} {namespace}/{name}"),
        first = %first.display(),
        used = %used.display(),
        "object defined twice: the later copy is read"
    );
}

/// The first read of a directory, file by file ([`Manifests::first_read`]; a few files are
/// parsed ahead, one per CPU), so that only those files' parsed objects are held (100,000
/// Services' EndpointSlices parsed at once take about 430 MB). Its events open a list of
/// each kind, apply every file's objects in file order (a later copy of an object wins, as
/// in a `Reset`) and close the lists; Pods and Namespaces, which the state takes whole only,
/// come in one `Reset` each at the end.
pub struct FirstRead {
    /// Files not handed out yet (a few read ahead); `None` once the lists are closed.
    files: Option<ReadAhead<Result<Parsed, Unparsed>>>,
    opened: bool,
    workloads: Vec<Object>,
    errors: Vec<ManifestError>,
    bad_documents: Vec<BadObject>,
    held: Vec<(PathBuf, Held)>,
    /// Every object's identity so far, to say which is defined twice, and the files read
    /// (by index).
    seen: Seen,
    files_read: Vec<PathBuf>,
}

/// The kinds listed object by object.
const STREAMED: [Kind; 3] = [Kind::Node, Kind::Service, Kind::EndpointSlice];

impl Manifests {
    /// Starts the first read of `dir`, skipping the files `writing` says are being written
    /// (they come as changes once closed). [`Self::read_next`] gives its events.
    pub fn first_read(
        &mut self,
        dir: &Path,
        writing: impl Fn(&Path) -> bool,
    ) -> Result<FirstRead, FileSourceError> {
        let (held, files): (Vec<PathBuf>, Vec<PathBuf>) = list_manifests(dir)?
            .into_iter()
            .partition(|file| writing(file));
        self.read_before = true;
        Ok(FirstRead {
            files: Some(ReadAhead::new(
                files,
                read_ahead::window_for_this_machine(),
                read_and_parse,
            )),
            opened: false,
            workloads: Vec::new(),
            errors: Vec::new(),
            bad_documents: Vec::new(),
            held: held.into_iter().map(|file| (file, Held::Writing)).collect(),
            seen: Seen::default(),
            files_read: Vec::new(),
        })
    }

    /// The next events of `read`: the lists' opening, one file's objects, or the lists'
    /// closing; `None` when it is done.
    pub fn read_next(&mut self, read: &mut FirstRead) -> Option<Vec<Event>> {
        let files = read.files.as_mut()?;
        if !read.opened {
            read.opened = true;
            return Some(STREAMED.into_iter().map(Event::Listing).collect());
        }
        let Some((file, parsed)) = files.next() else {
            read.files = None;
            let workloads = std::mem::take(&mut read.workloads);
            let (namespaces, pods) = workloads
                .into_iter()
                .partition(|object| object.kind() == Kind::Namespace);
            let mut closing = vec![
                Event::Reset(Kind::Namespace, namespaces),
                Event::Reset(Kind::Pod, pods),
            ];
            closing.extend(STREAMED.into_iter().map(Event::Listed));
            return Some(closing);
        };
        let (objects, text) = match parsed {
            Ok((file_read, text)) => {
                // Nothing was read before: their objects are left out.
                read.bad_documents.extend(said(file_read.bad, &[]));
                (file_read.objects, text)
            }
            Err((error, text)) => {
                if let Some(text) = text {
                    self.broken.insert(file, Broken { text, whole: true });
                }
                read.errors.push(error);
                return Some(Vec::new());
            }
        };
        let ids = ObjectIds::of(&objects);
        let index = read.files_read.len();
        read.files_read.push(file.clone());
        for id in objects.iter().map(object_id) {
            if let Some(before) = read.seen.met(&id, index) {
                warn_defined_twice(&id, &read.files_read[before], &file);
            }
        }
        let file_state = ManifestFile {
            text,
            ids,
            kept: None,
        };
        self.files.insert(file, file_state);
        let (streamed, workloads): (Vec<Object>, Vec<Object>) = objects
            .into_iter()
            .partition(|object| STREAMED.contains(&object.kind()));
        read.workloads.extend(workloads);
        Some(streamed.into_iter().map(Event::Applied).collect())
    }
}

impl FirstRead {
    /// What the read could not apply, as a [`Reload`] without events (they were sent).
    pub fn finish(self) -> Reload {
        Reload {
            events: Vec::new(),
            errors: self.errors,
            bad_documents: self.bad_documents,
            held: self.held,
        }
    }
}

/// The manifests of `dir`, in name order.
fn list_manifests(dir: &Path) -> Result<BTreeSet<PathBuf>, FileSourceError> {
    let entries = fs::read_dir(dir).map_err(|source| FileSourceError::ReadDir {
        path: dir.to_owned(),
        source,
    })?;
    Ok(entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_file() && is_manifest(path))
        .collect())
}

/// A file read (its documents that did not parse included) and its text.
type Parsed = (Read, LastGood);

/// Compressing the text too, on the thread that read it.
/// A file that did not read, and its text if it was read.
type Unparsed = (ManifestError, Option<LastGood>);

fn read_and_parse(file: &Path) -> Result<Parsed, Unparsed> {
    let text = read_text(file).map_err(|error| (error, None))?;
    match read_noting(file, &text) {
        Ok(read) => Ok((read, LastGood::new(&text))),
        Err(error) => Err((error, Some(LastGood::new(&text)))),
    }
}

/// `file`'s objects and the documents that do not read, with one line naming the objects
/// of kinds socklb does not read: a typo in a kind (`Sevice`) is seen there, where it would
/// otherwise leave a Service out unsaid.
fn read_noting(file: &Path, text: &str) -> Result<Read, ManifestError> {
    let read = super::manifest::read(file, text)?;
    if !read.passed_over.is_empty() {
        info!(
            file = %file.display(),
            objects = %crate::listed(&read.passed_over),
            "passed over: kinds socklb does not read (it reads Service, EndpointSlice, Node, \
             Pod and Namespace)"
        );
    }
    Ok(read)
}

/// Documents that did not read, each with whether its object keeps its last good state
/// (it is among `kept`; for a document that cannot be named, whether any object is).
fn said(bad: Vec<BadDocument>, kept: &[Object]) -> impl Iterator<Item = BadObject> {
    let kept = ObjectIds::of(kept);
    bad.into_iter().map(move |document| BadObject {
        kept: match &document.object {
            Some(id) => kept.contains(id),
            None => !kept.is_empty(),
        },
        document,
    })
}

fn read_text(file: &Path) -> Result<String, ManifestError> {
    fs::read_to_string(file).map_err(|e| ManifestError {
        file: file.to_owned(),
        line: None,
        message: e.to_string(),
    })
}

/// Whether a file of the directory is read, by its name.
fn is_manifest(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// Objects of a text that parsed before (some of its documents perhaps not), so parses
/// again.
fn parse_last_good(file: &Path, text: &str) -> Vec<Object> {
    super::manifest::read(file, text)
        .map(|read| read.objects)
        .unwrap_or_default()
}

/// The changed files' objects that are gone, then every object they hold: the state
/// compares each with what it has, so the unchanged ones cost a comparison, and the old text
/// need not be parsed again.
fn differences(changed: Vec<Changed>) -> Vec<Event> {
    let mut deleted = Vec::new();
    let mut applied = Vec::new();
    for Changed { lost, new, .. } in changed {
        deleted.extend(lost.into_iter().map(|id| Event::Deleted(identity_only(id))));
        applied.extend(new.into_iter().map(Event::Applied));
    }
    deleted.extend(applied);
    deleted
}

/// A deleted object as the file source knows it: only its kind, namespace and name.
fn identity_only((kind, namespace, name): ObjectId) -> Object {
    let metadata = ObjectMeta {
        namespace: (!matches!(kind, Kind::Node | Kind::Namespace)).then_some(namespace),
        name: Some(name),
        ..ObjectMeta::default()
    };
    match kind {
        Kind::Service => Object::Service(Box::new(Service {
            metadata,
            ..Service::default()
        })),
        Kind::EndpointSlice => Object::EndpointSlice(Box::new(EndpointSlice {
            metadata,
            ..EndpointSlice::default()
        })),
        Kind::Node => Object::Node(Box::new(Node {
            metadata,
            ..Node::default()
        })),
        Kind::Pod => Object::Pod(Box::new(Pod {
            metadata,
            ..Pod::default()
        })),
        Kind::Namespace => Object::Namespace(Box::new(Namespace {
            metadata,
            ..Namespace::default()
        })),
    }
}

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

/// A problem with the directory itself: logged when it starts or changes, and when it ends.
/// Meanwhile the objects stay as they were, and the directory is tried every [`RECHECK`].
#[derive(Debug, Default)]
struct Trouble(Option<String>);

impl Trouble {
    fn report(&mut self, dir: &Path, problem: String) {
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

    fn clear(&mut self, dir: &Path) {
        if self.0.take().is_some() {
            info!(dir = %dir.display(), "manifests directory read again");
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

type WatchEvent = notify::Result<notify::Event>;

/// One warning for a document that does not parse, saying what becomes of its object.
fn log_bad_document(bad: &BadObject) {
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
fn log_held(held: &[(PathBuf, Held)], logged: &mut HashSet<PathBuf>) {
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

/// Which files are being written, from inotify's events: a file whose data changed (or that
/// was created) and that no writer has closed since.
#[derive(Debug, Default)]
struct Writers {
    /// By file: when its data last changed.
    open: HashMap<PathBuf, Instant>,
    /// By file, open or closed: when its data last changed.
    changed: HashMap<PathBuf, Instant>,
    /// Files held past HOLD_MAX that were read anyway (logged once).
    expired: HashSet<PathBuf>,
}

impl Writers {
    fn note(&mut self, event: &WatchEvent, now: Instant) {
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
    fn settled(&self, file: &Path, now: Instant) -> bool {
        self.settled_at(file).is_none_or(|at| now >= at)
    }

    /// When `file` will have been unchanged for [`SETTLE`].
    fn settled_at(&self, file: &Path) -> Option<Instant> {
        self.changed.get(file).map(|changed| *changed + SETTLE)
    }

    /// Whether `file` is held back at `now`.
    fn writing(&self, file: &Path, now: Instant) -> bool {
        self.open
            .get(file)
            .is_some_and(|changed| now < *changed + HOLD_MAX)
    }

    /// Files still open but unchanged for HOLD_MAX that were not reported yet.
    fn expired(&mut self, now: Instant) -> Vec<PathBuf> {
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
    fn due(&self) -> Option<Instant> {
        self.open
            .iter()
            .filter(|(file, _)| !self.expired.contains(*file))
            .map(|(_, changed)| *changed + HOLD_MAX)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch manifests directory, removed when dropped.
    struct Dir(PathBuf);

    impl Dir {
        fn new(test: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("socklb-manifests-{test}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("create the manifests dir");
            Self(dir)
        }

        fn write(&self, file: &str, text: &str) {
            fs::write(self.0.join(file), text).expect("write a manifest");
        }

        fn remove(&self, file: &str) {
            fs::remove_file(self.0.join(file)).expect("remove a manifest");
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn service(name: &str, ip: &str) -> String {
        format!(
            "kind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: {ip}}}\n---\n"
        )
    }

    /// The events of a reload, one line each: "reset Service 2", "applied Service web".
    fn read(manifests: &mut Manifests, dir: &Dir) -> Vec<String> {
        lines(&manifests.reload(&dir.0).expect("reload").events)
    }

    fn lines(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|event| match event {
                Event::Reset(kind, objects) => format!("reset {kind:?} {}", objects.len()),
                Event::Applied(object) => format!("applied {:?} {}", object.kind(), name(object)),
                Event::Deleted(object) => format!("deleted {:?} {}", object.kind(), name(object)),
                Event::Listing(kind) => format!("listing {kind:?}"),
                Event::Listed(kind) => format!("listed {kind:?}"),
            })
            .collect()
    }

    fn name(object: &Object) -> String {
        object_id(object).2
    }

    /// The events of a read that resets every kind, with `services` Services and nothing
    /// else.
    fn resets_with_services(services: usize) -> [String; 5] {
        [
            "reset Node 0".to_owned(),
            format!("reset Service {services}"),
            "reset EndpointSlice 0".to_owned(),
            "reset Namespace 0".to_owned(),
            "reset Pod 0".to_owned(),
        ]
    }

    #[test]
    fn the_first_read_resets_every_kind() {
        let dir = Dir::new("first");
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.1") + &service("db", "10.96.0.2")),
        );
        let mut manifests = Manifests::default();
        assert_eq!(read(&mut manifests, &dir), resets_with_services(2));
    }

    #[test]
    fn the_agent_s_first_read_lists_file_by_file_and_workloads_whole() {
        let dir = Dir::new("streamed");
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.1") + &service("db", "10.96.0.2")),
        );
        dir.write("b.yaml", "kind: Service\nmetadata: [\n");
        dir.write(
            "c.yaml",
            &(service("web", "10.96.0.9")
                + "kind: Pod\nmetadata: {name: p, namespace: default}\n---\n"),
        );
        let mut manifests = Manifests::default();
        let mut first = manifests.first_read(&dir.0, |_| false).expect("read");
        let mut events = Vec::new();
        while let Some(batch) = manifests.read_next(&mut first) {
            events.extend(batch);
        }
        // The later copy of web is applied last, so it wins, as in a Reset.
        assert_eq!(
            lines(&events),
            [
                "listing Node",
                "listing Service",
                "listing EndpointSlice",
                "applied Service web",
                "applied Service db",
                "applied Service web",
                "reset Namespace 0",
                "reset Pod 1",
                "listed Node",
                "listed Service",
                "listed EndpointSlice",
            ]
        );
        let bad = first.finish().bad_documents;
        assert!(
            bad.len() == 1 && bad[0].document.file.ends_with("b.yaml") && !bad[0].kept,
            "{bad:?}"
        );
        // Later reads send what changed: the broken file, fixed.
        dir.write("b.yaml", &service("cache", "10.96.0.3"));
        assert_eq!(read(&mut manifests, &dir), ["applied Service cache"]);
    }

    #[test]
    fn a_re_read_sends_the_changed_files_objects_and_what_they_lost() {
        let dir = Dir::new("changes");
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.1") + &service("db", "10.96.0.2")),
        );
        dir.write("b.yaml", &service("cache", "10.96.0.3"));
        let mut manifests = Manifests::default();
        read(&mut manifests, &dir);

        // (what the directory becomes, what is sent: nothing of the files that did not
        // change; every object of a changed file, after those it lost)
        let steps: [(&dyn Fn(), &[&str]); 5] = [
            (&|| {}, &[]),
            (
                &|| {
                    dir.write(
                        "a.yaml",
                        &(service("web", "10.96.0.9") + &service("db", "10.96.0.2")),
                    )
                },
                &["applied Service web", "applied Service db"],
            ),
            (
                &|| dir.write("a.yaml", &service("web", "10.96.0.9")),
                &["deleted Service db", "applied Service web"],
            ),
            (
                &|| dir.write("c.yaml", &service("api", "10.96.0.4")),
                &["applied Service api"],
            ),
            (&|| dir.remove("b.yaml"), &["deleted Service cache"]),
        ];
        for (step, (change, expected)) in steps.into_iter().enumerate() {
            change();
            assert_eq!(read(&mut manifests, &dir), expected, "step {step}");
        }
    }

    #[test]
    fn an_object_defined_in_two_places_resets_everything() {
        let dir = Dir::new("duplicates");
        dir.write("a.yaml", &service("web", "10.96.0.1"));
        let mut manifests = Manifests::default();
        read(&mut manifests, &dir);
        // Which copy wins depends on every file: only a reset says it.
        dir.write("b.yaml", &service("web", "10.96.0.2"));
        assert_eq!(read(&mut manifests, &dir), resets_with_services(2));
        // Moving it back to one place: a reset again, then changes only.
        dir.remove("b.yaml");
        assert_eq!(read(&mut manifests, &dir), resets_with_services(1));
        dir.write("a.yaml", &service("web", "10.96.0.3"));
        assert_eq!(read(&mut manifests, &dir), ["applied Service web"]);
    }

    #[test]
    fn an_object_without_namespace_is_the_one_in_default() {
        let dir = Dir::new("namespace");
        dir.write("a.yaml", &service("web", "10.96.0.1"));
        let mut manifests = Manifests::default();
        read(&mut manifests, &dir);
        dir.write(
            "b.yaml",
            "kind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.2}\n",
        );
        assert_eq!(read(&mut manifests, &dir), resets_with_services(2));
    }

    #[test]
    fn a_broken_file_keeps_its_last_good_objects() {
        let dir = Dir::new("broken");
        dir.write(
            "svc.yaml",
            &(service("web", "10.96.0.1") + &service("db", "10.96.0.2")),
        );
        dir.write("list.json", &json_services(&[("api", "10.96.0.4")]));
        let mut manifests = Manifests::default();
        read(&mut manifests, &dir);

        // A syntax error: which object its document was cannot be read, so every object
        // the file no longer holds keeps its last good state.
        dir.write("svc.yaml", "kind: Service\nmetadata: {name: [\n");
        // A file broken from its start holds nothing to keep.
        dir.write("new.yaml", "kind: Service\nmetadata: {name: [\n");
        // JSON with a syntax error does not parse at all: the file keeps its objects whole.
        dir.write("list.json", "{\"kind\": \"List\", \"items\": [");
        let reload = manifests.reload(&dir.0).expect("reload");
        assert!(
            reload.errors.len() == 1 && manifests.holds(&reload.errors[0].file),
            "{:?}",
            reload.errors
        );
        let kept: Vec<(&str, bool)> = reload
            .bad_documents
            .iter()
            .map(|bad| (file_name(&bad.document.file), bad.kept))
            .collect();
        assert_eq!(kept, [("new.yaml", false), ("svc.yaml", true)]);
        // Said once: another file's change reads neither again.
        dir.write("other.yaml", &service("other", "10.96.0.3"));
        let again = manifests.reload(&dir.0).expect("reload");
        assert!(
            again.errors.is_empty() && again.bad_documents.is_empty(),
            "{again:?}"
        );
        dir.remove("new.yaml");
        assert!(
            reload.events.is_empty(),
            "nothing is deleted: {:?}",
            reload.events
        );

        // The next good text is compared with the last good one.
        dir.write("svc.yaml", &service("web", "10.96.0.1"));
        assert_eq!(
            read(&mut manifests, &dir),
            ["deleted Service db", "applied Service web"]
        );
        dir.write("list.json", &json_services(&[]));
        assert_eq!(read(&mut manifests, &dir), ["deleted Service api"]);
    }

    /// A Service whose `ports` is not a list: its document does not parse.
    fn bad_service(name: &str, ip: &str) -> String {
        format!(
            "kind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{clusterIP: {ip}, ports: 5}}\n---\n"
        )
    }

    /// A `kubectl get -o json` List of Services.
    fn json_services(services: &[(&str, &str)]) -> String {
        let items: Vec<String> = services
            .iter()
            .map(|(name, ip)| {
                format!(
                    r#"{{"kind": "Service", "metadata": {{"name": "{name}", "namespace": "default"}}, "spec": {{"clusterIP": "{ip}"}}}}"#
                )
            })
            .collect();
        format!(r#"{{"kind": "List", "items": [{}]}}"#, items.join(", "))
    }

    fn file_name(file: &Path) -> &str {
        file.file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default()
    }

    /// The clusterIP of each Service of a reset, by name.
    fn reset_services(events: &[Event]) -> BTreeMap<String, String> {
        events
            .iter()
            .filter_map(|event| match event {
                Event::Reset(Kind::Service, objects) => Some(objects),
                _ => None,
            })
            .flatten()
            .filter_map(|object| match object {
                Object::Service(service) => {
                    Some((name(object), service.spec.as_ref()?.cluster_ip.clone()?))
                }
                _ => None,
            })
            .collect()
    }

    /// At a first read (an agent's start, `socklb explain`) nothing of a bad document's
    /// object is known: it is left out, and its file's other objects are read.
    #[test]
    fn a_file_with_a_bad_document_serves_the_others_at_the_first_read() {
        let dir = Dir::new("bad-first");
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.1")
                + &bad_service("db", "10.96.0.2")
                + &service("cache", "10.96.0.3")),
        );
        let mut manifests = Manifests::default();
        let mut first = manifests.first_read(&dir.0, |_| false).expect("read");
        let mut events = Vec::new();
        while let Some(batch) = manifests.read_next(&mut first) {
            events.extend(batch);
        }
        let applied: Vec<String> = lines(&events)
            .into_iter()
            .filter(|line| line.starts_with("applied"))
            .collect();
        assert_eq!(applied, ["applied Service web", "applied Service cache"]);
        let bad = first.finish().bad_documents;
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(!bad[0].kept);
        assert_eq!(
            bad[0].document.object,
            Some((Kind::Service, "default".to_owned(), "db".to_owned()))
        );
        assert_eq!(
            bad[0].document.line, 7,
            "the line of spec: {}",
            bad[0].document
        );

        // `Manifests::reload`'s first read too.
        let mut manifests = Manifests::default();
        let reload = manifests.reload(&dir.0).expect("reload");
        assert_eq!(
            reset_services(&reload.events)
                .into_keys()
                .collect::<Vec<_>>(),
            ["cache", "web"]
        );
        assert_eq!(reload.bad_documents.len(), 1);

        // Fixed: applied as any change.
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.1")
                + &service("db", "10.96.0.2")
                + &service("cache", "10.96.0.3")),
        );
        assert_eq!(
            read(&mut manifests, &dir),
            [
                "applied Service web",
                "applied Service db",
                "applied Service cache"
            ]
        );
    }

    /// While the agent runs, an object whose document stops parsing keeps its last good
    /// state, per object: its file's other objects take their new state, and the kept one
    /// takes its new state once its document is fixed, or goes once it is removed.
    #[test]
    fn a_document_turned_bad_keeps_its_object_while_its_neighbours_change() {
        let dir = Dir::new("bad-later");
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.1")
                + &service("db", "10.96.0.2")
                + &service("cache", "10.96.0.3")),
        );
        let mut manifests = Manifests::default();
        read(&mut manifests, &dir);

        // db's document turns bad; web changes, cache goes.
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.9") + &bad_service("db", "10.96.0.22")),
        );
        let reload = manifests.reload(&dir.0).expect("reload");
        assert_eq!(
            lines(&reload.events),
            ["deleted Service cache", "applied Service web"]
        );
        assert!(
            reload.bad_documents.len() == 1 && reload.bad_documents[0].kept,
            "{:?}",
            reload.bad_documents
        );
        let said = reload.bad_documents[0].document.to_string();
        assert!(
            said.contains("Service default/db") && said.contains("a.yaml:"),
            "{said}"
        );

        // Other edits of the file leave it kept, and said once per text.
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.9")
                + &bad_service("db", "10.96.0.22")
                + &service("api", "10.96.0.4")),
        );
        let reload = manifests.reload(&dir.0).expect("reload");
        assert_eq!(
            lines(&reload.events),
            ["applied Service web", "applied Service api"]
        );
        assert!(reload.bad_documents[0].kept);
        // An object defined twice resets everything: the kept one is there, as it was.
        dir.write("b.yaml", &service("api", "10.96.0.5"));
        let reload = manifests.reload(&dir.0).expect("reload");
        assert!(reload.bad_documents.is_empty(), "said once");
        let services = reset_services(&reload.events);
        assert_eq!(services.get("db").map(String::as_str), Some("10.96.0.2"));
        assert_eq!(services.len(), 3, "{services:?}");
        dir.remove("b.yaml");
        read(&mut manifests, &dir);

        // Fixed: its new state is applied.
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.9")
                + &service("db", "10.96.0.22")
                + &service("api", "10.96.0.4")),
        );
        let reload = manifests.reload(&dir.0).expect("reload");
        assert!(reload.bad_documents.is_empty());
        assert_eq!(
            lines(&reload.events),
            [
                "applied Service web",
                "applied Service db",
                "applied Service api"
            ]
        );

        // Bad again, then removed: deleted.
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.9")
                + &bad_service("db", "10.96.0.23")
                + &service("api", "10.96.0.4")),
        );
        assert_eq!(
            read(&mut manifests, &dir),
            ["applied Service web", "applied Service api"]
        );
        dir.write(
            "a.yaml",
            &(service("web", "10.96.0.9") + &service("api", "10.96.0.4")),
        );
        assert_eq!(
            read(&mut manifests, &dir),
            [
                "deleted Service db",
                "applied Service web",
                "applied Service api"
            ]
        );
    }

    #[test]
    fn a_file_being_written_keeps_its_objects_until_it_is_closed() {
        let dir = Dir::new("writing");
        dir.write(
            "svc.yaml",
            &(service("web", "10.96.0.1") + &service("db", "10.96.0.2")),
        );
        let mut manifests = Manifests::default();
        read(&mut manifests, &dir);

        // Truncated by `cmd > svc.yaml`, not closed yet: not read at all.
        dir.write("svc.yaml", "");
        let path = dir.0.join("svc.yaml");
        let reload = manifests
            .reload_except(&dir.0, |file| file == path)
            .expect("reload");
        assert!(reload.events.is_empty(), "{:?}", reload.events);
        assert_eq!(reload.held, [(path.clone(), Held::Writing)]);
        // Closed with its new text: read as any change.
        dir.write("svc.yaml", &service("web", "10.96.0.1"));
        assert_eq!(
            read(&mut manifests, &dir),
            ["deleted Service db", "applied Service web"]
        );
    }

    #[test]
    fn an_emptied_file_is_read_twice_before_its_objects_are_deleted() {
        let dir = Dir::new("emptied");
        dir.write("svc.yaml", &service("web", "10.96.0.1"));
        dir.write("other.yaml", &service("api", "10.96.0.3"));
        let mut manifests = Manifests::default();
        read(&mut manifests, &dir);

        dir.write("svc.yaml", "\n");
        let reload = manifests.reload(&dir.0).expect("reload");
        assert!(reload.events.is_empty(), "{:?}", reload.events);
        assert_eq!(reload.held, [(dir.0.join("svc.yaml"), Held::Emptied)]);
        // Still empty a debounce later: the writer meant it.
        assert_eq!(read(&mut manifests, &dir), ["deleted Service web"]);

        // Emptied, then written again before the second read: nothing is deleted.
        dir.write("other.yaml", "");
        read(&mut manifests, &dir);
        dir.write("other.yaml", &service("api", "10.96.0.4"));
        assert_eq!(read(&mut manifests, &dir), ["applied Service api"]);
        // A file that held nothing is read at once.
        dir.write("svc.yaml", "");
        assert_eq!(read(&mut manifests, &dir), Vec::<String>::new());
    }

    #[test]
    fn a_shorter_file_is_read_only_once_it_settled() {
        let dir = Dir::new("settling");
        dir.write(
            "svc.yaml",
            &(service("web", "10.96.0.1") + "---\n" + &service("db", "10.96.0.2")),
        );
        let mut manifests = Manifests::default();
        read(&mut manifests, &dir);
        let path = dir.0.join("svc.yaml");

        // `> svc.yaml` wrote its first part and closed it; `>> svc.yaml` comes later.
        dir.write("svc.yaml", &service("web", "10.96.0.1"));
        let reload = manifests
            .reload_settling(&dir.0, |_| false, |_| false)
            .expect("reload");
        assert!(reload.events.is_empty(), "{:?}", reload.events);
        assert_eq!(reload.held, [(path.clone(), Held::Settling)]);
        // The second part: the file is whole again, and nothing was lost meanwhile.
        dir.write(
            "svc.yaml",
            &(service("web", "10.96.0.1") + "---\n" + &service("db", "10.96.0.2")),
        );
        let reload = manifests
            .reload_settling(&dir.0, |_| false, |_| false)
            .expect("reload");
        assert!(
            reload.events.is_empty() && reload.held.is_empty(),
            "{reload:?}"
        );

        // A change that is not shorter is read at once, settled or not.
        dir.write(
            "svc.yaml",
            &(service("web", "10.96.0.9") + "---\n" + &service("db", "10.96.0.2")),
        );
        let reload = manifests
            .reload_settling(&dir.0, |_| false, |_| false)
            .expect("reload");
        assert_eq!(reload.events.len(), 2, "{:?}", reload.events);
        // Nor is a change a few bytes shorter that loses nothing (an address edited).
        for ip in ["10.96.0.19", "10.96.0.9"] {
            dir.write(
                "svc.yaml",
                &(service("web", ip) + "---\n" + &service("db", "10.96.0.2")),
            );
            let reload = manifests
                .reload_settling(&dir.0, |_| false, |_| false)
                .expect("reload");
            assert_eq!(reload.events.len(), 2, "{ip}: {:?}", reload.events);
        }
        // Shorter and settled (unchanged for SETTLE): it meant it.
        dir.write("svc.yaml", &service("web", "10.96.0.9"));
        assert_eq!(
            read(&mut manifests, &dir),
            ["deleted Service db", "applied Service web"]
        );
    }

    fn event(kind: EventKind, file: &Path) -> WatchEvent {
        Ok(notify::Event::new(kind).add_path(file.to_owned()))
    }

    #[test]
    fn writers_are_followed_from_the_first_change_to_the_close() {
        use notify::event::{DataChange, RemoveKind};
        let file = Path::new("/m/svc.yaml");
        let modify = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        let closed = EventKind::Access(AccessKind::Close(AccessMode::Write));
        let moved_in = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        let start = Instant::now();
        // (event, writing afterwards)
        let rows = [
            (modify, true),
            (closed, false),
            (EventKind::Create(CreateKind::File), true),
            (EventKind::Access(AccessKind::Close(AccessMode::Read)), true),
            (moved_in, false),
            (modify, true),
            (EventKind::Remove(RemoveKind::File), false),
        ];
        let mut writers = Writers::default();
        for (row, (kind, writing)) in rows.into_iter().enumerate() {
            writers.note(&event(kind, file), start);
            assert_eq!(writers.writing(file, start), writing, "row {row}: {kind:?}");
        }
        // Other files (an editor's swap file) are not followed.
        writers.note(&event(modify, Path::new("/m/.svc.yaml.swp")), start);
        assert_eq!(writers.due(), None);
        // A writer that keeps the file open without changing it is read after HOLD_MAX.
        writers.note(&event(modify, file), start);
        assert_eq!(writers.due(), Some(start + HOLD_MAX));
        assert!(writers.writing(file, start + HOLD_MAX / 2));
        assert!(!writers.writing(file, start + HOLD_MAX));
        assert_eq!(writers.expired(start + HOLD_MAX), [file.to_owned()]);
        assert!(
            writers.expired(start + HOLD_MAX).is_empty(),
            "reported once"
        );
        assert_eq!(writers.due(), None);
    }

    /// On tokio's paused clock, which moves only when every task waits: the result is exact
    /// and the machine's load cannot change it.
    #[tokio::test(start_paused = true)]
    async fn a_stream_of_changes_is_read_at_least_every_debounce_max() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let file = Path::new("/m/noise.yaml");
        let kind = EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any));
        // A change every 10 ms for 3 s.
        let noise = tokio::spawn(async move {
            for _ in 0..300 {
                if tx.send(event(kind, file)).is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let started = Instant::now();
        assert!(settle(&mut rx, &mut Writers::default()).await);
        let waited = started.elapsed();
        noise.abort();
        assert_eq!(waited, DEBOUNCE_MAX, "the burst held the read off");
    }

    /// The clusterIP of the next Service `name` the source sends, waiting up to 10 s.
    async fn next_cluster_ip(events: &mut mpsc::Receiver<Event>, name: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let event = tokio::time::timeout_at(deadline, events.recv())
                .await
                .unwrap_or_else(|_| panic!("no Service {name} sent within 10 s"))
                .expect("the source ended");
            let services = match event {
                Event::Applied(object) => vec![object],
                Event::Reset(Kind::Service, objects) => objects,
                _ => continue,
            };
            for object in services {
                if let Object::Service(service) = object
                    && service.metadata.name.as_deref() == Some(name)
                {
                    return service
                        .spec
                        .and_then(|spec| spec.cluster_ip)
                        .expect("a clusterIP");
                }
            }
        }
    }

    #[tokio::test]
    async fn a_directory_replaced_or_gone_for_a_while_is_followed() {
        let root = Dir::new("followed");
        let path = root.0.join("manifests");
        let write = |dir: &str, ip: &str| {
            fs::write(root.0.join(dir).join("web.yaml"), service("web", ip))
                .expect("write a manifest");
        };
        fs::create_dir(&path).expect("create the manifests dir");
        write("manifests", "10.96.0.10");
        let (sender, mut events) = mpsc::channel(64);
        let source = tokio::spawn(FileSource::new(path.clone()).run(sender));
        assert_eq!(next_cluster_ip(&mut events, "web").await, "10.96.0.10");

        // Replaced whole: a new directory renamed over the path, then edited there.
        fs::create_dir(root.0.join("new")).expect("create the new dir");
        write("new", "10.96.0.11");
        fs::rename(&path, root.0.join("old")).expect("move the old dir away");
        fs::rename(root.0.join("new"), &path).expect("move the new dir in");
        assert_eq!(next_cluster_ip(&mut events, "web").await, "10.96.0.11");
        write("manifests", "10.96.0.12");
        assert_eq!(next_cluster_ip(&mut events, "web").await, "10.96.0.12");

        // Gone for longer than a check (the scenario's length, not a synchronisation),
        // changed meanwhile, then back: read again, and the source never stopped.
        fs::rename(&path, root.0.join("away")).expect("move the dir away");
        write("away", "10.96.0.13");
        tokio::time::sleep(RECHECK * 2).await;
        assert!(
            !source.is_finished(),
            "the source stopped while the directory was gone"
        );
        fs::rename(root.0.join("away"), &path).expect("move the dir back");
        assert_eq!(next_cluster_ip(&mut events, "web").await, "10.96.0.13");

        // Removed and made again at once (its inode number may come back): watched anew.
        fs::remove_dir_all(&path).expect("remove the dir");
        fs::create_dir(&path).expect("make the dir again");
        write("manifests", "10.96.0.14");
        assert_eq!(next_cluster_ip(&mut events, "web").await, "10.96.0.14");
        write("manifests", "10.96.0.15");
        assert_eq!(next_cluster_ip(&mut events, "web").await, "10.96.0.15");
        source.abort();
    }
}
