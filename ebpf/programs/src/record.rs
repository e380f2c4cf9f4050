//! What a connect()ed socket was translated for, kept in the socket's own storage for the
//! destroy iterators. The socket ring (`maps::SOCKETS`) serves getpeername() with one store
//! per connect, but newer sockets overwrite it; a record here lives exactly as long as its
//! socket, so a sweep finds every socket translated to a backend that left.
use aya_ebpf::helpers::generated::bpf_sk_storage_get;
use socklb_abi::{PROTO_TCP, SocketRecord};

use crate::{context::SockAddr, counters::bump, maps::SOCKET_RECORDS};

/// Whether TCP sockets are recorded too (socklb-abi `globals::RECORD_TCP`), set by the
/// agent at load time: only when it closes them, so that by default a TCP connect pays
/// nothing here. A read-only global: the verifier sees it as a constant.
#[unsafe(no_mangle)]
static RECORD_TCP: u32 = 0;

/// Records that the socket asked for `frontend` and got `backend` (IPv4, network order).
/// Its storage is allocated at the socket's first translation; a failed allocation is
/// counted and leaves the socket to the ring (the translation stands).
#[inline(always)]
pub fn remember(sock: &SockAddr, protocol: u8, frontend: (u32, u16), backend: (u32, u16)) {
    // SAFETY: a read of an initialised static; volatile so the agent's value is used.
    if protocol == PROTO_TCP && unsafe { core::ptr::read_volatile(&RECORD_TCP) } == 0 {
        return;
    }
    let record = SOCKET_RECORDS.get_or_insert_ptr_mut(sock.context(), None);
    if record.is_null() {
        bump(|c| &mut c.errors);
        return;
    }
    // SAFETY: a valid pointer into the socket's storage (zeroed when created); the fields
    // are written one by one at fixed offsets.
    unsafe {
        (*record).frontend_address = [0, 0, 0, frontend.0];
        (*record).frontend_port = frontend.1;
        (*record).backend_address = [0, 0, 0, backend.0];
        (*record).backend_port = backend.1;
        (*record).protocol = protocol;
        (*record).family = 4;
    }
}

/// The record of `sock` (a socket a destroy iterator visits), if it has one.
#[inline(always)]
pub fn of(sock: *mut core::ffi::c_void) -> Option<SocketRecord> {
    let map = core::ptr::from_ref(&SOCKET_RECORDS).cast_mut().cast();
    // SAFETY: the socket pointer the kernel gave the iterator; no value, no creation.
    let record = unsafe { bpf_sk_storage_get(map, sock, core::ptr::null_mut(), 0) };
    if record.is_null() {
        return None;
    }
    // SAFETY: a valid pointer into the socket's storage; copied out at once.
    Some(unsafe { *record.cast::<SocketRecord>() })
}
