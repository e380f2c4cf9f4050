//! Backend sets that shrink and grow while clients connect: no connect fails or proceeds
//! untranslated to the VIP, no connect that starts after a removal was synced reaches the
//! removed backend, and the programs count no error. IPv4 and IPv6 Services churn together,
//! each family's clients on its own VIPs.
//!
//! The race this guards against (a connect that read a count just before it was lowered
//! finding its slot deleted) has a window of about a microsecond between two map writes,
//! too short for any test to hit on demand; the writer's property test
//! (`the_writer_never_leaves_a_hole_for_a_lookup_in_flight`) is what proves the order.
use std::time::{Duration, Instant};

use socklb_agent::dataplane::{Desired, Frontend, Protocol};
use socklb_tests::{Attempt, NamedServer, Sandbox, SetChanges, addr, family::Family, spec};

/// The backend sets, by server index: 5 -> 3 -> 5 -> 1 -> 5, the 3 and the 1 taken from
/// the middle and the end so that slots move as well as vanish.
const SETS: [&[usize]; 4] = [&[0, 1, 2, 3, 4], &[0, 2, 4], &[0, 1, 2, 3, 4], &[3]];
/// How long the sets change, and how often.
const CHURN: Duration = Duration::from_secs(20);
const PERIOD: Duration = Duration::from_millis(50);

fn members(servers: &[NamedServer], set: usize) -> impl Iterator<Item = &NamedServer> {
    SETS[set].iter().map(move |i| &servers[*i])
}

/// One family's TCP and UDP Services and their five servers each.
struct Side {
    tcp: Frontend,
    udp: Frontend,
    tcp_servers: Vec<NamedServer>,
    udp_servers: Vec<NamedServer>,
}

#[test]
fn shrinking_and_growing_backend_sets_lose_no_connect() {
    let sandbox = Sandbox::new("shrink");
    let sides = [Family::V4, Family::V6].map(|family| Side {
        tcp: family.frontend(70, 80, Protocol::Tcp),
        udp: family.frontend(70, 53, Protocol::Udp),
        tcp_servers: family.tcp_servers(&sandbox, 20, 5, 8080),
        udp_servers: family.udp_servers(&sandbox, 20, 5, 5353),
    });
    let desired_for = |set: usize| {
        let mut desired = Desired::default();
        for side in &sides {
            desired.insert(side.tcp, spec(members(&side.tcp_servers, set)));
            desired.insert(side.udp, spec(members(&side.udp_servers, set)));
        }
        desired
    };
    let mut dataplane = sandbox.programmed(&desired_for(0));

    // Per family, two looping TCP clients and one connected-UDP client, 1 ms between
    // attempts, for a second longer than the churn.
    let probe_for = CHURN + Duration::from_secs(1);
    let mut clients: Vec<_> = sides
        .iter()
        .flat_map(|side| {
            [
                ("tcp", "tcp", side.tcp),
                ("tcp", "tcp", side.tcp),
                ("udp", "udp-connected", side.udp),
            ]
        })
        .map(|(kind, mode, vip)| {
            (
                kind,
                sandbox.spawn_probe_for(mode, addr(&vip), probe_for, 1),
            )
        })
        .collect();
    let mut changes = SetChanges::new(0);
    let started = Instant::now();
    let mut step = 0;
    while started.elapsed() < CHURN {
        std::thread::sleep(PERIOD);
        step += 1;
        let set = step % SETS.len();
        changes.change(set, || {
            let report = dataplane.apply(&desired_for(set)).expect("apply");
            assert!(report.rejected.is_empty(), "{:?}", report.rejected);
        });
        for (kind, client) in &mut clients {
            assert!(client.running(), "a {kind} client stopped during the churn");
        }
    }
    let attempts: Vec<(&str, Attempt)> = clients
        .into_iter()
        .flat_map(|(kind, client)| client.wait().into_iter().map(move |a| (kind, a)))
        .collect();

    let failures: Vec<_> = attempts.iter().filter(|(_, a)| a.error.is_some()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} attempts failed over {} set changes: {:?}",
        failures.len(),
        attempts.len(),
        changes.len(),
        &failures[..failures.len().min(5)]
    );
    let mut checked = 0;
    for (kind, attempt) in &attempts {
        let possible = changes.possible(attempt);
        let reply = attempt.reply.as_deref().unwrap_or_default();
        // Every answer comes from a server of a set that may have been in force (so never
        // from the VIP untranslated), and an attempt that ran while only one set was in
        // force reached that set.
        // Servers are b1..b5 (TCP) and u1..u5 (UDP): the number names the index.
        let server = reply.get(1..).and_then(|n| n.parse::<usize>().ok());
        assert!(
            possible
                .iter()
                .any(|set| SETS[*set].iter().any(|i| server == Some(i + 1))),
            "a {kind} attempt while sets {possible:?} were in force got {reply:?}: {attempt:?}"
        );
        checked += usize::from(possible.len() == 1);
    }
    assert!(
        checked > attempts.len() / 2,
        "only {checked} of {} attempts ran while one set was in force",
        attempts.len()
    );
    let counters = dataplane.counters().expect("counters");
    assert_eq!(counters.errors, 0, "{counters:?}");
    assert!(counters.translated >= attempts.len() as u64, "{counters:?}");
}
