//! The slot array: every frontend's backend slots, as backend ids at the range its master
//! entry names, mapped into the agent and written with plain stores.
//!
//! A frontend's range holds a power of two of slots, so that a Service growing by an
//! endpoint rarely moves. One that outgrows its range moves: the new range is filled (its
//! slots still being written to the old one too, for lookups that read the old master),
//! the master entry then names it, and the old range is freed at the next apply, when no
//! lookup can be on its way there any more (as the writer deletes uncovered slots).
use std::{
    collections::HashMap,
    ops::Range,
    sync::atomic::{AtomicU32, Ordering},
};

use range_alloc::RangeAllocator;

use crate::{desired::Frontend, kernel::mapped_words::MappedWords};

/// Where a frontend's slots are: slot `n` (`1..=room`) is index `first + n - 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRange {
    pub first: u32,
    pub room: u32,
}

impl SlotRange {
    fn indexes(self) -> Range<u32> {
        self.first..self.first + self.room
    }

    fn overlaps(self, other: Self) -> bool {
        self.first < other.first + other.room && other.first < self.first + self.room
    }

    /// The index of slot `slot`; `None` beyond the range.
    pub fn index(self, slot: u16) -> Option<u32> {
        let slot = u32::from(slot);
        (1..=self.room)
            .contains(&slot)
            .then(|| self.first + slot - 1)
    }
}

/// The array has no range of the length a frontend needs.
#[derive(Debug, thiserror::Error)]
#[error(
    "the slot array has no {needed} free slots in a row ({free} free in all): raise \
     --max-service-entries"
)]
pub struct SlotsFull {
    pub needed: u32,
    pub free: u32,
}

/// Where the slots' ids live: the mapped slot array (or plain memory in tests).
pub trait SlotWords {
    fn len(&self) -> u32;
    fn load(&self, index: u32) -> u32;
    fn store(&self, index: u32, id: u32);
}

impl SlotWords for MappedWords<AtomicU32> {
    fn len(&self) -> u32 {
        MappedWords::len(self)
    }

    fn load(&self, index: u32) -> u32 {
        self.word(index).load(Ordering::Relaxed)
    }

    /// The programs read an id with one load: a store is all it takes. Release, so that
    /// the backend entry written before is seen with the id on any CPU.
    fn store(&self, index: u32, id: u32) {
        self.word(index).store(id, Ordering::Release);
    }
}

/// The slot array and the ranges the frontends hold in it.
pub struct Slots<W = MappedWords<AtomicU32>> {
    words: W,
    free: RangeAllocator<u32>,
    /// The range each frontend's slots are written to.
    ranges: HashMap<Frontend, SlotRange>,
    /// The range each frontend's master entry names: the one lookups read, written too
    /// while the frontend moves.
    named: HashMap<Frontend, SlotRange>,
    /// Ranges no master names any more, freed at the next apply.
    retired: Vec<SlotRange>,
}

impl<W: SlotWords> Slots<W> {
    /// The array, all of it free.
    pub fn new(words: W) -> Self {
        let free = RangeAllocator::new(0..words.len());
        Self {
            words,
            free,
            ranges: HashMap::new(),
            named: HashMap::new(),
            retired: Vec::new(),
        }
    }

    pub fn len(&self) -> u32 {
        self.words.len()
    }

    /// Slots that are not free, in all.
    #[cfg(test)]
    fn used(&self) -> u32 {
        self.len() - self.free.total_available()
    }

    /// Takes the ranges the master entries read back name, and frees the rest: what the
    /// maps hold is what this agent (or the one before it) wrote. Ranges that overlap one
    /// taken before, or reach past the array, are not taken (their frontends move at their
    /// next write). Ranges retired and not yet freed stay so.
    pub fn adopt(&mut self, masters: impl IntoIterator<Item = (Frontend, SlotRange)>) {
        let mut taken: Vec<(Frontend, SlotRange)> = masters
            .into_iter()
            .filter(|(_, range)| range.room > 0)
            .filter(|(_, range)| {
                range
                    .first
                    .checked_add(range.room)
                    .is_some_and(|end| end <= self.len())
            })
            .collect();
        taken.sort_by_key(|(_, range)| range.first);
        self.ranges.clear();
        let mut end = 0;
        for (frontend, range) in taken {
            let overlaps_retired = self.retired.iter().any(|r| r.overlaps(range));
            if range.first >= end && !overlaps_retired {
                end = range.first + range.room;
                self.ranges.insert(frontend, range);
            }
        }
        self.named.clone_from(&self.ranges);
        self.rebuild_free();
    }

    /// Takes over the state of `old`, the slot array before the maps grew: its ranges, and
    /// its ids if `copy` (a new, larger array; else this maps the same one).
    pub fn take_over<O: SlotWords>(&mut self, old: &Slots<O>, copy: bool) {
        if copy {
            for index in 0..old.len().min(self.len()) {
                self.store(index, old.at(index));
            }
        }
        self.ranges.clone_from(&old.ranges);
        self.named.clone_from(&old.named);
        self.retired.clone_from(&old.retired);
        self.rebuild_free();
    }

    /// The free ranges: all the array but the ranges written, named or retired.
    fn rebuild_free(&mut self) {
        let mut held: Vec<SlotRange> = self
            .ranges
            .values()
            .chain(self.named.values())
            .chain(&self.retired)
            .copied()
            .collect();
        held.sort_by_key(|range| range.first);
        self.free = RangeAllocator::new(0..self.len());
        // All of it taken, then what lies between the held ranges given back.
        if self.len() == 0 || self.free.allocate_range(self.len()).is_err() {
            return;
        }
        let mut at = 0;
        for range in held {
            if range.first > at {
                self.free.free_range(at..range.first);
            }
            at = at.max(range.first + range.room);
        }
        if self.len() > at {
            self.free.free_range(at..self.len());
        }
    }

    /// Frees the ranges retired since the last call: called as an apply starts.
    pub fn free_retired(&mut self) {
        for range in std::mem::take(&mut self.retired) {
            self.free.free_range(range.indexes());
        }
    }

    /// The range `frontend`'s master entry is to name.
    pub fn range(&self, frontend: &Frontend) -> Option<SlotRange> {
        self.ranges.get(frontend).copied()
    }

    /// Makes room for `count` slots of `frontend` before they are written (its master
    /// entry will count them): one move, not one per power of two on the way.
    pub fn reserve(&mut self, frontend: &Frontend, count: u16) -> Result<(), SlotsFull> {
        let room = self.range(frontend).map_or(0, |range| range.room);
        if count > 0 && u32::from(count) > room {
            self.move_to_larger(frontend, count)?;
        }
        Ok(())
    }

    /// Writes backend `id` into `frontend`'s slot `slot` (`1..`): moves the frontend to a
    /// larger range first if its own ends before.
    pub fn put(&mut self, frontend: &Frontend, slot: u16, id: u32) -> Result<(), SlotsFull> {
        let range = match self.ranges.get(frontend) {
            Some(range) if range.index(slot).is_some() => *range,
            _ => self.move_to_larger(frontend, slot)?,
        };
        if let Some(index) = range.index(slot) {
            self.store(index, id);
        }
        // A lookup reads the range the master names until it names the new one.
        if let Some(index) = self
            .named
            .get(frontend)
            .filter(|named| **named != range)
            .and_then(|named| named.index(slot))
        {
            self.store(index, id);
        }
        Ok(())
    }

    /// Clears `frontend`'s slot `slot` if its range holds it (a slot above a lowered count).
    pub fn clear(&mut self, frontend: &Frontend, slot: u16) {
        if let Some(index) = self.range(frontend).and_then(|range| range.index(slot)) {
            self.store(index, 0);
        }
    }

    /// The master entry was written, naming the frontend's range (or none): the range it
    /// named before is retired.
    pub fn named(&mut self, frontend: &Frontend) {
        let now = self.range(frontend);
        let before = match now {
            Some(range) => self.named.insert(*frontend, range),
            None => self.named.remove(frontend),
        };
        self.retired
            .extend(before.filter(|before| Some(*before) != now));
    }

    /// The frontend's master entry is gone: its ranges are retired.
    pub fn remove(&mut self, frontend: &Frontend) {
        let named = self.named.remove(frontend);
        let written = self.ranges.remove(frontend);
        self.retired.extend(named);
        self.retired
            .extend(written.filter(|written| Some(*written) != named));
    }

    /// What `frontend`'s slot `slot` holds (0: nothing); `None` beyond its range.
    pub fn get(&self, frontend: &Frontend, slot: u16) -> Option<u32> {
        let index = self.range(frontend)?.index(slot)?;
        Some(self.words.load(index))
    }

    /// The id at `index`; 0 past the array.
    pub fn at(&self, index: u32) -> u32 {
        if index < self.len() {
            self.words.load(index)
        } else {
            0
        }
    }

    fn store(&self, index: u32, id: u32) {
        self.words.store(index, id);
    }

    /// A range of room for `slot` slots (a power of two), holding the slots of the
    /// frontend's current range. That range is freed at once unless the master names it
    /// (no lookup reads it then).
    fn move_to_larger(&mut self, frontend: &Frontend, slot: u16) -> Result<SlotRange, SlotsFull> {
        let room = u32::from(slot).next_power_of_two();
        let first = self
            .free
            .allocate_range(room)
            .map_err(|error| SlotsFull {
                needed: room,
                free: error.fragmented_free_length,
            })?
            .start;
        let new = SlotRange { first, room };
        if let Some(current) = self.ranges.insert(*frontend, new) {
            for (from, to) in current.indexes().zip(new.indexes()) {
                self.store(to, self.at(from));
            }
            if self.named.get(frontend) != Some(&current) {
                self.free.free_range(current.indexes());
            }
        }
        Ok(new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{Protocol, Scope};

    impl SlotWords for Vec<AtomicU32> {
        fn len(&self) -> u32 {
            u32::try_from(<[AtomicU32]>::len(self)).expect("a small array")
        }

        fn load(&self, index: u32) -> u32 {
            self[index as usize].load(Ordering::Relaxed)
        }

        fn store(&self, index: u32, id: u32) {
            self[index as usize].store(id, Ordering::Relaxed);
        }
    }

    fn array(len: u32) -> Slots<Vec<AtomicU32>> {
        Slots::new((0..len).map(|_| AtomicU32::new(0)).collect())
    }

    fn frontend(last: u8) -> Frontend {
        Frontend {
            address: std::net::Ipv4Addr::new(10, 96, 0, last).into(),
            port: 80,
            protocol: Protocol::Tcp,
            scope: Scope::Internal,
        }
    }

    fn ids(slots: &Slots<Vec<AtomicU32>>, frontend: &Frontend, count: u16) -> Vec<u32> {
        (1..=count)
            .map(|slot| slots.get(frontend, slot).expect("a slot in range"))
            .collect()
    }

    #[test]
    fn a_growing_frontend_moves_to_a_power_of_two_and_its_old_range_serves_until_named() {
        let mut slots = array(16);
        let web = frontend(1);
        slots.put(&web, 1, 11).expect("room");
        slots.named(&web);
        let first = slots.range(&web).expect("a range");
        assert_eq!(first.room, 1);
        for (slot, id) in [(2, 12), (3, 13)] {
            slots.put(&web, slot, id).expect("room");
        }
        let moved = slots.range(&web).expect("a range");
        assert_eq!(moved.room, 4);
        assert_eq!(ids(&slots, &web, 3), [11, 12, 13]);
        // The master still names the first range: slot 1 is written there too.
        slots.put(&web, 1, 21).expect("room");
        assert_eq!(slots.at(first.first), 21);
        slots.named(&web);
        // Retired, not free: a lookup may still read it until the next apply.
        assert_eq!(slots.used(), 1 + 4);
        slots.free_retired();
        assert_eq!(slots.used(), 4);
        assert_eq!(ids(&slots, &web, 3), [21, 12, 13]);
    }

    #[test]
    fn a_removed_frontend_s_range_is_freed_only_at_the_next_apply() {
        let mut slots = array(4);
        let (web, dns) = (frontend(1), frontend(2));
        slots.reserve(&web, 4).expect("room");
        for slot in 1..=4 {
            slots.put(&web, slot, u32::from(slot)).expect("room");
        }
        slots.named(&web);
        slots.remove(&web);
        let full = slots
            .put(&dns, 1, 9)
            .expect_err("the range is retired, not free");
        assert_eq!(full.needed, 1);
        slots.free_retired();
        slots.put(&dns, 1, 9).expect("room at the next apply");
        assert_eq!(slots.get(&web, 1), None);
    }

    #[test]
    fn a_slot_above_a_lowered_count_is_cleared_within_the_range() {
        let mut slots = array(8);
        let web = frontend(1);
        for slot in 1..=3 {
            slots.put(&web, slot, 7).expect("room");
        }
        slots.clear(&web, 3);
        slots.clear(&web, 9);
        assert_eq!(ids(&slots, &web, 3), [7, 7, 0]);
    }

    #[test]
    fn adoption_takes_the_ranges_read_back_and_frees_the_gaps() {
        let mut slots = array(16);
        let (web, dns, bad, outside) = (frontend(1), frontend(2), frontend(3), frontend(4));
        slots.adopt([
            (web, SlotRange { first: 4, room: 4 }),
            (dns, SlotRange { first: 8, room: 2 }),
            // Overlaps web's: its frontend moves at its next write.
            (bad, SlotRange { first: 6, room: 2 }),
            (outside, SlotRange { first: 15, room: 2 }),
        ]);
        assert_eq!(slots.range(&web), Some(SlotRange { first: 4, room: 4 }));
        assert_eq!(slots.range(&dns), Some(SlotRange { first: 8, room: 2 }));
        assert_eq!((slots.range(&bad), slots.range(&outside)), (None, None));
        assert_eq!(slots.used(), 6);
        // The gap before web's range serves a new frontend.
        slots.put(&bad, 1, 5).expect("room");
        let range = slots.range(&bad).expect("a range");
        assert!(
            range.first + range.room <= 4 || range.first >= 10,
            "{range:?}"
        );
    }

    #[test]
    fn a_larger_array_takes_over_the_ranges_and_their_ids() {
        let mut small = array(4);
        let web = frontend(1);
        for slot in 1..=2 {
            small.put(&web, slot, u32::from(slot) + 40).expect("room");
        }
        small.named(&web);
        let mut large = array(32);
        large.take_over(&small, true);
        assert_eq!(large.range(&web), small.range(&web));
        assert_eq!(ids(&large, &web, 2), [41, 42]);
        assert_eq!(large.used(), 2);
    }

    /// Below its flag's bound, growth keeps each family's service entries (masters and
    /// slots) within three quarters of its map's size, and the array holds two slots per
    /// unit of that size; a frontend's room is less than twice its slots. So the rooms take
    /// at most three quarters of the array, and churn up to there must always find a range
    /// in a row (at 85%, most of these seeds do not: best fit over rooms of every size
    /// fragments).
    #[test]
    fn churn_with_rooms_up_to_three_quarters_of_the_array_always_finds_a_range() {
        const LEN: u32 = 4_096;
        for seed in 0..20 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut slots = array(LEN);
            let mut rooms = 0;
            for step in 0..20_000 {
                if step % 10 == 0 {
                    slots.free_retired(); // an apply starts
                }
                let web = frontend_numbered(rng.u16(0..400));
                let count = if rng.u8(0..10) == 0 {
                    0
                } else {
                    rng.u16(1..=200)
                };
                let room = slots.range(&web).map_or(0, |range| range.room);
                let new_room = match count {
                    0 => 0,
                    count => room.max(u32::from(count).next_power_of_two()),
                };
                if (rooms - room + new_room) * 4 > LEN * 3 {
                    continue;
                }
                rooms = rooms - room + new_room;
                if count == 0 {
                    slots.remove(&web);
                    continue;
                }
                slots
                    .reserve(&web, count)
                    .and_then(|()| (1..=count).try_for_each(|slot| slots.put(&web, slot, 1)))
                    .unwrap_or_else(|full| panic!("seed {seed}, step {step}: {full}"));
                slots.named(&web);
            }
        }
    }

    fn frontend_numbered(n: u16) -> Frontend {
        let [high, low] = n.to_be_bytes();
        Frontend {
            address: std::net::Ipv4Addr::new(10, 96, high, low).into(),
            ..frontend(0)
        }
    }
}
