//! Temporary driver until the control plane lands: the desired datapath read from a JSON
//! file, a list of frontends with their backends:
//!
//! ```json
//! [{"address": "10.96.0.10", "port": 80, "protocol": "TCP",
//!   "backends": [{"address": "10.0.0.5", "port": 8080}],
//!   "affinity_timeout_seconds": 10800}]
//! ```
use std::{
    fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::dataplane::{Desired, Frontend, FrontendSpec};

#[derive(Debug, Serialize, Deserialize)]
pub struct Entry {
    #[serde(flatten)]
    pub frontend: Frontend,
    #[serde(flatten)]
    pub spec: FrontendSpec,
}

#[derive(Debug, thiserror::Error)]
pub enum StaticError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid frontend list")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: frontend {frontend} is listed twice")]
    Duplicate { path: PathBuf, frontend: Frontend },
}

pub fn read(path: &Path) -> Result<Desired, StaticError> {
    let text = fs::read_to_string(path).map_err(|source| StaticError::Read {
        path: path.to_owned(),
        source,
    })?;
    let entries: Vec<Entry> = serde_json::from_str(&text).map_err(|source| StaticError::Parse {
        path: path.to_owned(),
        source,
    })?;
    let mut desired = Desired::default();
    for Entry { frontend, spec } in entries {
        if desired.frontends.insert(frontend, spec).is_some() {
            return Err(StaticError::Duplicate {
                path: path.to_owned(),
                frontend,
            });
        }
    }
    Ok(desired)
}

/// Writes `desired` in the format [`read`] takes.
pub fn to_json(desired: &Desired) -> String {
    let entries: Vec<Entry> = desired
        .frontends
        .iter()
        .map(|(frontend, spec)| Entry {
            frontend: *frontend,
            spec: spec.clone(),
        })
        .collect();
    serde_json::to_string_pretty(&entries).unwrap_or_default()
}
