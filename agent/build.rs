//! Builds the eBPF programs (socklb-ebpf) with the pinned nightly and bpf-linker, into
//! OUT_DIR, where `kernel::object` embeds them. aya-build reruns this script whenever the
//! eBPF crate changes, so the embedded object can never be stale: it is rebuilt, or the
//! build fails loudly.
use anyhow::Context as _;

/// The nightly whose LLVM matches bpf-linker's (see xtask's setup).
const EBPF_TOOLCHAIN: &str = "nightly-2026-07-01";

fn main() -> anyhow::Result<()> {
    let ebpf = aya_build::Package {
        name: "socklb-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([ebpf], aya_build::Toolchain::Custom(EBPF_TOOLCHAIN)).context(
        "building the eBPF programs failed: run `cargo xtask setup` to install the nightly \
         toolchain with rust-src and bpf-linker",
    )
}
