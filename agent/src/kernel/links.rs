//! Pinned bpf links, of the cgroup and the TC programs alike: pinning a new one, and
//! opening one a previous agent left to swap a new program into it.
use std::path::{Path, PathBuf};

use aya::{
    pin::PinError,
    programs::links::{FdLink, LinkError, PinnedLink},
};

#[derive(Debug, thiserror::Error)]
pub enum PinnedLinkError {
    #[error("cannot {action} the pinned link {path}")]
    Link {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: LinkError,
    },
    #[error("cannot pin the link {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: PinError,
    },
}

/// Pins `link` at `pin`: the program stays attached after this process exits.
pub fn pin<L>(link: L, pin: &Path) -> Result<(), PinnedLinkError>
where
    FdLink: TryFrom<L, Error = LinkError>,
{
    let fd_link = FdLink::try_from(link).map_err(|source| PinnedLinkError::Link {
        action: "pin",
        path: pin.to_owned(),
        source,
    })?;
    fd_link.pin(pin).map_err(|source| PinnedLinkError::Pin {
        path: pin.to_owned(),
        source,
    })?;
    Ok(())
}

/// The link pinned at `pin`, which must be an `L`; `not_l` says what it is otherwise
/// ("reuse (not a TCX link)").
pub fn open<L>(pin: &Path, not_l: &'static str) -> Result<L, PinnedLinkError>
where
    L: TryFrom<FdLink, Error = LinkError>,
{
    let link_error = |action, source| PinnedLinkError::Link {
        action,
        path: pin.to_owned(),
        source,
    };
    let pinned = PinnedLink::from_pin(pin).map_err(|e| link_error("open", e))?;
    L::try_from(FdLink::from(pinned)).map_err(|e| link_error(not_l, e))
}
