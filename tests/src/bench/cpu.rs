//! Where the timed processes run and what CPU time they use.
use std::{fs, io, mem::size_of};

/// The CPUs the timed clients and the servers run on. On two CPUs the scheduler otherwise
/// moves clients and server threads between "same CPU" and "other CPU" from one batch to
/// the next, which shifts a batch's latency by up to 25 us whatever the peer: pinned, every
/// peer's connections take the same path (client on one CPU, server on the other).
pub const CLIENT_CPU: usize = 0;
pub const SERVER_CPU: usize = 1;

/// Pins the calling thread (or, before exec, the process) to `cpu`, if the machine has it.
/// Only a system call, so it is safe between fork and exec.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays in bounds (cpu < CPU_SETSIZE checked).
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Ok(());
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            let error = io::Error::last_os_error();
            // EINVAL: no such CPU here; one CPU serves everything then.
            if error.raw_os_error() != Some(libc::EINVAL) {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// This process's user + system CPU time (getrusage), in nanoseconds.
pub fn cpu_ns() -> u64 {
    // SAFETY: rusage is plain data; getrusage fills it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let ns = |time: libc::timeval| {
        u64::try_from(time.tv_sec).unwrap_or(0) * 1_000_000_000
            + u64::try_from(time.tv_usec).unwrap_or(0) * 1_000
    };
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

/// A process's user + system CPU time so far, in seconds (/proc/PID/stat).
pub fn process_cpu(pid: u32) -> f64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15; the list starts at field 3.
    let ticks = |field: usize| fields.get(field - 3).and_then(|v| v.parse::<f64>().ok());
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(14).unwrap_or(0.0) + ticks(15).unwrap_or(0.0)) / per_second
}
