//! socklb's agent: keeps the eBPF socket load balancer's maps in line with the cluster.
//!
//! Data flows one way: `source` -> `state` -> `select` -> `frontends` -> `dataplane`,
//! driven by `runner`; `desired`, `maps` and `kernel` are reached through `dataplane`.
//! docs/architecture.md draws the whole.
// These docs are for socklb's developers (`cargo doc --document-private-items`): a module's
// doc may name its private parts.
#![allow(rustdoc::private_intra_doc_links)]
pub mod cli;
pub mod conntrack_gc;
pub mod dataplane;
mod desired;
pub mod drops;
pub mod explain;
pub mod frontends;
pub mod health_check;
pub mod inspect;
mod kernel;
mod maps;
pub mod metrics;
mod netlink;
mod pod_namespaces;
pub mod runner;
pub mod select;
pub mod server;
mod shutdown;
pub mod source;
pub mod state;
pub mod stdout;
pub mod sweep;
pub mod tc_devices;
pub mod terminal;
pub mod trace;

#[cfg(test)]
mod fuzz;

/// `items` for one log field or message: `a, b, c`.
pub fn listed<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    items
        .into_iter()
        .map(|item| item.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// An error with its causes, for one log line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // Many errors show their source in their own text already.
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    enum Outer {
        /// Shows its source in its own text, as kube's errors do.
        #[error("client error ({0})")]
        Repeats(#[source] std::io::Error),
        #[error("cannot read the manifests")]
        Hides(#[source] std::io::Error),
    }

    #[test]
    fn a_chain_says_each_cause_once() {
        let cause = || std::io::Error::other("connection refused");
        assert_eq!(
            super::error_chain(&Outer::Hides(cause())),
            "cannot read the manifests: connection refused"
        );
        assert_eq!(
            super::error_chain(&Outer::Repeats(cause())),
            "client error (connection refused)"
        );
    }
}
