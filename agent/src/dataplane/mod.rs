//! The datapath as the control plane sees it: load and attach the kernel programs, and
//! `apply` a desired state to their maps.
//!
//! The one door to `desired`, `maps` and `kernel` (docs/architecture.md): [`Dataplane`]
//! owns the loaded object and every map writer, and what other modules and crates use is
//! re-exported here, so that `socklb_agent::dataplane::*` is the datapath's whole face.
mod apply;
mod config;
mod error;
mod expired_flows;
mod growth;
mod node;
mod start;
mod usage;

use std::{
    borrow::Cow,
    path::{Path, PathBuf},
    time::Instant,
};

use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray},
};
use socklb_abi::{Counters, NodeConfig, NodeConfig6, SocketRecordCount};

pub use self::{
    config::{Config, ConntrackTimeouts, DEFAULT_MAGLEV_TABLE_SIZE, NodeSettings, PodDelivery},
    error::DataplaneError,
    expired_flows::{ExpiredFlows, GC_INTERVAL_MAX, GC_INTERVAL_MIN, remove_expired_flows},
};
use crate::{
    desired::sizing::Sizes,
    maps::{
        maglev::MaglevWriter, mirror::MirrorWriter, names::NamesWriter, services::KernelMaps,
        source_ranges::SourceRangeWriter, writer::Writer,
    },
};
pub use crate::{
    desired::{
        BackendAddr, Desired, Frontend, FrontendSpec, Gone, Protocol, Scope,
        maglev::TABLE_SIZES as MAGLEV_TABLE_SIZES, sizing::Capacities,
    },
    kernel::{
        attach::{
            Attachment,
            tc::{DeviceRole, TcAttachError, TcAttached, TcDevice, TcMode},
        },
        cleanup::{Cleanup, RunningAgent, cleanup, cleanup_with},
        destroy::{
            DestroyPrograms, Unavailable as DestroyUnavailable, probe_kfunc as probe_destroy_kfunc,
            skc_cookie_offset,
        },
        devices::{DeviceError, check_devices, check_ethernet},
        host::{
            HostError, cgroup2_mount, ephemeral_ports, ipv4_forwarding, ipv6_forwarding,
            local_addresses, netns_cookie, outside_netns, prepare_pin_dir,
        },
        load::{LoadError, ProgramLoad, unpin_maps},
        pin_lock::{Holder, PinLock, PinLockError, lock as lock_pin_dir},
        pins::{DEFAULT_PIN_DIR, link_pin, lock_path as pin_lock_path, trace_lease_dir},
        pod_devices::{Link, PodDevices, links, netns_id, watch_links},
        privileges::{
            FOR_FEATURES as FEATURE_CAPABILITIES, ForFeature, NEEDED as NEEDED_CAPABILITIES,
            Needed, PrivilegeError, diagnose,
        },
        program_logs::{ProgramLogLevel, ProgramLogs, ProgramLogsError},
    },
    maps::{
        MapUsage,
        names::FrontendLabel,
        writer::{ApplyReport, Capacity, Outcome, Rejected, StoreError, Verified},
    },
};

/// The loaded datapath: programs verified by the kernel, maps pinned, and the writer that
/// owns the service and backend maps.
pub struct Dataplane {
    ebpf: Ebpf,
    writer: Writer<KernelMaps>,
    source_ranges: SourceRangeWriter,
    maglev: MaglevWriter,
    names: NamesWriter,
    /// The pods' namespaces the socket hooks serve (`--socket-lb-scope pods`).
    namespaces: MirrorWriter<u64, u8>,
    /// The served pod devices by interface index, with their `POD_DEVICE_*` flags.
    pod_devices: MirrorWriter<u32, u8>,
    counters: PerCpuArray<MapData, Counters>,
    /// How many sockets hold a record, kept by the programs.
    socket_records: Array<MapData, SocketRecordCount>,
    node: Array<MapData, NodeConfig>,
    /// The cookie of the agent's network namespace (0: unknown), written into the node map
    /// for `inspect` and `trace` to tell whether they see the agent's devices.
    netns_cookie: u64,
    /// This node's IPv6 settings, when the object has the map (the IPv6 TC programs).
    node6: Option<Array<MapData, NodeConfig6>>,
    /// The cgroup v2 directory the programs attach to.
    cgroup: PathBuf,
    config: Config,
    /// Sizes of the growable maps now.
    sizes: Sizes,
    /// After a failed growth: when to try again.
    growth_retry_at: Option<Instant>,
    /// The object loaded (its kfunc call patched), for loading it again when maps grow.
    object: Cow<'static, [u8]>,
    /// The socket iterators, until the sweeper takes them, or why there are none.
    destroy: Option<Result<DestroyPrograms, DestroyUnavailable>>,
    /// Pairs whose backend a failed sync removed: swept after the next sync that succeeds.
    unswept: Vec<Gone>,
    /// False until the kernel verified the programs ([`Config::program_load`]).
    programs_loaded: bool,
}

impl Dataplane {
    pub fn pin_dir(&self) -> &Path {
        &self.config.pin_dir
    }

    /// The socket programs whose link pin went since they were attached (removed behind the
    /// agent's back: by hand, or by `cleanup --force`), which detached them: this node's
    /// sockets then reach no Service. None before the programs are attached.
    pub fn detached(&self) -> Vec<&'static str> {
        if !self.programs_loaded {
            return Vec::new();
        }
        socklb_abi::program_names::SOCK_ADDR
            .iter()
            .copied()
            .filter(|name| !link_pin(&self.config.pin_dir, name).exists())
            .collect()
    }
}
