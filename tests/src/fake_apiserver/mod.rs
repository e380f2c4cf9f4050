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
//!
//! Here the handle tests hold; [`store`] keeps the objects, their history and the watches;
//! [`http`] answers a request that [`request`] reads, its selectors parsed by [`selector`];
//! [`wire`] writes what goes back as the real server writes it.
mod http;
mod request;
mod selector;
mod store;
#[cfg(test)]
mod tests;
mod wire;

use std::{
    net::{Ipv4Addr, SocketAddr, TcpListener},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    thread::JoinHandle,
    time::Duration,
};

use axum::{Router, http::StatusCode, serve::ListenerExt as _};
use k8s_openapi::{
    ListableResource,
    api::{
        core::v1::{Namespace, Node, Pod, Service},
        discovery::v1::EndpointSlice,
    },
};
use serde::Serialize;
use socklb_agent::source::Object;
use tokio::sync::oneshot;

pub use self::store::Served;
use self::{
    http::handle,
    store::{Signal, Store},
    wire::key_of,
};

/// The fake API server. Serves Services, EndpointSlices, Nodes, Pods and Namespaces from the
/// start; any other listable kind once an object of it is applied. Stops when dropped.
pub struct FakeApiServer {
    store: Arc<Mutex<Store>>,
    addr: SocketAddr,
    running: Option<Running>,
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
