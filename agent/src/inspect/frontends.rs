//! The frontends the service maps hold: their backends by slot, their Service's name (the
//! names map), their source ranges.
use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use aya::maps::{HashMap as BpfHashMap, LpmTrie, MapData};
use serde::Serialize;
use socklb_abi::{
    FrontendName, SERVICE_FLAG_AFFINITY, SERVICE_FLAG_MAGLEV, SERVICE_FLAG_REJECT,
    SOURCE_RANGE_FRONTEND_BITS, SOURCE_RANGE6_FRONTEND_BITS, SourceRange, SourceRange6,
    SourceVerdict, map_names,
};

use super::{
    error::InspectError,
    pinned::{ipv6, open, open6},
};
use crate::{
    desired::{BackendAddr, Frontend, Scope},
    kernel::mapped_words::MappedWords,
    maps::{
        frontend_filter::FrontendFilter,
        names::FrontendLabel,
        services::{KernelMaps, RawMaps},
        writer::{SlotKey, SlotValue},
    },
    terminal::printable,
};

/// One frontend as the maps hold it.
#[derive(Debug, Serialize)]
pub struct FrontendState {
    pub frontend: Frontend,
    pub service_id: u32,
    /// The Service (namespace, name, port, kind) the frontend belongs to, from the names
    /// map the agent keeps; absent for a frontend programmed by hand or before the agent
    /// wrote names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceLabel>,
    pub affinity_timeout_seconds: Option<u32>,
    /// Backends by slot (1..=count); a missing slot would show as `null`.
    pub backends: Vec<Option<BackendAddr>>,
    /// loadBalancerSourceRanges of an external frontend: the client CIDRs allowed in
    /// (empty: nobody); absent when unrestricted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_ranges: Option<Vec<String>>,
    /// New flows from outside choose by Maglev hashing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub maglev: bool,
    /// Without backends, traffic from outside is refused (a TCP reset, ICMP port
    /// unreachable for UDP): the Service has no endpoint at all. Otherwise an empty external
    /// frontend drops it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub refuses: bool,
}

#[derive(Debug, Serialize)]
pub struct ServiceLabel {
    pub namespace: String,
    pub name: String,
    pub port: String,
    pub kind: &'static str,
}

impl ServiceLabel {
    /// NAMESPACE/NAME, and :PORT if the port is named, escaped for the terminal: the names
    /// are the Service author's (the file source takes any character).
    pub(super) fn shown(&self) -> String {
        let (namespace, name) = (printable(&self.namespace), printable(&self.name));
        if self.port.is_empty() {
            format!("{namespace}/{name}")
        } else {
            format!("{namespace}/{name}:{}", printable(&self.port))
        }
    }
}

impl From<FrontendLabel> for ServiceLabel {
    fn from(label: FrontendLabel) -> Self {
        Self {
            namespace: label.namespace,
            name: label.name,
            port: label.port,
            kind: label.kind,
        }
    }
}

/// Each backend slot's id, by (service id, scope, slot): what an affinity entry's backend
/// is checked against.
pub type SlotIds = HashMap<(u32, Scope, u16), u32>;

/// The frontends (only those on `only`, if given), sorted, and the ids their slots hold.
pub fn read(
    pin_dir: &Path,
    only: Option<IpAddr>,
) -> Result<(Vec<FrontendState>, SlotIds), InspectError> {
    // Both families' service maps and the slot array, read as the agent reads them back,
    // keyed, so that finding a frontend's slots costs a lookup each, not a scan.
    let slots = MappedWords::open_array(open(pin_dir, map_names::SLOTS)?, map_names::SLOTS)
        .map_err(|source| InspectError::Slots {
            source: Box::new(source),
        })?;
    let frontend_filter =
        FrontendFilter::open(pin_dir).map_err(|source| InspectError::FrontendFilter {
            source: Box::new(source),
        })?;
    let mut maps = KernelMaps::new(RawMaps {
        services: open(pin_dir, map_names::SERVICES)?,
        slots,
        backends: open(pin_dir, map_names::BACKENDS)?,
        services6: open(pin_dir, map_names::SERVICES6)?,
        backends6: open(pin_dir, map_names::BACKENDS6)?,
        frontend_filter,
    })
    .map_err(InspectError::reading(map_names::SERVICES))?;
    let entries: HashMap<SlotKey, SlotValue> = maps
        .read()
        .map_err(InspectError::reading(map_names::SERVICES))?
        .services
        .into_iter()
        .collect();

    let ranges = source_ranges(pin_dir)?;
    let names_map: BpfHashMap<MapData, u32, FrontendName> = open(pin_dir, map_names::NAMES)?
        .try_into()
        .map_err(InspectError::reading(map_names::NAMES))?;
    let names: HashMap<u32, FrontendName> = names_map.iter().filter_map(Result::ok).collect();

    let mut frontends = Vec::new();
    // Each backend slot's id, by (service id, scope, slot), for the affinity entries.
    let mut slot_ids = SlotIds::new();
    for (key, value) in &entries {
        let SlotValue::Master(master) = value else {
            continue;
        };
        let frontend = key.frontend;
        if key.slot != 0 || only.is_some_and(|only| only != frontend.address) {
            continue;
        }
        let backends = (1..=master.count)
            .map(|slot| match entries.get(&SlotKey { frontend, slot }) {
                Some(SlotValue::Backend { id, backend }) => {
                    slot_ids.insert((master.service_id, frontend.scope, slot), *id);
                    Some(*backend)
                }
                _ => None,
            })
            .collect();
        frontends.push(FrontendState {
            frontend,
            service_id: master.service_id,
            service: names
                .get(&master.service_id)
                .and_then(FrontendLabel::decode)
                .map(ServiceLabel::from),
            affinity_timeout_seconds: (master.flags & SERVICE_FLAG_AFFINITY != 0)
                .then_some(master.affinity_timeout_s),
            backends,
            maglev: master.flags & SERVICE_FLAG_MAGLEV != 0,
            refuses: master.flags & SERVICE_FLAG_REJECT != 0,
            source_ranges: (frontend.scope == Scope::External)
                .then(|| {
                    ranges
                        .get(&(frontend.address, frontend.port, frontend.protocol.number()))
                        .cloned()
                })
                .flatten(),
        });
    }
    frontends.sort_by_key(|f| f.frontend);
    Ok((frontends, slot_ids))
}

/// The client CIDRs allowed in, by frontend (address, port, protocol number).
type SourceRanges = BTreeMap<(IpAddr, u16, u8), Vec<String>>;

fn source_ranges(pin_dir: &Path) -> Result<SourceRanges, InspectError> {
    let mut ranges = SourceRanges::new();
    let trie: LpmTrie<MapData, SourceRange, SourceVerdict> =
        open(pin_dir, map_names::SOURCE_RANGES)?
            .try_into()
            .map_err(InspectError::reading(map_names::SOURCE_RANGES))?;
    for key in trie.keys().filter_map(Result::ok) {
        let data = key.data();
        let frontend = Ipv4Addr::from(u32::from_be(data.frontend)).into();
        let held = ranges
            .entry((frontend, u16::from_be(data.port), data.protocol))
            .or_default();
        if key.prefix_len() > SOURCE_RANGE_FRONTEND_BITS {
            let client = Ipv4Addr::from(u32::from_be(data.client));
            held.push(format!(
                "{client}/{}",
                key.prefix_len() - SOURCE_RANGE_FRONTEND_BITS
            ));
        }
    }
    if let Some(trie) = open6(pin_dir, map_names::SOURCE_RANGES6)? {
        let trie: LpmTrie<MapData, SourceRange6, SourceVerdict> = trie
            .try_into()
            .map_err(InspectError::reading(map_names::SOURCE_RANGES6))?;
        for key in trie.keys().filter_map(Result::ok) {
            let data = key.data();
            let held = ranges
                .entry((ipv6(data.frontend), u16::from_be(data.port), data.protocol))
                .or_default();
            if key.prefix_len() > SOURCE_RANGE6_FRONTEND_BITS {
                held.push(format!(
                    "{}/{}",
                    ipv6(data.client),
                    key.prefix_len() - SOURCE_RANGE6_FRONTEND_BITS
                ));
            }
        }
    }
    Ok(ranges)
}
