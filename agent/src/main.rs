//! The `socklb` binary: parses the command line and hands it to the library
//! (`socklb_agent::cli`), where everything testable lives.
use std::process::ExitCode;

/// jemalloc instead of the C library's allocator. With glibc's, an incremental sync right
/// after a large relist (a file-source reload or a kube watch restart frees and allocates
/// tens of thousands of objects) took 0.4-4 ms instead of 0.15 ms at 30,000 Services,
/// consolidating the freed chunks; musl's (the static image) is slower still.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before main: one arena (objects decoded on the async workers
/// and freed on the sync thread would otherwise keep memory in one arena per thread; the
/// per-thread caches keep contention away), and freed pages returned to the kernel within a
/// second. At 10,000 Services: peak RSS 96 / 120 MiB (file / kube source) against glibc's
/// 102 / 124 MiB with two arenas (docs/benchmarks.md, control plane).
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 47] = b"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

fn main() -> ExitCode {
    let cli = match socklb_agent::cli::parse() {
        Ok(cli) => cli,
        Err(status) => return status,
    };
    socklb_agent::cli::init_tracing(&cli);
    socklb_agent::cli::main(cli)
}
