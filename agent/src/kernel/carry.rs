//! Flow state carried over when a table the programs write must be created again with
//! another size (a changed `--max-conntrack-entries`, `--max-conntrack-new-entries` or
//! `--max-affinity-entries`): without it every flow from outside through SNAT would be
//! reset and every ClientIP affinity forgotten at that restart.
//!
//! The old map's pin is moved aside ([`pins::holding_pin`]); [`copy`] runs after the load
//! and again once the new programs are attached (the flows the old ones made meanwhile),
//! then [`finish`] drops the old maps. Both passes only add keys the new map lacks, so an
//! entry the new programs updated is never overwritten by an older copy. A map pinned under
//! an older name ([`map_names::RENAMED`]) is carried the same way.
use std::{fs, io, path::Path};

use aya::{
    Pod,
    maps::{HashMap, Map, MapData, MapError},
};
use socklb_abi::{
    AffinityEntry, AffinityKey, AffinityKey6, CtEntry, CtEntry6, CtKey, CtKey6, map_names,
};

use super::pins;

/// The maps whose entries survive a change of their size: flow and affinity state the
/// programs write (the agent rewrites every other map from the cluster's state).
pub const CARRIED: [&str; 6] = [
    map_names::CONNTRACK,
    map_names::CONNTRACK_NEW,
    map_names::CONNTRACK6,
    map_names::CONNTRACK_NEW6,
    map_names::AFFINITY,
    map_names::AFFINITY6,
];

/// Every carry, as (the name the old map is held under, the map it is copied into): the
/// resized maps under their own names, the renamed ones under their old names.
fn carries() -> impl Iterator<Item = (&'static str, &'static str)> {
    CARRIED
        .iter()
        .map(|name| (*name, *name))
        .chain(map_names::RENAMED)
}

/// `BPF_NOEXIST`: add a key only if the map lacks it.
const BPF_NOEXIST: u64 = 1;

/// Moves the pin of `name`, about to be replaced by a map of another size, aside; an older
/// one left by an interrupted start is dropped first (its entries were copied already).
pub fn hold(pin_dir: &Path, name: &str) -> io::Result<()> {
    let held = pins::holding_pin(pin_dir, name);
    fs::create_dir_all(pins::holding_dir(pin_dir))?;
    match fs::remove_file(&held) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    fs::rename(pins::map_pin(pin_dir, name), held)
}

/// Moves the pins of maps an older agent pinned under an older name aside, when the new
/// name is not pinned yet: the loader then creates the map of the new name and their
/// entries are carried into it. Returns the old names held.
pub fn hold_renamed(pin_dir: &Path) -> io::Result<Vec<&'static str>> {
    let mut held = Vec::new();
    for (old, new) in map_names::RENAMED {
        let old_pin = pins::map_pin(pin_dir, old);
        if !old_pin.exists() || pins::map_pin(pin_dir, new).exists() {
            continue;
        }
        fs::create_dir_all(pins::holding_dir(pin_dir))?;
        fs::rename(old_pin, pins::holding_pin(pin_dir, old))?;
        held.push(old);
    }
    Ok(held)
}

#[derive(Debug, thiserror::Error)]
#[error("cannot carry the entries of {name} over into its new map")]
pub struct CarryError {
    name: &'static str,
    #[source]
    source: MapError,
}

/// Copies the entries of every held map into the pinned map of its name, adding only keys
/// the new map lacks. Returns how many were added.
pub fn copy(pin_dir: &Path) -> Result<usize, CarryError> {
    let mut added = 0;
    for (held_as, name) in carries() {
        let held = pins::holding_pin(pin_dir, held_as);
        if !held.exists() {
            continue;
        }
        let error = |source| CarryError { name, source };
        let old = MapData::from_pin(&held).map_err(error)?;
        let new = MapData::from_pin(pins::map_pin(pin_dir, name)).map_err(error)?;
        added += match name {
            n if n == map_names::CONNTRACK || n == map_names::CONNTRACK_NEW => {
                copy_entries::<CtKey, CtEntry>(old, new)
            }
            n if n == map_names::CONNTRACK6 || n == map_names::CONNTRACK_NEW6 => {
                copy_entries::<CtKey6, CtEntry6>(old, new)
            }
            n if n == map_names::AFFINITY => copy_entries::<AffinityKey, AffinityEntry>(old, new),
            _ => copy_entries::<AffinityKey6, AffinityEntry>(old, new),
        }
        .map_err(error)?;
    }
    Ok(added)
}

/// Puts the held maps back where they were (a renamed one under its old name), over the
/// new ones: for a start that failed before its programs ran.
pub fn restore(pin_dir: &Path) {
    for (held_as, _) in carries() {
        let held = pins::holding_pin(pin_dir, held_as);
        if held.exists() {
            let _ = fs::rename(&held, pins::map_pin(pin_dir, held_as));
        }
    }
    let _ = fs::remove_dir(pins::holding_dir(pin_dir));
}

/// Drops the held maps: the programs that wrote them are replaced.
pub fn finish(pin_dir: &Path) {
    for (held_as, _) in carries() {
        let _ = fs::remove_file(pins::holding_pin(pin_dir, held_as));
    }
    let _ = fs::remove_dir(pins::holding_dir(pin_dir));
}

fn copy_entries<K: Pod, V: Pod>(old: MapData, new: MapData) -> Result<usize, MapError> {
    let old: HashMap<MapData, K, V> = Map::HashMap(old).try_into()?;
    let mut new: HashMap<MapData, K, V> = Map::HashMap(new).try_into()?;
    let mut added = 0;
    // Keys of an LRU map may go while it is walked: a vanished key is simply skipped.
    for (key, value) in old.iter().filter_map(Result::ok) {
        match new.insert(&key, &value, BPF_NOEXIST) {
            Ok(()) => added += 1,
            // Already there: written by the new programs, or by the first pass.
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(added)
}
