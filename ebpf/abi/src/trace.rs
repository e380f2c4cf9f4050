//! The trace ring's events and the control entry that switches them on (`socklb trace`).

use crate::Ipv6Words;

/// What a trace event describes: a socket translation, a reverse translation, or a flow
/// from outside (TC).
pub const TRACE_SOURCE_CONNECT: u8 = 1;
pub const TRACE_SOURCE_SENDMSG: u8 = 2;
/// recvmsg/getpeername showing the frontend instead of the backend.
pub const TRACE_SOURCE_REVERSE: u8 = 3;
/// A packet from outside the node (NodePort, LoadBalancer IP, externalIP).
pub const TRACE_SOURCE_EXTERNAL: u8 = 4;
/// A packet from a pod device to an internal frontend (the per-packet path: a workload
/// whose sockets the socket hooks do not translate).
pub const TRACE_SOURCE_POD: u8 = 5;

// Why the backend was chosen (or none).

/// A random slot (TCP connect; a new flow from outside without Maglev).
pub const TRACE_REASON_RANDOM: u8 = 1;
/// The socket's hash (UDP: a socket keeps its backend).
pub const TRACE_REASON_PER_SOCKET: u8 = 2;
/// The client's session-affinity entry.
pub const TRACE_REASON_AFFINITY: u8 = 3;
/// No usable backend: refused (socket) or dropped (outside).
pub const TRACE_REASON_NO_BACKEND: u8 = 4;
/// The Maglev table's position for the flow.
pub const TRACE_REASON_MAGLEV: u8 = 5;
/// loadBalancerSourceRanges do not allow the client: dropped.
pub const TRACE_REASON_SOURCE_DENIED: u8 = 6;
/// No SNAT port was free for a flow to another node: dropped.
pub const TRACE_REASON_SNAT_EXHAUSTED: u8 = 7;
/// The flow's conntrack entry (a packet of a known flow from outside).
pub const TRACE_REASON_CONNTRACK: u8 = 8;
/// The socket's record of the frontend it asked for (reverse translation).
pub const TRACE_REASON_REVERSE: u8 = 9;

/// [`TraceControl::flags`]: also emit reverse translations (recvmsg, getpeername).
pub const TRACE_FLAG_REVERSE: u16 = 1 << 0;
/// [`TraceControl::flags`]: also emit every packet of known flows from outside.
pub const TRACE_FLAG_PACKETS: u16 = 1 << 1;

/// One translation, as `socklb trace` shows it. Socket events carry the process, network
/// namespace and cgroup of the caller (the agent adds the process name: the kernel gives
/// socket-address programs no helper for it); events of packets (from outside, from a pod
/// device) carry the client's address and the device the packet arrived on, and those of a
/// SNATed flow the source its backend sees.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// CLOCK_MONOTONIC, ns.
    pub time_ns: u64,
    pub socket_cookie: u64,
    pub netns_cookie: u64,
    pub cgroup_id: u64,
    /// The calling process (thread group id); 0 for packets from outside.
    pub pid: u32,
    pub service_id: u32,
    /// Addresses of [`Self::family`] and ports, in network byte order (IPv4 in the last
    /// word, as elsewhere in the ABI); 0 where not known.
    pub client_address: Ipv6Words,
    pub frontend_address: Ipv6Words,
    pub backend_address: Ipv6Words,
    /// The source the backend sees of a flow SNATed to this node (a remote backend of a
    /// flow from outside, a pod that is its own backend): the node's address and the
    /// flow's SNAT port; 0 when the flow keeps its client's address.
    pub snat_address: Ipv6Words,
    pub client_port: u16,
    pub frontend_port: u16,
    pub backend_port: u16,
    pub snat_port: u16,
    /// The slot chosen (1-based) and how many the frontend had; 0 when none.
    pub slot: u16,
    pub count: u16,
    pub protocol: u8,
    /// `TRACE_SOURCE_*`.
    pub source: u8,
    /// `TRACE_REASON_*`.
    pub reason: u8,
    /// [`TRACE_FAMILY_V4`] or [`TRACE_FAMILY_V6`].
    pub family: u8,
    /// The device a packet arrived on (the TC program's, its ifindex in the node's network
    /// namespace); 0 for socket events.
    pub ifindex: u32,
    pub pad: u32,
}

/// [`TraceEvent::family`] and [`TraceControl::family`]: IPv4 (also IPv6 sockets talking to
/// IPv4-mapped addresses, translated in the IPv4 maps).
pub const TRACE_FAMILY_V4: u8 = 4;
/// Native IPv6.
pub const TRACE_FAMILY_V6: u8 = 6;

/// Whether the programs emit trace events, and which. A session renews `until_ns` every
/// second; a session that dies without turning emission off stops it by not renewing.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceControl {
    /// Emit while CLOCK_MONOTONIC is below this, in ns; 0: off (the one check every
    /// translation pays).
    pub until_ns: u64,
    /// The session holding the lease (its pid), so that a second one can name it.
    pub session_pid: u32,
    pub frontend_port: u16,
    /// `TRACE_FLAG_*`.
    pub flags: u16,
    /// Kernel-side filters, 0 meaning any: frontend address and port, backend address, of
    /// [`Self::family`] (set with either address; IPv4 in the last word).
    pub frontend_address: Ipv6Words,
    pub backend_address: Ipv6Words,
    /// `TRACE_FAMILY_*`, or 0: any.
    pub family: u8,
    pub pad: u8,
    pub pad2: u16,
    pub pad3: u32,
}
