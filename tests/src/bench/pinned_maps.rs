//! What the agent's pinned maps hold: the kernel memory charged for them and their
//! service and backend entries.
use std::{
    fs,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use anyhow::Context as _;
use aya::maps::MapData;

/// Kernel memory of the agent's pinned maps (the kernel's `memlock` figure for each map,
/// which counts preallocated entries), and their entries.
pub fn map_memory(pin_dir: &Path) -> anyhow::Result<(u64, usize)> {
    let mut bytes = 0;
    let mut entries = 0;
    let mut pending = vec![pin_dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("list {}", dir.display()))? {
            let path = entry.context("list the pins")?.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            // Links and programs are pinned here too: only maps open as maps.
            let Ok(map) = MapData::from_pin(&path) else {
                continue;
            };
            let fd = map.fd().as_fd().as_raw_fd();
            let info = fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
            bytes += info
                .lines()
                .find_map(|line| line.strip_prefix("memlock:"))
                .and_then(|value| value.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if path.file_name().is_some_and(|name| {
                let name = name.to_string_lossy();
                name.contains("svc") || name.contains("_be_")
            }) {
                let map = aya::maps::Map::HashMap(map);
                if let Ok(keys) = aya::maps::HashMap::<
                    _,
                    socklb_abi::ServiceKey,
                    socklb_abi::ServiceEntry,
                >::try_from(&map)
                {
                    entries += keys.keys().count();
                } else if let Ok(keys) =
                    aya::maps::HashMap::<_, u32, socklb_abi::Backend>::try_from(&map)
                {
                    entries += keys.keys().count();
                }
            }
        }
    }
    Ok((bytes, entries))
}
