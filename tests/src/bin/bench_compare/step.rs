//! One step of the comparison: N services programmed into every peer (timed, with one
//! endpoint change), then connection setup and throughput measured with the peers
//! interleaved.
use std::{
    collections::BTreeMap,
    fs::{self, File},
    net::SocketAddrV4,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, ensure};
use socklb_agent::dataplane;
use socklb_tests::{
    Agent, ManifestDir, Sandbox,
    bench::{
        agent_privileges, baseline,
        cgroup::{kernel_memory, own_cgroup},
        client::{Client, Place},
        cluster::{
            ENDPOINTS, IPERF_PORT, NODE, POSITIONS, Position, Service, ZONE, agent_capacity_flags,
            changed_address, changed_service, cluster, manifest_file,
        },
        cpu::process_cpu,
        kube_proxy::{
            iptables::{self, IptablesSync},
            nftables,
        },
        loader::{flush_rules, load_rules},
        measure::{self, Cell, Plan, iperf3},
        netns::{End, new_netns, run_in, veth},
        peer::{PEERS, Peer},
        pinned_maps::map_memory,
        server::Servers,
    },
    node_yaml,
};

use crate::{KUBE_PROXY, Options, ROUNDS};

/// Manifests per file for the agent's file source.
const SERVICES_PER_FILE: u32 = 1_000;
/// Repeated change measurements of one peer stop once they have taken this long in all
/// (one iptables-restore of 30,000 services takes about a minute here).
const CHANGE_BUDGET: Duration = Duration::from_secs(20);

/// Programming a peer: from nothing, and one endpoint change.
#[derive(Default)]
pub struct Control {
    /// From nothing to every service programmed (the limit if it did not finish).
    pub program: Duration,
    /// The initial load was stopped at the limit: nothing else is measured for this peer.
    pub stopped: bool,
    /// socklb: from spawning the agent to ready (reading and parsing the manifests, the
    /// datapath load and the first full sync).
    pub ready: Option<Duration>,
    /// One endpoint change, each measurement.
    pub change: Vec<Duration>,
    /// iptables: the partial sync of kube-proxy >= 1.27 (full syncs are in `change`).
    pub change_partial: Vec<Duration>,
    /// socklb: from rewriting the manifest to the agent's "synced" line (file watch,
    /// debounce, parsing included).
    pub change_end_to_end: Vec<Duration>,
    /// Kernel memory of the programmed state.
    pub kernel_bytes: Option<u64>,
    /// socklb: the agent's resident set once ready.
    pub rss_kib: Option<u64>,
    /// Rules (iptables), chains + rules + elements (nftables), map entries (socklb).
    pub objects: usize,
}

pub struct Step {
    pub services: u32,
    pub latency: BTreeMap<(Peer, Position), Cell>,
    /// Gbit/s per iperf3 run.
    pub throughput: BTreeMap<Peer, Vec<f64>>,
    pub control: BTreeMap<Peer, Control>,
}

pub fn median(values: &[Duration]) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len() / 2).copied().unwrap_or_default()
}

/// Repeats `measure` up to `times` times, fewer once CHANGE_BUDGET is spent.
fn repeat(
    times: u32,
    mut measure: impl FnMut(u32) -> anyhow::Result<Duration>,
) -> anyhow::Result<Vec<Duration>> {
    let began = Instant::now();
    let mut samples = Vec::new();
    for number in 0..times {
        samples.push(measure(number)?);
        if began.elapsed() > CHANGE_BUDGET {
            break;
        }
    }
    Ok(samples)
}

/// A client namespace, a node of its own (the peer's rules and the node's baseline are
/// there), with a veth pair to the server namespace: `10.200.<slot>.1` here, .2 there, default
/// route through it.
fn client_netns(server: &File, slot: u32) -> anyhow::Result<File> {
    ensure!(slot < 256, "too many client namespaces");
    let netns = new_netns()?;
    run_in(&netns, "ip", &["link", "set", "lo", "up"])?;
    baseline::node(&netns)?;
    let (here, there) = (format!("slbcmp{slot}c"), format!("slbcmp{slot}s"));
    let (here_address, there_address) =
        (format!("10.200.{slot}.1/24"), format!("10.200.{slot}.2/24"));
    veth(
        &End {
            netns: &netns,
            device: &here,
            address: &here_address,
        },
        &End {
            netns: server,
            device: &there,
            address: &there_address,
        },
    )?;
    let gateway = format!("10.200.{slot}.2");
    run_in(&netns, "ip", &["route", "add", "default", "via", &gateway])?;
    Ok(netns)
}

pub struct Run<'a> {
    pub options: &'a Options,
    pub sandbox: &'a Sandbox,
    pub manifests: &'a ManifestDir,
    pub scratch: &'a Path,
    pub server: &'a mut Servers,
    /// Distinct veth subnets across steps (old namespaces die in the background).
    pub next_slot: u32,
    /// Distinct new addresses across every change.
    pub changes: u32,
}

impl Run<'_> {
    /// N services in every peer: programmed, changed, measured.
    pub fn step(&mut self, services: u32) -> anyhow::Result<Step> {
        let mut cluster = cluster(services);
        let total = cluster.len();
        eprintln!("== {services} services x {ENDPOINTS} endpoints (+1 for iperf3)");
        let mut step = Step {
            services,
            latency: BTreeMap::new(),
            throughput: BTreeMap::new(),
            control: BTreeMap::new(),
        };
        let mut netns = BTreeMap::new();
        for peer in PEERS {
            netns.insert(peer, client_netns(&self.server.netns, self.next_slot)?);
            self.next_slot += 1;
        }

        // iptables: load from nothing, then changes (full and partial syncs).
        let limit = self.options.load_limit;
        let ipt = &netns[&Peer::Iptables];
        let restore = self.options.iptables.restore();
        let restore_args = ["--noflush", "--counters"];
        let input = iptables::restore_input(&KUBE_PROXY, &cluster, IptablesSync::Initial);
        let rules = input.lines().filter(|line| line.starts_with("-A")).count();
        let mut control = self.initial_load(ipt, restore, &restore_args, &input, rules)?;
        eprintln!("iptables: {rules} rules loaded in {:.2?}", control.program);
        let changed = changed_service(services);
        if !control.stopped {
            control.change = repeat(self.options.changes, |_| {
                self.change_endpoint(&mut cluster[changed]);
                let input = iptables::restore_input(&KUBE_PROXY, &cluster, IptablesSync::Full);
                let took = load_rules(ipt, self.scratch, restore, &restore_args, &input, limit)?;
                Ok(took.unwrap_or(limit))
            })?;
            control.change_partial = repeat(self.options.changes, |_| {
                self.change_endpoint(&mut cluster[changed]);
                let input = iptables::restore_input(
                    &KUBE_PROXY,
                    &cluster,
                    IptablesSync::Partial { changed },
                );
                let took = load_rules(ipt, self.scratch, restore, &restore_args, &input, limit)?;
                Ok(took.unwrap_or(limit))
            })?;
            eprintln!(
                "iptables: one endpoint change: full sync {:.2?}, partial sync {:.2?}",
                median(&control.change),
                median(&control.change_partial)
            );
        }
        step.control.insert(Peer::Iptables, control);

        // nftables.
        let nft = &netns[&Peer::Nftables];
        let input = nftables::initial(&KUBE_PROXY, &cluster);
        let objects = input
            .lines()
            .filter(|line| !line.starts_with("flush"))
            .count();
        let mut control = self.initial_load(nft, "nft", &["-f", "-"], &input, objects)?;
        eprintln!("nftables: loaded in {:.2?}", control.program);
        if !control.stopped {
            control.change = repeat(self.options.changes, |_| {
                let stale = self.change_endpoint(&mut cluster[changed]);
                let input = nftables::change(&KUBE_PROXY, &cluster[changed], stale);
                let took = load_rules(nft, self.scratch, "nft", &["-f", "-"], &input, limit)?;
                Ok(took.unwrap_or(limit))
            })?;
            eprintln!(
                "nftables: one endpoint change {:.2?}",
                median(&control.change)
            );
        }
        step.control.insert(Peer::Nftables, control);
        let measured: Vec<Peer> = PEERS
            .into_iter()
            .filter(|peer| {
                step.control
                    .get(peer)
                    .is_none_or(|control| !control.stopped)
            })
            .collect();

        // socklb: the real agent on manifests of the same services.
        dataplane::cleanup(&self.sandbox.pin_dir).context("remove the previous agent's pins")?;
        let files = self.write_manifests(&cluster)?;
        let agent = start_agent(self.sandbox, &self.manifests.path, total)?;
        let ready_at = agent
            .lines()
            .iter()
            .find(|(_, line)| line.contains("datapath attached; ready"))
            .map(|(at, _)| at.duration_since(agent.started()))
            .context("the agent logged no ready line")?;
        agent.wait_for_log("synced", 1);
        let first = agent
            .syncs(agent.started(), Instant::now())
            .into_iter()
            .find(|sync| sync.full)
            .context("the agent's first sync is a full one")?;
        let (_, rss_kib) = socklb_tests::process_memory_kib(agent.pid());
        let (kernel_bytes, entries) = map_memory(&self.sandbox.pin_dir)?;
        let mut control = Control {
            program: first.took,
            ready: Some(ready_at),
            kernel_bytes: Some(kernel_bytes),
            rss_kib: Some(rss_kib),
            objects: entries,
            ..Control::default()
        };
        eprintln!(
            "socklb: first sync {:.2?} ({} writes), ready {ready_at:.2?} after spawn",
            first.took, first.writes
        );
        let mut end_to_end = Vec::new();
        control.change = repeat(self.options.changes, |_| {
            self.change_endpoint(&mut cluster[changed]);
            let file = changed as u32 / SERVICES_PER_FILE;
            let written = Instant::now();
            self.manifests.write(
                &files[file as usize].0,
                &manifest_file(&cluster, files[file as usize].1.clone()),
            );
            let sync = wait_for_sync(&agent, written)?;
            end_to_end.push(sync.1);
            Ok(sync.0)
        })?;
        control.change_end_to_end = end_to_end;
        eprintln!(
            "socklb: one endpoint change: agent sync {:.2?}",
            median(&control.change)
        );
        step.control.insert(Peer::Socklb, control);

        // Connection setup, every peer interleaved.
        let home = own_cgroup()?;
        let places: BTreeMap<Peer, Place> = measured
            .iter()
            .map(|&peer| {
                let cgroup = if peer == Peer::Socklb {
                    &self.sandbox.cgroup
                } else {
                    &home
                };
                (peer, Place::new(&netns[&peer], cgroup))
            })
            .collect();
        let mut client = Client::spawn(&netns[&Peer::Direct])?;
        let agent_cpu = process_cpu(agent.pid());
        let began = Instant::now();
        step.latency = self.latency(&cluster, services, &places, &mut client)?;
        eprintln!(
            "socklb: the agent used {:.1}% of a core while the connections were timed",
            100.0 * (process_cpu(agent.pid()) - agent_cpu) / began.elapsed().as_secs_f64()
        );
        drop(client);

        // Throughput: one iperf3 stream per peer, interleaved.
        let iperf = &cluster[total - 1];
        self.server.start_iperf(iperf.endpoints[0], IPERF_PORT)?;
        for round in 0..self.options.iperf_rounds {
            for offset in 0..measured.len() {
                let peer = measured[(offset + round as usize) % measured.len()];
                let target = if peer == Peer::Direct {
                    iperf.endpoints[0]
                } else {
                    iperf.vip
                };
                let cgroup = (peer == Peer::Socklb).then_some(self.sandbox.cgroup.as_path());
                let target = SocketAddrV4::new(target, IPERF_PORT);
                let gbits =
                    iperf3(&netns[&peer], cgroup, target, self.options.iperf_seconds)?.gbits;
                step.throughput.entry(peer).or_default().push(gbits);
            }
        }
        self.server.stop_iperf();

        agent.stop();
        for peer in [Peer::Iptables, Peer::Nftables] {
            flush_rules(&netns[&peer], self.options.iptables);
        }
        Ok(step)
    }

    /// Loads a kube-proxy ruleset into an empty namespace: how long it took and the kernel
    /// memory it holds, or that it was stopped at the limit.
    fn initial_load(
        &self,
        netns: &File,
        program: &str,
        args: &[&str],
        input: &str,
        objects: usize,
    ) -> anyhow::Result<Control> {
        let before = kernel_memory();
        let took = load_rules(
            netns,
            self.scratch,
            program,
            args,
            input,
            self.options.load_limit,
        )?;
        Ok(Control {
            program: took.unwrap_or(self.options.load_limit),
            stopped: took.is_none(),
            kernel_bytes: took
                .and(kernel_memory().zip(before))
                .map(|(after, before)| after.saturating_sub(before)),
            objects,
            ..Control::default()
        })
    }

    /// Replaces one endpoint of `service` with an address never used before; returns the
    /// replaced endpoint.
    fn change_endpoint(&mut self, service: &mut Service) -> SocketAddrV4 {
        let slot = (self.changes % ENDPOINTS) as usize;
        let stale = service.endpoint(slot);
        service.endpoints[slot] = changed_address(self.changes);
        self.changes += 1;
        stale
    }

    /// Writes the manifests (files of SERVICES_PER_FILE services), replacing any earlier
    /// step's; returns each file's name and service range.
    fn write_manifests(
        &self,
        cluster: &[Service],
    ) -> anyhow::Result<Vec<(String, std::ops::Range<usize>)>> {
        for entry in fs::read_dir(&self.manifests.path).context("list the manifests")? {
            let path = entry.context("list the manifests")?.path();
            fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
        }
        self.manifests
            .write("node.yaml", &node_yaml(NODE, ZONE, KUBE_PROXY.node_ip));
        let mut files = Vec::new();
        for first in (0..cluster.len()).step_by(SERVICES_PER_FILE as usize) {
            let range = first..cluster.len().min(first + SERVICES_PER_FILE as usize);
            let name = format!("services-{first:05}.yaml");
            self.manifests
                .write(&name, &manifest_file(cluster, range.clone()));
            files.push((name, range));
        }
        Ok(files)
    }

    fn latency(
        &self,
        cluster: &[Service],
        services: u32,
        places: &BTreeMap<Peer, Place>,
        client: &mut Client,
    ) -> anyhow::Result<BTreeMap<(Peer, Position), Cell>> {
        // Direct connections to each measured service's endpoints are the floor for that
        // service, measured like a peer: same number of cells, same interleaving.
        let mut plans = Vec::new();
        for (&peer, place) in places {
            for position in POSITIONS {
                let service = &cluster[position.index(services) as usize];
                let targets = if peer == Peer::Direct {
                    (0..service.endpoints.len())
                        .map(|endpoint| service.endpoint(endpoint))
                        .collect()
                } else {
                    vec![SocketAddrV4::new(service.vip, service.port)]
                };
                plans.push(Plan {
                    key: (peer, position),
                    place,
                    targets,
                    endpoints: service.endpoints.clone(),
                });
            }
        }
        let batch = self.options.connections / ROUNDS;
        measure::rounds(client, &[self.server], &plans, batch, ROUNDS, |_, _| {})
    }
}

fn start_agent(sandbox: &Sandbox, manifests: &Path, services: usize) -> anyhow::Result<Agent> {
    let mut flags = agent_capacity_flags(services);
    // The client's namespace is not one the agent can find as a pod's (the runtime pins
    // those; the benchmark's are held open by the process), so the default scope, pods,
    // would leave its sockets alone.
    flags.extend(["--socket-lb-scope", "all"].map(str::to_owned));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Ok(Agent::start_as(
        agent_privileges(),
        sandbox,
        manifests,
        NODE,
        &flags,
    ))
}

/// Waits for the agent's first incremental sync after `since`; returns its own duration
/// and the time from `since` to its log line.
fn wait_for_sync(agent: &Agent, since: Instant) -> anyhow::Result<(Duration, Duration)> {
    let deadline = since + Duration::from_secs(30);
    loop {
        let found = agent
            .lines()
            .into_iter()
            .filter(|(at, line)| {
                *at >= since && line.contains(" synced ") && !line.contains("full=true")
            })
            .map(|(at, _)| at)
            .next();
        if let Some(at) = found {
            let sync = agent
                .syncs(at, at)
                .into_iter()
                .next()
                .context("the sync line")?;
            ensure!(
                sync.services >= 1,
                "the agent synced without a change: {sync:?}"
            );
            return Ok((sync.took, at.duration_since(since)));
        }
        ensure!(
            Instant::now() < deadline,
            "the agent did not sync a manifest change within 30 s:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}
