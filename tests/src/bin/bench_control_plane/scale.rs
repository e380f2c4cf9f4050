//! `cargo xtask bench scale`: the agent with its default flags at each Service count, one
//! row per count: cold start to ready from manifests and from the (fake) API server, peak
//! RSS, the kernel memory of its maps, what resyncs cost, one EndpointSlice change, and
//! connection setup through a VIP against the same connections made to the endpoints
//! directly, at the first, middle and last Service.
//!
//! Per count, in the benchmark's one `Sandbox`:
//! 1. the manifests written in YAML and in JSON (a directory each), the fake API server
//!    filled, then [`COLD_STARTS`] rounds of cold starts over empty maps (the pins removed
//!    before each), one start from each source per round, in turn;
//! 2. the file agent started once more over the YAML manifests, measured in full, then the
//!    connections through it (the client in the sandbox's cgroup, the endpoints served on
//!    the sandbox's loopback);
//! 3. the file agent restarted over its maps with a resync every second ([`resyncs`]);
//! 4. the pins removed, the kube agent started once more, measured in full, then
//!    `--changes` changes one at a time through it.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs::File,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use socklb_agent::dataplane;
use socklb_tests::{
    Agent, ManifestDir, Sandbox,
    bench::{
        baseline,
        client::{Client, Place},
        cluster::{POSITIONS, Position},
        measure::{self, Plan},
        pinned_maps::map_memory,
        section::Section,
        server::Servers,
    },
};

use crate::{
    ColdStart, ENDPOINT_PORT, ENDPOINTS_PER_SERVICE, Latency, Options, Resyncs, SERVICE_PORT,
    Sizing, change_latency,
    cluster::{Cluster, Format, fake_cluster, vip},
    cold_start,
    maps::{Maps, check_maps},
    percentile, resyncs, start_file, start_kube,
};

pub const SECTION: Section = Section::new("scale", "scale", "Scale: 1,000 to 100,000 Services");

/// Rounds of cold starts per count, a start from each source in each. One start is one
/// sample of a machine whose other tenants move it by more than a second at 100,000
/// Services, for minutes at a time: the sources take turns, so that such a spell falls on
/// all of them; the table shows the median, the notes every start.
const COLD_STARTS: usize = 5;

/// Timed connections per path and round; rounds after one untimed warm-up batch.
const CONNECTIONS: u32 = 2_000;
const ROUNDS: u32 = 10;
/// Where every endpoint address is local: the sandbox's loopback answers them all.
const ENDPOINT_CIDR: &str = "10.128.0.0/9";
/// The Service CIDR: a VIP that is not translated goes nowhere.
const SERVICE_CIDR: &str = "10.96.0.0/12";

/// One Service count's results.
pub struct Row {
    services: u32,
    /// The last cold start of each source, measured in full.
    file: ColdStart,
    kube: ColdStart,
    /// Every cold start's time to ready, per source (the manifests in YAML, in JSON, the
    /// API server), sorted.
    file_ready: Vec<Duration>,
    json_ready: Vec<Duration>,
    kube_ready: Vec<Duration>,
    /// Kernel memory charged for every pinned map (memlock), once the file agent is ready.
    map_bytes: u64,
    resyncs: Resyncs,
    latency: Latency,
    /// connect()+answer+close() p50 through the VIP over p50 to the endpoints, per position.
    connect: BTreeMap<Position, f64>,
}

pub fn run(sandbox: &Sandbox, manifests: &ManifestDir, options: &Options) -> Vec<Row> {
    let netns = File::open("/proc/thread-self/ns/net").expect("open the sandbox's namespace");
    let route = |args: &[&str]| socklb_tests::run(std::process::Command::new("ip").args(args));
    route(&["route", "add", "local", ENDPOINT_CIDR, "dev", "lo"]);
    route(&["route", "add", "blackhole", SERVICE_CIDR]);
    baseline::node(&netns).expect("the benchmark baseline in the sandbox");
    let bind = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, ENDPOINT_PORT);
    let servers = Servers::start(netns.try_clone().expect("clone the namespace fd"), bind)
        .expect("start the endpoint servers");
    let mut client = Client::spawn(&netns).expect("start the timed client");
    let place = Place::new(&netns, &sandbox.cgroup);

    let json = manifests.beside("json");
    let mut rows = Vec::new();
    for &services in &options.scale {
        let mut cluster = Cluster::new(services);
        cluster.write_manifests(manifests, Format::Yaml);
        cluster.write_manifests(&json, Format::Json);
        let (api, kubeconfig) = fake_cluster(&json, &cluster);
        let sources: [&dyn Fn() -> Agent; 3] = [
            &|| start_file(sandbox, &manifests.path, Sizing::Defaults, &[]),
            &|| start_file(sandbox, &json.path, Sizing::Defaults, &[]),
            &|| start_kube(sandbox, &kubeconfig, Sizing::Defaults, "0s"),
        ];
        let [file_ready, json_ready, kube_ready] = cold_starts(sandbox, &sources);

        let agent = measured_start(sandbox, sources[0]);
        let mut file = cold_start(&agent);
        file.entries = check_maps(&Maps::open(&sandbox.pin_dir), services);
        let (map_bytes, _) = map_memory(&sandbox.pin_dir).expect("read the maps' memory");
        let connect = connect_ratios(&mut client, &servers, &place, &cluster);
        agent.stop();
        eprintln!(
            "{services} services: ready from manifests after {file_ready:.2?}, from JSON \
             manifests after {json_ready:.2?}, VIP / direct {connect:?}"
        );
        let resyncs = resyncs(sandbox, manifests, Sizing::Defaults);

        let agent = measured_start(sandbox, sources[2]);
        let mut kube = cold_start(&agent);
        let maps = Maps::open(&sandbox.pin_dir);
        kube.entries = check_maps(&maps, services);
        let latency = change_latency(&api, &maps, &agent, &mut cluster, options.changes);
        agent.stop();
        drop(api);
        dataplane::cleanup(&sandbox.pin_dir).expect("remove the kube agent's pins");
        eprintln!(
            "{services} services: ready from the API server after {kube_ready:.2?}, change p50 \
             {:.2?}",
            latency.p50
        );
        rows.push(Row {
            services,
            file,
            kube,
            file_ready,
            json_ready,
            kube_ready,
            map_bytes,
            resyncs,
            latency,
            connect,
        });
    }
    rows
}

/// [`COLD_STARTS`] rounds of cold starts, each over new maps (the pins removed before
/// each): one agent of each source per round, the first source of a round the next one
/// each time; every start's time to ready per source, sorted.
fn cold_starts<const N: usize>(
    sandbox: &Sandbox,
    sources: &[&dyn Fn() -> Agent; N],
) -> [Vec<Duration>; N] {
    let mut ready: [Vec<Duration>; N] = std::array::from_fn(|_| Vec::new());
    for round in 0..COLD_STARTS {
        for turn in 0..N {
            let source = (round + turn) % N;
            dataplane::cleanup(&sandbox.pin_dir).expect("remove the agent's pins");
            let agent = sources[source]();
            ready[source].push(cold_start(&agent).ready);
            agent.stop();
        }
    }
    for each in &mut ready {
        each.sort_unstable();
    }
    ready
}

/// One more cold start, over new maps, left running for the measurements that follow it.
fn measured_start(sandbox: &Sandbox, start: &dyn Fn() -> Agent) -> Agent {
    dataplane::cleanup(&sandbox.pin_dir).expect("remove the agent's pins");
    start()
}

/// VIP over direct, p50 of connect()+answer+close(), at each position. One client process
/// in the agent's cgroup alternates the two paths connection by connection (the VIP, the
/// first endpoint, the VIP, the second endpoint, ...): both see the machine as it is at
/// that moment, where batches of one path each paid for whatever the machine did during
/// them (their ratios spread over 0.93-1.10).
fn connect_ratios(
    client: &mut Client,
    servers: &Servers,
    place: &Place,
    cluster: &Cluster,
) -> BTreeMap<Position, f64> {
    let plans: Vec<Plan<'_, Position>> = POSITIONS
        .iter()
        .map(|&position| {
            let service = position.index(cluster.len());
            let endpoints = cluster.endpoints(service).to_vec();
            let through_vip = SocketAddrV4::new(vip(service), SERVICE_PORT);
            let targets = endpoints
                .iter()
                .flat_map(|&address| [through_vip, SocketAddrV4::new(address, ENDPOINT_PORT)])
                .collect();
            Plan {
                key: position,
                place,
                targets,
                endpoints,
            }
        })
        .collect();
    // Even targets are the VIP, odd ones an endpoint: CONNECTIONS of each per batch.
    let cells = measure::rounds(
        client,
        &[servers],
        &plans,
        2 * CONNECTIONS,
        ROUNDS,
        |_, _| {},
    )
    .expect("connections through the VIPs and to the endpoints");
    POSITIONS
        .iter()
        .map(|&position| {
            let p50 = |vip: bool| {
                let part = cells[&position].part(|target| (target % 2 == 0) == vip);
                part.percentile(50) as f64
            };
            (position, p50(true) / p50(false))
        })
        .collect()
}

pub fn report(machine: &str, options: &Options, rows: &[Row]) -> String {
    let mut out = String::new();
    let s = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
    let mib = |bytes: f64| format!("{:.0} MiB", bytes / (1024.0 * 1024.0));
    let _ = writeln!(out, "{machine}");
    let _ = writeln!(
        out,
        "Services of {ENDPOINTS_PER_SERVICE} endpoints on this node, one port each; release \
         build of the agent with its default flags (and --min-sync-period 0s); {COLD_STARTS} \
         rounds of cold starts, each over new maps, one from each source per round in turn \
         (ready: the median; the notes list every start); the other columns come from one \
         more start from YAML manifests and one from the API server; {} changes timed one at \
         a time; \
         {CONNECTIONS} connections per path, position and round (the two paths alternating \
         connection by connection), {ROUNDS} rounds.\n",
        options.changes
    );
    let _ = writeln!(
        out,
        "| Services | ready (median): manifests in YAML / in JSON / API server | peak RSS: \
         manifests / API server | BPF maps (memlock) | full resync | CPU per resync (verified entries) | one change p50 / \
         p99 | VIP / direct connect p50: first / middle / last |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in rows {
        let resyncs = &row.resyncs;
        let count = resyncs.verified.len().max(1);
        let read: usize = resyncs.verified.iter().map(|(read, _)| read).sum();
        let ratios: Vec<String> = row
            .connect
            .values()
            .map(|ratio| format!("{ratio:.3}"))
            .collect();
        let _ = writeln!(
            out,
            "| {} | **{}** / {} / **{}** | **{}** / **{}** | {} | {} | **{:.1} ms** ({}) | {} / \
             {} | {} |",
            row.services,
            s(percentile(&row.file_ready, 50)),
            s(percentile(&row.json_ready, 50)),
            s(percentile(&row.kube_ready, 50)),
            mib(row.file.peak_rss_kib as f64 * 1024.0),
            mib(row.kube.peak_rss_kib as f64 * 1024.0),
            mib(row.map_bytes as f64),
            ms(resyncs.full.took),
            resyncs.cpu * 1e3 / count as f64,
            read / count,
            ms(row.latency.p50),
            ms(row.latency.p99),
            ratios.join(" / "),
        );
    }
    let _ = writeln!(out);
    // The verifier's walk of each TC program, in instructions.
    let walked = |programs: &[(String, u32)]| -> String {
        if programs.is_empty() {
            return "no TC program listed".to_owned();
        }
        let each: Vec<String> = programs
            .iter()
            .map(|(name, count)| format!("{name} {count} instructions"))
            .collect();
        each.join(", ")
    };
    for row in rows {
        let mut took: Vec<Duration> = row.resyncs.verified.iter().map(|(_, t)| *t).collect();
        took.sort_unstable();
        let all = |ready: &[Duration]| -> String {
            let each: Vec<String> = ready.iter().map(|d| s(*d)).collect();
            each.join(", ")
        };
        let _ = writeln!(
            out,
            "- {} Services: ready from YAML manifests {}, from JSON manifests {}, from the API \
             server {}; first full sync {} \
             from manifests, {} from the API server ({} map writes), the programs verified \
             and loaded in {} and {} ({}); RSS at ready {} / {}; \
             resyncs {} in {} (p50 {}); agent sync per change p50 {}.",
            row.services,
            all(&row.file_ready),
            all(&row.json_ready),
            all(&row.kube_ready),
            s(row.file.sync.took),
            s(row.kube.sync.took),
            row.kube.sync.writes,
            s(row.file.verifier),
            s(row.kube.verifier),
            walked(&row.kube.verified_instructions),
            mib(row.file.rss_kib as f64 * 1024.0),
            mib(row.kube.rss_kib as f64 * 1024.0),
            row.resyncs.verified.len(),
            s(row.resyncs.window),
            ms(percentile(&took, 50)),
            ms(row.latency.sync_p50),
        );
    }
    out
}
