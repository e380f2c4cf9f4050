//! Network address translation of flows from outside: the SNAT source port a flow to a
//! backend on another node gets (so that its replies come back to this node), and the
//! rewrite of a packet to what its flow's conntrack entry says, both ways. ICMP errors
//! about a flow are translated by `icmp`.
use core::{any::TypeId, ffi::c_void};

use aya_ebpf::helpers;
use socklb_abi::{CT_FORWARD, CtEntry, CtTimeouts, Ipv6Words, NodeConfig};

use crate::{
    conntrack::{Closing, Holder, NOEXIST, held, key, now_s, reply_of},
    family::{Family, V4, V6},
    flow_filter,
    maps::NODE,
    packet::{Address, Packet, PacketError, Tuple},
};

/// Random ports tried before a flow is refused for lack of a free SNAT port.
const SNAT_ATTEMPTS: u32 = 16;

type Entry<F> = CtEntry<<F as Family>::Addr>;

/// Rewrites the packet to what its flow's conntrack entry says.
#[inline(always)]
pub fn rewrite<A: Address>(packet: &mut Packet<A>, entry: &CtEntry<A>) -> Result<(), PacketError> {
    packet.rewrite(
        entry.source,
        entry.source_port,
        entry.destination,
        entry.destination_port,
    )
}

/// Records both directions of a new flow SNATed to `snat_address`, as not confirmed,
/// and returns the source port it got: a random port of the configured range whose reply
/// key no live flow holds in either table (a flow whose entries expired gives its port
/// up). `None` when every attempt found a live flow; [`EEXIST`] when another CPU made the
/// flow first. A port is claimed only by an insert that finds its key free, so two CPUs
/// never both take one.
#[inline(always)]
pub fn insert_snat<F: Family>(
    arrived: &Tuple<F::Addr>,
    forward: &mut Entry<F>,
    snat_address: F::Addr,
    node: &NodeConfig,
) -> Result<Option<u16>, i32> {
    if F::SPLIT_FRAMES {
        match insert_snat_apart::<F>(arrived, forward, snat_address, node) {
            NO_PORT => Ok(None),
            port @ 0..=0xffff => Ok(Some(port as u16)),
            error => Err(error as i32),
        }
    } else {
        insert_snat_here::<F>(arrived, forward, snat_address, node)
    }
}

/// [`insert_snat_apart`]'s "no port free".
const NO_PORT: i64 = 0x1_0000;

/// [`insert_snat`] in a stack frame of its own ([`Family::SPLIT_FRAMES`]), returning a
/// plain integer (the port, [`NO_PORT`], or a negative error): the caller of a `Result`
/// returned through memory reads payloads never written, which the verifier refuses.
#[inline(never)]
fn insert_snat_apart<F: Family>(
    arrived: &Tuple<F::Addr>,
    forward: &mut Entry<F>,
    snat_address: F::Addr,
    node: &NodeConfig,
) -> i64 {
    match insert_snat_here::<F>(arrived, forward, snat_address, node) {
        Ok(Some(port)) => i64::from(port),
        Ok(None) => NO_PORT,
        Err(error) => i64::from(error.min(-1)),
    }
}

#[inline(always)]
fn insert_snat_here<F: Family>(
    arrived: &Tuple<F::Addr>,
    forward: &mut Entry<F>,
    snat_address: F::Addr,
    node: &NodeConfig,
) -> Result<Option<u16>, i32> {
    let (min, max) = (node.snat_port_min, node.snat_port_max);
    if min == 0 || max < min {
        return Ok(None);
    }
    forward.source = snat_address;
    flow_filter::mark_unconfirmed(arrived);
    let mut attempts = Attempts::<F> {
        arrived,
        forward: &raw mut *forward,
        outcome: NO_PORT,
    };
    // In bpf_loop rather than a loop of our own: the verifier checks the attempt once, not
    // once per iteration (sixteen of them were 70% of a TC program's verification).
    // SAFETY: `try_port::<F>` takes the pointer as the `Attempts<F>` it is, and bpf_loop
    // calls it only before it returns.
    unsafe {
        helpers::bpf_loop(
            SNAT_ATTEMPTS,
            try_port::<F> as *mut c_void,
            (&raw mut attempts).cast(),
            0,
        )
    };
    let outcome = attempts.outcome;
    attempts.clear_pointers();
    match outcome {
        NO_PORT => Ok(None),
        port @ 0..=0xffff => {
            flow_filter::mark_unconfirmed(arrived);
            Ok(Some(port as u16))
        }
        error => Err(error as i32),
    }
}

/// What each of [`try_port`]'s attempts reads, and what the last one leaves. The rest (the
/// port range, the timeouts, the time) an attempt reads itself: this struct is in the
/// frame of the programs' deepest call chain, which has no byte to spare.
struct Attempts<F: Family> {
    arrived: *const Tuple<F::Addr>,
    forward: *mut Entry<F>,
    /// The port claimed, [`NO_PORT`], or a negative error.
    outcome: i64,
}

impl<F: Family> Attempts<F> {
    /// Overwrites the pointers whole once bpf_loop is done. The compiler reuses their stack
    /// slots, and without CAP_PERFMON the verifier refuses a narrower store over a pointer
    /// ("attempt to corrupt spilled pointer on stack").
    #[inline(always)]
    fn clear_pointers(&mut self) {
        // SAFETY: writes to this struct's own fields; volatile so that they are not dropped
        // as dead stores.
        unsafe {
            core::ptr::write_volatile(&raw mut self.arrived, core::ptr::null());
            core::ptr::write_volatile(&raw mut self.forward, core::ptr::null_mut());
        }
    }
}

/// One attempt of [`insert_snat`], as bpf_loop's callback: 0 to draw again, 1 once the
/// outcome is known.
extern "C" fn try_port<F: Family>(_index: u64, attempts: *mut c_void) -> i64 {
    const AGAIN: i64 = 0;
    const DONE: i64 = 1;
    // SAFETY: the pointer `insert_snat_here` handed bpf_loop, to its live `Attempts<F>`,
    // whose pointers lead to its live tuple and entry until bpf_loop returns.
    let attempts = unsafe { &mut *attempts.cast::<Attempts<F>>() };
    let (arrived, forward) = (attempts.arrived, attempts.forward);
    // Each family's attempt is a global function: the verifier checks it once, on its own,
    // where it checks a static one again for every state its callers reach it in (that was
    // half of each TC program's verification, and of the agent's start). A global function
    // cannot be generic: `F` picks its family's (the pointers are of that family's types).
    let outcome = if TypeId::of::<F>() == TypeId::of::<V4>() {
        socklb_snat_attempt4(arrived.cast(), forward.cast())
    } else {
        socklb_snat_attempt6(arrived.cast(), forward.cast())
    };
    match outcome {
        TAKEN => AGAIN,
        outcome => {
            attempts.outcome = outcome;
            DONE
        }
    }
}

/// [`attempt`]'s "a live flow holds the port drawn".
const TAKEN: i64 = 0x2_0000;

/// [`attempt`] for IPv4 flows. A global function (exported, not generic), which the
/// verifier checks once, knowing of its arguments only their types.
#[unsafe(no_mangle)]
extern "C" fn socklb_snat_attempt4(arrived: *const Tuple<u32>, forward: *mut CtEntry<u32>) -> i64 {
    attempt::<V4>(arrived, forward)
}

/// [`attempt`] for IPv6 flows.
#[unsafe(no_mangle)]
extern "C" fn socklb_snat_attempt6(
    arrived: *const Tuple<Ipv6Words>,
    forward: *mut CtEntry<Ipv6Words>,
) -> i64 {
    attempt::<V6>(arrived, forward)
}

/// Draws a port and claims it if free: the port, a negative error, or [`TAKEN`].
#[inline(always)]
fn attempt<F: Family>(arrived: *const Tuple<F::Addr>, forward: *mut Entry<F>) -> i64 {
    // SAFETY: the caller's live tuple and entry. The verifier has a global function check
    // its pointers against null.
    let (Some(arrived), Some(forward)) = (unsafe { arrived.as_ref() }, unsafe { forward.as_mut() })
    else {
        return NO_PORT;
    };
    let Some(node) = NODE.get(0) else {
        return NO_PORT;
    };
    let (min, max) = (u32::from(node.snat_port_min), u32::from(node.snat_port_max));
    let span = max.wrapping_sub(min).wrapping_add(1);
    // `span == 0` never holds here, but said, so that `% span` has no panic path.
    if min == 0 || max < min || span == 0 {
        return NO_PORT;
    }
    let timeouts = CtTimeouts::of(Some(node));
    let now = now_s();
    // SAFETY: helper without arguments.
    let draw = unsafe { helpers::bpf_get_prandom_u32() };
    // The sum stays within the configured range, a u16.
    let port = (min + draw % span) as u16;
    forward.source_port = port.to_be();
    // The reply's key now, its entry only once the port is found free: the stack frame of
    // the programs' deepest call chain holds one of them at a time.
    let (reply_key, _) = reply_of(arrived, forward);
    if held::<F>(
        F::conntrack(),
        true,
        &reply_key,
        timeouts,
        now,
        Closing::Lives,
    ) == Holder::Live
        || held::<F>(
            F::conntrack_new(),
            false,
            &reply_key,
            timeouts,
            now,
            Closing::Lives,
        ) == Holder::Live
    {
        return TAKEN;
    }
    // Free (an expired holder's entries are gone): claimed only if no other CPU claimed
    // it since.
    let table = F::conntrack_new();
    let (_, reply) = reply_of(arrived, forward);
    if table
        .insert(F::ct_key(&reply_key), F::ct_entry(&reply), NOEXIST)
        .is_err()
    {
        return TAKEN;
    }
    let forward_key = key(arrived, CT_FORWARD);
    match table.insert(F::ct_key(&forward_key), F::ct_entry(forward), NOEXIST) {
        Ok(()) => i64::from(port),
        Err(error) => {
            let _ = table.remove(F::ct_key(&reply_key));
            i64::from(error.min(-1))
        }
    }
}
