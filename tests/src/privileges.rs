//! The privileges the chart gives socklb's containers, read from the chart as Helm renders
//! it (charts/render.sh), never from a copy: the tests run the agent, `socklb inspect` and
//! `socklb cleanup` with exactly those, so that a default `helm install` is what they prove.
use std::{
    collections::HashSet, path::PathBuf, process::Command, str::FromStr as _, sync::OnceLock,
};

use caps::{CapSet, Capability};
use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Container};
use serde::Deserialize as _;

/// What a container of the chart runs with: a user, the capabilities added after dropping
/// ALL, and whether it may gain privileges.
#[derive(Clone, Debug)]
pub struct ContainerPrivileges {
    /// Which container of the chart, for messages.
    pub container: String,
    pub user: i64,
    pub group: i64,
    /// Capability names as the chart writes them (`BPF`, `NET_ADMIN`).
    pub capabilities: Vec<String>,
    pub no_new_privs: bool,
    /// The `seccompProfile.type` the chart sets (`RuntimeDefault`).
    pub seccomp_profile: Option<String>,
    /// The seccomp profile (OCI JSON) the harness installs in its place, if any: a node's
    /// runtime compiles its own default for RuntimeDefault, so a test names the one it means.
    pub seccomp: Option<PathBuf>,
}

/// The agent container's, with the chart's default values.
pub fn chart_agent() -> &'static ContainerPrivileges {
    static AGENT: OnceLock<ContainerPrivileges> = OnceLock::new();
    AGENT.get_or_init(|| {
        let daemonsets = render("{}");
        privileges_of(&daemonsets, "agent")
    })
}

/// The agent container at the strict minimum: `closeSocketsInPods=false`, so only the
/// capabilities it needs to run.
pub fn chart_agent_minimal() -> &'static ContainerPrivileges {
    static AGENT: OnceLock<ContainerPrivileges> = OnceLock::new();
    AGENT.get_or_init(|| {
        let daemonsets = render(r#"{"closeSocketsInPods": false}"#);
        privileges_of(&daemonsets, "agent")
    })
}

/// The cleanup DaemonSet's init container (`socklb cleanup`), as `cleanup.enabled` renders it.
pub fn chart_cleanup() -> &'static ContainerPrivileges {
    static CLEANUP: OnceLock<ContainerPrivileges> = OnceLock::new();
    CLEANUP.get_or_init(|| {
        let daemonsets = render(r#"{"agent": {"enabled": false}, "cleanup": {"enabled": true}}"#);
        privileges_of(&daemonsets, "cleanup")
    })
}

impl ContainerPrivileges {
    /// `program` as the container runtime starts it: uid and gid 0, no supplementary groups,
    /// and the container's capabilities as its bounding, inheritable and ambient sets (root
    /// then gets exactly those as permitted and effective), `no_new_privs` if the chart
    /// forbids privilege escalation, and the seccomp filter of [`Self::seccomp`] installed
    /// last, just before `program` runs.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let set: String = std::iter::once("-all".to_owned())
            .chain(
                self.capabilities
                    .iter()
                    .map(|c| format!("+{}", c.to_lowercase())),
            )
            .collect::<Vec<_>>()
            .join(",");
        let mut command = Command::new("setpriv");
        command.args([
            format!("--reuid={}", self.user),
            format!("--regid={}", self.group),
            "--clear-groups".to_owned(),
            format!("--inh-caps={set}"),
            format!("--ambient-caps={set}"),
            format!("--bounding-set={set}"),
        ]);
        if self.no_new_privs {
            command.arg("--no-new-privs");
        }
        command.arg("--");
        if let Some(profile) = &self.seccomp {
            command
                .arg(crate::agent::target_bin(
                    "socklb-seccomp-exec",
                    "SOCKLB_SECCOMP_EXEC_BIN",
                ))
                .arg(profile)
                .arg("--");
        }
        command.arg(program);
        command
    }

    /// The same container under the seccomp profile at `profile`.
    pub fn with_seccomp(&self, profile: &std::path::Path) -> Self {
        Self {
            seccomp: Some(profile.to_owned()),
            ..self.clone()
        }
    }

    /// The same container with one capability fewer, to prove that the agent needs it.
    pub fn without(&self, capability: &str) -> Self {
        Self {
            capabilities: self
                .capabilities
                .iter()
                .filter(|c| *c != capability)
                .cloned()
                .collect(),
            ..self.clone()
        }
    }

    /// The same container with one capability more (a value of `capabilities` an operator
    /// may choose).
    pub fn with(&self, capability: &str) -> Self {
        let mut more = self.clone();
        if !more.capabilities.iter().any(|c| c == capability) {
            more.capabilities.push(capability.to_owned());
        }
        more
    }

    /// Runs `f` on this thread with exactly the container's capabilities effective (a
    /// thread's capabilities are its own), e.g. to load the datapath in a test's process as
    /// the agent would; the full set is restored afterwards.
    pub fn within<T>(&self, f: impl FnOnce() -> T) -> T {
        let wanted: HashSet<Capability> = self
            .capabilities
            .iter()
            .map(|name| {
                Capability::from_str(&format!("CAP_{name}"))
                    .unwrap_or_else(|e| panic!("capability {name} of the chart: {e}"))
            })
            .collect();
        let before = caps::read(None, CapSet::Effective).expect("read effective capabilities");
        caps::set(None, CapSet::Effective, &wanted)
            .unwrap_or_else(|e| panic!("lower this thread to {:?}: {e}", self.capabilities));
        struct Restore(HashSet<Capability>);
        impl Drop for Restore {
            fn drop(&mut self) {
                caps::set(None, CapSet::Effective, &self.0).expect("restore capabilities");
            }
        }
        let _restore = Restore(before);
        f()
    }
}

/// The DaemonSets of the chart rendered with `values` (JSON) over its defaults.
fn render(values: &str) -> Vec<DaemonSet> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../charts/render.sh");
    let output = Command::new("bash")
        .arg(&script)
        .arg(values)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "rendering the chart failed (charts/render.sh needs python3 with pip and PyPI on the \
         first run):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let manifest = String::from_utf8_lossy(&output.stdout);
    serde_norway::Deserializer::from_str(&manifest)
        .filter_map(|document| {
            let value = serde_norway::Value::deserialize(document).expect("rendered YAML");
            (value.get("kind").and_then(serde_norway::Value::as_str) == Some("DaemonSet")).then(
                || serde_norway::from_value(value).expect("a DaemonSet of the rendered chart"),
            )
        })
        .collect()
}

fn privileges_of(daemonsets: &[DaemonSet], name: &str) -> ContainerPrivileges {
    let container: &Container = daemonsets
        .iter()
        .filter_map(|d| d.spec.as_ref()?.template.spec.as_ref())
        .flat_map(|pod| {
            pod.containers
                .iter()
                .chain(pod.init_containers.iter().flatten())
        })
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("the rendered chart has no container {name}"));
    let security = container
        .security_context
        .as_ref()
        .unwrap_or_else(|| panic!("container {name} has no securityContext"));
    assert_ne!(
        security.privileged,
        Some(true),
        "the chart's default runs {name} privileged"
    );
    let capabilities = security.capabilities.as_ref();
    assert_eq!(
        capabilities.and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_owned()]),
        "container {name} must drop ALL capabilities"
    );
    ContainerPrivileges {
        container: name.to_owned(),
        user: security.run_as_user.unwrap_or(0),
        group: security.run_as_group.unwrap_or(0),
        capabilities: capabilities.and_then(|c| c.add.clone()).unwrap_or_default(),
        no_new_privs: security.allow_privilege_escalation == Some(false),
        seccomp_profile: security
            .seccomp_profile
            .as_ref()
            .map(|profile| profile.type_.clone()),
        seccomp: None,
    }
}
