//! TCP state as netfilter keeps it, for flows from outside:
//!
//! - A half-closed flow lives on: the client sends its request, shuts down writing (`nc
//!   -N`, uploaders) and the server answers long after the closing timeout; the answer and
//!   the close arrive, from a local and from a remote backend.
//! - A flow idle past the closing timeout still closes cleanly, whichever side sends the
//!   first FIN: the FIN that answers it (with the ACK of the first, as a peer that closes
//!   at once sends it) finds its entry, whose closing timeout starts with that FIN.
//! - A flow's entries stop translating once idle past their timeout: the same client,
//!   from the same port, then talks to the pod directly and sees the pod, not the
//!   NodePort it used before.
//! - A blind RST (a sequence number far from the flow's) and a SYN after it leave a live
//!   flow as it was, and so do blind FINs both ways. The flow goes to a remote backend: its SNAT port is what a flow
//!   started afresh would lose (to a local backend it would get the same tuple back).
use std::{
    io::{Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    thread::JoinHandle,
    time::Duration,
};

use socklb_agent::inspect;
use socklb_tests::{
    Agent,
    echo::{EchoServer, echo},
    family::Family,
    forged::{self, Capture, Flags},
    lan::{Addresses, LanNode},
    netns::Netns,
};

/// The closing timeout the agent runs with: short, so that waiting past it is quick.
const CLOSE_TIMEOUT: &str = "1s";
/// How long the half-closed flow stays quiet: well past [`CLOSE_TIMEOUT`].
const QUIET: Duration = Duration::from_secs(4);

socklb_tests::for_each_family!(
    a_half_closed_flow_gets_its_late_answer,
    an_idle_flow_closes_cleanly_whichever_side_closes_first,
    an_idle_flow_s_entries_leave_a_direct_connection_from_the_same_port_alone,
    a_blind_rst_and_syn_leave_a_live_flow_alone,
    blind_fins_both_ways_leave_a_live_flow_alone,
);

/// node1 on the LAN with the NodePorts of [`two_node_ports`] and an agent whose closing
/// timeout is [`CLOSE_TIMEOUT`], with `extra` flags.
fn node_with_short_close(
    family: Family,
    test: &str,
    lan: &str,
    target: u16,
    extra: &[&'static str],
) -> (LanNode, Agent) {
    let node = LanNode::new(family, test, lan);
    two_node_ports(&node, target);
    let mut flags = vec!["--conntrack-tcp-timeout-close", CLOSE_TIMEOUT];
    flags.extend(extra);
    let agent = node.agent(&flags);
    (node, agent)
}

fn a_half_closed_flow_gets_its_late_answer(family: Family) {
    let (node, _agent) = node_with_short_close(family, "halfclose", "h", 8080, &[]);
    let LanNode { a, lan, .. } = &node;
    let servers = [
        AfterFinServer::start(&lan.pod1, SocketAddr::new(a.pod1, 8080), QUIET, 1),
        AfterFinServer::start(&lan.pod2, SocketAddr::new(a.pod2, 8080), QUIET, 1),
    ];

    for (backend, port) in [("local", 30071), ("remote", 30072)] {
        let frontend: SocketAddr = Addresses::at(a.node1, port).parse().expect("address");
        let answer = lan.client.enter(|| {
            let stream = TcpStream::connect_timeout(&frontend, Duration::from_secs(5))
                .expect("connect through the NodePort");
            half_closed_request(stream, QUIET * 3).map_err(|e| e.to_string())
        });
        assert_eq!(
            answer.as_deref(),
            Ok("answer to request"),
            "{backend} backend: the answer sent {QUIET:?} after the client's FIN, and the \
             server's close, reach the client; {:?}",
            node.counters()
        );
    }
    for server in servers {
        server.join();
    }
}

fn an_idle_flow_closes_cleanly_whichever_side_closes_first(family: Family) {
    let (node, _agent) = node_with_short_close(family, "idleclose", "i", 8080, &[]);
    let LanNode { a, lan, .. } = &node;
    for first in [Closer::Server, Closer::Client] {
        let servers = [
            IdleCloseServer::start(&lan.pod1, SocketAddr::new(a.pod1, 8080), first),
            IdleCloseServer::start(&lan.pod2, SocketAddr::new(a.pod2, 8080), first),
        ];
        for ((backend, port), server) in [("local", 30071), ("remote", 30072)]
            .into_iter()
            .zip(servers)
        {
            let frontend: SocketAddr = Addresses::at(a.node1, port).parse().expect("address");
            let client = lan.client.enter(|| idle_then_close(frontend, first));
            let server = server.join();
            assert_eq!(
                (client.as_deref(), server.as_deref()),
                (Ok("closed"), Ok("closed")),
                "{backend} backend, {first:?} closing first after {QUIET:?} idle: each side \
                 reads the other's FIN; {:?}",
                node.counters()
            );
        }
    }
}

/// Which side of [`idle_then_close`] sends the first FIN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closer {
    Client,
    Server,
}

/// One ping and pong through `frontend`, [`QUIET`] idle, then the close, as
/// [`close_after_quiet`] does it.
fn idle_then_close(frontend: SocketAddr, first: Closer) -> Result<&'static str, String> {
    let mut stream = TcpStream::connect_timeout(&frontend, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(b"ping")
        .map_err(|e| format!("ping: {e}"))?;
    let mut pong = [0; 4];
    stream
        .read_exact(&mut pong)
        .map_err(|e| format!("pong: {e}"))?;
    close_after_quiet(stream, first == Closer::Client)
}

/// Stays quiet for [`QUIET`], then closes: first (shuts down writing, then reads the
/// peer's FIN), or after the peer's FIN, at once (its FIN carries the ACK of the peer's).
/// "closed" once both FINs went through.
fn close_after_quiet(mut stream: TcpStream, first: bool) -> Result<&'static str, String> {
    stream
        .set_read_timeout(Some(QUIET * 3))
        .map_err(|e| e.to_string())?;
    let mut rest = Vec::new();
    if first {
        std::thread::sleep(QUIET);
        stream
            .shutdown(Shutdown::Write)
            .map_err(|e| format!("shutdown: {e}"))?;
    }
    // Ends at the peer's FIN; a reset or the timeout is an error.
    stream
        .read_to_end(&mut rest)
        .map_err(|e| format!("waiting for the peer's FIN: {e}"))?;
    Ok("closed")
}

/// A server for one [`idle_then_close`] client: answers its ping, then closes as the
/// other side of `first`.
struct IdleCloseServer(JoinHandle<Result<&'static str, String>>);

impl IdleCloseServer {
    fn start(pod: &Netns, address: SocketAddr, first: Closer) -> Self {
        let listener = pod.enter(|| TcpListener::bind(address).expect("bind the server"));
        Self(std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
            let mut ping = [0; 4];
            stream
                .read_exact(&mut ping)
                .map_err(|e| format!("ping: {e}"))?;
            stream
                .write_all(b"pong")
                .map_err(|e| format!("pong: {e}"))?;
            close_after_quiet(stream, first == Closer::Server)
        }))
    }

    fn join(self) -> Result<&'static str, String> {
        self.0.join().expect("the server")
    }
}

fn an_idle_flow_s_entries_leave_a_direct_connection_from_the_same_port_alone(family: Family) {
    // What is tested is that the programs follow no expired entry: the conntrack GC would
    // remove these first.
    let (node, _agent) = node_with_short_close(
        family,
        "stale",
        "s",
        8080,
        &["--conntrack-gc-interval", "off"],
    );
    let LanNode { a, lan, .. } = &node;
    let server = AfterFinServer::start(&lan.pod1, SocketAddr::new(a.pod1, 8080), Duration::ZERO, 2);
    // The client reaches the pods directly too, through node1.
    let family_flag = match family {
        Family::V4 => "-4",
        Family::V6 => "-6",
    };
    lan.client
        .ip(&[family_flag, "route", "add", a.pod_cidr, "via", a.node1]);
    let client_port = 40123;
    let node_port: SocketAddr = Addresses::at(a.node1, 30071).parse().expect("address");
    let pod: SocketAddr = SocketAddr::new(a.pod1, 8080);

    let through_node_port = lan
        .client
        .enter(|| exchange(a.client, client_port, node_port));
    assert_eq!(
        through_node_port.0, node_port,
        "the NodePort flow: {through_node_port:?}"
    );
    assert_eq!(through_node_port.1, "answer to request");
    // Its entries are closing (FINs both ways; the client closed first, so the pod holds
    // no TIME_WAIT for the tuple the direct connection uses): idle past the closing
    // timeout, they must translate nothing.
    std::thread::sleep(Duration::from_secs(3));
    let direct = lan.client.enter(|| exchange(a.client, client_port, pod));
    assert_eq!(
        direct.0,
        pod,
        "a direct connection from the port the NodePort flow used sees the pod: {direct:?}; \
         {:?}",
        node.counters()
    );
    assert_eq!(direct.1, "answer to request");
    server.join();
}

fn a_blind_rst_and_syn_leave_a_live_flow_alone(family: Family) {
    let mut flow = RemoteEchoFlow::start(family, "blindrst", "b");
    // Half the sequence space away: outside any window.
    let blind = flow.client_sequence.wrapping_add(1 << 31);
    flow.node.lan.client.enter(|| {
        forged::send(flow.client, flow.frontend, blind, Flags::Rst);
        forged::send(
            flow.client,
            flow.frontend,
            blind.wrapping_add(1),
            Flags::Syn,
        );
    });
    let survived = echo(&mut flow.stream).map_err(|e| e.to_string());
    assert_eq!(
        survived,
        Ok(()),
        "after a blind RST and SYN from the client's tuple, the flow to the remote backend \
         still echoes; {:?}",
        flow.node.counters()
    );
}

/// FINs both ways mark a flow closing, whose entries then expire after the closing
/// timeout: forged ones, far from the flow's sequence numbers, must not.
fn blind_fins_both_ways_leave_a_live_flow_alone(family: Family) {
    let mut flow = RemoteEchoFlow::start(family, "blindfin", "f");
    // Where the flow reaches pod2 from: node1's SNAT address and port.
    let snat = inspect::inspect(&flow.node.sandbox.pin_dir, None)
        .expect("inspect")
        .conntrack
        .into_iter()
        .find(|entry| entry.direction == "forward" && entry.from == flow.client)
        .map(|entry| entry.rewritten_from)
        .unwrap_or_else(|| panic!("no forward entry for {}", flow.client));
    let pod2 = SocketAddr::new(flow.pod2, 8080);
    flow.node.lan.client.enter(|| {
        let client_fin = flow.client_sequence.wrapping_add(1 << 31);
        let server_fin = flow.server_sequence.wrapping_add(1 << 31);
        forged::send(flow.client, flow.frontend, client_fin, Flags::Fin);
        forged::send(pod2, snat, server_fin, Flags::Fin);
    });
    // Past the closing timeout: entries marked closing by the forged FINs would be gone.
    std::thread::sleep(Duration::from_secs(3));
    let survived = echo(&mut flow.stream).map_err(|e| e.to_string());
    assert_eq!(
        survived,
        Ok(()),
        "after blind FINs both ways, the flow to the remote backend still echoes; {:?}",
        flow.node.counters()
    );
}

/// A live TCP flow from the client through node1's NodePort to an echo server on pod2 (a
/// remote backend: SNATed, so a flow started afresh would lose its port), confirmed by one
/// echo, with the sequence numbers each side sent it. The agent runs with a short closing
/// timeout.
struct RemoteEchoFlow {
    stream: TcpStream,
    client: SocketAddr,
    frontend: SocketAddr,
    pod2: std::net::IpAddr,
    client_sequence: u32,
    server_sequence: u32,
    // Dropped in this order: the agent before what it reads and the namespaces.
    _agent: Agent,
    _server: EchoServer,
    node: LanNode,
}

impl RemoteEchoFlow {
    fn start(family: Family, name: &str, lan_name: &str) -> Self {
        let (node, agent) = node_with_short_close(family, name, lan_name, 8080, &[]);
        let (a, lan) = (&node.a, &node.lan);
        let server = EchoServer::start(&lan.pod2, SocketAddr::new(a.pod2, 8080));
        let frontend: SocketAddr = Addresses::at(a.node1, 30072).parse().expect("address");
        let capture = lan.client.enter(Capture::start);
        let mut stream = lan.client.enter(|| {
            TcpStream::connect_timeout(&frontend, Duration::from_secs(5))
                .expect("connect through the NodePort")
        });
        // The ACK ending the handshake confirmed the flow; the echo shows it works.
        echo(&mut stream).expect("the first echo");
        let client = stream.local_addr().expect("client address");
        let client_sequence = capture.data_sequence(client, frontend);
        let server_sequence = capture.data_sequence(frontend, client);
        Self {
            stream,
            client,
            frontend,
            pod2: a.pod2,
            client_sequence,
            server_sequence,
            _agent: agent,
            _server: server,
            node,
        }
    }
}

/// A NodePort Service to pod1 (30071) and one to pod2 (30072), both on `target`.
fn two_node_ports(node: &LanNode, target: u16) {
    node.local_and_remote("svc.yaml", 71, ("tcp", 80, target, "TCP"), 30071);
}

/// Connects from `client:port` to `target` (in the namespace it is called in), sends a
/// request and its FIN, and reads the answer to the end: the peer it saw and the answer.
fn exchange(client: &str, port: u16, target: SocketAddr) -> (SocketAddr, String) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let socket = match target {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        }
        .expect("socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket
            .bind(Addresses::at(client, port).parse().expect("client address"))
            .expect("bind the client's port");
        let stream = tokio::time::timeout(Duration::from_secs(5), socket.connect(target))
            .await
            .unwrap_or_else(|_| panic!("connect to {target} from port {port} timed out"))
            .unwrap_or_else(|e| panic!("connect to {target} from port {port}: {e}"));
        let peer = stream.peer_addr().expect("peer");
        let stream = stream.into_std().expect("std stream");
        stream.set_nonblocking(false).expect("blocking");
        let answer = half_closed_request(stream, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("request to {target}: {e}"));
        (peer, answer)
    })
}

/// Sends a request and its FIN on `stream` and reads the answer to the end, waiting for
/// it up to `wait`.
fn half_closed_request(mut stream: TcpStream, wait: Duration) -> std::io::Result<String> {
    stream.set_read_timeout(Some(wait))?;
    stream.write_all(b"request")?;
    stream.shutdown(Shutdown::Write)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// A server that reads each client's request to the end (the client's FIN), stays quiet
/// for `quiet`, then answers and closes; it serves `connections` clients, one at a time.
struct AfterFinServer(JoinHandle<()>);

impl AfterFinServer {
    fn start(pod: &Netns, address: SocketAddr, quiet: Duration, connections: usize) -> Self {
        let listener = pod.enter(|| TcpListener::bind(address).expect("bind the server"));
        Self(std::thread::spawn(move || {
            for _ in 0..connections {
                let (mut stream, _) = listener.accept().expect("accept");
                let mut request = String::new();
                stream
                    .read_to_string(&mut request)
                    .expect("read the request");
                std::thread::sleep(quiet);
                let _ = stream.write_all(format!("answer to {request}").as_bytes());
            }
        }))
    }

    fn join(self) {
        self.0.join().expect("the server");
    }
}
