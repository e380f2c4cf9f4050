//! This process's cgroup: where the peers other than socklb connect from, and whose memory
//! counters show what the rule loaders it starts leave in the kernel.
use std::{fs, path::PathBuf};

use anyhow::Context as _;

/// The cgroup v2 directory this process runs in.
pub fn own_cgroup() -> anyhow::Result<PathBuf> {
    let cgroups = fs::read_to_string("/proc/self/cgroup").context("read /proc/self/cgroup")?;
    let path = cgroups
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .context("this process has no cgroup v2 entry in /proc/self/cgroup")?;
    Ok(crate::cgroup2_root().join(path.trim_start_matches('/')))
}

/// Kernel memory charged to this process's memory cgroup so far, in bytes (the rule
/// loaders it starts run in the same cgroup, and the kernel charges their rules to it):
/// cgroup v1 `memory.kmem.usage_in_bytes` or cgroup v2 `memory.stat` `kernel`.
pub fn kernel_memory() -> Option<u64> {
    let cgroups = fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let file = format!("/sys/fs/cgroup/memory{path}/memory.kmem.usage_in_bytes");
            return fs::read_to_string(file).ok()?.trim().parse().ok();
        }
    }
    let stat = fs::read_to_string(own_cgroup().ok()?.join("memory.stat")).ok()?;
    stat.lines()
        .find_map(|line| line.strip_prefix("kernel "))
        .and_then(|value| value.trim().parse().ok())
}
