//! The objects of a manifests directory, read file by file: each file's last text is kept,
//! so that a re-read parses only the files whose text changed and sends what they changed,
//! and a file that no longer parses keeps its last good objects.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
};

use k8s_openapi::{
    api::{
        core::v1::{Namespace, Node, Pod, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use tracing::{info, warn};

use super::error::FileSourceError;
use crate::source::{
    Event, Kind, Object,
    last_good::LastGood,
    manifest::{BadDocument, ManifestError, Read},
    object_ids::{self, ObjectId, ObjectIds, Seen, object_id},
    read_ahead::{self, ReadAhead},
};

/// Bytes a file may shrink by without waiting for [`SETTLE`](super::timing::SETTLE): an edited address or port
/// (an endpoint replaced), which must not be slowed down.
const SHRINK_MARGIN: usize = 16;

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
    pub(super) read_before: bool,
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
    /// Lost objects or much of its text, and changed less than [`SETTLE`](super::timing::SETTLE) ago: perhaps
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

    /// Reads the directory again (the tests' shorthand).
    #[cfg(test)]
    pub fn reload(&mut self, dir: &Path) -> Result<Reload, FileSourceError> {
        self.reload_except(dir, |_| false)
    }

    /// Reads the directory again, except the files `writing` says are being written.
    #[cfg(test)]
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
    let read = crate::source::manifest::read(file, text)?;
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
pub(super) fn is_manifest(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml" | "json")
    )
}

/// Objects of a text that parsed before (some of its documents perhaps not), so parses
/// again.
fn parse_last_good(file: &Path, text: &str) -> Vec<Object> {
    crate::source::manifest::read(file, text)
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
