//! `socklb inspect`: what the pinned maps hold, read directly from bpffs, so it works while
//! the agent is down: frontends with their backends per scope, session-affinity entries, and
//! the kernel programs' counters.
use std::{fmt::Write as _, net::Ipv4Addr, path::Path};

use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray};
use serde::Serialize;
use socklb_abi::{
    AffinityEntry, AffinityKey, Counters, SERVICE_FLAG_AFFINITY, ServiceEntry, ServiceKey,
    map_names,
};

use crate::dataplane::{BackendAddr, Frontend, Protocol, Scope};

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(
        "cannot open the pinned map {path}: is socklb installed on this node (see `socklb run`), and is --bpffs right?"
    )]
    Open {
        path: String,
        #[source]
        source: MapError,
    },
    #[error("cannot read the map {map}")]
    Read {
        map: &'static str,
        #[source]
        source: MapError,
    },
}

/// One frontend as the maps hold it.
#[derive(Debug, Serialize)]
pub struct FrontendState {
    pub frontend: Frontend,
    pub service_id: u32,
    pub affinity_timeout_seconds: Option<u32>,
    /// Backends by slot (1..=count); a missing slot would show as `null`.
    pub backends: Vec<Option<BackendAddr>>,
}

#[derive(Debug, Serialize)]
pub struct AffinityState {
    pub netns_cookie: u64,
    pub service_id: u32,
    pub backend_id: u32,
    pub slot: u16,
}

#[derive(Debug, Serialize)]
pub struct Inspection {
    pub frontends: Vec<FrontendState>,
    pub affinity: Vec<AffinityState>,
    pub counters: CountersView,
}

#[derive(Debug, Serialize)]
pub struct CountersView {
    pub translated: u64,
    pub no_backend: u64,
    pub affinity_hits: u64,
    pub reverse_translated: u64,
    pub errors: u64,
}

fn open(pin_dir: &Path, name: &str) -> Result<Map, InspectError> {
    let path = pin_dir.join(name);
    let data = MapData::from_pin(&path).map_err(|source| InspectError::Open {
        path: path.display().to_string(),
        source,
    })?;
    Ok(match name {
        n if n == map_names::COUNTERS => Map::PerCpuArray(data),
        _ => Map::HashMap(data),
    })
}

/// Reads the maps under `pin_dir`; `only` keeps the frontends on that address.
pub fn inspect(pin_dir: &Path, only: Option<Ipv4Addr>) -> Result<Inspection, InspectError> {
    let read = |map| move |source| InspectError::Read { map, source };
    let services: HashMap<MapData, ServiceKey, ServiceEntry> = open(pin_dir, map_names::SERVICES)?
        .try_into()
        .map_err(read(map_names::SERVICES))?;
    let entries = services
        .iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(read(map_names::SERVICES))?;

    let mut frontends = Vec::new();
    for (key, master) in entries.iter().filter(|(key, _)| key.slot == 0) {
        let Some(frontend) = frontend_of(key) else {
            continue;
        };
        if only.is_some_and(|only| only != frontend.address) {
            continue;
        }
        let backends = (1..=master.count)
            .map(|slot| {
                entries
                    .iter()
                    .find(|(k, _)| *k == ServiceKey { slot, ..*key })
                    .map(|(_, entry)| BackendAddr {
                        address: Ipv4Addr::from(u32::from_be(entry.backend_address)),
                        port: u16::from_be(entry.backend_port),
                    })
            })
            .collect();
        frontends.push(FrontendState {
            frontend,
            service_id: master.service_id,
            affinity_timeout_seconds: (master.flags & SERVICE_FLAG_AFFINITY != 0)
                .then_some(master.affinity_timeout_s),
            backends,
        });
    }
    frontends.sort_by_key(|f| f.frontend);

    let affinity_map: HashMap<MapData, AffinityKey, AffinityEntry> =
        open(pin_dir, map_names::AFFINITY)?
            .try_into()
            .map_err(read(map_names::AFFINITY))?;
    let affinity = affinity_map
        .iter()
        .filter_map(Result::ok)
        .map(|(key, entry)| AffinityState {
            netns_cookie: key.netns_cookie,
            service_id: key.service_id,
            backend_id: entry.backend_id,
            slot: entry.slot,
        })
        .collect();

    let counters_map: PerCpuArray<MapData, Counters> = open(pin_dir, map_names::COUNTERS)?
        .try_into()
        .map_err(read(map_names::COUNTERS))?;
    let per_cpu = counters_map.get(&0, 0).map_err(read(map_names::COUNTERS))?;
    let sum = Counters::sum(per_cpu.iter());
    Ok(Inspection {
        frontends,
        affinity,
        counters: CountersView {
            translated: sum.translated,
            no_backend: sum.no_backend,
            affinity_hits: sum.affinity_hits,
            reverse_translated: sum.reverse_translated,
            errors: sum.errors,
        },
    })
}

fn frontend_of(key: &ServiceKey) -> Option<Frontend> {
    Some(Frontend {
        address: Ipv4Addr::from(u32::from_be(key.address)),
        port: u16::from_be(key.port),
        protocol: Protocol::from_number(key.protocol)?,
        scope: Scope::from_number(key.scope)?,
    })
}

pub fn table(inspection: &Inspection) -> String {
    let mut out = String::from("FRONTEND                 SCOPE     ID      AFFINITY  BACKENDS\n");
    for state in &inspection.frontends {
        let f = &state.frontend;
        let backends = if state.backends.is_empty() {
            "none: connections refused".to_owned()
        } else {
            state
                .backends
                .iter()
                .map(|b| b.map_or_else(|| "<missing slot>".to_owned(), |b| b.to_string()))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let affinity = state
            .affinity_timeout_seconds
            .map_or_else(|| "-".to_owned(), |t| format!("{t}s"));
        let _ = writeln!(
            out,
            "{:24} {:9} {:<7} {:9} {}",
            format!("{}:{}/{:?}", f.address, f.port, f.protocol).to_uppercase(),
            format!("{:?}", f.scope).to_lowercase(),
            state.service_id,
            affinity,
            backends
        );
    }
    let c = &inspection.counters;
    let _ = writeln!(
        out,
        "\naffinity entries: {}\ncounters: translated {} no_backend {} affinity_hits {} reverse_translated {} errors {}",
        inspection.affinity.len(),
        c.translated,
        c.no_backend,
        c.affinity_hits,
        c.reverse_translated,
        c.errors
    );
    out
}
