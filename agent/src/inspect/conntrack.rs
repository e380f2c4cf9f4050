//! The flows the TC programs translate per packet (from outside, and from pod devices):
//! both directions of each, in the main and the unconfirmed tables, and the fragments
//! awaiting their first fragment's ports.
use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use serde::Serialize;
use socklb_abi::{
    CT_FLAG_CLOSING, CT_FLAG_DIRECT, CT_FLAG_SEEN_REPLY, CT_FLAG_SNAT, CT_FORWARD, CtEntry,
    CtEntry6, CtKey, CtKey6, FragmentKey, FragmentKey6, FragmentPorts, map_names,
};

use super::{
    error::InspectError,
    pinned::{entries_of, open, open6, socket, socket6},
};
use crate::{desired::Protocol, kernel::host};

/// One direction of a flow from outside the node: the packet as it arrives and what it is
/// rewritten to.
#[derive(Debug, Serialize)]
pub struct ConntrackState {
    pub protocol: Option<Protocol>,
    /// "forward" (client to frontend) or "reply" (backend to client).
    pub direction: &'static str,
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub rewritten_from: SocketAddr,
    pub rewritten_to: SocketAddr,
    pub service_id: u32,
    pub backend_id: u32,
    pub snat: bool,
    /// A pod's flow to a local backend delivered past the node's routing and netfilter
    /// (`--pod-delivery direct`).
    pub direct: bool,
    pub closing: bool,
    /// In the main table: a TCP flow past its handshake, a UDP flow answered and continued.
    /// Unconfirmed flows (a SYN flood's) live in a table of their own.
    pub confirmed: bool,
    /// Unconfirmed: the backend answered.
    pub seen_reply: bool,
    /// Seconds since the last packet in this direction.
    pub idle_seconds: u32,
}

/// Both families' entries, both tables, sorted (only those with an address `only`, if
/// given).
pub fn read(pin_dir: &Path, only: Option<IpAddr>) -> Result<Vec<ConntrackState>, InspectError> {
    let now = host::monotonic_seconds();
    let mut conntrack = Vec::new();
    for (name, confirmed) in [
        (map_names::CONNTRACK, true),
        (map_names::CONNTRACK_NEW, false),
    ] {
        let map: BpfHashMap<MapData, CtKey, CtEntry> = open(pin_dir, name)?
            .try_into()
            .map_err(InspectError::reading(name))?;
        conntrack.extend(
            map.iter()
                .filter_map(Result::ok)
                .map(|(key, entry)| conntrack_state(&key, &entry, confirmed, now)),
        );
    }
    for (name, confirmed) in [
        (map_names::CONNTRACK6, true),
        (map_names::CONNTRACK_NEW6, false),
    ] {
        conntrack.extend(entries_of(
            open6(pin_dir, name)?,
            name,
            |key: CtKey6, entry: CtEntry6| Some(conntrack_state6(&key, &entry, confirmed, now)),
        )?);
    }
    conntrack.retain(|state| {
        only.is_none_or(|only| {
            [
                state.from,
                state.to,
                state.rewritten_from,
                state.rewritten_to,
            ]
            .iter()
            .any(|a| a.ip() == only)
        })
    });
    conntrack.sort_by_key(|c| (c.from, c.to, c.direction));
    Ok(conntrack)
}

/// Datagrams whose first fragment's ports are remembered for their later fragments.
pub fn fragments(pin_dir: &Path) -> Result<usize, InspectError> {
    let fragments_map: BpfHashMap<MapData, FragmentKey, FragmentPorts> =
        open(pin_dir, map_names::FRAGMENTS)?
            .try_into()
            .map_err(InspectError::reading(map_names::FRAGMENTS))?;
    Ok(fragments_map.keys().filter_map(Result::ok).count()
        + entries_of(
            open6(pin_dir, map_names::FRAGMENTS6)?,
            map_names::FRAGMENTS6,
            |_: FragmentKey6, _: FragmentPorts| Some(()),
        )?
        .len())
}

fn conntrack_state6(key: &CtKey6, entry: &CtEntry6, confirmed: bool, now: u32) -> ConntrackState {
    // The IPv4 view of the same flow, with the addresses swapped for the IPv6 ones.
    let v4 = conntrack_state(
        &CtKey {
            source_port: key.source_port,
            destination_port: key.destination_port,
            protocol: key.protocol,
            direction: key.direction,
            ..CtKey::default()
        },
        &CtEntry {
            source_port: entry.source_port,
            destination_port: entry.destination_port,
            backend_id: entry.backend_id,
            service_id: entry.service_id,
            last_seen_s: entry.last_seen_s,
            flags: entry.flags,
            ..CtEntry::default()
        },
        confirmed,
        now,
    );
    ConntrackState {
        from: socket6(key.source, key.source_port),
        to: socket6(key.destination, key.destination_port),
        rewritten_from: socket6(entry.source, entry.source_port),
        rewritten_to: socket6(entry.destination, entry.destination_port),
        ..v4
    }
}

fn conntrack_state(key: &CtKey, entry: &CtEntry, confirmed: bool, now: u32) -> ConntrackState {
    ConntrackState {
        protocol: Protocol::from_number(key.protocol),
        direction: if key.direction == CT_FORWARD {
            "forward"
        } else {
            "reply"
        },
        from: socket(key.source, key.source_port),
        to: socket(key.destination, key.destination_port),
        rewritten_from: socket(entry.source, entry.source_port),
        rewritten_to: socket(entry.destination, entry.destination_port),
        service_id: entry.service_id,
        backend_id: entry.backend_id,
        snat: entry.flags & CT_FLAG_SNAT != 0,
        direct: entry.flags & CT_FLAG_DIRECT != 0,
        closing: entry.flags & CT_FLAG_CLOSING != 0,
        confirmed,
        seen_reply: entry.flags & CT_FLAG_SEEN_REPLY != 0,
        idle_seconds: now.saturating_sub(entry.last_seen_s),
    }
}
