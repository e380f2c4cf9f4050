//! socklb's agent: keeps the eBPF socket load balancer's maps in line with the cluster.
pub mod cli;
pub mod dataplane;
pub mod select;
pub mod source;
pub mod state;
pub mod static_frontends;
