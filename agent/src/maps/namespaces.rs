//! The pods' network namespaces whose sockets the socket hooks translate besides the
//! host's (`socklb_lbns_v1`, `--socket-lb-scope pods`): a set of cookies, brought in line
//! with what the agent found. A namespace added before the pod's first connect() is
//! translated at the socket; one added later was served per packet meanwhile.
use std::collections::BTreeSet;

use aya::maps::{HashMap, MapData, MapError};

use super::ignore_missing;

pub struct NamespacesWriter {
    map: HashMap<MapData, u64, u8>,
    /// What the map holds.
    written: BTreeSet<u64>,
}

impl NamespacesWriter {
    /// Takes the map as a previous agent left it.
    pub fn adopt(map: HashMap<MapData, u64, u8>) -> Result<Self, MapError> {
        let written = map.keys().collect::<Result<_, _>>()?;
        Ok(Self { map, written })
    }

    /// Makes the map hold `wanted`: new namespaces first, then the gone ones out. Returns
    /// how many were added and removed.
    pub fn set(&mut self, wanted: &BTreeSet<u64>) -> Result<(usize, usize), MapError> {
        let added: Vec<u64> = wanted.difference(&self.written).copied().collect();
        let removed: Vec<u64> = self.written.difference(wanted).copied().collect();
        for cookie in &added {
            self.map.insert(cookie, &1, 0)?;
            self.written.insert(*cookie);
        }
        for cookie in &removed {
            ignore_missing(self.map.remove(cookie))?;
            self.written.remove(cookie);
        }
        Ok((added.len(), removed.len()))
    }
}
