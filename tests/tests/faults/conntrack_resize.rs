//! A restart with another `--max-conntrack-entries` (and `--max-conntrack-new-entries`):
//! the conntrack maps are created again with their new sizes, and the entries of the old
//! ones are carried over, so idle SNATed flows from outside carry on where a plain restart
//! would have kept them too.
use std::{
    net::{SocketAddrV4, TcpStream},
    time::Duration,
};

use socklb_tests::{
    Agent, ManifestDir, Sandbox,
    echo::{EchoServer, echo},
    lan::{NODE1, POD2, POD2_ENDPOINT, lan, nodes, service, slice},
};

const NODE_PORT: u16 = 30160;

#[test]
fn idle_snated_flows_survive_a_restart_with_another_conntrack_size() {
    let sandbox = Sandbox::new("ct-resize");
    let lan = lan("c");
    // On node2: flows from outside are SNATed to node1's address, so only conntrack
    // connects the replies to their clients.
    let _echo = EchoServer::start(&lan.pod2, SocketAddrV4::new(POD2, 8080));
    let manifests = ManifestDir::new(&sandbox);
    nodes(&manifests);
    manifests.service(
        "echo",
        &service(
            "echo",
            "10.96.0.160",
            &format!(
                "[{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]"
            ),
            "  type: NodePort",
            None,
        ),
        &slice("echo-1", "echo", ("http", 8080, "TCP"), &[POD2_ENDPOINT]),
    );
    let agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);
    agent.wait_for_log("synced", 1);
    let frontend = SocketAddrV4::new(NODE1.parse().expect("address"), NODE_PORT);
    let mut flows: Vec<TcpStream> = lan.client.enter(|| {
        (0..10)
            .map(|_| {
                TcpStream::connect_timeout(&frontend.into(), Duration::from_secs(5))
                    .expect("connect through the NodePort")
            })
            .collect()
    });
    for (i, flow) in flows.iter_mut().enumerate() {
        echo(flow).unwrap_or_else(|e| panic!("flow {i} before the restart: {e}"));
    }
    agent.stop();

    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node1",
        &[
            "--max-conntrack-entries",
            "65536",
            "--max-conntrack-new-entries",
            "4096",
        ],
    );
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
    assert!(
        log.contains("carried over"),
        "the agent says the entries were carried over:\n{log}"
    );
}
