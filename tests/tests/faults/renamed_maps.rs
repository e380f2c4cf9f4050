//! An agent started over an older agent's pins, whose unconfirmed-flow and source-range maps
//! had other names (`socklb_ctnew_v1`, `socklb_lbsrc_v1`, before twin maps were named
//! alike): a TCP handshake waiting in the old table is carried into the new one, an open
//! SNATed connection carries on, no old name is left pinned, and `socklb cleanup` removes
//! an old name it finds. And an agent started over a newer agent's pins (a downgrade)
//! unpins the maps of the layout it does not know, as cleanup does.
use std::{
    fs,
    net::{IpAddr, SocketAddr, SocketAddrV4, TcpStream},
    process::Command,
    time::{Duration, Instant},
};

use socklb_abi::map_names;
use socklb_agent::inspect;
use socklb_tests::{
    Agent, ManifestDir, Sandbox, agent_bin,
    echo::{EchoServer, echo},
    forged::{self, Flags},
    lan::{NODE1, POD2, POD2_ENDPOINT, lan, nodes, service, slice},
    run,
};

const NODE_PORT: u16 = 30170;
/// The names an older agent pinned, and what they are called now.
const OLD_NAMES: [(&str, &str); 2] = [
    ("socklb_ctnew_v1", map_names::CONNTRACK_NEW),
    ("socklb_lbsrc_v1", map_names::SOURCE_RANGES),
];

#[test]
fn an_older_agents_renamed_maps_are_taken_over_without_losing_a_flow() {
    let sandbox = Sandbox::new("renamed");
    let lan = lan("rn");
    let _echo = EchoServer::start(&lan.pod2, SocketAddrV4::new(POD2, 8080));
    let manifests = ManifestDir::new(&sandbox);
    nodes(&manifests);
    manifests.service(
        "echo",
        &service(
            "echo",
            "10.96.0.170",
            &format!(
                "[{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]"
            ),
            "  type: NodePort",
            None,
        ),
        &slice("echo-1", "echo", ("http", 8080, "TCP"), &[POD2_ENDPOINT]),
    );
    let agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);
    agent.wait_for_log("synced", 1);
    let node1: IpAddr = NODE1.parse().expect("address");
    let frontend = SocketAddr::new(node1, NODE_PORT);
    // An open connection (SNATed to pod2 on node2: only conntrack connects its replies).
    let mut open = lan.client.enter(|| {
        TcpStream::connect_timeout(&frontend, Duration::from_secs(5))
            .expect("connect through the NodePort")
    });
    echo(&mut open).expect("the open connection before the restart");
    // A handshake waiting for its ACK, in the table of unconfirmed flows: from a LAN address
    // no host holds, so that nothing resets it.
    let waiting = SocketAddr::new("10.77.0.13".parse().expect("address"), 40_170);
    lan.client
        .enter(|| forged::send(waiting, frontend, 1, Flags::Syn));
    wait_until("the SYN's unconfirmed entries", || {
        unconfirmed_entries(&sandbox, waiting) == 2
    });
    agent.stop();

    // The pins as the older agent named them (the programs still run over those maps).
    for (old, new) in OLD_NAMES {
        fs::rename(sandbox.pin_dir.join(new), sandbox.pin_dir.join(old))
            .unwrap_or_else(|e| panic!("rename the pin {new} to {old}: {e}"));
    }
    let agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);
    agent.wait_for_log("synced", 1);
    for (old, new) in OLD_NAMES {
        assert!(
            !sandbox.pin_dir.join(old).exists(),
            "the old name {old} is still pinned"
        );
        assert!(sandbox.pin_dir.join(new).exists(), "{new} is not pinned");
    }
    assert_eq!(
        unconfirmed_entries(&sandbox, waiting),
        2,
        "the waiting handshake's entries were carried into {}",
        map_names::CONNTRACK_NEW
    );
    echo(&mut open).expect("the open connection after the restart");
    let log = agent.stop();

    // An old name left behind (pinned again here) is removed by cleanup with the rest.
    let (old, new) = OLD_NAMES[1];
    pin_again(&sandbox, new, old);
    cleanup_removes_every_pin(&sandbox, &format!("the old name included:\n{log}"));
}

/// What a newer agent left pinned, by names of layouts this agent does not know: another
/// version of a map it has, and a map it has not.
const NEWER_NAMES: [&str; 2] = ["socklb_svc_v99", "socklb_newkind_v1"];

#[test]
fn maps_of_a_newer_layout_are_unpinned_at_start_and_by_cleanup() {
    let sandbox = Sandbox::new("newer-layout");
    let manifests = ManifestDir::web_with_one_endpoint(&sandbox, 71, "10.96.71.10");
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    agent.wait_for_log("synced", 1);
    agent.stop();
    // The newer agent's maps: any map pinned under those names stands for them.
    for name in NEWER_NAMES {
        pin_again(&sandbox, map_names::NODE, name);
    }
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    agent.wait_for_log("synced", 1);
    let log = agent.stop();
    for name in NEWER_NAMES {
        assert!(
            !sandbox.pin_dir.join(name).exists(),
            "{name}, of a layout this agent does not know, is still pinned:\n{log}"
        );
        assert!(
            log.contains(&format!("map={}", sandbox.pin_dir.join(name).display())),
            "the agent did not log the removal of {name}:\n{log}"
        );
    }
    assert!(
        sandbox.pin_dir.join(map_names::NODE).exists(),
        "the agent's own map went with them"
    );

    pin_again(&sandbox, map_names::NODE, NEWER_NAMES[1]);
    cleanup_removes_every_pin(&sandbox, "the newer layout's included");
}

/// Runs `socklb cleanup` and checks that it removed every pin (`what`: which, and the log).
fn cleanup_removes_every_pin(sandbox: &Sandbox, what: &str) {
    run(Command::new(agent_bin())
        .args(["cleanup", "--bpffs"])
        .arg(&sandbox.pin_dir));
    assert!(
        !sandbox.pin_dir.exists(),
        "cleanup did not remove every pin, {what}"
    );
}

/// Pins the map pinned as `pinned` once more, as `name`.
fn pin_again(sandbox: &Sandbox, pinned: &str, name: &str) {
    run(Command::new("bpftool").args([
        "map",
        "pin",
        "pinned",
        &sandbox.pin_dir.join(pinned).to_string_lossy(),
        &sandbox.pin_dir.join(name).to_string_lossy(),
    ]));
}

/// The conntrack entries of the flow from `client`, both directions, in the table of
/// unconfirmed flows.
fn unconfirmed_entries(sandbox: &Sandbox, client: SocketAddr) -> usize {
    inspect::inspect(&sandbox.pin_dir, None)
        .expect("inspect")
        .conntrack
        .into_iter()
        .filter(|flow| !flow.confirmed && (flow.from == client || flow.rewritten_to == client))
        .count()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}
