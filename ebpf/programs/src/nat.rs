//! Network address translation of flows from outside: the SNAT source port a flow to a
//! backend on another node gets (so that its replies come back to this node), and the
//! rewrite of a packet to what its flow's conntrack entry says, both ways. ICMP errors
//! about a flow are translated by `icmp`.
use aya_ebpf::helpers;
use socklb_abi::{CT_FORWARD, CtEntry, CtTimeouts, NodeConfig};

use crate::{
    conntrack::{Closing, Holder, NOEXIST, held, key, reply_of},
    family::Family,
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
    now: u32,
) -> Result<Option<u16>, i32> {
    if F::SPLIT_FRAMES {
        match insert_snat_apart::<F>(arrived, forward, snat_address, node, now) {
            NO_PORT => Ok(None),
            port @ 0..=0xffff => Ok(Some(port as u16)),
            error => Err(error as i32),
        }
    } else {
        insert_snat_here::<F>(arrived, forward, snat_address, node, now)
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
    now: u32,
) -> i64 {
    match insert_snat_here::<F>(arrived, forward, snat_address, node, now) {
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
    now: u32,
) -> Result<Option<u16>, i32> {
    let timeouts = CtTimeouts::of(Some(node));
    let (min, max) = (node.snat_port_min, node.snat_port_max);
    if min == 0 || max < min {
        return Ok(None);
    }
    let span = u32::from(max - min) + 1;
    forward.source = snat_address;
    for _ in 0..SNAT_ATTEMPTS {
        // SAFETY: helper without arguments.
        let draw = unsafe { helpers::bpf_get_prandom_u32() };
        // span >= 1 and the sum stays within min..=max, a u16.
        let port = (u32::from(min) + draw % span) as u16;
        forward.source_port = port.to_be();
        let (reply_key, reply) = reply_of(arrived, forward);
        if held::<F>(
            F::conntrack(),
            true,
            &reply_key,
            timeouts,
            now,
            Closing::Lives,
        ) == Holder::Live
        {
            continue;
        }
        if held::<F>(
            F::conntrack_new(),
            false,
            &reply_key,
            timeouts,
            now,
            Closing::Lives,
        ) == Holder::Live
        {
            continue;
        }
        // Free (an expired holder's entries are gone): claimed only if no other CPU
        // claimed it since.
        let table = F::conntrack_new();
        if table
            .insert(F::ct_key(&reply_key), F::ct_entry(&reply), NOEXIST)
            .is_err()
        {
            continue;
        }
        let forward_key = key(arrived, CT_FORWARD);
        if let Err(error) = table.insert(F::ct_key(&forward_key), F::ct_entry(forward), NOEXIST) {
            let _ = table.remove(F::ct_key(&reply_key));
            return Err(error);
        }
        return Ok(Some(port));
    }
    Ok(None)
}
