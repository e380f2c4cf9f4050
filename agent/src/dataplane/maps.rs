//! Typed access to the pinned service and backend maps: the kernel-side [`Store`] of the
//! writer, and reading them back for adoption and inspection.
use aya::maps::{HashMap, Map, MapData, MapError};
use socklb_abi::{Backend, ServiceEntry, ServiceKey};

use super::writer::{MapContents, Op, Store, StoreError};

pub struct KernelMaps {
    pub(super) services: HashMap<MapData, ServiceKey, ServiceEntry>,
    pub(super) backends: HashMap<MapData, u32, Backend>,
}

impl KernelMaps {
    pub fn new(services: Map, backends: Map) -> Result<Self, MapError> {
        Ok(Self {
            services: services.try_into()?,
            backends: backends.try_into()?,
        })
    }

    /// Reads both maps. Entries that vanish during the walk are skipped.
    pub fn read(&self) -> Result<MapContents, MapError> {
        let services = self.services.iter().collect::<Result<Vec<_>, _>>()?;
        let backends = self.backends.iter().collect::<Result<Vec<_>, _>>()?;
        Ok(MapContents { services, backends })
    }
}

impl Store for KernelMaps {
    fn write(&mut self, op: &Op) -> Result<(), StoreError> {
        let result = match op {
            Op::PutBackend { id, backend } => self.backends.insert(id, backend, 0),
            Op::PutService { key, entry } => self.services.insert(key, entry, 0),
            Op::DeleteService { key } => ignore_missing(self.services.remove(key)),
            Op::DeleteBackend { id } => ignore_missing(self.backends.remove(id)),
        };
        result.map_err(|error| StoreError {
            op: op.clone(),
            source: match error {
                MapError::SyscallError(syscall) => syscall.io_error,
                other => std::io::Error::other(other.to_string()),
            },
        })
    }
}

/// Deleting what is already gone (e.g. removed by hand with bpftool) is not an error.
pub(super) fn ignore_missing(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}
