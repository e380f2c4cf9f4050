//! What stops the file source from reading its directory.
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FileSourceError {
    #[error("cannot read the manifests directory {path}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch the manifests directory {path}")]
    Watch {
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
}
