//! A map that is a set the agent keeps in line with what it found (the value is always 1):
//! the pods' network namespaces the socket hooks translate besides the host's
//! (`socklb_lbns_v1`, `--socket-lb-scope pods`, by cookie), and the pod devices that are
//! veths (`socklb_peerdev_v1`, by interface index). A namespace added before the pod's
//! first connect() is translated at the socket; one added later was served per packet
//! meanwhile.
use std::collections::BTreeSet;

use aya::{
    Pod,
    maps::{HashMap, MapData, MapError},
};

use super::ignore_missing;

pub struct KeySetWriter<K> {
    map: HashMap<MapData, K, u8>,
    /// What the map holds.
    written: BTreeSet<K>,
}

impl<K: Pod + Ord> KeySetWriter<K> {
    /// Takes the map as a previous agent left it.
    pub fn adopt(map: HashMap<MapData, K, u8>) -> Result<Self, MapError> {
        let written = map.keys().collect::<Result<_, _>>()?;
        Ok(Self { map, written })
    }

    /// Makes the map hold `wanted`: new keys first, then the gone ones out. Returns how
    /// many were added and removed.
    pub fn set(&mut self, wanted: &BTreeSet<K>) -> Result<(usize, usize), MapError> {
        let added: Vec<K> = wanted.difference(&self.written).copied().collect();
        let removed: Vec<K> = self.written.difference(wanted).copied().collect();
        for key in &added {
            self.map.insert(key, &1, 0)?;
            self.written.insert(*key);
        }
        for key in &removed {
            ignore_missing(self.map.remove(key))?;
            self.written.remove(key);
        }
        Ok((added.len(), removed.len()))
    }
}
