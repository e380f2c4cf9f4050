//! The maps, as described in socklb-abi. Capacities here are placeholders: the agent sets
//! the real ones at load time from its flags.
use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf, SkStorage},
    macros::btf_map,
};
use socklb_abi::{
    AffinityEntry, AffinityKey, AffinityKey6, Backend, Backend6, Counters, CtEntry, CtEntry6,
    CtKey, CtKey6, FLOW_FILTER_ENTRIES, FRONTEND_FILTER_ENTRIES, FragmentKey, FragmentKey6,
    FragmentPorts, FrontendName, GONE_CAPACITY, GoneKey, GoneKey6, MaglevKey, NodeConfig,
    NodeConfig6, ReverseEntry, ReverseEntry6, ReverseKey, ReverseKey6, ServiceEntry, ServiceKey,
    ServiceKey6, SlotPair, SocketFrontend, SocketFrontend6, SocketRecord, SocketRecordCount,
    SourceRange, SourceRange6, SourceVerdict, TraceControl, TraceEvent,
};

/// The shapes the service, reverse and socket maps of both families share, so that `socket`
/// names them once (see `socket_family`).
pub type ServiceMap<K, V> = HashMap<K, V, 65536, { BPF_F_NO_PREALLOC as usize }>;
pub type ReverseMap<K, V> = LruHashMap<K, V, 65536>;
pub type SocketRing<T> = Array<T, 262144>;

/// Not preallocated, as the backend map: their memory follows the entries the agent
/// programmed (docs/operations.md, "Map memory and capacities").
///
/// Reader safety is unchanged by this. Since Linux 6.1 an element freed by an update or a
/// delete goes back to the BPF memory allocator, which may hand it out again at once, as the
/// preallocated pool does: neither flavour waits for an RCU grace period before reuse. The
/// programs copy an entry out right after its lookup, and the writer's order (slots before
/// the count, ranges freed one sync later) with the programs' bounded re-read is what keeps
/// a lookup consistent, whichever way the elements are allocated.
#[btf_map(name = "socklb_svc_v3", pin_by_name)]
pub static SERVICES: ServiceMap<ServiceKey, ServiceEntry> = HashMap::new();

/// The frontends' backend slots: backend ids, each frontend's at the range its master entry
/// names. An array the agent maps and writes with plain stores: a million slots cost a
/// million hash-map inserts before, about half of a first sync of 100,000 Services. A slot
/// is one aligned word, so a program reads either its old or its new id.
#[btf_map(name = "socklb_slot_v1", pin_by_name)]
pub static SLOTS: Array<SlotPair, 32768, { BPF_F_MMAPABLE as usize }> = Array::new();

/// Indexed by backend id: the agent hands out the lowest free ids, so the array is about
/// as large as the backends it holds, and a million of them are written in a tenth of the
/// time a hash map takes. An id no backend holds reads as zeros.
#[btf_map(name = "socklb_be_v3", pin_by_name)]
pub static BACKENDS: Array<Backend, 65536> = Array::new();

/// IPv6 frontends: [`SERVICES`] with 16-byte addresses. The agent sizes it as [`SERVICES`].
#[btf_map(name = "socklb_svc6_v2", pin_by_name)]
pub static SERVICES6: ServiceMap<ServiceKey6, ServiceEntry> = HashMap::new();

/// IPv6 backends, by ids of their own (bit 31 set, so that an id says its map).
#[btf_map(name = "socklb_be6_v1", pin_by_name)]
pub static BACKENDS6: HashMap<u32, Backend6, 65536, { BPF_F_NO_PREALLOC as usize }> =
    HashMap::new();

#[btf_map(name = "socklb_rev_v1", pin_by_name)]
pub static REVERSE: ReverseMap<ReverseKey, ReverseEntry> = LruHashMap::new();

/// A ring indexed by socket cookie (see [`socket_slot`]): connect() writes its slot with
/// one store, where an insert into a hash or LRU map would take a lock and cold memory.
#[btf_map(name = "socklb_sock_v1", pin_by_name)]
pub static SOCKETS: SocketRing<SocketFrontend> = Array::new();

#[btf_map(name = "socklb_rev6_v1", pin_by_name)]
pub static REVERSE6: ReverseMap<ReverseKey6, ReverseEntry6> = LruHashMap::new();

/// [`SOCKETS`] of IPv6 sockets: the same size, so [`socket_slot`] serves both.
#[btf_map(name = "socklb_sock6_v1", pin_by_name)]
pub static SOCKETS6: SocketRing<SocketFrontend6> = Array::new();

/// The socket maps' size minus one, set by the agent at load time (socklb-abi `globals`).
/// A read-only global: the verifier sees it as a constant.
#[unsafe(no_mangle)]
static SOCKET_SLOT_MASK: u32 = 262_143;

/// The socket map slot of the socket with `cookie`.
#[inline(always)]
pub fn socket_slot(cookie: u64) -> u32 {
    // SAFETY: a read of an initialised static; volatile so the agent's value is used, not
    // the compiled-in default.
    let mask = unsafe { core::ptr::read_volatile(&SOCKET_SLOT_MASK) };
    // Truncating is the point: the low bits of the cookie pick the slot.
    (cookie as u32) & mask
}

/// Each translated socket's own record, for the destroy iterators (see `record`).
#[btf_map(name = "socklb_skrec_v1", pin_by_name)]
pub static SOCKET_RECORDS: SkStorage<SocketRecord> = SkStorage::new();

/// How many sockets hold a record (see `record`).
#[btf_map(name = "socklb_skcnt_v1", pin_by_name)]
pub static SOCKET_RECORD_COUNT: Array<SocketRecordCount, 1> = Array::new();

/// The pods' namespaces the socket hooks translate besides the host's (see `socket`).
#[btf_map(name = "socklb_lbns_v1", pin_by_name)]
pub static SOCKET_LB_NAMESPACES: HashMap<
    u64,
    u8,
    SOCKET_LB_NAMESPACES_CAPACITY,
    { BPF_F_NO_PREALLOC as usize },
> = HashMap::new();

/// The served pod devices by interface index, with their `POD_DEVICE_*` flags (see
/// `deliver`).
#[btf_map(name = "socklb_podif_v1", pin_by_name)]
pub static POD_DEVICES: HashMap<u32, u8, POD_DEVICES_CAPACITY, { BPF_F_NO_PREALLOC as usize }> =
    HashMap::new();

/// Devices in [`POD_DEVICES`] at most: as many as pods' namespaces.
pub const POD_DEVICES_CAPACITY: usize = SOCKET_LB_NAMESPACES_CAPACITY;

/// Network namespaces in [`SOCKET_LB_NAMESPACES`] at most: far beyond a node's pods (the
/// kubelet allows 110 by default).
pub const SOCKET_LB_NAMESPACES_CAPACITY: usize = 4_096;

/// Placeholder capacity of the affinity maps of both families.
pub const AFFINITY_CAPACITY: usize = 65536;

#[btf_map(name = "socklb_aff_v1", pin_by_name)]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityEntry, AFFINITY_CAPACITY> = LruHashMap::new();

#[btf_map(name = "socklb_cnt_v8", pin_by_name)]
pub static COUNTERS: PerCpuArray<Counters, 1> = PerCpuArray::new();

/// Placeholder capacity of both conntrack tables, which share one type.
pub const CT_CAPACITY: usize = 262_144;

/// Confirmed flows from outside (see `conntrack`).
#[btf_map(name = "socklb_ct_v1", pin_by_name)]
pub static CONNTRACK: LruHashMap<CtKey, CtEntry, CT_CAPACITY> = LruHashMap::new();

/// Flows from outside not yet confirmed.
#[btf_map(name = "socklb_ctn_v1", pin_by_name)]
pub static CONNTRACK_NEW: LruHashMap<CtKey, CtEntry, CT_CAPACITY> = LruHashMap::new();

/// Which packets may have an entry in the conntrack tables of either family (see
/// `flow_filter`). Mmapable, so that the agent marks slots as the programs do.
#[btf_map(name = "socklb_ctf_v2", pin_by_name)]
pub static FLOW_FILTER: Array<u64, { FLOW_FILTER_ENTRIES as usize }, { BPF_F_MMAPABLE as usize }> =
    Array::new();

/// Which packets may be addressed to a frontend (see `frontend_filter`). Mmapable: the
/// agent marks the slots, the programs only read them.
#[btf_map(name = "socklb_fef_v1", pin_by_name)]
pub static FRONTEND_FILTER: Array<
    u64,
    { FRONTEND_FILTER_ENTRIES as usize },
    { BPF_F_MMAPABLE as usize },
> = Array::new();

/// Ports of first fragments, for the later fragments of the same datagram (see `packet`).
#[btf_map(name = "socklb_frag_v1", pin_by_name)]
pub static FRAGMENTS: LruHashMap<FragmentKey, FragmentPorts, 8192> = LruHashMap::new();

#[btf_map(name = "socklb_node_v4", pin_by_name)]
pub static NODE: Array<NodeConfig, 1> = Array::new();

#[btf_map(name = "socklb_src_v1", pin_by_name)]
pub static SOURCE_RANGES: LpmTrie<SourceRange, SourceVerdict, 65536> = LpmTrie::new();

/// Not preallocated: only nodes with Maglev Services pay for tables.
#[btf_map(name = "socklb_mglv_v1", pin_by_name)]
pub static MAGLEV: HashMap<MaglevKey, u32, 262144, { BPF_F_NO_PREALLOC as usize }> = HashMap::new();

/// Written by the agent for `socklb inspect` and bpftool; no program reads it.
#[btf_map(name = "socklb_names_v1", pin_by_name)]
pub static NAMES: HashMap<u32, FrontendName, 65536, { BPF_F_NO_PREALLOC as usize }> =
    HashMap::new();

/// Trace events for `socklb trace` (see `trace`): 256 KiB, about 1,900 events between two
/// reads of the session.
#[btf_map(name = "socklb_trace_v2", pin_by_name)]
pub static TRACE: RingBuf<TraceEvent, { 256 * 1024 }> = RingBuf::new();

#[btf_map(name = "socklb_trctl_v2", pin_by_name)]
pub static TRACE_CONTROL: Array<TraceControl, 1> = Array::new();

/// The (frontend, backend) pairs whose sockets the destroy iterators close; filled by the
/// agent for one sweep. Not pinned: it belongs to the agent that loaded the iterators.
#[btf_map(name = "socklb_gone_v1")]
pub static GONE: HashMap<GoneKey, u8, { GONE_CAPACITY as usize }> = HashMap::new();

/// [`GONE`] of IPv6 frontends. Not pinned either.
#[btf_map(name = "socklb_gone6_v1")]
pub static GONE6: HashMap<GoneKey6, u8, { GONE_CAPACITY as usize }> = HashMap::new();

// IPv6 flows from outside (socklb-abi `map_names::*6`): the same roles as the IPv4 maps
// above, keyed by 16-byte addresses.

/// ClientIP affinity of IPv6 clients outside the node.
#[btf_map(name = "socklb_aff6_v1", pin_by_name)]
pub static AFFINITY6: LruHashMap<AffinityKey6, AffinityEntry, AFFINITY_CAPACITY> =
    LruHashMap::new();

/// Confirmed IPv6 flows from outside (see `conntrack`).
#[btf_map(name = "socklb_ct6_v1", pin_by_name)]
pub static CONNTRACK6: LruHashMap<CtKey6, CtEntry6, CT_CAPACITY> = LruHashMap::new();

/// IPv6 flows from outside not yet confirmed.
#[btf_map(name = "socklb_ctn6_v1", pin_by_name)]
pub static CONNTRACK_NEW6: LruHashMap<CtKey6, CtEntry6, CT_CAPACITY> = LruHashMap::new();

/// Ports of first IPv6 fragments (see `packet`): half of IPv4's, as the agent sizes the
/// other IPv6 tables of flows from outside.
#[btf_map(name = "socklb_frag6_v1", pin_by_name)]
pub static FRAGMENTS6: LruHashMap<FragmentKey6, FragmentPorts, 4096> = LruHashMap::new();

#[btf_map(name = "socklb_node6_v1", pin_by_name)]
pub static NODE6: Array<NodeConfig6, 1> = Array::new();

#[btf_map(name = "socklb_src6_v1", pin_by_name)]
pub static SOURCE_RANGES6: LpmTrie<SourceRange6, SourceVerdict, 65536> = LpmTrie::new();

/// Per-CPU room for the IPv6 conntrack key and entry handed to a map helper, and for the
/// packet's flow entry (see `family::V6`): 40-byte keys and 52-byte entries on the stack
/// would not fit IPv6's path into the 512 bytes the verifier allows. A program run never
/// interleaves with another on its CPU. Not pinned: scratch of the loaded programs.
#[repr(C)]
pub struct Scratch6 {
    pub key: CtKey6,
    pub entry: CtEntry6,
    /// The entry the packet's flow is rewritten to, while its steps run.
    pub flow: CtEntry6,
}

#[btf_map(name = "socklb_scr6_v1")]
pub static SCRATCH6: PerCpuArray<Scratch6, 1> = PerCpuArray::new();

/// What [`REJECT_BUDGET`] holds for one CPU: the second it counts, and the answers sent in
/// it.
#[repr(C)]
pub struct RejectBudget {
    pub second: u32,
    pub sent: u32,
}

#[btf_map(name = "socklb_rej_v1")]
pub static REJECT_BUDGET: PerCpuArray<RejectBudget, 1> = PerCpuArray::new();
