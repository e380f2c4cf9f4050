//! Names the agent and the kernel programs share: the pinned maps (with their layout
//! versions, and the older names a new agent retires or carries over), the programs, and
//! the programs' read-only globals the agent sets at load time.

/// Map names as the kernel and bpffs see them (at most 15 bytes).
pub mod map_names {
    /// [`crate::ServiceKey`] -> [`crate::ServiceEntry`]: frontends (master entries only;
    /// `_v2` held the backend slots too, and `_v1` was preallocated).
    pub const SERVICES: &str = "socklb_svc_v3";
    /// Array of backend ids (`u32`, mmapable): each frontend's backend slots, at the range
    /// its [`crate::ServiceEntry`] names. Both families' frontends share it.
    pub const SLOTS: &str = "socklb_slot_v1";
    /// Array of [`crate::Backend`] indexed by backend id (the agent hands out the lowest
    /// free one); an id no backend holds reads as zeros. `_v2` was a hash map.
    pub const BACKENDS: &str = "socklb_be_v3";
    /// [`crate::ReverseKey`] -> [`crate::ReverseEntry`] (LRU): which VIP an unconnected UDP
    /// socket sent each datagram to, so that the replies come from it.
    pub const REVERSE: &str = "socklb_rev_v1";
    /// Array of [`crate::SocketFrontend`] indexed by socket cookie modulo its (power of two)
    /// size: which VIP a connect()ed socket asked for.
    pub const SOCKETS: &str = "socklb_sock_v1";
    /// [`crate::AffinityKey`] -> [`crate::AffinityEntry`]: ClientIP session affinity.
    pub const AFFINITY: &str = "socklb_aff_v1";
    /// Per-CPU [`crate::Counters`], a single entry at index 0.
    pub const COUNTERS: &str = "socklb_cnt_v8";
    /// [`crate::CtKey`] -> [`crate::CtEntry`] (LRU): confirmed flows from outside the node
    /// (TCP past its handshake, UDP answered and continued) and their NAT.
    pub const CONNTRACK: &str = "socklb_ct_v1";
    /// [`crate::CtKey`] -> [`crate::CtEntry`] (LRU, smaller): flows from outside not yet
    /// confirmed. A SYN flood fills this table and never evicts a confirmed flow.
    pub const CONNTRACK_NEW: &str = "socklb_ctn_v1";
    /// Array of [`crate::FLOW_FILTER_ENTRIES`] 64-bit words (mmapable): which packets may
    /// have an entry in the conntrack tables of either family, so that the others skip
    /// their lookups (see `flow_filter_destination`).
    pub const FLOW_FILTER: &str = "socklb_ctf_v2";
    /// Array of [`crate::FRONTEND_FILTER_ENTRIES`] 64-bit words (mmapable): which packets
    /// may be addressed to a frontend, so that the others skip the service map's lookup
    /// (see `frontend_filter_slot`). Written only by the agent.
    pub const FRONTEND_FILTER: &str = "socklb_fef_v1";
    /// [`crate::NodeConfig`], a single entry at index 0: what the TC programs need to
    /// know about this node.
    pub const NODE: &str = "socklb_node_v4";
    /// [`crate::FragmentKey`] -> [`crate::FragmentPorts`] (LRU): the ports of an IP
    /// datagram's first fragment, for its later fragments (which carry none).
    pub const FRAGMENTS: &str = "socklb_frag_v1";
    /// LPM trie of [`crate::SourceRange`] -> [`crate::SourceVerdict`]:
    /// loadBalancerSourceRanges.
    pub const SOURCE_RANGES: &str = "socklb_src_v1";
    /// [`crate::MaglevKey`] -> slot (`u32`): Maglev tables of external frontends.
    pub const MAGLEV: &str = "socklb_mglv_v1";
    /// service id (`u32`) -> [`crate::FrontendName`]: which Service a frontend belongs to,
    /// for `socklb inspect` and bpftool. The programs never read it.
    pub const NAMES: &str = "socklb_names_v1";
    /// Ring buffer of [`crate::TraceEvent`]s: translations as they happen, written only
    /// while a `socklb trace` session holds the lease in [`TRACE_CONTROL`].
    pub const TRACE: &str = "socklb_trace_v2";
    /// [`crate::TraceControl`], a single entry at index 0: whether, and for what, the
    /// programs write trace events.
    pub const TRACE_CONTROL: &str = "socklb_trctl_v2";
    /// aya-log's ring buffer of the programs' diagnostics (`AYA_LOGS` in the object),
    /// pinned so that programs loaded again over grown maps keep writing where the agent
    /// reads. Written only with `--bpf-log-level`.
    pub const PROGRAM_LOGS: &str = "socklb_logs_v1";
    /// Socket-local storage of [`crate::SocketRecord`]: what each connect()ed socket that
    /// may have to be closed was translated for. Unlike the socket ring it forgets no live
    /// socket (the kernel frees a record with its socket), so a sweep finds every one.
    pub const SOCKET_RECORDS: &str = "socklb_skrec_v1";
    /// [`crate::SocketRecordCount`], a single entry at index 0: how many sockets hold a
    /// record. The kernel charges records to the agent's memory cgroup, and any pod can
    /// create them, so connect() stops creating them at [`crate::globals::MAX_SOCKET_RECORDS`].
    pub const SOCKET_RECORD_COUNT: &str = "socklb_skcnt_v1";
    /// `u64` network namespace cookie -> `u8` (hash): the namespaces besides the host's
    /// whose sockets the socket hooks translate under `--socket-lb-scope pods` (the pods'
    /// namespaces the node's runtime pinned), written by the agent.
    pub const SOCKET_LB_NAMESPACES: &str = "socklb_lbns_v1";
    /// `u32` interface index -> `u8` `POD_DEVICE_*` flags (hash): the pod devices that
    /// carry the per-packet path's programs, the only ones a flow delivered directly
    /// (`--pod-delivery direct`) is redirected to, written by the agent.
    pub const POD_DEVICES: &str = "socklb_podif_v1";
    /// [`crate::GoneKey`] -> `u8` (hash, small): the (frontend, backend) pairs of one sync
    /// whose backend left, read by the socket iterators that close their sockets. Not
    /// pinned: it belongs to the running agent and is empty between sweeps.
    pub const GONE: &str = "socklb_gone_v1";

    /// [`crate::ServiceKey6`] -> [`crate::ServiceEntry`]: IPv6 frontends (`_v1` held their
    /// backend slots too). Service ids are one space across both families, so the affinity,
    /// Maglev and names maps serve both.
    pub const SERVICES6: &str = "socklb_svc6_v2";
    /// backend id (`u32`, bit 31 set: IPv6 ids are their own) -> [`crate::Backend6`].
    pub const BACKENDS6: &str = "socklb_be6_v1";
    /// [`crate::ReverseKey6`] -> [`crate::ReverseEntry6`] (LRU): [`REVERSE`] for IPv6.
    pub const REVERSE6: &str = "socklb_rev6_v1";
    /// Array of [`crate::SocketFrontend6`]: [`SOCKETS`] for IPv6 sockets.
    pub const SOCKETS6: &str = "socklb_sock6_v1";
    /// [`crate::AffinityKey6`] -> [`crate::AffinityEntry`] (LRU): ClientIP affinity of IPv6
    /// clients outside the node (local sockets use [`AFFINITY`], keyed by netns cookie).
    pub const AFFINITY6: &str = "socklb_aff6_v1";
    /// [`crate::CtKey6`] -> [`crate::CtEntry6`] (LRU): [`CONNTRACK`] for IPv6.
    pub const CONNTRACK6: &str = "socklb_ct6_v1";
    /// [`crate::CtKey6`] -> [`crate::CtEntry6`] (LRU): [`CONNTRACK_NEW`] for IPv6.
    pub const CONNTRACK_NEW6: &str = "socklb_ctn6_v1";
    /// [`crate::FragmentKey6`] -> [`crate::FragmentPorts`] (LRU): [`FRAGMENTS`] for IPv6.
    pub const FRAGMENTS6: &str = "socklb_frag6_v1";
    /// LPM trie of [`crate::SourceRange6`] -> [`crate::SourceVerdict`]: IPv6
    /// loadBalancerSourceRanges.
    pub const SOURCE_RANGES6: &str = "socklb_src6_v1";
    /// [`crate::NodeConfig6`], a single entry at index 0: this node's IPv6 settings (the
    /// family-independent ones stay in [`NODE`]).
    pub const NODE6: &str = "socklb_node6_v1";
    /// [`crate::GoneKey6`] -> `u8`: [`GONE`] for IPv6 sockets. Not pinned.
    pub const GONE6: &str = "socklb_gone6_v1";
    /// Per-CPU scratch room of the TC programs for IPv6 keys and entries (their type is the
    /// programs' own). Not pinned: it holds nothing between two packets, and each load of
    /// the programs has its own.
    pub const SCRATCH6: &str = "socklb_scr6_v1";
    /// Per-CPU count of the ICMP answers the TC programs sent in the current second
    /// (refusals of frontends without endpoints are rate limited). Not pinned: each load
    /// starts afresh.
    pub const REJECT_BUDGET: &str = "socklb_rej_v1";
    /// The TC programs' own maps, never pinned: they hold nothing that outlives a load.
    pub const PROGRAM_LOCAL: [&str; 2] = [SCRATCH6, REJECT_BUDGET];

    /// Every map socklb pins, in the order the agent reports them.
    pub const ALL: [&str; 33] = [
        SERVICES,
        SLOTS,
        BACKENDS,
        SERVICES6,
        BACKENDS6,
        REVERSE,
        REVERSE6,
        SOCKETS,
        SOCKETS6,
        AFFINITY,
        COUNTERS,
        CONNTRACK,
        CONNTRACK_NEW,
        FLOW_FILTER,
        FRONTEND_FILTER,
        NODE,
        FRAGMENTS,
        SOURCE_RANGES,
        MAGLEV,
        NAMES,
        TRACE,
        TRACE_CONTROL,
        PROGRAM_LOGS,
        SOCKET_RECORDS,
        SOCKET_RECORD_COUNT,
        SOCKET_LB_NAMESPACES,
        POD_DEVICES,
        AFFINITY6,
        CONNTRACK6,
        CONNTRACK_NEW6,
        NODE6,
        FRAGMENTS6,
        SOURCE_RANGES6,
    ];

    /// Names of maps an older agent pinned and this one no longer uses: removed at load and
    /// by `socklb cleanup`.
    pub const RETIRED: [&str; 20] = [
        "socklb_cnt_v1",
        "socklb_cnt_v2",
        "socklb_cnt_v3",
        "socklb_cnt_v4",
        "socklb_cnt_v5",
        "socklb_cnt_v6",
        "socklb_cnt_v7",
        "socklb_node_v1",
        // Before the socket hooks' scope and the agent's namespace.
        "socklb_node_v2",
        // Before the pods' delivery.
        "socklb_node_v3",
        RETIRED_SERVICES[0],
        RETIRED_SERVICES[1],
        "socklb_svc6_v1",
        "socklb_be_v1",
        "socklb_be_v2",
        // IPv4-only trace events and filters.
        "socklb_trace_v1",
        "socklb_trctl_v1",
        // Renamed to match their IPv6 twins ([`RENAMED`]).
        "socklb_ctnew_v1",
        "socklb_lbsrc_v1",
        RETIRED_FLOW_FILTERS[0],
    ];

    /// The flow filters of the previous layouts: the programs still using one (until they
    /// are replaced) must stop trusting it before its pin goes, as this agent's programs no
    /// longer mark it. `socklb_ctf_v1`: before the unconfirmed frontends' slots.
    pub const RETIRED_FLOW_FILTERS: [&str; 1] = ["socklb_ctf_v1"];

    /// Maps an older agent pinned under another name, with the same layout, whose entries
    /// the programs wrote and a new agent carries over into the map of the new name (flows
    /// in progress live on); (old name, new name). Other renamed maps are written by the
    /// agent and are simply [`RETIRED`].
    pub const RENAMED: [(&str, &str); 1] = [("socklb_ctnew_v1", CONNTRACK_NEW)];

    /// The service maps of the previous layouts (with [`SERVICES`]' key, and the backend
    /// slots in the same map): the frontends they hold were serving, so the agent reads
    /// them before removing their pins and gives them the room first in the new map.
    pub const RETIRED_SERVICES: [&str; 2] = ["socklb_svc_v1", "socklb_svc_v2"];
}

/// Names of the kernel programs (the functions in socklb-ebpf), one per hook.
/// The `*6` programs serve IPv6 sockets that talk to IPv4-mapped addresses.
pub mod program_names {
    pub const CONNECT4: &str = "socklb_connect4";
    pub const SENDMSG4: &str = "socklb_sendmsg4";
    pub const RECVMSG4: &str = "socklb_recvmsg4";
    pub const GETPEERNAME4: &str = "socklb_getpeername4";
    pub const CONNECT6: &str = "socklb_connect6";
    pub const SENDMSG6: &str = "socklb_sendmsg6";
    pub const RECVMSG6: &str = "socklb_recvmsg6";
    pub const GETPEERNAME6: &str = "socklb_getpeername6";

    /// TC ingress on the node's external devices: NodePort, LoadBalancer and externalIP
    /// traffic from outside, and the replies of SNATed flows.
    pub const TC_INGRESS: &str = "socklb_tc_in";
    /// TC egress on the node's external devices: replies of local backends to outside
    /// clients.
    pub const TC_EGRESS: &str = "socklb_tc_out";
    /// TC ingress on pod devices (their host side): packets from a pod to an internal
    /// frontend (ClusterIP, or a node address's NodePort) that no socket hook translated,
    /// and the replies of hairpin flows. Their egress takes [`TC_EGRESS`], which rewrites the
    /// replies of every backend back to the frontend.
    pub const TC_POD: &str = "socklb_tc_pod";

    /// The cgroup sock_addr programs.
    pub const SOCK_ADDR: [&str; 8] = [
        CONNECT4,
        SENDMSG4,
        RECVMSG4,
        GETPEERNAME4,
        CONNECT6,
        SENDMSG6,
        RECVMSG6,
        GETPEERNAME6,
    ];

    /// The TC programs.
    pub const TC: [&str; 3] = [TC_INGRESS, TC_EGRESS, TC_POD];

    /// cgroup sock_release: a socket with a record leaves the count of records.
    pub const SOCK_RELEASE: &str = "socklb_sock_release";

    /// Socket iterators (`iter/udp`, `iter/tcp`) that close the sockets translated to a
    /// backend that left. Loaded by the agent for itself only, never pinned.
    pub const DESTROY_UDP: &str = "socklb_destroy_udp";
    pub const DESTROY_TCP: &str = "socklb_destroy_tcp";
}

/// Names of the programs' read-only globals that the agent sets at load time.
pub mod globals {
    /// `u32`: the socket map's size minus one (the size is a power of two).
    pub const SOCKET_SLOT_MASK: &str = "SOCKET_SLOT_MASK";
    /// `u32`: 1 when connect() records TCP sockets too (the agent closes them when their
    /// backend leaves, `--destroy-tcp-on-backend-removal`); 0: UDP only, and a TCP connect
    /// pays nothing for it.
    pub const RECORD_TCP: &str = "RECORD_TCP";
    /// `u32`: the byte offset of `skc_cookie` in the running kernel's `struct sock_common`
    /// (from its BTF), so that the destroy iterators read a socket's cookie without handing
    /// one out to every socket they visit; 0: unknown, the programs ask the helper.
    pub const SKC_COOKIE_OFFSET: &str = "SKC_COOKIE_OFFSET";

    // Added for IPv6 sockets (sock6).
    /// `u32`: the byte offset of `skc_v6_daddr` in the running kernel's `struct
    /// sock_common` (from its BTF), where the destroy iterators read an IPv6 socket's peer;
    /// 0: unknown, IPv6 sockets are not swept.
    pub const SKC_V6_DADDR_OFFSET: &str = "SKC_V6_DADDR_OFFSET";

    /// `u32`: how many sockets may hold a record at once (`--max-socket-records`); past
    /// it connect() still translates, and the sweep finds the socket through the socket
    /// ring only.
    pub const MAX_SOCKET_RECORDS: &str = "MAX_SOCKET_RECORDS";

    /// `u64`: the cookie of the only network namespace whose sockets the socket hooks
    /// translate (`--socket-lb-scope host`: the agent's, the host's); 0: every namespace.
    pub const SOCKET_LB_NETNS: &str = "SOCKET_LB_NETNS";

    /// `u32`: 1 when the socket hooks also translate the sockets of the namespaces in
    /// [`crate::map_names::SOCKET_LB_NAMESPACES`] besides [`SOCKET_LB_NETNS`]'s
    /// (`--socket-lb-scope pods`); 0: that one namespace only (or every one, with 0 there).
    pub const SOCKET_LB_LISTED: &str = "SOCKET_LB_LISTED";

    /// `u32`: 1 when packets from outside the node to a ClusterIP (a client routed to the
    /// Service CIDR) are translated on the external devices (`--cluster-ips-from-outside`);
    /// 0: only NodePorts, LoadBalancer IPs and externalIPs are.
    pub const CLUSTER_IPS_FROM_OUTSIDE: &str = "CLUSTER_IPS_FROM_OUTSIDE";
}
