//! What keeps `socklb inspect` from reading the maps.
use aya::maps::MapError;

use crate::kernel::{attach::tc::TcAttachError, mapped_words::MappedWordsError};

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(
        "cannot open the pinned map {path}: is socklb installed on this node (see `socklb run`), and is --bpffs right?"
    )]
    Open {
        path: String,
        #[source]
        source: MapError,
    },
    #[error("cannot read the map {map}")]
    Read {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("cannot list the devices the TC programs serve")]
    Devices {
        #[source]
        source: Box<TcAttachError>,
    },
    #[error("cannot read the flow filter")]
    FlowFilter {
        #[source]
        source: Box<MappedWordsError>,
    },
    #[error("cannot read the frontend filter")]
    FrontendFilter {
        #[source]
        source: Box<MappedWordsError>,
    },
    #[error("cannot read the slot array")]
    Slots {
        #[source]
        source: Box<MappedWordsError>,
    },
}

impl InspectError {
    /// The error of reading map `map`, for `map_err`.
    pub(super) fn reading(map: &'static str) -> impl Fn(MapError) -> Self {
        move |source| Self::Read { map, source }
    }
}
