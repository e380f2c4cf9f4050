//! Harness for the privileged tests: a private network namespace and child cgroup per test,
//! real servers on loopback addresses inside that namespace, the real `socklb-probe` client
//! run inside the cgroup, and cleanup of everything in `Drop`, also when a test panics.
//!
//! A missing prerequisite (not root, no bpffs, no cgroup v2) fails the test with a message
//! naming it; nothing is skipped.
//!
//! The fixtures, one module each:
//! - [`sandbox`]: the test's own network namespace, cgroup and pins;
//! - network: [`netns`] (named namespaces), [`lan`] (the LAN of the tests of traffic from
//!   outside the node), [`testbed`] (a two-node cluster on the fake API server);
//! - clients: [`clients`] (the probe client and checks over its attempts), [`hold`] (a
//!   client that holds its sockets), [`forged`] (segments no socket would send), and
//!   [`raw_socket`] (raw sockets and socket options std does not offer);
//! - servers: [`servers`] (real servers that answer with their name), [`echo`] and
//!   [`boom_server`] (servers for long-lived and out-of-window flows);
//! - the agent: [`agent`] (the real agent), [`privileges`] and [`seccomp`] (as the chart
//!   runs it), [`manifests`] (its file source), [`node_a`] (the one-node cluster most of its
//!   tests run), [`cluster`] and [`fake_apiserver`] (its kube source);
//! - [`family`]: one scenario run over both address families;
//! - [`frontends`]: frontends programmed through the library, without the agent;
//! - [`tools`]: what `tc` and `bpftool` show of what socklb attached and pinned;
//! - [`test_run`] and [`frames`]: one packet through an attached TC program in the kernel's
//!   test harness, and the frames it takes;
//! - [`process`] and [`wait`]: commands, children, and waiting for what is asynchronous;
//! - [`bench`](mod@bench), [`signals`] and [`machine`]: what the benchmarks need around a run.
// Docs for the harness's developers (`cargo doc --document-private-items`): a module's doc
// may name its private parts.
#![allow(rustdoc::private_intra_doc_links)]
pub mod agent;
pub mod bench;
pub mod boom_server;
pub mod clients;
pub mod cluster;
pub mod echo;
pub mod fake_apiserver;
pub mod family;
pub mod forged;
pub mod frames;
pub mod frontends;
pub mod hold;
pub mod interrupted;
pub mod lan;
pub mod machine;
pub mod manifests;
pub mod netns;
pub mod node_a;
pub mod privileges;
pub mod process;
pub mod raw_socket;
pub mod sandbox;
pub mod seccomp;
pub mod servers;
pub mod signals;
pub mod test_run;
pub mod testbed;
pub mod tools;
pub mod wait;

pub use agent::{
    Agent, FREE_PORTS, LogFollower, Source, SyncLine, agent_bin, assert_logged, explain_command,
    parse_debug_duration,
};
pub use clients::{
    Attempt, ProbeRun, SetChanges, assert_all_answered_by, assert_all_connected, assert_peer,
    hold_bin, mesh_proxy_bin, monotonic_ns, tally,
};
pub use frontends::{addr, frontend, spec};
pub use machine::{machine_context, process_memory_kib};
pub use manifests::{
    ManifestDir, endpoint_slice, filler_services, node_yaml, service_manifest, service_yaml,
    slice_yaml,
};
pub use node_a::{TwoBackendWeb, web_slice};
pub use process::{KillOnDrop, run, run_to_exit, stdout_of};
pub use sandbox::{Sandbox, cgroup2_root, command_in_cgroup, remove_cgroup};
pub use servers::{Dnsmasq, NamedServer, ServerThread, tcp_backends, udp_backends};
pub use signals::{
    Leftovers, block_termination_signals, cleanup_on_signal, kill_children, unblock_signals_on_exec,
};
pub use tools::{bpftool, tc_filters};
pub use wait::eventually;
