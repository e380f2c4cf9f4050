//! `socklb inspect`: what the pinned maps hold, read directly from bpffs, so it works while
//! the agent is down: frontends with their backends per scope, session-affinity entries,
//! conntrack entries of traffic from outside, the kernel programs' counters, and which path
//! serves each pod (`pods`).
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

use aya::maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray};
use serde::Serialize;
use socklb_abi::{
    AFFINITY_EXTERNAL_CLIENT, AffinityEntry, AffinityKey, AffinityKey6, CT_FLAG_CLOSING,
    CT_FLAG_SEEN_REPLY, CT_FLAG_SNAT, CT_FORWARD, Counters, CtEntry, CtEntry6, CtKey, CtKey6,
    FragmentKey, FragmentKey6, FragmentPorts, FrontendName, Ipv6Words, SERVICE_FLAG_AFFINITY,
    SERVICE_FLAG_MAGLEV, SERVICE_FLAG_REJECT, SOURCE_RANGE_FRONTEND_BITS,
    SOURCE_RANGE6_FRONTEND_BITS, SocketRecordCount, SourceRange, SourceRange6, SourceVerdict,
    ipv6_octets, map_names,
};

use crate::{
    desired::{BackendAddr, Frontend, Protocol, Scope},
    kernel::{
        attach::tc::{DeviceRole, TcAttachError, served_devices},
        flow_filter, host,
        mapped_words::{MappedWords, MappedWordsError},
        pins,
    },
    maps::{
        frontend_filter::{self, FrontendFilter},
        names::FrontendLabel,
        services::{KernelMaps, RawMaps},
        writer::{SlotKey, SlotValue},
    },
    terminal::printable,
};

mod pods;

pub use self::pods::{PodPathState, PodState};
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
    #[error("cannot list the devices the TC programs serve")]
    Devices {
        #[source]
        source: Box<TcAttachError>,
    },
    #[error("cannot read the flow filter")]
    FlowFilter {
        #[source]
        source: Box<MappedWordsError>,
    },
    #[error("cannot read the frontend filter")]
    FrontendFilter {
        #[source]
        source: Box<MappedWordsError>,
    },
    #[error("cannot read the slot array")]
    Slots {
        #[source]
        source: Box<MappedWordsError>,
    },
}

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
    fn shown(&self) -> String {
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
    pub closing: bool,
    /// In the main table: a TCP flow past its handshake, a UDP flow answered and continued.
    /// Unconfirmed flows (a SYN flood's) live in a table of their own.
    pub confirmed: bool,
    /// Unconfirmed: the backend answered.
    pub seen_reply: bool,
    /// Seconds since the last packet in this direction.
    pub idle_seconds: u32,
}

#[derive(Debug, Serialize)]
pub struct Inspection {
    pub frontends: Vec<FrontendState>,
    pub affinity: Vec<AffinityState>,
    pub conntrack: Vec<ConntrackState>,
    /// Datagrams whose first fragment's ports are remembered for their later fragments.
    pub fragments: usize,
    /// Sockets holding a record of what they were translated for (bounded by
    /// `--max-socket-records`).
    pub socket_records: u64,
    /// Pods' network namespaces whose sockets the socket hooks translate besides the
    /// host's (`--socket-lb-scope pods`).
    pub pod_namespaces: usize,
    /// The pods' namespaces the runtime pinned, and which path serves each.
    pub pods: Vec<PodState>,
    /// Why `pods` is empty although there may be pods (the namespaces cannot be entered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pods_unreadable: Option<String>,
    /// Devices whose traffic from outside the TC programs translate.
    pub external_devices: Vec<String>,
    /// Workloads' devices the per-packet path serves (`--pod-devices`).
    pub pod_devices: Vec<String>,
    pub counters: CountersView,
    /// How full the flow filter of the TC programs is (`None`: not pinned).
    pub flow_filter: Option<flow_filter::Fill>,
    pub frontend_filter: Option<frontend_filter::Fill>,
    /// How an agent in this container closes the sockets of removed backends.
    pub socket_destroy: crate::sweep::Expected,
}

/// The counters as `socklb inspect -o json` shows them (and tests and tools read them back):
/// the ABI's table, one field per counter.
pub type CountersView = Counters;

fn open(pin_dir: &Path, name: &str) -> Result<Map, InspectError> {
    let path = pins::map_pin(pin_dir, name);
    let data = MapData::from_pin(&path).map_err(|source| InspectError::Open {
        path: path.display().to_string(),
        source,
    })?;
    Ok(match name {
        n if n == map_names::COUNTERS => Map::PerCpuArray(data),
        n if n == map_names::SOCKET_RECORD_COUNT
            || n == map_names::SLOTS
            || n == map_names::BACKENDS =>
        {
            Map::Array(data)
        }
        n if n == map_names::SOURCE_RANGES || n == map_names::SOURCE_RANGES6 => Map::LpmTrie(data),
        _ => Map::HashMap(data),
    })
}

/// An IPv6 map, or `None` when it is not pinned (an agent from before IPv6, or one whose
/// programs do not have that map yet): its family then simply has no entries.
fn open6(pin_dir: &Path, name: &str) -> Result<Option<Map>, InspectError> {
    if !pins::map_pin(pin_dir, name).exists() {
        return Ok(None);
    }
    open(pin_dir, name).map(Some)
}

/// The entries of a hash map, decoded by `decode`; unreadable entries are left out.
fn entries_of<K: aya::Pod, V: aya::Pod, T>(
    map: Option<Map>,
    name: &'static str,
    decode: impl Fn(K, V) -> Option<T>,
) -> Result<Vec<T>, InspectError> {
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    let map: HashMap<MapData, K, V> = map
        .try_into()
        .map_err(|source| InspectError::Read { map: name, source })?;
    Ok(map
        .iter()
        .filter_map(Result::ok)
        .filter_map(|(key, value)| decode(key, value))
        .collect())
}

fn ipv6(words: Ipv6Words) -> IpAddr {
    Ipv6Addr::from(ipv6_octets(words)).into()
}

/// Reads the maps under `pin_dir`, both families; `only` keeps the frontends on that
/// address.
pub fn inspect(pin_dir: &Path, only: Option<IpAddr>) -> Result<Inspection, InspectError> {
    let read = |map| move |source| InspectError::Read { map, source };
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
    .map_err(read(map_names::SERVICES))?;
    let entries: std::collections::HashMap<SlotKey, SlotValue> = maps
        .read()
        .map_err(read(map_names::SERVICES))?
        .services
        .into_iter()
        .collect();

    // Source ranges by frontend (address, port, protocol number).
    let mut ranges: BTreeMap<(IpAddr, u16, u8), Vec<String>> = BTreeMap::new();
    let trie: LpmTrie<MapData, SourceRange, SourceVerdict> =
        open(pin_dir, map_names::SOURCE_RANGES)?
            .try_into()
            .map_err(read(map_names::SOURCE_RANGES))?;
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
        let trie: LpmTrie<MapData, SourceRange6, SourceVerdict> =
            trie.try_into().map_err(read(map_names::SOURCE_RANGES6))?;
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

    let names_map: HashMap<MapData, u32, FrontendName> = open(pin_dir, map_names::NAMES)?
        .try_into()
        .map_err(read(map_names::NAMES))?;
    let names: std::collections::HashMap<u32, FrontendName> =
        names_map.iter().filter_map(Result::ok).collect();

    let mut frontends = Vec::new();
    // Each backend slot's id, by (service id, scope, slot), for the affinity entries.
    let mut slot_ids: std::collections::HashMap<(u32, Scope, u16), u32> =
        std::collections::HashMap::new();
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

    let affinity_map: HashMap<MapData, AffinityKey, AffinityEntry> =
        open(pin_dir, map_names::AFFINITY)?
            .try_into()
            .map_err(read(map_names::AFFINITY))?;
    let affinity = affinity_map
        .iter()
        .filter_map(Result::ok)
        .map(|(key, entry)| AffinityState {
            netns_cookie: (key.netns_cookie & AFFINITY_EXTERNAL_CLIENT == 0)
                .then_some(key.netns_cookie),
            client: (key.netns_cookie & AFFINITY_EXTERNAL_CLIENT != 0).then(|| {
                Ipv4Addr::from(u32::from_be(
                    (key.netns_cookie & u64::from(u32::MAX)) as u32,
                ))
                .into()
            }),
            service_id: key.service_id,
            backend_id: entry.backend_id,
            slot: entry.slot,
            backend: None,
            idle_seconds: idle_seconds(entry.last_used_ns),
            expired: false,
        })
        .collect::<Vec<_>>();
    // IPv6 clients from outside (local sockets of either family share the map above).
    let mut affinity = affinity;
    affinity.extend(entries_of(
        open6(pin_dir, map_names::AFFINITY6)?,
        map_names::AFFINITY6,
        |key: AffinityKey6, entry: AffinityEntry| {
            Some(AffinityState {
                netns_cookie: None,
                client: Some(ipv6(key.client)),
                service_id: key.service_id,
                backend_id: entry.backend_id,
                slot: entry.slot,
                backend: None,
                idle_seconds: idle_seconds(entry.last_used_ns),
                expired: false,
            })
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

    let now = host::monotonic_seconds();
    let mut conntrack = Vec::new();
    for (name, confirmed) in [
        (map_names::CONNTRACK, true),
        (map_names::CONNTRACK_NEW, false),
    ] {
        let map: HashMap<MapData, CtKey, CtEntry> = open(pin_dir, name)?
            .try_into()
            .map_err(|source| InspectError::Read { map: name, source })?;
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

    let fragments_map: HashMap<MapData, FragmentKey, FragmentPorts> =
        open(pin_dir, map_names::FRAGMENTS)?
            .try_into()
            .map_err(read(map_names::FRAGMENTS))?;
    let fragments = fragments_map.keys().filter_map(Result::ok).count()
        + entries_of(
            open6(pin_dir, map_names::FRAGMENTS6)?,
            map_names::FRAGMENTS6,
            |_: FragmentKey6, _: FragmentPorts| Some(()),
        )?
        .len();

    let counters_map: PerCpuArray<MapData, Counters> = open(pin_dir, map_names::COUNTERS)?
        .try_into()
        .map_err(read(map_names::COUNTERS))?;
    let per_cpu = counters_map.get(&0, 0).map_err(read(map_names::COUNTERS))?;
    let sum = Counters::sum(per_cpu.iter());
    let socket_records = socket_records(pin_dir)?;
    let listed: BTreeSet<u64> = entries_of(
        open6(pin_dir, map_names::SOCKET_LB_NAMESPACES)?,
        map_names::SOCKET_LB_NAMESPACES,
        |cookie: u64, _: u8| Some(cookie),
    )?
    .into_iter()
    .collect();
    let devices = served_devices(pin_dir).map_err(|source| InspectError::Devices {
        source: Box::new(source),
    })?;
    let of_role = |wanted| {
        devices
            .iter()
            .filter(|(_, role)| *role == wanted)
            .map(|(device, _)| device.clone())
            .collect()
    };
    let pod_devices: Vec<String> = of_role(DeviceRole::Pod);
    let (pods, pods_unreadable) = match pods::pods(&listed, &pod_devices, only) {
        Ok(pods) => (pods, None),
        Err(error) => (
            Vec::new(),
            Some(format!(
                "cannot enter the pods' network namespaces ({error}): run as root, or in the \
                 agent's container with CAP_SYS_ADMIN"
            )),
        ),
    };
    Ok(Inspection {
        external_devices: of_role(DeviceRole::External),
        pod_devices,
        pods,
        pods_unreadable,
        frontends,
        affinity,
        conntrack,
        fragments,
        socket_records,
        pod_namespaces: listed.len(),
        counters: sum,
        flow_filter: flow_filter::fill(pin_dir).map_err(|source| InspectError::FlowFilter {
            source: Box::new(source),
        })?,
        frontend_filter: frontend_filter::fill(pin_dir).map_err(|source| {
            InspectError::FrontendFilter {
                source: Box::new(source),
            }
        })?,
        socket_destroy: crate::sweep::Expected::probe(),
    })
}

/// How many sockets hold a record: the programs' count, which a release racing another may
/// leave a moment below zero.
fn socket_records(pin_dir: &Path) -> Result<u64, InspectError> {
    let name = map_names::SOCKET_RECORD_COUNT;
    let map: Array<MapData, SocketRecordCount> = open(pin_dir, name)?
        .try_into()
        .map_err(|source| InspectError::Read { map: name, source })?;
    let count = map
        .get(&0, 0)
        .map_err(|source| InspectError::Read { map: name, source })?;
    Ok(u64::try_from(count.live).unwrap_or(0))
}

/// Names separated by spaces, or "none"; escaped for the terminal (a device's name is
/// its creator's choice).
fn listed(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names
            .iter()
            .map(|name| printable(name))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn socket(address: u32, port: u16) -> SocketAddr {
    SocketAddr::new(
        Ipv4Addr::from(u32::from_be(address)).into(),
        u16::from_be(port),
    )
}

fn socket6(address: Ipv6Words, port: u16) -> SocketAddr {
    SocketAddr::new(ipv6(address), u16::from_be(port))
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

/// Seconds since `last_used_ns` (the programs' `bpf_ktime_get_ns`, CLOCK_MONOTONIC).
fn idle_seconds(last_used_ns: u64) -> u32 {
    let last_used = u32::try_from(last_used_ns / 1_000_000_000).unwrap_or(u32::MAX);
    host::monotonic_seconds().saturating_sub(last_used)
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
        closing: entry.flags & CT_FLAG_CLOSING != 0,
        confirmed,
        seen_reply: entry.flags & CT_FLAG_SEEN_REPLY != 0,
        idle_seconds: now.saturating_sub(entry.last_seen_s),
    }
}

/// Keeps what belongs to the Service `namespace/name`: its frontends, and the affinity and
/// conntrack entries of those frontends.
pub fn only_service(
    mut inspection: Inspection,
    service: &crate::select::ServiceName,
) -> Inspection {
    let matches =
        |label: &ServiceLabel| label.namespace == service.namespace && label.name == service.name;
    inspection
        .frontends
        .retain(|f| f.service.as_ref().is_some_and(matches));
    let ids: std::collections::HashSet<u32> =
        inspection.frontends.iter().map(|f| f.service_id).collect();
    inspection.affinity.retain(|a| ids.contains(&a.service_id));
    inspection.conntrack.retain(|c| ids.contains(&c.service_id));
    inspection
}

pub fn table(inspection: &Inspection) -> String {
    let mut out = String::from(
        "FRONTEND                 SCOPE     ID      SERVICE                        AFFINITY  BACKENDS\n",
    );
    for state in &inspection.frontends {
        let f = &state.frontend;
        let backends = if state.backends.is_empty() && state.refuses {
            // The reason follows on the row (`refused: no endpoints`).
            "none".to_owned()
        } else if state.backends.is_empty() {
            crate::explain::empty_frontend(f.scope, state.refuses).to_owned()
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
        let backends = match &state.source_ranges {
            Some(ranges) if ranges.is_empty() => format!("{backends}  (no client allowed)"),
            Some(ranges) => format!("{backends}  (clients: {})", ranges.join(" ")),
            None => backends,
        };
        let backends = if state.maglev {
            format!("{backends}  (maglev)")
        } else {
            backends
        };
        let backends = if state.refuses {
            format!("{backends}  (refused: no endpoints)")
        } else {
            backends
        };
        let _ = writeln!(
            out,
            "{:24} {:9} {:<7} {:30} {:9} {}",
            format!(
                "{}/{}",
                SocketAddr::new(f.address, f.port),
                f.protocol.name()
            ),
            f.scope.name(),
            state.service_id,
            state
                .service
                .as_ref()
                .map_or_else(|| "-".to_owned(), ServiceLabel::shown),
            affinity,
            backends
        );
    }
    if !inspection.conntrack.is_empty() {
        out.push_str(
            "\nCONNTRACK (flows translated per packet: from outside, and from pod devices)\n",
        );
        for c in &inspection.conntrack {
            let protocol = c.protocol.map_or("?", |p| p.name());
            let _ = writeln!(
                out,
                "{:4} {:7} {} -> {}  =>  {} -> {}  service {} backend {}{}{}{} idle {}s",
                protocol,
                c.direction,
                c.from,
                c.to,
                c.rewritten_from,
                c.rewritten_to,
                c.service_id,
                c.backend_id,
                if c.snat { " snat" } else { "" },
                match (c.confirmed, c.seen_reply) {
                    (true, true) => "",
                    (true, false) => " unanswered",
                    (false, false) => " unconfirmed",
                    (false, true) => " unconfirmed answered",
                },
                if c.closing { " closing" } else { "" },
                c.idle_seconds
            );
        }
    }
    if !inspection.affinity.is_empty() {
        out.push_str("\nAFFINITY (sessionAffinity ClientIP)\n");
        for a in &inspection.affinity {
            let client = match (a.netns_cookie, a.client) {
                (Some(cookie), _) => format!("netns {cookie}"),
                (None, Some(client)) => format!("client {client}"),
                (None, None) => "?".to_owned(),
            };
            let service = inspection
                .frontends
                .iter()
                .find(|f| f.service_id == a.service_id)
                .and_then(|f| f.service.as_ref())
                .map_or_else(String::new, |s| {
                    format!(" ({}/{})", printable(&s.namespace), printable(&s.name))
                });
            let _ = writeln!(
                out,
                "{client} service {}{service} -> {} slot {} idle {}s{}",
                a.service_id,
                a.backend
                    .map_or_else(|| "<slot no longer holds it>".to_owned(), |b| b.to_string()),
                a.slot,
                a.idle_seconds,
                if a.expired {
                    " expired (the next connection chooses afresh)"
                } else {
                    ""
                }
            );
        }
    }
    let _ = write!(
        out,
        "\naffinity entries: {}\nfragmented datagrams: {}\nsockets with a record: {}\npods' \
         namespaces in the socket hooks' scope: {}\nexternal devices: {}\npod devices (per-packet \
         path): {}\ncounters:",
        inspection.affinity.len(),
        inspection.fragments,
        inspection.socket_records,
        inspection.pod_namespaces,
        listed(&inspection.external_devices),
        listed(&inspection.pod_devices),
    );
    for (name, value) in Counters::NAMES.iter().zip(inspection.counters.values()) {
        let _ = write!(out, " {name} {value}");
    }
    if let Some(fill) = &inspection.flow_filter {
        let _ = write!(
            out,
            "\nflow filter: {}, {} of {} frontend slots, {} of {} backend slots and {} of {} \
             unconfirmed frontend slots marked",
            if fill.ready {
                "trusted"
            } else {
                "not trusted yet (every packet is looked up)"
            },
            fill.frontends,
            fill.slots,
            fill.backends,
            fill.slots,
            fill.unconfirmed,
            fill.slots,
        );
    }
    if let Some(fill) = &inspection.frontend_filter {
        let _ = write!(
            out,
            "\nfrontend filter: {}, {} of {} slots marked",
            if fill.ready {
                "trusted"
            } else {
                "not trusted yet (every packet of no flow is looked up)"
            },
            fill.marked,
            fill.slots,
        );
    }
    if !inspection.pods.is_empty() {
        out.push_str("\npods (network namespaces the runtime pinned):");
        for pod in &inspection.pods {
            let path = match pod.path {
                PodPathState::Socket => "socket",
                PodPathState::PerPacket => "per-packet",
                PodPathState::None => "none (not translated)",
            };
            let _ = write!(
                out,
                "\n  {} addresses {} devices {}: {path}",
                printable(&pod.namespace),
                listed(
                    &pod.addresses
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                ),
                listed(&pod.devices),
            );
        }
    }
    if let Some(why) = &inspection.pods_unreadable {
        let _ = write!(out, "\npods: {why}");
    }
    // What `auto` picks with this process's capabilities: the agent's own mode (it may run
    // another) is in its start log and in socklb_socket_destroy_mode.
    let destroy = &inspection.socket_destroy;
    let _ = write!(
        out,
        "\n{} (as this process would; the agent's own mode: its start log, metric \
         socklb_socket_destroy_mode)",
        destroy.describe()
    );
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::{Expected, Mode, netns::Coverage};

    fn inspection(frontends: Vec<FrontendState>, affinity: Vec<AffinityState>) -> Inspection {
        Inspection {
            frontends,
            affinity,
            conntrack: Vec::new(),
            fragments: 0,
            socket_records: 0,
            pod_namespaces: 0,
            pods: vec![PodState {
                namespace: "/run/netns/cni-\x1b[2J".to_owned(),
                addresses: Vec::new(),
                devices: vec!["veth\u{202e}0".to_owned()],
                path: PodPathState::Socket,
            }],
            pods_unreadable: None,
            external_devices: vec!["eth\x1b0".to_owned()],
            pod_devices: Vec::new(),
            counters: CountersView::default(),
            flow_filter: None,
            frontend_filter: None,
            socket_destroy: Expected {
                mode: Mode::Off,
                every_namespace: false,
                coverage: Coverage {
                    enters_others: false,
                    host_processes: false,
                    other_users: false,
                },
                reason: None,
            },
        }
    }

    #[test]
    fn names_from_the_cluster_reach_the_terminal_escaped() {
        let frontend = FrontendState {
            frontend: Frontend {
                address: Ipv4Addr::new(10, 96, 0, 10).into(),
                port: 80,
                protocol: Protocol::Tcp,
                scope: Scope::Internal,
            },
            service_id: 3,
            service: Some(ServiceLabel {
                namespace: "default\x1b[31m".to_owned(),
                name: "web\u{202e}gpj".to_owned(),
                port: "\x1b]0;pwned\x07".to_owned(),
                kind: "ClusterIP",
            }),
            affinity_timeout_seconds: Some(600),
            backends: Vec::new(),
            source_ranges: None,
            maglev: false,
            refuses: false,
        };
        let affinity = AffinityState {
            netns_cookie: Some(1),
            client: None,
            service_id: 3,
            backend_id: 1,
            slot: 1,
            backend: None,
            idle_seconds: 5,
            expired: false,
        };
        let table = table(&inspection(vec![frontend], vec![affinity]));
        for raw in ['\x1b', '\x07', '\u{202e}'] {
            assert!(!table.contains(raw), "{raw:?} reached the table:\n{table}");
        }
        for shown in [
            "default\\x1b[31m/web\\u{202e}gpj:\\x1b]0;pwned\\x07",
            "service 3 (default\\x1b[31m/web\\u{202e}gpj)",
            "/run/netns/cni-\\x1b[2J",
            "devices veth\\u{202e}0",
            "external devices: eth\\x1b0",
        ] {
            assert!(table.contains(shown), "{shown:?} missing:\n{table}");
        }
    }
}
