//! An mmapable BPF array of words mapped into the agent: the bit filters the TC programs
//! read (the flow filter, the frontend filter; 64-bit words) and the slot array (32-bit
//! backend ids). The agent reads and writes their words in place, with no syscall per word.
use std::{
    marker::PhantomData,
    num::NonZeroUsize,
    os::fd::AsFd,
    path::Path,
    ptr::NonNull,
    sync::atomic::{AtomicU32, AtomicU64},
};

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
    #[error(
        "cannot map {name} into memory as one run of words: its entries of {entry} bytes are padded to 8"
    )]
    Unaligned { name: &'static str, entry: usize },
    #[error("cannot map {name} into memory (was it created without BPF_F_MMAPABLE?)")]
    Mmap {
        name: &'static str,
        #[source]
        source: nix::Error,
    },
}

/// The atomic types a mapped array's entries are read and written as.
pub trait Word {}
impl Word for AtomicU64 {}
impl Word for AtomicU32 {}

/// The words of one map, mapped into this process; unmapped on drop.
pub struct MappedWords<W: Word = AtomicU64> {
    start: NonNull<u8>,
    words: u32,
    word: PhantomData<W>,
    /// The map taken from a loaded object, held open: its programs, if loaded later, are
    /// relocated against its fd.
    held: Option<MapData>,
}

// SAFETY: the mapping is plain shared memory, reached only through atomics.
unsafe impl<W: Word> Send for MappedWords<W> {}
// SAFETY: as above.
unsafe impl<W: Word> Sync for MappedWords<W> {}

impl<W: Word> MappedWords<W> {
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

    /// The array `map` taken from a loaded object (named `name` in errors), all the words of
    /// all its entries.
    pub fn open_array(map: aya::maps::Map, name: &'static str) -> Result<Self, MappedWordsError> {
        let aya::maps::Map::Array(map) = map else {
            return Err(MappedWordsError::Open {
                name,
                source: MapError::InvalidName {
                    name: name.to_owned(),
                },
            });
        };
        let info = map
            .info()
            .map_err(|source| MappedWordsError::Open { name, source })?;
        // Entries are 8-byte aligned: only then are the words of consecutive entries one run.
        let entry = info.value_size() as usize;
        if !entry.is_multiple_of(8) {
            return Err(MappedWordsError::Unaligned { name, entry });
        }
        let per_entry = u32::try_from(entry / size_of::<W>()).unwrap_or(u32::MAX);
        let words = info.max_entries().saturating_mul(per_entry);
        let mut mapped = Self::open(&map, name, words)?;
        mapped.held = Some(map);
        Ok(mapped)
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
            word: PhantomData,
            held: None,
        })
    }

    fn length(words: u32) -> NonZeroUsize {
        NonZeroUsize::new(words.max(1) as usize * size_of::<W>()).unwrap_or(NonZeroUsize::MIN)
    }

    /// How many words the map holds.
    pub fn len(&self) -> u32 {
        self.words
    }

    /// Word `index`; panics past the map's end (a caller's bug).
    pub fn word(&self, index: u32) -> &W {
        assert!(index < self.words, "a word of the map");
        // SAFETY: within the mapping (checked above), aligned to the word's size (page-aligned
        // start, entries of the word's size), shared with the programs and other writers,
        // which touch it only atomically.
        unsafe { &*self.start.as_ptr().cast::<W>().add(index as usize) }
    }
}

impl<W: Word> Drop for MappedWords<W> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, not used after this.
        let _ = unsafe { munmap(self.start.cast(), Self::length(self.words).get()) };
    }
}
