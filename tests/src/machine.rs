//! What the machine says about a run: its kernel, CPUs and date (next to which absolute
//! times mean something) and a process's memory.
use std::{fs, process::Command};

/// Kernel, CPUs and date: absolute times only mean something next to these.
pub fn machine_context() -> String {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|release| release.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let model = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{date}, kernel {kernel}, {cpus} CPUs ({model})")
}

/// VmHWM (peak resident set) and VmRSS of a process, in KiB.
pub fn process_memory_kib(pid: u32) -> (u64, u64) {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in {path}"))
    };
    (kib("VmHWM:"), kib("VmRSS:"))
}
