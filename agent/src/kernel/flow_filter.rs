//! The flow filter the TC programs read before their conntrack lookups (socklb-abi
//! `flow_filter_destination`). The programs mark the slots of every flow they make; entries
//! they did not make (written by programs that predate the filter, or carried over from
//! resized tables) are marked here. So each load [`distrust`]s the filter, and once the new
//! programs replaced every earlier one, [`seed`] rebuilds it from the tables and trusts it
//! again. Until then the programs look up every packet, as without a filter.
//!
//! The map is mmapped, so that the agent marks a slot as the programs do: an atomic OR of
//! its bit into its word (the programs mark other bits of the same words meanwhile).
use std::{
    ops::Range,
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
};

use aya::maps::{HashMap, Map, MapData};
use socklb_abi::{
    CT_FORWARD, CtEntry, CtKey, FLOW_FILTER_DESTINATIONS, FLOW_FILTER_ENTRIES, FLOW_FILTER_READY,
    FLOW_FILTER_SLOTS, FLOW_FILTER_SOURCES, FLOW_FILTER_UNCONFIRMED, FilterSlot,
    flow_filter_destination, flow_filter_source, flow_filter_unconfirmed, fold_ipv6, map_names,
};

use super::{
    mapped_words::{MappedWords, MappedWordsError},
    pins,
};

/// The filter's words, mapped into this process.
struct Mapped(MappedWords);

/// Which of a family's two conntrack tables an entry is in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Table {
    Main,
    Unconfirmed,
}

impl Mapped {
    fn open(pin_dir: &Path) -> Result<Self, MappedWordsError> {
        MappedWords::open_pin(pin_dir, map_names::FLOW_FILTER, FLOW_FILTER_ENTRIES).map(Self)
    }

    fn set_ready(&self, ready: bool) {
        self.word(FLOW_FILTER_READY)
            .store(u64::from(ready), Ordering::SeqCst);
    }

    /// Marks the slots of an entry's key, as the programs do: its destination for a forward
    /// entry (the frontend), also among the unconfirmed ones for an entry in an
    /// unconfirmed table; its source for a reply entry (the backend).
    fn mark<A>(&self, key: &CtKey<A>, table: Table, fold: impl Fn(&A) -> u32) {
        if key.direction != CT_FORWARD {
            self.set(flow_filter_source(
                fold(&key.source),
                key.source_port,
                key.protocol,
            ));
            return;
        }
        let (frontend, port, protocol) =
            (fold(&key.destination), key.destination_port, key.protocol);
        self.set(flow_filter_destination(frontend, port, protocol));
        if table == Table::Unconfirmed {
            self.set(flow_filter_unconfirmed(frontend, port, protocol));
        }
    }

    fn set(&self, slot: FilterSlot) {
        self.word(slot.word).fetch_or(slot.bit, Ordering::Relaxed);
    }

    fn word(&self, index: u32) -> &AtomicU64 {
        self.0.word(index)
    }
}

/// Makes the programs look up every packet until [`seed`] runs: called at load, before any
/// program of this load is attached.
pub fn distrust(pin_dir: &Path) -> Result<(), MappedWordsError> {
    Mapped::open(pin_dir)?.set_ready(false);
    Ok(())
}

/// Makes the programs still on the retired flow filter `name` (an older layout's, pinned by
/// an older agent) look up every packet: this load's programs mark only the current
/// filter, so the retired one's slots miss their flows. Called before its pin goes.
pub fn distrust_retired(pin_dir: &Path, name: &'static str) -> Result<(), MappedWordsError> {
    let ready: MappedWords = MappedWords::open_pin(pin_dir, name, FLOW_FILTER_READY + 1)?;
    ready.word(FLOW_FILTER_READY).store(0, Ordering::SeqCst);
    Ok(())
}

/// Rebuilds the filter from the conntrack tables, then lets the programs trust it: every
/// bit cleared (so that bits of flows long gone do not pile up), then the slots of every
/// entry marked. Called once this load's programs replaced every earlier one (attached,
/// and the resized tables' entries carried over), while the filter is distrusted: a bit the
/// clearing removes that still matters belongs to an entry already in the tables, which the
/// walk after it marks again, and the programs mark every flow they make after it. Returns how many
/// entries were read.
pub fn seed(pin_dir: &Path) -> Result<usize, MappedWordsError> {
    let filter = Mapped::open(pin_dir)?;
    for word in FLOW_FILTER_DESTINATIONS.start..FLOW_FILTER_UNCONFIRMED.end {
        filter.word(word).store(0, Ordering::Relaxed);
    }
    // The unconfirmed tables first: a flow confirmed meanwhile moves to its main table, which
    // is walked after; a walk the other way round could miss it in both.
    let mut entries = 0;
    for (name, table) in [
        (map_names::CONNTRACK_NEW, Table::Unconfirmed),
        (map_names::CONNTRACK, Table::Main),
    ] {
        entries += filter.mark_table::<u32>(pin_dir, name, table, |address| *address)?;
    }
    for (name, table) in [
        (map_names::CONNTRACK_NEW6, Table::Unconfirmed),
        (map_names::CONNTRACK6, Table::Main),
    ] {
        entries += filter.mark_table(pin_dir, name, table, fold_ipv6)?;
    }
    filter.set_ready(true);
    Ok(entries)
}

/// How full the filter is, for `socklb inspect`: the more slots are marked, the more
/// packets of no flow are looked up all the same.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Fill {
    /// Whether the programs trust it (else they look up every packet).
    pub ready: bool,
    /// Slots per direction.
    pub slots: u32,
    /// Marked slots of frontends with flows, and of their backends.
    pub frontends: u32,
    pub backends: u32,
    /// Marked slots of frontends with flows made in an unconfirmed table: flows from
    /// outside, and pods' SNATed flows or those whose reply key another flow held.
    pub unconfirmed: u32,
}

/// The filter's [`Fill`]; `None` when it is not pinned (an agent from before it).
pub fn fill(pin_dir: &Path) -> Result<Option<Fill>, MappedWordsError> {
    if !pins::map_pin(pin_dir, map_names::FLOW_FILTER).exists() {
        return Ok(None);
    }
    let filter = Mapped::open(pin_dir)?;
    let marked = |words: Range<u32>| -> u32 {
        words
            .map(|word| filter.word(word).load(Ordering::Relaxed).count_ones())
            .sum()
    };
    Ok(Some(Fill {
        ready: filter.word(FLOW_FILTER_READY).load(Ordering::Relaxed) != 0,
        slots: FLOW_FILTER_SLOTS,
        frontends: marked(FLOW_FILTER_DESTINATIONS),
        backends: marked(FLOW_FILTER_SOURCES),
        unconfirmed: marked(FLOW_FILTER_UNCONFIRMED),
    }))
}

impl Mapped {
    /// Marks the slots of every key of a pinned conntrack table; how many it read. Keys of
    /// an LRU map may go while it is walked: a vanished key is skipped (its entry is gone,
    /// and needs no slot).
    fn mark_table<A>(
        &self,
        pin_dir: &Path,
        name: &'static str,
        table: Table,
        fold: impl Fn(&A) -> u32,
    ) -> Result<usize, MappedWordsError>
    where
        CtKey<A>: aya::Pod,
        CtEntry<A>: aya::Pod,
    {
        let error = |source| MappedWordsError::Open { name, source };
        let map = MapData::from_pin(pins::map_pin(pin_dir, name)).map_err(error)?;
        let entries: HashMap<MapData, CtKey<A>, CtEntry<A>> =
            Map::HashMap(map).try_into().map_err(error)?;
        let mut read = 0;
        for key in entries.keys().filter_map(Result::ok) {
            self.mark(&key, table, &fold);
            read += 1;
        }
        Ok(read)
    }
}
