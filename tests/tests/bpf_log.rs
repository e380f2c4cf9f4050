//! The kernel programs' own log (aya-log, `--bpf-log-level`): a program that takes a logged
//! failure path shows up in the agent's log when asked, writes nothing when not, and its
//! log calls are gone from the programs the verifier accepted when the level is off.
use std::{
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use aya::{
    maps::{Map, MapData, MapInfo, RingBuf},
    programs::{
        ProgramInfo,
        links::{FdLink, PinnedLink},
        loaded_programs,
    },
};
use socklb_abi::{PROTO_TCP, ServiceEntry, ServiceKey, program_names};
use socklb_tests::{Agent, ManifestDir, Sandbox, assert_logged, service_yaml, slice_yaml};

/// A VIP the agent does not know: the test writes a broken frontend for it by hand.
const BROKEN: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 96, 9, 9), 80);
/// What the connect program logs for it.
const LOGGED: &str = "frontend 10.96.9.9:80 lists 2 backends but the slots drawn are missing";

/// node-a and a Service (no server needed: the test connects only to the broken VIP).
fn cluster(sandbox: &Sandbox, net: u8) -> ManifestDir {
    ManifestDir::web_with_one_endpoint(sandbox, net, "10.96.1.10")
}

/// The agent with the programs' log at warn (and no periodic resync to interfere).
fn logging_agent(sandbox: &Sandbox, manifests: &ManifestDir) -> Agent {
    let flags = ["--bpf-log-level", "warn", "--sync-period", "1h"];
    Agent::start(sandbox, &manifests.path, "node-a", &flags)
}

/// A master entry that says two backends at slots past the slot array's end (as a broken
/// writer or a hand edit would leave it): connect() draws, finds no slot, and takes the
/// failure path that proceeds untranslated, counted as `errors` and logged.
fn write_broken_frontend(sandbox: &Sandbox) {
    let map = Map::HashMap(
        MapData::from_pin(sandbox.pin_dir.join(socklb_abi::map_names::SERVICES))
            .expect("open the pinned service map"),
    );
    let mut services: aya::maps::HashMap<_, ServiceKey, ServiceEntry> =
        map.try_into().expect("the service map");
    let key = ServiceKey {
        address: u32::from(BROKEN.0).to_be(),
        port: BROKEN.1.to_be(),
        protocol: PROTO_TCP,
        ..ServiceKey::default()
    };
    let master = ServiceEntry {
        count: 2,
        service_id: 9999,
        first_slot: u32::MAX,
        ..ServiceEntry::default()
    };
    services
        .insert(&key, &master, 0)
        .expect("write the broken master entry");
}

/// The kernel's `errors` counter, as `socklb inspect` sums it.
fn errors(sandbox: &Sandbox) -> u64 {
    sandbox.inspect()["counters"]["errors"]
        .as_u64()
        .expect("inspect shows the errors counter")
}

/// Connects to the broken frontend from the sandbox's cgroup until the program has taken
/// the failure path (the counter moved), with a deadline.
fn hit_the_failure_path(sandbox: &Sandbox) {
    let before = errors(sandbox);
    let target = SocketAddr::from(BROKEN);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // Untranslated, the connect fails (no route in the sandbox): only the count matters.
        let _ = sandbox.probe("tcp", target, 1);
        if errors(sandbox) > before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the connect program never counted the broken frontend as an error"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The connect4 program attached through this sandbox's pinned link.
fn connect4(pin_dir: &Path) -> ProgramInfo {
    let link = PinnedLink::from_pin(pin_dir.join("links").join(program_names::CONNECT4))
        .expect("open the pinned connect4 link");
    let id = FdLink::from(link)
        .info()
        .expect("the link's info")
        .program_id();
    loaded_programs()
        .filter_map(Result::ok)
        .find(|program| program.id() == id)
        .expect("the attached connect4 program")
}

/// The log ring buffer (aya-log's `AYA_LOGS`) of a program.
fn log_ring(program: &ProgramInfo) -> RingBuf<MapData> {
    let id = program
        .map_ids()
        .expect("the program's maps")
        .unwrap_or_default()
        .into_iter()
        .find(|id| {
            MapInfo::from_id(*id)
                .ok()
                .is_some_and(|info| info.name_as_str() == Some("AYA_LOGS"))
        })
        .expect("the programs use aya-log's AYA_LOGS ring buffer");
    RingBuf::try_from(Map::RingBuf(
        MapData::from_id(id).expect("open the log ring buffer"),
    ))
    .expect("a ring buffer")
}

#[test]
fn a_program_failure_is_in_the_agent_log_with_bpf_log_level() {
    let sandbox = Sandbox::new("bpflog-on");
    let manifests = cluster(&sandbox, 41);
    let agent = logging_agent(&sandbox, &manifests);
    write_broken_frontend(&sandbox);
    hit_the_failure_path(&sandbox);
    agent.wait_for_log(LOGGED, 1);
    let log = agent.stop();
    let line = log
        .lines()
        .find(|line| line.contains(LOGGED))
        .expect("the line");
    assert_logged(
        line,
        &["WARN", "socklb::lb"],
        "a warning, with the program's module as its target",
    );
}

#[test]
fn without_bpf_log_level_the_programs_log_nothing_and_carry_no_log_code() {
    let sandbox = Sandbox::new("bpflog-off");
    let manifests = cluster(&sandbox, 42);
    let args = ["--sync-period", "1h"];
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &args);
    let off = connect4(&sandbox.pin_dir);
    write_broken_frontend(&sandbox);
    // The failure path ran (counted), and wrote nothing to the log ring: the counter is
    // bumped after the (would-be) log call, in the same program run.
    hit_the_failure_path(&sandbox);
    assert!(
        log_ring(&off).next().is_none(),
        "the program wrote a log record although the level is off"
    );
    let log = agent.stop();
    assert!(!log.contains("socklb::lb"), "{log}");

    // The same programs loaded with the level on are larger: with it off, the verifier
    // removed the log calls (it knows the read-only level), so they cost nothing.
    let agent = logging_agent(&sandbox, &manifests);
    let on = connect4(&sandbox.pin_dir);
    agent.stop();
    let size = |program: &ProgramInfo| program.size_translated().expect("xlated size");
    assert!(
        size(&off) < size(&on),
        "connect4 is {} bytes with the log off and {} with it on: the log calls were not \
         removed when off",
        size(&off),
        size(&on)
    );
}

/// Programs loaded again over grown maps write to the same (pinned) log buffer, which the
/// agent keeps reading: a failure after a growth is in the log too.
#[test]
fn after_the_maps_grow_program_failures_still_reach_the_agent_log() {
    let sandbox = Sandbox::new("bpflog-grown");
    let manifests = cluster(&sandbox, 43);
    let agent = logging_agent(&sandbox, &manifests);
    // 3,200 one-endpoint Services need 6,400 service entries: more than three quarters of
    // the 8,192 the service map starts with.
    let mut many = String::new();
    for i in 0..3_200u32 {
        let name = format!("grow-{i}");
        let vip = format!("10.97.{}.{}", i / 250, i % 250 + 1);
        let endpoint = format!("10.200.{}.{}", i / 250, i % 250 + 1);
        many.push_str(&service_yaml(&name, &vip, 80, ""));
        many.push_str("---\n");
        many.push_str(&slice_yaml(
            &format!("{name}-1"),
            &name,
            8080,
            &[(&endpoint, "node-a", "zone-a", "")],
            false,
        ));
        many.push_str("---\n");
    }
    manifests.write("many.yaml", &many);
    agent.wait_for_log("maps grown", 1);
    write_broken_frontend(&sandbox);
    hit_the_failure_path(&sandbox);
    agent.wait_for_log(LOGGED, 1);
}
