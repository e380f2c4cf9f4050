//! A Service with more endpoints than a frontend holds (65,535: a slot number is 16 bits).
//! Its change is refused whole: a frontend that had 65,535 keeps exactly those (none left
//! out, none added), the warning gives the right count, and `socklb explain` says the
//! frontend is refused and why instead of listing endpoints as in use.
use std::{collections::BTreeSet, net::Ipv4Addr};

use socklb_tests::{
    Agent, ManifestDir, Sandbox, explain_command, node_yaml, service_yaml, stdout_of,
};

const VIP: &str = "10.96.46.10";

/// One EndpointSlice of `count` endpoints from 10.64.0.0 on (the file source takes any
/// size; the API server's 1,000 per slice would make it many slices of one Service).
fn slice(count: u32) -> String {
    let mut yaml = String::from(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: big-1, namespace: default, labels: {kubernetes.io/service-name: big}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
",
    );
    for i in 0..count {
        yaml.push_str(&format!(
            "- addresses: [\"{}\"]\n",
            Ipv4Addr::from(0x0a40_0000 + i)
        ));
    }
    yaml
}

/// The backends programmed for the VIP, as `socklb inspect` reads them from the maps.
fn programmed(sandbox: &Sandbox) -> BTreeSet<String> {
    let frontend = sandbox
        .inspected_frontend(VIP)
        .unwrap_or_else(|| panic!("no frontend {VIP} programmed"));
    frontend["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .map(|b| b["address"].as_str().expect("an address").to_owned())
        .collect()
}

fn explain(manifests: &ManifestDir) -> String {
    stdout_of(explain_command(&manifests.path, "node-a").args(["--service", "default/big"]))
}

#[test]
fn more_endpoints_than_a_frontend_holds_are_refused_whole_and_said_so() {
    let sandbox = Sandbox::new("large-service");
    let manifests = ManifestDir::new(&sandbox);
    manifests.write("node.yaml", &node_yaml("node-a", "zone-a", "192.168.46.1"));
    manifests.write("big.yaml", &service_yaml("big", VIP, 80, ""));
    manifests.write("slice.yaml", &slice(65_535));
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    let before = programmed(&sandbox);
    assert_eq!(before.len(), 65_535, "the limit itself is programmed");

    manifests.write("slice.yaml", &slice(69_999));
    agent.wait_for_log("69999 endpoints, more than the 65535 a frontend holds", 1);
    assert!(
        programmed(&sandbox) == before,
        "the frontend keeps exactly the 65,535 it had"
    );
    let explained = explain(&manifests);
    assert!(
        explained.contains("refused: 69999 endpoints, more than the 65535")
            && !explained.contains("10.64."),
        "explain says the frontend is refused and lists no endpoint:\n{}",
        &explained[..explained.len().min(2000)]
    );
    let log = agent.stop();
    assert!(
        log.contains("keeps its previous state"),
        "the warning says what became of the frontend:\n{}",
        &log[log.len().saturating_sub(4000)..]
    );
}
