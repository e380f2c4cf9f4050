use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = socklb_agent::cli::Cli::parse();
    socklb_agent::cli::init_tracing(&cli);
    socklb_agent::cli::main(cli)
}

/// glibc gives every thread that allocates an arena of its own; objects decoded on the async
/// workers and freed on the sync thread then hold memory in several of them. Two arenas cut
/// the agent's peak RSS by about a quarter (docs/benchmarks.md, control plane).
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: called first in main, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
