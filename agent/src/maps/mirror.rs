//! A small map the agent keeps equal to what it found, entry by entry: the pods' network
//! namespaces the socket hooks translate besides the host's (`socklb_lbns_v1`, `--socket-lb-scope
//! pods`, cookie -> 1), and the served pod devices (`socklb_podif_v1`, interface index ->
//! `POD_DEVICE_*` flags). A namespace added before the pod's first connect() is translated at
//! the socket; one added later was served per packet meanwhile.
use std::collections::BTreeMap;

use aya::{
    Pod,
    maps::{HashMap, MapData, MapError},
};

use super::ignore_missing;

pub struct MirrorWriter<K, V> {
    map: HashMap<MapData, K, V>,
    /// What the map holds.
    written: BTreeMap<K, V>,
}

impl<K: Pod + Ord, V: Pod + PartialEq> MirrorWriter<K, V> {
    /// Takes the map as a previous agent left it.
    pub fn adopt(map: HashMap<MapData, K, V>) -> Result<Self, MapError> {
        let written = map.iter().collect::<Result<_, _>>()?;
        Ok(Self { map, written })
    }

    /// Makes the map hold `wanted`: new and changed entries first, then the gone ones out.
    /// Returns how many were written and removed.
    pub fn set(&mut self, wanted: &BTreeMap<K, V>) -> Result<(usize, usize), MapError> {
        let written: Vec<(K, V)> = wanted
            .iter()
            .filter(|(key, value)| self.written.get(key) != Some(value))
            .map(|(key, value)| (*key, *value))
            .collect();
        let removed: Vec<K> = self
            .written
            .keys()
            .filter(|key| !wanted.contains_key(key))
            .copied()
            .collect();
        for (key, value) in &written {
            self.map.insert(key, value, 0)?;
            self.written.insert(*key, *value);
        }
        for key in &removed {
            ignore_missing(self.map.remove(key))?;
            self.written.remove(key);
        }
        Ok((written.len(), removed.len()))
    }
}
