//! Forward translation shared by connect and sendmsg: frontend lookup, backend choice
//! (session affinity, then random or per-socket), and the reverse entry that later lets
//! recvmsg/getpeername show the frontend again. Written once for both address families
//! (see `socket_family`).
use aya_ebpf::helpers;
use socklb_abi::{
    PROTO_TCP, PROTO_UDP, TRACE_REASON_AFFINITY, TRACE_REASON_NO_BACKEND, TRACE_REASON_PER_SOCKET,
    TRACE_REASON_RANDOM, TRACE_REASON_REVERSE, TRACE_SOURCE_CONNECT, TRACE_SOURCE_REVERSE,
    TRACE_SOURCE_SENDMSG,
};

use crate::{
    PROCEED, REJECT,
    backend::{self, Pick},
    context::SockAddr,
    counters::bump,
    log,
    maps::{SOCKET_LB_NAMESPACES, socket_slot},
    record,
    socket_family::{Address as _, Family, Frontend, Master, Slot},
    trace::{self, Decision},
};

const ECONNREFUSED: i32 = 111;
/// Draws before a translation gives up when slots keep vanishing under it. The agent deletes
/// a slot one sync after no count covers it any more, so a second draw always finds one;
/// the bound keeps the verifier's loop finite.
const DRAWS: u32 = 3;

/// A lookup or update that should have worked did not: proceed untranslated, count it.
pub struct Error;

pub enum Forward {
    /// Not a frontend (or not TCP/UDP): untouched.
    Untouched,
    /// A frontend without any usable backend.
    NoBackend,
    Translated {
        affinity_hit: bool,
    },
}

/// The socket call being translated.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// connect(): once per socket.
    Connect,
    /// sendmsg() of an unconnected UDP socket: once per datagram.
    SendMsg,
}

/// Turns a forward translation into the hook's verdict, counting what happened.
#[inline(always)]
pub fn forward_verdict(result: Result<Forward, Error>) -> i32 {
    match result {
        Ok(Forward::Untouched) => PROCEED,
        Ok(Forward::Translated { affinity_hit }) => {
            bump(|c| &mut c.translated);
            if affinity_hit {
                bump(|c| &mut c.affinity_hits);
            }
            PROCEED
        }
        Ok(Forward::NoBackend) => {
            bump(|c| &mut c.no_backend);
            // What kube-proxy's REJECT rule gives the client. The kernel keeps a negative
            // retval set by the program instead of its default EPERM.
            // SAFETY: plain helper call without pointers.
            unsafe { helpers::bpf_set_retval(-ECONNREFUSED) };
            REJECT
        }
        Err(Error) => {
            bump(|c| &mut c.errors);
            PROCEED
        }
    }
}

/// The socket's L4 protocol if socklb serves it.
#[inline(always)]
pub fn served_protocol(sock: &SockAddr) -> Option<u8> {
    match sock.protocol() {
        p if p == u32::from(PROTO_TCP) => Some(PROTO_TCP),
        p if p == u32::from(PROTO_UDP) => Some(PROTO_UDP),
        _ => None,
    }
}

/// Rewrites the socket's destination from a frontend to one of its backends, in the maps
/// of family `F`.
#[inline(always)]
pub fn translate<F: Family>(sock: &SockAddr, protocol: u8, call: Call) -> Result<Forward, Error> {
    let pick = if protocol == PROTO_TCP {
        Pick::Random
    } else {
        Pick::PerSocket
    };
    if !in_scope(sock) {
        return Ok(Forward::Untouched);
    }
    let frontend_address = F::destination(sock);
    let frontend_port = sock.port();
    let key = F::service_key(frontend_address, frontend_port, protocol);
    // The one lookup every non-frontend destination pays.
    let Some(mut master) = master_entry::<F>(&key) else {
        return Ok(Forward::Untouched);
    };
    let cookie = sock.socket_cookie();
    let source = match call {
        Call::Connect => TRACE_SOURCE_CONNECT,
        Call::SendMsg => TRACE_SOURCE_SENDMSG,
    };
    let mut decision = Decision::new(source, protocol, (frontend_address, frontend_port));
    let mut chosen = None;
    for _ in 0..DRAWS {
        if master.count == 0 {
            decision.reason = TRACE_REASON_NO_BACKEND;
            decision.service_id = master.service_id;
            trace::socket(&decision, sock, cookie);
            return Ok(Forward::NoBackend);
        }
        chosen = backend::for_socket::<F>(sock, &master, cookie, pick);
        if chosen.is_some() {
            break;
        }
        // The slot drawn is gone: the backend set changed since the master was read.
        // Read it again and draw from the new set.
        let Some(now) = master_entry::<F>(&key) else {
            return Ok(Forward::Untouched);
        };
        master = now;
    }
    let Some((backend, slot, affinity_hit)) = chosen else {
        F::log_missing_slots(frontend_address, frontend_port, master.count);
        return Err(Error);
    };
    decision.reason = match (affinity_hit, pick) {
        (true, _) => TRACE_REASON_AFFINITY,
        (false, Pick::Random) => TRACE_REASON_RANDOM,
        (false, Pick::PerSocket) => TRACE_REASON_PER_SOCKET,
    };
    decision.service_id = master.service_id;
    decision.backend = (backend.address, backend.port);
    decision.slot = slot;
    decision.count = master.count;
    trace::socket(&decision, sock, cookie);

    remember_frontend::<F>(
        call,
        cookie,
        &backend,
        &Frontend {
            address: frontend_address,
            port: frontend_port,
            service_id: master.service_id,
        },
    );
    if call == Call::Connect {
        record::remember(
            sock,
            protocol,
            F::RECORD_FAMILY,
            (F::words(frontend_address), frontend_port),
            (F::words(backend.address), backend.port),
        );
    }
    F::set_destination(sock, backend.address, backend.port);
    Ok(Forward::Translated { affinity_hit })
}

/// The only network namespace whose sockets are translated (socklb-abi
/// `globals::SOCKET_LB_NETNS`), set by the agent at load time; 0: every namespace. A
/// read-only global: with 0, the verifier removes the check.
#[unsafe(no_mangle)]
static SOCKET_LB_NETNS: u64 = 0;

/// 1: the namespaces of `SOCKET_LB_NAMESPACES` are in scope too (socklb-abi
/// `globals::SOCKET_LB_LISTED`).
#[unsafe(no_mangle)]
static SOCKET_LB_LISTED: u32 = 0;

/// Whether `sock` is in the socket hooks' scope (`--socket-lb-scope`): a socket out of it
/// keeps its destination, for whatever serves that namespace instead (the per-packet path
/// on a pod's device).
#[inline(always)]
fn in_scope(sock: &SockAddr) -> bool {
    // SAFETY: reads of initialised statics; volatile so the agent's values are used.
    let (only, listed) = unsafe {
        (
            core::ptr::read_volatile(&SOCKET_LB_NETNS),
            core::ptr::read_volatile(&SOCKET_LB_LISTED),
        )
    };
    if only == 0 {
        return true;
    }
    let netns = sock.netns_cookie();
    // SAFETY: a lookup whose value is not read.
    netns == only || (listed != 0 && unsafe { SOCKET_LB_NAMESPACES.get(&netns) }.is_some())
}

/// The frontend's master entry, copied out.
#[inline(always)]
fn master_entry<F: Family>(key: &F::ServiceKey) -> Option<Master> {
    let master = F::services().get_ptr(key)?;
    // SAFETY: pointer from a successful lookup; copied out at once.
    Some(F::master(unsafe { &*master }))
}

/// Records which frontend the socket asked for. A connect()ed socket has one peer: its slot
/// in the socket ring is overwritten. An unconnected UDP socket may send to several
/// frontends, so each (socket, backend) gets an LRU entry; every datagram comes through
/// here, so the write is skipped when the entry is already there. A record that cannot be
/// written is counted; the translation stands (the socket would see the backend's address).
#[inline(always)]
fn remember_frontend<F: Family>(
    call: Call,
    cookie: u64,
    backend: &Slot<F::Address>,
    frontend: &Frontend<F::Address>,
) {
    if call == Call::Connect {
        let Some(slot) = F::sockets().get_ptr_mut(socket_slot(cookie)) else {
            bump(|c| &mut c.errors);
            return;
        };
        // SAFETY: pointer from a successful lookup, valid for this run.
        unsafe { publish::<F>(slot, cookie, backend, frontend) };
        return;
    }
    let key = F::reverse_key(cookie, backend.address, backend.port);
    if let Some(existing) = F::reverse().get_ptr(&key)
        // SAFETY: pointer from a successful lookup.
        && F::frontend(unsafe { &*existing }).same(frontend)
    {
        return;
    }
    if let Err(error) = F::reverse().insert(&key, &F::reverse_entry(frontend), 0) {
        log::reverse_not_written(error);
        bump(|c| &mut c.errors);
    }
}

/// Writes a socket ring slot so that no reader takes half of it for a whole entry: the
/// cookie is cleared first and set last, and [`read_slot`] checks it on both sides of its
/// copy. Volatile accesses keep the compiler's order; x86's total store order keeps it for
/// other CPUs. On arm64 other CPUs may see the stores in another order: a racing reader
/// can then, rarely, take a mixed entry (BPF has no plain fence; atomics would need a newer
/// instruction set than these programs are built for).
///
/// # Safety
/// `slot` must be a valid pointer into the family's socket map.
#[inline(always)]
unsafe fn publish<F: Family>(
    slot: *mut F::SocketFrontend,
    cookie: u64,
    backend: &Slot<F::Address>,
    frontend: &Frontend<F::Address>,
) {
    // SAFETY: the caller's pointer; field pointers stay inside the entry.
    unsafe {
        let fields = F::ring_fields(slot);
        fields.cookie.write_volatile(0);
        F::Address::write_volatile(fields.backend_address, backend.address);
        fields.backend_port.write_volatile(backend.port);
        F::Address::write_volatile(fields.frontend_address, frontend.address);
        fields.frontend_port.write_volatile(frontend.port);
        fields.service_id.write_volatile(frontend.service_id);
        fields.cookie.write_volatile(cookie);
    }
}

/// A whole socket ring entry, copied out.
struct RingEntry<A> {
    backend_address: A,
    backend_port: u16,
    frontend: Frontend<A>,
}

/// A socket ring slot if it holds a whole entry for `cookie`: the backend and the frontend,
/// the cookie read before and after the copy (see [`publish`]).
#[inline(always)]
fn read_slot<F: Family>(cookie: u64) -> Option<RingEntry<F::Address>> {
    // Mutable only because the field pointers are shared with `publish`; only read here.
    let slot = F::sockets().get_ptr(socket_slot(cookie))?.cast_mut();
    // SAFETY: pointer from a successful lookup, valid for this run; field pointers stay
    // inside the entry.
    unsafe {
        let fields = F::ring_fields(slot);
        if fields.cookie.read_volatile() != cookie {
            return None;
        }
        let entry = RingEntry {
            backend_address: F::Address::read_volatile(fields.backend_address),
            backend_port: fields.backend_port.read_volatile(),
            frontend: Frontend {
                address: F::Address::read_volatile(fields.frontend_address),
                port: fields.frontend_port.read_volatile(),
                service_id: fields.service_id.read_volatile(),
            },
        };
        (fields.cookie.read_volatile() == cookie).then_some(entry)
    }
}

/// recvmsg/getpeername: shows the frontend instead of the backend, counted; always allows.
#[inline(always)]
pub fn reverse_verdict<F: Family>(sock: &SockAddr) -> i32 {
    if reverse::<F>(sock) {
        bump(|c| &mut c.reverse_translated);
    }
    PROCEED
}

/// If this socket reached the peer through a frontend, shows the frontend instead: the
/// socket ring for a connect()ed socket, else the LRU entries of unconnected UDP (and of
/// sockets connected under an agent older than the ring). Returns whether it rewrote.
#[inline(always)]
fn reverse<F: Family>(sock: &SockAddr) -> bool {
    let cookie = sock.socket_cookie();
    let peer = F::destination(sock);
    let port = sock.port();
    let frontend = if let Some(slot) = read_slot::<F>(cookie)
        && slot.backend_address.same(&peer)
        && slot.backend_port == port
    {
        slot.frontend
    } else {
        let Some(frontend) = F::reverse().get_ptr(&F::reverse_key(cookie, peer, port)) else {
            return false;
        };
        // SAFETY: pointer from a successful lookup.
        F::frontend(unsafe { &*frontend })
    };
    F::set_destination(sock, frontend.address, frontend.port);
    let decision = Decision {
        reason: TRACE_REASON_REVERSE,
        service_id: frontend.service_id,
        backend: (peer, port),
        ..Decision::new(
            TRACE_SOURCE_REVERSE,
            served_protocol(sock).unwrap_or(0),
            (frontend.address, frontend.port),
        )
    };
    trace::socket(&decision, sock, cookie);
    true
}
