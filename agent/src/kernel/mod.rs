//! The kernel's side of the datapath's life: what the host must provide, loading the
//! programs over the pinned maps, attaching them, and removing them again.
//!
//! - `pins`: the pin directory's layout; every other module finds its paths there.
//! - `host`, `devices`, `privileges`: what the node must provide (cgroup v2, bpffs, Ethernet
//!   devices, capabilities), each refusal explained with what to do.
//! - `pod_devices`: which devices are workloads' (the per-packet path's), and when they
//!   change.
//! - `pin_lock`: one agent per pin directory.
//! - `object`, `load`, `carry`, `destroy`, `program_logs`: the embedded object, loaded with
//!   its maps pinned (flow state carried over when a table changes size), the optional
//!   socket iterators, and the programs' own log lines.
//! - `flow_filter`: the filter that spares the TC programs conntrack lookups, distrusted at
//!   each load and seeded from the tables once the new programs run; `mapped_words` maps
//!   it (and the frontend filter, `maps::frontend_filter`) into the agent.
//! - `attach`: the cgroup and TC programs, through pinned links (`links`).
//! - `cleanup`: `socklb cleanup`.
//!
//! Of the model it reads only the maps' sizes (`desired::sizing`); the `dataplane` hands the
//! loaded maps to their writers (docs/architecture.md, "three layers behind one door").
pub mod attach;
pub mod carry;
pub mod cleanup;
pub mod destroy;
pub mod devices;
pub mod flow_filter;
pub mod host;
pub mod links;
pub mod load;
pub mod mapped_words;
pub mod object;
pub mod pin_lock;
pub mod pins;
pub mod pod_devices;
pub mod privileges;
pub mod program_logs;
