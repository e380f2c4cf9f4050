//! `cargo xtask image`: the container image, built offline with podman (vfs storage, no
//! daemon): a static musl build of the agent in a FROM scratch image.
use std::{
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
const PODMAN: [&str; 2] = ["podman", "--storage-driver=vfs"];

/// Builds the image as `name` and returns the `socklb version` the binary inside prints.
pub fn build(name: &str) -> anyhow::Result<String> {
    super::step(
        "build the static agent",
        &[
            "build",
            "--quiet",
            "--release",
            "--package",
            "socklb-agent",
            "--bin",
            "socklb",
            "--target",
            MUSL_TARGET,
        ],
    )?;
    let context = Path::new("target/image");
    std::fs::create_dir_all(context).context("creating target/image")?;
    let binary = format!("target/{MUSL_TARGET}/release/socklb");
    std::fs::copy(&binary, context.join("socklb"))
        .with_context(|| format!("copying {binary} into the build context"))?;
    eprintln!("==> image: podman build -t {name}");
    podman(
        &["build", "--quiet", "--tag", name, "--file", "Containerfile"],
        Some(context),
    )?;
    version_inside(name)
}

/// Runs the image's binary without a container runtime: mounts the image and executes it.
fn version_inside(name: &str) -> anyhow::Result<String> {
    let mount = podman(&["image", "mount", name], None)?;
    let output = Command::new(Path::new(mount.trim()).join("socklb"))
        .arg("version")
        .output();
    podman(&["image", "unmount", name], None)?;
    let output = output.context("running socklb from the image")?;
    if !output.status.success() {
        bail!(
            "socklb version in the image failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Removes the image (tests leave nothing behind).
pub fn remove(name: &str) -> anyhow::Result<()> {
    podman(&["rmi", name], None).map(drop)
}

fn podman(args: &[&str], context: Option<&Path>) -> anyhow::Result<String> {
    let mut command = Command::new(PODMAN[0]);
    command.arg(PODMAN[1]).args(args);
    if let Some(context) = context {
        command.arg(context);
    }
    let output = command
        .stdin(Stdio::null())
        .output()
        .context("running podman (`cargo xtask setup` installs it)")?;
    if !output.status.success() {
        bail!(
            "podman {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
