//! Where each backend of a frontend sits in the service map's slots. Pure.
//!
//! Backends that stay keep their slot (so session-affinity entries stay valid and few
//! entries are written); new backends fill the holes left by removed ones, then append;
//! when the set shrinks, backends from the tail move into the remaining holes.
use std::collections::VecDeque;

// foldhash rather than std's SipHash: a first sync of 100,000 Services lays out 100,000
// frontends.
use hashbrown::HashSet;

/// The new slot contents (index 0 is slot 1) for a frontend whose slots held `old` and
/// that should now use `wanted` (backend ids, in preference order, duplicates ignored).
pub fn assign_slots(old: &[u32], wanted: &[u32]) -> Vec<u32> {
    let wanted_set: HashSet<u32> = wanted.iter().copied().collect();
    let mut kept = HashSet::new();
    let mut slots: Vec<Option<u32>> = old
        .iter()
        .map(|id| (wanted_set.contains(id) && kept.insert(*id)).then_some(*id))
        .collect();

    let mut queued = HashSet::new();
    let mut newcomers: VecDeque<u32> = wanted
        .iter()
        .copied()
        .filter(|id| !kept.contains(id) && queued.insert(*id))
        .collect();
    for slot in slots.iter_mut().filter(|slot| slot.is_none()) {
        match newcomers.pop_front() {
            Some(id) => *slot = Some(id),
            None => break,
        }
    }
    slots.extend(newcomers.into_iter().map(Some));

    // Fewer backends than before: close the holes with backends from the tail. Holes are
    // filled front to back, so the search goes on from the last one (linear, not
    // quadratic, for a large Service that lost many backends).
    let mut hole = 0;
    loop {
        while slots.last() == Some(&None) {
            slots.pop();
        }
        // `slots[hole]` was filled from a non-empty tail, so `hole` is within the slots.
        let Some(offset) = slots[hole..].iter().position(Option::is_none) else {
            break;
        };
        hole += offset;
        let last = slots.pop().flatten();
        slots[hole] = last;
    }
    slots.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::assign_slots;

    #[test]
    fn table() {
        // (old slots, wanted, expected slots)
        let rows: &[(&[u32], &[u32], &[u32])] = &[
            // new frontend: wanted order
            (&[], &[3, 1, 2], &[3, 1, 2]),
            // unchanged set in another order: nothing moves
            (&[1, 2, 3], &[3, 2, 1], &[1, 2, 3]),
            // grow: append
            (&[1, 2], &[1, 2, 3], &[1, 2, 3]),
            // replace one: the newcomer takes the hole
            (&[1, 2, 3], &[1, 4, 3], &[1, 4, 3]),
            // shrink from the middle: the tail moves into the hole
            (&[1, 2, 3, 4], &[1, 3, 4], &[1, 4, 3]),
            // shrink from the tail: nothing moves
            (&[1, 2, 3], &[1, 2], &[1, 2]),
            // remove all
            (&[1, 2, 3], &[], &[]),
            // duplicates in wanted are ignored
            (&[], &[5, 5, 6], &[5, 6]),
            // a stale duplicate in old keeps only its first slot
            (&[7, 7], &[7], &[7]),
            // a hole marker (0 = unreadable slot) gets refilled
            (&[1, 0, 3], &[1, 2, 3], &[1, 2, 3]),
            // two holes, one newcomer, tail moves into the other hole
            (&[1, 2, 3, 4, 5], &[1, 3, 5, 9], &[1, 9, 3, 5]),
        ];
        for (old, wanted, expected) in rows {
            assert_eq!(
                assign_slots(old, wanted),
                *expected,
                "old {old:?} wanted {wanted:?}"
            );
        }
    }

    #[test]
    fn every_wanted_backend_gets_exactly_one_slot() {
        for old_len in 0..6u32 {
            for wanted_len in 0..6u32 {
                let old: Vec<u32> = (1..=old_len).collect();
                let wanted: Vec<u32> = (3..3 + wanted_len).collect();
                let mut got = assign_slots(&old, &wanted);
                got.sort_unstable();
                let mut want = wanted.clone();
                want.sort_unstable();
                assert_eq!(got, want, "old {old:?} wanted {wanted:?}");
            }
        }
    }
}
