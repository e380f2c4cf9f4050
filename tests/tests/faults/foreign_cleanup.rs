//! `socklb cleanup --bpffs DIR` removes what the instance of DIR attached, and nothing of
//! another instance's. TCX links are pinned in the instance's directory; netlink TC
//! filters (kernels without TCX) carry no pin, so each instance records its own.
use std::{path::PathBuf, process::Command};

use socklb_agent::dataplane::{Config, TcMode};
use socklb_tests::{Sandbox, agent_bin, privileges::chart_cleanup, run};

#[test]
fn cleanup_of_another_pin_dir_leaves_this_instances_netlink_filters() {
    let sandbox = Sandbox::new("foreign-cleanup");
    // Two devices only the sandbox's namespace has (this kernel has veth, not dummy): the
    // agent finds them through the kernel, not in the host's /sys/class/net.
    run(Command::new("ip").args([
        "link", "add", "ext0", "type", "veth", "peer", "name", "ext1",
    ]));
    for device in ["ext0", "ext1"] {
        run(Command::new("ip").args(["link", "set", device, "up"]));
    }
    // This instance serves eth0 from the sandbox's pins; another serves eth1 from its own.
    let mut this = sandbox.dataplane();
    this.attach_external(&["ext0".to_owned()], TcMode::Netlink)
        .expect("attach this instance's TC programs");
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
    another
        .attach_external(&["ext1".to_owned()], TcMode::Netlink)
        .expect("attach the other instance's TC programs");
    // Netlink filters outlive their loader, as they do when an agent exits.
    drop((this, another));
    assert_eq!(filters("ext0"), 2, "this instance: ingress and egress");
    assert_eq!(filters("ext1"), 2, "the other instance: ingress and egress");

    cleanup(&other.0);
    assert_eq!(
        filters("ext1"),
        0,
        "cleanup removes the other instance's filters"
    );
    assert_eq!(
        filters("ext0"),
        2,
        "cleanup of another pin directory leaves this instance's filters"
    );
    cleanup(&sandbox.pin_dir);
    assert_eq!(
        filters("ext0"),
        0,
        "cleanup removes this instance's filters"
    );
    assert!(
        !sandbox.pin_dir.exists(),
        "the pin directory (with its netlink records) is gone"
    );
}

#[test]
fn two_instances_on_one_device_keep_their_own_netlink_filters() {
    let sandbox = Sandbox::new("shared-device");
    run(Command::new("ip").args([
        "link", "add", "ext0", "type", "veth", "peer", "name", "ext1",
    ]));
    run(Command::new("ip").args(["link", "set", "ext0", "up"]));
    let device = ["ext0".to_owned()];
    let mut this = sandbox.dataplane();
    this.attach_external(&device, TcMode::Netlink)
        .expect("attach this instance's TC programs");
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
    another
        .attach_external(&device, TcMode::Netlink)
        .expect("attach the other instance's TC programs");
    assert_eq!(
        filters("ext0"),
        4,
        "the second instance attached beside the first, not over it"
    );
    // Both again, as restarted agents: each replaces its own filters, nobody else's.
    this.attach_external(&device, TcMode::Netlink)
        .expect("attach this instance's TC programs again");
    another
        .attach_external(&device, TcMode::Netlink)
        .expect("attach the other instance's TC programs again");
    drop((this, another));
    assert_eq!(filters("ext0"), 4, "restarts replaced filters in place");

    cleanup(&other.0);
    assert_eq!(
        filters("ext0"),
        2,
        "cleanup of the other instance leaves this instance's filters on the shared device"
    );
    cleanup(&sandbox.pin_dir);
    assert_eq!(filters("ext0"), 0, "no program is left on the device");
}

/// `socklb cleanup` as the chart's cleanup container runs it.
fn cleanup(pin_dir: &std::path::Path) {
    let output = chart_cleanup()
        .command(agent_bin())
        .arg("cleanup")
        .arg("--bpffs")
        .arg(pin_dir)
        .output()
        .expect("run socklb cleanup");
    assert!(
        output.status.success(),
        "socklb cleanup --bpffs {}: {}",
        pin_dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// socklb's netlink filters on `device`, as `tc` lists them.
pub fn filters(device: &str) -> usize {
    ["ingress", "egress"]
        .iter()
        .map(|hook| {
            let output = Command::new("tc")
                .args(["filter", "show", "dev", device, hook])
                .output()
                .expect("tc (iproute2)");
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter(|line| line.contains("socklb_tc_"))
                .count()
        })
        .sum()
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
