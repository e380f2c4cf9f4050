//! What the side-by-side benchmarks (`bench compare`, `bench nodeport`, `bench pod`) share:
//! the peers, the services and the kube-proxy rules written for them, the network namespaces
//! they run in, the servers and the timed client, and the interleaved measurement rounds.
//!
//! Each benchmark is a thin binary over these modules: it builds its world, programs the
//! peers and reports; the method (one client process for every peer, the cells in a new
//! random order every round) is written once, here. `section` is where every benchmark
//! writes its results in docs/benchmarks.md.
pub mod baseline;
pub mod cgroup;
pub mod client;
pub mod cluster;
pub mod cpu;
pub mod flags;
pub mod kube_proxy;
pub mod loader;
pub mod measure;
pub mod netns;
pub mod node;
pub mod node_flags;
pub mod peer;
pub mod pinned_maps;
pub mod preflight;
pub mod section;
pub mod server;
pub mod trace_session;

use crate::privileges::{ContainerPrivileges, chart_agent};

/// What every benchmark runs the agent with: a default `helm install`'s privileges, as on a
/// real node. Its CAP_SYS_ADMIN (for closeSocketsInPods) spares the programs the verifier's
/// Spectre hardening; the tests run the agent with the minimal set instead, to prove that
/// the programs pass the hardening.
pub fn agent_privileges() -> &'static ContainerPrivileges {
    chart_agent()
}
