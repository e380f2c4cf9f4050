//! How large the maps are: their capacities (the `--max-*` flags), and the sizes the
//! growable ones have now. Pure.
//!
//! The service, backend and Maglev maps start small and grow, so that a small node pays
//! for a small map; the LRU tables and the socket ring keep the size their flag sets
//! (docs/operations.md, "Growing maps" says when and why).

/// Map capacities (`max_entries`). The service, backend and Maglev maps start smaller and
/// grow up to theirs (`grown`); the others have theirs from the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacities {
    /// Service map entries: one per frontend plus one per backend slot (an upper bound).
    pub service_entries: u32,
    /// Distinct backends (address, port, protocol) (an upper bound).
    pub backends: u32,
    /// Sockets whose peer is shown as the frontend: connect()ed sockets (a ring of this
    /// size rounded up to a power of two) and unconnected UDP sockets' (socket, backend)
    /// pairs (LRU).
    pub reverse: u32,
    /// Session-affinity entries (LRU).
    pub affinity: u32,
    /// Conntrack entries for traffic from outside and of the per-packet path, two per flow
    /// (LRU): confirmed flows.
    pub conntrack: u32,
    /// Conntrack entries of flows from outside not yet confirmed (LRU): what a SYN flood
    /// fills, apart from the confirmed flows.
    pub conntrack_new: u32,
    /// loadBalancerSourceRanges entries: one per range plus one per restricted frontend.
    pub source_ranges: u32,
    /// Maglev table entries: the table size for each Maglev frontend (an upper bound).
    pub maglev_entries: u32,
    /// Sockets that may hold a record at once (what each was translated for, so that the
    /// sweep closes it when its backend leaves). Records are charged to the agent's memory
    /// cgroup and any pod creates them; past the bound, sockets are still translated.
    pub socket_records: u32,
}

impl Capacities {
    /// Slots of the socket ring: `reverse` rounded up to a power of two, so that the
    /// programs index it with a mask.
    pub fn socket_slots(&self) -> u32 {
        self.reverse
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(1 << 31)
    }
}

/// Sized for a small node (`faults/map_memory.rs`; docs/operations.md, "Map memory", has
/// the cost of each). The service, backend and Maglev maps are not preallocated (nor is the
/// source-range trie) and start small (`INITIAL`): their capacities are bounds a
/// large cluster reaches by growth alone (20,000 Services of 10 endpoints need about
/// 220,000 service entries). The LRU maps and the socket ring are preallocated to their
/// capacity, which a busy node raises with the flags.
impl Default for Capacities {
    fn default() -> Self {
        Self {
            // 100,000 Services of 10 endpoints: 1.1 million entries, a million backends.
            service_entries: 4_194_304,
            backends: 2_097_152,
            reverse: 16_384,
            affinity: 8_192,
            conntrack: 32_768,
            conntrack_new: 8_192,
            source_ranges: 16_384,
            maglev_entries: 1_048_576,
            socket_records: 65_536,
        }
    }
}

/// The sizes (`max_entries`) the growable maps have now. Each family's service and backend
/// maps grow with that family's frontends, so a node serving one family keeps the other's
/// small; the names map grows with the frontends of both, one name each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub services: u32,
    pub backends: u32,
    pub services6: u32,
    pub backends6: u32,
    pub names: u32,
    pub maglev: u32,
}

/// Service entries a frontend counts for at least: its master entry and one slot, even
/// with no backend. The service maps hold the masters alone, so a map of half its family's
/// service entries holds every frontend those entries admit (at 100,000 Services of 10
/// endpoints, a bucket array of 16 MiB where one per entry took 32 MiB).
pub const MIN_FRONTEND_ENTRIES: u32 = 2;

impl std::fmt::Display for Sizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "services {}, backends {}, services6 {}, backends6 {}, names {}, maglev {}",
            self.services, self.backends, self.services6, self.backends6, self.names, self.maglev
        )
    }
}

impl Sizes {
    /// The `max_entries` of a service map (master entries only) for `service_entries`.
    pub fn service_map(service_entries: u32) -> u32 {
        service_entries.div_ceil(MIN_FRONTEND_ENTRIES).max(1)
    }

    /// The service entries a service map of `masters` entries was made for, under the
    /// flag's `bound` (the inverse of [`Self::service_map`]: the entries are a power of
    /// two from [`INITIAL`] on, so even, or the bound).
    pub fn service_entries_of_map(masters: u32, bound: u32) -> u32 {
        if masters == Self::service_map(bound) {
            bound
        } else {
            masters.saturating_mul(MIN_FRONTEND_ENTRIES)
        }
    }

    /// The slot array's entries, two slots each ([`socklb_abi::SlotPair`]): two slots per
    /// service entry of both families, as each frontend's slots take a power of two (at most
    /// twice its count) and a moving frontend holds its old range until the next apply.
    /// Grows with them. Counted from the service maps' sizes, which their pins keep exactly
    /// (the entries read back from a map made under another, odd flag may be one more).
    pub fn slot_pairs(&self) -> u32 {
        let pairs = |entries| Self::service_map(entries).saturating_mul(MIN_FRONTEND_ENTRIES);
        pairs(self.services).saturating_add(pairs(self.services6))
    }
}

/// Sizes a new map starts with, before its flag caps them: room for about 500 Services of a
/// few endpoints in each family, and for one Maglev table of the default size.
pub const INITIAL: Sizes = Sizes {
    services: 8_192,
    backends: 4_096,
    services6: 8_192,
    backends6: 4_096,
    names: 8_192,
    maglev: 16_384,
};

/// The size a map of `current` entries should grow to before it holds `demand`, capped by
/// `bound`; `None` if it has room enough (at most three quarters full) or is at its bound.
/// It at least doubles, so that a node growing step by step swaps its programs seldom.
pub fn grown(current: u32, demand: u32, bound: u32) -> Option<u32> {
    let fits = u64::from(demand) * 4 <= u64::from(current) * 3;
    if fits || current >= bound {
        return None;
    }
    let wanted = (u64::from(demand) * 4).div_ceil(3).next_power_of_two();
    let size = wanted.max(u64::from(current) * 2).min(u64::from(bound));
    u32::try_from(size).ok()
}

#[cfg(test)]
mod tests {
    use super::{Capacities, MIN_FRONTEND_ENTRIES, Sizes, grown};

    #[test]
    fn the_socket_ring_is_the_reverse_capacity_rounded_up_to_a_power_of_two() {
        // (--max-reverse-entries, ring slots)
        let rows = [
            (0, 1),
            (1, 1),
            (3, 4),
            (16_384, 16_384),
            (262_145, 524_288),
            (u32::MAX, 1 << 31),
        ];
        for (reverse, slots) in rows {
            let capacities = Capacities {
                reverse,
                ..Capacities::default()
            };
            assert_eq!(capacities.socket_slots(), slots, "reverse = {reverse}");
        }
    }

    #[test]
    fn table() {
        // (current size, demand, bound, grown to)
        let rows = [
            // three quarters full: room enough
            (8_192, 6_144, 1 << 20, None),
            // beyond three quarters: doubles
            (8_192, 6_145, 1 << 20, Some(16_384)),
            // a large jump: straight to the power of two that keeps a quarter free
            (8_192, 60_000, 1 << 20, Some(131_072)),
            // capped by the flag, which need not be a power of two
            (8_192, 60_000, 100_000, Some(100_000)),
            // at the flag: no growth (the writer refuses what does not fit)
            (100_000, 99_000, 100_000, None),
            // a map adopted larger than needed never shrinks
            (1 << 20, 10, 1 << 20, None),
            // a tiny flag
            (4, 5, 12, Some(8)),
            (8, 7, 12, Some(12)),
            (0, 1, 4, Some(2)),
        ];
        for (current, demand, bound, expected) in rows {
            assert_eq!(
                grown(current, demand, bound),
                expected,
                "current {current} demand {demand} bound {bound}"
            );
        }
    }

    #[test]
    fn a_service_map_s_size_gives_back_the_service_entries_it_was_made_for() {
        // Sizes start at INITIAL and double, or are the flag's bound, which may be odd.
        for bound in [1, 2, 5, 12, 8_193, 100_001, 4_194_304] {
            let sizes = [8_192u32, 16_384, 1 << 21]
                .into_iter()
                .filter(|size| *size < bound)
                .chain([bound]);
            for entries in sizes {
                let masters = Sizes::service_map(entries);
                assert!(masters * MIN_FRONTEND_ENTRIES >= entries, "{entries}");
                assert_eq!(
                    Sizes::service_entries_of_map(masters, bound),
                    entries,
                    "{entries} under {bound}"
                );
            }
        }
    }

    #[test]
    fn after_growing_the_demand_fits() {
        for current in [1, 3, 8_192, 65_536] {
            for demand in [1, 5, 6_145, 60_000, 1_000_000] {
                if let Some(size) = grown(current, demand, u32::MAX) {
                    assert!(
                        u64::from(demand) * 4 <= u64::from(size) * 3,
                        "{current} {demand}"
                    );
                    assert!(size >= current * 2, "{current} {demand}");
                }
            }
        }
    }
}
