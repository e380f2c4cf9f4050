//! HTTP endpoints: `/healthz` and `/livez` with kube-proxy's meaning (unhealthy when a
//! queued change has waited longer than twice the sync period), `/readyz` (the first full
//! sync is done, and every frontend found room in the maps) and `/metrics`.
use std::{
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use socklb_abi::Counters;
use tracing::info;

use crate::metrics::Metrics;

/// Sync progress as the health endpoints report it. Times are nanoseconds since `start`
/// (0 = never), so that they fit atomics.
pub struct Health {
    start: Instant,
    timeout: Duration,
    last_queued: AtomicU64,
    last_updated: AtomicU64,
    ready: AtomicBool,
    /// Frontends not programmed because the maps are full at their bounds.
    short_of_room: AtomicU64,
    /// Socket programs detached behind the agent's back.
    detached: AtomicBool,
}

impl Health {
    pub fn new(sync_period: Duration) -> Self {
        Self {
            start: Instant::now(),
            timeout: sync_period * 2,
            last_queued: AtomicU64::new(0),
            last_updated: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            short_of_room: AtomicU64::new(0),
            detached: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// A change arrived that a sync has to program.
    pub fn queued(&self) {
        // Only the oldest unprogrammed change matters.
        let _ =
            self.last_queued
                .compare_exchange(0, self.now(), Ordering::Relaxed, Ordering::Relaxed);
    }

    /// A sync programmed everything queued so far.
    pub fn updated(&self) {
        self.last_updated.store(self.now(), Ordering::Relaxed);
        self.last_queued.store(0, Ordering::Relaxed);
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// How many frontends the last sync left out for lack of room in the maps.
    pub fn set_short_of_room(&self, frontends: usize) {
        self.short_of_room
            .store(frontends as u64, Ordering::Relaxed);
    }

    /// Whether socket programs were found detached behind the agent's back.
    pub fn set_detached(&self, detached: bool) {
        self.detached.store(detached, Ordering::Relaxed);
    }

    pub fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Relaxed)
    }

    /// kube-proxy's rule: healthy unless a queued change waits longer than the timeout; and
    /// not with programs detached, which a restart (the liveness probe's) attaches again.
    pub fn is_healthy(&self) -> bool {
        let queued = self.last_queued.load(Ordering::Relaxed);
        let fresh = queued == 0 || Duration::from_nanos(self.now() - queued) <= self.timeout;
        fresh && !self.is_detached()
    }

    /// Unix time of the last sync, if any.
    fn last_updated_unix(&self) -> Option<f64> {
        let updated = self.last_updated.load(Ordering::Relaxed);
        (updated != 0).then(|| {
            let ago = Duration::from_nanos(self.now().saturating_sub(updated));
            SystemTime::now()
                .checked_sub(ago)
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0.0, |d| d.as_secs_f64())
        })
    }
}

/// The health server's (`--healthz-bind-address`, every address by default, for the
/// kubelet's probes): health only, as kube-proxy's.
pub fn health_router(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health)
}

/// The metrics server's (`--metrics-bind-address`, loopback by default): what the node
/// serves is read there only, where the operator chose to expose it. As kube-proxy's, it
/// also answers `/healthz` (the process serves) and `/proxyMode`, which tools such as the
/// Kubernetes e2e suite read to tell the dataplane.
pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok" }))
        .route("/proxyMode", get(|| async { "socklb" }))
        .with_state(metrics)
}

/// The kernel programs' counters, summed over CPUs, from the pinned map (under `pin_dir`),
/// read at every scrape so that the metrics are current.
pub fn read_counters(pin_dir: &Path) -> Option<Counters> {
    let pin = crate::kernel::pins::map_pin(pin_dir, socklb_abi::map_names::COUNTERS);
    let map = aya::maps::Map::PerCpuArray(aya::maps::MapData::from_pin(pin).ok()?);
    let counters: aya::maps::PerCpuArray<_, Counters> = map.try_into().ok()?;
    let per_cpu = counters.get(&0, 0).ok()?;
    Some(Counters::sum(per_cpu.iter()))
}

/// Binds a health or metrics address at start, so that a port another process holds (often
/// kube-proxy's 10256 and 10249 during a migration) stops the agent before it loads
/// anything, with the flag to change, instead of failing when it exits.
pub fn bind(address: SocketAddr, flag: &str) -> std::io::Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(address)
        .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot listen on {address} ({e}): another process may hold the port \
                     (kube-proxy uses 10256 and 10249); choose another with {flag}"
                ),
            )
        })?;
    Ok(listener)
}

/// Serves `router` (`what` it serves, for the log) on `listener` until `shutdown`
/// completes.
pub async fn serve(
    listener: std::net::TcpListener,
    (what, router): (&'static str, Router),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    // Said once the agent's start got this far, not at the bind.
    info!(address = %listener.local_addr()?, "serving {what}");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn healthz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    let body = serde_json::json!({
        "lastUpdated": health.last_updated_unix(),
        "currentTime": SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
    });
    let status = if health.is_healthy() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body.to_string())
}

/// Not ready until the first full sync, nor while Services are left out for lack of room:
/// a node that cannot serve its cluster must not pass for one that does (a rollout of new
/// bounds stops there).
async fn readyz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    let short = health.short_of_room.load(Ordering::Relaxed);
    if !health.is_ready() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first full sync".to_owned(),
        )
    } else if health.is_detached() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "socket programs are detached: their link pins were removed (restart the agent to \
             attach them again)"
                .to_owned(),
        )
    } else if short > 0 {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{short} frontends are not programmed: the maps are full at their bounds (the \
                 agent's log names the flag to raise)"
            ),
        )
    } else {
        (StatusCode::OK, "ok".to_owned())
    }
}

async fn metrics_text(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_only_when_a_queued_change_waits_too_long() {
        let patient = Health::new(Duration::from_secs(3600));
        assert!(patient.is_healthy(), "nothing queued");
        patient.queued();
        assert!(patient.is_healthy(), "queued well within the timeout");

        let impatient = Health::new(Duration::ZERO);
        impatient.queued();
        std::thread::sleep(Duration::from_millis(2));
        assert!(!impatient.is_healthy(), "queued longer than the timeout");
        impatient.updated();
        assert!(impatient.is_healthy(), "programmed");
    }
}
