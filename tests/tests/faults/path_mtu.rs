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
    net::{Shutdown, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use socklb_tests::{
    KillOnDrop, Sandbox,
    echo::EchoServer,
    eventually,
    family::Family,
    lan::{self, Addresses, LanNode},
    netns::Netns,
};

/// The size of the HTTP response: many segments above the path's MTU.
const BODY: usize = 1 << 20;

socklb_tests::for_each_family!(
    a_1280_mtu_hop_before_the_client_leaves_nodeport_transfers_whole,
    port_unreachable_from_a_backend_refuses_the_client_at_once,
    a_1280_mtu_route_to_a_remote_backend_leaves_nodeport_uploads_whole,
);

fn a_1280_mtu_hop_before_the_client_leaves_nodeport_transfers_whole(family: Family) {
    let node = LanNode::new(family, "pmtu", "m");
    let LanNode {
        a, lan, sandbox, ..
    } = &node;
    let far = lan.far_client(1280);
    let files = WebRoot::new(sandbox);
    let _servers = [
        HttpServer::start(&lan.pod1, SocketAddr::new(a.pod1, 8080), &files.0),
        HttpServer::start(&lan.pod2, SocketAddr::new(a.pod2, 8080), &files.0),
    ];
    node.local_and_remote("web.yaml", 61, ("http", 80, 8080, "TCP"), 30061);
    let _agent = node.agent(&[]);
    let before = node.counters();

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
            node.counters()
        );
    }
    let after = node.counters();
    assert!(
        after.icmp_errors_translated > before.icmp_errors_translated,
        "the router's errors were translated: {after:?}"
    );
    assert_eq!(after.errors, before.errors, "{after:?}");
    drop(far);
}

fn port_unreachable_from_a_backend_refuses_the_client_at_once(family: Family) {
    let node = LanNode::new(family, "unreach", "u");
    let a = &node.a;
    // No server listens on the target port in either pod.
    node.local_and_remote("dns.yaml", 63, ("dns", 53, 5999, "UDP"), 30063);
    let _agent = node.agent(&[]);

    for (backend, port) in [("local", 30063), ("remote", 30064)] {
        let frontend = Addresses::at(a.node1, port);
        let refused = node.udp_query(&frontend, Duration::from_secs(5));
        assert_eq!(
            refused,
            Err(ErrorKind::ConnectionRefused),
            "{backend} backend without a listener: the client's socket connected to \
             {frontend} must get the port unreachable as ECONNREFUSED, not wait"
        );
    }
    assert!(node.counters().icmp_errors_translated >= 2);
}

/// The path from node1 to pod2 carries 1,280 bytes (node1's route there, as with an
/// overlay's smaller device MTU), while the client and both pods use 1,500: the client's
/// segments to the backend are too big for it, and socklb, which forwards them itself,
/// answers as a router does, so that the client lowers its path MTU.
fn a_1280_mtu_route_to_a_remote_backend_leaves_nodeport_uploads_whole(family: Family) {
    let node = LanNode::new(family, "pmtub", "o");
    let LanNode { a, lan, .. } = &node;
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
    // The echo Service, and one for traceroute: nothing listens on pod2's port 9, so its
    // probe ends with port unreachable.
    let services = [
        a.exposed("remote", 65).port("echo", 80, 8080, 30065, "TCP"),
        a.exposed("probe", 66).port("probe", 81, 9, 30066, "UDP"),
    ];
    for (file, service) in ["echo.yaml", "probe.yaml"].into_iter().zip(services) {
        node.write(file, &service.endpoints(&[a.pod2_endpoint()]).yaml());
    }
    let _agent = node.agent(&[]);
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
        node.counters()
    );
    assert!(
        node.counters().too_big_answered > 0,
        "socklb answered the too-big segments: {:?}",
        node.counters()
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
        node.counters()
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
struct HttpServer;

impl HttpServer {
    fn start(pod: &Netns, address: SocketAddr, root: &Path) -> KillOnDrop {
        let server = KillOnDrop(
            pod.command("python3")
                .args(["-m", "http.server", "--bind"])
                .arg(address.ip().to_string())
                .arg("--directory")
                .arg(root)
                .arg(address.port().to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("prerequisite missing: python3 (its http.server serves the test's file)"),
        );
        eventually(
            &format!("python3 -m http.server listening on {address}"),
            Duration::from_secs(10),
            || {
                pod.enter(|| TcpStream::connect_timeout(&address, Duration::from_millis(200)))
                    .map_err(|e| e.to_string())
            },
        );
        server
    }
}
