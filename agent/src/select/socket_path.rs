//! Which path serves a pod's connections to Services: the socket hooks (the default, under
//! `--socket-lb-scope pods`), or the per-packet path on its device, for a pod whose sockets
//! must keep the Service address: a meshed pod (its sidecar routes by the original
//! destination) or one its owner opted out. Pure: the runner applies it to the pods'
//! network namespaces, `socklb explain` shows it.
use std::{collections::BTreeMap, net::IpAddr};

use clap::ValueEnum;
use serde::Serialize;

/// Pod annotation and Namespace label: `off` keeps the pod's sockets on the Service address
/// (the per-packet path serves it), `on` keeps the socket path even for a meshed pod.
pub const SOCKET_LB_KEY: &str = "socklb.io/socket-lb";
/// Set on a pod Istio injected its sidecar into.
pub const ISTIO_SIDECAR: &str = "sidecar.istio.io/status";
/// Set on a pod Linkerd injected its proxy into.
pub const LINKERD_PROXY: &str = "linkerd.io/proxy-version";

/// Which sockets the socket hooks translate (`--socket-lb-scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// Every network namespace's.
    All,
    /// The host's network namespace's only.
    Host,
    /// The host's and those of this node's pods (the namespaces its runtime pinned).
    Pods,
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::All => "all",
            Self::Host => "host",
            Self::Pods => "pods",
        })
    }
}

/// What the choice reads of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub ips: Vec<IpAddr>,
    pub annotations: BTreeMap<String, String>,
    /// `spec.hostNetwork`: the pod's sockets are the host's.
    pub host_network: bool,
    /// `metadata.deletionTimestamp` is set: its runtime may already have torn down its
    /// network namespace while the Pod still shows its addresses.
    pub terminating: bool,
}

/// The path of a pod's connections, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SocketPath {
    /// Translated at connect() (the default).
    Socket,
    /// A pod in the host's network namespace: its sockets are the host's, which the socket
    /// hooks translate under every scope; no annotation can move them.
    HostNetwork,
    /// The pod's annotation says `on`, over a sidecar or its Namespace's label.
    SocketByAnnotation,
    /// The pod's annotation says `off`.
    PerPacketByAnnotation,
    /// Its Namespace's label says `off`.
    PerPacketByNamespace,
    /// An Istio sidecar.
    PerPacketIstio,
    /// A Linkerd proxy.
    PerPacketLinkerd,
}

impl SocketPath {
    pub fn per_packet(self) -> bool {
        !matches!(
            self,
            Self::Socket | Self::HostNetwork | Self::SocketByAnnotation
        )
    }

    /// As `socklb explain` names it (its `reason` under `--socket-lb-scope pods`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Socket => "socket",
            Self::HostNetwork => "host-network",
            Self::SocketByAnnotation => "socket-by-annotation",
            Self::PerPacketByAnnotation => "per-packet-by-annotation",
            Self::PerPacketByNamespace => "per-packet-by-namespace",
            Self::PerPacketIstio => "per-packet-istio",
            Self::PerPacketLinkerd => "per-packet-linkerd",
        }
    }
}

/// A value of [`SOCKET_LB_KEY`] that is neither `on` nor `off`: it chooses nothing.
pub fn not_understood(value: Option<&String>) -> Option<&str> {
    value
        .map(String::as_str)
        .filter(|value| !matches!(*value, "on" | "off"))
}

/// The value of [`SOCKET_LB_KEY`] on a Namespace that chooses nothing: a Namespace can only
/// say `off` (send its pods to the per-packet path).
pub fn namespace_label_ignored(labels: Option<&BTreeMap<String, String>>) -> Option<&str> {
    labels?
        .get(SOCKET_LB_KEY)
        .map(String::as_str)
        .filter(|value| *value != "off")
}

/// The path of `pod`, whose Namespace has `namespace_labels`.
pub fn socket_path(
    pod: &PodInfo,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> SocketPath {
    if pod.host_network {
        return SocketPath::HostNetwork;
    }
    match pod.annotations.get(SOCKET_LB_KEY).map(String::as_str) {
        Some("off") => return SocketPath::PerPacketByAnnotation,
        Some("on") => return SocketPath::SocketByAnnotation,
        _ => {}
    }
    if namespace_labels
        .and_then(|labels| labels.get(SOCKET_LB_KEY))
        .map(String::as_str)
        == Some("off")
    {
        return SocketPath::PerPacketByNamespace;
    }
    if pod.annotations.contains_key(ISTIO_SIDECAR) {
        return SocketPath::PerPacketIstio;
    }
    if pod.annotations.contains_key(LINKERD_PROXY) {
        return SocketPath::PerPacketLinkerd;
    }
    SocketPath::Socket
}

/// The path that serves a pod's connections to Services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    /// The socket hooks, at connect() and sendmsg().
    Socket,
    /// The TC programs on the pod's device, packet by packet.
    PerPacket,
}

/// A pod's path under `scope`, and why, for `socklb explain`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodPath {
    /// namespace/name.
    pub pod: String,
    pub addresses: Vec<IpAddr>,
    pub path: Path,
    /// `scope-all`, `scope-host`, or the pod's own choice (`socket`, `per-packet-istio`, ...).
    pub reason: String,
    pub why: String,
}

/// The path of `pod`, whose own choice is `choice`, when the agent runs with `scope`.
pub fn pod_path(scope: Scope, pod: &PodInfo, choice: SocketPath) -> PodPath {
    let (path, reason, why) = match scope {
        _ if choice == SocketPath::HostNetwork => (
            Path::Socket,
            choice.label(),
            "hostNetwork: its sockets are the node's, which the socket hooks translate under \
             every scope",
        ),
        Scope::All => (
            Path::Socket,
            "scope-all",
            "--socket-lb-scope all: every namespace's sockets are translated, a sidecar's too",
        ),
        Scope::Host => (
            Path::PerPacket,
            "scope-host",
            "--socket-lb-scope host: only the host's sockets are translated",
        ),
        Scope::Pods => {
            let why = match choice {
                SocketPath::Socket | SocketPath::HostNetwork => "the default for this node's pods",
                SocketPath::SocketByAnnotation => "its annotation socklb.io/socket-lb: on",
                SocketPath::PerPacketByAnnotation => "its annotation socklb.io/socket-lb: off",
                SocketPath::PerPacketByNamespace => {
                    "its Namespace's label socklb.io/socket-lb: off"
                }
                SocketPath::PerPacketIstio => {
                    "an Istio sidecar (sidecar.istio.io/status) routes by the Service address"
                }
                SocketPath::PerPacketLinkerd => {
                    "a Linkerd proxy (linkerd.io/proxy-version) routes by the Service address"
                }
            };
            let path = if choice.per_packet() {
                Path::PerPacket
            } else {
                Path::Socket
            };
            (path, choice.label(), why)
        }
    };
    let why = match not_understood(pod.annotations.get(SOCKET_LB_KEY)) {
        Some(value) => format!("{why} ({SOCKET_LB_KEY}: {value:?} is neither on nor off)"),
        None => why.to_owned(),
    };
    PodPath {
        pod: format!("{}/{}", pod.namespace, pod.name),
        addresses: pod.ips.clone(),
        path,
        reason: reason.to_owned(),
        why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            namespace: "default".to_owned(),
            name: "app".to_owned(),
            ips: Vec::new(),
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            host_network: false,
            terminating: false,
        }
    }

    #[test]
    fn a_host_network_pod_is_the_host_s_under_every_scope() {
        let host = PodInfo {
            host_network: true,
            ..pod(&[(SOCKET_LB_KEY, "off"), (ISTIO_SIDECAR, "{}")])
        };
        let choice = socket_path(&host, None);
        assert_eq!(choice, SocketPath::HostNetwork);
        assert!(!choice.per_packet());
        for scope in [Scope::All, Scope::Host, Scope::Pods] {
            let path = pod_path(scope, &host, choice);
            assert_eq!(
                (path.path, path.reason.as_str()),
                (Path::Socket, "host-network"),
                "{scope:?}"
            );
        }
    }

    /// (pod annotations, namespace labels, path)
    type Row<'a> = (
        &'a [(&'a str, &'a str)],
        Option<&'a BTreeMap<String, String>>,
        SocketPath,
    );

    #[test]
    fn each_rule_decides_in_its_order() {
        let off = BTreeMap::from([(SOCKET_LB_KEY.to_owned(), "off".to_owned())]);
        let other = BTreeMap::from([("team".to_owned(), "a".to_owned())]);
        let rows: [Row; 9] = [
            (&[], None, SocketPath::Socket),
            (&[], Some(&other), SocketPath::Socket),
            (
                &[(SOCKET_LB_KEY, "off")],
                None,
                SocketPath::PerPacketByAnnotation,
            ),
            (&[], Some(&off), SocketPath::PerPacketByNamespace),
            (&[(ISTIO_SIDECAR, "{}")], None, SocketPath::PerPacketIstio),
            (
                &[(LINKERD_PROXY, "stable-2.14")],
                None,
                SocketPath::PerPacketLinkerd,
            ),
            // The pod's own word wins over its Namespace and its sidecar.
            (
                &[(SOCKET_LB_KEY, "on"), (ISTIO_SIDECAR, "{}")],
                Some(&off),
                SocketPath::SocketByAnnotation,
            ),
            // The Namespace's label before the sidecar: both say per packet.
            (
                &[(ISTIO_SIDECAR, "{}")],
                Some(&off),
                SocketPath::PerPacketByNamespace,
            ),
            // Another value is no opinion.
            (&[(SOCKET_LB_KEY, "maybe")], None, SocketPath::Socket),
        ];
        for (annotations, labels, path) in rows {
            assert_eq!(
                socket_path(&pod(annotations), labels),
                path,
                "{annotations:?} {labels:?}"
            );
        }
    }

    #[test]
    fn a_value_neither_on_nor_off_is_said_in_the_why() {
        let typo = pod(&[(SOCKET_LB_KEY, "Off")]);
        let path = pod_path(Scope::Pods, &typo, socket_path(&typo, None));
        assert_eq!(path.path, Path::Socket);
        assert!(
            path.why.contains("\"Off\" is neither on nor off"),
            "{}",
            path.why
        );
        let off = pod(&[(SOCKET_LB_KEY, "off")]);
        let path = pod_path(Scope::Pods, &off, socket_path(&off, None));
        assert!(!path.why.contains("neither"), "{}", path.why);
    }

    #[test]
    fn the_scope_decides_before_the_pod() {
        let meshed = pod(&[(ISTIO_SIDECAR, "{}")]);
        let choice = socket_path(&meshed, None);
        let under = |scope| {
            let path = pod_path(scope, &meshed, choice);
            (path.path, path.reason)
        };
        assert_eq!(under(Scope::All), (Path::Socket, "scope-all".to_owned()));
        assert_eq!(
            under(Scope::Host),
            (Path::PerPacket, "scope-host".to_owned())
        );
        assert_eq!(
            under(Scope::Pods),
            (Path::PerPacket, "per-packet-istio".to_owned())
        );
        let plain = pod(&[]);
        let path = pod_path(Scope::Pods, &plain, socket_path(&plain, None));
        assert_eq!(
            (path.path, path.pod.as_str()),
            (Path::Socket, "default/app")
        );
    }
}
