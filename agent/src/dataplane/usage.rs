//! What the datapath reports: how full the maps the agent fills are, and the kernel
//! programs' counters, for metrics and `socklb inspect`.
use socklb_abi::{Counters, map_names};

use super::{Dataplane, error::DataplaneError};
use crate::maps::MapUsage;

impl Dataplane {
    /// Entries in use, capacity now and the capacity they may grow to, of the maps the
    /// agent fills, for metrics.
    pub fn usage(&self) -> [MapUsage; 8] {
        let bounds = &self.config.capacities;
        let usage = |map, entries, capacity, max_entries| MapUsage {
            map,
            entries,
            capacity,
            max_entries,
        };
        let entries = self.writer.entries();
        [
            usage(
                map_names::SERVICES,
                entries.v4.service_entries,
                self.sizes.services,
                bounds.service_entries,
            ),
            usage(
                map_names::BACKENDS,
                entries.v4.backends,
                self.sizes.backends,
                bounds.backends,
            ),
            usage(
                map_names::SERVICES6,
                entries.v6.service_entries,
                self.sizes.services6,
                bounds.service_entries,
            ),
            usage(
                map_names::BACKENDS6,
                entries.v6.backends,
                self.sizes.backends6,
                bounds.backends,
            ),
            usage(
                map_names::SOURCE_RANGES,
                self.source_ranges.entries().0,
                bounds.source_ranges,
                bounds.source_ranges,
            ),
            usage(
                map_names::SOURCE_RANGES6,
                self.source_ranges.entries().1,
                bounds.source_ranges,
                bounds.source_ranges,
            ),
            usage(
                map_names::MAGLEV,
                self.maglev.entries(),
                self.sizes.maglev,
                bounds.maglev_entries,
            ),
            // Not a capacity the kernel enforces: the programs stop creating records there.
            usage(
                map_names::SOCKET_RECORDS,
                self.socket_records(),
                bounds.socket_records,
                bounds.socket_records,
            ),
        ]
    }

    /// How many sockets hold a record now (0 if the count cannot be read).
    fn socket_records(&self) -> u32 {
        self.socket_records
            .get(&0, 0)
            .map(|count| u32::try_from(count.live.max(0)).unwrap_or(u32::MAX))
            .unwrap_or(0)
    }

    /// The kernel programs' counters, summed over CPUs.
    pub fn counters(&self) -> Result<Counters, DataplaneError> {
        let per_cpu = self
            .counters
            .get(&0, 0)
            .map_err(DataplaneError::map(map_names::COUNTERS))?;
        Ok(Counters::sum(per_cpu.iter()))
    }
}
