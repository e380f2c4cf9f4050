//! Swaps the program of a pinned link in place (`BPF_LINK_UPDATE`: no moment without a
//! program) for the program types aya 0.16 gives no `attach_to_link`: the cgroup sock
//! program that counts released sockets.
use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsFd, AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

use aya_obj::generated::bpf_cmd;

/// `union bpf_attr` for `BPF_OBJ_GET` (UAPI layout).
#[repr(C)]
struct ObjGet {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// `union bpf_attr` for `BPF_LINK_UPDATE` (UAPI layout).
#[repr(C)]
struct LinkUpdate {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
}

/// Makes the link pinned at `pin` run `program` from now on.
pub fn update_pinned(pin: &Path, program: impl AsFd) -> io::Result<()> {
    let link = obj_get(pin)?;
    let attr = LinkUpdate {
        link_fd: fd_number(link.as_raw_fd())?,
        new_prog_fd: fd_number(program.as_fd().as_raw_fd())?,
        flags: 0,
        old_prog_fd: 0,
    };
    bpf(bpf_cmd::BPF_LINK_UPDATE, &attr).map(drop)
}

fn obj_get(pin: &Path) -> io::Result<OwnedFd> {
    let path = CString::new(pin.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let attr = ObjGet {
        pathname: path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    let fd = bpf(bpf_cmd::BPF_OBJ_GET, &attr)?;
    // SAFETY: BPF_OBJ_GET returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fd_number(fd: i32) -> io::Result<u32> {
    u32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))
}

fn bpf<T>(command: bpf_cmd, attr: &T) -> io::Result<i32> {
    // SAFETY: `attr` is a live value of the layout the command reads, and its size is
    // passed; the kernel reads nothing beyond it.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command as libc::c_long,
            std::ptr::from_ref(attr),
            size_of::<T>(),
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    i32::try_from(result).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))
}
