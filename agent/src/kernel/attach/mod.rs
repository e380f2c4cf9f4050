//! Attaching the loaded programs: the cgroup programs (`cgroup`) and the TC programs
//! (`tc`), each through a pinned link where the kernel has one.
//!
//! A new agent swaps its programs into the pinned links atomically (`link_update`), so
//! translation never stops across a restart, an upgrade or a growth.
pub mod cgroup;
mod link_update;
pub mod tc;

/// What `attach` did for each program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attachment {
    /// A new link was created and pinned.
    Attached,
    /// The program of an existing pinned link was replaced in place.
    Replaced,
}
