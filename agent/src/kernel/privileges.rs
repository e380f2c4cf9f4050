//! The privileges the agent needs, and what to say when the kernel refuses an operation
//! for lack of one.
//!
//! The agent does not gate itself on a capability list: it lets the kernel decide, and
//! explains a refusal (EPERM, or the verifier's EACCES) by what the calling thread lacks.
//! So a capability is only ever asked for because the kernel refused without it, and the
//! tests that drop each one prove that it is needed.
use std::{error::Error, fs, io};

use caps::{CapSet, Capability};

/// A capability the agent needs, with the operations that need it.
pub struct Needed {
    pub capability: Capability,
    /// Its name in a container's securityContext (and in the Helm value `capabilities`).
    pub short_name: &'static str,
    pub needed_for: &'static str,
}

/// Every capability the agent needs; the chart's default `capabilities` value is exactly
/// this list.
pub const NEEDED: [Needed; 2] = [
    Needed {
        capability: Capability::CAP_BPF,
        short_name: "BPF",
        needed_for: "bpf(2): creating, pinning and opening the maps, loading the programs",
    },
    Needed {
        capability: Capability::CAP_NET_ADMIN,
        short_name: "NET_ADMIN",
        needed_for: "loading and attaching the cgroup socket-address and TC programs",
    },
];

/// A capability an optional feature needs: without it the agent runs, and the feature does
/// less (it says so when it starts).
pub struct ForFeature {
    pub capability: Capability,
    pub short_name: &'static str,
    pub feature: &'static str,
    /// The chart value that grants it (on by default).
    pub chart_value: &'static str,
}

/// Capabilities the chart grants by default for a feature, after [`NEEDED`].
pub const FOR_FEATURES: [ForFeature; 1] = [ForFeature {
    capability: Capability::CAP_SYS_ADMIN,
    short_name: "SYS_ADMIN",
    feature: "setns(2) into pods' network namespaces, to close the sockets of removed backends \
              and to tell pods' namespaces from nested ones (--socket-lb-scope pods)",
    chart_value: "closeSocketsInPods",
}];

/// Whether the verifier will harden the programs this thread loads against Spectre: it does
/// for a loader with neither CAP_PERFMON nor CAP_SYS_ADMIN (`bpf_bypass_spec_v1`), masking
/// pointer arithmetic and adding speculation barriers that every packet then runs.
pub fn verifier_hardens() -> bool {
    let has = |cap| caps::has_cap(None, CapSet::Effective, cap).unwrap_or(false);
    !has(Capability::CAP_PERFMON) && !has(Capability::CAP_SYS_ADMIN)
}

/// Why the kernel refused, in terms an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error(
        "the kernel refused this without {missing}: socklb needs {needed}; grant it (the Helm \
         value `capabilities` must include {short_names}) or set privileged=true"
    )]
    Missing {
        missing: String,
        needed: String,
        short_names: String,
    },
    #[error(
        "the kernel refused a program without CAP_PERFMON (the verifier's Spectre hardening \
         for loaders without it): this is a bug in socklb's programs, please report it; \
         meanwhile add PERFMON to the Helm value `capabilities` or set privileged=true"
    )]
    Perfmon,
    #[error(
        "bpf(2) was refused although CAP_BPF is effective: this process runs under a seccomp \
         filter that blocks it (the RuntimeDefault profiles of CRI-O and of older containerd \
         releases allow bpf(2) only with CAP_SYS_ADMIN); set the Helm value \
         seccompProfile.type=Unconfined, or a Localhost profile that allows bpf (see the \
         chart's README), or privileged=true"
    )]
    Seccomp,
}

/// Explains `error` if the kernel refused it for lack of privileges; `None` otherwise.
pub fn diagnose(error: &(dyn Error + 'static)) -> Option<PrivilegeError> {
    let refusal = kernel_refusal(error)?;
    let effective = caps::read(None, CapSet::Effective).ok()?;
    let missing: Vec<&Needed> = NEEDED
        .iter()
        .filter(|needed| !effective.contains(&needed.capability))
        .collect();
    if !missing.is_empty() {
        let join = |f: fn(&Needed) -> String| {
            missing
                .iter()
                .map(|n| f(n))
                .collect::<Vec<_>>()
                .join(" and ")
        };
        return Some(PrivilegeError::Missing {
            missing: join(|n| n.capability.to_string()),
            needed: join(|n| format!("{} for {}", n.capability, n.needed_for)),
            short_names: join(|n| n.short_name.to_owned()),
        });
    }
    match refusal {
        Refusal::Verifier
            if !effective.contains(&Capability::CAP_PERFMON)
                && !effective.contains(&Capability::CAP_SYS_ADMIN) =>
        {
            Some(PrivilegeError::Perfmon)
        }
        Refusal::NotPermitted if under_seccomp_filter() => Some(PrivilegeError::Seccomp),
        _ => None,
    }
}

/// How the kernel said no.
enum Refusal {
    /// EPERM: a capability check (or a seccomp filter) failed.
    NotPermitted,
    /// EACCES: the verifier refused what it refuses only to loaders without CAP_PERFMON.
    Verifier,
}

/// The first refusal in the error's chain of sources.
fn kernel_refusal(error: &(dyn Error + 'static)) -> Option<Refusal> {
    let mut next = Some(error);
    while let Some(error) = next {
        match error
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            Some(libc::EPERM) => return Some(Refusal::NotPermitted),
            Some(libc::EACCES) => return Some(Refusal::Verifier),
            _ => next = error.source(),
        }
    }
    None
}

/// Whether the kernel refused `error` with EPERM, anywhere in its chain of sources.
pub(super) fn not_permitted(error: &(dyn Error + 'static)) -> bool {
    matches!(kernel_refusal(error), Some(Refusal::NotPermitted))
}

/// Whether a seccomp filter is installed on this thread (`Seccomp: 2`).
fn under_seccomp_filter() -> bool {
    fs::read_to_string("/proc/thread-self/status").is_ok_and(|status| {
        status.lines().any(|line| {
            line.split_once(':')
                .is_some_and(|(k, v)| k == "Seccomp" && v.trim() == "2")
        })
    })
}
