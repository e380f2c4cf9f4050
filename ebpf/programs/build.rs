//! Rebuild the eBPF object when bpf-linker changes: the linker is part of the toolchain
//! that shapes the object, yet cargo does not track it.
use which::which;

fn main() {
    match which("bpf-linker") {
        Ok(linker) => println!("cargo:rerun-if-changed={}", linker.display()),
        Err(error) => {
            println!("cargo:warning=bpf-linker not found ({error}): run `cargo xtask setup`")
        }
    }
}
