//! `socklb explain`: for every Service frontend, the backends this node uses for internal
//! and external traffic, and why; for every pod of this node, which path serves its
//! connections, and why. A table for people, JSON (`-o json`) for tools.

use std::{borrow::Cow, collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use crate::{
    desired::Frontend,
    select::{
        FrontendKind, Policy, Refusal, ServiceName, ServiceSelection, SkipReason, SkippedPart,
        ThisNode, Topology,
        socket_path::{Path, PodPath, SOCKET_LB_KEY, Scope, pod_path},
    },
    state::ClusterState,
    terminal::printable,
};

/// The JSON document of `socklb explain -o json` (documented in docs/explain.md).
#[derive(Debug, Serialize)]
pub struct Explanation {
    pub node: NodeView,
    pub services: Vec<ServiceSelection>,
    pub skipped: Vec<SkippedService>,
    /// The scope the pods' paths are worked out for (`--socket-lb-scope`).
    pub socket_lb_scope: Scope,
    pub pods: Vec<PodPath>,
}

/// Which Services and pods to explain.
#[derive(Debug, Default)]
pub struct Only<'a> {
    pub service: Option<&'a ServiceName>,
    /// namespace/name.
    pub pod: Option<&'a str>,
}

#[derive(Debug, Serialize)]
pub struct NodeView {
    pub name: String,
    pub zone: Option<String>,
    pub addresses: Vec<std::net::IpAddr>,
}

#[derive(Debug, Serialize)]
pub struct SkippedService {
    pub service: ServiceName,
    #[serde(flatten)]
    pub reason: SkipReason,
}

/// What the agent programs for `state` with `--socket-lb-scope scope`.
pub fn explain(state: &ClusterState, scope: Scope, only: &Only<'_>) -> Explanation {
    let node: &ThisNode = state.this_node();
    // `--pod` alone asks about a pod, not about the Services.
    let wanted = |name: &ServiceName| match only.service {
        Some(only) => only == name,
        None => only.pod.is_none(),
    };
    let selections = state.select_all();
    // Of the Services that claim one frontend, the first claim programs it, as in the
    // agent's table.
    let mut owners: BTreeMap<Frontend, (u8, &ServiceName)> = BTreeMap::new();
    for selection in &selections {
        for choice in &selection.frontends {
            let claim = (choice.kind.claim_rank(), &selection.service);
            let owner = owners.entry(choice.frontend).or_insert(claim);
            *owner = (*owner).min(claim);
        }
    }
    let owners: BTreeMap<Frontend, ServiceName> = owners
        .into_iter()
        .map(|(frontend, (_, owner))| (frontend, owner.clone()))
        .collect();
    Explanation {
        node: NodeView {
            name: node.name.clone(),
            zone: node.zone().map(str::to_owned),
            addresses: node.addresses.clone(),
        },
        services: selections
            .into_iter()
            .filter(|s| wanted(&s.service))
            .map(|mut selection| {
                // A refused frontend uses none of its endpoints (what it had programmed
                // before, if anything, is in `socklb inspect`).
                for choice in &mut selection.frontends {
                    if let Some(owner) = owners.get(&choice.frontend)
                        && *owner != selection.service
                    {
                        choice.refused = Some(Refusal::TakenBy {
                            service: owner.clone(),
                        });
                    }
                    if choice.refused.is_some() {
                        choice.spec.backends.clear();
                    }
                }
                selection
            })
            .collect(),
        skipped: state
            .skipped()
            .filter(|(name, _)| wanted(name))
            .map(|(service, reason)| SkippedService {
                service: service.clone(),
                reason: reason.clone(),
            })
            .collect(),
        socket_lb_scope: scope,
        pods: state
            .workloads()
            .paths()
            .map(|(pod, choice)| {
                let mut path = pod_path(scope, pod, choice);
                if let Some(value) = state.workloads().namespace_label_ignored(pod) {
                    path.why.push_str(&format!(
                        " (its Namespace's label {SOCKET_LB_KEY}={value:?} is not off: it \
                         chooses nothing)"
                    ));
                }
                path
            })
            // `--service` alone asks about a Service, not about the pods.
            .filter(|path| match only.pod {
                Some(pod) => pod == path.pod,
                None => only.service.is_none(),
            })
            .collect(),
    }
}

/// `items` separated by spaces.
fn spaced<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a frontend without backends does: a local socket's connection is refused, and so
/// is traffic from outside to a Service with no endpoint at all; traffic from outside to
/// one with endpoints on other nodes only (externalTrafficPolicy Local) is dropped, as
/// kube-proxy drops it.
pub fn empty_frontend(scope: crate::desired::Scope, no_endpoints: bool) -> &'static str {
    if scope == crate::desired::Scope::External && !no_endpoints {
        "none: dropped (no endpoint on this node)"
    } else {
        "none: connections refused"
    }
}

pub fn table(explanation: &Explanation) -> String {
    let mut rows: Vec<[String; 8]> = vec![[
        "SERVICE".into(),
        "PORT".into(),
        "FRONTEND".into(),
        "KIND/SCOPE".into(),
        "POLICY".into(),
        "AFFINITY".into(),
        "WHY".into(),
        "BACKENDS".into(),
    ]];
    for service in &explanation.services {
        for choice in &service.frontends {
            let frontend = &choice.frontend;
            let backends = if let Some(refused) = &choice.refused {
                format!("refused: {refused}")
            } else if choice.spec.backends.is_empty() {
                empty_frontend(frontend.scope, choice.spec.no_endpoints).to_owned()
            } else {
                spaced(&choice.spec.backends)
            };
            rows.push([
                service.service.to_string(),
                if choice.port_name.is_empty() {
                    "-".into()
                } else {
                    choice.port_name.clone()
                },
                format!(
                    "{}/{}",
                    std::net::SocketAddr::new(frontend.address, frontend.port),
                    frontend.protocol.name()
                ),
                format!("{}/{}", kind(choice.kind), frontend.scope.name()),
                match choice.why.policy {
                    Policy::Cluster => "Cluster".into(),
                    Policy::Local => "Local".into(),
                },
                choice
                    .spec
                    .affinity_timeout_seconds
                    .map_or_else(|| "-".to_owned(), |timeout| format!("{timeout}s")),
                why(
                    choice.why.policy,
                    &choice.why.topology,
                    choice.why.terminating_fallback,
                ),
                backends,
            ]);
        }
        for SkippedPart { part: what, reason } in &service.skipped {
            rows.push([
                service.service.to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("{what} not served: {reason}"),
                "-".into(),
            ]);
        }
    }
    for skipped in &explanation.skipped {
        rows.push([
            skipped.service.to_string(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            format!("not served: {}", skipped.reason),
            "-".into(),
        ]);
    }
    let mut out = format!(
        "node {} (zone {}, addresses {})\n",
        printable(&explanation.node.name),
        printable(explanation.node.zone.as_deref().unwrap_or("unset")),
        spaced(&explanation.node.addresses)
    );
    out.push_str(&aligned(&rows));
    if !explanation.pods.is_empty() {
        let mut pods = vec![[
            "POD".into(),
            "ADDRESSES".into(),
            "PATH".into(),
            "WHY".into(),
        ]];
        pods.extend(explanation.pods.iter().map(|pod| {
            [
                pod.pod.clone(),
                spaced(&pod.addresses),
                match pod.path {
                    Path::Socket => "socket".into(),
                    Path::PerPacket => "per-packet".into(),
                },
                pod.why.clone(),
            ]
        }));
        out.push('\n');
        out.push_str(&aligned(&pods));
        // The cluster's objects choose; the node may not follow (see inspect).
        let _ = write!(
            out,
            "\npaths as the cluster's objects choose them under --socket-lb-scope {}; a pod \
             whose device does not carry the per-packet program (--pod-devices) keeps the \
             socket path, and one whose address no pinned network namespace holds may (the \
             agent warns about both): `socklb inspect` shows what the node does\n",
            explanation.socket_lb_scope
        );
    }
    out
}

/// `rows` in columns as wide as their widest cell. Every cell is escaped for the terminal
/// (and measured escaped): most hold names, port names, annotation values or reasons that
/// quote them, as the cluster's objects give them.
fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let rows: Vec<[Cow<'_, str>; N]> = rows
        .iter()
        .map(|row| row.each_ref().map(|cell| printable(cell)))
        .collect();
    let mut widths = [0usize; N];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(widths) {
            // Padded by hand: a format width above u16::MAX (a 100,000-character name, the
            // backends of 70,000 endpoints) panics.
            line.push_str(cell);
            line.extend(std::iter::repeat_n(
                ' ',
                width.saturating_sub(cell.chars().count()) + 2,
            ));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn kind(kind: FrontendKind) -> &'static str {
    match kind {
        FrontendKind::ClusterIp => "ClusterIP",
        FrontendKind::NodePort => "NodePort",
        FrontendKind::ExternalIp => "externalIP",
        FrontendKind::LoadBalancer => "LoadBalancer",
    }
}

fn why(policy: Policy, topology: &Topology, terminating_fallback: bool) -> String {
    if policy == Policy::Local {
        return if terminating_fallback {
            "no ready endpoint on this node: serving terminating ones here".to_owned()
        } else {
            "ready endpoints on this node".to_owned()
        };
    }
    let topology = match topology {
        Topology::None => "all ready endpoints".to_owned(),
        Topology::HintsIgnored { reason } => {
            format!("all ready endpoints (hints ignored: {reason})")
        }
        Topology::NodeHints => "node hints for this node".to_owned(),
        Topology::ZoneHints { zone } => format!("zone hints for {zone}"),
        Topology::Key { key } => format!("topology key {key}"),
        Topology::KeysUnmatched => "no topology key matched".to_owned(),
    };
    if terminating_fallback {
        "no ready endpoint: serving terminating ones".to_owned()
    } else {
        topology
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{Event, file::parse};

    fn state_of(yaml: &str) -> ClusterState {
        let mut state = ClusterState::new("node-a");
        for object in parse(std::path::Path::new("test.yaml"), yaml).expect("parse") {
            state.apply(Event::Applied(object));
        }
        state
    }

    /// A Service of one port with a ClusterIP and an externalIP, and its slice of one
    /// endpoint.
    fn claimant(name: &str, cluster_ip: &str, external_ip: &str, endpoint: &str) -> String {
        format!(
            "kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {cluster_ip}
  externalIPs: [{external_ip}]
  ports: [{{name: http, port: 80}}]
---
kind: EndpointSlice
metadata: {{name: {name}-1, namespace: default, labels: {{kubernetes.io/service-name: {name}}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints: [{{addresses: [{endpoint}]}}]
---
"
        )
    }

    #[test]
    fn a_frontend_two_services_claim_is_said_taken_by_the_first() {
        let service =
            |name: &str, cluster_ip: &str| claimant(name, cluster_ip, "203.0.113.9", "10.244.0.9");
        let state = state_of(&format!(
            "{}{}",
            service("b-second", "10.96.9.2"),
            service("a-first", "10.96.9.1")
        ));
        let explanation = explain(&state, Scope::Pods, &Only::default());
        let table = table(&explanation);
        let rows: Vec<&str> = table
            .lines()
            .filter(|line| line.contains("203.0.113.9:80"))
            .collect();
        let row = |service: &str| {
            rows.iter()
                .filter(|row| row.starts_with(service))
                .copied()
                .collect::<Vec<_>>()
        };
        let first = row("default/a-first");
        assert!(
            !first.is_empty() && first.iter().all(|row| row.ends_with("10.244.0.9:8080")),
            "{rows:?}"
        );
        let second = row("default/b-second");
        assert!(
            !second.is_empty()
                && second
                    .iter()
                    .all(|row| row.contains("refused: taken by default/a-first")),
            "{rows:?}"
        );
    }

    #[test]
    fn an_external_ip_equal_to_a_cluster_ip_is_taken_by_the_cluster_ip_s_service() {
        let service = claimant;
        let state = state_of(&format!(
            "{}{}",
            service("zz-dns", "10.96.0.10", "203.0.113.1", "10.244.0.10"),
            service("aaa", "10.96.0.11", "10.96.0.10", "10.244.0.66")
        ));
        let explanation = explain(&state, Scope::Pods, &Only::default());
        let rows: Vec<String> = table(&explanation)
            .lines()
            .filter(|line| line.contains("10.96.0.10:80"))
            .map(str::to_owned)
            .collect();
        assert!(
            rows.iter()
                .filter(|row| row.starts_with("default/zz-dns"))
                .all(|row| row.ends_with("10.244.0.10:8080")),
            "{rows:?}"
        );
        assert!(
            rows.iter().any(|row| row.starts_with("default/aaa")
                && row.contains("refused: taken by default/zz-dns")),
            "{rows:?}"
        );
    }

    #[test]
    fn the_table_shows_a_client_ip_services_affinity_timeout() {
        let state = state_of(
            "kind: Service
metadata: {name: sticky, namespace: default}
spec:
  clusterIP: 10.96.8.1
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  ports: [{name: http, port: 80}]
",
        );
        let table = table(&explain(&state, Scope::Pods, &Only::default()));
        let row = table
            .lines()
            .find(|line| line.contains("10.96.8.1:80/TCP"))
            .expect("the ClusterIP's row");
        assert!(row.contains(" 600s "), "{table}");
        assert!(
            table.starts_with("node ") && table.contains(" AFFINITY "),
            "{table}"
        );
    }

    #[test]
    fn a_namespace_label_that_chooses_nothing_is_said_in_the_why() {
        let state = state_of(
            "kind: Namespace
metadata: {name: shop, labels: {socklb.io/socket-lb: 'false'}}
---
kind: Pod
metadata: {name: app, namespace: shop}
spec: {nodeName: node-a}
status: {podIPs: [{ip: 10.244.0.3}]}
",
        );
        let explanation = explain(&state, Scope::Pods, &Only::default());
        let why = &explanation.pods[0].why;
        assert!(
            why.starts_with("the default")
                && why.contains("socklb.io/socket-lb=\"false\" is not off"),
            "{why}"
        );
    }

    #[test]
    fn a_service_filter_leaves_the_pods_out_and_a_pod_filter_the_services() {
        let state = state_of(
            "kind: Pod
metadata: {name: app, namespace: default}
spec: {nodeName: node-a}
status: {podIPs: [{ip: 10.244.0.3}]}
---
kind: Service
metadata: {name: lb, namespace: default}
spec: {clusterIP: 10.96.0.9, ports: [{port: 80}]}
",
        );
        let services = |only: Only<'_>| explain(&state, Scope::Pods, &only).services.len();
        assert_eq!(services(Only::default()), 1);
        assert_eq!(
            services(Only {
                service: None,
                pod: Some("default/app")
            }),
            0
        );
        let lb = ServiceName {
            namespace: "default".to_owned(),
            name: "lb".to_owned(),
        };
        let pods = |only: Only<'_>| explain(&state, Scope::Pods, &only).pods.len();
        assert_eq!(pods(Only::default()), 1);
        assert_eq!(
            pods(Only {
                service: Some(&lb),
                pod: None
            }),
            0
        );
        assert_eq!(
            pods(Only {
                service: Some(&lb),
                pod: Some("default/app")
            }),
            1
        );
    }

    #[test]
    fn an_empty_external_frontend_says_whether_it_drops_or_refuses() {
        let state_with = |endpoint_node: &str| {
            let yaml = format!(
                "kind: Node
metadata: {{name: node-a}}
status: {{addresses: [{{type: InternalIP, address: 192.168.7.1}}]}}
---
kind: Service
metadata: {{name: lb, namespace: default}}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  clusterIP: 10.96.7.1
  ports: [{{name: http, port: 80, nodePort: 30007}}]
status: {{loadBalancer: {{ingress: [{{ip: 198.51.100.7}}]}}}}
---
kind: EndpointSlice
metadata: {{name: lb-1, namespace: default, labels: {{kubernetes.io/service-name: lb}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints: [{{addresses: [10.244.2.7], nodeName: {endpoint_node}}}]
"
            );
            state_of(&yaml)
        };
        let row = |endpoint_node: &str| {
            let explanation = explain(&state_with(endpoint_node), Scope::Pods, &Only::default());
            table(&explanation)
                .lines()
                .find(|line| line.contains("198.51.100.7:80") && line.contains("external"))
                .map(str::to_owned)
                .expect("the LoadBalancer IP's external row")
        };
        // Endpoints elsewhere only: kube-proxy drops traffic from outside (no reject flag).
        assert!(row("node-b").ends_with("none: dropped (no endpoint on this node)"));
        // The local endpoint serves it.
        assert!(
            row("node-a").ends_with("10.244.2.7:8080"),
            "{}",
            row("node-a")
        );
    }

    #[test]
    fn names_and_annotation_values_reach_the_terminal_escaped() {
        // Double-quoted YAML: `\e` is ESC, `\a` BEL, `\u202E` the right-to-left override.
        let state = state_of(
            r#"kind: Service
metadata:
  name: "web\u202Egpj"
  namespace: "default\e[31m"
  annotations:
    service.beta.kubernetes.io/load-balancer-source-ranges: "10.0.0.0/8,\e]0;pwned\a\e[2J"
spec:
  type: LoadBalancer
  clusterIP: 10.96.6.1
  ports: [{name: "ht\e[8mtp", port: 80}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.6}]}}
---
kind: Service
metadata: {name: "gone\e[2J", namespace: default}
spec: {clusterIP: None}
"#,
        );
        let mut explanation = explain(&state, Scope::Pods, &Only::default());
        // The node's name and zone as a hostname or a label could give them.
        explanation.node.name = "node\x1b[2J-a".to_owned();
        explanation.node.zone = Some("z\u{202e}1".to_owned());
        let table = table(&explanation);
        for raw in ['\x1b', '\x07', '\u{202e}'] {
            assert!(!table.contains(raw), "{raw:?} reached the table:\n{table}");
        }
        for shown in [
            "node node\\x1b[2J-a (zone z\\u{202e}1,",
            "default\\x1b[31m/web\\u{202e}gpj",
            "ht\\x1b[8mtp",
            "loadBalancerSourceRanges \\x1b]0;pwned\\x07\\x1b[2J not served: invalid: not a CIDR",
            "default/gone\\x1b[2J",
        ] {
            assert!(table.contains(shown), "{shown:?} missing:\n{table}");
        }
        // The columns line up on the escaped text.
        let header = table.lines().nth(1).expect("the header");
        let row = table
            .lines()
            .find(|line| line.contains("10.96.6.1:80/TCP"))
            .expect("the ClusterIP's row");
        assert_eq!(header.find("FRONTEND"), row.find("10.96.6.1"), "{table}");
        // JSON keeps the values as they are: serde escapes them.
        let json = serde_json::to_string(&explanation).expect("json");
        assert!(
            json.contains("web\u{202e}gpj") && json.contains("\\u001b"),
            "{json}"
        );
    }

    #[test]
    fn a_cell_wider_than_a_format_width_is_printed_whole() {
        let name = "n".repeat(100_000);
        let explanation = Explanation {
            node: NodeView {
                name: "node-a".to_owned(),
                zone: None,
                addresses: Vec::new(),
            },
            services: Vec::new(),
            skipped: vec![SkippedService {
                service: ServiceName {
                    namespace: "default".to_owned(),
                    name: name.clone(),
                },
                reason: SkipReason::Headless,
            }],
            socket_lb_scope: Scope::Pods,
            pods: Vec::new(),
        };
        let table = table(&explanation);
        assert!(
            table.contains(&format!("default/{name}")),
            "{}",
            &table[..200]
        );
    }
}
