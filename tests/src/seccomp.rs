//! Container runtimes' seccomp profiles (the OCI JSON format of `seccompProfile`), compiled
//! with libseccomp the way runc and crun compile them, so that a test can run the agent under
//! exactly the filter a node would give the chart's container.
//!
//! A profile's rules can depend on the container's capabilities (`includes.caps`,
//! `excludes.caps`): the filter is built for a given set, as the runtime builds it for the
//! container's.
use std::{collections::HashSet, path::Path};

use anyhow::{Context as _, bail};
use libseccomp::{
    ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall,
};
use serde::{Deserialize, Serialize};

/// CRI-O's and podman's default profile (RuntimeDefault there), from containers-common.
pub const CONTAINERS_COMMON: &str = "/usr/share/containers/seccomp.json";

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    pub default_action: String,
    pub default_errno_ret: Option<u32>,
    pub syscalls: Vec<Rule>,
}

/// Profiles write absent lists as `null` as often as they leave them out.
fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub names: Vec<String>,
    pub action: String,
    #[serde(default)]
    pub errno_ret: Option<u32>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub args: Vec<Arg>,
    #[serde(default)]
    pub includes: Condition,
    #[serde(default)]
    pub excludes: Condition,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Arg {
    pub index: u32,
    pub value: u64,
    #[serde(default)]
    pub value_two: u64,
    pub op: String,
}

/// When a rule applies: every listed capability held (or, in `excludes`, none), on one of
/// the listed architectures (Go's names: `amd64`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub caps: Vec<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub arches: Vec<String>,
}

/// This machine's architecture as profiles name it.
const ARCH: &str = "amd64";

impl Profile {
    pub fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
            panic!(
                "prerequisite missing: the seccomp profile {} ({e}); `./x setup` installs it",
                path.display()
            )
        });
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Writes the profile where a runtime (or `socklb-seccomp-exec`) reads it.
    pub fn write(&self, path: &Path) {
        let text = serde_json::to_string_pretty(self).expect("a profile serializes");
        std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// The filter a runtime installs for a container holding `capabilities` (names such as
    /// `CAP_BPF`). Names this libseccomp does not know are skipped, as runtimes skip them.
    pub fn filter(&self, capabilities: &HashSet<String>) -> anyhow::Result<ScmpFilterContext> {
        let default = action(&self.default_action, self.default_errno_ret)?;
        let mut filter = ScmpFilterContext::new(default)?;
        filter.add_arch(ScmpArch::native())?;
        for rule in self.syscalls.iter().filter(|r| r.applies(capabilities)) {
            let rule_action = action(&rule.action, rule.errno_ret)?;
            // libseccomp refuses a rule that repeats the default action; it changes nothing.
            if rule_action == default {
                continue;
            }
            let conditions = rule
                .args
                .iter()
                .map(Arg::compare)
                .collect::<Result<Vec<_>, _>>()?;
            for name in &rule.names {
                let Ok(syscall) = ScmpSyscall::from_name(name) else {
                    continue;
                };
                filter
                    .add_rule_conditional(rule_action, syscall, &conditions)
                    .with_context(|| format!("rule {} for {name}", rule.action))?;
            }
        }
        Ok(filter)
    }
}

impl Rule {
    fn applies(&self, capabilities: &HashSet<String>) -> bool {
        let arch_ok = |arches: &[String]| arches.iter().any(|a| a == ARCH);
        self.includes.caps.iter().all(|c| capabilities.contains(c))
            && (self.includes.arches.is_empty() || arch_ok(&self.includes.arches))
            && !self.excludes.caps.iter().any(|c| capabilities.contains(c))
            && !arch_ok(&self.excludes.arches)
    }
}

impl Arg {
    fn compare(&self) -> anyhow::Result<ScmpArgCompare> {
        let op = match self.op.as_str() {
            "SCMP_CMP_NE" => ScmpCompareOp::NotEqual,
            "SCMP_CMP_LT" => ScmpCompareOp::Less,
            "SCMP_CMP_LE" => ScmpCompareOp::LessOrEqual,
            "SCMP_CMP_EQ" => ScmpCompareOp::Equal,
            "SCMP_CMP_GE" => ScmpCompareOp::GreaterEqual,
            "SCMP_CMP_GT" => ScmpCompareOp::Greater,
            // The OCI format puts the mask in `value` and the expected value in `valueTwo`.
            "SCMP_CMP_MASKED_EQ" => {
                return Ok(ScmpArgCompare::new(
                    self.index,
                    ScmpCompareOp::MaskedEqual(self.value),
                    self.value_two,
                ));
            }
            other => bail!("unknown comparison {other}"),
        };
        Ok(ScmpArgCompare::new(self.index, op, self.value))
    }
}

/// An OCI action; an errno action without `errnoRet` returns EPERM, as runc's does.
fn action(name: &str, errno: Option<u32>) -> anyhow::Result<ScmpAction> {
    Ok(match name {
        "SCMP_ACT_ALLOW" => ScmpAction::Allow,
        "SCMP_ACT_ERRNO" => ScmpAction::Errno(errno.map_or(libc::EPERM, |e| e as i32)),
        "SCMP_ACT_KILL" | "SCMP_ACT_KILL_THREAD" => ScmpAction::KillThread,
        "SCMP_ACT_KILL_PROCESS" => ScmpAction::KillProcess,
        "SCMP_ACT_TRAP" => ScmpAction::Trap,
        "SCMP_ACT_LOG" => ScmpAction::Log,
        other => bail!("unsupported action {other}"),
    })
}

impl Profile {
    /// This profile with the rule containerd (>= 1.7) and Docker (>= 23) added to their
    /// defaults: bpf(2) is allowed to a container that holds CAP_BPF, not only CAP_SYS_ADMIN.
    /// The same edit as the chart README's recipe for a Localhost profile: `bpf` leaves every
    /// refusing rule, and one rule allows it with CAP_BPF.
    pub fn allowing_bpf_with_cap_bpf(mut self) -> Self {
        for rule in &mut self.syscalls {
            if rule.action != "SCMP_ACT_ALLOW" {
                rule.names.retain(|n| n != "bpf");
            }
        }
        self.syscalls.push(Rule {
            names: vec!["bpf".to_owned()],
            action: "SCMP_ACT_ALLOW".to_owned(),
            errno_ret: None,
            args: Vec::new(),
            includes: Condition {
                caps: vec!["CAP_BPF".to_owned()],
                arches: Vec::new(),
            },
            excludes: Condition::default(),
        });
        self
    }
}
