//! The session-affinity entries (sessionAffinity ClientIP), each with the backend its
//! client is sent to, if its slot still holds it.
use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use serde::Serialize;
use socklb_abi::{AFFINITY_EXTERNAL_CLIENT, AffinityEntry, AffinityKey, AffinityKey6, map_names};

use super::{
    error::InspectError,
    frontends::{FrontendState, SlotIds},
    pinned::{entries_of, ipv6, open, open6},
};
use crate::{
    desired::{BackendAddr, Scope},
    kernel::host,
};

#[derive(Debug, Serialize)]
pub struct AffinityState {
    /// The client: its network namespace (local sockets), or `client` below.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netns_cookie: Option<u64>,
    /// A client outside the node, by address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<IpAddr>,
    pub service_id: u32,
    pub backend_id: u32,
    pub slot: u16,
    /// The backend in that slot of the frontend (internal for a local client, external for
    /// one from outside); absent if the slot no longer holds it (the entry is then unused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendAddr>,
    /// Since the client last connected through it (the Service's timeout ends it).
    pub idle_seconds: u32,
    /// Idle past the Service's timeout: the client's next connection chooses afresh (the
    /// LRU map drops the entry when it needs the room).
    pub expired: bool,
}

impl AffinityState {
    /// An entry as the map holds it, its backend not yet looked up in its frontend.
    fn unresolved(
        netns_cookie: Option<u64>,
        client: Option<IpAddr>,
        service_id: u32,
        entry: &AffinityEntry,
    ) -> Self {
        Self {
            netns_cookie,
            client,
            service_id,
            backend_id: entry.backend_id,
            slot: entry.slot,
            backend: None,
            idle_seconds: idle_seconds(entry.last_used_ns),
            expired: false,
        }
    }
}

/// Both families' entries, each resolved against `frontends` (only those of `only`'s
/// frontends, if given).
pub fn read(
    pin_dir: &Path,
    frontends: &[FrontendState],
    slot_ids: &SlotIds,
    only: Option<IpAddr>,
) -> Result<Vec<AffinityState>, InspectError> {
    let mut affinity: Vec<AffinityState> = entries_of(
        Some(open(pin_dir, map_names::AFFINITY)?),
        map_names::AFFINITY,
        |key: AffinityKey, entry: AffinityEntry| {
            // An outside client's IPv4 address is held where a socket's cookie would be.
            let external = key.netns_cookie & AFFINITY_EXTERNAL_CLIENT != 0;
            let client = Ipv4Addr::from(u32::from_be(
                (key.netns_cookie & u64::from(u32::MAX)) as u32,
            ));
            Some(if external {
                AffinityState::unresolved(None, Some(client.into()), key.service_id, &entry)
            } else {
                AffinityState::unresolved(Some(key.netns_cookie), None, key.service_id, &entry)
            })
        },
    )?;
    // IPv6 clients from outside (local sockets of either family share the map above).
    affinity.extend(entries_of(
        open6(pin_dir, map_names::AFFINITY6)?,
        map_names::AFFINITY6,
        |key: AffinityKey6, entry: AffinityEntry| {
            Some(AffinityState::unresolved(
                None,
                Some(ipv6(key.client)),
                key.service_id,
                &entry,
            ))
        },
    )?);
    // The backend each entry sends its client to: its slot's, if the slot still holds the
    // entry's backend (as the programs check); under `--address`, only the entries of that
    // address's frontends.
    affinity.retain_mut(|state| {
        // A client known by its address is one from outside (external frontends) or a pod
        // the per-packet path serves (internal ones): the scope whose slot holds the
        // entry's backend is the one it was made for.
        let scopes: &[Scope] = if state.netns_cookie.is_some() {
            &[Scope::Internal]
        } else {
            &[Scope::External, Scope::Internal]
        };
        let holds = |scope: Scope| {
            slot_ids.get(&(state.service_id, scope, state.slot)) == Some(&state.backend_id)
        };
        let frontend_of = |scope: Scope| {
            frontends
                .iter()
                .find(|f| f.service_id == state.service_id && f.frontend.scope == scope)
        };
        let found = scopes
            .iter()
            .find_map(|scope| {
                frontend_of(*scope)
                    .filter(|_| holds(*scope))
                    .map(|f| (f, true))
            })
            .or_else(|| {
                scopes
                    .iter()
                    .find_map(|scope| frontend_of(*scope).map(|f| (f, false)))
            });
        let Some((frontend, held)) = found else {
            return only.is_none();
        };
        state.expired = frontend
            .affinity_timeout_seconds
            .is_some_and(|timeout| state.idle_seconds > timeout);
        if held {
            state.backend = frontend
                .backends
                .get(usize::from(state.slot).wrapping_sub(1))
                .copied()
                .flatten();
        }
        true
    });
    Ok(affinity)
}

/// Seconds since `last_used_ns` (the programs' `bpf_ktime_get_ns`, CLOCK_MONOTONIC).
fn idle_seconds(last_used_ns: u64) -> u32 {
    let last_used = u32::try_from(last_used_ns / 1_000_000_000).unwrap_or(u32::MAX);
    host::monotonic_seconds().saturating_sub(last_used)
}
