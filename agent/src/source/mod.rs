//! Where cluster state comes from. Every source produces the same [`Event`]s, whatever it
//! reads: the Kubernetes API (`kube`) or a directory of manifests (`file`).
pub mod file;
pub mod kube;
mod last_good;
mod manifest;
mod object_ids;
mod read_ahead;
pub mod retry;
mod watched_dir;

use k8s_openapi::{
    api::{
        core::v1::{Namespace, Node, Pod, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

/// The kinds of object socklb reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Service,
    EndpointSlice,
    Node,
    /// This node's pods (which path serves each).
    Pod,
    /// Namespaces' labels (which path serves their pods).
    Namespace,
}

impl Kind {
    /// Every kind, each of which a source lists once before it watches.
    pub const ALL: [Self; 5] = [
        Self::Service,
        Self::EndpointSlice,
        Self::Node,
        Self::Pod,
        Self::Namespace,
    ];

    /// The name of the kind as objects carry it (`kind:`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
            Self::Node => "Node",
            Self::Pod => "Pod",
            Self::Namespace => "Namespace",
        }
    }

    /// The namespace an object of this kind is keyed by: none for cluster-wide kinds,
    /// `default` for a namespaced object that names none (as kubectl applies it).
    pub fn namespace_of(self, namespace: Option<&str>) -> String {
        match (self, namespace) {
            (Self::Node | Self::Namespace, _) => String::new(),
            (_, Some(namespace)) => namespace.to_owned(),
            (_, None) => "default".to_owned(),
        }
    }

    /// The kind an object's `kind:` names, if socklb reads it.
    pub fn named(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

/// One object of a kind socklb reads.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Service(Box<Service>),
    EndpointSlice(Box<EndpointSlice>),
    Node(Box<Node>),
    Pod(Box<Pod>),
    Namespace(Box<Namespace>),
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Self::Service(_) => Kind::Service,
            Self::EndpointSlice(_) => Kind::EndpointSlice,
            Self::Node(_) => Kind::Node,
            Self::Pod(_) => Kind::Pod,
            Self::Namespace(_) => Kind::Namespace,
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Self::Service(service) => &service.metadata,
            Self::EndpointSlice(slice) => &slice.metadata,
            Self::Node(node) => &node.metadata,
            Self::Pod(pod) => &pod.metadata,
            Self::Namespace(namespace) => &namespace.metadata,
        }
    }
}

impl Event {
    /// The kind whose complete set this event ends, if it ends one.
    pub fn listed(&self) -> Option<Kind> {
        match self {
            Self::Reset(kind, _) | Self::Listed(kind) => Some(*kind),
            _ => None,
        }
    }
}

/// A change in the cluster, as a source sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The complete current set of objects of one kind: after the initial list, after a
    /// relist (410 Gone, reconnect), or after a manifests directory was re-read. Objects of
    /// that kind not in the set are gone.
    Reset(Kind, Vec<Object>),
    /// The start of a list of one kind sent object by object, so that a list of 100,000
    /// Services is never held at once: the objects [`Event::Applied`] until
    /// [`Event::Listed`] of that kind are its complete set (Services and EndpointSlices).
    Listing(Kind),
    /// The end of a list begun by [`Event::Listing`]: objects of that kind not applied
    /// since are gone.
    Listed(Kind),
    /// An object was created or changed.
    Applied(Object),
    /// An object was deleted: its last known state (the file source, which keeps no parsed
    /// objects, gives only the kind, namespace and name).
    Deleted(Object),
}
