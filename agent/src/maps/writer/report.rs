//! What an apply reports: the frontends it could not program as desired and what became of
//! them, read by the runner's logs and metrics.
use std::net::IpAddr;

use crate::desired::{Frontend, Gone};

/// Entries of one family's service and backend maps (as in `max_entries`): the room they
/// have, or what an apply needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Room {
    pub service_entries: u32,
    pub backends: u32,
}

/// Each family's [`Room`]. The IPv6 maps are sized apart from the IPv4 ones, so that a
/// node serving one family does not pay for the other's maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub v4: Room,
    pub v6: Room,
}

impl Capacity {
    /// The same room for both families.
    pub const fn both(room: Room) -> Self {
        Self { v4: room, v6: room }
    }

    /// The room of the family of `address`.
    pub fn of(&self, address: IpAddr) -> Room {
        if address.is_ipv6() { self.v6 } else { self.v4 }
    }
}

/// What an apply needs: each family's entries, and the frontends it names (one name each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    pub maps: Capacity,
    pub frontends: u32,
}

/// A frontend that was not programmed as desired.
#[derive(Debug, thiserror::Error)]
pub enum Rejected {
    #[error(
        "frontend {frontend} needs {needed} more entries in map {map} but only {free} of its \
         {capacity} are free: raise {flag} ({outcome})"
    )]
    MapFull {
        frontend: Frontend,
        map: &'static str,
        flag: &'static str,
        capacity: u32,
        free: u32,
        needed: u32,
        outcome: Outcome,
    },
    #[error(
        "frontend {frontend} has {count} endpoints, more than the {max} a frontend holds: \
         its change is refused whole, {outcome}; split the Service"
    )]
    TooManyBackends {
        frontend: Frontend,
        count: usize,
        max: u16,
        outcome: Outcome,
    },
}

impl Rejected {
    pub fn frontend(&self) -> Frontend {
        match self {
            Self::MapFull { frontend, .. } | Self::TooManyBackends { frontend, .. } => *frontend,
        }
    }

    pub fn outcome(&self) -> Outcome {
        match self {
            Self::MapFull { outcome, .. } | Self::TooManyBackends { outcome, .. } => *outcome,
        }
    }

    pub(super) fn with_outcome(mut self, new: Outcome) -> Self {
        match &mut self {
            Self::MapFull { outcome, .. } | Self::TooManyBackends { outcome, .. } => {
                *outcome = new;
            }
        }
        self
    }
}

/// What became of a frontend that could not be programmed as desired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    KeptPrevious,
    /// A new frontend got a master entry without backends.
    Refused,
    /// Not even a master entry fitted: its traffic is not translated.
    NotProgrammed,
}

impl Outcome {
    pub const ALL: [Self; 3] = [Self::KeptPrevious, Self::Refused, Self::NotProgrammed];

    /// Its name in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::KeptPrevious => "kept_previous",
            Self::Refused => "refused",
            Self::NotProgrammed => "not_programmed",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::KeptPrevious => "the frontend keeps its previous state",
            Self::Refused => "connections to it are refused until it fits",
            Self::NotProgrammed => {
                "it does not fit even without backends, so nothing of it is programmed: its \
                 traffic is not translated"
            }
        })
    }
}

/// What an `apply` did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Map writes issued.
    pub writes: usize,
    /// Frontends left unchanged because their change could not be applied.
    pub rejected: Vec<Rejected>,
    /// Backends that left their frontend (filled by the dataplane, which compares what the
    /// writer programmed before and after).
    pub gone: Vec<Gone>,
}
