//! `./x demo`: socklb as a kube-proxy replacement, end to end, on this machine, inside a
//! private network namespace and cgroup so that nothing on the host is touched.
//!
//! It starts real backends (six HTTP servers "in three zones", two dnsmasq DNS servers),
//! runs the real agent on the embedded example cluster (examples/cluster: this node is
//! node-a in zone-a), and shows curl and dig going through Service VIPs, which backends
//! answer and why (zone hints), how the answers follow edits of the manifests (this node
//! moves to zone-b; a zone's endpoints terminate), a Service without endpoints refusing,
//! and translation going on while the agent is stopped. Everything is removed at the end.
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use socklb_tests::{
    Agent, Dnsmasq, ManifestDir, NamedServer, Sandbox, explain_command, privileges::chart_agent,
};

/// The example cluster, embedded so that the demo needs nothing but this binary.
const CLUSTER: [(&str, &str); 4] = [
    (
        "nodes.yaml",
        include_str!("../../../examples/cluster/nodes.yaml"),
    ),
    (
        "web.yaml",
        include_str!("../../../examples/cluster/web.yaml"),
    ),
    (
        "dns.yaml",
        include_str!("../../../examples/cluster/dns.yaml"),
    ),
    (
        "others.yaml",
        include_str!("../../../examples/cluster/others.yaml"),
    ),
];

const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

fn main() {
    let sandbox = Sandbox::new("demo");
    let _web: Vec<NamedServer> = (1..=6u8)
        .map(|i| {
            let zone = ZONES[usize::from((i - 1) / 2)];
            let body = format!("web-{i} ({zone})\n");
            let reply = format!(
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            NamedServer::tcp_replying(
                &format!("web-{i}"),
                SocketAddrV4::new(Ipv4Addr::new(127, 0, 1, i), 8080),
                &reply,
            )
        })
        .collect();
    let _dns = [
        Dnsmasq::start(Ipv4Addr::new(127, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 1)),
        Dnsmasq::start(Ipv4Addr::new(127, 0, 2, 2), Ipv4Addr::new(192, 0, 2, 2)),
    ];
    let manifests = ManifestDir::new(&sandbox);
    for (file, yaml) in CLUSTER {
        manifests.write(file, yaml);
    }

    section("The cluster (examples/cluster), as node-a sees it: socklb explain");
    explain(&manifests);

    section(
        "Starting the agent: socklb run --source file --node-name node-a, with the \
         capabilities of a default helm install",
    );
    let agent = Agent::start_as(chart_agent(), &sandbox, &manifests.path, "node-a", &[]);
    for line in agent.log().lines() {
        println!("  {line}");
    }
    println!(
        "  (no device of the demo's namespace holds node-a's address, 192.168.50.10: the \
         warnings about traffic from outside are expected here; this demo shows local \
         clients only)"
    );

    section("curl http://10.96.0.10/ x12 from a process in the cgroup (zone hints: zone-a)");
    curl_tally(&sandbox);

    section("Edit: node-a moves to zone-b (nodes.yaml)");
    manifests.write(
        "nodes.yaml",
        &CLUSTER[0].1.replacen(
            "topology.kubernetes.io/zone: zone-a",
            "topology.kubernetes.io/zone: zone-b",
            1,
        ),
    );
    agent.wait_for_log("synced", 2);
    curl_tally(&sandbox);

    section("Edit: zone-b's pods terminate (web.yaml); no ready endpoint for zone-b");
    let terminating = CLUSTER[1]
        .1
        .lines()
        .map(|line| {
            if line.contains("zone: zone-b") {
                line.replacen(
                    "zone: zone-b,",
                    "zone: zone-b, conditions: {ready: false, serving: true, terminating: true},",
                    1,
                )
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    manifests.write("web.yaml", &terminating);
    agent.wait_for_log("synced", 3);
    println!(
        "  (no ready endpoint is hinted for zone-b: hints are ignored, all ready ones are used)"
    );
    curl_tally(&sandbox);

    section("dig @10.96.0.53 who.test x4 (UDP; replies come back from the VIP)");
    for _ in 0..4 {
        let out = sandbox
            .in_cgroup("dig")
            .args(["@10.96.0.53", "who.test", "+short", "+time=2", "+tries=1"])
            .output()
            .expect("dig");
        println!("  answer {}", String::from_utf8_lossy(&out.stdout).trim());
    }

    section("curl http://10.96.0.11/ (Service api has no endpoints)");
    let out = sandbox
        .in_cgroup("curl")
        .args(["-sS", "-m", "3", "http://10.96.0.11/"])
        .output()
        .expect("curl");
    println!("  {}", String::from_utf8_lossy(&out.stderr).trim());

    section("Stopping the agent (SIGTERM): the pinned programs keep serving");
    agent.stop();
    curl_tally(&sandbox);

    section("Cleaning up (socklb cleanup, cgroup, network namespace, servers)");
    drop(manifests);
    drop(sandbox);
    println!("  done");
}

fn explain(manifests: &ManifestDir) {
    let out = explain_command(&manifests.path, "node-a")
        .output()
        .expect("socklb explain");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("  {line}");
    }
}

/// Which backends answer 12 connections to the web VIP.
fn curl_tally(sandbox: &Sandbox) {
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..12 {
        let out = sandbox
            .in_cgroup("curl")
            .args(["-sS", "-m", "3", "http://10.96.0.10/"])
            .output()
            .expect("curl");
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let answer = if answer.is_empty() {
            String::from_utf8_lossy(&out.stderr).trim().to_owned()
        } else {
            answer
        };
        *tally.entry(answer).or_default() += 1;
    }
    for (answer, count) in tally {
        println!("  {count:2} x {answer}");
    }
    std::thread::sleep(Duration::from_millis(10));
}

fn section(title: &str) {
    println!("\n== {title}");
}
