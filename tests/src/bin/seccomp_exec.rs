//! `socklb-seccomp-exec PROFILE.json -- PROGRAM [ARGS...]`: runs PROGRAM under the seccomp
//! filter a container runtime compiles from PROFILE for a container with this process's
//! effective capabilities, installed last before exec as runc and crun install it. The tests
//! start it under setpriv with the chart's capabilities, so the filter is the node's.
use std::{collections::HashSet, os::unix::process::CommandExt as _, path::Path, process::Command};

use anyhow::{Context as _, bail};
use caps::CapSet;
use socklb_tests::seccomp::Profile;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [profile, separator, program, rest @ ..] = args.as_slice() else {
        bail!("usage: socklb-seccomp-exec PROFILE.json -- PROGRAM [ARGS...]");
    };
    if separator != "--" {
        bail!("usage: socklb-seccomp-exec PROFILE.json -- PROGRAM [ARGS...]");
    }
    let capabilities: HashSet<String> = caps::read(None, CapSet::Effective)
        .context("reading this process's capabilities")?
        .iter()
        .map(ToString::to_string)
        .collect();
    let filter = Profile::read(Path::new(profile))
        .filter(&capabilities)
        .with_context(|| format!("compiling {profile}"))?;
    filter.load().context("installing the seccomp filter")?;
    let error = Command::new(program).args(rest).exec();
    Err(error).with_context(|| format!("exec {program}"))
}
