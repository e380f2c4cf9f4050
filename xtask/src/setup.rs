//! `cargo xtask setup`: installs what a fresh Debian 12 machine lacks. Every step checks
//! first, so a second run only checks.
use std::{
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// The nightly that builds the eBPF crate: its LLVM (22) must match bpf-linker's. Keep in
/// sync with agent/build.rs.
pub const EBPF_TOOLCHAIN: &str = "nightly-2026-07-01";
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// Debian packages: LLVM for bpf-linker, bpftool, and the real servers and clients the
/// tests use (dnsmasq as DNS backends, dig, curl, iproute2).
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "bpftool",
    "iproute2",
    "dnsmasq-base",
    "bind9-dnsutils",
    "curl",
    // Real clients of the north-south tests.
    "iperf3",
    "traceroute",
    // kube-proxy's rules, for the side-by-side benchmarks only.
    "iptables",
    "nftables",
    // Text in the benchmark plots (docs/plots).
    "fonts-dejavu-core",
    // The container image: podman builds it offline, musl-gcc compiles ring for the static build.
    "podman",
    "musl-tools",
    // The seccomp tests: libseccomp compiles a container runtime's default profile, and
    // containers-common ships one (CRI-O's and podman's).
    "libseccomp-dev",
    "golang-github-containers-common",
    // jemalloc, the agent's allocator, is built from source by its crate (configure, make).
    "make",
];

pub fn run() -> anyhow::Result<()> {
    apt_packages()?;
    musl_target()?;
    ebpf_toolchain()?;
    bpf_linker()?;
    bpffs()?;
    eprintln!("==> setup: done");
    Ok(())
}

fn apt_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|package| !apt_installed(package))
        .collect();
    if missing.is_empty() {
        eprintln!("==> setup: apt packages present");
        return Ok(());
    }
    eprintln!("==> setup: installing apt packages {}", missing.join(" "));
    run_quiet(
        Command::new("apt-get").arg("update").arg("-qq"),
        "apt-get update",
    )?;
    run_quiet(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install",
    )
}

fn apt_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("install ok installed"))
}

/// The static (musl) target of the host toolchain, for the container image.
fn musl_target() -> anyhow::Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(MUSL_TARGET));
    if installed {
        eprintln!("==> setup: target {MUSL_TARGET} present");
        return Ok(());
    }
    eprintln!("==> setup: adding target {MUSL_TARGET} (static builds for the image)");
    run_quiet(
        Command::new("rustup").args(["target", "add", MUSL_TARGET]),
        "rustup target add",
    )
}

const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

fn ebpf_toolchain() -> anyhow::Result<()> {
    let installed = Command::new("rustup")
        .args([
            "component",
            "list",
            "--installed",
            "--toolchain",
            EBPF_TOOLCHAIN,
        ])
        .output()
        .is_ok_and(|out| {
            let components = String::from_utf8_lossy(&out.stdout);
            out.status.success() && components.contains("rust-src") && components.contains("clippy")
        });
    if installed {
        eprintln!("==> setup: toolchain {EBPF_TOOLCHAIN} with rust-src and clippy present");
        return Ok(());
    }
    eprintln!(
        "==> setup: installing toolchain {EBPF_TOOLCHAIN} with rust-src and clippy (eBPF builds)"
    );
    run_quiet(
        Command::new("rustup").args([
            "toolchain",
            "install",
            EBPF_TOOLCHAIN,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
            "--component",
            "clippy",
        ]),
        "rustup toolchain install",
    )
}

fn bpf_linker() -> anyhow::Result<()> {
    let present = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(BPF_LINKER_VERSION));
    if present {
        eprintln!("==> setup: bpf-linker {BPF_LINKER_VERSION} present");
        return Ok(());
    }
    eprintln!(
        "==> setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)"
    );
    run_quiet(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--locked",
                "--version",
                BPF_LINKER_VERSION,
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", LLVM_PREFIX),
        "cargo install bpf-linker",
    )
}

fn bpffs() -> anyhow::Result<()> {
    let mounted = std::fs::read_to_string("/proc/self/mounts")
        .context("reading /proc/self/mounts")?
        .lines()
        .any(|line| {
            let mut fields = line.split_whitespace();
            let target = fields.nth(1);
            let fstype = fields.next();
            target == Some("/sys/fs/bpf") && fstype == Some("bpf")
        });
    if mounted {
        eprintln!("==> setup: bpffs mounted at /sys/fs/bpf");
        return Ok(());
    }
    eprintln!("==> setup: mounting bpffs at /sys/fs/bpf");
    if !Path::new("/sys/fs/bpf").is_dir() {
        bail!("/sys/fs/bpf does not exist: is sysfs mounted?");
    }
    run_quiet(
        Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]),
        "mount -t bpf bpf /sys/fs/bpf (needs root)",
    )
}

/// Runs a command, showing its output only when it fails.
fn run_quiet(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {what}"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
