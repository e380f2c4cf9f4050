//! Label and field selectors (`k`, `!k`, `k=v`, `k==v`, `k!=v`; fields `metadata.name`,
//! `metadata.namespace`, `spec.nodeName`), as the API server parses and applies them.
use std::collections::HashMap;

use axum::http::StatusCode;
use serde_json::Value;

use super::wire::Refusal;

/// Label and field requirements of a request; all must hold.
#[derive(Clone, Debug, Default)]
pub(super) struct Filter {
    pub(super) namespace: Option<String>,
    pub(super) labels: Vec<Requirement>,
    pub(super) fields: Vec<Requirement>,
}

#[derive(Clone, Debug)]
pub(super) enum Requirement {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
}

impl Requirement {
    pub(super) fn parse(text: &str, fields: bool) -> Result<Self, String> {
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
    pub(super) fn holds<'a>(&self, value: impl Fn(&str) -> Option<&'a str>) -> bool {
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
    pub(super) fn parse(query: &HashMap<String, String>) -> Result<Self, Refusal> {
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

    pub(super) fn matches(&self, object: &Value) -> bool {
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
