//! Hostile conditions on the real kernel: floods, shrinking backend sets, agent kills,
//! API-server outages, fragments, full maps and operator mistakes. Each module holds one
//! fault and checks the guarantee that docs/operations.md states for it.
mod api_outage;
mod foreign_cleanup;
mod slow_manifest;
