//! The HTTP side: a request in, a list or a watch stream out.
use std::{
    io,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::Response,
};
use futures::StreamExt as _;
use tokio::sync::mpsc;

use super::{
    request::{ParsedRequest, collection_of, metadata_only, parse_query},
    selector::Filter,
    store::{Served, Signal, Store},
    wire::{Refusal, json_response},
};

/// A watch without `timeoutSeconds` lasts this long (the real server picks 30-60 minutes).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// A request, answered with a list, a watch stream, or the Status of its refusal.
pub(super) async fn handle(
    State(store): State<Arc<Mutex<Store>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    serve(&store, &method, &uri, &headers).unwrap_or_else(Refusal::response)
}

pub(super) fn serve(
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
pub(super) fn watch_body(
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
