//! Opening the pinned maps and decoding what they hold: addresses in network byte order, an
//! IPv6 map that may not be pinned.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
};

use aya::maps::{HashMap, Map, MapData};
use socklb_abi::{Ipv6Words, ipv6_octets, map_names};

use super::error::InspectError;
use crate::kernel::pins;

/// The map pinned as `name`, typed as its kind needs to be read.
pub(super) fn open(pin_dir: &Path, name: &str) -> Result<Map, InspectError> {
    let path = pins::map_pin(pin_dir, name);
    let data = MapData::from_pin(&path).map_err(|source| InspectError::Open {
        path: path.display().to_string(),
        source,
    })?;
    Ok(match name {
        n if n == map_names::COUNTERS => Map::PerCpuArray(data),
        n if n == map_names::SOCKET_RECORD_COUNT
            || n == map_names::NODE
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
pub(super) fn open6(pin_dir: &Path, name: &str) -> Result<Option<Map>, InspectError> {
    if !pins::map_pin(pin_dir, name).exists() {
        return Ok(None);
    }
    open(pin_dir, name).map(Some)
}

/// The entries of a hash map, decoded by `decode`; unreadable entries are left out.
pub(super) fn entries_of<K: aya::Pod, V: aya::Pod, T>(
    map: Option<Map>,
    name: &'static str,
    decode: impl Fn(K, V) -> Option<T>,
) -> Result<Vec<T>, InspectError> {
    let Some(map) = map else {
        return Ok(Vec::new());
    };
    let map: HashMap<MapData, K, V> = map.try_into().map_err(InspectError::reading(name))?;
    Ok(map
        .iter()
        .filter_map(Result::ok)
        .filter_map(|(key, value)| decode(key, value))
        .collect())
}

/// An IPv6 address as the maps hold it.
pub(super) fn ipv6(words: Ipv6Words) -> IpAddr {
    Ipv6Addr::from(ipv6_octets(words)).into()
}

/// An IPv4 address and port as the maps hold them (network byte order).
pub(super) fn socket(address: u32, port: u16) -> SocketAddr {
    SocketAddr::new(
        Ipv4Addr::from(u32::from_be(address)).into(),
        u16::from_be(port),
    )
}

/// An IPv6 address and port as the maps hold them.
pub(super) fn socket6(address: Ipv6Words, port: u16) -> SocketAddr {
    SocketAddr::new(ipv6(address), u16::from_be(port))
}
