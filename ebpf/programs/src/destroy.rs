//! Socket iterators (`iter/udp`, `iter/tcp`) that close the sockets socklb translated to a
//! backend that has left its frontend, with the `bpf_sock_destroy` kfunc (Linux >= 6.5).
//!
//! The agent fills the gone maps with one sync's (frontend, backend) pairs and reads each
//! iterator once per network namespace (an iterator walks its reader's namespace). A socket
//! is closed only if what connect() recorded for it (its ring slot while it holds one, else
//! its record in socket storage) names a gone pair and its peer is still that backend; its
//! cookie then goes to the output, which the agent counts. docs/operations.md, "Sockets of
//! removed backends", has the rest.
use core::ffi::c_void;

use aya_ebpf::helpers::generated::{bpf_get_socket_cookie, bpf_seq_write};
use socklb_abi::{
    GoneKey, GoneKey6, Ipv6Words, PROTO_TCP, PROTO_UDP, SOCK_DESTROY_CALL, SocketRecord,
};

use crate::{
    maps::{GONE, GONE6, SOCKETS, socket_slot},
    record,
    socket_family::Address as _,
};

/// Calls the `bpf_sock_destroy` kfunc, which aborts the socket with ECONNABORTED so that
/// the application's next call fails. bpf-linker does not emit the BTF of an extern
/// function (rustc gives declarations no debug info), so aya cannot relocate a kfunc call:
/// the call instruction is written raw, with a placeholder the agent replaces by the
/// kfunc's id in the running kernel's BTF before loading (see [`SOCK_DESTROY_CALL`]).
///
/// # Safety
/// `sock` must be the socket the iterator passed.
#[inline(always)]
unsafe fn sock_destroy(sock: *mut c_void) -> i64 {
    let result: i64;
    // SAFETY: one call instruction; r1 is its argument, r0 its result, r1-r5 clobbered,
    // as for any BPF call.
    unsafe {
        core::arch::asm!(
            ".quad {call}",
            call = const SOCK_DESTROY_CALL,
            inlateout("r1") sock => _,
            lateout("r0") result,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        );
    }
    result
}

/// `struct bpf_iter__udp` and `struct bpf_iter__tcp` both start with the iterator's meta
/// and the socket (`udp_sock` / `sock_common`, whose first member chain starts with
/// `sock_common`).
#[repr(C)]
struct IterContext {
    meta: *mut IterMeta,
    sock: *mut c_void,
}

/// `struct bpf_iter_meta`: its first field is the output.
#[repr(C)]
struct IterMeta {
    seq: *mut c_void,
}

/// `struct sock_common` offsets of the fields read here. They have not moved in a decade
/// (they are the socket hash tables' lookup key); these programs have no CO-RE.
const SKC_DADDR: usize = 0;
const SKC_DPORT: usize = 12;
const SKC_FAMILY: usize = 16;
const SKC_STATE: usize = 18;
const AF_INET: u16 = 2;

/// The byte offset of `skc_v6_daddr` in `struct sock_common`, set by the agent from the
/// kernel's BTF (socklb-abi `globals`); 0 when unknown: IPv6 records are then left alone.
/// A read-only global: the verifier sees it as a constant.
#[unsafe(no_mangle)]
static SKC_V6_DADDR_OFFSET: u32 = 0;

/// The byte offset of `skc_cookie` in `struct sock_common`, set by the agent from the
/// kernel's BTF (socklb-abi `globals`); 0 when unknown. A read-only global: the verifier
/// sees it as a constant.
#[unsafe(no_mangle)]
static SKC_COOKIE_OFFSET: u32 = 0;

/// TCP states that are not a full socket or not a client's: a TIME_WAIT or request mini
/// socket keeps its parent's cookie but cannot be destroyed; a listener was never
/// translated.
const TCP_TIME_WAIT: u8 = 6;
const TCP_LISTEN: u8 = 10;
const TCP_NEW_SYN_RECV: u8 = 12;

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/udp")]
pub fn socklb_destroy_udp(ctx: *mut c_void) -> i32 {
    visit(ctx, PROTO_UDP);
    0
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub fn socklb_destroy_tcp(ctx: *mut c_void) -> i32 {
    visit(ctx, PROTO_TCP);
    0
}

/// The socket's cookie, 0 if it has none yet. Read from the socket where the agent knows
/// the field's offset: the helper would hand a cookie to every socket without one, which
/// spreads the cookies of translated sockets over more socket map slots.
#[inline(always)]
fn cookie(sock: *mut c_void) -> u64 {
    // SAFETY: a read of an initialised static; volatile so the agent's value is used.
    let offset = unsafe { core::ptr::read_volatile(&SKC_COOKIE_OFFSET) };
    if offset == 0 {
        // SAFETY: the helper takes the socket pointer the kernel gave.
        return unsafe { bpf_get_socket_cookie(sock) };
    }
    // SAFETY: a trusted socket pointer; the verifier checks the read against the BTF
    // (`skc_cookie`, an atomic64_t).
    unsafe { *((sock as *const u8).add(offset as usize) as *const u64) }
}

#[inline(always)]
fn visit(ctx: *mut c_void, protocol: u8) {
    // SAFETY: the kernel passes `struct bpf_iter__{udp,tcp}`, described above.
    let ctx = unsafe { &*(ctx as *const IterContext) };
    let sock = ctx.sock;
    // The last call of an iteration has no socket.
    if sock.is_null() {
        return;
    }
    // SAFETY: a trusted socket pointer; the verifier checks each read against the BTF.
    let (daddr, dport, family, state) = unsafe {
        let base = sock as *const u8;
        (
            *(base.add(SKC_DADDR) as *const u32),
            *(base.add(SKC_DPORT) as *const u16),
            *(base.add(SKC_FAMILY) as *const u16),
            *base.add(SKC_STATE),
        )
    };
    if protocol == PROTO_TCP
        && (state == TCP_TIME_WAIT || state == TCP_LISTEN || state == TCP_NEW_SYN_RECV)
    {
        return;
    }
    // An IPv4 socket whose peer is no gone backend is done with one lookup: the record is
    // read only for the sockets of gone backends (IPv6 sockets, rarer, read it at once).
    let ipv4 = family == AF_INET;
    if ipv4
        && GONE
            .get_ptr(&GoneKey::peer(protocol, daddr, dport))
            .is_none()
    {
        return;
    }
    // Only sockets socklb translated have a record; its backend must still be the peer
    // (a socket may have connected elsewhere since). The socket ring, one array lookup,
    // answers for the sockets it still holds.
    let ring = if ipv4 {
        from_ring(sock, protocol)
    } else {
        None
    };
    let Some(record) = ring.or_else(|| record::of(sock)) else {
        return;
    };
    if record.protocol != protocol || record.backend_port != dport {
        return;
    }
    // A socket talking to an IPv4-mapped address was translated by the IPv4 maps and has
    // an IPv4 record; its `skc_daddr` holds that IPv4 address.
    if record.family == 6 {
        if gone6(sock, &record, protocol) {
            destroy(ctx, sock);
        }
        return;
    }
    if record.family != 4 || record.backend_address[3] != daddr {
        return;
    }
    let key = GoneKey {
        frontend_address: record.frontend_address[3],
        frontend_port: record.frontend_port,
        protocol,
        pad: 0,
        backend_address: record.backend_address[3],
        backend_port: record.backend_port,
        pad2: 0,
    };
    if GONE.get_ptr(&key).is_none() {
        return;
    }
    destroy(ctx, sock);
}

/// The record the socket ring holds for an IPv4 socket, if its slot is still the socket's.
#[inline(always)]
fn from_ring(sock: *mut c_void, protocol: u8) -> Option<SocketRecord> {
    let cookie = cookie(sock);
    if cookie == 0 {
        return None;
    }
    let slot = SOCKETS.get_ptr(socket_slot(cookie))?;
    // SAFETY: pointer from a successful lookup; copied out at once.
    let slot = unsafe { *slot };
    (slot.cookie == cookie).then_some(SocketRecord {
        frontend_address: [0, 0, 0, slot.frontend_address],
        backend_address: [0, 0, 0, slot.backend_address],
        frontend_port: slot.frontend_port,
        backend_port: slot.backend_port,
        family: 4,
        protocol,
        pad: 0,
    })
}

/// Whether an IPv6 record names a gone pair whose backend is still the socket's peer.
#[inline(always)]
fn gone6(sock: *mut c_void, record: &SocketRecord, protocol: u8) -> bool {
    // SAFETY: a read of an initialised static; volatile so the agent's value is used.
    let offset = unsafe { core::ptr::read_volatile(&SKC_V6_DADDR_OFFSET) };
    if offset == 0 {
        return false;
    }
    // SAFETY: a trusted socket pointer; the verifier checks each read against the BTF
    // (`skc_v6_daddr`, a `struct in6_addr`).
    let peer: Ipv6Words = unsafe {
        let word = (sock as *const u8).add(offset as usize) as *const u32;
        [*word, *word.add(1), *word.add(2), *word.add(3)]
    };
    if !record.backend_address.same(&peer) {
        return false;
    }
    let key = GoneKey6 {
        frontend_address: record.frontend_address,
        frontend_port: record.frontend_port,
        protocol,
        pad: 0,
        backend_address: record.backend_address,
        backend_port: record.backend_port,
        pad2: 0,
    };
    GONE6.get_ptr(&key).is_some()
}

/// Closes the socket and writes its cookie to the iterator's output.
#[inline(always)]
fn destroy(ctx: &IterContext, sock: *mut c_void) {
    // SAFETY: the socket pointer the kernel gave; the kfunc is allowed in these iterators.
    if unsafe { sock_destroy(sock) } != 0 {
        return;
    }
    let cookie = cookie(sock);
    // SAFETY: `ctx.meta` and its output are valid during this call; 8 bytes from a local.
    unsafe {
        let seq = (*ctx.meta).seq;
        bpf_seq_write(
            seq.cast(),
            core::ptr::addr_of!(cookie).cast(),
            size_of::<u64>() as u32,
        );
    }
}
