use std::{collections::BTreeMap, fs, path::Path, time::Duration};

use notify::event::{CreateKind, ModifyKind, RenameMode};

use super::*;
use crate::source::{Kind, Object, object_ids::object_id};

/// A scratch manifests directory, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("socklb-manifests-{test}-{}", std::process::id()));
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
        fs::write(root.0.join(dir).join("web.yaml"), service("web", ip)).expect("write a manifest");
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
