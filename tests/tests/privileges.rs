//! Least privilege: the agent runs with exactly the capabilities the chart renders (every
//! other test starts it that way), and each of them is needed: without it the kernel
//! refuses, and the agent says which capability and which chart value grants it. Under a
//! container runtime's default seccomp profile it starts, serves, restarts, is inspected and
//! cleaned up; under one that still gates bpf(2) on CAP_SYS_ADMIN it names the filter.
//! Without CAP_PERFMON or CAP_SYS_ADMIN it says that the verifier hardened its programs.
use std::{
    net::{SocketAddr, SocketAddrV4},
    path::PathBuf,
};

use aya::programs::links::{FdLink, PinnedLink};
use socklb_abi::program_names::CONNECT4;
use socklb_agent::dataplane::{self, FEATURE_CAPABILITIES, NEEDED_CAPABILITIES};
use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox, agent_bin, bpftool, node_yaml,
    privileges::{ContainerPrivileges, chart_agent, chart_agent_minimal, chart_cleanup},
    seccomp::{CONTAINERS_COMMON, Profile},
    service_yaml, slice_yaml,
};

#[test]
fn the_chart_grants_exactly_the_capabilities_the_agent_needs() {
    let needed: Vec<&str> = NEEDED_CAPABILITIES.iter().map(|n| n.short_name).collect();
    assert_eq!(
        chart_agent_minimal().capabilities,
        needed,
        "the chart's `capabilities` value and the agent's list of needed capabilities differ"
    );
    let with_features: Vec<&str> = needed
        .iter()
        .copied()
        .chain(FEATURE_CAPABILITIES.iter().map(|f| f.short_name))
        .collect();
    assert_eq!(
        chart_agent().capabilities,
        with_features,
        "the chart's defaults should grant what the agent needs and what its default features \
         need, nothing more"
    );
}

#[test]
fn without_each_capability_the_kernel_refuses_and_the_agent_names_it() {
    for capability in &chart_agent_minimal().capabilities {
        let sandbox = Sandbox::new(&format!("no-{}", capability.to_lowercase()));
        let manifests = web_manifests(&sandbox, "10.0.1.1");
        let output = run_agent(
            &chart_agent_minimal().without(capability),
            &sandbox,
            &manifests,
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "started without {capability}");
        let error = stderr
            .lines()
            .find(|line| line.starts_with("error: "))
            .unwrap_or_else(|| panic!("no error line without {capability}:\n{stderr}"));
        assert!(
            error.starts_with(&format!(
                "error: the kernel refused this without CAP_{capability}:"
            )) && error.contains(&format!(
                "the Helm value `capabilities` must include {capability}"
            )) && error.contains("Operation not permitted"),
            "without {capability}, the first words name it, the chart value, then the \
             kernel's refusal:\n{error}"
        );
        assert!(
            !sandbox.pin_dir.exists(),
            "a failed start without {capability} left pins behind: {:?}",
            std::fs::read_dir(&sandbox.pin_dir)
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
    }
}

/// containerd (>= 1.7) and Docker (>= 23) allow bpf(2) with CAP_BPF in their default
/// profiles; CRI-O's and podman's (containers-common) still ask for CAP_SYS_ADMIN. The
/// containerd profile is containers-common's with that one rule, which is also how the
/// chart's README tells CRI-O users to write a Localhost profile.
#[test]
fn under_the_runtime_default_seccomp_profile_the_agent_serves_restarts_and_cleans_up() {
    assert_eq!(
        chart_agent().seccomp_profile.as_deref(),
        Some("RuntimeDefault"),
        "the chart's default seccomp profile is the one this test stands for"
    );
    let sandbox = Sandbox::new("seccomp-default");
    let profile = TempFile::new(&sandbox, "seccomp.json");
    Profile::read(CONTAINERS_COMMON.as_ref())
        .allowing_bpf_with_cap_bpf()
        .write(&profile.0);
    let agent_privileges = chart_agent_minimal().with_seccomp(&profile.0);
    let backend: SocketAddrV4 = "127.0.31.1:8080".parse().expect("address");
    let _server = NamedServer::tcp("b1", backend);
    let manifests = web_manifests(&sandbox, &backend.ip().to_string());
    let vip: SocketAddr = "10.96.0.10:80".parse().expect("address");

    for run in ["first", "restarted"] {
        let agent = Agent::start_as(&agent_privileges, &sandbox, &manifests.path, "node-a", &[]);
        assert_eq!(
            seccomp_mode(agent.pid()),
            "2",
            "the {run} agent is not under the seccomp filter"
        );
        let attempts = sandbox.probe("tcp", vip, 5);
        assert!(
            attempts.iter().all(|a| a.reply.as_deref() == Some("b1")),
            "the {run} agent under seccomp did not translate: {attempts:?}"
        );
        agent.stop();
    }

    // Panics unless inspect succeeds under the filter.
    let inspected = sandbox.inspect_as(&agent_privileges);
    assert!(
        inspected.get("frontends").is_some(),
        "inspect under seccomp: {inspected}"
    );
    let cleanup = chart_cleanup()
        .with_seccomp(&profile.0)
        .command(agent_bin())
        .args(["cleanup", "--bpffs"])
        .arg(&sandbox.pin_dir)
        .output()
        .expect("run socklb cleanup");
    assert!(
        cleanup.status.success() && !sandbox.pin_dir.exists(),
        "cleanup under seccomp: {}",
        String::from_utf8_lossy(&cleanup.stderr)
    );
}

#[test]
fn a_seccomp_profile_that_gates_bpf_on_sys_admin_is_named_as_the_cause() {
    let sandbox = Sandbox::new("seccomp-sys-admin");
    let manifests = web_manifests(&sandbox, "10.0.1.1");
    let shipped: PathBuf = CONTAINERS_COMMON.into();
    let output = run_agent(
        &chart_agent_minimal().with_seccomp(&shipped),
        &sandbox,
        &manifests,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "started although bpf(2) is filtered"
    );
    let error = stderr
        .lines()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line under the filter:\n{stderr}"));
    assert!(
        error.starts_with(
            "error: bpf(2) was refused although CAP_BPF is effective: this process runs under a \
             seccomp filter"
        ) && error.contains("seccompProfile")
            && error.contains("Operation not permitted"),
        "the error names the seccomp filter and the chart value first:\n{error}"
    );
    sandbox.assert_no_pins("the failed start left pins behind");
}

/// Without CAP_PERFMON or CAP_SYS_ADMIN the verifier hardens the programs against Spectre,
/// which every packet pays for: the agent says so at start under the minimal set
/// (`closeSocketsInPods=false`), and neither the chart's defaults nor the minimal set with
/// PERFMON added (what the docs advise) leave a speculation barrier in the programs.
#[test]
fn the_agent_says_when_the_verifier_hardens_its_programs() {
    let sandbox = Sandbox::new("spectre-hardening");
    let manifests = web_manifests(&sandbox, "127.0.32.1");
    for (privileges, hardened) in [
        (chart_agent_minimal().clone(), true),
        (chart_agent_minimal().with("PERFMON"), false),
        (chart_agent().clone(), false),
    ] {
        let agent = Agent::start_as(&privileges, &sandbox, &manifests.path, "node-a", &[]);
        let link = PinnedLink::from_pin(dataplane::link_pin(&sandbox.pin_dir, CONNECT4))
            .expect("open the pinned connect4 link");
        let id = FdLink::from(link)
            .info()
            .expect("the link's info")
            .program_id();
        let barriers = bpftool(&["prog", "dump", "xlated", "id", &id.to_string()])
            .matches("nospec")
            .count();
        let said = agent.log().contains("the verifier hardened the programs");
        assert_eq!(
            (barriers > 0, said),
            (hardened, hardened),
            "with {:?}: {barriers} speculation barriers in connect4, the agent said so: {said}\n{}",
            privileges.capabilities,
            agent.log()
        );
        agent.stop();
    }
}

/// The manifests of one Service, web (10.96.0.10:80), with one endpoint on node-a.
fn web_manifests(sandbox: &Sandbox, endpoint: &str) -> ManifestDir {
    let manifests = ManifestDir::new(sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "z1", "10.0.0.1"));
    manifests.write("web.yaml", &service_yaml("web", "10.96.0.10", 80, ""));
    manifests.write(
        "web-slice.yaml",
        &slice_yaml("web", "web", 8080, &[(endpoint, "node-a", "z1", "")], false),
    );
    manifests
}

/// The `Seccomp:` mode of a process (2: a filter is installed).
fn seccomp_mode(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("Seccomp:"))
        .map(|mode| mode.trim().to_owned())
        .expect("a Seccomp line")
}

/// A scratch file of one test, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(sandbox: &Sandbox, name: &str) -> Self {
        Self(std::env::temp_dir().join(format!("{}-{name}", sandbox.name)))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run_agent(
    privileges: &ContainerPrivileges,
    sandbox: &Sandbox,
    manifests: &ManifestDir,
) -> std::process::Output {
    sandbox
        .agent_command(privileges, &manifests.path)
        .args([
            "--healthz-bind-address",
            "127.0.0.1:0",
            "--metrics-bind-address",
            "127.0.0.1:0",
        ])
        .output()
        .expect("prerequisite missing: setpriv (util-linux)")
}
