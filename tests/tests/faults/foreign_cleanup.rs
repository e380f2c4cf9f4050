//! `socklb cleanup --bpffs DIR` removes what the instance of DIR attached, and nothing of
//! another instance's. TCX links are pinned in the instance's directory; netlink TC
//! filters (kernels without TCX) carry no pin, so each instance records its own.
use std::{path::PathBuf, process::Command};

use socklb_agent::dataplane::{Config, Dataplane, DeviceRole, TcMode};
use socklb_tests::{Sandbox, agent_bin, privileges::chart_cleanup, run, stdout_of, tc_filters};

#[test]
fn cleanup_of_another_pin_dir_leaves_this_instances_netlink_filters() {
    let sandbox = Sandbox::new("foreign-cleanup");
    // Two devices only the sandbox's namespace has (this kernel has veth, not dummy): the
    // agent finds them through the kernel, not in the host's /sys/class/net.
    veth_pair(&["ext0", "ext1"]);
    // This instance serves eth0 from the sandbox's pins; another serves eth1 from its own.
    let (other, this, another) = two_instances(&sandbox, "ext0", "ext1");
    // Netlink filters outlive their loader, as they do when an agent exits.
    drop((this, another));
    assert_eq!(tc_filters("ext0"), 2, "this instance: ingress and egress");
    assert_eq!(
        tc_filters("ext1"),
        2,
        "the other instance: ingress and egress"
    );

    cleanup(&other.0);
    assert_eq!(
        tc_filters("ext1"),
        0,
        "cleanup removes the other instance's filters"
    );
    assert_eq!(
        tc_filters("ext0"),
        2,
        "cleanup of another pin directory leaves this instance's filters"
    );
    cleanup(&sandbox.pin_dir);
    assert_eq!(
        tc_filters("ext0"),
        0,
        "cleanup removes this instance's filters"
    );
    sandbox.assert_no_pins("the pin directory (with its netlink records) is gone");
}

#[test]
fn two_instances_on_one_device_keep_their_own_netlink_filters() {
    let sandbox = Sandbox::new("shared-device");
    veth_pair(&["ext0"]);
    let (other, mut this, mut another) = two_instances(&sandbox, "ext0", "ext0");
    assert_eq!(
        tc_filters("ext0"),
        4,
        "the second instance attached beside the first, not over it"
    );
    // Both again, as restarted agents: each replaces its own filters, nobody else's.
    attach_external(&mut this, "ext0");
    attach_external(&mut another, "ext0");
    drop((this, another));
    assert_eq!(tc_filters("ext0"), 4, "restarts replaced filters in place");

    cleanup(&other.0);
    assert_eq!(
        tc_filters("ext0"),
        2,
        "cleanup of the other instance leaves this instance's filters on the shared device"
    );
    cleanup(&sandbox.pin_dir);
    assert_eq!(tc_filters("ext0"), 0, "no program is left on the device");
}

/// Two devices only the sandbox's namespace has (this kernel has veth, not dummy), ext0 and
/// ext1, with those of `up` up: the agent finds them through the kernel, not in the host's
/// /sys/class/net.
fn veth_pair(up: &[&str]) {
    run(Command::new("ip").args([
        "link", "add", "ext0", "type", "veth", "peer", "name", "ext1",
    ]));
    for device in up {
        run(Command::new("ip").args(["link", "set", device, "up"]));
    }
}

/// This instance (the sandbox's pins) with its TC programs attached to `this_device` by
/// netlink, and another instance (pins of its own, removed when dropped) attached to
/// `other_device`.
fn two_instances(
    sandbox: &Sandbox,
    this_device: &str,
    other_device: &str,
) -> (OtherPins, Dataplane, Dataplane) {
    let mut this = sandbox.dataplane();
    attach_external(&mut this, this_device);
    let other = OtherPins(PathBuf::from(format!(
        "{}-other",
        sandbox.pin_dir.display()
    )));
    let mut another = sandbox
        .load(Config {
            pin_dir: other.0.clone(),
            ..sandbox.config()
        })
        .expect("load another instance");
    attach_external(&mut another, other_device);
    (other, this, another)
}

/// The TC programs of an external device on `device`, by netlink, as a (re)started agent
/// attaches them.
fn attach_external(dataplane: &mut Dataplane, device: &str) {
    dataplane
        .attach_tc(
            &[(device.to_owned(), DeviceRole::External)],
            &[],
            TcMode::Netlink,
        )
        .unwrap_or_else(|e| panic!("attach the TC programs to {device}: {e}"));
}

/// `socklb cleanup` as the chart's cleanup container runs it.
fn cleanup(pin_dir: &std::path::Path) {
    stdout_of(
        chart_cleanup()
            .command(agent_bin())
            .arg("cleanup")
            .arg("--bpffs")
            .arg(pin_dir),
    );
}

/// The other instance's pin directory, removed even when the test fails.
struct OtherPins(PathBuf);

impl Drop for OtherPins {
    fn drop(&mut self) {
        if let Err(e) = socklb_agent::dataplane::cleanup(&self.0) {
            eprintln!("cleanup of {}: {e}", self.0.display());
        }
    }
}
