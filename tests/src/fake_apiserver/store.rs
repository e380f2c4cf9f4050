//! The fake API server's objects, their history (one global resourceVersion) and the open
//! watches, with the list and watch semantics of the real server.
use std::collections::{BTreeMap, HashMap};

use axum::{body::Bytes, http::StatusCode};
use k8s_openapi::ListableResource;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{
    request::ParsedRequest,
    selector::Filter,
    wire::{Refusal, event_line, list_item, shown, status_object},
};

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

/// Objects, history and open watches, shared by the handle and the HTTP handlers.
pub(super) struct Store {
    /// The last resourceVersion handed out; global across kinds, like etcd's revision.
    pub(super) revision: u64,
    /// Watches from a resourceVersion older than this get 410 Gone.
    pub(super) oldest: u64,
    /// By collection path (`/api/v1/services`).
    pub(super) collections: BTreeMap<String, Collection>,
    /// Changes after `oldest`, in order.
    pub(super) history: Vec<Change>,
    pub(super) watches: Vec<Watch>,
    /// Remaining items of paged lists, by continue token.
    pub(super) pages: HashMap<String, Page>,
    pub(super) next_page: u64,
    pub(super) expired: usize,
    pub(super) served: Vec<Served>,
    /// Until when every request is refused, and how (see [`super::FakeApiServer::refuse_for`]).
    pub(super) refusing: Option<(StatusCode, &'static str, std::time::Instant)>,
    /// Streamed lists are served (the WatchList feature, on by default since Kubernetes
    /// 1.34).
    pub(super) watch_list: bool,
}

pub(super) struct Collection {
    pub(super) kind: &'static str,
    pub(super) api_version: &'static str,
    pub(super) list_kind: &'static str,
    /// By (namespace, name), namespace empty for cluster-scoped kinds; sorted like etcd keys.
    pub(super) objects: BTreeMap<(String, String), Value>,
    /// Each object's ADDED event line, encoded once when it is stored: the API server does
    /// not run on the node, so the lists of 100,000 objects it streams must not cost the
    /// node's CPU seconds of encoding.
    pub(super) added: BTreeMap<(String, String), Bytes>,
}

impl Collection {
    /// The ADDED lines of the objects `request` selects. Both maps hold the same keys, so
    /// they walk in step: no lookup per object, as a watch cache streams what it holds.
    pub(super) fn added_lines(&self, request: &ParsedRequest) -> Vec<Bytes> {
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
pub(super) struct Change {
    pub(super) revision: u64,
    pub(super) path: String,
    pub(super) old: Option<Value>,
    pub(super) new: Option<Value>,
}

pub(super) struct Page {
    pub(super) revision: u64,
    pub(super) items: Vec<Value>,
}

pub(super) enum Signal {
    Line(String),
    /// Break the connection.
    Break,
}

/// An open watch: what it selects and where its lines go.
pub(super) struct Watch {
    pub(super) path: String,
    pub(super) filter: Filter,
    pub(super) metadata_only: bool,
    pub(super) bookmarks: bool,
    pub(super) kind: &'static str,
    pub(super) api_version: &'static str,
    pub(super) tx: mpsc::UnboundedSender<Signal>,
}

impl Watch {
    /// The event this watch sees for a change, if any: a filtered watch sees an object that
    /// starts matching as ADDED and one that stops matching as DELETED.
    pub(super) fn event(&self, change: &Change) -> Option<String> {
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

    pub(super) fn bookmark(&self, revision: u64) -> String {
        self.bookmark_with(revision, json!({}))
    }

    /// The bookmark that ends a streamed list's initial objects.
    pub(super) fn initial_events_end(&self, revision: u64) -> String {
        self.bookmark_with(revision, json!({"k8s.io/initial-events-end": "true"}))
    }

    pub(super) fn bookmark_with(&self, revision: u64, annotations: Value) -> String {
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
    pub(super) fn new() -> Self {
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
    pub(super) fn register<K: ListableResource>(&mut self) -> String {
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
    pub(super) fn change(&mut self, path: &str, key: (String, String), new: Option<Value>) -> u64 {
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

    pub(super) fn list(&mut self, request: &ParsedRequest) -> Result<Value, Refusal> {
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
    pub(super) fn watch(
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
    pub(super) fn streamed_list(
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

    pub(super) fn new_watch(
        &self,
        request: &ParsedRequest,
    ) -> (Watch, mpsc::UnboundedReceiver<Signal>) {
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
