//! A restart with another `--max-conntrack-entries` (and `--max-conntrack-new-entries`):
//! the conntrack maps are created again with their new sizes, and the entries of the old
//! ones are carried over, so idle SNATed flows from outside carry on where a plain restart
//! would have kept them too.
use std::{
    net::{SocketAddr, TcpStream},
    time::Duration,
};

use socklb_tests::{
    assert_logged,
    echo::{EchoServer, echo},
    family::Family,
    lan::{Addresses, LanNode},
};

const NODE_PORT: u16 = 30160;

#[test]
fn idle_snated_flows_survive_a_restart_with_another_conntrack_size() {
    let node = LanNode::new(Family::V4, "ct-resize", "c");
    let LanNode { a, lan, .. } = &node;
    // On node2: flows from outside are SNATed to node1's address, so only conntrack
    // connects the replies to their clients.
    let _echo = EchoServer::start(&lan.pod2, SocketAddr::new(a.pod2, 8080));
    node.expose_pod2("echo", 160, ("http", 80, 8080, NODE_PORT, "TCP"));
    let agent = node.agent(&[]);
    agent.wait_for_log("synced", 1);
    let frontend: SocketAddr = Addresses::at(a.node1, NODE_PORT).parse().expect("address");
    let mut flows: Vec<TcpStream> = lan.client.enter(|| {
        (0..10)
            .map(|_| {
                TcpStream::connect_timeout(&frontend, Duration::from_secs(5))
                    .expect("connect through the NodePort")
            })
            .collect()
    });
    for (i, flow) in flows.iter_mut().enumerate() {
        echo(flow).unwrap_or_else(|e| panic!("flow {i} before the restart: {e}"));
    }
    agent.stop();

    let agent = node.agent(&[
        "--max-conntrack-entries",
        "65536",
        "--max-conntrack-new-entries",
        "4096",
    ]);
    agent.wait_for_log("synced", 1);
    let broken: Vec<String> = flows
        .iter_mut()
        .enumerate()
        .filter_map(|(i, flow)| echo(flow).err().map(|e| format!("flow {i}: {e}")))
        .collect();
    let log = agent.stop();
    assert!(
        broken.is_empty(),
        "idle flows lost across the resize: {broken:?}\n{log}"
    );
    assert_logged(
        &log,
        &["carried over"],
        "the agent says the entries were carried over",
    );
}
