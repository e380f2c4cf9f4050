//! The pinned maps the agent writes, one module per map (or per pair of family twins): how
//! their keys and values are encoded, what the agent mirrors of them, and the writers that
//! keep them in line with `desired` in a lookup-safe order.
//!
//! - `writer`: the service and backend maps' diff writer, over a [`writer::Store`];
//!   `services` is that store for the kernel's maps (the codecs of both families).
//! - `frontend_filter`: which destinations may be frontends, marked by `services` before
//!   each master entry, for the TC programs to skip the service map's lookup.
//! - `conntrack`: the expired entries of the programs' conntrack tables, swept.
//! - `maglev`, `source_ranges`, `names`: the Maglev tables, the loadBalancerSourceRanges
//!   tries, and the Services' names (for display only).
//!
//! Nothing here loads or attaches anything: the maps come in as aya handles (`kernel`
//! loads them; `dataplane` hands them over), so a map's writer is tested without a kernel.
use std::collections::BTreeMap;

use aya::maps::MapError;

use crate::desired::Frontend;

mod batch;
pub mod conntrack;
pub mod frontend_filter;
pub mod maglev;
pub mod mirror;
pub mod names;
pub mod services;
pub mod slots;
pub mod source_ranges;
pub mod writer;

/// How full a map the agent fills is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapUsage {
    pub map: &'static str,
    pub entries: u32,
    /// Its `max_entries` now.
    pub capacity: u32,
    /// What it may grow to: its `--max-*` flag.
    pub max_entries: u32,
}

/// Deleting what is already gone (e.g. removed by hand with bpftool) is not an error.
fn ignore_missing(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// The frontends of `held` that `named` does not name: what a full apply removes.
fn not_named<V>(held: &BTreeMap<Frontend, V>, named: impl Fn(&Frontend) -> bool) -> Vec<Frontend> {
    held.keys().filter(|f| !named(f)).copied().collect()
}
