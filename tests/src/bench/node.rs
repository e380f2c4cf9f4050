//! A node between a client and a pod, for the benchmarks of the per-packet paths (`bench
//! nodeport`: a client outside the node through a NodePort; `bench pod`: a pod on the node
//! to a ClusterIP). Each peer gets its own world of three network namespaces, with the same
//! addresses in every world, so that the only difference is what the node runs: socklb's
//! agent (file source), kube-proxy's rules for the same Services, or nothing (it routes).
//!
//! ```text
//!   client ── node ── pod 10.244.1.10 (device pod1 on the node, 10.244.1.1)
//! ```
//!
//! The namespaces are anonymous (they die with the process); the agents' pins, cgroups and
//! manifests are removed by [`AgentFiles`]'s guard.
use std::{
    collections::BTreeMap,
    fmt::Debug,
    fs::{self, File},
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, ensure};
use aya::programs::{
    links::{FdLink, PinnedLink},
    loaded_programs,
};

use super::{
    baseline,
    client::{Client, Place},
    cluster::{
        ENDPOINT_PORT, IPERF_PORT, NODE, SERVICE_PORT, Service, ZONE, agent_capacity_flags,
        manifest_file, services, vip,
    },
    kube_proxy::{
        self,
        iptables::{self, IptablesSync},
        nftables,
    },
    loader::{IptablesBackend, load_rules},
    measure::{self, Moment, Plan},
    netns::{End, enter, new_netns, run_in, veth},
    server::Servers,
};
use crate::{Agent, Leftovers, Source, node_yaml};

/// The Node's address (in its manifest and in kube-proxy's rules): the node's on the
/// client's link, or on its `lo` ([`ClientLink::node_ip_on_lo`]).
pub const NODE_IP: &str = "10.88.0.1";
/// kube-proxy's rules for the node. The pod network is 10.244.0.0/16: a client outside
/// (10.88.0.2) is not a pod, so its traffic takes the Local policy, not kube-proxy's pod
/// short-circuit; a client pod's is DNATed without masquerade.
const KUBE_PROXY: kube_proxy::Config = kube_proxy::Config {
    pod_cidr: "10.244.0.0/16",
    node_ip: NODE_IP,
};
/// The pod behind the node: every Service of the benchmarks that is measured ends there.
pub const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 10);
/// The node's device towards the pod.
pub const POD_DEVICE: &str = "pod1";
/// A rule load still running after this fails the benchmark: nft's load of 10,000 Services
/// took 136 s on one of these machines and more than 300 s on another.
const LOAD_LIMIT: Duration = Duration::from_secs(900);

/// How the client is plugged into the node: the client's address, the node's address and
/// device on that link, the client's route towards the Services and the pod, and the
/// Node's address when it is not the node's on that link (an address on its `lo`).
pub struct ClientLink {
    pub client: &'static str,
    pub node: &'static str,
    pub node_device: &'static str,
    pub route: &'static [&'static str],
    pub node_ip_on_lo: Option<&'static str>,
}

/// What the node runs.
pub enum Translator<'a> {
    /// Nothing: it routes.
    Nothing,
    /// socklb's agent with these flags on top of the capacities the Services need.
    Agent(&'a AgentFiles, &'a [&'a str]),
    /// kube-proxy's iptables-mode rules.
    Iptables(IptablesBackend),
    /// kube-proxy's nftables-mode table.
    Nftables,
}

/// One peer's namespaces and what runs in them; dropped in field order.
pub struct World {
    _agent: Option<Agent>,
    pub servers: Servers,
    pub client: File,
    _node: File,
}

/// The world of one peer: `link` between client and node, the pod behind the node serving
/// [`ENDPOINT_PORT`] and iperf3, and the node running `translator` for `cluster`.
fn world(
    link: &ClientLink,
    translator: &Translator<'_>,
    cluster: &[Service],
    scratch: &Path,
) -> anyhow::Result<World> {
    let (client, node, pod) = (new_netns()?, new_netns()?, new_netns()?);
    for netns in [&client, &node, &pod] {
        run_in(netns, "ip", &["link", "set", "lo", "up"])?;
    }
    // The client is a pod of the node (`bench pod`) or a machine outside it (`bench
    // nodeport`): neither runs the node's tables.
    baseline::pod(&client)?;
    baseline::node(&node)?;
    baseline::pod(&pod)?;
    let end = |netns, device, address| End {
        netns,
        device,
        address,
    };
    veth(
        &end(&client, "eth0", link.client),
        &end(&node, link.node_device, link.node),
    )?;
    run_in(&client, "ip", link.route)?;
    if let Some(address) = link.node_ip_on_lo {
        run_in(&node, "ip", &["addr", "add", address, "dev", "lo"])?;
    }
    run_in(&node, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
    veth(
        &end(&node, POD_DEVICE, "10.244.1.1/24"),
        &end(&pod, "eth0", "10.244.1.10/24"),
    )?;
    run_in(
        &pod,
        "ip",
        &["route", "add", "default", "via", "10.244.1.1"],
    )?;
    // A Service address the node did not translate stops here.
    run_in(&node, "ip", &["route", "add", "blackhole", "10.96.0.0/12"])?;
    let mut servers = Servers::start(pod, SocketAddrV4::new(POD, ENDPOINT_PORT))?;
    servers.start_iperf(POD, IPERF_PORT)?;

    let load = |program: &str, args: &[&str], input: String| -> anyhow::Result<()> {
        let took = load_rules(&node, scratch, program, args, &input, LOAD_LIMIT)?;
        ensure!(
            took.is_some(),
            "{program} did not finish within {LOAD_LIMIT:?}"
        );
        Ok(())
    };
    let agent = match translator {
        Translator::Nothing => None,
        Translator::Agent(files, flags) => Some(start_agent(&node, files, cluster.len(), flags)?),
        Translator::Iptables(backend) => {
            let input = iptables::restore_input(&KUBE_PROXY, cluster, IptablesSync::Initial);
            load(backend.restore(), &["--noflush"], input)?;
            None
        }
        Translator::Nftables => {
            load("nft", &["-f", "-"], nftables::initial(&KUBE_PROXY, cluster))?;
            None
        }
    };
    Ok(World {
        _agent: agent,
        servers,
        client,
        _node: node,
    })
}

/// A world per key, the node of each running `translator(key)`.
pub fn worlds<'a, K: Copy + Ord>(
    keys: &[K],
    link: &ClientLink,
    translator: impl Fn(K) -> Translator<'a>,
    cluster: &[Service],
    scratch: &Path,
) -> anyhow::Result<BTreeMap<K, World>> {
    let mut worlds = BTreeMap::new();
    for &key in keys {
        let world = world(link, &translator(key), cluster, scratch)?;
        worlds.insert(key, world);
    }
    Ok(worlds)
}

/// `fillers` ClusterIP Services of 10 endpoints, then the measured one ("web") and the
/// iperf3 one ("web-iperf"), both to [`POD`], with these NodePorts if given.
pub fn measured_services(fillers: u32, node_ports: Option<[u16; 2]>) -> Vec<Service> {
    let mut cluster = services(fillers);
    for (index, (name, port, target_port)) in [
        ("web", SERVICE_PORT, ENDPOINT_PORT),
        ("web-iperf", IPERF_PORT, IPERF_PORT),
    ]
    .into_iter()
    .enumerate()
    {
        cluster.push(Service {
            name: name.to_owned(),
            vip: vip(fillers + index as u32),
            port,
            target_port,
            node_port: node_ports.map(|ports| ports[index]),
            endpoints: vec![POD],
        });
    }
    cluster
}

/// The connection rounds over `worlds`, alternating connection by connection
/// (`measure::alternating`): a client process in each key's client namespace and
/// `cgroup(key)`, `connections` per round to `target(key)`, answered by [`POD`] only.
pub fn alternating_rounds<'c, K: Copy + Ord + Debug>(
    worlds: &BTreeMap<K, World>,
    cgroup: impl Fn(K) -> &'c Path,
    target: impl Fn(K) -> SocketAddrV4,
    connections: u32,
    rounds: u32,
) -> anyhow::Result<BTreeMap<K, measure::Cell>> {
    let places = places(worlds, cgroup);
    let plans = plans(worlds, &places, target);
    let servers: Vec<&Servers> = worlds.values().map(|world| &world.servers).collect();
    let mut clients = worlds
        .values()
        .map(|world| Client::spawn(&world.client))
        .collect::<anyhow::Result<Vec<_>>>()?;
    measure::alternating(&mut clients, &servers, &plans, connections, rounds)
}

/// Each world's client namespace, with `cgroup(key)`.
fn places<'c, K: Copy + Ord>(
    worlds: &BTreeMap<K, World>,
    cgroup: impl Fn(K) -> &'c Path,
) -> BTreeMap<K, Place> {
    worlds
        .iter()
        .map(|(&key, world)| (key, Place::new(&world.client, cgroup(key))))
        .collect()
}

/// One plan per world: from its place to `target(key)`, answered by [`POD`] only.
fn plans<'p, K: Copy + Ord>(
    worlds: &BTreeMap<K, World>,
    places: &'p BTreeMap<K, Place>,
    target: impl Fn(K) -> SocketAddrV4,
) -> Vec<Plan<'p, K>> {
    worlds
        .keys()
        .map(|&key| Plan {
            key,
            place: &places[&key],
            targets: vec![target(key)],
            endpoints: vec![POD],
        })
        .collect()
}

/// The run time of groups of `files`' TC programs (each group's links as in
/// [`AgentFiles::tc_run_time`]), `(ns, runs)` per group, over one more batch of
/// `connections` from `key`'s world to `target` (after a warm-up batch): while that path
/// alone runs, outside the timed rounds. The kernel's run-time stats are on only for this
/// batch: they add two clock reads to every program run, which only socklb's paths would
/// pay in the timed rounds.
pub fn tc_run_time_of_batch<'a, K: Copy + Ord + Debug, const N: usize>(
    worlds: &BTreeMap<K, World>,
    key: K,
    cgroup: &Path,
    target: SocketAddrV4,
    connections: u32,
    files: &'a AgentFiles,
    groups: [&'a [(&'a str, &'a str)]; N],
) -> anyhow::Result<[(u64, u64); N]> {
    let _stats =
        aya::sys::enable_stats(aya::sys::Stats::RunTime).context("enable BPF run-time stats")?;
    let mut meter = TcMeter::new(files, groups);
    let world = &worlds[&key];
    let place = Place::new(&world.client, cgroup);
    let plan = Plan {
        key,
        place: &place,
        targets: vec![target],
        endpoints: vec![POD],
    };
    let mut client = Client::spawn(&world.client)?;
    measure::rounds(
        &mut client,
        &[&world.servers],
        &[plan],
        connections,
        1,
        |_, moment| meter.observe(moment),
    )?;
    meter.totals()
}

/// The agent, in the node's namespace (its TC programs attach to the node's devices).
pub fn start_agent(
    node: &File,
    files: &AgentFiles,
    services: usize,
    extra: &[&str],
) -> anyhow::Result<Agent> {
    let mut flags = agent_capacity_flags(services);
    flags.extend(["--healthz-bind-address", "127.0.0.1:0"].map(str::to_owned));
    flags.extend(extra.iter().map(|flag| (*flag).to_owned()));
    // Rendered here, in the host's namespace: the first render installs the Helm engine from
    // PyPI, which the node's namespace cannot reach.
    let privileges = super::agent_privileges();
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> anyhow::Result<Agent> {
                enter(node)?;
                let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                let state = (files.pin_dir.as_path(), files.cgroup.as_path());
                let source = Source::File(&files.manifests);
                let binary = files.binary.clone().unwrap_or_else(crate::agent_bin);
                Ok(Agent::start_binary(
                    &binary, privileges, state, source, NODE, &flags,
                ))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the agent did not start (its log is above)"))?
    })
}

/// One agent's pins, cgroup and manifests (the node and `cluster`); removed when dropped.
pub struct AgentFiles {
    pub pin_dir: PathBuf,
    pub cgroup: PathBuf,
    pub manifests: PathBuf,
    /// The agent binary, when not the one the tests run ([`crate::agent_bin`]).
    pub binary: Option<PathBuf>,
}

impl AgentFiles {
    pub fn new(name: &str, cluster: &[Service]) -> anyhow::Result<Self> {
        let name = format!("{name}-{}", std::process::id());
        let files = Self {
            pin_dir: PathBuf::from("/sys/fs/bpf").join(&name),
            cgroup: crate::cgroup2_root().join(&name),
            manifests: std::env::temp_dir().join(format!("{name}-manifests")),
            binary: None,
        };
        for dir in [&files.cgroup, &files.manifests] {
            fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        files.write_manifests(cluster)?;
        Ok(files)
    }

    /// The Node (with [`NODE_IP`]) and `cluster`, for the next agent to read at its start.
    fn write_manifests(&self, cluster: &[Service]) -> anyhow::Result<()> {
        let yaml = format!(
            "{}---\n{}",
            node_yaml(NODE, ZONE, NODE_IP),
            manifest_file(cluster, 0..cluster.len())
        );
        let file = self.manifests.join("cluster.yaml");
        fs::write(&file, yaml).with_context(|| format!("write {}", file.display()))
    }

    /// No pins left by the previous agent, and `cluster` for the next (a new Service
    /// count): each count is measured from a fresh start.
    pub fn reset(&self, cluster: &[Service]) -> anyhow::Result<()> {
        socklb_agent::dataplane::cleanup(&self.pin_dir)
            .with_context(|| format!("clean up {}", self.pin_dir.display()))?;
        self.write_manifests(cluster)
    }

    /// What a signal's cleanup removes (with `dirs` besides the manifests).
    pub fn leftovers(&self, dirs: Vec<PathBuf>) -> Leftovers {
        let mut all = vec![self.manifests.clone()];
        all.extend(dirs);
        Leftovers {
            pin_dir: self.pin_dir.clone(),
            cgroup: self.cgroup.clone(),
            dirs: all,
            also: None,
        }
    }

    /// Run time (ns) and run count, summed, of the TC programs linked as `program@device`
    /// for each of `links`.
    pub fn tc_run_time(&self, links: &[(&str, &str)]) -> anyhow::Result<(u64, u64)> {
        let mut ids = Vec::new();
        for (program, device) in links {
            let pin =
                socklb_agent::dataplane::link_pin(&self.pin_dir, &format!("{program}@{device}"));
            let link = PinnedLink::from_pin(&pin)
                .with_context(|| format!("open the link pin {}", pin.display()))?;
            let info = FdLink::from(link)
                .info()
                .with_context(|| format!("read the link {}", pin.display()))?;
            ids.push(info.program_id());
        }
        let mut total = (0, 0);
        for info in loaded_programs().flatten() {
            if ids.contains(&info.id()) {
                total.0 += u64::try_from(info.run_time().as_nanos()).unwrap_or(0);
                total.1 += info.run_count();
            }
        }
        Ok(total)
    }
}

impl Drop for AgentFiles {
    fn drop(&mut self) {
        if let Err(e) = socklb_agent::dataplane::cleanup(&self.pin_dir) {
            eprintln!("cleanup of {}: {e}", self.pin_dir.display());
        }
        crate::remove_cgroup(&self.cgroup);
        let _ = fs::remove_dir_all(&self.manifests);
    }
}

/// What a node benchmark needs before it starts: root, and the tools of every path.
pub fn preflight(iptables: IptablesBackend) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "creates network namespaces, rules and BPF programs: run it as root"
    );
    for tool in [iptables.restore(), "nft", "iperf3", "ip", "sysctl"] {
        ensure!(
            which::which(tool).is_ok(),
            "{tool} is missing: `cargo xtask setup` installs it (apt: iperf3 iptables nftables \
             iproute2 procps)"
        );
    }
    Ok(())
}

/// The rule loaders' scratch files of benchmark `name`; removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let path = std::env::temp_dir().join(format!("{name}-{}-scratch", std::process::id()));
        fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The run time of groups of an agent's TC programs (each group's links as in
/// [`AgentFiles::tc_run_time`]) over the batches it observes: what each group added between
/// [`Moment::Before`] and [`Moment::After`], summed over the batches.
struct TcMeter<'a, const N: usize> {
    files: &'a AgentFiles,
    groups: [&'a [(&'a str, &'a str)]; N],
    marks: [(u64, u64); N],
    totals: [(u64, u64); N],
    error: Option<anyhow::Error>,
}

impl<'a, const N: usize> TcMeter<'a, N> {
    fn new(files: &'a AgentFiles, groups: [&'a [(&'a str, &'a str)]; N]) -> Self {
        Self {
            files,
            groups,
            marks: [(0, 0); N],
            totals: [(0, 0); N],
            error: None,
        }
    }

    /// Reads the groups at `moment` of a batch; a failed read is kept for [`Self::totals`].
    fn observe(&mut self, moment: Moment) {
        for (index, group) in self.groups.iter().enumerate() {
            match (moment, self.files.tc_run_time(group)) {
                (Moment::Before, Ok(now)) => self.marks[index] = now,
                (Moment::After, Ok(now)) => {
                    self.totals[index].0 += now.0 - self.marks[index].0;
                    self.totals[index].1 += now.1 - self.marks[index].1;
                }
                (_, Err(error)) => self.error = Some(error),
            }
        }
    }

    /// Each group's `(ns, runs)` over the batches, or the last read that failed.
    fn totals(self) -> anyhow::Result<[(u64, u64); N]> {
        match self.error {
            Some(error) => Err(error),
            None => Ok(self.totals),
        }
    }
}

/// Mean ns per program run of a `(ns, runs)` difference.
pub fn per_run((ns, runs): (u64, u64)) -> f64 {
    if runs == 0 {
        0.0
    } else {
        ns as f64 / runs as f64
    }
}
