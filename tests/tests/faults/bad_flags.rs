//! Operator mistakes in `socklb run`'s flags: each stops the agent at start with an error
//! that names the flag, before anything is created (no pin directory, no maps, no program
//! attached), instead of the kernel's bare error after 27 maps were pinned, or a busy loop.
use std::time::Duration;

use socklb_tests::{
    FREE_PORTS, ManifestDir, Sandbox, agent_bin, privileges::chart_agent_minimal, run_to_exit,
};

/// Runs the agent as the chart does with `flags` (the sandbox's pins and, unless `flags`
/// give their own, its cgroup and `manifests`) and returns whether it succeeded and its
/// stderr; killed if it is still running after 20 s.
fn start_with(sandbox: &Sandbox, manifests: &ManifestDir, flags: &[&str]) -> (bool, String) {
    let mut command = chart_agent_minimal().command(agent_bin());
    command
        .args([
            "run",
            "--source",
            "file",
            "--node-name",
            "node-a",
            "--bpffs",
        ])
        .arg(&sandbox.pin_dir);
    if !flags.contains(&"--manifests") {
        command.arg("--manifests").arg(&manifests.path);
    }
    if !flags.contains(&"--cgroup-path") {
        command.arg("--cgroup-path").arg(&sandbox.cgroup);
    }
    run_to_exit(
        command.args(FREE_PORTS).args(flags),
        Duration::from_secs(20),
    )
}

#[test]
fn each_bad_flag_stops_the_start_naming_the_flag_and_creates_nothing() {
    let sandbox = Sandbox::new("bad-flags");
    let manifests = ManifestDir::node_a(&sandbox, 50);
    let missing = manifests.path.join("missing");
    let missing = missing.to_str().expect("a UTF-8 path");
    // (flags, the flag the error must name)
    let rows: &[(&[&str], &str)] = &[
        (&["--manifests", missing], "--manifests"),
        (&["--devices", "socklb-nope0"], "--devices"),
        (&["--sync-period", "0s"], "--sync-period"),
        (&["--max-service-entries", "0"], "--max-service-entries"),
        (&["--max-backends", "4294967295"], "--max-backends"),
        (&["--max-conntrack-entries", "0"], "--max-conntrack-entries"),
        (
            &["--max-conntrack-entries", "268435456"],
            "--max-conntrack-entries",
        ),
        (&["--max-reverse-entries", "0"], "--max-reverse-entries"),
        (
            &["--conntrack-tcp-timeout-close", "0s"],
            "--conntrack-tcp-timeout-close",
        ),
        (&["--cgroup-path", missing], "--cgroup-path"),
    ];
    for (flags, flag) in rows {
        let (started, stderr) = start_with(&sandbox, &manifests, flags);
        assert!(!started, "{flags:?}: the agent ran:\n{stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains("nothing was started"),
            "{flags:?}: the error names {flag}:\n{stderr}"
        );
        assert!(
            !sandbox.pin_dir.exists(),
            "{flags:?}: the pin directory {} was created",
            sandbox.pin_dir.display()
        );
    }
}

/// The Kubernetes source with no API to reach (no in-cluster config, no kubeconfig): the
/// start fails before the pin directory is made, not after the maps were pinned.
#[test]
fn a_kube_source_without_config_stops_the_start_and_creates_nothing() {
    let sandbox = Sandbox::new("no-kube");
    let mut command = chart_agent_minimal().command(agent_bin());
    command
        .args(["run", "--node-name", "node-a", "--bpffs"])
        .arg(&sandbox.pin_dir)
        .arg("--cgroup-path")
        .arg(&sandbox.cgroup)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        // No default kubeconfig either (~/.kube/config).
        .env("HOME", "/nonexistent/socklb-home");
    let (started, stderr) = run_to_exit(command.args(FREE_PORTS), Duration::from_secs(20));
    assert!(!started, "the agent ran:\n{stderr}");
    assert!(
        stderr.contains("no Kubernetes API to connect to"),
        "the error says what is missing:\n{stderr}"
    );
    assert!(
        !sandbox.pin_dir.exists(),
        "the pin directory {} was created:\n{stderr}",
        sandbox.pin_dir.display()
    );
}
