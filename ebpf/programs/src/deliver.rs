//! Delivery of the packets socklb forwards itself (a SNATed flow to its remote backend, and
//! that flow's replies): the FIB names the egress device and its neighbour, and the packet
//! is redirected there, past the node's netfilter; a destination the FIB leaves to the
//! kernel (local, unroutable) goes on through the kernel's own path. A packet too big for
//! the path is left as it is, for the entry to answer (`reject`).
use core::mem::{MaybeUninit, align_of, size_of};

use aya_ebpf::{
    EbpfContext,
    bindings::{__sk_buff, bpf_fib_lookup},
    helpers,
    programs::TcContext,
};
use socklb_abi::{CtEntry, POD_DEVICE_VETH};

use crate::{
    family::Family,
    maps::POD_DEVICES,
    nat,
    packet::{Packet, PacketError},
};

/// TC verdicts.
pub const TC_ACT_OK: i32 = 0;
pub const TC_ACT_SHOT: i32 = 2;
/// Verdicts at or below this one: a packet too big for the path to its backend, answered
/// from the entry (see `reject`) with the MTU `TOO_BIG - verdict`.
pub const TOO_BIG: i32 = -0x1_0000;

const ETH_ALEN: usize = 6;
/// `bpf_fib_lookup` results.
const FIB_SUCCESS: i64 = 0;
const FIB_NO_NEIGHBOUR: i64 = 7;
const FIB_FRAG_NEEDED: i64 = 8;

/// Zeroes `buffer` with eight 8-byte stores and returns it as an all-zero
/// `bpf_fib_lookup`. `zeroed()` would become a call to a byte loop (bpf-linker lowers
/// memset to aya-ebpf's `memset`) whose stack pointer arithmetic the verifier refuses
/// without CAP_PERFMON (Spectre v1 rules: "pointer arithmetic ... prohibited for !root").
/// The stores are volatile and the struct is used in place, so that LLVM can neither merge
/// them into a memset nor re-zero a copy.
#[inline(always)]
fn zeroed_fib_params(buffer: &mut MaybeUninit<[u64; 8]>) -> &mut bpf_fib_lookup {
    const _: () = assert!(size_of::<bpf_fib_lookup>() == size_of::<[u64; 8]>());
    const _: () = assert!(align_of::<bpf_fib_lookup>() <= align_of::<[u64; 8]>());
    let words = buffer.as_mut_ptr().cast::<u64>();
    // SAFETY: each store is within the eight-word buffer; after them every byte is written,
    // and all zeroes is a valid bpf_fib_lookup (a plain C struct of integers) that fits the
    // buffer's size and alignment.
    unsafe {
        words.write_volatile(0);
        words.add(1).write_volatile(0);
        words.add(2).write_volatile(0);
        words.add(3).write_volatile(0);
        words.add(4).write_volatile(0);
        words.add(5).write_volatile(0);
        words.add(6).write_volatile(0);
        words.add(7).write_volatile(0);
        &mut *buffer.as_mut_ptr().cast::<bpf_fib_lookup>()
    }
}

/// Sends a packet on towards its new destination, rewritten first to `to` if given (else
/// already translated): straight to the egress device the FIB names, or to the kernel's
/// own path when the destination is local or unroutable (its usual errors then apply).
/// A packet of a flow delivered directly (`to_pod`) is redirected only to a served pod
/// device ([`POD_DEVICES`]), whose program takes the flow's answers; to any other device
/// (one the per-packet path does not serve, a bridge) it takes the kernel's path, as its
/// answers will. Into a veth's pod it goes at once (`bpf_redirect_peer`, from a TC
/// ingress: no second pass through the device's queue and egress).
/// A packet still to be rewritten is looked up with its size: one too big for the path
/// (and not to be fragmented) is left as it is and its verdict is [`TOO_BIG`] less the
/// path's MTU, for the entry to answer.
#[inline(always)]
pub fn forward<F: Family>(
    ctx: &TcContext,
    packet: &mut Packet<F::Addr>,
    to: Option<&CtEntry<F::Addr>>,
    to_pod: bool,
) -> Result<i32, PacketError> {
    let hop = if F::SPLIT_FRAMES {
        next_hop_apart::<F>(ctx, packet, to)
    } else {
        next_hop_here::<F>(ctx, packet, to)
    };
    if hop <= HOP_TOO_BIG {
        return Ok(TOO_BIG - (HOP_TOO_BIG - hop) as i32);
    }
    if hop == HOP_ERROR {
        return Err(PacketError);
    }
    if let Some(entry) = to {
        nat::rewrite(packet, entry)?;
    }
    if hop == HOP_STACK {
        return Ok(TC_ACT_OK);
    }
    let ifindex = hop as u32;
    let pod_device = if to_pod { pod_device(ifindex) } else { None };
    if to_pod && pod_device.is_none() {
        return Ok(TC_ACT_OK);
    }
    packet.decrement_ttl()?;
    if hop & HOP_NEIGHBOUR != 0 {
        // SAFETY: a null neighbour lets the kernel resolve the next hop itself.
        return Ok(
            unsafe { helpers::bpf_redirect_neigh(ifindex, core::ptr::null_mut(), 0, 0) } as i32,
        );
    }
    if pod_device.is_some_and(|flags| flags & POD_DEVICE_VETH != 0) {
        // SAFETY: plain helper call without pointers.
        return Ok(unsafe { helpers::bpf_redirect_peer(ifindex, 0) } as i32);
    }
    // SAFETY: plain helper call without pointers.
    Ok(unsafe { helpers::bpf_redirect(ifindex, 0) } as i32)
}

/// The `POD_DEVICE_*` flags of a served pod device ([`POD_DEVICES`]); `None`: not one.
/// `bpf_redirect_peer` drops what it sends to a device that is not a veth.
#[inline(always)]
fn pod_device(ifindex: u32) -> Option<u8> {
    // SAFETY: a plain integer read at once from a successful lookup.
    unsafe { POD_DEVICES.get(&ifindex) }.copied()
}

/// [`next_hop_here`]'s answers besides an egress device's index: the kernel's path.
const HOP_STACK: i64 = 0;
/// A helper failed.
const HOP_ERROR: i64 = -1;
/// With the device's index: its neighbour is not resolved yet (the kernel resolves it).
const HOP_NEIGHBOUR: i64 = 1 << 32;
/// At or below: too big for the path, whose MTU is `HOP_TOO_BIG - hop`.
const HOP_TOO_BIG: i64 = -2;

/// [`next_hop_here`] in a stack frame of its own ([`Family::SPLIT_FRAMES`]).
#[inline(never)]
fn next_hop_apart<F: Family>(
    ctx: &TcContext,
    packet: &Packet<F::Addr>,
    to: Option<&CtEntry<F::Addr>>,
) -> i64 {
    next_hop_here::<F>(ctx, packet, to)
}

/// Where the packet goes once translated (to `to`, or as it is): the FIB's egress device,
/// whose MAC addresses are written into the packet (they are not part of a rewrite), or
/// one of the `HOP_*` answers. A plain integer: the caller of a `Result` returned through
/// memory reads the payload of an error too, a read of stack never written, which the
/// verifier refuses.
#[inline(always)]
fn next_hop_here<F: Family>(
    ctx: &TcContext,
    packet: &Packet<F::Addr>,
    to: Option<&CtEntry<F::Addr>>,
) -> i64 {
    let mut buffer = MaybeUninit::uninit();
    let fib = zeroed_fib_params(&mut buffer);
    fib.family = F::AF;
    fib.l4_protocol = packet.tuple.protocol;
    // SAFETY: the context is the valid __sk_buff of this run.
    let skb = unsafe { &*ctx.as_ptr().cast::<__sk_buff>() };
    match to {
        Some(entry) => {
            fib.sport = entry.source_port;
            fib.dport = entry.destination_port;
            F::fib_addresses(fib, entry.source, entry.destination);
            // The path's MTU is checked against what the packet leaves as (one segment
            // of a GSO batch).
            fib.__bindgen_anon_1.tot_len = packet.wire_length() as u16;
        }
        None => {
            fib.sport = packet.tuple.source_port;
            fib.dport = packet.tuple.destination_port;
            F::fib_addresses(fib, packet.tuple.source, packet.tuple.destination);
        }
    }
    fib.ifindex = skb.ingress_ifindex;
    // SAFETY: fib is a valid, writable bpf_fib_lookup of the size passed.
    let rc = unsafe {
        helpers::bpf_fib_lookup(
            ctx.as_ptr(),
            &mut *fib,
            size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    };
    match rc {
        FIB_SUCCESS => {
            // SAFETY: reading the MAC pair the successful lookup filled in.
            let macs = unsafe { fib.__bindgen_anon_6.__bindgen_anon_2 };
            if ctx.store(0, &macs.dmac, 0).is_err() || ctx.store(ETH_ALEN, &macs.smac, 0).is_err() {
                return HOP_ERROR;
            }
            i64::from(fib.ifindex)
        }
        FIB_NO_NEIGHBOUR => HOP_NEIGHBOUR | i64::from(fib.ifindex),
        FIB_FRAG_NEEDED if to.is_some() && packet.may_not_fragment() => {
            // SAFETY: the lookup wrote the path's MTU into the union.
            HOP_TOO_BIG - i64::from(unsafe { fib.__bindgen_anon_1.mtu_result })
        }
        _ => HOP_STACK,
    }
}
