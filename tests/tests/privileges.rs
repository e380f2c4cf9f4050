//! Least privilege: the agent runs with exactly the capabilities the chart renders (every
//! other test starts it that way), and each of them is needed: without it the kernel
//! refuses, and the agent says which capability and which chart value grants it.
use std::process::Command;

use socklb_agent::dataplane::NEEDED_CAPABILITIES;
use socklb_tests::{
    ManifestDir, Sandbox, agent_bin, node_yaml,
    privileges::{ContainerPrivileges, chart_agent},
    service_yaml, slice_yaml,
};

#[test]
fn the_chart_grants_exactly_the_capabilities_the_agent_needs() {
    let needed: Vec<&str> = NEEDED_CAPABILITIES.iter().map(|n| n.short_name).collect();
    assert_eq!(
        chart_agent().capabilities,
        needed,
        "the chart's `capabilities` value and the agent's list of needed capabilities differ"
    );
}

#[test]
fn without_each_capability_the_kernel_refuses_and_the_agent_names_it() {
    for capability in &chart_agent().capabilities {
        let sandbox = Sandbox::new(&format!("no-{}", capability.to_lowercase()));
        let manifests = ManifestDir::new(&sandbox);
        manifests.write("node.yaml", &node_yaml("node-a", "z1", "10.0.0.1"));
        manifests.write("web.yaml", &service_yaml("web", "10.96.0.10", 80, ""));
        manifests.write(
            "web-slice.yaml",
            &slice_yaml(
                "web",
                "web",
                8080,
                &[("10.0.1.1", "node-a", "z1", "")],
                false,
            ),
        );
        let output = run_agent(&chart_agent().without(capability), &sandbox, &manifests);
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
            !sandbox.pin_dir.join("links").exists(),
            "nothing may be attached without {capability}"
        );
    }
}

fn run_agent(
    privileges: &ContainerPrivileges,
    sandbox: &Sandbox,
    manifests: &ManifestDir,
) -> std::process::Output {
    let mut command: Command = privileges.command(agent_bin());
    command
        .args([
            "run",
            "--source",
            "file",
            "--node-name",
            "node-a",
            "--manifests",
        ])
        .arg(&manifests.path)
        .arg("--bpffs")
        .arg(&sandbox.pin_dir)
        .arg("--cgroup-path")
        .arg(&sandbox.cgroup)
        .args([
            "--healthz-bind-address",
            "127.0.0.1:0",
            "--metrics-bind-address",
            "127.0.0.1:0",
        ])
        .output()
        .expect("prerequisite missing: setpriv (util-linux)")
}
