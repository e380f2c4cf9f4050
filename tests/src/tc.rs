//! What socklb attached to a device of this thread's namespace, as the kernel's own tools
//! list it (for the attach modes that pin nothing: netlink TC filters).
use std::process::Command;

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
