//! Maglev consistent hashing (Eisenbud et al., NSDI 2016) for traffic from outside the node:
//! which backend slot each position of a frontend's lookup table holds. Pure; the Maglev
//! map's writer (`maps::maglev`) writes the tables.
//!
//! Every node computes the same table from the same backends (named `address:port`, order
//! irrelevant), so a flow lands on the same backend through any node (README, "Traffic
//! from outside the node (TC)").
//! The table holds *slots*, never ids, so that a stale entry can only name a slot of the
//! same frontend (the program falls back to a random slot if it is out of range).
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::frontend::BackendAddr;

/// Table sizes offered: primes, so that every skip visits every position.
pub const TABLE_SIZES: [u32; 8] = [251, 509, 1021, 2039, 4093, 8191, 16381, 32749];

/// The Maglev table of `names`: for each of `size` positions, the index of its backend in
/// `names`. Empty when there is no backend. Pure; `size` must be prime (see TABLE_SIZES).
pub fn table(names: &[String], size: u32) -> Vec<usize> {
    let size = size as usize;
    if names.is_empty() || size == 0 {
        return Vec::new();
    }
    let permutation: Vec<(usize, usize)> = names
        .iter()
        .map(|name| {
            let offset = xxh3_64_with_seed(name.as_bytes(), 0) as usize % size;
            let skip = xxh3_64_with_seed(name.as_bytes(), 1) as usize % (size - 1).max(1) + 1;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0usize; names.len()];
    let mut entries: Vec<Option<usize>> = vec![None; size];
    let mut filled = 0;
    // Each backend in turn takes its next preferred free position, until all are taken.
    'fill: loop {
        for (backend, (offset, skip)) in permutation.iter().enumerate() {
            let mut position = (offset + next[backend] * skip) % size;
            while entries[position].is_some() {
                next[backend] += 1;
                position = (offset + next[backend] * skip) % size;
            }
            entries[position] = Some(backend);
            next[backend] += 1;
            filled += 1;
            if filled == size {
                break 'fill;
            }
        }
    }
    entries.into_iter().map(|e| e.unwrap_or(0)).collect()
}

/// The slot (1-based) at each of `size` positions of the table of a frontend whose backends
/// are `by_slot` (slot 1 first): backends sorted by name, so that every node agrees.
pub fn slots(by_slot: &[BackendAddr], size: u32) -> Vec<u32> {
    let mut named: Vec<(String, u32)> = by_slot
        .iter()
        .enumerate()
        .map(|(index, b)| (format!("{}:{}", b.address, b.port), index as u32 + 1))
        .collect();
    named.sort();
    let names: Vec<String> = named.iter().map(|(name, _)| name.clone()).collect();
    table(&names, size)
        .into_iter()
        .map(|backend| named[backend].1)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(count: usize) -> Vec<String> {
        (0..count)
            .map(|i| format!("10.0.{}.{}:8080", i / 250, i % 250 + 1))
            .collect()
    }

    #[test]
    fn every_backend_gets_a_near_equal_share() {
        let names = names(7);
        let table = table(&names, 4093);
        assert_eq!(table.len(), 4093);
        let mut shares = vec![0usize; names.len()];
        for backend in &table {
            shares[*backend] += 1;
        }
        let (least, most) = (shares.iter().min(), shares.iter().max());
        assert!(
            most.zip(least).is_some_and(|(m, l)| m - l <= 1),
            "round-robin filling keeps shares within one: {shares:?}"
        );
    }

    #[test]
    fn removing_one_backend_of_ten_moves_few_positions() {
        let before = names(10);
        let after: Vec<String> = before
            .iter()
            .filter(|n| *n != &before[3])
            .cloned()
            .collect();
        let old = table(&before, 16381);
        let new = table(&after, 16381);
        let moved = old
            .iter()
            .zip(&new)
            .filter(|(o, n)| before[**o] != after[**n])
            .count();
        // The removed backend's tenth must move; Maglev moves little else.
        let share = 16381 / 10;
        assert!(moved >= share, "{moved}");
        assert!(
            moved < share * 2,
            "{moved} positions moved, expected about {share}"
        );
    }

    #[test]
    fn the_table_depends_on_the_backends_only() {
        assert_eq!(table(&names(3), 251), table(&names(3), 251));
        assert!(table(&[], 251).is_empty());
        assert_eq!(table(&names(1), 251), vec![0; 251]);
    }
}
