//! The `bpf-iterator` mode: the destroy iterators (socklb-ebpf `destroy`) walk the sockets
//! of the namespace the sweeping thread is in and close those the gone map names; the
//! kernel does the filtering, so a sweep costs one pass over the sockets per namespace and
//! protocol, without copying them out.
use std::{
    io::{self, Read as _},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
};

use aya::maps::{HashMap, MapData, MapError};
use socklb_abi::{GoneKey, GoneKey6};

use crate::{
    dataplane::DestroyPrograms,
    desired::{Gone, Protocol},
};

/// `enum bpf_cmd` and `enum bpf_attach_type` values (uapi/linux/bpf.h).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_TRACE_ITER: u32 = 28;

/// The iterators' links (created once; each sweep of a namespace opens a fresh iterator
/// from them) and the gone map.
pub struct Iterators {
    udp: OwnedFd,
    tcp: OwnedFd,
    gone: HashMap<MapData, GoneKey, u8>,
    gone6: HashMap<MapData, GoneKey6, u8>,
}

impl Iterators {
    pub fn new(programs: DestroyPrograms) -> io::Result<Self> {
        Ok(Self {
            udp: link_create(programs.udp.as_raw_fd())?,
            tcp: link_create(programs.tcp.as_raw_fd())?,
            gone: programs.gone,
            gone6: programs.gone6,
        })
    }

    /// Names `pairs` in the gone map of their family.
    pub fn prepare(&mut self, pairs: &[Gone]) -> Result<(), MapError> {
        for key in pairs.iter().filter_map(Gone::key) {
            self.gone.insert(&key, &1, 0)?;
            self.gone.insert(&peer(&key), &1, 0)?;
        }
        for key in pairs.iter().filter_map(Gone::key6) {
            self.gone6.insert(&key, &1, 0)?;
        }
        Ok(())
    }

    /// Empties the gone maps again, so that a sweep never acts on an older sync's pairs.
    pub fn finish(&mut self, pairs: &[Gone]) {
        // Absent if prepare stopped early.
        for key in pairs.iter().filter_map(Gone::key) {
            let _ = self.gone.remove(&key);
            let _ = self.gone.remove(&peer(&key));
        }
        for key in pairs.iter().filter_map(Gone::key6) {
            let _ = self.gone6.remove(&key);
        }
    }

    /// Closes the `protocol` sockets of the gone pairs in the calling thread's namespace;
    /// returns how many.
    pub fn sweep(&self, protocol: Protocol) -> io::Result<u64> {
        let link = match protocol {
            Protocol::Udp => &self.udp,
            Protocol::Tcp => &self.tcp,
        };
        // The iterator walks the namespace of the thread that creates it.
        let mut iterator = std::fs::File::from(iter_create(link.as_raw_fd())?);
        // The programs write the cookie of every socket they closed.
        let mut output = Vec::new();
        iterator.read_to_end(&mut output)?;
        Ok((output.len() / size_of::<u64>()) as u64)
    }
}

fn bpf(command: libc::c_long, attr: &mut [u32]) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a zeroed `union bpf_attr` prefix of the size passed, as the
    // command expects; the kernel returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd the kernel just returned, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// BPF_LINK_CREATE for an iterator program: `link_create { prog_fd, target_fd,
/// attach_type, flags }`, the rest zero.
fn link_create(program: RawFd) -> io::Result<OwnedFd> {
    let mut attr = [0u32; 16];
    attr[0] = program as u32;
    attr[2] = BPF_TRACE_ITER;
    bpf(BPF_LINK_CREATE, &mut attr)
}

/// BPF_ITER_CREATE: `iter_create { link_fd, flags }`.
fn iter_create(link: RawFd) -> io::Result<OwnedFd> {
    let mut attr = [0u32; 2];
    attr[0] = link as u32;
    bpf(BPF_ITER_CREATE, &mut attr)
}

/// The peer key of a pair's key (see `GoneKey::peer`).
fn peer(key: &GoneKey) -> GoneKey {
    GoneKey::peer(key.protocol, key.backend_address, key.backend_port)
}
