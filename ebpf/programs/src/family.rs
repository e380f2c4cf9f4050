//! The address family of a packet from outside: which maps its flow uses and how its
//! addresses fit their keys. The flow logic (`external`, `conntrack`) is written once over
//! [`Family`]; [`V4`] and [`V6`] map it onto the per-family maps of socklb-abi, whose keys
//! and values are one generic declaration over the address (4 or 16 bytes wide). Service and backend
//! ids are one space across both, so the Maglev map serves both.
use aya_ebpf::{
    bindings::bpf_fib_lookup,
    btf_maps::{LruHashMap, lpm_trie::Key},
};
use socklb_abi::{
    AFFINITY_EXTERNAL_CLIENT, AffinityEntry, AffinityKey, AffinityKey6, Backend, Backend6, CtEntry,
    CtEntry6, CtKey, CtKey6, Ipv6Words, SOURCE_ALLOW, SOURCE_RANGE_FRONTEND_BITS,
    SOURCE_RANGE6_FRONTEND_BITS, ServiceKey, ServiceKey6, SourceRange, SourceRange6, ipv6_octets,
};

use crate::{
    backend,
    icmp::Quoting,
    log,
    maps::{
        AFFINITY, AFFINITY_CAPACITY, AFFINITY6, BACKENDS, BACKENDS6, CONNTRACK, CONNTRACK_NEW,
        CONNTRACK_NEW6, CONNTRACK6, CT_CAPACITY, NODE, NODE6, SCRATCH6, SERVICES, SERVICES6,
        SOURCE_RANGES, SOURCE_RANGES6,
    },
    packet::{Address, Tuple},
    trace::TracedValue,
};

/// A frontend's master entry, copied out of the service map.
#[derive(Clone, Copy)]
pub struct Master {
    pub count: u16,
    pub flags: u16,
    pub service_id: u32,
    pub affinity_timeout_s: u32,
    pub first_slot: u32,
}

/// The backend in one of a frontend's slots.
#[derive(Clone, Copy)]
pub struct Slot<A> {
    pub backend_id: u32,
    pub backend_address: A,
    pub backend_port: u16,
    /// `BACKEND_FLAG_*` bits.
    pub flags: u8,
}

/// A conntrack table of one family.
pub type CtTable<F> =
    LruHashMap<CtKey<<F as Family>::Addr>, CtEntry<<F as Family>::Addr>, CT_CAPACITY>;

pub trait Family: Sized + 'static {
    type Addr: Address + Quoting + TracedValue;
    type AffinityKey: Copy;

    /// `bpf_fib_lookup`'s family (AF_INET, AF_INET6).
    const AF: u8;
    /// Whether the larger steps of a flow (SNAT port search, forwarding) run out of line,
    /// each in a stack frame of its own: IPv6's keys and entries are too large for the
    /// whole path to fit the 512 bytes of one frame. IPv4 keeps its path inline.
    const SPLIT_FRAMES: bool;

    /// The confirmed and the unconfirmed conntrack table (see `conntrack`).
    fn conntrack() -> &'static CtTable<Self>;
    fn conntrack_new() -> &'static CtTable<Self>;
    /// A key or entry where a map helper reads it: the caller's own (IPv4), or a copy in
    /// per-CPU scratch room (IPv6), which the caller hands to the helper at once.
    fn ct_key(key: &CtKey<Self::Addr>) -> &CtKey<Self::Addr>;
    fn ct_entry(entry: &CtEntry<Self::Addr>) -> &CtEntry<Self::Addr>;

    /// The master entry, of `scope` (`SCOPE_*`), of the frontend a packet of `tuple` is
    /// addressed to.
    fn master(tuple: &Tuple<Self::Addr>, scope: u8) -> Option<Master>;
    /// A backend's entry by id; `None` if no backend of this family holds the id.
    fn backend_entry(id: u32) -> Option<Backend<Self::Addr>>;

    /// A backend's address and port, by id.
    #[inline(always)]
    fn backend(id: u32) -> Option<(Self::Addr, u16)> {
        let backend = Self::backend_entry(id)?;
        Some((backend.address, backend.port))
    }

    /// ClientIP affinity of clients outside the node.
    fn affinity() -> &'static LruHashMap<Self::AffinityKey, AffinityEntry, AFFINITY_CAPACITY>;
    fn affinity_key(client: Self::Addr, service_id: u32) -> Self::AffinityKey;

    /// loadBalancerSourceRanges: the longest match of (frontend, client) decides; a
    /// frontend without ranges has no entry and lets everyone in.
    fn source_allowed(tuple: &Tuple<Self::Addr>) -> bool;

    /// The Maglev hash of a flow: only what every node sees alike (not the node address a
    /// NodePort flow arrives at), so that every node picks the same backend.
    fn flow_hash(tuple: &Tuple<Self::Addr>) -> u32;

    /// The address flows to remote backends are SNATed to; `None` until the agent wrote one.
    fn snat_address() -> Option<Self::Addr>;

    fn fib_addresses(fib: &mut bpf_fib_lookup, source: Self::Addr, destination: Self::Addr);

    /// Where the entry a packet's flow is rewritten to lives while its steps run: `local`
    /// (IPv4), or per-CPU scratch room (IPv6, whose stack has no room); `None` if that is
    /// missing (never: the array's one entry always exists).
    fn flow_room(local: &mut CtEntry<Self::Addr>) -> Option<&mut CtEntry<Self::Addr>>;

    /// An address all of whose words are `word` (to fill a blank entry).
    fn addr_from(word: u32) -> Self::Addr;

    fn log_missing_slot(address: Self::Addr, port: u16, count: u32, slot: u16);
}

pub struct V4;
pub struct V6;

/// What `V6::ct_key`/`ct_entry` return should the scratch room be missing (never: the
/// array's one entry always exists).
static ZERO_KEY6: CtKey6 = CtKey6 {
    source: [0; 4],
    destination: [0; 4],
    source_port: 0,
    destination_port: 0,
    protocol: 0,
    direction: 0,
    pad: 0,
};
static ZERO_ENTRY6: CtEntry6 = CtEntry6 {
    source: [0; 4],
    destination: [0; 4],
    source_port: 0,
    destination_port: 0,
    backend_id: 0,
    service_id: 0,
    last_seen_s: 0,
    flags: 0,
    sequence_high: 0,
};

/// The master entry lookup, copied out at once (the same fields in both families).
macro_rules! master_lookup {
    ($services:ident, $key:ident) => {
        #[inline(always)]
        fn master(tuple: &Tuple<Self::Addr>, scope: u8) -> Option<Master> {
            let key = $key {
                address: tuple.destination,
                port: tuple.destination_port,
                protocol: tuple.protocol,
                scope,
                slot: 0,
                pad: 0,
            };
            // SAFETY: pointer from a successful lookup; copied out at once.
            let entry = unsafe { *$services.get_ptr(&key)? };
            Some(Master {
                count: entry.count,
                flags: entry.flags,
                service_id: entry.service_id,
                affinity_timeout_s: entry.affinity_timeout_s,
                first_slot: entry.first_slot,
            })
        }
    };
}

/// The backend in `slot` (`1..=count`) of `master`'s frontend; `None` if the slot array has
/// no such index or its id names no backend of this family (an id being replaced).
#[inline(always)]
pub fn backend_slot<F: Family>(master: &Master, slot: u16) -> Option<Slot<F::Addr>> {
    let id = backend::slot_id(master.first_slot, slot)?;
    let backend = F::backend_entry(id)?;
    Some(Slot {
        backend_id: id,
        backend_address: backend.address,
        backend_port: backend.port,
        flags: backend.flags,
    })
}

impl Family for V4 {
    type Addr = u32;
    type AffinityKey = AffinityKey;

    const AF: u8 = 2;
    const SPLIT_FRAMES: bool = false;

    #[inline(always)]
    fn conntrack() -> &'static CtTable<Self> {
        &CONNTRACK
    }

    #[inline(always)]
    fn conntrack_new() -> &'static CtTable<Self> {
        &CONNTRACK_NEW
    }

    #[inline(always)]
    fn ct_key(key: &CtKey) -> &CtKey {
        key
    }

    #[inline(always)]
    fn ct_entry(entry: &CtEntry) -> &CtEntry {
        entry
    }

    master_lookup!(SERVICES, ServiceKey);

    #[inline(always)]
    fn backend_entry(id: u32) -> Option<Backend> {
        // SAFETY: pointer from a successful lookup; copied out at once.
        let backend = unsafe { *BACKENDS.get_ptr(id)? };
        // All zeros: no backend holds the id (the agent always writes the protocol).
        (backend.protocol != 0).then_some(backend)
    }

    #[inline(always)]
    fn affinity() -> &'static LruHashMap<AffinityKey, AffinityEntry, AFFINITY_CAPACITY> {
        &AFFINITY
    }

    #[inline(always)]
    fn affinity_key(client: u32, service_id: u32) -> AffinityKey {
        AffinityKey {
            netns_cookie: AFFINITY_EXTERNAL_CLIENT | u64::from(client),
            service_id,
            pad: 0,
        }
    }

    #[inline(always)]
    fn source_allowed(tuple: &Tuple<u32>) -> bool {
        let key = Key::new(
            SOURCE_RANGE_FRONTEND_BITS + 32,
            SourceRange {
                frontend: tuple.destination,
                port: tuple.destination_port,
                protocol: tuple.protocol,
                pad: 0,
                client: tuple.source,
            },
        );
        SOURCE_RANGES
            .get(&key)
            .is_none_or(|verdict| *verdict == SOURCE_ALLOW)
    }

    #[inline(always)]
    fn flow_hash(tuple: &Tuple<u32>) -> u32 {
        let flow = (u64::from(tuple.source) << 32)
            | (u64::from(tuple.source_port) << 16)
            | u64::from(tuple.destination_port);
        backend::mix(flow ^ u64::from(tuple.protocol).rotate_left(40))
    }

    #[inline(always)]
    fn snat_address() -> Option<u32> {
        NODE.get(0)
            .map(|node| node.snat_address)
            .filter(|address| *address != 0)
    }

    #[inline(always)]
    fn fib_addresses(fib: &mut bpf_fib_lookup, source: u32, destination: u32) {
        fib.__bindgen_anon_3.ipv4_src = source;
        fib.__bindgen_anon_4.ipv4_dst = destination;
    }

    #[inline(always)]
    fn flow_room(local: &mut CtEntry<u32>) -> Option<&mut CtEntry<u32>> {
        Some(local)
    }

    #[inline(always)]
    fn addr_from(word: u32) -> u32 {
        word
    }

    #[inline(always)]
    fn log_missing_slot(address: u32, port: u16, count: u32, slot: u16) {
        log::external_missing_slot(u32::from_be(address), u16::from_be(port), count, slot);
    }
}

impl Family for V6 {
    type Addr = Ipv6Words;
    type AffinityKey = AffinityKey6;

    const AF: u8 = 10;
    const SPLIT_FRAMES: bool = true;

    #[inline(always)]
    fn conntrack() -> &'static CtTable<Self> {
        &CONNTRACK6
    }

    #[inline(always)]
    fn conntrack_new() -> &'static CtTable<Self> {
        &CONNTRACK_NEW6
    }

    /// Written into the per-CPU scratch room (`SCRATCH6`): the caller hands the reference
    /// to a map helper at once, before the next call overwrites it. The fallback (the
    /// array's one entry always exists) is an all-zero key no flow has.
    #[inline(always)]
    fn ct_key(key: &CtKey<Ipv6Words>) -> &CtKey6 {
        let Some(scratch) = SCRATCH6.get_ptr_mut(0) else {
            return &ZERO_KEY6;
        };
        // SAFETY: this CPU's scratch entry, used by this run alone.
        unsafe {
            let slot = &mut (*scratch).key;
            slot.source = key.source;
            slot.destination = key.destination;
            slot.source_port = key.source_port;
            slot.destination_port = key.destination_port;
            slot.protocol = key.protocol;
            slot.direction = key.direction;
            slot.pad = 0;
            &*slot
        }
    }

    /// As [`Self::ct_key`]; the fallback is an all-zero entry.
    #[inline(always)]
    fn ct_entry(entry: &CtEntry<Ipv6Words>) -> &CtEntry6 {
        let Some(scratch) = SCRATCH6.get_ptr_mut(0) else {
            return &ZERO_ENTRY6;
        };
        // SAFETY: as in ct_key. The room's `entry` is no caller's entry, so the addresses
        // are copied as what they are, apart: a copy whose two sides the compiler cannot
        // tell apart (an entry behind a global function's pointer) becomes a memmove, whose
        // pointer subtraction the verifier refuses without CAP_PERFMON.
        unsafe {
            let slot = &mut (*scratch).entry;
            core::ptr::copy_nonoverlapping(&raw const entry.source, &raw mut slot.source, 1);
            core::ptr::copy_nonoverlapping(
                &raw const entry.destination,
                &raw mut slot.destination,
                1,
            );
            slot.source_port = entry.source_port;
            slot.destination_port = entry.destination_port;
            slot.backend_id = entry.backend_id;
            slot.service_id = entry.service_id;
            slot.last_seen_s = entry.last_seen_s;
            slot.flags = entry.flags;
            slot.sequence_high = entry.sequence_high;
            &*slot
        }
    }

    master_lookup!(SERVICES6, ServiceKey6);

    #[inline(always)]
    fn backend_entry(id: u32) -> Option<Backend6> {
        // SAFETY: pointer from a successful lookup; copied out at once.
        Some(unsafe { *BACKENDS6.get_ptr(&id)? })
    }

    #[inline(always)]
    fn affinity() -> &'static LruHashMap<AffinityKey6, AffinityEntry, AFFINITY_CAPACITY> {
        &AFFINITY6
    }

    #[inline(always)]
    fn affinity_key(client: Ipv6Words, service_id: u32) -> AffinityKey6 {
        AffinityKey6 {
            client,
            service_id,
            pad: 0,
        }
    }

    #[inline(always)]
    fn source_allowed(tuple: &Tuple<Ipv6Words>) -> bool {
        let key = Key::new(
            SOURCE_RANGE6_FRONTEND_BITS + 128,
            SourceRange6 {
                frontend: tuple.destination,
                port: tuple.destination_port,
                protocol: tuple.protocol,
                pad: 0,
                client: tuple.source,
            },
        );
        SOURCE_RANGES6
            .get(&key)
            .is_none_or(|verdict| *verdict == SOURCE_ALLOW)
    }

    #[inline(always)]
    fn flow_hash(tuple: &Tuple<Ipv6Words>) -> u32 {
        let [a, b, c, d] = tuple.source;
        let high = (u64::from(a) << 32) | u64::from(b);
        let low = (u64::from(c) << 32) | u64::from(d);
        let ports = (u64::from(tuple.source_port) << 16) | u64::from(tuple.destination_port);
        let address = u64::from(backend::mix(high)) << 32 | u64::from(backend::mix(low));
        backend::mix(address ^ ports ^ u64::from(tuple.protocol).rotate_left(40))
    }

    #[inline(always)]
    fn snat_address() -> Option<Ipv6Words> {
        NODE6
            .get(0)
            .map(|node| node.snat_address)
            .filter(|address| *address != [0; 4])
    }

    #[inline(always)]
    fn fib_addresses(fib: &mut bpf_fib_lookup, source: Ipv6Words, destination: Ipv6Words) {
        fib.__bindgen_anon_3.ipv6_src = source;
        fib.__bindgen_anon_4.ipv6_dst = destination;
    }

    #[inline(always)]
    fn flow_room(_local: &mut CtEntry<Ipv6Words>) -> Option<&mut CtEntry<Ipv6Words>> {
        let scratch = SCRATCH6.get_ptr_mut(0)?;
        // SAFETY: this CPU's scratch entry, used by this run alone; the flow field is used
        // by nothing else.
        Some(unsafe { &mut (*scratch).flow })
    }

    #[inline(always)]
    fn addr_from(word: u32) -> Ipv6Words {
        [word; 4]
    }

    #[inline(always)]
    fn log_missing_slot(address: Ipv6Words, port: u16, count: u32, slot: u16) {
        log::external_missing_slot6(ipv6_octets(address), u16::from_be(port), count, slot);
    }
}
