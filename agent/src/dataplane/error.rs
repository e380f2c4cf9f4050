//! What can go wrong loading, attaching or writing the datapath, and the privilege the
//! kernel wanted when it refused.
use aya::maps::MapError;

use crate::{
    kernel::{
        attach::tc::TcAttachError,
        host::HostError,
        load::LoadError,
        mapped_words::MappedWordsError,
        privileges::{self, PrivilegeError},
        program_logs::ProgramLogsError,
    },
    maps::{
        maglev::MaglevError,
        names::NamesError,
        source_ranges::SourceRangeError,
        writer::{StoreError, VerifyError},
    },
};

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot use map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("writing the maps failed; the agent re-read them and retries at the next sync")]
    Write(#[source] StoreError),
    #[error("verifying the maps failed; the agent re-read them and retries at the next sync")]
    Verify(#[source] VerifyError),
    #[error(transparent)]
    Tc(Box<TcAttachError>),
    #[error(
        "writing the source ranges failed; the agent re-read them and retries at the next sync"
    )]
    SourceRanges(#[source] SourceRangeError),
    #[error("writing a Maglev table failed; the agent re-read them and retries at the next sync")]
    Maglev(#[source] MaglevError),
    #[error("writing a frontend's name failed; the agent re-reads them at the next full sync")]
    Names(#[source] NamesError),
    #[error(transparent)]
    ProgramLogs(#[from] ProgramLogsError),
    /// The flow filter or the frontend filter.
    #[error(transparent)]
    Filter(#[from] MappedWordsError),
    /// The kernel refused for lack of a privilege: what to grant, then what was refused.
    #[error("{diagnosis}")]
    Privileges {
        diagnosis: PrivilegeError,
        #[source]
        refused: Box<DataplaneError>,
    },
}

impl DataplaneError {
    /// An error of map `name`, for `map_err`.
    pub(super) fn map(name: &'static str) -> impl Fn(MapError) -> Self + Copy {
        move |source| Self::Map { name, source }
    }

    /// Puts the missing privilege first when that is why the kernel refused.
    pub(super) fn explain_refusal(self) -> Self {
        match privileges::diagnose(&self) {
            Some(diagnosis) => Self::Privileges {
                diagnosis,
                refused: Box::new(self),
            },
            None => self,
        }
    }
}
