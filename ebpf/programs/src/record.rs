//! What a connect()ed socket was translated for, kept in the socket's own storage for the
//! destroy iterators. The socket ring (`maps::SOCKETS`) serves getpeername() with one store
//! per connect, but newer sockets overwrite it; a record here lives exactly as long as its
//! socket, so a sweep finds every socket translated to a backend that left.
//!
//! Records are charged to the agent's memory cgroup, so they are counted
//! (`maps::SOCKET_RECORD_COUNT`) and bounded: docs/operations.md, "Sockets of removed
//! backends".
use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_sk_storage_get;
use socklb_abi::{Ipv6Words, PROTO_TCP, SocketRecord};

use crate::{
    context::SockAddr,
    counters::bump,
    maps::{SOCKET_RECORD_COUNT, SOCKET_RECORDS},
};

/// Whether TCP sockets are recorded too (socklb-abi `globals::RECORD_TCP`), set by the
/// agent at load time: only when it closes them, so that by default a TCP connect pays
/// nothing here. A read-only global: the verifier sees it as a constant.
#[unsafe(no_mangle)]
static RECORD_TCP: u32 = 0;

/// How many sockets may hold a record at once (socklb-abi `globals::MAX_SOCKET_RECORDS`),
/// set by the agent at load time. A read-only global: the verifier sees it as a constant.
#[unsafe(no_mangle)]
static MAX_SOCKET_RECORDS: u32 = 65_536;

/// Records that the socket asked for `frontend` and got `backend` (network order, an IPv4
/// address in the last word), of `family` (4 or 6). Its storage is allocated at the
/// socket's first translation, while fewer than `MAX_SOCKET_RECORDS` sockets hold one; past
/// that, or when the allocation fails, the socket is left to the ring (the translation
/// stands) and counted.
#[inline(always)]
pub fn remember(
    sock: &SockAddr,
    protocol: u8,
    family: u8,
    frontend: (Ipv6Words, u16),
    backend: (Ipv6Words, u16),
) {
    // SAFETY: a read of an initialised static; volatile so the agent's value is used.
    if protocol == PROTO_TCP && unsafe { core::ptr::read_volatile(&RECORD_TCP) } == 0 {
        return;
    }
    let mut record = SOCKET_RECORDS.get_ptr_mut(sock.context());
    if record.is_null() {
        record = create(sock);
        if record.is_null() {
            return;
        }
    }
    // SAFETY: a valid pointer into the socket's storage (zeroed when created); the fields
    // are written one by one at fixed offsets.
    unsafe {
        (*record).frontend_address = frontend.0;
        (*record).frontend_port = frontend.1;
        (*record).backend_address = backend.0;
        (*record).backend_port = backend.1;
        (*record).protocol = protocol;
        (*record).family = family;
    }
}

/// A new, zeroed record for `sock`, counted; null past the bound or if the kernel refused.
#[inline(always)]
fn create(sock: &SockAddr) -> *mut SocketRecord {
    let Some(count) = live_count() else {
        bump(|c| &mut c.errors);
        return core::ptr::null_mut();
    };
    // SAFETY: a read of an initialised static; volatile so the agent's value is used.
    let bound = unsafe { core::ptr::read_volatile(&MAX_SOCKET_RECORDS) };
    // Concurrent connects on other CPUs may each pass this check: the bound holds to
    // within the number of CPUs.
    // SAFETY: a valid pointer into the map's value (see `live_count`).
    if unsafe { core::ptr::read_volatile(count) } >= i64::from(bound) {
        bump(|c| &mut c.socket_records_full);
        return core::ptr::null_mut();
    }
    let record = SOCKET_RECORDS.get_or_insert_ptr_mut(sock.context(), None);
    if record.is_null() {
        bump(|c| &mut c.errors);
        return record;
    }
    // SAFETY: as above.
    unsafe { atomic_add(count, 1) };
    record
}

/// Takes `sock` (a socket being released) out of the count if it holds a record.
#[inline(always)]
pub fn forget(sock: *mut c_void) {
    let map = core::ptr::from_ref(&SOCKET_RECORDS).cast_mut().cast();
    // SAFETY: the socket of the sock_release call; no value, no creation.
    let record = unsafe { bpf_sk_storage_get(map, sock, core::ptr::null_mut(), 0) };
    if record.is_null() {
        return;
    }
    let Some(count) = live_count() else {
        return;
    };
    // Records an older agent made before it counted them are not in the count: keep it
    // from going below zero for them (two releases racing here may, by one each).
    // SAFETY: a valid pointer into the map's value (see `live_count`).
    unsafe {
        if core::ptr::read_volatile(count) > 0 {
            atomic_add(count, -1);
        }
    }
}

/// The shared count of sockets holding a record: an 8-byte aligned map value, which every
/// CPU changes with [`atomic_add`] only.
#[inline(always)]
fn live_count() -> Option<*mut i64> {
    let live = SOCKET_RECORD_COUNT.get_ptr_mut(0)?;
    // SAFETY: a valid pointer to the map's value; no reference is made.
    Some(unsafe { &raw mut (*live).live })
}

/// `*value += delta` as one atomic instruction (BPF_ATOMIC add, which every BPF CPU version
/// has; the BPF target offers no Rust atomics).
///
/// # Safety
/// `value` must point into a map value.
#[inline(always)]
unsafe fn atomic_add(value: *mut i64, delta: i64) {
    // SAFETY: one atomic add to memory the caller vouches for.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({value} + 0) += {delta}",
            value = in(reg) value,
            delta = in(reg) delta,
        );
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
