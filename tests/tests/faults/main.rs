//! Hostile conditions on the real kernel: floods, shrinking backend sets, agent kills,
//! API-server outages, fragments, full maps, map memory and operator mistakes. Each module
//! holds one fault and checks the guarantee that docs/operations.md states for it.
mod agent_killed;
mod api_outage;
mod bad_flags;
mod conntrack_resize;
mod foreign_cleanup;
mod fragments;
mod l3_device;
mod large_service;
mod low_ttl;
mod map_growth;
mod map_memory;
mod netlink_attach;
mod no_endpoints;
mod path_mtu;
mod pin_dir;
mod raised_capacity;
mod renamed_maps;
mod shrinking_churn;
mod slow_manifest;
mod snat_port_reuse;
mod syn_flood;
mod tcp_state;
mod udp_state;
