//! A manifest file's text into the objects socklb reads. Each YAML (or JSON) document is
//! read straight into the type of its kind; a YAML value in between took an eighth of the
//! time it takes to read 100,000 Services. A file that does not read that way is read again
//! document by document (split at its `---` lines; JSON object by object; a List item by
//! item) through YAML values: a document that does not read is named (its line, and its
//! object when its kind and name can be read) and the others are read all the same. A
//! document without a kind is skipped as any other kind is.
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

use super::{Kind, Object};

/// An object's kind, namespace (`default` when a namespaced object names none; empty for
/// Nodes and Namespaces) and name.
pub type ObjectId = (Kind, String, String);

/// `Kind namespace/name` (`Kind name` for Nodes and Namespaces), as logs name an object.
pub fn display((kind, namespace, name): &ObjectId) -> String {
    if namespace.is_empty() {
        format!("{} {name}", kind.name())
    } else {
        format!("{} {namespace}/{name}", kind.name())
    }
}

/// A manifest that cannot be read, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ManifestError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

/// A document of a manifest that does not read (a field of the wrong type, a syntax error):
/// the file's other documents are read all the same.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {}{message}", file.display(), named(object.as_ref()))]
pub struct BadDocument {
    pub file: PathBuf,
    /// The line of the error, or of the document's first content.
    pub line: usize,
    /// Its kind, namespace and name, when its text says them: the object it would be.
    pub object: Option<ObjectId>,
    pub message: String,
}

/// `Kind namespace/name: ` for a document that names its object.
fn named(object: Option<&ObjectId>) -> String {
    object
        .map(|o| format!("{}: ", display(o)))
        .unwrap_or_default()
}

impl From<BadDocument> for ManifestError {
    fn from(bad: BadDocument) -> Self {
        let object = bad.object.as_ref().map(display);
        Self {
            file: bad.file,
            line: Some(bad.line),
            message: match object {
                Some(object) => format!("{object}: {}", bad.message),
                None => bad.message,
            },
        }
    }
}

/// Parses one file's text into the objects socklb reads; the first document that does not
/// read fails it.
pub fn parse(file: &Path, text: &str) -> Result<Vec<Object>, ManifestError> {
    let read = read(file, text)?;
    match read.bad.into_iter().next() {
        Some(bad) => Err(bad.into()),
        None => Ok(read.objects),
    }
}

/// One file's objects, those of kinds socklb does not read, and the documents that do not
/// read.
pub struct Read {
    pub objects: Vec<Object>,
    /// `Kind name` of each object passed over (a Deployment, or a typo in a kind).
    pub passed_over: Vec<String>,
    /// Each document (or List item) that does not read; the others are in `objects`.
    pub bad: Vec<BadDocument>,
}

/// [`parse`], saying what was passed over and which documents do not read. Only a file
/// that cannot be split into documents fails whole: one that cannot be read as text, or
/// JSON with a syntax error (JSON has no document marker to go on from).
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
            bad: Vec::new(),
        });
    }
    let mut read = Read {
        objects: Vec::new(),
        passed_over: Vec::new(),
        bad: Vec::new(),
    };
    parse_through_values(file, text, &mut read)?;
    Ok(read)
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
            kind if Kind::named(kind).is_some() => {}
            kind => names.push(other_name(kind, &header.metadata.name)),
        }
    }
    names.reverse();
    names
}

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

/// Reads `text` again document by document, through YAML values (JSON values for JSON:
/// objects one after another are not a YAML stream), to name what does not read (the line
/// of a syntax error, the object whose fields do not fit its kind) and to read the other
/// documents all the same.
fn parse_through_values(file: &Path, text: &str, read: &mut Read) -> Result<(), ManifestError> {
    if is_json(text) {
        let documents = json_values(text).map_err(|(line, message)| ManifestError {
            file: file.to_owned(),
            line,
            message,
        })?;
        for (line, value) in documents {
            collect(file, Place::at(line), value, read);
        }
        return Ok(());
    }
    for document in yaml_documents(text) {
        let line = document.content.unwrap_or(document.line);
        let at = Place {
            line,
            start: document.line,
            text: Some(document.text),
        };
        for value in serde_norway::Deserializer::from_str(document.text) {
            match serde_norway::Value::deserialize(value) {
                Ok(value) => collect(file, at, value, read),
                Err(error) => {
                    // Said where it is in the file, not in the document.
                    let error = serde_norway::from_str::<serde_norway::Value>(&at.in_place())
                        .err()
                        .unwrap_or(error);
                    read.bad.push(BadDocument {
                        file: file.to_owned(),
                        line: error.location().map_or(line, |l| l.line()),
                        object: None,
                        message: error.to_string(),
                    });
                    // The parser does not go on after a syntax error.
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Where a document is: the line that names it, and its text and first line when it is
/// read by itself (YAML; a List's items and JSON documents are not).
#[derive(Clone, Copy)]
struct Place<'a> {
    line: usize,
    start: usize,
    text: Option<&'a str>,
}

impl<'a> Place<'a> {
    fn at(line: usize) -> Self {
        Self {
            line,
            start: line,
            text: None,
        }
    }

    /// Its text after as many empty lines as come before it in the file, so that an error
    /// names the file's line: made only for a document that does not read.
    fn in_place(&self) -> String {
        "\n".repeat(self.start.saturating_sub(1)) + self.text.unwrap_or_default()
    }
}

/// A YAML stream's documents, split at the lines that start a document (`---`): a syntax
/// error ends the parser's stream, not the file. Lines before a document's content
/// (comments, directives) stay with it. Each comes with the line it starts on and the line
/// of its first content (which names it where no error has a line).
fn yaml_documents(text: &str) -> Vec<YamlDocument<'_>> {
    let mut documents = Vec::new();
    let mut document = YamlDocument {
        line: 1,
        content: None,
        text: "",
    };
    let (mut start, mut offset) = (0, 0);
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let marker = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\r', '\n']));
        if marker && document.content.is_some() {
            document.text = &text[start..offset];
            documents.push(document);
            document = YamlDocument {
                line: index + 1,
                content: None,
                text: "",
            };
            start = offset;
        }
        let trimmed = line.trim();
        let content = !(trimmed.is_empty()
            || trimmed.starts_with('#')
            || trimmed.starts_with('%')
            || marker && trimmed == "---");
        if content && document.content.is_none() {
            document.content = Some(index + 1);
        }
        offset += line.len();
    }
    if start < text.len() {
        document.text = &text[start..];
        documents.push(document);
    }
    documents
}

#[derive(Debug, PartialEq, Eq)]
struct YamlDocument<'a> {
    line: usize,
    content: Option<usize>,
    text: &'a str,
}

/// A syntax error's line, if known, and message.
type SyntaxError = (Option<usize>, String);

/// JSON documents one after another, each with the line it starts on.
fn json_values(text: &str) -> Result<Vec<(usize, serde_norway::Value)>, SyntaxError> {
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    let mut values = Vec::new();
    // Lines counted from the last document on, not from the file's start at each one.
    let (mut counted_to, mut line) = (0, 1);
    loop {
        let before = stream.byte_offset();
        let Some(document) = stream.next() else {
            return Ok(values);
        };
        let document = document.map_err(|e| (Some(e.line()), e.to_string()))?;
        let skipped = text[before..].len() - text[before..].trim_start().len();
        line += text[counted_to..before + skipped].matches('\n').count();
        counted_to = before + skipped;
        let value = serde_norway::to_value(document).map_err(|e| (Some(line), e.to_string()))?;
        values.push((line, value));
    }
}

/// Adds the object `value` is to `read`, a List's items one by one, and what does not read
/// to its documents that do not.
fn collect(file: &Path, at: Place<'_>, value: serde_norway::Value, read: &mut Read) {
    if value.is_null() {
        return; // an empty document, e.g. a trailing `---`
    }
    let text = |field: &str| {
        value
            .get("metadata")
            .and_then(|m| m.get(field))
            .and_then(|n| n.as_str())
            .map(str::to_owned)
    };
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default()
        .to_owned();
    let (name, namespace) = (text("name"), text("namespace"));
    if kind == "List" {
        let items = value.get("items").and_then(|i| i.as_sequence()).cloned();
        for item in items.unwrap_or_default() {
            collect(file, Place::at(at.line), item, read);
        }
        return;
    }
    let Some(kind) = Kind::named(&kind) else {
        let name = name.as_deref().unwrap_or("<unnamed>");
        read.passed_over.push(other_name(&kind, name));
        return;
    };
    let object = name.map(|name| (kind, kind.namespace_of(namespace.as_deref()), name));
    let object_of_kind = match kind {
        Kind::Service => as_kind(at, value, Object::Service),
        Kind::EndpointSlice => as_kind(at, value, Object::EndpointSlice),
        Kind::Node => as_kind(at, value, Object::Node),
        Kind::Pod => as_kind(at, value, Object::Pod),
        Kind::Namespace => as_kind(at, value, Object::Namespace),
    };
    match object_of_kind {
        Ok(typed) => read.objects.push(typed),
        Err(error) => read.bad.push(BadDocument {
            file: file.to_owned(),
            line: error.location().map_or(at.line, |l| l.line()),
            object,
            message: error.to_string(),
        }),
    }
}

/// `value` as a `T`, or why not: said by reading the document's text again for a document
/// read by itself, which names the field and its line (a value's error names neither).
fn as_kind<T: serde::de::DeserializeOwned>(
    at: Place<'_>,
    value: serde_norway::Value,
    wrap: fn(Box<T>) -> Object,
) -> Result<Object, serde_norway::Error> {
    serde_norway::from_value::<T>(value)
        .map(|typed| wrap(Box::new(typed)))
        .map_err(|error| {
            at.text
                .and_then(|_| serde_norway::from_str::<T>(&at.in_place()).err())
                .unwrap_or(error)
        })
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
        let mut through_values = Read {
            objects: Vec::new(),
            passed_over: Vec::new(),
            bad: Vec::new(),
        };
        parse_through_values(Path::new("x.yaml"), text, &mut through_values)
            .expect("read through values");
        let through_values = through_values.objects;
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
        assert!(error.message.contains("Service default/web"), "{error}");
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
        assert!(error.message.contains("Service default/web"), "{error}");
    }

    /// A document that does not read leaves the others read, and is named by its line, its
    /// object (when its text names it) and the field.
    #[test]
    fn a_bad_document_is_named_and_the_others_are_read() {
        let text = "\
kind: Service
metadata: {name: web, namespace: shop}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
---
kind: Service
metadata: {name: db}
spec:
  clusterIP: 10.96.0.11
  ports: [{port: http}]
---
kind: Node
metadata: {name: [unclosed
---
# a comment before the marker
--- {kind: Node, metadata: {name: node-a}}
---
kind: List
items:
- {kind: Pod, metadata: {name: p}, spec: 5}
- {kind: Namespace, metadata: {name: shop}}
";
        let read = read(Path::new("dir/svc.yaml"), text).expect("read");
        let kinds: Vec<Kind> = read.objects.iter().map(Object::kind).collect();
        assert_eq!(kinds, [Kind::Service, Kind::Node, Kind::Namespace]);
        let said: Vec<String> = read.bad.iter().map(ToString::to_string).collect();
        assert_eq!(said.len(), 3, "{said:#?}");
        // (line, object, what the message holds)
        let rows = [
            (9, Some("Service default/db"), "spec.ports[0].port"),
            (13, None, "line 13"),
            (17, Some("Pod default/p"), "invalid type"),
        ];
        for ((line, object, holds), bad) in rows.into_iter().zip(&read.bad) {
            assert_eq!(bad.line, line, "{bad}");
            assert_eq!(bad.object.as_ref().map(display).as_deref(), object);
            assert!(bad.message.contains(holds), "{bad}");
            assert!(
                bad.to_string()
                    .starts_with(&format!("dir/svc.yaml:{line}: ")),
                "{bad}"
            );
        }
        let error = parse(Path::new("dir/svc.yaml"), text).expect_err("parse fails whole");
        assert!(error.message.starts_with("Service default/db: "), "{error}");
    }

    /// JSON objects one after another, or a List, read object by object as YAML's documents
    /// are; JSON that does not parse fails whole (see `json_that_does_not_read_is_named_as_yaml_is`).
    #[test]
    fn a_bad_json_object_leaves_the_others_read() {
        let stream = r#"{"kind": "Service", "metadata": {"name": "web"}, "spec": {"ports": 5}}
{"kind": "Node", "metadata": {"name": "a"}}"#;
        let list = r#"{"kind": "List", "items": [
  {"kind": "Node", "metadata": {"name": "a"}},
  {"kind": "Node", "metadata": {"name": "b", "labels": 7}}
]}"#;
        for (text, line, bad) in [(stream, 1, "Service default/web"), (list, 1, "Node b")] {
            let read = read(Path::new("x.json"), text).expect("read");
            let kinds: Vec<Kind> = read.objects.iter().map(Object::kind).collect();
            assert_eq!(kinds, [Kind::Node], "{text}");
            assert_eq!(read.bad.len(), 1, "{text}");
            assert_eq!(read.bad[0].line, line, "{text}");
            assert_eq!(
                read.bad[0].object.as_ref().map(display).as_deref(),
                Some(bad)
            );
        }
        let second =
            format!("{{\"kind\": \"Node\", \"metadata\": {{\"name\": \"a\"}}}}\n\n{stream}");
        let read = read(Path::new("x.json"), &second).expect("read");
        assert_eq!(read.bad[0].line, 3, "the line the object starts on");
    }

    #[test]
    fn documents_are_split_at_their_markers() {
        let text = "%YAML 1.2\n---\na: 1\n--- {b: 2}\n---\n\nc: |\n  ---\n  text\n---x: 3\n";
        let documents: Vec<(usize, Option<usize>, &str)> = yaml_documents(text)
            .into_iter()
            .map(|d| (d.line, d.content, d.text))
            .collect();
        assert_eq!(
            documents,
            [
                (1, Some(3), "%YAML 1.2\n---\na: 1\n"),
                (4, Some(4), "--- {b: 2}\n"),
                (5, Some(7), "---\n\nc: |\n  ---\n  text\n---x: 3\n"),
            ]
        );
        assert_eq!(yaml_documents("---\n# nothing\n")[0].content, None);
    }
}
