//! Closing the sockets still connected to a backend that left its frontend, in every
//! network namespace of the node, right after the sync that removed it: a socket translated
//! at connect() has no NAT entry to delete, and a connected UDP client never notices a dead
//! peer by itself. What is closed, the modes and their limits: docs/operations.md, "Sockets
//! of removed backends".
//!
//! The work runs on a thread of its own, which enters each namespace in turn, so that a
//! sweep never holds up a sync; the removals of one sync make one sweep, syncs queued
//! meanwhile join it, and a queued pair whose backend came back is dropped (`queue`).
mod iterator;
mod netlink;
pub mod netns;
mod queue;

use std::{
    fmt, io,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use socklb_abi::GONE_PAIRS_PER_PASS;
use tracing::{error, info, warn};

use self::{iterator::Iterators, netlink::Netlink, queue::Queue};
use crate::{
    dataplane::{DestroyPrograms, DestroyUnavailable},
    desired::{Gone, Protocol},
    metrics::{Metrics, ModeLabels, ProtocolLabels},
};

/// How sockets are closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// BPF socket iterators calling the `bpf_sock_destroy` kfunc (Linux >= 6.5, and
    /// CAP_PERFMON to load them).
    BpfIterator,
    /// sock_diag dumps and SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY), when the iterators
    /// cannot be loaded.
    Netlink,
    /// Nothing closes sockets (neither mode is available).
    Off,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BpfIterator => "bpf-iterator",
            Self::Netlink => "netlink",
            Self::Off => "off",
        })
    }
}

/// The `--socket-destroy-mode` an operator asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Requested {
    /// BPF socket iterators if they load, else netlink.
    #[default]
    Auto,
    BpfIterator,
    Netlink,
    /// Never close sockets.
    Off,
}

/// The mode asked for is not available.
#[derive(Debug, thiserror::Error)]
#[error(
    "--socket-destroy-mode {requested:?} is not available: {reason}; use \
     --socket-destroy-mode auto to fall back"
)]
pub struct StartError {
    requested: Requested,
    reason: String,
}

/// How sockets would be closed by an agent with this process's capabilities on this
/// kernel and `--socket-destroy-mode auto`: what `socklb inspect` (run in the agent's
/// container) shows. The agent logs the
/// mode it picked and exports it as `socklb_socket_destroy_mode`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Expected {
    pub mode: Mode,
    /// Whether the sweep can enter other network namespaces (CAP_SYS_ADMIN).
    pub every_namespace: bool,
    /// Which network namespaces the sweep finds and enters.
    pub coverage: netns::Coverage,
    /// Why the mode is not the fastest one, if it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Expected {
    pub fn probe() -> Self {
        use caps::{CapSet, Capability, has_cap};
        let has = |cap| has_cap(None, CapSet::Effective, cap).unwrap_or(false);
        let every_namespace = has(Capability::CAP_SYS_ADMIN);
        // Loading a tracing program needs CAP_PERFMON, which CAP_SYS_ADMIN implies.
        let perfmon = has(Capability::CAP_PERFMON) || every_namespace;
        let (mode, reason) = match crate::dataplane::probe_destroy_kfunc() {
            Err(unavailable) => (Mode::Netlink, Some(crate::error_chain(&unavailable))),
            Ok(()) if !perfmon => (
                Mode::Netlink,
                Some("no CAP_PERFMON to load the socket iterators".to_owned()),
            ),
            Ok(()) => (Mode::BpfIterator, None),
        };
        Self {
            mode,
            every_namespace,
            coverage: netns::Coverage::probe(every_namespace, has(Capability::CAP_SYS_PTRACE)),
            reason,
        }
    }

    /// The mode, why, and the namespaces covered: one line for `run --help` and `inspect`.
    pub fn describe(&self) -> String {
        let mut text = format!("socket destroy mode (auto): {}", self.mode);
        if let Some(reason) = &self.reason {
            text.push_str(&format!(" ({reason})"));
        }
        text.push_str(&format!("; sweeps {}", self.coverage));
        text
    }
}

/// The kernel side of a mode.
enum Kernel {
    Iterators(Iterators),
    Netlink(Netlink),
}

impl Kernel {
    fn mode(&self) -> Mode {
        match self {
            Self::Iterators(_) => Mode::BpfIterator,
            Self::Netlink(_) => Mode::Netlink,
        }
    }

    fn prepare(&mut self, pairs: &[Gone]) -> Result<(), aya::maps::MapError> {
        match self {
            Self::Iterators(iterators) => iterators.prepare(pairs),
            Self::Netlink(_) => Ok(()),
        }
    }

    fn finish(&mut self, pairs: &[Gone]) {
        if let Self::Iterators(iterators) = self {
            iterators.finish(pairs);
        }
    }

    fn sweep(&self, protocol: Protocol, pairs: &[Gone]) -> io::Result<u64> {
        match self {
            Self::Iterators(iterators) => iterators.sweep(protocol),
            Self::Netlink(netlink) => netlink.sweep(protocol, pairs),
        }
    }
}

/// Hands the removals of each sync to the sweeping thread.
pub struct Sweeper {
    /// `None` when sockets are not closed.
    queue: Option<Arc<Queue>>,
    mode: Mode,
    destroy_tcp: bool,
}

impl Sweeper {
    /// Picks the mode from what the datapath could load (the iterators, else netlink with
    /// the socket map pinned in `pin_dir`), logs it, and starts the thread.
    pub fn start(
        programs: Option<Result<DestroyPrograms, DestroyUnavailable>>,
        pin_dir: &Path,
        requested: Requested,
        destroy_tcp: bool,
        metrics: Arc<Metrics>,
    ) -> Result<Self, StartError> {
        let iterators = match (requested, programs) {
            (Requested::Netlink, _) => Err("--socket-destroy-mode netlink".to_owned()),
            (Requested::Off, _) => Err("--socket-destroy-mode off".to_owned()),
            (_, Some(Ok(programs))) => Iterators::new(programs)
                .map(Kernel::Iterators)
                .map_err(|error| format!("cannot create the iterator links: {error}")),
            (_, Some(Err(unavailable))) => Err(crate::error_chain(&unavailable)),
            (_, None) => Err("the iterators were taken already".to_owned()),
        };
        let iterators = match (requested, iterators) {
            (Requested::BpfIterator, Err(reason)) => {
                return Err(StartError { requested, reason });
            }
            (Requested::Off, Err(reason)) => Err(reason),
            (_, iterators) => iterators,
        };
        let kernel = iterators.or_else(|why_not| match Netlink::new(pin_dir) {
            _ if requested == Requested::Off => Err(why_not),
            Ok(netlink) => {
                info!(
                    reason = %why_not,
                    "the BPF socket iterators are not available: netlink SOCK_DESTROY closes \
                     the sockets of removed backends instead (slower)"
                );
                Ok(Kernel::Netlink(netlink))
            }
            Err(error) => Err(format!(
                "{why_not}; netlink: cannot open the socket map: {error}"
            )),
        });
        if requested == Requested::Netlink
            && let Err(reason) = &kernel
        {
            return Err(StartError {
                requested,
                reason: reason.clone(),
            });
        }
        let (mode, kernel) = match kernel {
            Ok(kernel) => {
                info!(
                    mode = %kernel.mode(),
                    tcp = destroy_tcp,
                    "sockets of removed backends are closed"
                );
                (kernel.mode(), Some(kernel))
            }
            Err(reason) => {
                warn!(
                    mode = %Mode::Off,
                    %reason,
                    "sockets of removed backends are not closed: clients keep sending to a \
                     removed backend until they reconnect by themselves"
                );
                (Mode::Off, None)
            }
        };
        metrics
            .socket_destroy_mode
            .get_or_create(&ModeLabels {
                mode: mode.to_string(),
            })
            .set(1);
        let queue = kernel.and_then(|kernel| {
            let queue = Arc::new(Queue::default());
            let taken = queue.clone();
            let spawned = std::thread::Builder::new()
                .name("socklb-sweep".to_owned())
                .spawn(move || run(kernel, &taken, mode, &metrics));
            match spawned {
                Ok(_) => Some(queue),
                Err(error) => {
                    error!(%error, "cannot start the sweeping thread: sockets are not closed");
                    None
                }
            }
        });
        Ok(Self {
            queue,
            mode,
            destroy_tcp,
        })
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Queues one sync's removals (UDP always, TCP only when configured), and keeps of the
    /// pairs still queued those that `still_gone` (the maps as they stand) returns.
    pub fn sweep(&self, gone: &[Gone], still_gone: impl FnOnce(Vec<Gone>) -> Vec<Gone>) {
        let Some(queue) = &self.queue else {
            return;
        };
        let pairs = gone
            .iter()
            .filter(|pair| pair.protocol() == Protocol::Udp || self.destroy_tcp)
            .copied();
        queue.push(pairs, still_gone);
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        if let Some(queue) = &self.queue {
            queue.close();
        }
    }
}

/// The sweeping thread: one sweep per batch of removals.
fn run(mut kernel: Kernel, queue: &Queue, mode: Mode, metrics: &Metrics) {
    let home = match netns::current() {
        Ok(home) => home,
        Err(error) => {
            error!(%error, "cannot open the agent's network namespace: sockets are not closed");
            return;
        }
    };
    let mut warned = false;
    while let Some(pairs) = queue.take() {
        for chunk in pairs.chunks(GONE_PAIRS_PER_PASS as usize) {
            let report = sweep(&mut kernel, chunk, &home);
            for (protocol, count) in [("udp", report.udp), ("tcp", report.tcp)] {
                metrics
                    .sockets_destroyed
                    .get_or_create(&ProtocolLabels {
                        protocol: protocol.to_owned(),
                    })
                    .inc_by(count);
            }
            if report.denied > 0 && !warned {
                warned = true;
                warn!(
                    namespaces = report.denied,
                    "cannot enter the other network namespaces (setns needs CAP_SYS_ADMIN): \
                     only the agent's own namespace is swept; set the Helm value \
                     closeSocketsInPods=true (it adds SYS_ADMIN) to close the sockets of pods too"
                );
            }
            info!(
                %mode,
                pairs = chunk.len(),
                namespaces = report.namespaces,
                skipped_namespaces = report.denied + report.failed,
                unreadable_processes = report.unreadable,
                udp = report.udp,
                tcp = report.tcp,
                took = ?report.took,
                cpu = ?report.cpu,
                "closed the sockets of removed backends"
            );
        }
    }
}

/// What one sweep did.
#[derive(Debug, Default)]
struct Report {
    namespaces: usize,
    /// Namespaces setns refused for lack of privilege.
    denied: usize,
    /// Namespaces that could not be swept for another reason (gone meanwhile).
    failed: usize,
    /// Processes whose namespace could not be read (no ptrace-read access): their
    /// namespaces are swept only if pinned or shared with a readable process.
    unreadable: usize,
    udp: u64,
    tcp: u64,
    took: Duration,
    /// This thread's CPU time.
    cpu: Duration,
}

fn sweep(kernel: &mut Kernel, pairs: &[Gone], home: &netns::Namespace) -> Report {
    let started = Instant::now();
    let cpu_started = thread_cpu_time();
    let mut report = Report::default();
    let protocols: Vec<Protocol> = [Protocol::Udp, Protocol::Tcp]
        .into_iter()
        .filter(|p| pairs.iter().any(|pair| pair.protocol() == *p))
        .collect();
    if let Err(error) = kernel.prepare(pairs) {
        error!(%error, "cannot fill the gone map: this sweep is skipped");
        kernel.finish(pairs);
        return report;
    }
    // The thread is at home between sweeps; the first namespace listed is its own.
    let here = match netns::current() {
        Ok(here) => here,
        Err(error) => {
            error!(%error, "cannot open the sweeping thread's network namespace");
            kernel.finish(pairs);
            return report;
        }
    };
    let mut inside = here.inode;
    let found = netns::enumerate(here);
    report.unreadable = found.unreadable;
    for namespace in &found.namespaces {
        if namespace.inode != inside {
            match netns::enter(namespace) {
                Ok(()) => inside = namespace.inode,
                Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                    report.denied += 1;
                    continue;
                }
                Err(_) => {
                    report.failed += 1;
                    continue;
                }
            }
        }
        for protocol in &protocols {
            match kernel.sweep(*protocol, pairs) {
                Ok(count) if *protocol == Protocol::Udp => report.udp += count,
                Ok(count) => report.tcp += count,
                Err(error) => {
                    warn!(%error, namespace = %namespace.path.display(), protocol = protocol.name(), "sweep failed");
                }
            }
        }
        report.namespaces += 1;
    }
    if inside != home.inode
        && let Err(error) = netns::enter(home)
    {
        error!(%error, "cannot return to the agent's network namespace");
    }
    kernel.finish(pairs);
    report.took = started.elapsed();
    report.cpu = thread_cpu_time().saturating_sub(cpu_started);
    report
}

fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}
