//! Manifests written the way operators write them: `cmd > file` truncates the file at once
//! and writes it when `cmd` has output, and tools that rewrite a file every few milliseconds.
//! A half-written file is never applied, and a stream of edits cannot hold other changes
//! back.
use std::{
    fs::File,
    io::Write as _,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use socklb_tests::{
    Agent, ManifestDir, NamedServer, ProbeRun, Sandbox, assert_logged, eventually, service_yaml,
    web_slice,
};

fn vip(net: u8) -> SocketAddr {
    SocketAddr::from(([10, 96, net, 10], 80))
}

/// Two servers, node-a, the web Service and its slice with endpoint 1; the agent started
/// on them.
fn cluster(sandbox: &Sandbox, net: u8) -> (Vec<NamedServer>, ManifestDir, Agent) {
    let servers = NamedServer::numbered(net, 2);
    let manifests = ManifestDir::web_with_one_endpoint(sandbox, net, &vip(net).ip().to_string());
    let agent = Agent::start(sandbox, &manifests.path, "node-a", &[]);
    wait_for(sandbox, net, 1, 20, "at start");
    (servers, manifests, agent)
}

/// Waits until only endpoint `endpoint` answers the VIP, failing after `seconds`.
fn wait_for(sandbox: &Sandbox, net: u8, endpoint: u8, seconds: u64, what: &str) {
    let expected = format!("127.0.{net}.{endpoint}");
    let within = Duration::from_secs(seconds);
    eventually(
        &format!("{what}: {expected} answers"),
        within,
        || match sandbox.answering(vip(net), 10) {
            got if got.len() == 1 && got.contains(&expected) => Ok(()),
            got => Err(format!("got {got:?}")),
        },
    );
}

/// Two clients that connect to the VIP of net `net` all along, 5 ms apart.
fn looping_clients(sandbox: &Sandbox, net: u8) -> Vec<ProbeRun> {
    (0..2)
        .map(|_| sandbox.spawn_probe("tcp", vip(net), u32::MAX, 5))
        .collect()
}

/// No connect of `clients` failed while the manifests were written `how`, and the agent's
/// log says, naming web.yaml, `held_back` (that it held the file back).
fn no_connect_failed_and_logged(clients: Vec<ProbeRun>, agent: Agent, how: &str, held_back: &str) {
    let attempts: Vec<_> = clients.into_iter().flat_map(|c| c.stop()).collect();
    socklb_tests::assert_all_connected(&attempts, &format!("while {how}"));
    assert_logged(
        &agent.stop(),
        &[held_back, "web.yaml"],
        "one line says that the manifest is held back",
    );
}

/// `cmd > file` with a slow `cmd`: truncated, nothing for 500 ms, then written and closed.
fn write_slowly(path: &std::path::Path, text: &str) {
    let mut file = File::create(path).expect("truncate the manifest");
    std::thread::sleep(Duration::from_millis(500));
    file.write_all(text.as_bytes()).expect("write the manifest");
}

#[test]
fn a_manifest_written_slowly_is_applied_once_written_and_never_half() {
    let net = 40;
    let sandbox = Sandbox::new("slow-manifest");
    let (_servers, manifests, agent) = cluster(&sandbox, net);
    let clients = looping_clients(&sandbox, net);

    // The Service rewritten unchanged, then the slice rewritten with another endpoint.
    let service = service_yaml("web", &vip(net).ip().to_string(), 80, "");
    write_slowly(&manifests.path.join("web.yaml"), &service);
    write_slowly(&manifests.path.join("slice.yaml"), &web_slice(net, 2));
    wait_for(&sandbox, net, 2, 5, "the slowly written slice");
    let how = "manifests were written slowly";
    no_connect_failed_and_logged(clients, agent, how, "manifest is being written");
}

#[test]
fn edits_every_2ms_do_not_hold_other_changes_back() {
    let net = 41;
    let sandbox = Sandbox::new("manifest-debounce");
    let (_servers, manifests, agent) = cluster(&sandbox, net);

    // Other tools rewrite their own manifests every 2 ms (edits every 30 ms once held
    // syncing off for seconds; faster and two of them, so that the burst never pauses
    // for a debounce even on a loaded machine), for as long as the test runs.
    let stop = Arc::new(AtomicBool::new(false));
    let noise: Vec<_> = (0..2)
        .map(|writer| {
            let stop = stop.clone();
            let path = manifests.path.join(format!("noise-{writer}.yaml"));
            std::thread::spawn(move || {
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let text = format!("kind: ConfigMap\nmetadata: {{name: noise-{round}}}\n");
                    std::fs::write(&path, text).expect("write a noise manifest");
                    round += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        })
        .collect();
    /// Stops the noise even when the test fails.
    struct Stop(Arc<AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stopping = Stop(stop);
    // The change comes amid the edits, not before the first ones (part of the fault).
    std::thread::sleep(Duration::from_millis(300));
    manifests.write("slice.yaml", &web_slice(net, 2));
    wait_for(
        &sandbox,
        net,
        2,
        1,
        "a change while other files are rewritten every 2 ms",
    );
    drop(stopping);
    for writer in noise {
        writer.join().expect("a noise writer");
    }
    agent.stop();
}

/// A manifest written with several opens, as a script does: `cmd1 > web.yaml` writes the
/// Service and closes the file, `cmd2 >> web.yaml` appends its slice a moment later. In
/// between, the file is closed and parses, but without the slice: applied, it would refuse
/// every connection until the second part came. It is read once it has not changed for a
/// short while, and no connection fails.
#[test]
fn a_manifest_written_with_several_opens_is_applied_whole() {
    let net = 42;
    let sandbox = Sandbox::new("manifest-two-opens");
    let _servers = NamedServer::numbered(net, 1);
    let manifests = ManifestDir::node_a(&sandbox, net);
    let service = service_yaml("web", &vip(net).ip().to_string(), 80, "");
    let whole = format!("{service}---\n{}", web_slice(net, 1));
    manifests.write("web.yaml", &whole);
    let agent = Agent::start(&sandbox, &manifests.path, "node-a", &[]);
    wait_for(&sandbox, net, 1, 20, "at start");
    let clients = looping_clients(&sandbox, net);

    let path = manifests.path.join("web.yaml");
    // `cmd1 > web.yaml`: the Service alone, closed.
    std::fs::write(&path, format!("{service}---\n")).expect("write the first part");
    // The gap between the two commands (part of the fault, not a wait for a condition).
    std::thread::sleep(Duration::from_millis(700));
    // `cmd2 >> web.yaml`: the slice appended, closed.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("open for appending");
    file.write_all(web_slice(net, 1).as_bytes())
        .expect("append the second part");
    drop(file);
    wait_for(&sandbox, net, 1, 5, "once written whole");
    let how = "the manifest was written in two parts";
    no_connect_failed_and_logged(clients, agent, how, "manifest shorter than what is applied");
}
