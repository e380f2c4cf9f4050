//! An L3 device (no Ethernet header) under the TC programs, which parse Ethernet: refused
//! by name, never attached to. WireGuard and ipip are not in this kernel; tun is, and is
//! the same kind of device (link type `ARPHRD_NONE`, as WireGuard's).
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use socklb_tests::{Agent, ManifestDir, Sandbox, node_yaml, privileges::chart_agent_minimal, run};

use crate::foreign_cleanup::filters;

#[test]
fn an_explicit_l3_device_fails_the_start_before_anything_is_created() {
    let sandbox = Sandbox::new("l3-explicit");
    tun("tun0", "10.79.0.1/24");
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "10.79.0.1"));
    let mut child = sandbox
        .agent_command(chart_agent_minimal(), &manifests.path)
        .args(["--devices", "tun0", "--tc-attach-mode", "netlink"])
        .args(["--healthz-bind-address", "127.0.0.1:0"])
        .args(["--metrics-bind-address", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("run socklb");
    // An agent that does not stop at start would run on: it is killed at the deadline.
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait for socklb").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("socklb's output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started on tun0:\n{stderr}");
    assert!(
        stderr.contains("tun0") && stderr.contains("not an Ethernet device"),
        "the error names the device and why:\n{stderr}"
    );
    assert!(
        !sandbox.pin_dir.exists(),
        "nothing may be created before the devices are checked"
    );
    assert_eq!(filters("tun0"), 0, "nothing attached to tun0");
}

#[test]
fn an_l3_device_holding_the_node_address_is_skipped_with_one_warning() {
    let sandbox = Sandbox::new("l3-auto");
    tun("tun0", "10.79.0.1/24");
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "10.79.0.1"));
    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node-a",
        &["--tc-attach-mode", "netlink", "--sync-period", "1s"],
    );
    // More full syncs: the device is found again each time, and not warned about again.
    agent.wait_for_log("synced", 3);
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
    assert_eq!(filters("tun0"), 0, "nothing attached to tun0:\n{log}");
}

/// An L3 device in the sandbox's namespace, up, holding `address`.
fn tun(device: &str, address: &str) {
    run(Command::new("ip").args(["tuntap", "add", "dev", device, "mode", "tun"]));
    run(Command::new("ip").args(["addr", "add", address, "dev", device]));
    run(Command::new("ip").args(["link", "set", device, "up"]));
}
