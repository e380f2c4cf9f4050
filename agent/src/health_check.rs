//! kube-proxy's healthCheckNodePorts, answered as its
//! `pkg/proxy/healthcheck/service_health.go` does (README, "Health and metrics", has the
//! status, headers and body).
//!
//! The runner hands [`HealthChecks::sync`] the wanted ports after each sync; a count is
//! updated in place (a listener is never reopened for one), and a port that cannot be bound
//! is retried at later syncs without stopping the others.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{Arc, PoisonError, RwLock},
};

use axum::{
    Router,
    extract::State,
    http::{HeaderName, StatusCode, header},
    response::{IntoResponse, Response},
};
use tokio::sync::oneshot;
use tracing::{debug, info, warn};

use crate::{
    metrics::{Metrics, StateLabels},
    select::{ServiceName, ServiceSelection},
    server::Health,
};

/// kube-proxy's header for load balancers that weigh nodes by their local endpoints.
const ENDPOINT_WEIGHT: HeaderName = HeaderName::from_static("x-load-balancing-endpoint-weight");

/// Listen backlog: load balancers probe every few seconds from a handful of sources.
const BACKLOG: u32 = 128;

/// What one health-check port reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub service: ServiceName,
    /// Ready endpoints on this node (see [`crate::select::local_ready_endpoints`]).
    pub local_endpoints: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum HealthCheckError {
    #[error(
        "cannot listen on {address} for the health check of Service {service}: {source}; load \
         balancers see this node as down for it. Free the port (`ss -ltnp 'sport = :{port}'` \
         names its owner) or change spec.healthCheckNodePort; retried at every sync",
        port = address.port()
    )]
    Bind {
        address: SocketAddr,
        service: ServiceName,
        source: std::io::Error,
    },
}

/// The ports wanted by `selections`: every Service with a health check. Two Services on one
/// port (the API server prevents it; hand-written manifests may not) go to the first by
/// namespace/name, like frontends; the others are returned as conflicts.
pub fn desired<'a>(
    selections: impl IntoIterator<Item = &'a ServiceSelection>,
) -> (BTreeMap<u16, Served>, Vec<(u16, ServiceName)>) {
    let mut ports: BTreeMap<u16, Served> = BTreeMap::new();
    let mut conflicts = Vec::new();
    let mut sorted: Vec<&ServiceSelection> = selections.into_iter().collect();
    sorted.sort_by(|a, b| a.service.cmp(&b.service));
    for selection in sorted {
        let Some(check) = selection.health_check else {
            continue;
        };
        if ports.contains_key(&check.node_port) {
            conflicts.push((check.node_port, selection.service.clone()));
            continue;
        }
        ports.insert(
            check.node_port,
            Served {
                service: selection.service.clone(),
                local_endpoints: check.local_endpoints,
            },
        );
    }
    (ports, conflicts)
}

/// One open health-check port.
struct Listener {
    served: Arc<RwLock<Served>>,
    /// Dropping it stops the server: the port closes, open connections finish their request.
    _stop: oneshot::Sender<()>,
}

/// The open health-check ports.
pub struct HealthChecks {
    address: IpAddr,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    listeners: BTreeMap<u16, Listener>,
    /// Problems logged at the last sync, so that a persistent one is logged once.
    reported: BTreeSet<String>,
}

impl HealthChecks {
    /// Health checks listening on `address`. An unspecified address (`0.0.0.0` or `::`)
    /// means every address of the node, of both families: one dual-stack socket on `[::]`,
    /// or `0.0.0.0` where the node has no IPv6.
    pub fn new(address: IpAddr, health: Arc<Health>, metrics: Arc<Metrics>) -> Self {
        Self {
            address,
            health,
            metrics,
            listeners: BTreeMap::new(),
            reported: BTreeSet::new(),
        }
    }

    /// Ports being served.
    pub fn ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.listeners.keys().copied()
    }

    /// Makes the open ports exactly `wanted` (as far as they can be bound). Must run inside
    /// the tokio runtime: each port is served by a task of its own.
    pub fn sync(&mut self, wanted: &BTreeMap<u16, Served>, conflicts: &[(u16, ServiceName)]) {
        self.listeners.retain(|port, listener| {
            let keep = wanted.contains_key(port);
            if !keep {
                let served = read(&listener.served);
                info!(service = %served.service, port, "health check closed");
            }
            keep
        });
        // (service, port, message): logged when new, once however many syncs it lasts.
        let mut problems: Vec<(&ServiceName, u16, String)> = Vec::new();
        let mut failed = 0_i64;
        for (port, served) in wanted {
            if let Some(listener) = self.listeners.get(port) {
                let mut current = listener
                    .served
                    .write()
                    .unwrap_or_else(PoisonError::into_inner);
                if *current != *served {
                    debug!(
                        service = %served.service,
                        port,
                        local_endpoints = served.local_endpoints,
                        "health check updated"
                    );
                    *current = served.clone();
                }
                continue;
            }
            match self.open(*port, served) {
                Ok(listener) => {
                    self.listeners.insert(*port, listener);
                }
                Err(error) => {
                    failed += 1;
                    problems.push((&served.service, *port, error.to_string()));
                }
            }
        }
        for (port, service) in conflicts {
            problems.push((
                service,
                *port,
                format!(
                    "Service {service} wants healthCheckNodePort {port}, which another \
                     Service (first by namespace/name) already has: give it a port of its own"
                ),
            ));
        }
        for (service, port, message) in &problems {
            if !self.reported.contains(message) {
                warn!(%service, port, "{message}");
            }
        }
        self.reported = problems
            .into_iter()
            .map(|(_, _, message)| message)
            .collect();

        let gauge = |state: &str| {
            self.metrics.health_check_ports.get_or_create(&StateLabels {
                state: state.to_owned(),
            })
        };
        gauge("serving").set(i64::try_from(self.listeners.len()).unwrap_or(i64::MAX));
        gauge("failed").set(failed);
    }

    fn open(&self, port: u16, served: &Served) -> Result<Listener, HealthCheckError> {
        let (listener, address) = if self.address.is_unspecified() {
            // Both families on one socket; IPv4 alone on a node without IPv6.
            match listen(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port), true) {
                Err(error) if ipv6_unavailable(&error) => {
                    let address = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port);
                    (listen(address, false), address)
                }
                listened => (
                    listened,
                    SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port),
                ),
            }
        } else {
            let address = SocketAddr::new(self.address, port);
            (listen(address, false), address)
        };
        let listener = listener.map_err(|source| HealthCheckError::Bind {
            address,
            service: served.service.clone(),
            source,
        })?;
        info!(
            service = %served.service,
            // The unspecified IPv6 address of a dual-stack socket takes IPv4 too.
            address = %if address.ip() == IpAddr::from(Ipv6Addr::UNSPECIFIED) {
                format!("{address} (IPv4 and IPv6)")
            } else {
                address.to_string()
            },
            local_endpoints = served.local_endpoints,
            "serving health check"
        );

        let served = Arc::new(RwLock::new(served.clone()));
        let router = Router::new().fallback(answer).with_state(Shared {
            served: served.clone(),
            health: self.health.clone(),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let shutdown = async {
                // Resolves when the sender is dropped.
                let _ = stopped.await;
            };
            if let Err(error) = axum::serve(listener, router)
                .with_graceful_shutdown(shutdown)
                .await
            {
                warn!(%address, %error, "health check server stopped");
            }
        });
        Ok(Listener {
            served,
            _stop: stop,
        })
    }
}

/// A listening socket on `address`; `dual_stack`: an IPv6 socket that takes IPv4 too
/// (IPV6_V6ONLY off, whatever `net.ipv6.bindv6only` says).
fn listen(address: SocketAddr, dual_stack: bool) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }?;
    if dual_stack {
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::Ipv6V6Only, &false)?;
    }
    // A restarted agent rebinds while the old one's connections sit in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(BACKLOG)
}

/// The node has no IPv6 (disabled at boot or by sysctl): an IPv6 socket cannot be made or
/// bound.
fn ipv6_unavailable(error: &std::io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL | libc::EPROTONOSUPPORT)
    )
}

fn read(served: &RwLock<Served>) -> Served {
    served
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

#[derive(Clone)]
struct Shared {
    served: Arc<RwLock<Served>>,
    health: Arc<Health>,
}

async fn answer(State(shared): State<Shared>) -> Response {
    let served = read(&shared.served);
    let healthy = shared.health.is_healthy();
    let status = if served.local_endpoints > 0 && healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
            (ENDPOINT_WEIGHT, served.local_endpoints.to_string()),
        ],
        body(&served.service, served.local_endpoints, healthy),
    )
        .into_response()
}

/// kube-proxy's body, byte for byte (tab-indented, no trailing newline), so that anything
/// parsing it, or comparing it, sees no difference.
fn body(service: &ServiceName, local_endpoints: usize, healthy: bool) -> String {
    let quote = |text: &str| serde_json::Value::from(text).to_string();
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\
         \"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": {healthy}\n}}",
        quote(&service.namespace),
        quote(&service.name),
    )
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        net::{Ipv4Addr, TcpStream},
        time::{Duration, Instant},
    };

    use super::*;
    use crate::select::HealthCheck;

    fn name(name: &str) -> ServiceName {
        ServiceName {
            namespace: "default".to_owned(),
            name: name.to_owned(),
        }
    }

    fn served(service: &str, local_endpoints: usize) -> Served {
        Served {
            service: name(service),
            local_endpoints,
        }
    }

    fn selection(service: &str, check: Option<(u16, usize)>) -> ServiceSelection {
        ServiceSelection {
            service: name(service),
            frontends: Vec::new(),
            skipped: Vec::new(),
            health_check: check.map(|(node_port, local_endpoints)| HealthCheck {
                node_port,
                local_endpoints,
            }),
        }
    }

    #[test]
    fn the_body_is_kube_proxys() {
        let text = body(&name("web"), 2, true);
        assert_eq!(
            text,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(json["localEndpoints"], 2);
    }

    #[test]
    fn wanted_ports_come_from_services_with_a_health_check_first_by_name() {
        let selections = [
            selection("b", Some((32000, 1))),
            selection("a", Some((32000, 0))),
            selection("c", Some((32001, 3))),
            selection("d", None),
        ];
        let (ports, conflicts) = desired(&selections);
        assert_eq!(
            ports,
            BTreeMap::from([(32000, served("a", 0)), (32001, served("c", 3))])
        );
        assert_eq!(conflicts, [(32000, name("b"))]);
    }

    /// A free loopback port (bound, then released).
    fn free_port() -> u16 {
        std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    }

    /// Status line and headers+body of a GET, or the connection error.
    async fn get(port: u16) -> std::io::Result<String> {
        get_from(Ipv4Addr::LOCALHOST.into(), port).await
    }

    /// [`get`] to `address`.
    async fn get_from(address: IpAddr, port: u16) -> std::io::Result<String> {
        tokio::task::spawn_blocking(move || {
            let mut stream = TcpStream::connect((address, port))?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            stream.write_all(b"GET /any/path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
            let mut text = String::new();
            stream.read_to_string(&mut text)?;
            Ok(text)
        })
        .await
        .expect("the client thread")
    }

    /// Polls until `check` holds for the answer on `port` (the server runs on its own task).
    async fn wait_for(port: u16, what: &str, check: impl Fn(&std::io::Result<String>) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer = get(port).await;
            if check(&answer) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: got {answer:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every address, both families: one port answers over IPv4 and over IPv6 loopback.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_address_means_both_families() {
        let health = Arc::new(Health::new(Duration::from_secs(3600)));
        let metrics = Arc::new(Metrics::new());
        let mut checks = HealthChecks::new(Ipv4Addr::UNSPECIFIED.into(), health, metrics);
        let port = free_port();
        checks.sync(&BTreeMap::from([(port, served("web", 1))]), &[]);
        assert_eq!(checks.ports().collect::<Vec<_>>(), [port]);
        for address in [
            IpAddr::from(Ipv4Addr::LOCALHOST),
            Ipv6Addr::LOCALHOST.into(),
        ] {
            let answer = get_from(address, port)
                .await
                .unwrap_or_else(|e| panic!("{address}: {e}"));
            assert!(answer.starts_with("HTTP/1.1 200"), "{address}: {answer}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ports_open_update_fail_and_close() {
        let health = Arc::new(Health::new(Duration::from_secs(3600)));
        let metrics = Arc::new(Metrics::new());
        let mut checks = HealthChecks::new(Ipv4Addr::LOCALHOST.into(), health, metrics.clone());
        let (web, busy) = (free_port(), free_port());
        let occupant = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, busy)).expect("occupy");

        // One port taken by someone else: logged, the other still served.
        let wanted = BTreeMap::from([(web, served("web", 1)), (busy, served("busy", 1))]);
        checks.sync(&wanted, &[]);
        assert_eq!(checks.ports().collect::<Vec<_>>(), [web]);
        assert!(
            metrics
                .encode()
                .contains("socklb_health_check_ports{state=\"failed\"} 1"),
            "{}",
            metrics.encode()
        );
        let answer = get(web).await.expect("served");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        for header in [
            "content-type: application/json",
            "x-content-type-options: nosniff",
            "x-load-balancing-endpoint-weight: 1",
        ] {
            assert!(answer.to_lowercase().contains(header), "{header}: {answer}");
        }
        assert!(
            answer.ends_with("\"serviceProxyHealthy\": true\n}"),
            "{answer}"
        );

        // The count drops to zero: 503 on the same listener; the freed port is retried.
        drop(occupant);
        let wanted = BTreeMap::from([(web, served("web", 0)), (busy, served("busy", 1))]);
        checks.sync(&wanted, &[]);
        let answer = get(web).await.expect("served");
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("\"localEndpoints\": 0"), "{answer}");
        let mut both = vec![web, busy];
        both.sort_unstable();
        assert_eq!(checks.ports().collect::<Vec<_>>(), both);
        let answer = get(busy).await.expect("served after the retry");
        assert!(answer.contains("\"name\": \"busy\""), "{answer}");

        // No longer wanted: closed.
        checks.sync(&BTreeMap::from([(busy, served("busy", 1))]), &[]);
        wait_for(web, "port closed", Result::is_err).await;
        assert!(get(busy).await.is_ok());
        assert!(
            metrics
                .encode()
                .contains("socklb_health_check_ports{state=\"serving\"} 1"),
            "{}",
            metrics.encode()
        );
    }
}
