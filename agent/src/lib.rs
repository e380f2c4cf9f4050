//! socklb's agent: keeps the eBPF socket load balancer's maps in line with the cluster.
pub mod cli;
pub mod dataplane;
pub mod select;
pub mod static_frontends;
