//! A node grows from 100 to 20,000 Services on the default flags, under load: the service
//! and backend maps grow by themselves (new maps, the programs swapped in place), no
//! connection fails, and the state the programs keep (conntrack, session affinity, the
//! socket ring) survives the swaps: the same maps, read by the new programs. A flow from
//! outside and a VM's flow through the per-packet path then also survive an agent restart.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream},
    path::Path,
    time::{Duration, Instant},
};

use aya::{
    maps::{HashMap, Map, MapData},
    programs::{
        links::{FdLink, PinnedLink},
        loaded_programs,
    },
};
use socklb_abi::{AffinityEntry, AffinityKey, ServiceEntry, ServiceKey, map_names, program_names};
use socklb_agent::inspect;
use socklb_tests::{
    Agent,
    echo::{EchoServer, echo},
    family::Family,
    filler_services,
    lan::{LanNode, NODE1, POD1_ENDPOINT, POD2, POD2_ENDPOINT, answers, service, slice},
};

/// Services on the node at each stage, besides the three the test talks to.
const STAGES: [usize; 3] = [100, 2_000, 20_000];
/// Endpoints of every filler Service (addresses nobody connects to).
const ENDPOINTS: usize = 5;
const NODE_PORT: u16 = 30140;

/// The maps that grow here: the IPv4 service and backend maps, the slot array of both
/// families, and the names of all frontends. Every other map must stay the same object,
/// entries and all: the IPv6 twins among them, which grow with IPv6 frontends only, and
/// this node has none.
const GROWN: [&str; 4] = [
    map_names::SERVICES,
    map_names::SLOTS,
    map_names::BACKENDS,
    map_names::NAMES,
];

#[test]
fn maps_grow_from_100_to_20000_services_under_load_and_keep_every_flow() {
    let node = LanNode::new(Family::V4, "map-growth", "w");
    let LanNode {
        lan,
        sandbox,
        manifests,
        ..
    } = &node;
    let _echo = EchoServer::start(&lan.pod2, SocketAddrV4::new(POD2, 8080));
    let vm = lan.vm();
    let _spread = [node.tcp_servers(8081), node.udp_servers(8053)];
    let pods = [POD1_ENDPOINT, POD2_ENDPOINT];
    // Reached from outside through its NodePort; its backend is on node2 (SNAT, conntrack).
    node.write(
        "echo.yaml",
        &node
            .a
            .exposed("echo", 140)
            .port("http", 80, 8080, NODE_PORT, "TCP")
            .endpoints(&[POD2_ENDPOINT])
            .yaml(),
    );
    // Reached from local sockets: Services that spread (TCP and UDP), one that sticks
    // (ClientIP affinity).
    for (name, vip, protocol, port, extra) in [
        ("spread", "10.96.0.141", "TCP", 8081, ""),
        ("dns", "10.96.0.143", "UDP", 8053, ""),
        (
            "sticky",
            "10.96.0.142",
            "TCP",
            8081,
            "  sessionAffinity: ClientIP\n",
        ),
    ] {
        let ports = format!("[{{name: p, port: 80, targetPort: {port}, protocol: {protocol}}}]");
        manifests.service(
            name,
            &service(name, vip, &ports, extra, None),
            &slice(&format!("{name}-1"), name, ("p", port, protocol), &pods),
        );
    }
    manifests.write("fillers.yaml", &filler_services(STAGES[0], ENDPOINTS));
    let agent = node.agent(&[]);
    wait_for_entries(&sandbox.pin_dir, STAGES[0], &agent);

    // Traffic from outside: a long-lived flow through conntrack and SNAT.
    let frontend = SocketAddrV4::new(NODE1.parse().expect("node address"), NODE_PORT);
    let mut outside = lan.client.enter(|| {
        std::net::TcpStream::connect_timeout(&frontend.into(), Duration::from_secs(5))
            .expect("connect through the NodePort")
    });
    echo(&mut outside).expect("the flow from outside echoes before the growth");
    // A VM's long-lived flow to the same Service's ClusterIP, through the per-packet path
    // on its device.
    let cluster_ip = SocketAddrV4::new(Ipv4Addr::new(10, 96, 0, 140), 80);
    let mut from_vm = vm.enter(|| {
        TcpStream::connect_timeout(&cluster_ip.into(), Duration::from_secs(5))
            .expect("connect from the VM to the ClusterIP")
    });
    echo(&mut from_vm).expect("the VM's flow echoes before the growth");
    // Session affinity: where the sticky Service sends this node's clients.
    let sticky: SocketAddr = "10.96.0.142:80".parse().expect("address");
    let stuck = single_backend(&sandbox.probe("tcp", sticky, 3), "before the growth");
    let affinity_before = affinity_entries(&sandbox.pin_dir);
    assert!(!affinity_before.is_empty(), "no affinity entry was made");
    let before = MapIds::read(&sandbox.pin_dir);

    // Load: clients connect to the spreading Services all along.
    let spread: SocketAddr = "10.96.0.141:80".parse().expect("address");
    let dns: SocketAddr = "10.96.0.143:80".parse().expect("address");
    let forever = Duration::from_secs(600);
    let mut load = [
        sandbox.spawn_probe_for("tcp", spread, forever, 5),
        sandbox.spawn_probe_for("udp-connected", dns, forever, 5),
    ];
    for (stage, services) in STAGES.iter().enumerate().skip(1) {
        manifests.write("fillers.yaml", &filler_services(*services, ENDPOINTS));
        agent.wait_for_log_within("maps grown", stage, Duration::from_secs(120));
        wait_for_entries(&sandbox.pin_dir, *services, &agent);
        assert!(
            load.iter_mut().all(|client| client.running()),
            "a load client ended early"
        );
    }
    for (client, what) in load.into_iter().zip(["TCP", "connected UDP"]) {
        let attempts = client.stop();
        assert!(
            attempts.len() >= 20,
            "the {what} client made only {} attempts",
            attempts.len()
        );
        // `answers` fails on any attempt without a reply.
        let servers = answers(&attempts);
        assert!(
            servers
                .iter()
                .all(|(server, _)| server == "pod1" || server == "pod2"),
            "the {what} Service under load was answered by someone else: {servers:?}"
        );
    }

    let after = MapIds::read(&sandbox.pin_dir);
    for name in map_names::ALL
        .into_iter()
        .filter(|name| !GROWN.contains(name))
    {
        assert_eq!(
            before.maps[name], after.maps[name],
            "{name} was replaced: its entries are lost"
        );
    }
    for name in GROWN {
        assert_ne!(before.maps[name], after.maps[name], "{name} did not grow");
        assert!(
            after.sizes[name] > before.sizes[name],
            "{name}: {} entries, was {}",
            after.sizes[name],
            before.sizes[name]
        );
    }
    // Every attached link runs a new program, which reads only the pinned maps (none that
    // the agent no longer writes).
    let pinned: Vec<u32> = after.maps.values().copied().collect();
    for (link, program) in &after.programs {
        assert_ne!(
            before.programs.get(link),
            Some(program),
            "{link} still runs the program of before the growth"
        );
        for map in program_maps(*program) {
            assert!(
                pinned.contains(&map) || !is_socklb_map(map),
                "{link} reads map {map}, which is not pinned any more"
            );
        }
    }

    // The names map grew with the service map: every frontend is still named.
    let named = inspect::inspect(&sandbox.pin_dir, None)
        .expect("inspect")
        .frontends
        .iter()
        .filter(|frontend| frontend.service.is_some())
        .count();
    assert!(
        named > STAGES[2],
        "{named} frontends named after the growths"
    );
    echo(&mut outside).expect("the flow from outside echoes after the growths");
    echo(&mut from_vm).expect("the VM's flow echoes after the growths");
    assert_eq!(
        affinity_entries(&sandbox.pin_dir)
            .into_iter()
            .filter(|(key, _)| affinity_before.contains_key(key))
            .count(),
        affinity_before.len(),
        "affinity entries were lost"
    );
    assert_eq!(
        single_backend(&sandbox.probe("tcp", sticky, 3), "after the growth"),
        stuck,
        "the sticky client moved"
    );
    assert_eq!(node.counters().errors, 0, "{}", agent.log());

    // The programs stay attached through their pins while no agent runs, and the next one
    // takes over their state.
    agent.stop();
    echo(&mut outside).expect("the flow from outside echoes with no agent running");
    echo(&mut from_vm).expect("the VM's flow echoes with no agent running");
    let _next = node.agent(&[]);
    echo(&mut outside).expect("the flow from outside echoes after a restart");
    echo(&mut from_vm).expect("the VM's flow echoes after a restart");
    let again = vm.enter(|| TcpStream::connect_timeout(&cluster_ip.into(), Duration::from_secs(5)));
    echo(&mut again.expect("a new flow from the VM after the restart"))
        .expect("the VM's new flow echoes");
}

/// Waits until the service map holds every filler Service's entries.
fn wait_for_entries(pin_dir: &Path, services: usize, agent: &Agent) {
    let expected = services * (1 + ENDPOINTS);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let held = service_entries(pin_dir);
        if held >= expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not program {services} Services within 60 s ({held} entries):\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Master entries and the slots they count.
fn service_entries(pin_dir: &Path) -> usize {
    let data = MapData::from_pin(pin_dir.join(map_names::SERVICES)).expect("the service map");
    let map: HashMap<_, ServiceKey, ServiceEntry> =
        HashMap::try_from(Map::HashMap(data)).expect("a hash map");
    map.iter()
        .filter_map(Result::ok)
        .map(|(_, master)| 1 + usize::from(master.count))
        .sum()
}

fn affinity_entries(pin_dir: &Path) -> BTreeMap<(u64, u32), u32> {
    let data = MapData::from_pin(pin_dir.join(map_names::AFFINITY)).expect("the affinity map");
    let map: HashMap<_, AffinityKey, AffinityEntry> =
        HashMap::try_from(Map::LruHashMap(data)).expect("an LRU map");
    map.iter()
        .filter_map(Result::ok)
        .map(|(key, entry)| ((key.netns_cookie, key.service_id), entry.backend_id))
        .collect()
}

/// The one backend that answered every attempt.
fn single_backend(attempts: &[socklb_tests::Attempt], when: &str) -> String {
    let backends: std::collections::BTreeSet<String> = answers(attempts)
        .into_iter()
        .map(|(server, _)| server)
        .collect();
    assert_eq!(
        backends.len(),
        1,
        "the sticky client moved {when}: {backends:?}"
    );
    backends.into_iter().next().expect("one backend")
}

/// Ids of the pinned maps, their sizes, and the program each pinned link runs.
struct MapIds {
    maps: BTreeMap<&'static str, u32>,
    sizes: BTreeMap<&'static str, u32>,
    programs: BTreeMap<String, u32>,
}

impl MapIds {
    fn read(pin_dir: &Path) -> Self {
        let mut maps = BTreeMap::new();
        let mut sizes = BTreeMap::new();
        for name in map_names::ALL {
            let info = MapData::from_pin(pin_dir.join(name))
                .and_then(|map| map.info())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            maps.insert(name, info.id());
            sizes.insert(name, info.max_entries());
        }
        let mut programs = BTreeMap::new();
        let links = std::fs::read_dir(pin_dir.join("links")).expect("the link pins");
        for entry in links {
            let path = entry.expect("a link pin").path();
            let name = path
                .file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned();
            let link = FdLink::from(PinnedLink::from_pin(&path).expect("a pinned link"));
            programs.insert(name, link.info().expect("link info").program_id());
        }
        assert!(
            programs.len() > program_names::SOCK_ADDR.len(),
            "both the cgroup and the TC programs are attached: {programs:?}"
        );
        Self {
            maps,
            sizes,
            programs,
        }
    }
}

/// Whether map `id` is one of socklb's (a program also uses maps of its own, such as
/// .rodata for its globals).
fn is_socklb_map(id: u32) -> bool {
    aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .find(|map| map.id() == id)
        .and_then(|map| {
            // The programs' own maps hold nothing that outlives a load: never pinned.
            map.name_as_str().map(|name| {
                name.starts_with("socklb_") && !map_names::PROGRAM_LOCAL.contains(&name)
            })
        })
        .unwrap_or(false)
}

/// The ids of the maps program `id` uses.
fn program_maps(id: u32) -> Vec<u32> {
    loaded_programs()
        .filter_map(Result::ok)
        .find(|program| program.id() == id)
        .and_then(|program| program.map_ids().ok().flatten())
        .unwrap_or_else(|| panic!("program {id} is not loaded"))
}
