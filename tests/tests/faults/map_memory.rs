//! The kernel memory socklb's maps take with the default capacities on a small node: 100
//! Services of 10 endpoints, programmed by the real agent. Measured as bpftool reports it:
//! the kernel's `memlock` figure of each pinned map (its fdinfo), which counts what the map
//! holds (preallocated maps: their capacity; the others: their bucket array and entries).
use std::{
    fs,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
    time::{Duration, Instant},
};

use aya::maps::{HashMap, Map, MapData};
use socklb_abi::{ServiceEntry, ServiceKey, map_names};
use socklb_tests::{Agent, ManifestDir, Sandbox, node_yaml, service_yaml, slice_yaml};

const SERVICES: usize = 100;
const ENDPOINTS: usize = 10;
/// What a small node (100 Services) may lock in map memory with the default capacities.
const BUDGET: u64 = 16 * 1024 * 1024;

#[test]
fn a_node_with_100_services_locks_at_most_16_mib_of_map_memory() {
    let sandbox = Sandbox::new("map-memory");
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.81.1"));
    for service in 0..SERVICES {
        let name = format!("svc-{service}");
        let endpoints: Vec<(String, &str, &str, &str)> = (0..ENDPOINTS)
            .map(|endpoint| {
                let address = format!("10.244.{service}.{}", endpoint + 1);
                (address, "node-a", "zone-a", "")
            })
            .collect();
        let endpoints: Vec<_> = endpoints
            .iter()
            .map(|(address, node, zone, conditions)| (address.as_str(), *node, *zone, *conditions))
            .collect();
        manifests.write(
            &format!("{name}.yaml"),
            &format!(
                "{}---\n{}",
                service_yaml(&name, &format!("10.96.1.{}", service + 1), 80, ""),
                slice_yaml(&format!("{name}-1"), &name, 8080, &endpoints, false)
            ),
        );
    }
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);

    // A master and a slot per endpoint for each Service.
    let expected = SERVICES * (1 + ENDPOINTS);
    let deadline = Instant::now() + Duration::from_secs(30);
    while service_entries(&sandbox.pin_dir) < expected {
        assert!(
            Instant::now() < deadline,
            "the agent did not program {expected} service-map entries within 30 s (it has {}):\n{}",
            service_entries(&sandbox.pin_dir),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let per_map: Vec<(&str, u64)> = map_names::ALL
        .iter()
        .map(|name| (*name, memlock(&sandbox.pin_dir.join(name))))
        .collect();
    let total: u64 = per_map.iter().map(|(_, bytes)| bytes).sum();
    let table: String = per_map
        .iter()
        .map(|(name, bytes)| format!("  {name:<16} {bytes:>10} B {:>7.2} MiB\n", mib(*bytes)))
        .collect();
    eprintln!(
        "map memory with {SERVICES} Services of {ENDPOINTS} endpoints: {:.2} MiB\n{table}",
        mib(total)
    );
    assert!(
        total <= BUDGET,
        "socklb's maps lock {:.2} MiB with {SERVICES} Services of {ENDPOINTS} endpoints and the \
         default capacities, more than {:.0} MiB:\n{table}",
        mib(total),
        mib(BUDGET)
    );
    agent.stop();
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The kernel's `memlock` figure of a pinned map (what `bpftool map show` prints).
fn memlock(pin: &Path) -> u64 {
    let map = MapData::from_pin(pin)
        .unwrap_or_else(|e| panic!("the agent did not pin {}: {e}", pin.display()));
    let fd = map.fd().as_fd().as_raw_fd();
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
        .unwrap_or_else(|e| panic!("read the fdinfo of {}: {e}", pin.display()));
    info.lines()
        .find_map(|line| line.strip_prefix("memlock:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no memlock in the fdinfo of {}:\n{info}", pin.display()))
}

fn service_entries(pin_dir: &Path) -> usize {
    let Ok(map) = MapData::from_pin(pin_dir.join(map_names::SERVICES)) else {
        return 0;
    };
    let map: HashMap<_, ServiceKey, ServiceEntry> = Map::HashMap(map)
        .try_into()
        .expect("the service map's key and value");
    // Master entries and the slots they count.
    map.iter()
        .filter_map(Result::ok)
        .map(|(_, master)| 1 + usize::from(master.count))
        .sum()
}
