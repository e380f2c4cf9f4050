//! `./x demo`: the socket datapath on this machine, end to end, in a private network
//! namespace and cgroup so that nothing on the host is touched.
//!
//! It starts real backends (three HTTP servers, two dnsmasq DNS servers), runs the real
//! `socklb` agent on the embedded frontends (examples/demo-frontends.json), and shows curl
//! and dig reaching the backends through service VIPs, a VIP without endpoints refusing,
//! and translation going on while the agent is stopped. Everything is removed at the end.
use std::{
    io::{BufRead as _, BufReader},
    net::{Ipv4Addr, SocketAddrV4},
    process::{Command, Stdio},
    time::Duration,
};

use socklb_tests::{Dnsmasq, NamedServer, Sandbox, agent_bin};

/// The demo's frontends, embedded so that the demo needs nothing but this binary.
const FRONTENDS: &str = include_str!("../../../examples/demo-frontends.json");

fn main() {
    let sandbox = Sandbox::new("demo");
    let web: Vec<NamedServer> = (1..=3)
        .map(|i| {
            let body = format!("hello from web-{i} (127.0.1.{i}:8080)\n");
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
    let dns = [
        Dnsmasq::start(Ipv4Addr::new(127, 0, 2, 1), Ipv4Addr::new(192, 0, 2, 1)),
        Dnsmasq::start(Ipv4Addr::new(127, 0, 2, 2), Ipv4Addr::new(192, 0, 2, 2)),
    ];
    section("Backends");
    println!("  web-1..3   HTTP on 127.0.1.1-3:8080");
    println!(
        "  dns-1, -2  dnsmasq on 127.0.2.1-2:53, answering who.test with 192.0.2.1 / 192.0.2.2"
    );

    let frontends = std::env::temp_dir().join(format!("{}.json", sandbox.name));
    std::fs::write(&frontends, FRONTENDS).expect("write the demo frontends");
    section("Frontends (examples/demo-frontends.json)");
    println!("  10.96.0.10:80/TCP -> web-1, web-2, web-3");
    println!("  10.96.0.53:53/UDP -> dns-1, dns-2");
    println!("  10.96.0.11:80/TCP -> (no endpoints)");

    section("Starting the agent");
    let mut agent = Command::new(agent_bin())
        .arg("run")
        .arg("--static-frontends")
        .arg(&frontends)
        .arg("--bpffs")
        .arg(&sandbox.pin_dir)
        .arg("--cgroup-path")
        .arg(&sandbox.cgroup)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start socklb");
    let stderr = agent.stderr.take().expect("agent stderr");
    let mut lines = BufReader::new(stderr).lines();
    for line in lines.by_ref() {
        let line = line.expect("agent log");
        println!("  {line}");
        if line.contains("ready") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});

    section("curl http://10.96.0.10/ (9 times, from a process in the cgroup)");
    for _ in 0..9 {
        let out = sandbox
            .in_cgroup("curl")
            .args([
                "-sS",
                "-m",
                "3",
                "-w",
                "  [curl saw peer %{remote_ip}:%{remote_port}]",
                "http://10.96.0.10/",
            ])
            .output()
            .expect("curl");
        print!(
            "  {}",
            String::from_utf8_lossy(&out.stdout).replace('\n', "")
        );
        println!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }

    section("dig @10.96.0.53 who.test (4 times)");
    for _ in 0..4 {
        let out = sandbox
            .in_cgroup("dig")
            .args(["@10.96.0.53", "who.test", "+short", "+time=2", "+tries=1"])
            .output()
            .expect("dig");
        println!(
            "  answer {} (reply accepted by dig from 10.96.0.53)",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }

    section("curl http://10.96.0.11/ (a service without endpoints)");
    let out = sandbox
        .in_cgroup("curl")
        .args(["-sS", "-m", "3", "http://10.96.0.11/"])
        .output()
        .expect("curl");
    println!("  {}", String::from_utf8_lossy(&out.stderr).trim());

    section("Stopping the agent: the pinned programs keep serving");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.id().cast_signed(), libc::SIGTERM) };
    let _ = agent.wait();
    std::thread::sleep(Duration::from_millis(200));
    let out = sandbox
        .in_cgroup("curl")
        .args(["-sS", "-m", "3", "http://10.96.0.10/"])
        .output()
        .expect("curl");
    print!(
        "  agent stopped; curl http://10.96.0.10/ -> {}",
        String::from_utf8_lossy(&out.stdout)
    );

    section("bpftool map dump pinned .../socklb_svc_v1 (first entry)");
    let out = Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(sandbox.pin_dir.join("socklb_svc_v1"))
        .output()
        .expect("bpftool");
    for line in String::from_utf8_lossy(&out.stdout).lines().take(17) {
        println!("  {line}");
    }

    section("Cleaning up (socklb cleanup, cgroup, network namespace)");
    let _ = std::fs::remove_file(&frontends);
    drop(dns);
    drop(web);
    drop(sandbox);
    println!("  done");
}

fn section(title: &str) {
    println!("\n== {title}");
}
