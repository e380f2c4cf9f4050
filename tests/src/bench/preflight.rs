//! What a benchmark binary checks before it starts: that it runs as root, since it loads
//! BPF programs and makes network namespaces and cgroups of its own.

/// Exits with a message that says how to run it unless the process runs as root; `command`
/// is the `cargo xtask bench` subcommand of the benchmark.
pub fn exit_unless_root(command: &str) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "the benchmark runs the agent, which loads BPF programs, in a network namespace and \
             a cgroup of its own: run it as root (e.g. `sudo cargo xtask bench {command}`)"
        );
        std::process::exit(1);
    }
}
