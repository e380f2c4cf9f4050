//! An L3 device (no Ethernet header) under the TC programs, which parse Ethernet: refused
//! by name, never attached to. WireGuard and ipip are not in this kernel; tun is, and is
//! the same kind of device (link type `ARPHRD_NONE`, as WireGuard's).
use std::{process::Command, time::Duration};

use socklb_tests::{
    Agent, FREE_PORTS, ManifestDir, Sandbox, node_yaml, privileges::chart_agent_minimal, run,
    run_to_exit, tc_filters,
};

#[test]
fn an_explicit_l3_device_fails_the_start_before_anything_is_created() {
    let (sandbox, manifests) = node_on_tun("l3-explicit");
    let (started, stderr) = run_to_exit(
        sandbox
            .agent_command(chart_agent_minimal(), &manifests.path)
            .args(["--devices", "tun0", "--tc-attach-mode", "netlink"])
            .args(FREE_PORTS),
        Duration::from_secs(20),
    );
    assert!(!started, "started on tun0:\n{stderr}");
    assert!(
        stderr.contains("tun0") && stderr.contains("not an Ethernet device"),
        "the error names the device and why:\n{stderr}"
    );
    sandbox.assert_no_pins("nothing may be created before the devices are checked");
    assert_eq!(tc_filters("tun0"), 0, "nothing attached to tun0");
}

#[test]
fn an_l3_device_holding_the_node_address_is_skipped_with_one_warning() {
    let (sandbox, manifests) = node_on_tun("l3-auto");
    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--tc-attach-mode", "netlink", "--sync-period", "1s"],
    );
    // More syncs (resyncs every second): the device is found again each time, and not
    // warned about again.
    agent.wait_for_log("maps verified", 2);
    let log = agent.stop();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("skipping a device"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning:\n{log}");
    assert!(
        warnings[0].contains("tun0") && warnings[0].contains("not an Ethernet device"),
        "the warning names the device and why: {}",
        warnings[0]
    );
    assert_eq!(tc_filters("tun0"), 0, "nothing attached to tun0:\n{log}");
}

/// The sandbox of `test` with an L3 device, tun0, up and holding 10.79.0.1/24, and the
/// manifests of node-a, whose address that is.
fn node_on_tun(test: &str) -> (Sandbox, ManifestDir) {
    let sandbox = Sandbox::new(test);
    run(Command::new("ip").args(["tuntap", "add", "dev", "tun0", "mode", "tun"]));
    run(Command::new("ip").args(["addr", "add", "10.79.0.1/24", "dev", "tun0"]));
    run(Command::new("ip").args(["link", "set", "tun0", "up"]));
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "10.79.0.1"));
    (sandbox, manifests)
}
