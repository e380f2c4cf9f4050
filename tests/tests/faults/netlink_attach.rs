//! Netlink TC filters (kernels without TCX; forced here with `--tc-attach-mode netlink`):
//! an agent restart and a map growth replace the program of each filter in place, at the
//! instance's own priority and handle, so four clients looping from outside through a
//! NodePort see no failed connection, four long-lived flows echoing all along see no reset,
//! and the device keeps exactly one filter per hook.
use std::{
    net::{SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use socklb_tests::{
    assert_all_connected,
    echo::{EchoServer, echo},
    family::Family,
    filler_services,
    lan::{Addresses, LanNode, answers},
    tc_filters,
};

const NODE_PORT: u16 = 30150;
const ECHO_NODE_PORT: u16 = 30151;
const NETLINK: [&str; 2] = ["--tc-attach-mode", "netlink"];
/// ClusterIP Services that fill the service and backend maps past three quarters of their
/// starting sizes (8,192 and 4,096 entries): 1,100 Services of 5 endpoints each.
const FILLERS: usize = 1_100;

#[test]
fn restarts_and_growth_replace_netlink_filters_without_a_failed_connection() {
    let node = LanNode::new(Family::V4, "nl-attach", "n");
    let LanNode { a, lan, .. } = &node;
    let _servers = node.tcp_servers(8080);
    let _echo = [
        EchoServer::start(&lan.pod1, SocketAddr::new(a.pod1, 9000)),
        EchoServer::start(&lan.pod2, SocketAddr::new(a.pod2, 9000)),
    ];
    let pods = [a.pod1_endpoint(), a.pod2_endpoint()];
    // (Service, its host in the service CIDR, port name, target port, NodePort)
    for (name, host, port, target, node_port) in [
        ("echo", 151, "echo", 9000, ECHO_NODE_PORT),
        ("web", 150, "http", 8080, NODE_PORT),
    ] {
        let service = a
            .exposed(name, host)
            .port(port, 80, target, node_port, "TCP");
        node.write(&format!("{name}.yaml"), &service.endpoints(&pods).yaml());
    }
    let mut agent = node.agent(&NETLINK);
    agent.wait_for_log("synced", 1);
    assert_eq!(
        tc_filters("eth0"),
        2,
        "one filter per hook:\n{}",
        agent.log()
    );

    let frontend = Addresses::at(a.node1, NODE_PORT);
    let forever = Duration::from_secs(600);
    let mut clients: Vec<_> = (0..4)
        .map(|_| lan.client.spawn_probe_for("tcp", &frontend, forever, 2))
        .collect();
    // Flows that send all along: a packet of theirs in a gap between two filters would
    // meet the host's stack, which has no such connection and resets it.
    let echo_frontend: SocketAddr = Addresses::at(a.node1, ECHO_NODE_PORT)
        .parse()
        .expect("address");
    let flows: Vec<EchoLoop> = (0..4)
        .map(|_| EchoLoop::start(&lan.client, echo_frontend))
        .collect();
    for restart in 1..=3 {
        drop(agent);
        agent = node.agent(&NETLINK);
        agent.wait_for_log("synced", 1);
        let replaced = agent
            .log()
            .lines()
            .filter(|line| line.contains(r#"device="eth0" mode=Netlink attachment=Replaced"#))
            .count();
        assert_eq!(
            replaced,
            2,
            "restart {restart} did not replace the filters in place:\n{}",
            agent.log()
        );
        assert!(
            clients.iter_mut().all(|c| c.running()),
            "a client stopped before restart {restart} was recovered from"
        );
    }
    node.write("fillers.yaml", &filler_services(FILLERS, 5));
    agent.wait_for_log("maps grown", 1);
    assert_eq!(
        tc_filters("eth0"),
        2,
        "restarts and growth left one filter per hook:\n{}",
        agent.log()
    );
    agent.stop();

    for (i, flow) in flows.into_iter().enumerate() {
        let rounds = flow
            .stop()
            .unwrap_or_else(|e| panic!("long-lived flow {i} through the NodePort broke: {e}"));
        assert!(rounds > 0, "flow {i} echoed nothing");
    }
    for (i, client) in clients.into_iter().enumerate() {
        let attempts = client.stop();
        assert_all_connected(&attempts, &format!("client {i} from outside"));
        // `answers` fails on any attempt without a reply.
        assert!(
            answers(&attempts)
                .iter()
                .all(|(server, _)| server == "pod1" || server == "pod2"),
            "client {i}: answered by someone other than the pods"
        );
    }
}

/// A connection from `netns` that echoes a byte at a time until stopped.
struct EchoLoop {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<std::io::Result<u64>>,
}

impl EchoLoop {
    fn start(netns: &socklb_tests::netns::Netns, frontend: SocketAddr) -> Self {
        let mut stream = netns.enter(|| {
            TcpStream::connect_timeout(&frontend, Duration::from_secs(5))
                .expect("connect through the NodePort")
        });
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut rounds = 0;
            while !stopped.load(Ordering::Relaxed) {
                echo(&mut stream)?;
                rounds += 1;
            }
            Ok(rounds)
        });
        Self { stop, thread }
    }

    /// The rounds echoed, or the error that ended the flow.
    fn stop(self) -> std::io::Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("echo thread")
    }
}
