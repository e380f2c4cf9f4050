//! The kernel's own tools as the tests use them to see what socklb attached and pinned:
//! `tc` for netlink TC filters (which pin nothing), `bpftool` for maps and cgroup programs.
use std::{ffi::OsStr, process::Command};

use crate::process::stdout_of;

/// socklb's netlink TC filters on `device`, ingress and egress, as `tc` lists them.
pub fn tc_filters(device: &str) -> usize {
    ["ingress", "egress"]
        .iter()
        .map(|hook| {
            stdout_of(Command::new("tc").args(["filter", "show", "dev", device, hook]))
                .lines()
                .filter(|line| line.contains("socklb_tc_"))
                .count()
        })
        .sum()
}

/// `bpftool <args>`, which must succeed: its output.
pub fn bpftool<S: AsRef<OsStr>>(args: &[S]) -> String {
    let output = Command::new("bpftool")
        .args(args)
        .output()
        .expect("prerequisite missing: bpftool (./x setup installs it)");
    assert!(
        output.status.success(),
        "bpftool: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}
