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
    cluster::{
        ENDPOINT_PORT, IPERF_PORT, NODE, Service, ZONE, agent_capacity_flags, manifest_file,
    },
    kube_proxy::{
        self,
        iptables::{self, IptablesSync},
        nftables,
    },
    loader::{IptablesBackend, load_rules},
    netns::{End, enter, new_netns, run_in, veth},
    server::Servers,
};
use crate::{Agent, Leftovers, Source, node_yaml};

/// The pod behind the node: every Service of the benchmarks that is measured ends there.
pub const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 10);
/// The node's device towards the pod.
pub const POD_DEVICE: &str = "pod1";
/// A rule load still running after this fails the benchmark.
const LOAD_LIMIT: Duration = Duration::from_secs(300);

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
/// [`ENDPOINT_PORT`] and iperf3, and the node running `translator` for `cluster`, with
/// kube-proxy's rules written for `kube_proxy`.
pub fn world(
    link: &ClientLink,
    translator: &Translator<'_>,
    kube_proxy: &kube_proxy::Config,
    cluster: &[Service],
    scratch: &Path,
) -> anyhow::Result<World> {
    let (client, node, pod) = (new_netns()?, new_netns()?, new_netns()?);
    for netns in [&client, &node, &pod] {
        run_in(netns, "ip", &["link", "set", "lo", "up"])?;
        baseline::apply(netns)?;
    }
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
            let input = iptables::restore_input(kube_proxy, cluster, IptablesSync::Initial);
            load(backend.restore(), &["--noflush"], input)?;
            None
        }
        Translator::Nftables => {
            load("nft", &["-f", "-"], nftables::initial(kube_proxy, cluster))?;
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

/// The agent, in the node's namespace (its TC programs attach to the node's devices).
fn start_agent(
    node: &File,
    files: &AgentFiles,
    services: usize,
    extra: &[&str],
) -> anyhow::Result<Agent> {
    let mut flags = agent_capacity_flags(services);
    flags.extend(["--healthz-bind-address", "127.0.0.1:0"].map(str::to_owned));
    flags.extend(extra.iter().map(|flag| (*flag).to_owned()));
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> anyhow::Result<Agent> {
                enter(node)?;
                let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                let state = (files.pin_dir.as_path(), files.cgroup.as_path());
                let source = Source::File(&files.manifests);
                Ok(Agent::start_at(state, source, NODE, &flags))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the agent did not start (its log is above)"))?
    })
}

/// One agent's pins, cgroup and manifests (the node and `cluster`, its Node address
/// `node_ip`); removed when dropped.
pub struct AgentFiles {
    pub pin_dir: PathBuf,
    pub cgroup: PathBuf,
    pub manifests: PathBuf,
}

impl AgentFiles {
    pub fn new(name: &str, node_ip: &str, cluster: &[Service]) -> anyhow::Result<Self> {
        let name = format!("{name}-{}", std::process::id());
        let files = Self {
            pin_dir: PathBuf::from("/sys/fs/bpf").join(&name),
            cgroup: crate::cgroup2_root().join(&name),
            manifests: std::env::temp_dir().join(format!("{name}-manifests")),
        };
        for dir in [&files.cgroup, &files.manifests] {
            fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        files.write_manifests(node_ip, cluster)?;
        Ok(files)
    }

    /// The Node (with `node_ip`) and `cluster`, for the next agent to read at its start.
    fn write_manifests(&self, node_ip: &str, cluster: &[Service]) -> anyhow::Result<()> {
        let yaml = format!(
            "{}---\n{}",
            node_yaml(NODE, ZONE, node_ip),
            manifest_file(cluster, 0..cluster.len())
        );
        let file = self.manifests.join("cluster.yaml");
        fs::write(&file, yaml).with_context(|| format!("write {}", file.display()))
    }

    /// No pins left by the previous agent, and `cluster` for the next (a new Service
    /// count): each count is measured from a fresh start.
    pub fn reset(&self, node_ip: &str, cluster: &[Service]) -> anyhow::Result<()> {
        socklb_agent::dataplane::cleanup(&self.pin_dir)
            .with_context(|| format!("clean up {}", self.pin_dir.display()))?;
        self.write_manifests(node_ip, cluster)
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

/// Mean ns per program run of a `(ns, runs)` difference.
pub fn per_run((ns, runs): (u64, u64)) -> f64 {
    if runs == 0 {
        0.0
    } else {
        ns as f64 / runs as f64
    }
}
