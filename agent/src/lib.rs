//! socklb's agent: keeps the eBPF socket load balancer's maps in line with the cluster.
//!
//! Data flows one way: `source` (events) -> `state` (caches, change tracking) -> `select`
//! (pure, per node) -> `frontends` (the desired datapath) -> `dataplane` (the maps), driven
//! by `runner`; `server` and `metrics` report on it, `health_check` answers load balancers'
//! healthCheckNodePorts, `explain` shows it.
pub mod cli;
pub mod dataplane;
pub mod explain;
pub mod frontends;
pub mod health_check;
pub mod inspect;
pub mod metrics;
pub mod runner;
pub mod select;
pub mod server;
pub mod source;
pub mod state;
pub mod sweep;

#[cfg(test)]
mod fuzz;
