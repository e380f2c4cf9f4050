//! The kernel programs, built by build.rs from ebpf/programs and embedded in the binary.

/// The eBPF ELF object (BTF included).
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/socklb"));
