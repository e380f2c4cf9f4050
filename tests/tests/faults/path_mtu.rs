//! Real network paths: ICMP errors about a flow from outside reach the host that can act
//! on them, quoting what it sent.
//!
//! - A hop with an MTU of 1,280 between an outside client and the node (a tunnel, PPPoE, an
//!   IPv6 router that never fragments): the router's "fragmentation needed" (Packet Too
//!   Big) quotes the frontend's reply; translated back, it lowers the backend's path MTU,
//!   and a 1 MiB HTTP response through a NodePort arrives whole, from a local and from a
//!   remote backend, with no MSS clamping anywhere.
//! - A route with an MTU of 1,280 from the node to a remote backend (an overlay): the
//!   client's larger segments are answered by socklb with "fragmentation needed" (Packet
//!   Too Big), as a router answers, and a 1 MiB upload through a NodePort arrives whole;
//!   traceroute (`--mtu`, UDP to the NodePort) sees the node as a hop (socklb answers a
//!   packet whose TTL runs out with "time exceeded", as a router does) and the path's MTU.
//! - A backend without a listener on the target port answers UDP with port unreachable;
//!   translated, it reaches the client's connected socket as ECONNREFUSED at once.
use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use socklb_tests::{
    Agent, ManifestDir, Sandbox,
    echo::EchoServer,
    family::Family,
    lan::{self, Addresses, addresses, counters, lan},
    netns::Netns,
};

/// The size of the HTTP response: many segments above the path's MTU.
const BODY: usize = 1 << 20;

#[test]
fn a_1280_mtu_hop_before_the_client_leaves_nodeport_transfers_whole_over_ipv4() {
    a_small_mtu_hop_before_the_client(Family::V4);
}

#[test]
fn a_1280_mtu_hop_before_the_client_leaves_nodeport_transfers_whole_over_ipv6() {
    a_small_mtu_hop_before_the_client(Family::V6);
}

fn a_small_mtu_hop_before_the_client(family: Family) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("pmtu{}", family.tag()));
    let lan = lan(&format!("m{}", family.tag()));
    let far = lan.far_client(1280);
    let files = WebRoot::new(&sandbox);
    let _servers = [
        HttpServer::start(&lan.pod1, SocketAddr::new(a.pod1, 8080), &files.0),
        HttpServer::start(&lan.pod2, SocketAddr::new(a.pod2, 8080), &files.0),
    ];
    let manifests = ManifestDir::new(&sandbox);
    a.nodes(&manifests);
    let ports = |port: u16| {
        format!("[{{name: http, port: 80, targetPort: 8080, nodePort: {port}, protocol: TCP}}]")
    };
    manifests.write(
        "web.yaml",
        &format!(
            "{}---\n{}---\n{}---\n{}",
            a.service("local", 61, &ports(30061), "  type: NodePort", false),
            a.slice(
                "local-1",
                "local",
                ("http", 8080, "TCP"),
                &[a.pod1_endpoint()]
            ),
            a.service("remote", 62, &ports(30062), "  type: NodePort", false),
            a.slice(
                "remote-1",
                "remote",
                ("http", 8080, "TCP"),
                &[a.pod2_endpoint()]
            ),
        ),
    );
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);
    let before = counters(&sandbox);

    for (backend, port) in [("local", 30061), ("remote", 30062)] {
        let url = format!("http://{}/big", Addresses::at(a.node1, port));
        let output = far.client.output(
            "curl",
            &[
                "--silent",
                "--show-error",
                "--max-time",
                "20",
                "--output",
                "/dev/null",
                "--write-out",
                "%{size_download}",
                &url,
            ],
        );
        let received = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            received,
            BODY.to_string(),
            "{backend} backend: 1 MiB through {url} across a 1,280 MTU hop ({}); {:?}",
            String::from_utf8_lossy(&output.stderr),
            counters(&sandbox)
        );
    }
    let after = counters(&sandbox);
    assert!(
        after.icmp_errors_translated > before.icmp_errors_translated,
        "the router's errors were translated: {after:?}"
    );
    assert_eq!(after.errors, before.errors, "{after:?}");
    drop(far);
}

#[test]
fn port_unreachable_from_a_backend_refuses_the_client_at_once_over_ipv4() {
    port_unreachable_from_a_backend(Family::V4);
}

#[test]
fn port_unreachable_from_a_backend_refuses_the_client_at_once_over_ipv6() {
    port_unreachable_from_a_backend(Family::V6);
}

fn port_unreachable_from_a_backend(family: Family) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("unreach{}", family.tag()));
    let lan = lan(&format!("u{}", family.tag()));
    // No server listens on the target port in either pod.
    let manifests = ManifestDir::new(&sandbox);
    a.nodes(&manifests);
    let ports = |port: u16| {
        format!("[{{name: dns, port: 53, targetPort: 5999, nodePort: {port}, protocol: UDP}}]")
    };
    manifests.write(
        "dns.yaml",
        &format!(
            "{}---\n{}---\n{}---\n{}",
            a.service("local", 63, &ports(30063), "  type: NodePort", false),
            a.slice(
                "local-1",
                "local",
                ("dns", 5999, "UDP"),
                &[a.pod1_endpoint()]
            ),
            a.service("remote", 64, &ports(30064), "  type: NodePort", false),
            a.slice(
                "remote-1",
                "remote",
                ("dns", 5999, "UDP"),
                &[a.pod2_endpoint()]
            ),
        ),
    );
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);

    for (backend, port) in [("local", 30063), ("remote", 30064)] {
        let frontend = Addresses::at(a.node1, port);
        let refused = lan.client.enter(|| {
            let client = UdpSocket::bind(Addresses::at(a.client, 0)).expect("bind");
            client.connect(&frontend).expect("connect");
            client
                .set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            client.send(b"query").expect("send");
            let mut buffer = [0u8; 64];
            client.recv(&mut buffer).map_err(|e| e.kind())
        });
        assert_eq!(
            refused,
            Err(ErrorKind::ConnectionRefused),
            "{backend} backend without a listener: the client's socket connected to \
             {frontend} must get the port unreachable as ECONNREFUSED, not wait"
        );
    }
    assert!(counters(&sandbox).icmp_errors_translated >= 2);
}

#[test]
fn a_1280_mtu_route_to_a_remote_backend_leaves_nodeport_uploads_whole_over_ipv4() {
    a_small_mtu_towards_the_backend(Family::V4);
}

#[test]
fn a_1280_mtu_route_to_a_remote_backend_leaves_nodeport_uploads_whole_over_ipv6() {
    a_small_mtu_towards_the_backend(Family::V6);
}

/// The path from node1 to pod2 carries 1,280 bytes (node1's route there, as with an
/// overlay's smaller device MTU), while the client and both pods use 1,500: the client's
/// segments to the backend are too big for it, and socklb, which forwards them itself,
/// answers as a router does, so that the client lowers its path MTU.
fn a_small_mtu_towards_the_backend(family: Family) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("pmtub{}", family.tag()));
    let lan = lan(&format!("o{}", family.tag()));
    let _server = EchoServer::start(&lan.pod2, SocketAddr::new(a.pod2, 8080));
    let (version, pod2_net) = match family {
        Family::V4 => ("-4", "10.244.2.0/24"),
        Family::V6 => ("-6", "fd00:244:2::/64"),
    };
    // node1's route to pod2 carries 1,280 bytes, as an overlay device's MTU would ("lock":
    // the kernel's forwarding heeds a route's MTU only then, and so does the FIB lookup).
    lan::here(&[
        version, "route", "change", pod2_net, "via", a.node2, "mtu", "lock", "1280",
    ]);
    let manifests = ManifestDir::new(&sandbox);
    a.nodes(&manifests);
    manifests.write(
        "echo.yaml",
        &format!(
            "{}---\n{}",
            a.service(
                "remote",
                65,
                "[{name: echo, port: 80, targetPort: 8080, nodePort: 30065, protocol: TCP}]",
                "  type: NodePort",
                false
            ),
            a.slice(
                "remote-1",
                "remote",
                ("echo", 8080, "TCP"),
                &[a.pod2_endpoint()]
            ),
        ),
    );
    // Nothing listens on pod2's port 9: traceroute's probe ends with port unreachable.
    manifests.write(
        "probe.yaml",
        &format!(
            "{}---\n{}",
            a.service(
                "probe",
                66,
                "[{name: probe, port: 81, targetPort: 9, nodePort: 30066, protocol: UDP}]",
                "  type: NodePort",
                false
            ),
            a.slice(
                "probe-1",
                "probe",
                ("probe", 9, "UDP"),
                &[a.pod2_endpoint()]
            ),
        ),
    );
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);
    let frontend: SocketAddr = Addresses::at(a.node1, 30065).parse().expect("address");

    let echoed = lan.client.enter(|| {
        let mut stream = TcpStream::connect_timeout(&frontend, Duration::from_secs(5))
            .expect("connect through the NodePort");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        stream
            .set_write_timeout(Some(Duration::from_secs(20)))
            .expect("write timeout");
        let mut writer = stream.try_clone().expect("clone");
        let upload = std::thread::spawn(move || {
            writer.write_all(&vec![b'x'; BODY])?;
            writer.shutdown(Shutdown::Write)
        });
        let mut received = Vec::new();
        let read = stream.read_to_end(&mut received);
        let sent = upload.join().expect("the upload");
        (
            received.len(),
            read.err().map(|e| e.to_string()),
            sent.err().map(|e| e.to_string()),
        )
    });
    assert_eq!(
        echoed,
        (BODY, None, None),
        "1 MiB sent through the NodePort to a backend behind a 1,280 MTU route comes back \
         whole; {:?}",
        counters(&sandbox)
    );
    assert!(
        counters(&sandbox).too_big_answered > 0,
        "socklb answered the too-big segments: {:?}",
        counters(&sandbox)
    );
    // The client's kernel took the answer (checksums, quote and all): it keeps the path
    // MTU it learned for the node. (Veths carry GSO batches whatever their MTU, so the
    // upload alone would also complete without it.)
    let route = lan.client.output("ip", &["route", "get", a.node1]);
    let route = String::from_utf8_lossy(&route.stdout);
    assert!(
        route.contains("mtu 1280"),
        "the client learned the path MTU from socklb's answer: {route}"
    );

    // traceroute to the UDP NodePort, one probe per hop, finding the path's MTU: the first
    // probe's TTL runs out at node1 ("time exceeded"), the next is too big for the route to
    // pod2 ("fragmentation needed", F=1280), and a smaller one reaches pod2, whose port
    // unreachable comes back translated. Every answer comes from node1: no hop is a `*`.
    let hops = lan.client.output(
        "traceroute",
        &[
            &format!("-{}", family.tag()),
            "-n",
            "-U",
            "-p",
            "30066",
            "--mtu",
            "-q",
            "1",
            "-w",
            "2",
            "-m",
            "4",
            a.node1,
        ],
    );
    let hops = String::from_utf8_lossy(&hops.stdout).into_owned();
    let lines: Vec<&str> = hops.lines().skip(1).collect();
    assert!(
        lines.len() >= 2
            && lines.iter().all(|line| line.contains(a.node1))
            && hops.contains("F=1280"),
        "traceroute shows node1 as the first hop, then reaches the backend through it with \
         the path's MTU of 1,280:\n{hops}\n{:?}",
        counters(&sandbox)
    );
}

/// The servers' directory, holding `big` ([`BODY`] bytes); removed when dropped.
struct WebRoot(PathBuf);

impl WebRoot {
    fn new(sandbox: &Sandbox) -> Self {
        let dir = std::env::temp_dir().join(format!("{}-www", sandbox.name));
        std::fs::create_dir_all(&dir).expect("create the web root");
        let root = Self(dir);
        std::fs::write(root.0.join("big"), vec![b'x'; BODY]).expect("write the response body");
        root
    }
}

impl Drop for WebRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Python's HTTP server in a pod's namespace, serving `root`; killed when dropped.
struct HttpServer(Child);

impl HttpServer {
    fn start(pod: &Netns, address: SocketAddr, root: &Path) -> Self {
        let child = pod
            .command("python3")
            .args(["-m", "http.server", "--bind"])
            .arg(address.ip().to_string())
            .arg("--directory")
            .arg(root)
            .arg(address.port().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prerequisite missing: python3 (its http.server serves the test's file)");
        let server = Self(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while pod
            .enter(|| TcpStream::connect_timeout(&address, Duration::from_millis(200)))
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "python3 -m http.server did not listen on {address}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
