//! Puts prepared for batch updates: grouped by the map they go to, encoded as a batch, and
//! shared among threads when there are many.
use std::{os::fd::BorrowedFd, thread::JoinHandle};

use aya::Pod;
use socklb_abi::{Backend, Backend6, ServiceEntry, ServiceKey, ServiceKey6};

use super::encoding::{MapAddress, encode_backend, encode_key, encode_master};
use crate::maps::{
    batch::{self, BatchError},
    slots::SlotRange,
    writer::{Op, SlotValue},
};

/// A put into a map, as held or batched: the writer's op, and for a master entry the slot
/// range it names (known once the frontend's slots are written, which come before).
#[derive(Clone, Debug)]
pub(super) struct Put {
    pub(super) op: Op,
    pub(super) range: Option<SlotRange>,
}

/// A map's puts given back by the thread that wrote them, and how it went ([`put_run`]).
pub(super) type WrittenRun = (Vec<Put>, Option<Result<(), BatchError>>);

/// Which map a put goes to, for batching consecutive puts into one map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Run {
    Services { v6: bool },
    Backends { v6: bool },
}

impl Run {
    pub(super) fn of(op: &Op) -> Option<Self> {
        match op {
            Op::PutService {
                key,
                value: SlotValue::Master(_),
            } => Some(Self::Services {
                v6: key.frontend.address.is_ipv6(),
            }),
            Op::PutBackend { backend, .. } => Some(Self::Backends {
                v6: backend.address.is_ipv6(),
            }),
            _ => None,
        }
    }
}

/// The entries of a run of master-entry puts; `None` if one does not encode for this
/// family (the one-by-one path reports it).
fn master_entries<A: MapAddress>(puts: &[Put]) -> Option<Vec<(ServiceKey<A>, ServiceEntry)>> {
    puts.iter()
        .map(|put| match &put.op {
            Op::PutService {
                key,
                value: SlotValue::Master(master),
            } => Some((encode_key::<A>(key)?, encode_master(master, put.range))),
            _ => None,
        })
        .collect()
}

fn backend_entries<A: MapAddress>(puts: &[Put]) -> Option<Vec<(u32, Backend<A>)>> {
    puts.iter()
        .map(|put| match &put.op {
            Op::PutBackend {
                id,
                backend,
                protocol,
            } => Some((*id, encode_backend::<A>(backend, *protocol)?)),
            _ => None,
        })
        .collect()
}

/// One batch update for `puts` (all into `run`'s map, `map`): `None` if one of them
/// does not encode.
pub(super) fn put_run(
    map: BorrowedFd<'_>,
    run: Run,
    puts: &[Put],
) -> Option<Result<(), BatchError>> {
    match run {
        Run::Services { v6: false } => {
            put_batch::<ServiceKey, ServiceEntry>(map, master_entries(puts))
        }
        Run::Services { v6: true } => {
            put_batch::<ServiceKey6, ServiceEntry>(map, master_entries(puts))
        }
        Run::Backends { v6: false } => put_batch::<u32, Backend>(map, backend_entries(puts)),
        Run::Backends { v6: true } => put_batch::<u32, Backend6>(map, backend_entries(puts)),
    }
}

/// Fewer puts than this are not shared among threads: a thread costs more than they do.
const SHARE_MIN: usize = 4096;

/// `ops` in at most `threads` shares of about equal length (none below [`SHARE_MIN`]
/// unless there are fewer), in order, none empty.
pub(super) fn shares<T>(mut ops: Vec<T>, threads: usize) -> Vec<Vec<T>> {
    let count = threads.min(ops.len() / SHARE_MIN).max(1);
    let share = ops.len().div_ceil(count);
    let mut shares = Vec::new();
    while ops.len() > share {
        let rest = ops.split_off(share);
        shares.push(std::mem::replace(&mut ops, rest));
    }
    if !ops.is_empty() {
        shares.push(ops);
    }
    shares
}

/// One batch update of `entries` into `map`.
fn put_batch<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    entries: Option<Vec<(K, V)>>,
) -> Option<Result<(), BatchError>> {
    let (keys, values): (Vec<K>, Vec<V>) = entries?.into_iter().unzip();
    Some(batch::update(map, &keys, &values))
}

/// A thread's result; its panic goes on here.
pub(super) fn joined<T>(thread: JoinHandle<T>) -> T {
    thread
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    #[test]
    fn held_puts_are_shared_among_threads_in_order_and_small_runs_stay_whole() {
        let deletes = |range: std::ops::Range<u32>| -> Vec<Op> {
            range
                .map(|id| Op::DeleteBackend {
                    id,
                    address: IpAddr::V4(Ipv4Addr::LOCALHOST),
                })
                .collect()
        };
        let ids = |shares: &[Vec<Op>]| -> Vec<Vec<u32>> {
            let id = |op: &Op| match op {
                Op::DeleteBackend { id, .. } => *id,
                _ => unreachable!("only deletes were shared"),
            };
            shares
                .iter()
                .map(|share| share.iter().map(id).collect())
                .collect()
        };
        let rows: [(u32, usize, &[usize]); 5] = [
            (20_000, 2, &[10_000, 10_000]),
            (20_001, 2, &[10_001, 10_000]),
            (20_000, 3, &[6_667, 6_667, 6_666]),
            (SHARE_MIN as u32 * 2 - 1, 2, &[SHARE_MIN * 2 - 1]),
            (100, 8, &[100]),
        ];
        for (len, threads, lengths) in rows {
            let shares = shares(deletes(0..len), threads);
            let got: Vec<usize> = shares.iter().map(Vec::len).collect();
            assert_eq!(got, lengths, "{len} puts, {threads} threads");
            let flat: Vec<u32> = ids(&shares).concat();
            assert_eq!(flat, (0..len).collect::<Vec<_>>(), "in order");
        }
        assert!(shares(Vec::<Op>::new(), 2).is_empty());
    }
}
