//! What a verification of the maps (and the walk for entries the writer did not write)
//! reports, and where the next one goes on from.
use std::io;

use super::store::StoreError;
use crate::desired::Frontend;

/// Where the verification goes on from: backends first, so that a slot written back
/// finds its backend, as in an apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// Backends from this id on are next.
    Backends(u32),
    /// The frontends after this one (from the first: `None`) are next.
    Frontends(Option<Frontend>),
}

impl Cursor {
    pub const START: Self = Self::Backends(1);
}

/// What one call read and restored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Entries read back.
    pub read: usize,
    /// Entries written back because they differed from what this agent wrote.
    pub restored: usize,
    /// This call finished a pass over every entry.
    pub pass_done: bool,
}

/// What one step of the walk for entries the writer did not write read
/// ([`Writer::find_extras`](super::Writer::find_extras)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// Entries read.
    pub read: usize,
    /// Entries the mirror did not account for: deleted by the next apply.
    pub found: usize,
    /// This step read the last map through: the next goes on from the first.
    pub pass_done: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("reading the service or backend map back failed")]
    Read(#[source] io::Error),
    #[error("writing a drifted entry back failed")]
    Write(#[source] StoreError),
}
