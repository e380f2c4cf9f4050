//! The conntrack GC's pass over the pinned tables of both families (`maps::conntrack` says
//! why the agent removes expired entries). Each pass opens the tables afresh: a relayout
//! may have replaced them since the last one.
use std::{path::Path, time::Duration};

use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData},
};
use socklb_abi::{CtEntry, CtKey, CtTimeouts, Ipv6Words, NodeConfig, map_names};

use super::error::DataplaneError;
use crate::{
    kernel::{host, pins},
    maps::conntrack::{self, Expiry},
};

/// The shortest time between two passes of the conntrack GC.
pub const GC_INTERVAL_MIN: Duration = Duration::from_secs(1);
/// The longest time between two passes, whatever the timeouts.
pub const GC_INTERVAL_MAX: Duration = Duration::from_secs(60);

/// What a pass removed, and when the next one is due by the timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpiredFlows {
    pub removed: usize,
    /// The shortest timeout the programs apply, within [`GC_INTERVAL_MIN`] and
    /// [`GC_INTERVAL_MAX`]: an entry goes at most about that long after it expired.
    pub next_in: Duration,
}

/// Removes the expired entries of every conntrack table, by the timeouts the programs
/// apply (the node map's). Nothing is removed until this agent wrote its timeouts there
/// (a zero is the default to the programs, but a node map just made for a new layout
/// still serves programs of the agent before, which applied that agent's timeouts).
pub fn remove_expired_flows(pin_dir: &Path) -> Result<ExpiredFlows, DataplaneError> {
    let node: Array<MapData, NodeConfig> = open(pin_dir, map_names::NODE, Map::Array)?
        .try_into()
        .map_err(DataplaneError::map(map_names::NODE))?;
    let config = node
        .get(&0, 0)
        .map_err(DataplaneError::map(map_names::NODE))?;
    let written = [
        config.ct_timeout_syn_s,
        config.ct_timeout_established_s,
        config.ct_timeout_closing_s,
        config.ct_timeout_udp_s,
    ]
    .iter()
    .all(|timeout| *timeout != 0);
    if !written {
        return Ok(ExpiredFlows {
            removed: 0,
            next_in: GC_INTERVAL_MIN,
        });
    }
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
        removed += remove_from::<u32>(pin_dir, name, confirmed, expiry)?;
    }
    for (name, confirmed) in [
        (map_names::CONNTRACK6, true),
        (map_names::CONNTRACK_NEW6, false),
    ] {
        removed += remove_from::<Ipv6Words>(pin_dir, name, confirmed, expiry)?;
    }
    Ok(ExpiredFlows {
        removed,
        next_in: Duration::from_secs(u64::from(timeouts.shortest()))
            .clamp(GC_INTERVAL_MIN, GC_INTERVAL_MAX),
    })
}

fn remove_from<A>(
    pin_dir: &Path,
    name: &'static str,
    confirmed: bool,
    expiry: Expiry,
) -> Result<usize, DataplaneError>
where
    A: Copy + PartialEq,
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
