//! Map commands aya does not offer. Writing and reading many entries of one map in one
//! system call (`BPF_MAP_UPDATE_BATCH`, `BPF_MAP_LOOKUP_BATCH`, Linux 5.6): a first sync of
//! 100,000 Services writes two million entries, and a restarted agent reads them back; one
//! call per entry (two to read one) cost each about five to ten seconds. Reads go a chunk
//! at a time, so that the resyncs' walk through the maps can stop between two chunks. And
//! taking one entry out (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`), for the conntrack GC to see
//! what it removed.
use std::{
    io,
    os::fd::{AsFd as _, AsRawFd, BorrowedFd},
};

use aya::{
    Pod,
    maps::{Array, HashMap, IterableMap, MapData, MapError},
};

/// `union bpf_attr` for the batch commands (UAPI layout).
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `BPF_MAP_LOOKUP_BATCH` and `BPF_MAP_UPDATE_BATCH` in `enum bpf_cmd`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` in `enum bpf_cmd` (hash maps: Linux 5.14).
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;

/// `union bpf_attr` for the commands on one element (UAPI layout).
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Entries read per call.
const READ_CHUNK: usize = 8192;

/// The kernel's own "not supported" (not in libc): what it answers for a map type without
/// batch operations.
const ENOTSUPP: i32 = 524;

/// Why a batch stopped: how many of its entries were written (or read) before, and the error.
#[derive(Debug)]
pub struct BatchError {
    pub done: usize,
    pub error: io::Error,
}

impl BatchError {
    /// The kernel has no batch updates for this map (older than 5.6, or another map type):
    /// the caller writes the entries one by one.
    pub fn unsupported(&self) -> bool {
        self.done == 0
            && matches!(
                self.error.raw_os_error(),
                Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP)
            )
    }
}

/// Runs a batch `command` on `attr`; the kernel writes back how far it got in `attr.count`.
///
/// # Safety
/// `attr.keys` and `attr.values` must point to `attr.count` elements of the map's key and
/// value sizes, writable for a lookup, and `in_batch`/`out_batch` to u32s or be 0.
unsafe fn batch(command: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
    // SAFETY: `attr` has the layout the command reads and its size is passed; the buffers
    // it names are the caller's promise.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_mut(attr),
            size_of::<BatchAttr>(),
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What a [`take`] found.
#[derive(Debug)]
pub enum Taken<V> {
    /// The entry, now deleted.
    Was(V),
    /// No entry under the key.
    Absent,
    /// The kernel cannot take entries out of this map (older than 5.14).
    Unsupported,
}

/// Reads the entry under `key` of `map` and deletes it, in one step: no writer can come in
/// between.
pub fn take<K: Copy, V: Copy + Default>(map: BorrowedFd<'_>, key: &K) -> io::Result<Taken<V>> {
    let fd =
        u32::try_from(map.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    let mut value = V::default();
    let mut attr = ElemAttr {
        map_fd: fd,
        pad: 0,
        key: std::ptr::from_ref(key) as u64,
        value: std::ptr::from_mut(&mut value) as u64,
        flags: 0,
    };
    // SAFETY: `key` and `value` are of the map's key and value sizes (the caller's types are
    // the map's); the kernel reads the one and writes the other.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_AND_DELETE_ELEM,
            std::ptr::from_mut(&mut attr),
            size_of::<ElemAttr>(),
        )
    };
    if result == 0 {
        return Ok(Taken::Was(value));
    }
    let error = io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ENOENT) => Ok(Taken::Absent),
        Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP) => Ok(Taken::Unsupported),
        _ => Err(error),
    }
}

/// Inserts or replaces `keys[i]` with `values[i]` in order, as that many updates would.
pub fn update<K: Copy, V: Copy>(
    map: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), BatchError> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    let fd = u32::try_from(map.as_raw_fd()).map_err(|_| BatchError {
        done: 0,
        error: io::Error::from_raw_os_error(libc::EBADF),
    })?;
    let mut written = 0;
    while written < keys.len() {
        let rest = keys.len() - written;
        let mut attr = BatchAttr {
            in_batch: 0,
            out_batch: 0,
            keys: keys[written..].as_ptr() as u64,
            values: values[written..].as_ptr() as u64,
            count: u32::try_from(rest).unwrap_or(u32::MAX),
            map_fd: fd,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `keys` and `values` hold `count` elements of the map's key and value
        // sizes (the caller's types are the map's), and the kernel only reads them.
        let result = unsafe { batch(BPF_MAP_UPDATE_BATCH, &mut attr) };
        // The kernel says in `count` how many it wrote, also when it stopped early.
        let done = attr.count as usize;
        if let Err(error) = result {
            return Err(BatchError {
                done: written + done,
                error,
            });
        }
        // A kernel that writes none without an error would loop forever.
        if done == 0 {
            return Err(BatchError {
                done: written,
                error: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        written += done;
    }
    Ok(())
}

/// Reads one chunk (at most [`READ_CHUNK`] entries) of a map from the position `from` on
/// (`None`: its start) into `entries`: a bucket of a hash map (whole buckets are read), the
/// last index read of an array. Returns where the next chunk begins, `None` at the map's
/// end: a walk can stop between two calls and go on later.
pub fn read_chunk<K: Copy + Default, V: Copy + Default>(
    map: BorrowedFd<'_>,
    from: Option<u32>,
    entries: &mut Vec<(K, V)>,
) -> Result<Option<u32>, BatchError> {
    let fd = u32::try_from(map.as_raw_fd()).map_err(|_| BatchError {
        done: 0,
        error: io::Error::from_raw_os_error(libc::EBADF),
    })?;
    let mut keys = vec![K::default(); READ_CHUNK];
    let mut values = vec![V::default(); READ_CHUNK];
    // The hash map's position: a bucket number the kernel hands back after each call.
    let position = from.unwrap_or(0);
    let mut next = 0u32;
    let mut attr = BatchAttr {
        in_batch: if from.is_some() {
            std::ptr::from_ref(&position) as u64
        } else {
            0
        },
        out_batch: std::ptr::from_mut(&mut next) as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: READ_CHUNK as u32,
        map_fd: fd,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: `keys` and `values` have room for `count` elements of the map's key and
    // value sizes (the caller's types are the map's), and the positions are u32, as hash
    // maps and arrays use.
    let result = unsafe { batch(BPF_MAP_LOOKUP_BATCH, &mut attr) };
    let read = (attr.count as usize).min(READ_CHUNK);
    entries.extend(
        keys[..read]
            .iter()
            .copied()
            .zip(values[..read].iter().copied()),
    );
    match result {
        // The end of the map.
        Err(error) if error.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(error) => Err(BatchError { done: read, error }),
        Ok(()) => Ok(Some(next)),
    }
}

/// Entries of one map read back, and where the next chunk begins (`None`: the map's end).
pub type Chunk<K, V> = (Vec<(K, V)>, Option<u32>);

/// One chunk of `map` from the position `from` on ([`read_chunk`]). A kernel without batch
/// lookups gives the whole map at once, read key by key.
pub fn chunk<K: Pod + Default, V: Pod + Default>(
    map: &HashMap<MapData, K, V>,
    from: Option<u32>,
) -> Result<Chunk<K, V>, MapError> {
    let mut entries = Vec::new();
    match read_chunk(IterableMap::map(map).fd().as_fd(), from, &mut entries) {
        Ok(next) => Ok((entries, next)),
        Err(error) if error.unsupported() => Ok((map.iter().collect::<Result<_, _>>()?, None)),
        Err(error) => Err(MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_lookup_batch",
            io_error: error.error,
        })),
    }
}

/// One chunk of the array `map` from the position `from` on, as [`chunk`] reads a hash
/// map; index by index where the kernel has no batch lookups.
pub fn array_chunk<V: Pod + Default>(
    map: &Array<MapData, V>,
    from: Option<u32>,
) -> Result<Chunk<u32, V>, MapError> {
    let mut entries = Vec::new();
    match read_chunk(IterableMap::map(map).fd().as_fd(), from, &mut entries) {
        Ok(next) => Ok((entries, next)),
        Err(error) if error.unsupported() => {
            let indexes = 0..map.len();
            let read = indexes.map(|index| Ok((index, map.get(&index, 0)?)));
            Ok((read.collect::<Result<_, MapError>>()?, None))
        }
        Err(error) => Err(MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_lookup_batch",
            io_error: error.error,
        })),
    }
}

/// Every entry of `map`, a chunk per call: a tenth of the cost of a walk key by key (two
/// calls per entry).
pub fn entries<K: Pod + Default, V: Pod + Default>(
    map: &HashMap<MapData, K, V>,
) -> Result<Vec<(K, V)>, MapError> {
    let mut entries = Vec::new();
    let mut from = None;
    loop {
        let (chunk, next) = chunk(map, from)?;
        entries.extend(chunk);
        match next {
            Some(next) => from = Some(next),
            None => return Ok(entries),
        }
    }
}
