//! An mmapable BPF array of 64-bit words mapped into the agent, for the bit filters the TC
//! programs read (the flow filter, the frontend filter): the agent reads and marks their
//! words in place, with no syscall per word.
use std::{num::NonZeroUsize, os::fd::AsFd, path::Path, ptr::NonNull, sync::atomic::AtomicU64};

use aya::maps::{MapData, MapError};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

use super::pins;

#[derive(Debug, thiserror::Error)]
pub enum MappedWordsError {
    #[error("cannot open map {name}")]
    Open {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("cannot map {name} into memory (was it created without BPF_F_MMAPABLE?)")]
    Mmap {
        name: &'static str,
        #[source]
        source: nix::Error,
    },
}

/// The words of one map, mapped into this process; unmapped on drop.
pub struct MappedWords {
    start: NonNull<u64>,
    words: u32,
}

// SAFETY: the mapping is plain shared memory, reached only through atomics.
unsafe impl Send for MappedWords {}
// SAFETY: as above.
unsafe impl Sync for MappedWords {}

impl MappedWords {
    /// The pinned map `name` of `words` words in `pin_dir`.
    pub fn open_pin(
        pin_dir: &Path,
        name: &'static str,
        words: u32,
    ) -> Result<Self, MappedWordsError> {
        let map = MapData::from_pin(pins::map_pin(pin_dir, name))
            .map_err(|source| MappedWordsError::Open { name, source })?;
        Self::open(&map, name, words)
    }

    /// `map` (named `name` in errors), an mmapable array of `words` words.
    pub fn open(map: &MapData, name: &'static str, words: u32) -> Result<Self, MappedWordsError> {
        let length = Self::length(words);
        // SAFETY: a new shared mapping of the map's entries (an mmapable array, its entries
        // from offset 0), at an address the kernel picks; unmapped on drop. The fd may close
        // after: the mapping holds the map.
        let start = unsafe {
            mmap(
                None,
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                map.fd().as_fd(),
                0,
            )
        }
        .map_err(|source| MappedWordsError::Mmap { name, source })?;
        Ok(Self {
            start: start.cast(),
            words,
        })
    }

    fn length(words: u32) -> NonZeroUsize {
        NonZeroUsize::new(words.max(1) as usize * 8).unwrap_or(NonZeroUsize::MIN)
    }

    /// Word `index`; panics past the map's end (a slot function's bug).
    pub fn word(&self, index: u32) -> &AtomicU64 {
        assert!(index < self.words, "a word of the map");
        // SAFETY: within the mapping (checked above), 8-byte aligned (page-aligned start,
        // 8-byte entries), shared with the programs, which write it only atomically.
        unsafe { AtomicU64::from_ptr(self.start.add(index as usize).as_ptr()) }
    }
}

impl Drop for MappedWords {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, not used after this.
        let _ = unsafe { munmap(self.start.cast(), Self::length(self.words).get()) };
    }
}
