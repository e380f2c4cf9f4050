//! A manifest file's text into the objects socklb reads. Each YAML (or JSON) document is
//! read straight into the type of its kind; a YAML value in between took an eighth of the
//! time it takes to read 100,000 Services. A file that does not read that way is read again
//! through a YAML value, which names the object in its error and skips a document without
//! a kind as any other kind is skipped.
//!
//! A file whose text starts with `{` (what `kubectl get -o json` writes: one object or a
//! List, or several objects one after another) is read by a JSON parser: about six times
//! faster than the YAML parser reads the same objects, which is most of a start from
//! 100,000 Services' manifests.
use std::path::{Path, PathBuf};

use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use serde::Deserialize;

use super::Object;

/// A manifest that cannot be read, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ManifestError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

/// Parses one file's text into the objects socklb reads.
pub fn parse(file: &Path, text: &str) -> Result<Vec<Object>, ManifestError> {
    read(file, text).map(|read| read.objects)
}

/// One file's objects, and those of kinds socklb does not read.
pub struct Read {
    pub objects: Vec<Object>,
    /// `Kind name` of each object passed over (a Deployment, or a typo in a kind).
    pub passed_over: Vec<String>,
}

/// [`parse`], saying what was passed over.
pub fn read(file: &Path, text: &str) -> Result<Read, ManifestError> {
    let mut objects = Vec::new();
    let mut others = 0;
    let read = if is_json(text) {
        parse_json(text, &mut objects, &mut others).is_ok()
    } else {
        parse_typed(text, &mut objects, &mut others).is_ok()
    };
    if read {
        // Only a file that has some is read again for their names.
        let passed_over = if others > 0 {
            passed_over(text)
        } else {
            Vec::new()
        };
        return Ok(Read {
            objects,
            passed_over,
        });
    }
    objects.clear();
    let mut passed_over = Vec::new();
    parse_through_values(file, text, &mut objects, &mut passed_over)?;
    Ok(Read {
        objects,
        passed_over,
    })
}

/// A document's kind and name, and a List's items.
#[derive(Deserialize)]
struct Header {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: HeaderMetadata,
    #[serde(default)]
    items: Vec<Header>,
}

#[derive(Default, Deserialize)]
struct HeaderMetadata {
    #[serde(default)]
    name: String,
}

/// `Kind name` of the objects of `text` whose kind socklb does not read.
fn passed_over(text: &str) -> Vec<String> {
    let headers: Vec<Header> = if is_json(text) {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Header>()
            .map_while(Result::ok)
            .collect()
    } else {
        serde_norway::Deserializer::from_str(text)
            .map_while(|document| Option::<Header>::deserialize(document).ok())
            .flatten()
            .collect()
    };
    let mut names = Vec::new();
    let mut pending = headers;
    while let Some(header) = pending.pop() {
        match header.kind.as_str() {
            "List" => pending.extend(header.items),
            kind if READ_KINDS.contains(&kind) => {}
            kind => names.push(other_name(kind, &header.metadata.name)),
        }
    }
    names.reverse();
    names
}

/// The kinds socklb reads (a `List` holds them).
const READ_KINDS: [&str; 5] = ["Service", "EndpointSlice", "Node", "Pod", "Namespace"];

fn other_name(kind: &str, name: &str) -> String {
    let kind = if kind.is_empty() { "(no kind)" } else { kind };
    let name = if name.is_empty() { "<unnamed>" } else { name };
    format!("{kind} {name}")
}

/// A document, by its kind; what socklb does not read is left as [`Document::Other`].
#[derive(Deserialize)]
#[serde(tag = "kind")]
enum Document {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    Node(Box<Node>),
    Pod(Box<Pod>),
    Namespace(Box<Namespace>),
    List {
        #[serde(default)]
        items: Vec<Document>,
    },
    #[serde(other)]
    Other,
}

fn parse_typed(
    text: &str,
    objects: &mut Vec<Object>,
    others: &mut usize,
) -> Result<(), serde_norway::Error> {
    for document in serde_norway::Deserializer::from_str(text) {
        // An empty document (a trailing `---`) is none.
        if let Some(document) = Option::<Document>::deserialize(document)? {
            document.collect(objects, others);
        }
    }
    Ok(())
}

/// JSON is YAML too: the JSON parser is only a faster way to read it.
fn is_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

fn parse_json(
    text: &str,
    objects: &mut Vec<Object>,
    others: &mut usize,
) -> Result<(), serde_json::Error> {
    for document in serde_json::Deserializer::from_str(text).into_iter::<Document>() {
        document?.collect(objects, others);
    }
    Ok(())
}

impl Document {
    /// Adds the objects socklb reads to `objects`, and counts the others.
    fn collect(self, objects: &mut Vec<Object>, others: &mut usize) {
        match self {
            Self::Service(service) => objects.push(Object::Service(service)),
            Self::EndpointSlice(slice) => objects.push(Object::EndpointSlice(slice)),
            Self::Node(node) => objects.push(Object::Node(node)),
            Self::Pod(pod) => objects.push(Object::Pod(pod)),
            Self::Namespace(namespace) => objects.push(Object::Namespace(namespace)),
            Self::List { items } => items
                .into_iter()
                .for_each(|item| item.collect(objects, others)),
            Self::Other => *others += 1,
        }
    }
}

/// Reads `text` again through YAML values (JSON values for JSON: objects one after another
/// are not a YAML stream), to name what does not read: the line of a syntax error, or the
/// object whose fields do not fit its kind.
fn parse_through_values(
    file: &Path,
    text: &str,
    objects: &mut Vec<Object>,
    passed_over: &mut Vec<String>,
) -> Result<(), ManifestError> {
    let error = |line: Option<usize>, message: String| ManifestError {
        file: file.to_owned(),
        line,
        message,
    };
    let values = if is_json(text) {
        json_values(text)
    } else {
        yaml_values(text)
    };
    for value in values.map_err(|(line, message)| error(line, message))? {
        if value.is_null() {
            continue; // an empty document, e.g. a trailing `---`
        }
        collect(value, objects, passed_over).map_err(|message| error(None, message))?;
    }
    Ok(())
}

/// A syntax error's line, if known, and message.
type SyntaxError = (Option<usize>, String);

fn yaml_values(text: &str) -> Result<Vec<serde_norway::Value>, SyntaxError> {
    serde_norway::Deserializer::from_str(text)
        .map(|document| {
            serde_norway::Value::deserialize(document)
                .map_err(|e| (e.location().map(|l| l.line()), e.to_string()))
        })
        .collect()
}

fn json_values(text: &str) -> Result<Vec<serde_norway::Value>, SyntaxError> {
    serde_json::Deserializer::from_str(text)
        .into_iter::<serde_json::Value>()
        .map(|document| {
            let document = document.map_err(|e| (Some(e.line()), e.to_string()))?;
            serde_norway::to_value(document).map_err(|e| (None, e.to_string()))
        })
        .collect()
}

fn collect(
    value: serde_norway::Value,
    objects: &mut Vec<Object>,
    passed_over: &mut Vec<String>,
) -> Result<(), String> {
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default()
        .to_owned();
    let name = value
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(|n| n.as_str())
        .unwrap_or("<unnamed>")
        .to_owned();
    let invalid = |e: serde_norway::Error| format!("{kind} {name}: {e}");
    match kind.as_str() {
        "Service" => objects.push(Object::Service(Box::new(
            serde_norway::from_value::<Service>(value).map_err(invalid)?,
        ))),
        "EndpointSlice" => objects.push(Object::EndpointSlice(Box::new(
            serde_norway::from_value::<EndpointSlice>(value).map_err(invalid)?,
        ))),
        "Node" => objects.push(Object::Node(Box::new(
            serde_norway::from_value::<Node>(value).map_err(invalid)?,
        ))),
        "Pod" => objects.push(Object::Pod(Box::new(
            serde_norway::from_value::<Pod>(value).map_err(invalid)?,
        ))),
        "Namespace" => objects.push(Object::Namespace(Box::new(
            serde_norway::from_value::<Namespace>(value).map_err(invalid)?,
        ))),
        "List" => {
            let items = value.get("items").and_then(|i| i.as_sequence()).cloned();
            for item in items.unwrap_or_default() {
                collect(item, objects, passed_over)?;
            }
        }
        other => passed_over.push(other_name(other, &name)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Kind;

    #[test]
    fn parses_multi_document_files_lists_and_ignores_other_kinds() {
        let text = "\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: node-a, labels: {topology.kubernetes.io/zone: a}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  endpoints: [{addresses: [10.0.0.1]}]
---
";
        let objects = parse(Path::new("x.yaml"), text).expect("parse");
        let kinds: Vec<Kind> = objects.iter().map(Object::kind).collect();
        assert_eq!(kinds, [Kind::Service, Kind::Node, Kind::EndpointSlice]);
    }

    #[test]
    fn what_is_passed_over_is_named_in_yaml_json_and_lists() {
        let yaml = "\
kind: Service
metadata: {name: web}
---
kind: Sevice
metadata: {name: api}
---
kind: List
items:
- {kind: ConfigMap, metadata: {name: settings}}
- {kind: Node, metadata: {name: node-a}}
";
        let passed_over = |file: &str, text: &str| {
            read(Path::new(file), text)
                .expect("read")
                .passed_over
                .join(", ")
        };
        assert_eq!(
            passed_over("x.yaml", yaml),
            "Sevice api, ConfigMap settings"
        );
        let json = r#"{"kind": "Service", "metadata": {"name": "web"}}
{"kind": "Deployment", "metadata": {"name": "web"}}"#;
        assert_eq!(passed_over("x.json", json), "Deployment web");
        // Nothing to say for a file of known kinds only.
        assert_eq!(
            passed_over("y.yaml", "kind: Service\nmetadata: {name: web}\n"),
            ""
        );
    }

    /// Both ways of reading give the same objects, each field read.
    #[test]
    fn reading_straight_and_through_values_agree() {
        let text = "\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default, annotations: {a: b}}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: web}, {port: 53, protocol: UDP, targetPort: 5353}]
  sessionAffinity: ClientIP
---
{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {\"name\": \"p\"}, \"spec\": {\"nodeName\": \"a\"}}
";
        let mut straight = Vec::new();
        parse_typed(text, &mut straight, &mut 0).expect("read straight");
        let mut through_values = Vec::new();
        parse_through_values(
            Path::new("x.yaml"),
            text,
            &mut through_values,
            &mut Vec::new(),
        )
        .expect("read through values");
        assert_eq!(straight.len(), 2);
        assert_eq!(format!("{straight:?}"), format!("{through_values:?}"));
    }

    /// What `kubectl get -o json` writes (a List), and objects one after another, read as
    /// the same text in YAML's block style is.
    #[test]
    fn json_is_read_as_its_yaml_twin() {
        let list = r#"{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "v1", "kind": "Service",
   "metadata": {"name": "web", "namespace": "default"},
   "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]}},
  {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
   "metadata": {"name": "web-1", "namespace": "default",
                "labels": {"kubernetes.io/service-name": "web"}},
   "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}]},
  {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}
]}"#;
        let stream = r#"{"kind": "Node", "metadata": {"name": "a"}}
{"kind": "Namespace", "metadata": {"name": "default"}}"#;
        let yaml = "\
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: default}
  spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  endpoints: [{addresses: [10.0.0.1]}]
- {apiVersion: apps/v1, kind: Deployment, metadata: {name: web}}
---
kind: Node
metadata: {name: a}
---
kind: Namespace
metadata: {name: default}
";
        let mut from_json = Vec::new();
        parse_json(list, &mut from_json, &mut 0).expect("read the List");
        parse_json(stream, &mut from_json, &mut 0).expect("read the objects");
        let from_yaml = parse(Path::new("x.yaml"), yaml).expect("read the YAML");
        let kinds: Vec<Kind> = from_json.iter().map(Object::kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::Service,
                Kind::EndpointSlice,
                Kind::Node,
                Kind::Namespace
            ]
        );
        assert_eq!(format!("{from_json:?}"), format!("{from_yaml:?}"));
        let through_parse =
            parse(Path::new("x.json"), &format!("{list}\n{stream}")).expect("parse the JSON");
        assert_eq!(format!("{through_parse:?}"), format!("{from_json:?}"));
    }

    #[test]
    fn json_that_does_not_read_is_named_as_yaml_is() {
        let text = r#"{"kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": 5}}"#;
        let error = parse(Path::new("a.json"), text).expect_err("must fail");
        assert!(error.message.contains("Service web"), "{error}");
        let kindless = r#"{"metadata": {"name": "x"}}
{"kind": "Node", "metadata": {"name": "a"}}"#;
        let objects = parse(Path::new("b.json"), kindless).expect("parse");
        let kinds: Vec<Kind> = objects.iter().map(Object::kind).collect();
        assert_eq!(kinds, [Kind::Node]);
        let broken = "{\"kind\": \"Node\", \"metadata\": {\"name\": \"a\"}}\n{\"kind\": ";
        let error = parse(Path::new("c.json"), broken).expect_err("must fail");
        assert_eq!(error.line, Some(2), "{error}");
    }

    #[test]
    fn documents_without_a_kind_are_skipped() {
        let text = "metadata: {name: x}\n---\nkind: 5\n---\nkind: Node\nmetadata: {name: a}\n";
        let objects = parse(Path::new("x.yaml"), text).expect("parse");
        let kinds: Vec<Kind> = objects.iter().map(Object::kind).collect();
        assert_eq!(kinds, [Kind::Node]);
    }

    #[test]
    fn a_syntax_error_names_the_file_and_line() {
        let text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: [unclosed\n";
        let error = parse(Path::new("dir/bad.yaml"), text).expect_err("must fail");
        assert_eq!(error.file, Path::new("dir/bad.yaml"));
        assert!(error.line.is_some(), "{error}");
        assert!(error.to_string().starts_with("dir/bad.yaml:"), "{error}");
    }

    #[test]
    fn a_wrong_field_type_names_the_object() {
        let text = "kind: Service\nmetadata: {name: web}\nspec: {ports: notalist}\n";
        let error = parse(Path::new("a.yaml"), text).expect_err("must fail");
        assert!(error.message.contains("Service web"), "{error}");
    }
}
