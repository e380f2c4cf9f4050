//! Loading kube-proxy's rules the way kube-proxy does (one iptables-restore or nft -f per
//! sync), timed, and removing them.
use std::{
    fs::{self, File},
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::netns::{in_netns, run_in};

/// Which iptables kube-proxy's iptables mode drives: x_tables or nf_tables.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum IptablesBackend {
    Legacy,
    Nft,
}

impl IptablesBackend {
    /// The value of a `--iptables` flag.
    pub fn parse(value: &str) -> anyhow::Result<Self> {
        match value {
            "legacy" => Ok(Self::Legacy),
            "nft" => Ok(Self::Nft),
            _ => bail!("--iptables legacy|nft, not {value}"),
        }
    }

    pub fn restore(self) -> &'static str {
        match self {
            Self::Legacy => "iptables-legacy-restore",
            Self::Nft => "iptables-nft-restore",
        }
    }

    pub fn command(self) -> &'static str {
        match self {
            Self::Legacy => "iptables-legacy",
            Self::Nft => "iptables-nft",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Legacy => "legacy (x_tables)",
            Self::Nft => "nf_tables (iptables-nft)",
        }
    }
}

/// Runs a rule loader (`iptables-restore`, `nft -f -`) in `netns` on `input`; returns how
/// long it took (process start to exit, as kube-proxy pays it), or None if it was still
/// running after `limit` and was killed (both loaders apply all or nothing).
pub fn load_rules(
    netns: &File,
    scratch: &Path,
    program: &str,
    args: &[&str],
    input: &str,
    limit: Duration,
) -> anyhow::Result<Option<Duration>> {
    let file = scratch.join("rules.txt");
    fs::write(&file, input).with_context(|| format!("write {}", file.display()))?;
    let stdin = File::open(&file).with_context(|| format!("open {}", file.display()))?;
    let errors = scratch.join("errors.txt");
    let stderr = File::create(&errors).with_context(|| format!("create {}", errors.display()))?;
    let started = Instant::now();
    let mut child = in_netns(netns, program)
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .with_context(|| {
            format!(
                "cannot run {program}: install it (`cargo xtask setup` installs iptables and \
                 nftables)"
            )
        })?;
    let status = loop {
        if let Some(status) = child.try_wait().context("wait for the rule loader")? {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("{program}: still loading after {limit:?}, stopped (--load-limit)");
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = started.elapsed();
    if !status.success() {
        let kept = std::env::temp_dir().join("slbcmp-failed-rules.txt");
        let _ = fs::copy(&file, &kept);
        bail!(
            "{program} {} failed ({status}): {}\nits input is kept in {}",
            args.join(" "),
            fs::read_to_string(&errors).unwrap_or_default().trim(),
            kept.display()
        );
    }
    Ok(Some(took))
}

/// Removes the kube-proxy rules from a namespace before it is dropped, so that the kernel
/// frees them now rather than in the background while the next step is measured.
pub fn flush_rules(netns: &File, backend: IptablesBackend) {
    let iptables = backend.command();
    for table in ["nat", "filter"] {
        let _ = run_in(netns, iptables, &["-t", table, "-F"]);
        let _ = run_in(netns, iptables, &["-t", table, "-X"]);
    }
    let _ = run_in(netns, "nft", &["flush", "ruleset"]);
}
