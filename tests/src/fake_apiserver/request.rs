//! A list or watch request as the fake API server reads it: the collection, the query, the
//! selectors, and whether the client asked for metadata only.
use std::collections::HashMap;

use axum::http::{HeaderMap, StatusCode, header};

use super::{selector::Filter, wire::Refusal};

/// A list or watch request, checked against what the server serves.
pub(super) struct ParsedRequest {
    pub(super) path: String,
    pub(super) query: HashMap<String, String>,
    pub(super) filter: Filter,
    pub(super) metadata_only: bool,
}

impl ParsedRequest {
    pub(super) fn flag(&self, name: &str) -> bool {
        self.query
            .get(name)
            .is_some_and(|value| value == "true" || value == "1")
    }

    pub(super) fn number(&self, name: &str) -> Result<Option<u64>, Refusal> {
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

/// The collection path and namespace of `/api/v1/namespaces/NS/services` (or of an
/// all-namespaces path, which is its own collection).
pub(super) fn collection_of(path: &str) -> (String, Option<String>) {
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
pub(super) fn metadata_only(headers: &HeaderMap, watch: bool) -> Result<bool, Refusal> {
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

/// The query's parameters (`application/x-www-form-urlencoded`: selectors arrive as
/// `%21app%2Cx%3Dy`).
pub(super) fn parse_query(query: &str) -> HashMap<String, String> {
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}
