//! The `file` source: a directory of YAML (or JSON) manifests holding Services,
//! EndpointSlices and Nodes, for demos, tests and clusters without an API server to ask.
//!
//! Every `*.yaml`, `*.yml` and `*.json` file directly in the directory is read; a file may
//! hold several documents (`---`) and `kind: List` documents. Other kinds are ignored. The
//! directory is watched: after a change (debounced) it is read again and a `Reset` of each
//! kind is sent, which the state turns into per-Service changes. A file that does not
//! parse keeps its last good objects and the error is logged with the file and line.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use notify::{RecursiveMode, Watcher as _};
use serde::Deserialize as _;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Event, Kind, Object};

/// A manifest that cannot be read, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ManifestError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FileSourceError {
    #[error("cannot read the manifests directory {path}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch the manifests directory {path}")]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// Parses one file's text into the objects socklb reads.
pub fn parse(file: &Path, text: &str) -> Result<Vec<Object>, ManifestError> {
    let error = |line: Option<usize>, message: String| ManifestError {
        file: file.to_owned(),
        line,
        message,
    };
    let mut objects = Vec::new();
    for document in serde_norway::Deserializer::from_str(text) {
        let value = serde_norway::Value::deserialize(document)
            .map_err(|e| error(e.location().map(|l| l.line()), e.to_string()))?;
        if value.is_null() {
            continue; // an empty document, e.g. a trailing `---`
        }
        collect(value, &mut objects).map_err(|message| error(None, message))?;
    }
    Ok(objects)
}

fn collect(value: serde_norway::Value, objects: &mut Vec<Object>) -> Result<(), String> {
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
        "List" => {
            let items = value.get("items").and_then(|i| i.as_sequence()).cloned();
            for item in items.unwrap_or_default() {
                collect(item, objects)?;
            }
        }
        other => debug!(kind = other, name, "ignoring a manifest of another kind"),
    }
    Ok(())
}

/// The manifests of a directory. Each file's last text that parsed is kept (text is a few
/// times smaller than the parsed objects), so that a file that no longer parses contributes
/// its last good objects.
#[derive(Debug, Default)]
pub struct Manifests {
    last_good: BTreeMap<PathBuf, String>,
}

/// One read of the directory.
#[derive(Debug)]
pub struct Reload {
    /// One `Reset` per kind with every object of the directory.
    pub events: Vec<Event>,
    /// Files that did not parse (their last good objects are in `events`).
    pub errors: Vec<ManifestError>,
}

impl Manifests {
    /// Reads the directory again.
    pub fn reload(&mut self, dir: &Path) -> Result<Reload, FileSourceError> {
        let entries = fs::read_dir(dir).map_err(|source| FileSourceError::ReadDir {
            path: dir.to_owned(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| {
                path.is_file()
                    && matches!(
                        path.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
            })
            .collect();
        files.sort();

        let mut errors = Vec::new();
        let mut next = BTreeMap::new();
        let mut by_kind = [
            (Kind::Node, Vec::new()),
            (Kind::Service, Vec::new()),
            (Kind::EndpointSlice, Vec::new()),
        ];
        for file in files {
            let read = fs::read_to_string(&file).map_err(|e| ManifestError {
                file: file.clone(),
                line: None,
                message: e.to_string(),
            });
            let parsed = read.and_then(|text| Ok((parse(&file, &text)?, text)));
            let objects = match parsed {
                Ok((objects, text)) => {
                    next.insert(file, text);
                    objects
                }
                Err(error) => {
                    errors.push(error);
                    let Some(text) = self.last_good.remove(&file) else {
                        continue;
                    };
                    // It parsed before, so it parses again.
                    let objects = parse(&file, &text).unwrap_or_default();
                    next.insert(file, text);
                    objects
                }
            };
            for object in objects {
                let kind = object.kind();
                if let Some((_, list)) = by_kind.iter_mut().find(|(k, _)| *k == kind) {
                    list.push(object);
                }
            }
        }
        self.last_good = next;
        Ok(Reload {
            events: by_kind
                .into_iter()
                .map(|(kind, objects)| Event::Reset(kind, objects))
                .collect(),
            errors,
        })
    }
}

/// Watches a manifests directory and sends its state as events.
pub struct FileSource {
    dir: PathBuf,
    debounce: Duration,
}

impl FileSource {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            // Editors write a file in several steps; one reload after they are done.
            debounce: Duration::from_millis(50),
        }
    }

    /// Sends the directory's objects now and after every change, until the receiver is
    /// dropped.
    pub async fn run(self, events: mpsc::Sender<Event>) -> Result<(), FileSourceError> {
        let (changed_tx, mut changed_rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // Reading the files is an event too (inotify reports opens and closes): only
                // changes of their content or of the directory's entries count.
                if event
                    .as_ref()
                    .is_ok_and(|e| e.kind.is_access() || e.kind.is_other())
                {
                    return;
                }
                let _ = changed_tx.send(event);
            })
            .map_err(|source| FileSourceError::Watch {
                path: self.dir.clone(),
                source,
            })?;
        watcher
            .watch(&self.dir, RecursiveMode::NonRecursive)
            .map_err(|source| FileSourceError::Watch {
                path: self.dir.clone(),
                source,
            })?;

        let mut manifests = Manifests::default();
        loop {
            let reload = manifests.reload(&self.dir)?;
            for error in reload.errors {
                warn!(%error, "manifest not applied; its last good state is kept");
            }
            info!(dir = %self.dir.display(), "manifests read");
            for event in reload.events {
                if events.send(event).await.is_err() {
                    return Ok(());
                }
            }
            // Wait for a change, then for the burst of changes to end.
            if changed_rx.recv().await.is_none() {
                return Ok(());
            }
            while let Ok(Some(_)) = tokio::time::timeout(self.debounce, changed_rx.recv()).await {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_broken_file_keeps_its_last_good_objects() {
        let dir = std::env::temp_dir().join(format!("socklb-manifests-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("svc.yaml");
        fs::write(
            &file,
            "kind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.1}\n",
        )
        .expect("write");
        let mut manifests = Manifests::default();
        assert!(manifests.reload(&dir).expect("reload").errors.is_empty());
        fs::write(&file, "kind: Service\nmetadata: {name: [\n").expect("write");
        let reload = manifests.reload(&dir).expect("reload");
        assert_eq!(reload.errors.len(), 1);
        let services = reload
            .events
            .iter()
            .find_map(|e| match e {
                Event::Reset(Kind::Service, objects) => Some(objects.len()),
                _ => None,
            })
            .expect("a Service reset");
        assert_eq!(services, 1, "the last good Service is kept");
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
