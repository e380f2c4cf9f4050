//! The maps, as described in socklb-abi. Capacities here are placeholders: the agent sets
//! the real ones at load time from its flags.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray},
    macros::btf_map,
};
use socklb_abi::{
    AffinityEntry, AffinityKey, Backend, Counters, CtEntry, CtKey, FrontendName, MaglevKey,
    NodeConfig, ReverseEntry, ReverseKey, ServiceEntry, ServiceKey, SourceRange, SourceVerdict,
};

#[btf_map(name = "socklb_svc_v1", pin_by_name)]
pub static SERVICES: HashMap<ServiceKey, ServiceEntry, 65536> = HashMap::new();

#[btf_map(name = "socklb_be_v1", pin_by_name)]
pub static BACKENDS: HashMap<u32, Backend, 65536> = HashMap::new();

#[btf_map(name = "socklb_rev_v1", pin_by_name)]
pub static REVERSE: LruHashMap<ReverseKey, ReverseEntry, 65536> = LruHashMap::new();

#[btf_map(name = "socklb_aff_v1", pin_by_name)]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityEntry, 65536> = LruHashMap::new();

#[btf_map(name = "socklb_cnt_v2", pin_by_name)]
pub static COUNTERS: PerCpuArray<Counters, 1> = PerCpuArray::new();

#[btf_map(name = "socklb_ct_v1", pin_by_name)]
pub static CONNTRACK: LruHashMap<CtKey, CtEntry, 262144> = LruHashMap::new();

#[btf_map(name = "socklb_node_v1", pin_by_name)]
pub static NODE: Array<NodeConfig, 1> = Array::new();

#[btf_map(name = "socklb_lbsrc_v1", pin_by_name)]
pub static SOURCE_RANGES: LpmTrie<SourceRange, SourceVerdict, 65536> = LpmTrie::new();

/// Not preallocated: only nodes with Maglev Services pay for tables.
#[btf_map(name = "socklb_mglv_v1", pin_by_name)]
pub static MAGLEV: HashMap<MaglevKey, u32, 262144, { BPF_F_NO_PREALLOC as usize }> = HashMap::new();

/// Written by the agent for `socklb inspect` and bpftool; no program reads it.
#[btf_map(name = "socklb_names_v1", pin_by_name)]
pub static NAMES: HashMap<u32, FrontendName, 65536, { BPF_F_NO_PREALLOC as usize }> =
    HashMap::new();
