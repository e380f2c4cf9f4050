//! `socklb inspect`'s table: a row per frontend, then the flows, the affinity entries, the
//! counters and filters, and the pods' paths. Names from the cluster and the node are
//! escaped for the terminal.
use std::{fmt::Write as _, net::SocketAddr};

use socklb_abi::Counters;

use super::{frontends::ServiceLabel, inspection::Inspection, pods::PodPathState};
use crate::{dataplane::PodDelivery, select::socket_path::Scope, terminal::printable};

pub fn table(inspection: &Inspection) -> String {
    let mut out = String::from(
        "FRONTEND                 SCOPE     ID      SERVICE                        AFFINITY  BACKENDS\n",
    );
    for state in &inspection.frontends {
        let f = &state.frontend;
        let backends = if state.backends.is_empty() && state.refuses {
            // The reason follows on the row (`refused: no endpoints`).
            "none".to_owned()
        } else if state.backends.is_empty() {
            crate::explain::empty_frontend(f.scope, state.refuses).to_owned()
        } else {
            state
                .backends
                .iter()
                .map(|b| b.map_or_else(|| "<missing slot>".to_owned(), |b| b.to_string()))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let affinity = state
            .affinity_timeout_seconds
            .map_or_else(|| "-".to_owned(), |t| format!("{t}s"));
        let backends = match &state.source_ranges {
            Some(ranges) if ranges.is_empty() => format!("{backends}  (no client allowed)"),
            Some(ranges) => format!("{backends}  (clients: {})", ranges.join(" ")),
            None => backends,
        };
        let backends = if state.maglev {
            format!("{backends}  (maglev)")
        } else {
            backends
        };
        let backends = if state.refuses {
            format!("{backends}  (refused: no endpoints)")
        } else {
            backends
        };
        let _ = writeln!(
            out,
            "{:24} {:9} {:<7} {:30} {:9} {}",
            format!(
                "{}/{}",
                SocketAddr::new(f.address, f.port),
                f.protocol.name()
            ),
            f.scope.name(),
            state.service_id,
            state
                .service
                .as_ref()
                .map_or_else(|| "-".to_owned(), ServiceLabel::shown),
            affinity,
            backends
        );
    }
    if !inspection.conntrack.is_empty() {
        out.push_str(
            "\nCONNTRACK (flows translated per packet: from outside, and from pod devices)\n",
        );
        for c in &inspection.conntrack {
            let protocol = c.protocol.map_or("?", |p| p.name());
            let _ = writeln!(
                out,
                "{:4} {:7} {} -> {}  =>  {} -> {}  service {} backend {}{}{}{}{} idle {}s",
                protocol,
                c.direction,
                c.from,
                c.to,
                c.rewritten_from,
                c.rewritten_to,
                c.service_id,
                c.backend_id,
                if c.snat { " snat" } else { "" },
                if c.direct { " direct" } else { "" },
                match (c.confirmed, c.seen_reply) {
                    (true, true) => "",
                    (true, false) => " unanswered",
                    (false, false) => " unconfirmed",
                    (false, true) => " unconfirmed answered",
                },
                if c.closing { " closing" } else { "" },
                c.idle_seconds
            );
        }
    }
    if !inspection.affinity.is_empty() {
        out.push_str("\nAFFINITY (sessionAffinity ClientIP)\n");
        for a in &inspection.affinity {
            let client = match (a.netns_cookie, a.client) {
                (Some(cookie), _) => format!("netns {cookie}"),
                (None, Some(client)) => format!("client {client}"),
                (None, None) => "?".to_owned(),
            };
            let service = inspection
                .frontends
                .iter()
                .find(|f| f.service_id == a.service_id)
                .and_then(|f| f.service.as_ref())
                .map_or_else(String::new, |s| {
                    format!(" ({}/{})", printable(&s.namespace), printable(&s.name))
                });
            let _ = writeln!(
                out,
                "{client} service {}{service} -> {} slot {} idle {}s{}",
                a.service_id,
                a.backend
                    .map_or_else(|| "<slot no longer holds it>".to_owned(), |b| b.to_string()),
                a.slot,
                a.idle_seconds,
                if a.expired {
                    " expired (the next connection chooses afresh)"
                } else {
                    ""
                }
            );
        }
    }
    let _ = write!(
        out,
        "\naffinity entries: {}\nfragmented datagrams: {}\nsockets with a record: {}\nsocket \
         hooks' scope: {}\npods' delivery (their per-packet flows to this node's pods): {}\npods' \
         namespaces in the socket hooks' scope: {}\nexternal devices: {}\npod devices \
         (per-packet path): {}\ncounters:",
        inspection.affinity.len(),
        inspection.fragments,
        inspection.socket_records,
        match inspection.socket_lb_scope {
            Some(Scope::All) => "all (every network namespace's sockets)",
            Some(Scope::Host) => "host (the host's sockets only)",
            Some(Scope::Pods) => "pods (the host's, and the listed pods')",
            None => "not written (the agent has not synced yet, or is older than this inspect)",
        },
        match inspection.pod_delivery {
            Some(PodDelivery::Kernel) => "kernel (through the node's routing and netfilter)",
            Some(PodDelivery::Direct) =>
                "direct (redirected past the node's routing and netfilter)",
            None => "not written (no node map, or one older than this inspect)",
        },
        inspection.pod_namespaces,
        listed(&inspection.external_devices),
        listed(&inspection.pod_devices),
    );
    for (name, value) in Counters::NAMES.iter().zip(inspection.counters.values()) {
        let _ = write!(out, " {name} {value}");
    }
    if let Some(fill) = &inspection.flow_filter {
        let _ = write!(
            out,
            "\nflow filter: {}, {} of {} frontend slots, {} of {} backend slots and {} of {} \
             unconfirmed frontend slots marked",
            if fill.ready {
                "trusted"
            } else {
                "not trusted yet (every packet is looked up)"
            },
            fill.frontends,
            fill.slots,
            fill.backends,
            fill.slots,
            fill.unconfirmed,
            fill.slots,
        );
    }
    if let Some(fill) = &inspection.frontend_filter {
        let _ = write!(
            out,
            "\nfrontend filter: {}, {} of {} slots marked",
            if fill.ready {
                "trusted"
            } else {
                "not trusted yet (every packet of no flow is looked up)"
            },
            fill.marked,
            fill.slots,
        );
    }
    if !inspection.pods.is_empty() {
        out.push_str("\npods (network namespaces the runtime pinned):");
        for pod in &inspection.pods {
            let path = match pod.path {
                PodPathState::Socket => "socket",
                PodPathState::PerPacket => "per-packet",
                PodPathState::None => "none (not translated)",
            };
            let _ = write!(
                out,
                "\n  {} netns {} addresses {} devices {}: {path}",
                printable(&pod.namespace),
                pod.cookie,
                listed(
                    &pod.addresses
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                ),
                listed(&pod.devices),
            );
        }
    }
    if let Some(why) = &inspection.pods_unreadable {
        let _ = write!(out, "\npods: {why}");
    }
    // What `auto` picks with this process's capabilities: the agent's own mode (it may run
    // another) is in its start log and in socklb_socket_destroy_mode.
    let destroy = &inspection.socket_destroy;
    let _ = write!(
        out,
        "\n{} (as this process would; the agent's own mode: its start log, metric \
         socklb_socket_destroy_mode)",
        destroy.describe()
    );
    out.push('\n');
    out
}

/// Names separated by spaces, or "none"; escaped for the terminal (a device's name is
/// its creator's choice).
fn listed(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names
            .iter()
            .map(|name| printable(name))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::{
        super::{
            affinity::AffinityState,
            frontends::FrontendState,
            inspection::CountersView,
            pods::{PodPathState, PodState},
        },
        *,
    };
    use crate::{
        desired::{Frontend, Protocol, Scope},
        sweep::{Expected, Mode, netns::Coverage},
    };

    fn inspection(frontends: Vec<FrontendState>, affinity: Vec<AffinityState>) -> Inspection {
        Inspection {
            frontends,
            affinity,
            conntrack: Vec::new(),
            fragments: 0,
            socket_records: 0,
            pod_namespaces: 0,
            socket_lb_scope: Some(crate::select::socket_path::Scope::Pods),
            pod_delivery: Some(PodDelivery::Kernel),
            pods: vec![PodState {
                namespace: "/run/netns/cni-\x1b[2J".to_owned(),
                cookie: 4096,
                addresses: Vec::new(),
                devices: vec!["veth\u{202e}0".to_owned()],
                path: PodPathState::Socket,
            }],
            pods_unreadable: None,
            external_devices: vec!["eth\x1b0".to_owned()],
            pod_devices: Vec::new(),
            counters: CountersView::default(),
            flow_filter: None,
            frontend_filter: None,
            socket_destroy: Expected {
                mode: Mode::Off,
                every_namespace: false,
                coverage: Coverage {
                    enters_others: false,
                    host_processes: false,
                    other_users: false,
                },
                reason: None,
            },
        }
    }

    #[test]
    fn names_from_the_cluster_reach_the_terminal_escaped() {
        let frontend = FrontendState {
            frontend: Frontend {
                address: Ipv4Addr::new(10, 96, 0, 10).into(),
                port: 80,
                protocol: Protocol::Tcp,
                scope: Scope::Internal,
            },
            service_id: 3,
            service: Some(ServiceLabel {
                namespace: "default\x1b[31m".to_owned(),
                name: "web\u{202e}gpj".to_owned(),
                port: "\x1b]0;pwned\x07".to_owned(),
                kind: "ClusterIP",
            }),
            affinity_timeout_seconds: Some(600),
            backends: Vec::new(),
            source_ranges: None,
            maglev: false,
            refuses: false,
        };
        let affinity = AffinityState {
            netns_cookie: Some(1),
            client: None,
            service_id: 3,
            backend_id: 1,
            slot: 1,
            backend: None,
            idle_seconds: 5,
            expired: false,
        };
        let table = table(&inspection(vec![frontend], vec![affinity]));
        for raw in ['\x1b', '\x07', '\u{202e}'] {
            assert!(!table.contains(raw), "{raw:?} reached the table:\n{table}");
        }
        for shown in [
            "default\\x1b[31m/web\\u{202e}gpj:\\x1b]0;pwned\\x07",
            "service 3 (default\\x1b[31m/web\\u{202e}gpj)",
            "/run/netns/cni-\\x1b[2J",
            "devices veth\\u{202e}0",
            "external devices: eth\\x1b0",
            "socket hooks' scope: pods",
            "netns 4096 addresses",
        ] {
            assert!(table.contains(shown), "{shown:?} missing:\n{table}");
        }
    }
}
