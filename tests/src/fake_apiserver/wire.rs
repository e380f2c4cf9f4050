//! What the fake API server writes as the real one does: objects as a client asked for them,
//! watch event lines, `Status` objects and the refusals that carry them.
use axum::{
    body::Body,
    http::{StatusCode, header},
    response::Response,
};
use serde_json::{Value, json};

pub(super) fn key_of(object: &Value) -> (String, String) {
    let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
    let metadata = &object["metadata"];
    (text(&metadata["namespace"]), text(&metadata["name"]))
}

/// An object as a client that asked for metadata only (or not) gets it.
pub(super) fn shown(object: &Value, metadata_only: bool) -> Value {
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
pub(super) fn list_item(object: &Value, metadata_only: bool) -> Value {
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
pub(super) fn event_line(kind: &str, object: &Value) -> String {
    format!("{{\"type\":{},\"object\":{object}}}\n", Value::from(kind))
}

pub(super) fn status_object(code: u16, reason: &str, message: &str) -> Value {
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
pub(super) struct Refusal {
    code: StatusCode,
    reason: &'static str,
    message: String,
}

impl Refusal {
    pub(super) fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    pub(super) fn response(self) -> Response {
        let status = status_object(self.code.as_u16(), self.reason, &self.message);
        json_response(self.code, Body::from(status.to_string()))
    }
}

pub(super) fn json_response(code: StatusCode, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}
