//! Growing the maps the agent fills while the programs run (`desired::sizing` says when and
//! how far). It lives here, where the kernel and the maps meet: it loads the programs again
//! (`kernel::load`), copies the maps' entries, and swaps the programs into the links
//! (`kernel::attach`).
//!
//! The agent, the maps' only writer, writes nothing until the swap is done, so old and new
//! programs read the same entries; the steps: docs/operations.md, "Growing maps".
use std::{fs, path::Path};

use aya::{
    Ebpf, Pod,
    maps::{Array, HashMap, MapData, MapError},
};
use socklb_abi::{FrontendName, MaglevKey, map_names};
use tracing::{error, info, warn};

use super::Dataplane;
use crate::{
    desired::sizing::{self, Sizes},
    kernel::{
        attach::{
            cgroup,
            tc::{self, TcAttachError},
        },
        load::{self, LoadError, take_map},
        mapped_words::{MappedWords, MappedWordsError},
        pins,
    },
    maps::{
        frontend_filter::FrontendFilter,
        services::{KernelMaps, RawMaps},
        writer::{Capacity, Demand, Room},
    },
};

/// The maps of a new load the agent writes: services and backends, Maglev, names.
type Grown = (
    KernelMaps,
    HashMap<MapData, MaglevKey, u32>,
    HashMap<MapData, u32, FrontendName>,
);

/// How long after a failed growth the next is tried: each try loads every program again.
const GROWTH_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum GrowError {
    #[error(transparent)]
    Load(#[from] Box<LoadError>),
    #[error("cannot use the larger map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("cannot copy the entries of {name} into the larger map")]
    Copy {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error(transparent)]
    FrontendFilter(#[from] MappedWordsError),
    #[error("cannot swap the programs into the attached links")]
    SwapCgroup(#[source] Box<LoadError>),
    #[error("cannot swap the programs into the attached TC links")]
    SwapTc(#[source] Box<TcAttachError>),
}

impl Dataplane {
    /// Grows the maps that an apply needing `demand` (and `maglev_demand` Maglev entries)
    /// would fill beyond three quarters, within their flags. A failed growth is logged and
    /// leaves the maps as they were: the writer then refuses what does not fit, as at a flag.
    pub(super) fn make_room(&mut self, demand: Demand, maglev_demand: u32) {
        let bounds = self.config.capacities;
        let current = self.sizes;
        let grown = |current: u32, demand: u32, bound: u32| {
            sizing::grown(current, demand, bound).unwrap_or(current)
        };
        let (v4, v6) = (demand.maps.v4, demand.maps.v6);
        let target = Sizes {
            services: grown(current.services, v4.service_entries, bounds.service_entries),
            backends: grown(current.backends, v4.backends, bounds.backends),
            services6: grown(
                current.services6,
                v6.service_entries,
                bounds.service_entries,
            ),
            backends6: grown(current.backends6, v6.backends, bounds.backends),
            // Bounded as the service map: every frontend holds a service entry.
            names: grown(current.names, demand.frontends, bounds.service_entries),
            maglev: grown(current.maglev, maglev_demand, bounds.maglev_entries),
        };
        let retry_later = self
            .growth_retry_at
            .is_some_and(|at| std::time::Instant::now() < at);
        if target == current || retry_later {
            return;
        }
        self.growth_retry_at = None;
        let loaded = self.programs_loaded;
        match self.grow(target) {
            Ok(swapped) if loaded => info!(
                from = ?current,
                to = ?target,
                links_swapped = swapped,
                "maps grown: the programs now run over the larger maps"
            ),
            Ok(_) => info!(
                from = ?current,
                to = ?target,
                "maps grown to fit the first lists, before the programs are loaded"
            ),
            Err(error) => {
                warn!(
                    error = %crate::error_chain(&error),
                    from = ?current,
                    to = ?target,
                    retry_in = ?GROWTH_RETRY,
                    "growing the maps failed; they keep serving at their size, and what does \
                     not fit is refused until a later sync grows them"
                );
                self.growth_retry_at = Some(std::time::Instant::now() + GROWTH_RETRY);
            }
        }
    }

    /// Loads the programs over maps of `target` sizes, copies the entries and swaps the
    /// programs in. Returns how many links now run the new programs. Programs not loaded
    /// yet (a fresh node before its first sync) stay so, over the new maps.
    fn grow(&mut self, target: Sizes) -> Result<usize, GrowError> {
        let pin_dir = self.config.pin_dir.clone();
        let now = self.sizes;
        let grown: Vec<&'static str> = [
            (map_names::SERVICES, target.services != now.services),
            (map_names::SLOTS, target.slot_pairs() != now.slot_pairs()),
            (map_names::SERVICES6, target.services6 != now.services6),
            (map_names::BACKENDS, target.backends != now.backends),
            (map_names::BACKENDS6, target.backends6 != now.backends6),
            (map_names::MAGLEV, target.maglev != now.maglev),
            (map_names::NAMES, target.names != now.names),
        ]
        .into_iter()
        .filter_map(|(name, grows)| grows.then_some(name))
        .collect();
        let mut ebpf = load::load_grown(
            &pin_dir,
            &self.config.capacities,
            self.config.program_settings(),
            &self.object,
            &target,
            &grown,
            self.programs_loaded,
        )
        .map_err(Box::new)?;
        let (kernel_maps, maglev, names) = match self.copy_into(&mut ebpf, &grown) {
            Ok(maps) => maps,
            Err(error) => {
                load::remove_staging(&pin_dir);
                return Err(error);
            }
        };
        // Programs never loaded run nowhere: no link to swap.
        let swapped = if self.programs_loaded {
            swap(&mut ebpf, &pin_dir)
        } else {
            Ok(0)
        };
        let swapped = match swapped {
            Ok(swapped) => swapped,
            Err(failure) => {
                // Links already swapped go back to the programs over the old maps, which
                // the agent keeps writing (if they were loaded: else none was attached).
                if self.programs_loaded
                    && let Err(error) = swap(&mut self.ebpf, &pin_dir)
                {
                    error!(
                        error = %crate::error_chain(&error),
                        "cannot put the programs over the old maps back after a failed \
                         growth: some links may read maps no longer written; restart the agent"
                    );
                }
                load::remove_staging(&pin_dir);
                return Err(failure);
            }
        };

        // From here on the new maps are the ones: the links read them.
        drop(self.writer.replace_store(kernel_maps));
        drop(self.maglev.replace_map(maglev));
        drop(self.names.replace_map(names));
        self.ebpf = ebpf;
        self.sizes = target;
        self.writer.set_capacity(capacity(&target));
        for name in &grown {
            let staged = pins::staged_map_pin(&pin_dir, name);
            let pinned = pins::map_pin(&pin_dir, name);
            if let Err(error) = fs::rename(&staged, &pinned) {
                warn!(
                    map = name,
                    %error,
                    "cannot move the larger map's pin: a restarted agent adopts the old map \
                     and rewrites it before it attaches"
                );
            }
        }
        load::remove_staging(&pin_dir);
        Ok(swapped)
    }
}

impl Dataplane {
    /// The maps of the new load, the grown ones filled with the entries of the old.
    fn copy_into(&self, ebpf: &mut Ebpf, grown: &[&'static str]) -> Result<Grown, GrowError> {
        let mut take =
            |name| take_map(ebpf, name).map_err(|error| GrowError::Load(Box::new(error)));
        let raw = RawMaps {
            services: take(map_names::SERVICES)?,
            slots: MappedWords::open_array(take(map_names::SLOTS)?, map_names::SLOTS)?,
            backends: take(map_names::BACKENDS)?,
            services6: take(map_names::SERVICES6)?,
            backends6: take(map_names::BACKENDS6)?,
            frontend_filter: FrontendFilter::open(&self.config.pin_dir)?,
        };
        let maglev = take(map_names::MAGLEV)?;
        let mut kernel_maps = KernelMaps::new(raw).map_err(|source| GrowError::Map {
            name: map_names::SERVICES,
            source,
        })?;
        let mut maglev: HashMap<MapData, MaglevKey, u32> =
            maglev.try_into().map_err(|source| GrowError::Map {
                name: map_names::MAGLEV,
                source,
            })?;
        let old = self.writer.store();
        // The ranges go on; the ids are copied where the array is a new one.
        kernel_maps
            .slots
            .take_over(&old.slots, grown.contains(&map_names::SLOTS));
        if grown.contains(&map_names::SERVICES) {
            copy(
                map_names::SERVICES,
                &old.services,
                &mut kernel_maps.services,
            )?;
        }
        if grown.contains(&map_names::SERVICES6) {
            copy(
                map_names::SERVICES6,
                &old.services6,
                &mut kernel_maps.services6,
            )?;
        }
        if grown.contains(&map_names::BACKENDS) {
            copy_array(
                map_names::BACKENDS,
                &old.backends,
                &mut kernel_maps.backends,
            )?;
        }
        if grown.contains(&map_names::BACKENDS6) {
            copy(
                map_names::BACKENDS6,
                &old.backends6,
                &mut kernel_maps.backends6,
            )?;
        }
        if grown.contains(&map_names::MAGLEV) {
            copy(map_names::MAGLEV, self.maglev.map(), &mut maglev)?;
        }
        let mut names: HashMap<MapData, u32, FrontendName> = take(map_names::NAMES)?
            .try_into()
            .map_err(|source| GrowError::Map {
                name: map_names::NAMES,
                source,
            })?;
        if grown.contains(&map_names::NAMES) {
            copy(map_names::NAMES, self.names.map(), &mut names)?;
        }
        Ok((kernel_maps, maglev, names))
    }
}

/// Swaps the programs of `ebpf` into every link attached under `pin_dir`; returns how many.
fn swap(ebpf: &mut Ebpf, pin_dir: &Path) -> Result<usize, GrowError> {
    let local =
        cgroup::replace_attached(ebpf, pin_dir).map_err(|e| GrowError::SwapCgroup(Box::new(e)))?;
    let external =
        tc::replace_attached(ebpf, pin_dir).map_err(|e| GrowError::SwapTc(Box::new(e)))?;
    Ok(local + external)
}

fn copy<K: Pod, V: Pod>(
    name: &'static str,
    from: &HashMap<MapData, K, V>,
    to: &mut HashMap<MapData, K, V>,
) -> Result<(), GrowError> {
    let error = |source| GrowError::Copy { name, source };
    for entry in from.iter() {
        let (key, value) = entry.map_err(error)?;
        to.insert(&key, &value, 0).map_err(error)?;
    }
    Ok(())
}

/// The held entries of the array `from` into the larger `to`, at the same indexes.
fn copy_array<V: Pod + PartialEq + Default>(
    name: &'static str,
    from: &Array<MapData, V>,
    to: &mut Array<MapData, V>,
) -> Result<(), GrowError> {
    let error = |source| GrowError::Copy { name, source };
    for (index, entry) in (0..).zip(from.iter()) {
        let value = entry.map_err(error)?;
        if value != V::default() {
            to.set(index, &value, 0).map_err(error)?;
        }
    }
    Ok(())
}

/// The room of each family's service and backend maps at `sizes`, as the writer counts it.
pub(super) fn capacity(sizes: &Sizes) -> Capacity {
    Capacity {
        v4: Room {
            service_entries: sizes.services,
            backends: sizes.backends,
        },
        v6: Room {
            service_entries: sizes.services6,
            backends: sizes.backends6,
        },
    }
}
