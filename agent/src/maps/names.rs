//! The names map: which Service (namespace, name, port, kind) each programmed frontend
//! belongs to, by service id, so that `socklb inspect` and bpftool can say it while the
//! agent is down. The programs never read it; a stale or missing name only affects display.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    hash::BuildHasher as _,
    os::fd::AsFd as _,
};

use aya::{
    maps::{HashMap as BpfHashMap, IterableMap, MapData, MapError},
    sys::SyscallError,
};
use socklb_abi::{
    FRONTEND_KIND_CLUSTER_IP, FRONTEND_KIND_EXTERNAL_IP, FRONTEND_KIND_LOAD_BALANCER,
    FRONTEND_KIND_NODE_PORT, FrontendName,
};
use tracing::debug;

use super::{batch, ignore_missing};
use crate::desired::Frontend;

/// Which Service a frontend belongs to, as the control plane knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendLabel {
    pub namespace: String,
    pub name: String,
    pub port: String,
    /// "cluster-ip", "node-port", "external-ip" or "load-balancer".
    pub kind: &'static str,
}

impl FrontendLabel {
    fn encode(&self) -> FrontendName {
        let mut encoded = FrontendName {
            kind: match self.kind {
                "cluster-ip" => FRONTEND_KIND_CLUSTER_IP,
                "node-port" => FRONTEND_KIND_NODE_PORT,
                "external-ip" => FRONTEND_KIND_EXTERNAL_IP,
                "load-balancer" => FRONTEND_KIND_LOAD_BALANCER,
                _ => 0,
            },
            ..FrontendName::default()
        };
        copy(&mut encoded.namespace, &self.namespace);
        copy(&mut encoded.name, &self.name);
        copy(&mut encoded.port, &self.port);
        encoded
    }

    /// The label a names-map value holds; `None` if it is not one the agent wrote.
    pub fn decode(value: &FrontendName) -> Option<Self> {
        Some(Self {
            namespace: text(&value.namespace)?,
            name: text(&value.name)?,
            port: text(&value.port)?,
            kind: match value.kind {
                FRONTEND_KIND_CLUSTER_IP => "cluster-ip",
                FRONTEND_KIND_NODE_PORT => "node-port",
                FRONTEND_KIND_EXTERNAL_IP => "external-ip",
                FRONTEND_KIND_LOAD_BALANCER => "load-balancer",
                _ => return None,
            },
        })
    }
}

/// Kubernetes names fit (namespace and Service names are at most 63 bytes, port names 15),
/// so truncation never happens for valid objects; it is only a guard.
fn copy(field: &mut [u8], text: &str) {
    let bytes = text.as_bytes();
    let len = bytes.len().min(field.len());
    field[..len].copy_from_slice(&bytes[..len]);
}

fn text(field: &[u8]) -> Option<String> {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8(field[..end].to_vec()).ok()
}

#[derive(Debug, thiserror::Error)]
#[error("writing the name of service id {service_id} to socklb_names_v1 failed")]
pub struct NamesError {
    service_id: u32,
    #[source]
    source: MapError,
}

/// Owns the names map.
pub struct NamesWriter {
    map: BpfHashMap<MapData, u32, FrontendName>,
    /// What the map holds for each frontend this writer named: the service id and a hash of
    /// the name (152 bytes each, 15 MB at 100,000 Services, only to skip rewriting it).
    held: BTreeMap<Frontend, (u32, u64)>,
    hasher: hashbrown::DefaultHashBuilder,
    /// Entries read from the map, not yet matched to a frontend.
    adopted: HashMap<u32, FrontendName>,
}

impl NamesWriter {
    pub fn adopt(map: BpfHashMap<MapData, u32, FrontendName>) -> Result<Self, MapError> {
        let adopted = super::batch::entries(&map)?.into_iter().collect();
        Ok(Self {
            map,
            held: BTreeMap::new(),
            hasher: hashbrown::DefaultHashBuilder::default(),
            adopted,
        })
    }

    pub fn map(&self) -> &BpfHashMap<MapData, u32, FrontendName> {
        &self.map
    }

    /// Writes go to `map` from now on; it must hold what the old one held.
    pub fn replace_map(
        &mut self,
        map: BpfHashMap<MapData, u32, FrontendName>,
    ) -> BpfHashMap<MapData, u32, FrontendName> {
        std::mem::replace(&mut self.map, map)
    }

    pub fn readopt(&mut self) -> Result<(), MapError> {
        self.held.clear();
        self.adopted = super::batch::entries(&self.map)?.into_iter().collect();
        Ok(())
    }

    /// Names the given frontends (`None`: gone); `id_of` gives a frontend's service id as
    /// programmed now. With `full`, `labels` are every frontend: the names of others are
    /// removed. The labels are made one at a time: a map of them all took 15 MB at 100,000
    /// Services, at the first sync's peak.
    pub fn apply(
        &mut self,
        labels: impl IntoIterator<Item = (Frontend, Option<FrontendLabel>)>,
        id_of: impl Fn(&Frontend) -> Option<u32>,
        full: bool,
    ) -> Result<(), NamesError> {
        // What a full apply does not name is left here.
        let (mut ids, mut names) = (Vec::new(), Vec::new());
        let mut not_given = if full {
            std::mem::take(&mut self.held)
        } else {
            BTreeMap::new()
        };
        for (frontend, label) in labels {
            let wanted = label
                .as_ref()
                .and_then(|label| Some((id_of(&frontend)?, label.encode())));
            let held = if full {
                not_given.remove(&frontend)
            } else {
                self.held.remove(&frontend)
            };
            let old = held.or_else(|| {
                let (id, _) = wanted.as_ref()?;
                let value = self.adopted.remove(id)?;
                Some((*id, self.hasher.hash_one(value)))
            });
            if let Some((old_id, _)) = old
                && wanted.as_ref().is_none_or(|(id, _)| *id != old_id)
            {
                self.remove(old_id)?;
            }
            if let Some((id, value)) = wanted {
                let hash = self.hasher.hash_one(value);
                if old != Some((id, hash)) {
                    ids.push(id);
                    names.push(value);
                }
                self.held.insert(frontend, (id, hash));
            }
        }
        // Written after the removals: an id removed above may name another frontend now.
        self.put(&ids, &names)?;
        if full {
            // An id a frontend gone held may name another one now.
            let named: HashSet<u32> = self.held.values().map(|(id, _)| *id).collect();
            let not_given = not_given.into_values().map(|(id, _)| id);
            let adopted = std::mem::take(&mut self.adopted).into_keys();
            for id in not_given.chain(adopted) {
                if !named.contains(&id) {
                    self.remove(id)?;
                }
            }
        }
        Ok(())
    }

    /// Writes `names[i]` under `ids[i]`, in one system call per chunk the kernel takes: one
    /// call per name made 100,000 Services' names take 0.3 s.
    fn put(&mut self, ids: &[u32], names: &[FrontendName]) -> Result<(), NamesError> {
        let error = match batch::update(IterableMap::map(&self.map).fd().as_fd(), ids, names) {
            Ok(()) => return Ok(()),
            Err(error) if error.unsupported() => error,
            Err(error) => {
                return Err(NamesError {
                    service_id: ids.get(error.done).copied().unwrap_or_default(),
                    source: MapError::SyscallError(SyscallError {
                        call: "bpf_map_update_batch",
                        io_error: error.error,
                    }),
                });
            }
        };
        debug!(error = %error.error, "no batch updates: names written one by one");
        for (id, name) in ids.iter().zip(names) {
            self.map.insert(id, name, 0).map_err(|source| NamesError {
                service_id: *id,
                source,
            })?;
        }
        Ok(())
    }

    fn remove(&mut self, service_id: u32) -> Result<(), NamesError> {
        ignore_missing(self.map.remove(&service_id))
            .map_err(|source| NamesError { service_id, source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_survive_the_round_trip_through_the_map_value() {
        let label = FrontendLabel {
            namespace: "kube-system".to_owned(),
            name: "kube-dns".to_owned(),
            port: "dns-tcp".to_owned(),
            kind: "cluster-ip",
        };
        assert_eq!(FrontendLabel::decode(&label.encode()), Some(label));
        assert_eq!(FrontendLabel::decode(&FrontendName::default()), None);
    }
}
