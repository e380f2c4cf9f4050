//! The Kubernetes Service e2e scenarios that a proxy decides (upstream
//! `test/e2e/network/{service,conntrack,endpointslice,traffic_distribution}.go`), as our own
//! suite: one scenario per upstream test, named after it, in a module per group of
//! scenarios. docs/conformance.md maps each upstream test to the scenario here, or says why
//! it does not apply.
//!
//! Every scenario runs twice, once per path that serves pods
//! ([`PodPath`](socklb_tests::testbed::PodPath), through
//! [`for_each_pod_path!`](socklb_tests::for_each_pod_path)): `socket_lb::<scenario>`, where
//! the socket hooks translate pods' sockets at connect() and sendmsg(), and
//! `per_packet::<scenario>`, where the agents serve only the host's sockets that way
//! (`--socket-lb-scope host`) and pods' packets leave them with the Service address, for
//! `socklb_tc_pod` on their node's side of the veth to translate. hostNetwork clients take
//! the socket hooks and the outside client the external TC path either way.
//!
//! Every test builds a small cluster ([`Testbed`](socklb_tests::testbed::Testbed)): two
//! nodes, pods and an outside client as network namespaces on one LAN, the fake API server,
//! and the real agent on the `kube` source on the nodes that need one. The test changes
//! Services and EndpointSlices through the API server as the control plane would (a "pod is
//! created" when its endpoint appears in a slice and its server runs in its namespace), and
//! real clients (curl, dig, the probe) check which pod answered and which address it saw. A
//! destination socklb did not translate is stopped by a route (a blackhole: EINVAL; on the
//! per-packet path's nodes an unreachable route: EHOSTUNREACH), which is how "not served" is
//! told apart from "refused by socklb" (ECONNREFUSED, counted as `no_backend` by the socket
//! hooks and `pod_no_backend` by the per-packet path). What the scenarios share is in
//! [`scenario`].
//!
//! Each scenario's tag (the first argument of `Testbed::new`, which adds the path to it)
//! names its namespaces, cgroups and pins: it must be unique in this binary, whose tests run
//! in parallel.
mod addressing;
mod conntrack;
mod endpoint_slices;
mod labels;
mod no_endpoints;
mod not_ready_endpoints;
mod scenario;
mod serving;
mod session_affinity;
mod terminating_endpoints;
mod traffic_distribution;
mod traffic_policy;
mod type_changes;
mod updates;
