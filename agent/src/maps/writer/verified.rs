//! What a verification of the maps reports, and where the next one goes on from.
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

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("reading the service or backend map back failed")]
    Read(#[source] io::Error),
    #[error("writing a drifted entry back failed")]
    Write(#[source] StoreError),
}
