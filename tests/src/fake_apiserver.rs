//! A fake Kubernetes API server for testing API clients (the agent's `kube` source) without a
//! cluster: real HTTP on 127.0.0.1, list and watch with the API server's semantics, and a
//! handle through which tests change objects and inject the failures clients must survive.
//!
//! Faithful: one global resourceVersion (like etcd's revision); lists carry it in
//! `metadata.resourceVersion` and page with `limit`/`continue`; `?watch=true&resourceVersion=RV`
//! streams the changes after RV as newline-delimited JSON, with the transitions a filtered
//! watch sees (an object leaving the selector is `DELETED`); a watch from before the retained
//! history gets a 410 `ERROR` event in the stream, as from the real watch cache; bookmarks when
//! asked for; streamed lists (`sendInitialEvents=true`: the current objects as ADDED, then a
//! BOOKMARK annotated `k8s.io/initial-events-end`), or their refusal as by a server with the
//! WatchList feature off; label selectors (`k`, `!k`, `k=v`, `k==v`, `k!=v`) and field selectors on
//! `metadata.name`, `metadata.namespace` and `spec.nodeName`; `timeoutSeconds`; metadata-only responses for
//! `Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`.
//!
//! Not served: writes over HTTP (tests change objects through [`FakeApiServer`]), single-object
//! GETs, set-based selectors (`in`, `notin`), protobuf, tables, periodic bookmarks (sent only by
//! [`FakeApiServer::bookmark`], so that tests stay deterministic).
use std::{
    collections::{BTreeMap, HashMap},
    io,
    net::{Ipv4Addr, SocketAddr, TcpListener},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    thread::JoinHandle,
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri, header},
    response::Response,
    serve::ListenerExt as _,
};
use futures::StreamExt as _;
use k8s_openapi::{
    ListableResource,
    api::{
        core::v1::{Namespace, Node, Pod, Service},
        discovery::v1::EndpointSlice,
    },
};
use serde::Serialize;
use serde_json::{Value, json};
use socklb_agent::source::Object;
use tokio::sync::{mpsc, oneshot};

/// A watch without `timeoutSeconds` lasts this long (the real server picks 30-60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// The fake API server. Serves Services, EndpointSlices, Nodes, Pods and Namespaces from the
/// start; any other listable kind once an object of it is applied. Stops when dropped.
pub struct FakeApiServer {
    store: Arc<Mutex<Store>>,
    addr: SocketAddr,
    running: Option<Running>,
}

/// A request the server answered, for tests that check what a client asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// The collection, e.g. `/api/v1/services` (namespaced requests included).
    pub path: String,
    pub watch: bool,
    /// Whether the client asked for PartialObjectMetadata.
    pub metadata_only: bool,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    /// `resourceVersion` as asked ("0": any version, e.g. from the watch cache).
    pub resource_version: Option<String>,
    /// A watch that streams the list first (`sendInitialEvents=true`).
    pub send_initial_events: bool,
}

impl FakeApiServer {
    /// Starts serving on an ephemeral port of 127.0.0.1, on a thread with its own tokio
    /// runtime, so that plain `#[test]`s and `#[tokio::test]`s can both use it.
    pub fn start() -> Self {
        Self::start_on(Ipv4Addr::LOCALHOST)
    }

    /// Starts serving on an ephemeral port of `address` (`0.0.0.0`: every address of the
    /// network namespace, for clients on other hosts of a test network).
    pub fn start_on(address: Ipv4Addr) -> Self {
        let mut store = Store::new();
        store.register::<Service>();
        store.register::<EndpointSlice>();
        store.register::<Node>();
        store.register::<Pod>();
        store.register::<Namespace>();
        let listener =
            TcpListener::bind((address, 0)).unwrap_or_else(|e| panic!("bind {address}:0: {e}"));
        let addr = listener
            .local_addr()
            .expect("local address of the listener");
        let store = Arc::new(Mutex::new(store));
        let running = Some(Running::spawn(store.clone(), listener));
        Self {
            store,
            addr,
            running,
        }
    }

    /// The base URL for a client (`kube::Config::new(url.parse()?)`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The port it listens on, for clients that reach it through another address.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Creates or replaces an object (namespace and name from its metadata) and returns its
    /// new resourceVersion. Open watches see the change.
    pub fn apply<K: ListableResource + Serialize>(&self, object: &K) -> String {
        let mut store = self.lock();
        let path = store.register::<K>();
        let value = serde_json::to_value(object).expect("serialize the object");
        let key = key_of(&value);
        assert!(!key.1.is_empty(), "apply: the object has no metadata.name");
        store.change(&path, key, Some(value)).to_string()
    }

    /// Applies every object of a kind the agent reads in a YAML manifest text (parsed as the
    /// agent's file source parses it).
    pub fn apply_manifests(&self, yaml: &str) {
        let objects = socklb_agent::source::file::parse(std::path::Path::new("test.yaml"), yaml)
            .unwrap_or_else(|e| panic!("the test's manifests do not parse: {e}"));
        for object in &objects {
            self.apply_object(object);
        }
    }

    /// Applies one object of a kind the agent reads.
    pub fn apply_object(&self, object: &Object) {
        match object {
            Object::Service(service) => self.apply(&**service),
            Object::EndpointSlice(slice) => self.apply(&**slice),
            Object::Node(node) => self.apply(&**node),
            Object::Pod(pod) => self.apply(&**pod),
            Object::Namespace(namespace) => self.apply(&**namespace),
        };
    }

    /// A kubeconfig for this server (no authentication), for `socklb run --kubeconfig`.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: \"{}\"}}}}]
users: [{{name: test, user: {{}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: test}}}}]
current-context: fake
",
            self.url()
        )
    }

    /// Deletes an object (`namespace` is `None` for cluster-scoped kinds) and returns the
    /// resourceVersion of the deletion; panics if there is no such object.
    pub fn delete<K: ListableResource>(&self, namespace: Option<&str>, name: &str) -> String {
        let mut store = self.lock();
        let path = store.register::<K>();
        let key = (namespace.unwrap_or_default().to_owned(), name.to_owned());
        let exists = store
            .collections
            .get(&path)
            .is_some_and(|c| c.objects.contains_key(&key));
        assert!(exists, "delete: no {} {key:?}", K::KIND);
        store.change(&path, key, None).to_string()
    }

    /// Forgets the change history, as etcd compaction does: the next watch from an older
    /// resourceVersion gets 410 Gone, and continue tokens expire.
    pub fn compact(&self) {
        let mut store = self.lock();
        store.oldest = store.revision;
        store.history.clear();
        store.pages.clear();
    }

    /// Breaks every open watch connection mid-stream (no end of the chunked body), as a
    /// failing network or load balancer does.
    pub fn drop_watches(&self) {
        for watch in self.lock().watches.drain(..) {
            let _ = watch.tx.send(Signal::Break);
        }
    }

    /// Sends a BOOKMARK with the current resourceVersion to every open watch that allows
    /// them; returns how many got one.
    pub fn bookmark(&self) -> usize {
        let mut store = self.lock();
        let revision = store.revision;
        let mut sent = 0;
        store.watches.retain(|watch| {
            if !watch.bookmarks {
                return !watch.tx.is_closed();
            }
            let line = watch.bookmark(revision);
            let delivered = watch.tx.send(Signal::Line(line)).is_ok();
            sent += usize::from(delivered);
            delivered
        });
        sent
    }

    /// The open watches, so that a test can wait until a client is watching before it
    /// breaks the connections.
    pub fn watch_count(&self) -> usize {
        let mut store = self.lock();
        store.watches.retain(|watch| !watch.tx.is_closed());
        store.watches.len()
    }

    /// How many watches were refused with 410 Gone.
    pub fn expired_count(&self) -> usize {
        self.lock().expired
    }

    /// Every list and watch request served so far.
    pub fn served(&self) -> Vec<Served> {
        self.lock().served.clone()
    }

    /// Stops serving, like a killed API server process: the listener closes and every
    /// connection is dropped. The objects and history stay (they live in etcd).
    pub fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.stop();
        }
        self.lock().watches.clear();
    }

    /// Answers every request with `code` (a `Status` with `reason`) for `duration`, as a
    /// restarted API server answers 403 Forbidden until its authorizer's cache is warm.
    /// Changes made meanwhile are kept and delivered afterwards.
    pub fn refuse_for(&self, code: u16, reason: &'static str, duration: Duration) {
        let code = StatusCode::from_u16(code).expect("an HTTP status code");
        let until = std::time::Instant::now() + duration;
        self.lock().refusing = Some((code, reason, until));
    }

    /// Refuses streamed lists from now on, as an API server with the WatchList feature off
    /// (Kubernetes 1.33's default) does: 422 Invalid.
    pub fn without_watch_list(&self) {
        self.lock().watch_list = false;
    }

    /// Serves again on the same address, after [`stop`](Self::stop) (or at once).
    pub fn restart(&mut self) {
        self.stop();
        let listener = TcpListener::bind(self.addr)
            .unwrap_or_else(|e| panic!("bind {} again for the restart: {e}", self.addr));
        self.running = Some(Running::spawn(self.store.clone(), listener));
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The serving thread of one server incarnation.
struct Running {
    stop: oneshot::Sender<()>,
    thread: JoinHandle<()>,
}

impl Running {
    fn spawn(store: Arc<Mutex<Store>>, listener: TcpListener) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let thread = std::thread::Builder::new()
            .name("fake-apiserver".to_owned())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("tokio runtime of the fake API server");
                runtime.block_on(async move {
                    // Like the real API server: no Nagle delay on watch streams.
                    let listener = tokio::net::TcpListener::from_std(listener)
                        .expect("tokio listener of the fake API server")
                        .tap_io(|tcp| {
                            let _ = tcp.set_nodelay(true);
                        });
                    let app = Router::new().fallback(handle).with_state(store);
                    tokio::select! {
                        result = axum::serve(listener, app) => {
                            if let Err(e) = result {
                                eprintln!("fake API server: {e}");
                            }
                        }
                        _ = stopped => {}
                    }
                });
                // Dropping the runtime drops every connection task: the abrupt end of a
                // killed process, not a graceful shutdown.
            })
            .expect("spawn the fake API server thread");
        Self { stop, thread }
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// Objects, history and open watches, shared by the handle and the HTTP handlers.
struct Store {
    /// The last resourceVersion handed out; global across kinds, like etcd's revision.
    revision: u64,
    /// Watches from a resourceVersion older than this get 410 Gone.
    oldest: u64,
    /// By collection path (`/api/v1/services`).
    collections: BTreeMap<String, Collection>,
    /// Changes after `oldest`, in order.
    history: Vec<Change>,
    watches: Vec<Watch>,
    /// Remaining items of paged lists, by continue token.
    pages: HashMap<String, Page>,
    next_page: u64,
    expired: usize,
    served: Vec<Served>,
    /// Until when every request is refused, and how (see [`FakeApiServer::refuse_for`]).
    refusing: Option<(StatusCode, &'static str, std::time::Instant)>,
    /// Streamed lists are served (the WatchList feature, on by default since Kubernetes
    /// 1.34).
    watch_list: bool,
}

struct Collection {
    kind: &'static str,
    api_version: &'static str,
    list_kind: &'static str,
    /// By (namespace, name), namespace empty for cluster-scoped kinds; sorted like etcd keys.
    objects: BTreeMap<(String, String), Value>,
    /// Each object's ADDED event line, encoded once when it is stored: the API server does
    /// not run on the node, so the lists of 100,000 objects it streams must not cost the
    /// node's CPU seconds of encoding.
    added: BTreeMap<(String, String), Bytes>,
}

impl Collection {
    /// The ADDED lines of the objects `request` selects. Both maps hold the same keys, so
    /// they walk in step: no lookup per object, as a watch cache streams what it holds.
    fn added_lines(&self, request: &ParsedRequest) -> Vec<Bytes> {
        self.objects
            .values()
            .zip(self.added.values())
            .filter(|(object, _)| request.filter.matches(object))
            .map(|(object, line)| {
                if request.metadata_only {
                    Bytes::from(event_line("ADDED", &shown(object, true)))
                } else {
                    line.clone()
                }
            })
            .collect()
    }
}

/// One change of one object: created (`old` is None), modified, or deleted (`new` is None).
struct Change {
    revision: u64,
    path: String,
    old: Option<Value>,
    new: Option<Value>,
}

struct Page {
    revision: u64,
    items: Vec<Value>,
}

enum Signal {
    Line(String),
    /// Break the connection.
    Break,
}

/// An open watch: what it selects and where its lines go.
struct Watch {
    path: String,
    filter: Filter,
    metadata_only: bool,
    bookmarks: bool,
    kind: &'static str,
    api_version: &'static str,
    tx: mpsc::UnboundedSender<Signal>,
}

impl Watch {
    /// The event this watch sees for a change, if any: a filtered watch sees an object that
    /// starts matching as ADDED and one that stops matching as DELETED.
    fn event(&self, change: &Change) -> Option<String> {
        if change.path != self.path {
            return None;
        }
        let was = change.old.as_ref().is_some_and(|o| self.filter.matches(o));
        match &change.new {
            Some(new) if self.filter.matches(new) => {
                let kind = if was { "MODIFIED" } else { "ADDED" };
                Some(event_line(kind, &shown(new, self.metadata_only)))
            }
            _ if was => {
                // The last state seen, at the resourceVersion of the change.
                let mut gone = change.old.clone().unwrap_or_default();
                gone["metadata"]["resourceVersion"] = json!(change.revision.to_string());
                Some(event_line("DELETED", &shown(&gone, self.metadata_only)))
            }
            _ => None,
        }
    }

    fn bookmark(&self, revision: u64) -> String {
        self.bookmark_with(revision, json!({}))
    }

    /// The bookmark that ends a streamed list's initial objects.
    fn initial_events_end(&self, revision: u64) -> String {
        self.bookmark_with(revision, json!({"k8s.io/initial-events-end": "true"}))
    }

    fn bookmark_with(&self, revision: u64, annotations: Value) -> String {
        let (kind, api_version) = if self.metadata_only {
            ("PartialObjectMetadata", "meta.k8s.io/v1")
        } else {
            (self.kind, self.api_version)
        };
        let object = json!({
            "kind": kind,
            "apiVersion": api_version,
            "metadata": {"resourceVersion": revision.to_string(), "annotations": annotations},
        });
        event_line("BOOKMARK", &object)
    }
}

impl Store {
    fn new() -> Self {
        Self {
            // etcd's first revision; "0" means "any version" to the API.
            revision: 1,
            oldest: 1,
            collections: BTreeMap::new(),
            history: Vec::new(),
            watches: Vec::new(),
            pages: HashMap::new(),
            next_page: 0,
            expired: 0,
            served: Vec::new(),
            refusing: None,
            watch_list: true,
        }
    }

    /// Serves K's collection (if not yet) and returns its path.
    fn register<K: ListableResource>(&mut self) -> String {
        let path = if K::GROUP.is_empty() {
            format!("/api/{}/{}", K::VERSION, K::URL_PATH_SEGMENT)
        } else {
            format!("/apis/{}/{}/{}", K::GROUP, K::VERSION, K::URL_PATH_SEGMENT)
        };
        self.collections
            .entry(path.clone())
            .or_insert_with(|| Collection {
                kind: K::KIND,
                api_version: K::API_VERSION,
                list_kind: K::LIST_KIND,
                objects: BTreeMap::new(),
                added: BTreeMap::new(),
            });
        path
    }

    /// Stores a new state of an object (`None`: deleted), records the change and sends it to
    /// the open watches; returns the change's resourceVersion.
    fn change(&mut self, path: &str, key: (String, String), new: Option<Value>) -> u64 {
        self.revision += 1;
        let revision = self.revision;
        let Some(collection) = self.collections.get_mut(path) else {
            return revision;
        };
        let new = new.map(|mut value| {
            value["metadata"]["resourceVersion"] = json!(revision.to_string());
            value
        });
        let old = match &new {
            Some(value) => {
                let line = Bytes::from(event_line("ADDED", value));
                collection.added.insert(key.clone(), line);
                collection.objects.insert(key, value.clone())
            }
            None => {
                collection.added.remove(&key);
                collection.objects.remove(&key)
            }
        };
        let change = Change {
            revision,
            path: path.to_owned(),
            old,
            new,
        };
        self.watches.retain(|watch| match watch.event(&change) {
            Some(line) => watch.tx.send(Signal::Line(line)).is_ok(),
            None => !watch.tx.is_closed(),
        });
        self.history.push(change);
        revision
    }

    fn list(&mut self, request: &ParsedRequest) -> Result<Value, Refusal> {
        let collection = &self.collections[&request.path];
        let (kind, api_version) = if request.metadata_only {
            ("PartialObjectMetadataList", "meta.k8s.io/v1")
        } else {
            (collection.list_kind, collection.api_version)
        };
        let (revision, mut items) = match request.query.get("continue") {
            Some(token) => {
                let page = self.pages.remove(token).ok_or_else(|| {
                    self.expired += 1;
                    Refusal::new(
                        StatusCode::GONE,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent \
                         list result. You can start a new list without the continue parameter.",
                    )
                })?;
                (page.revision, page.items)
            }
            None => {
                let items = collection
                    .objects
                    .values()
                    .filter(|object| request.filter.matches(object))
                    .map(|object| list_item(object, request.metadata_only))
                    .collect();
                (self.revision, items)
            }
        };
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        let limit = request.number("limit")?.unwrap_or(0);
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if limit > 0 && items.len() > limit {
            let rest = items.split_off(limit);
            self.next_page += 1;
            let token = format!("page-{}", self.next_page);
            metadata["continue"] = json!(token);
            metadata["remainingItemCount"] = json!(rest.len());
            self.pages.insert(
                token,
                Page {
                    revision,
                    items: rest,
                },
            );
        }
        Ok(json!({
            "kind": kind,
            "apiVersion": api_version,
            "metadata": metadata,
            "items": items,
        }))
    }

    /// The lines a new watch starts with, and its live feed unless it ends at once.
    fn watch(
        &mut self,
        request: &ParsedRequest,
    ) -> Result<(Vec<Bytes>, Option<mpsc::UnboundedReceiver<Signal>>), Refusal> {
        if request.flag("sendInitialEvents") {
            return self.streamed_list(request);
        }
        let from = match request.query.get("resourceVersion").map(String::as_str) {
            // No version or "0": the current objects as ADDED, then the changes.
            None | Some("" | "0") => None,
            Some(version) => Some(version.parse::<u64>().map_err(|_| {
                let message = format!("invalid resourceVersion {version:?}");
                Refusal::new(StatusCode::BAD_REQUEST, "BadRequest", message)
            })?),
        };
        if let Some(from) = from
            && from < self.oldest
        {
            self.expired += 1;
            let message = format!("too old resource version: {from} ({})", self.oldest);
            let error = status_object(410, "Expired", &message);
            return Ok((vec![Bytes::from(event_line("ERROR", &error))], None));
        }
        let (watch, rx) = self.new_watch(request);
        let initial = match from {
            None => self.collections[&request.path].added_lines(request),
            Some(from) => self
                .history
                .iter()
                .filter(|change| change.revision > from)
                .filter_map(|change| watch.event(change))
                .map(Bytes::from)
                .collect(),
        };
        self.watches.push(watch);
        Ok((initial, Some(rx)))
    }

    /// A watch that starts with the current objects and a bookmark that ends them, with the
    /// real server's validation of the request.
    fn streamed_list(
        &mut self,
        request: &ParsedRequest,
    ) -> Result<(Vec<Bytes>, Option<mpsc::UnboundedReceiver<Signal>>), Refusal> {
        let invalid = |message: &str| {
            Refusal::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                message.to_owned(),
            )
        };
        if !self.watch_list {
            return Err(invalid(
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless \
                 the WatchList feature gate is enabled",
            ));
        }
        if request
            .query
            .get("resourceVersionMatch")
            .map(String::as_str)
            != Some("NotOlderThan")
        {
            return Err(invalid(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting \
                 resourceVersionMatch to NotOlderThan",
            ));
        }
        if !request.flag("allowWatchBookmarks") {
            return Err(invalid(
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires allowWatchBookmarks",
            ));
        }
        let (watch, rx) = self.new_watch(request);
        let mut initial = self.collections[&request.path].added_lines(request);
        initial.push(Bytes::from(watch.initial_events_end(self.revision)));
        self.watches.push(watch);
        Ok((initial, Some(rx)))
    }

    fn new_watch(&self, request: &ParsedRequest) -> (Watch, mpsc::UnboundedReceiver<Signal>) {
        let collection = &self.collections[&request.path];
        let (tx, rx) = mpsc::unbounded_channel();
        let watch = Watch {
            path: request.path.clone(),
            filter: request.filter.clone(),
            metadata_only: request.metadata_only,
            bookmarks: request.flag("allowWatchBookmarks"),
            kind: collection.kind,
            api_version: collection.api_version,
            tx,
        };
        (watch, rx)
    }
}

/// A list or watch request, checked against what the server serves.
struct ParsedRequest {
    path: String,
    query: HashMap<String, String>,
    filter: Filter,
    metadata_only: bool,
}

impl ParsedRequest {
    fn flag(&self, name: &str) -> bool {
        self.query
            .get(name)
            .is_some_and(|value| value == "true" || value == "1")
    }

    fn number(&self, name: &str) -> Result<Option<u64>, Refusal> {
        self.query
            .get(name)
            .map(|value| {
                value.parse().map_err(|_| {
                    let message = format!("invalid {name}: {value:?}");
                    Refusal::new(StatusCode::BAD_REQUEST, "BadRequest", message)
                })
            })
            .transpose()
    }
}

async fn handle(
    State(store): State<Arc<Mutex<Store>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    serve(&store, &method, &uri, &headers).unwrap_or_else(Refusal::response)
}

fn serve(
    store: &Mutex<Store>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, Refusal> {
    if method != Method::GET {
        let message = "the fake API server only serves list and watch";
        return Err(Refusal::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            message,
        ));
    }
    let mut store = store.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((code, reason, until)) = store.refusing {
        if std::time::Instant::now() < until {
            let message = format!("refused by the test until {until:?}");
            return Err(Refusal::new(code, reason, message));
        }
        store.refusing = None;
    }
    let (path, namespace) = collection_of(uri.path());
    if !store.collections.contains_key(&path) {
        let message = format!("the server could not find the requested resource: {path}");
        return Err(Refusal::new(StatusCode::NOT_FOUND, "NotFound", message));
    }
    let query = parse_query(uri.query().unwrap_or_default());
    let mut filter = Filter::parse(&query)?;
    filter.namespace = namespace;
    let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let metadata_only = metadata_only(headers, watch)?;
    let request = ParsedRequest {
        path,
        query,
        filter,
        metadata_only,
    };
    store.served.push(Served {
        path: request.path.clone(),
        watch,
        metadata_only,
        label_selector: request.query.get("labelSelector").cloned(),
        field_selector: request.query.get("fieldSelector").cloned(),
        resource_version: request.query.get("resourceVersion").cloned(),
        send_initial_events: request.flag("sendInitialEvents"),
    });
    if !watch {
        let list = store.list(&request)?;
        return Ok(json_response(StatusCode::OK, Body::from(list.to_string())));
    }
    let timeout = request
        .number("timeoutSeconds")?
        .map_or(DEFAULT_WATCH_TIMEOUT, Duration::from_secs);
    let (initial, live) = store.watch(&request)?;
    Ok(json_response(
        StatusCode::OK,
        watch_body(initial, live, timeout),
    ))
}

/// The newline-delimited events: the initial lines, then the live ones until the timeout
/// (a clean end), a [`Signal::Break`] (an error, which makes hyper drop the connection) or
/// the server's end.
fn watch_body(
    initial: Vec<Bytes>,
    live: Option<mpsc::UnboundedReceiver<Signal>>,
    timeout: Duration,
) -> Body {
    let deadline = tokio::time::Instant::now() + timeout;
    let initial = futures::stream::iter(initial.into_iter().map(Ok));
    let live = futures::stream::unfold(live, move |rx| async move {
        let mut rx = rx?;
        tokio::select! {
            signal = rx.recv() => match signal? {
                Signal::Line(line) => Some((Ok(Bytes::from(line)), Some(rx))),
                Signal::Break => Some((Err(io::Error::other("watch broken by the test")), None)),
            },
            () = tokio::time::sleep_until(deadline) => None,
        }
    });
    Body::from_stream(initial.chain(live))
}

/// The collection path and namespace of `/api/v1/namespaces/NS/services` (or of an
/// all-namespaces path, which is its own collection).
fn collection_of(path: &str) -> (String, Option<String>) {
    if let Some((prefix, rest)) = path.split_once("/namespaces/")
        && let Some((namespace, plural)) = rest.split_once('/')
        && !plural.contains('/')
        && !namespace.is_empty()
    {
        return (format!("{prefix}/{plural}"), Some(namespace.to_owned()));
    }
    (path.trim_end_matches('/').to_owned(), None)
}

/// Whether the client asked for PartialObjectMetadata; what the real server does not serve
/// is refused the way it refuses it (406).
fn metadata_only(headers: &HeaderMap, watch: bool) -> Result<bool, Refusal> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    let Some((_, transform)) = accept.split_once(";as=") else {
        return Ok(false);
    };
    let target = transform.split(';').next().unwrap_or_default();
    match target {
        "PartialObjectMetadataList" => Ok(true),
        // A list must ask for the list type; a watch may name either.
        "PartialObjectMetadata" if watch => Ok(true),
        _ => {
            let message = format!("only the following media types are accepted: {accept:?}");
            Err(Refusal::new(
                StatusCode::NOT_ACCEPTABLE,
                "NotAcceptable",
                &message,
            ))
        }
    }
}

/// Label and field requirements of a request; all must hold.
#[derive(Clone, Debug, Default)]
struct Filter {
    namespace: Option<String>,
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

#[derive(Clone, Debug)]
enum Requirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
}

impl Requirement {
    fn parse(text: &str, fields: bool) -> Result<Self, String> {
        let text = text.trim();
        if text.contains('(') || text.contains(" in ") || text.contains(" notin ") {
            return Err(format!("set-based requirement {text:?} is not supported"));
        }
        let requirement = if let Some((key, value)) = text.split_once("!=") {
            Self::NotEquals(key.trim().to_owned(), value.trim().to_owned())
        } else if let Some((key, value)) = text.split_once("==") {
            Self::Equals(key.trim().to_owned(), value.trim().to_owned())
        } else if let Some((key, value)) = text.split_once('=') {
            Self::Equals(key.trim().to_owned(), value.trim().to_owned())
        } else if fields {
            return Err(format!("invalid field selector {text:?}"));
        } else if let Some(key) = text.strip_prefix('!') {
            Self::NotExists(key.trim().to_owned())
        } else {
            Self::Exists(text.to_owned())
        };
        let key = match &requirement {
            Self::Exists(key) | Self::NotExists(key) => key,
            Self::Equals(key, _) | Self::NotEquals(key, _) => key,
        };
        if key.is_empty() {
            return Err(format!("requirement {text:?} has no key"));
        }
        if fields
            && !["metadata.name", "metadata.namespace", "spec.nodeName"].contains(&key.as_str())
        {
            return Err(format!("field label not supported: {key}"));
        }
        Ok(requirement)
    }

    /// `value` is the label's (or field's) value, `None` when the object has no such label.
    fn holds<'a>(&self, value: impl Fn(&str) -> Option<&'a str>) -> bool {
        match self {
            Self::Exists(key) => value(key).is_some(),
            Self::NotExists(key) => value(key).is_none(),
            Self::Equals(key, expected) => value(key) == Some(expected),
            // As in Kubernetes, an object without the label matches `key!=value`.
            Self::NotEquals(key, unwanted) => value(key) != Some(unwanted),
        }
    }
}

impl Filter {
    fn parse(query: &HashMap<String, String>) -> Result<Self, Refusal> {
        let parse = |name: &str, fields: bool| -> Result<Vec<Requirement>, Refusal> {
            let text = query.get(name).map(String::as_str).unwrap_or_default();
            text.split(',')
                .filter(|part| !part.trim().is_empty())
                .map(|part| Requirement::parse(part, fields))
                .collect::<Result<_, _>>()
                .map_err(|message| Refusal::new(StatusCode::BAD_REQUEST, "BadRequest", message))
        };
        Ok(Self {
            namespace: None,
            labels: parse("labelSelector", false)?,
            fields: parse("fieldSelector", true)?,
        })
    }

    fn matches(&self, object: &Value) -> bool {
        let metadata = &object["metadata"];
        fn text(value: &Value) -> &str {
            value.as_str().unwrap_or_default()
        }
        let namespace = text(&metadata["namespace"]);
        if self.namespace.as_ref().is_some_and(|ns| ns != namespace) {
            return false;
        }
        let labels = |key: &str| metadata["labels"].get(key).map(text);
        let fields = |key: &str| match key {
            "metadata.name" => Some(text(&metadata["name"])),
            "metadata.namespace" => Some(namespace),
            "spec.nodeName" => object["spec"]["nodeName"].as_str(),
            _ => None,
        };
        self.labels.iter().all(|r| r.holds(labels)) && self.fields.iter().all(|r| r.holds(fields))
    }
}

fn key_of(object: &Value) -> (String, String) {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    let metadata = &object["metadata"];
    (text(&metadata["namespace"]), text(&metadata["name"]))
}

/// An object as a client that asked for metadata only (or not) gets it.
fn shown(object: &Value, metadata_only: bool) -> Value {
    if metadata_only {
        json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": object["metadata"],
        })
    } else {
        object.clone()
    }
}

/// List items carry no kind and apiVersion (the list has them), as from the real server.
fn list_item(object: &Value, metadata_only: bool) -> Value {
    let mut item = shown(object, metadata_only);
    if let Some(fields) = item.as_object_mut() {
        fields.remove("kind");
        fields.remove("apiVersion");
    }
    item
}

/// A watch event as the API server writes it: `type` before `object` (the field order of
/// `metav1.WatchEvent`). A client reads `type` first and decodes the object straight into
/// its kind; with `object` first (a JSON map's sorted keys), kube-rs buffers every object
/// and decodes it twice.
fn event_line(kind: &str, object: &Value) -> String {
    format!("{{\"type\":{},\"object\":{object}}}\n", Value::from(kind))
}

fn status_object(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// A request the real API server refuses too, answered with a `Status` object.
#[derive(Debug)]
struct Refusal {
    code: StatusCode,
    reason: &'static str,
    message: String,
}

impl Refusal {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    fn response(self) -> Response {
        let status = status_object(self.code.as_u16(), self.reason, &self.message);
        json_response(self.code, Body::from(status.to_string()))
    }
}

fn json_response(code: StatusCode, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

fn parse_query(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(name), percent_decode(value))
        })
        .collect()
}

/// `application/x-www-form-urlencoded` decoding (selectors arrive as `%21app%2Cx%3Dy`).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        let escaped = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (byte, escaped) {
            (b'%', Some(escaped)) => {
                decoded.push(escaped);
                i += 3;
            }
            (b'+', _) => {
                decoded.push(b' ');
                i += 1;
            }
            (byte, _) => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(namespace: &str, name: &str, labels: Value) -> Value {
        json!({"metadata": {"namespace": namespace, "name": name, "labels": labels}})
    }

    fn filter(labels: &str, fields: &str) -> Filter {
        let query = HashMap::from([
            ("labelSelector".to_owned(), labels.to_owned()),
            ("fieldSelector".to_owned(), fields.to_owned()),
        ]);
        Filter::parse(&query).expect("valid selectors")
    }

    /// kube-rs decodes a watch event without buffering it only when `type` comes first.
    #[test]
    fn watch_events_name_their_type_before_their_object() {
        let object = object("default", "web", json!({"app": "web"}));
        let line = event_line("ADDED", &object);
        assert!(line.starts_with(r#"{"type":"ADDED","object":{"#), "{line}");
        let event: kube::api::WatchEvent<Value> =
            serde_json::from_str(&line).expect("a watch event kube-rs reads");
        assert!(matches!(event, kube::api::WatchEvent::Added(read) if read == object));
    }

    #[test]
    fn selectors_follow_kubernetes_rules() {
        let plain = object("default", "web", json!({"app": "web"}));
        let proxied = object(
            "default",
            "x",
            json!({"service.kubernetes.io/service-proxy-name": "p"}),
        );
        let rows = [
            ("", "", &plain, true),
            ("app", "", &plain, true),
            ("!app", "", &plain, false),
            ("app=web", "", &plain, true),
            ("app==web", "", &plain, true),
            ("app!=web", "", &plain, false),
            ("tier!=db", "", &plain, true),
            (
                "!service.kubernetes.io/service-proxy-name",
                "",
                &proxied,
                false,
            ),
            ("!a,!service.kubernetes.io/headless", "", &plain, true),
            ("", "metadata.name=web", &plain, true),
            ("", "metadata.name!=web", &plain, false),
            ("", "metadata.namespace=kube-system", &plain, false),
            // An object without the field (a Service has no spec.nodeName) does not match.
            ("", "spec.nodeName=node-a", &plain, false),
        ];
        for (labels, fields, object, expected) in rows {
            let matched = filter(labels, fields).matches(object);
            assert_eq!(matched, expected, "labels {labels:?} fields {fields:?}");
        }
    }

    #[test]
    fn unsupported_selectors_are_refused() {
        for (labels, fields) in [
            ("app in (a,b)", ""),
            ("", "status.phase=Running"),
            ("", "x"),
        ] {
            let query = HashMap::from([
                ("labelSelector".to_owned(), labels.to_owned()),
                ("fieldSelector".to_owned(), fields.to_owned()),
            ]);
            assert!(Filter::parse(&query).is_err(), "{labels:?} {fields:?}");
        }
    }

    #[test]
    fn queries_are_decoded() {
        let query = parse_query("labelSelector=%21a%2C%21b&fieldSelector=metadata.name%21%3Dn&x");
        assert_eq!(query["labelSelector"], "!a,!b");
        assert_eq!(query["fieldSelector"], "metadata.name!=n");
        assert_eq!(query["x"], "");
        assert_eq!(percent_decode("a+b%zz%4"), "a b%zz%4");
    }

    /// kube-rs's default watch timeout is longer than a test, so the source's tests do not
    /// cover this one.
    #[tokio::test]
    async fn watches_end_after_timeout_seconds() {
        let server = FakeApiServer::start();
        let url = server.url().parse().expect("URL");
        let client = kube::Client::try_from(kube::Config::new(url)).expect("client");
        let api = kube::Api::<Service>::all(client);
        let params = kube::api::WatchParams::default().timeout(1);
        let stream = api.watch(&params, "1").await.expect("watch");
        let ended = tokio::time::timeout(Duration::from_secs(20), stream.count()).await;
        assert_eq!(
            ended.ok(),
            Some(0),
            "the watch did not end after timeoutSeconds"
        );
    }

    #[test]
    fn namespaced_paths_name_their_collection() {
        let rows = [
            ("/api/v1/services", ("/api/v1/services", None)),
            (
                "/api/v1/namespaces/ns/services",
                ("/api/v1/services", Some("ns")),
            ),
            (
                "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices",
                ("/apis/discovery.k8s.io/v1/endpointslices", Some("ns")),
            ),
            ("/api/v1/namespaces", ("/api/v1/namespaces", None)),
            (
                "/api/v1/namespaces/ns/services/web",
                ("/api/v1/namespaces/ns/services/web", None),
            ),
        ];
        for (path, (collection, namespace)) in rows {
            let expected = (collection.to_owned(), namespace.map(str::to_owned));
            assert_eq!(collection_of(path), expected, "{path}");
        }
    }
}
