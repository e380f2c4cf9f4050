//! This node's pods and the Namespaces' labels, as far as they choose the path that serves
//! each pod's connections (`select::socket_path`). Kept apart from the Services: a pod's
//! change reprograms no frontend, only the socket hooks' list of namespaces.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use tracing::warn;

use crate::{
    select::socket_path::{
        PodInfo, SOCKET_LB_KEY, SocketPath, namespace_label_ignored, not_understood, socket_path,
    },
    source::{Kind, Object},
};

#[derive(Debug, Default)]
pub struct Workloads {
    /// This node's pods, by (namespace, name).
    pods: BTreeMap<(String, String), PodInfo>,
    /// Namespaces' labels, by name.
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Something changed since [`Self::take_changed`].
    changed: bool,
}

impl Workloads {
    /// Replaces every pod (of `node`) or every Namespace, as `kind` says, with `objects`.
    /// Counts as a change even when nothing differs: the first lists (empty ones too) are
    /// what lets the pods' namespaces be written at all. Each object is compared with what
    /// was held, so a relist warns only about what it changed.
    pub fn reset(&mut self, node: &str, kind: Kind, objects: Vec<Object>) {
        let mut listed_pods = BTreeSet::new();
        let mut listed_namespaces = BTreeSet::new();
        for object in objects {
            match &object {
                Object::Pod(pod) if kind == Kind::Pod => listed_pods.insert(pod_key(pod)),
                Object::Namespace(namespace) if kind == Kind::Namespace => {
                    listed_namespaces.insert(namespace_labels(namespace).0)
                }
                _ => continue,
            };
            self.upsert_for(node, object);
        }
        match kind {
            Kind::Pod => self.pods.retain(|key, _| listed_pods.contains(key)),
            Kind::Namespace => self
                .namespaces
                .retain(|name, _| listed_namespaces.contains(name)),
            _ => return,
        }
        self.changed = true;
    }

    /// A pod of `node` or any Namespace, added or changed; a pod of another node (the file
    /// source reads every pod) is left out.
    pub fn upsert_for(&mut self, node: &str, object: Object) {
        if let Object::Pod(pod) = &object
            && (pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) != Some(node)
                || finished(pod))
        {
            return self.delete(&object);
        }
        self.upsert(object);
    }

    fn upsert(&mut self, object: Object) {
        match object {
            Object::Pod(pod) => {
                let info = pod_info(&pod);
                let key = (info.namespace.clone(), info.name.clone());
                let before = self.pods.get(&key);
                if before != Some(&info) {
                    // Said when the value is new, not when the pod changes otherwise.
                    let value = info.annotations.get(SOCKET_LB_KEY);
                    if before.map(|before| before.annotations.get(SOCKET_LB_KEY)) != Some(value)
                        && let Some(value) = not_understood(value)
                    {
                        warn!(
                            pod = %format!("{}/{}", key.0, key.1),
                            "annotation {SOCKET_LB_KEY}: {value:?} is neither on nor off: \
                             the pod's path is chosen as without it"
                        );
                    }
                    self.pods.insert(key, info);
                    self.changed = true;
                }
            }
            Object::Namespace(namespace) => {
                let (name, labels) = namespace_labels(&namespace);
                let before = self.namespaces.get(&name);
                if before != Some(&labels) {
                    // A Namespace can only send its pods to the per-packet path; said when
                    // the value is new.
                    if before.map(|before| before.get(SOCKET_LB_KEY))
                        != Some(labels.get(SOCKET_LB_KEY))
                        && let Some(value) = namespace_label_ignored(Some(&labels))
                    {
                        warn!(
                            namespace = name,
                            "label {SOCKET_LB_KEY}={value:?} is not off: its pods' paths are \
                             chosen as without it"
                        );
                    }
                    self.namespaces.insert(name, labels);
                    self.changed = true;
                }
            }
            _ => {}
        }
    }

    pub fn delete(&mut self, object: &Object) {
        let removed = match object {
            Object::Pod(pod) => self.pods.remove(&pod_key(pod)).is_some(),
            Object::Namespace(namespace) => self
                .namespaces
                .remove(namespace.metadata.name.as_deref().unwrap_or_default())
                .is_some(),
            _ => false,
        };
        self.changed |= removed;
    }

    /// Whether a pod or a Namespace changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    pub fn changed(&self) -> bool {
        self.changed
    }

    /// The value of its Namespace's [`SOCKET_LB_KEY`] label that chooses nothing for `pod`.
    pub fn namespace_label_ignored(&self, pod: &PodInfo) -> Option<&str> {
        namespace_label_ignored(self.namespaces.get(&pod.namespace))
    }

    /// Every pod of this node with its path.
    pub fn paths(&self) -> impl Iterator<Item = (&PodInfo, SocketPath)> {
        self.pods.values().map(|pod| {
            let labels = self.namespaces.get(&pod.namespace);
            (pod, socket_path(pod, labels))
        })
    }

    /// The addresses of this node's pods the per-packet path serves.
    pub fn per_packet_addresses(&self) -> Vec<IpAddr> {
        self.paths()
            .filter(|(_, path)| path.per_packet())
            .flat_map(|(pod, _)| pod.ips.iter().copied())
            .collect()
    }
}

fn pod_info(pod: &Pod) -> PodInfo {
    let status = pod.status.as_ref();
    let mut ips: Vec<IpAddr> = status
        .and_then(|status| status.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.ip.parse().ok())
        .collect();
    if ips.is_empty()
        && let Some(ip) = status.and_then(|status| status.pod_ip.as_ref())
        && let Ok(ip) = ip.parse()
    {
        ips.push(ip);
    }
    let (namespace, name) = pod_key(pod);
    PodInfo {
        namespace,
        name,
        ips,
        annotations: pod.metadata.annotations.clone().unwrap_or_default(),
        host_network: pod
            .spec
            .as_ref()
            .and_then(|spec| spec.host_network)
            .unwrap_or(false),
        terminating: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// Whether a pod's containers all ended for good (`Succeeded`, `Failed`): it keeps its
/// `podIPs`, which the node may already have given to a new pod.
fn finished(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .is_some_and(|phase| matches!(phase, "Succeeded" | "Failed"))
}

/// A pod's (namespace, name).
fn pod_key(pod: &Pod) -> (String, String) {
    (
        pod.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

fn namespace_labels(namespace: &Namespace) -> (String, BTreeMap<String, String>) {
    (
        namespace.metadata.name.clone().unwrap_or_default(),
        namespace.metadata.labels.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PodIP, PodSpec, PodStatus},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;

    const ISTIO: &str = "sidecar.istio.io/status";

    /// Labels or annotations.
    fn strings(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect(),
        )
    }

    fn pod(name: &str, node: &str, ip: &str, annotations: &[(&str, &str)]) -> Object {
        Object::Pod(Box::new(Pod {
            metadata: ObjectMeta {
                namespace: Some("shop".to_owned()),
                name: Some(name.to_owned()),
                annotations: strings(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.to_owned()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                pod_ips: Some(vec![PodIP { ip: ip.to_owned() }]),
                ..PodStatus::default()
            }),
        }))
    }

    fn namespace(name: &str, labels: &[(&str, &str)]) -> Object {
        Object::Namespace(Box::new(Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: strings(labels),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        }))
    }

    #[test]
    fn meshed_and_opted_out_pods_of_this_node_are_served_per_packet() {
        let mut workloads = Workloads::default();
        workloads.upsert_for("n1", pod("app", "n1", "10.244.1.5", &[]));
        workloads.upsert_for(
            "n1",
            pod(
                "meshed",
                "n1",
                "10.244.1.6",
                &[("sidecar.istio.io/status", "{}")],
            ),
        );
        workloads.upsert_for(
            "n1",
            pod(
                "elsewhere",
                "n2",
                "10.244.2.7",
                &[("socklb.io/socket-lb", "off")],
            ),
        );
        assert!(workloads.take_changed());
        assert_eq!(
            workloads.per_packet_addresses(),
            ["10.244.1.6".parse::<IpAddr>().expect("address")]
        );
        workloads.upsert_for("n1", namespace("shop", &[("socklb.io/socket-lb", "off")]));
        assert!(workloads.take_changed());
        assert_eq!(workloads.per_packet_addresses().len(), 2);
        // The same objects again change nothing.
        workloads.upsert_for("n1", namespace("shop", &[("socklb.io/socket-lb", "off")]));
        assert!(!workloads.take_changed());
        workloads.delete(&pod("meshed", "n1", "10.244.1.6", &[]));
        assert!(workloads.take_changed());
        assert_eq!(
            workloads.per_packet_addresses(),
            ["10.244.1.5".parse::<IpAddr>().expect("address")]
        );
    }

    #[test]
    fn a_finished_pod_leaves_its_address_to_the_pod_that_holds_it_now() {
        let mut workloads = Workloads::default();
        let job = || pod("job", "n1", "10.244.1.5", &[(ISTIO, "{}")]);
        workloads.upsert_for("n1", job());
        assert_eq!(workloads.per_packet_addresses().len(), 1);
        let Object::Pod(mut done) = job() else {
            unreachable!("a pod")
        };
        if let Some(status) = done.status.as_mut() {
            status.phase = Some("Succeeded".to_owned());
        }
        workloads.upsert_for("n1", Object::Pod(done));
        assert!(workloads.per_packet_addresses().is_empty());
    }

    #[test]
    fn a_relist_keeps_what_it_lists_and_drops_the_rest() {
        let mut workloads = Workloads::default();
        let listed = || {
            vec![
                pod("a", "n1", "10.244.1.5", &[("socklb.io/socket-lb", "off")]),
                pod("b", "n1", "10.244.1.6", &[("socklb.io/socket-lb", "off")]),
            ]
        };
        workloads.reset("n1", Kind::Pod, listed());
        workloads.reset("n1", Kind::Pod, listed());
        assert_eq!(workloads.per_packet_addresses().len(), 2);
        // The namespaces' list leaves the pods alone.
        workloads.reset("n1", Kind::Namespace, vec![namespace("shop", &[])]);
        assert_eq!(workloads.per_packet_addresses().len(), 2);
        workloads.reset("n1", Kind::Pod, listed().split_off(1));
        assert_eq!(
            workloads.per_packet_addresses(),
            ["10.244.1.6".parse::<IpAddr>().expect("address")]
        );
        assert!(workloads.take_changed());
    }
}
