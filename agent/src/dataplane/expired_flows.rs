//! The sweep of the conntrack tables' expired entries (`maps::conntrack`), over the pinned
//! tables of both families. Each sweep opens them afresh: a relayout may have replaced
//! them since the last one.
use std::{path::Path, time::Duration};

use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData},
};
use socklb_abi::{CtEntry, CtKey, CtTimeouts, NodeConfig, map_names};

use super::error::DataplaneError;
use crate::{
    kernel::{host, pins},
    maps::conntrack::{self, Expiry},
};

/// What a sweep removed, and when the next one is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowSweep {
    pub removed: usize,
    /// The shortest timeout the programs apply, within [`SWEEP_INTERVALS`]: an entry is
    /// removed at most about that long after it expired.
    pub next_in: Duration,
}

/// The bounds of the time between two sweeps.
pub const SWEEP_INTERVALS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// Removes the expired entries of every conntrack table, by the timeouts the programs
/// apply (the node map's).
pub fn sweep_expired_flows(pin_dir: &Path) -> Result<FlowSweep, DataplaneError> {
    let node: Array<MapData, NodeConfig> = open(pin_dir, map_names::NODE, Map::Array)?
        .try_into()
        .map_err(DataplaneError::map(map_names::NODE))?;
    let config = node
        .get(&0, 0)
        .map_err(DataplaneError::map(map_names::NODE))?;
    let timeouts = CtTimeouts::of(Some(&config));
    let expiry = Expiry {
        timeouts,
        now_s: host::monotonic_seconds(),
    };
    let mut removed = 0;
    for (name, confirmed) in [
        (map_names::CONNTRACK, true),
        (map_names::CONNTRACK_NEW, false),
    ] {
        removed += sweep_table::<u32>(pin_dir, name, confirmed, expiry)?;
    }
    for (name, confirmed) in [
        (map_names::CONNTRACK6, true),
        (map_names::CONNTRACK_NEW6, false),
    ] {
        removed += sweep_table::<socklb_abi::Ipv6Words>(pin_dir, name, confirmed, expiry)?;
    }
    let shortest = [
        timeouts.syn_s,
        timeouts.established_s,
        timeouts.closing_s,
        timeouts.udp_s,
    ]
    .into_iter()
    .min()
    .unwrap_or(0);
    let (min, max) = SWEEP_INTERVALS;
    Ok(FlowSweep {
        removed,
        next_in: Duration::from_secs(u64::from(shortest)).clamp(min, max),
    })
}

fn sweep_table<A>(
    pin_dir: &Path,
    name: &'static str,
    confirmed: bool,
    expiry: Expiry,
) -> Result<usize, DataplaneError>
where
    CtKey<A>: Pod + Default,
    CtEntry<A>: Pod + Default,
{
    let mut table: HashMap<MapData, CtKey<A>, CtEntry<A>> = open(pin_dir, name, Map::HashMap)?
        .try_into()
        .map_err(DataplaneError::map(name))?;
    conntrack::remove_expired(&mut table, confirmed, expiry).map_err(DataplaneError::map(name))
}

fn open(
    pin_dir: &Path,
    name: &'static str,
    kind: fn(MapData) -> Map,
) -> Result<Map, DataplaneError> {
    MapData::from_pin(pins::map_pin(pin_dir, name))
        .map(kind)
        .map_err(DataplaneError::map(name))
}
