//! The agent's `kube` source against the fake API server: what it requests, the events it
//! makes of lists and watches, and how it rides out broken watches, expired resource versions
//! and API server restarts. No root needed.
//!
//! Every wait has a timeout, so that a broken source fails a test rather than hanging it.
//! Events of different kinds come from different watches, so their relative order is free;
//! the tests compare sets where it is, and sequences only within one kind.
use std::{
    collections::{BTreeMap, HashMap},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use k8s_openapi::{
    api::{
        core::v1::{Node, NodeAddress, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec},
        discovery::v1::{Endpoint, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use socklb_agent::source::{Event, Kind, Object, kube::KubeSource};
use socklb_tests::fake_apiserver::FakeApiServer;
use tokio::sync::mpsc;

/// This node; node-b and node-c are the others.
const NODE: &str = "node-a";
const PROXIED: &str = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";
/// Long enough for the watcher's backoff after a few refused connections.
const WAIT: Duration = Duration::from_secs(30);

fn meta(namespace: Option<&str>, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        namespace: namespace.map(str::to_owned),
        name: Some(name.to_owned()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..ObjectMeta::default()
    }
}

fn service(name: &str, port: i32, labels: &[(&str, &str)]) -> Service {
    Service {
        metadata: meta(Some("default"), name, labels),
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.96.0.10".to_owned()),
            ports: Some(vec![ServicePort {
                port,
                protocol: Some("TCP".to_owned()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

fn slice(name: &str, service: &str, labels: &[(&str, &str)]) -> EndpointSlice {
    let mut labels = labels.to_vec();
    labels.push(("kubernetes.io/service-name", service));
    EndpointSlice {
        metadata: meta(Some("default"), name, &labels),
        address_type: "IPv4".to_owned(),
        endpoints: vec![Endpoint {
            addresses: vec!["10.244.0.5".to_owned()],
            node_name: Some(NODE.to_owned()),
            ..Endpoint::default()
        }],
        ports: None,
    }
}

fn node(name: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: meta(None, name, labels),
        spec: Some(NodeSpec {
            pod_cidr: Some("10.244.0.0/24".to_owned()),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".to_owned(),
                address: "192.168.1.10".to_owned(),
            }]),
            ..NodeStatus::default()
        }),
    }
}

/// A small cluster: one proxied service with a slice, services and a slice that socklb must
/// not see, and three nodes in two zones.
fn populated() -> FakeApiServer {
    let api = FakeApiServer::start();
    api.apply(&service("web", 80, &[("app", "web")]));
    api.apply(&service(
        "other-proxy",
        80,
        &[("service.kubernetes.io/service-proxy-name", "other")],
    ));
    api.apply(&service(
        "headless",
        80,
        &[("service.kubernetes.io/headless", "")],
    ));
    api.apply(&slice("web-1", "web", &[]));
    api.apply(&slice(
        "headless-1",
        "headless",
        &[("service.kubernetes.io/headless", "")],
    ));
    for (name, zone) in [(NODE, "z1"), ("node-b", "z1"), ("node-c", "z2")] {
        api.apply(&node(name, &[("topology.kubernetes.io/zone", zone)]));
    }
    api
}

/// Starts the source against `api`; it runs until the receiver is dropped. Lists sent
/// object by object (Services, EndpointSlices) come folded into one Reset each, as the
/// state applies them, so that the tests compare whole lists.
fn start_source(api: &FakeApiServer) -> mpsc::Receiver<Event> {
    let mut raw = start_raw_source(api);
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut listing: HashMap<Kind, Vec<Object>> = HashMap::new();
        while let Some(event) = raw.recv().await {
            let event = match event {
                Event::Listing(kind) => {
                    listing.insert(kind, Vec::new());
                    continue;
                }
                Event::Applied(object) if listing.contains_key(&object.kind()) => {
                    listing
                        .get_mut(&object.kind())
                        .expect("checked")
                        .push(object);
                    continue;
                }
                Event::Listed(kind) => {
                    Event::Reset(kind, listing.remove(&kind).expect("Listing before Listed"))
                }
                other => other,
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// The source's own events, lists object by object.
fn start_raw_source(api: &FakeApiServer) -> mpsc::Receiver<Event> {
    let url = api.url().parse().expect("fake API server URL");
    let client = kube::Client::try_from(kube::Config::new(url)).expect("kube client");
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        KubeSource::new(client, NODE.to_owned())
            .run(tx)
            .await
            .expect("the kube source failed");
    });
    rx
}

async fn next(events: &mut mpsc::Receiver<Event>) -> Event {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("no event from the source in time")
        .expect("the source stopped")
}

/// The next `n` events, described and sorted (they come from different watches).
async fn next_set(events: &mut mpsc::Receiver<Event>, n: usize) -> Vec<String> {
    let mut set = Vec::new();
    for _ in 0..n {
        set.push(describe(&next(events).await));
    }
    set.sort();
    set
}

/// The first events: exactly one Reset of each kind.
async fn initial(events: &mut mpsc::Receiver<Event>) -> HashMap<Kind, Vec<Object>> {
    let mut resets = HashMap::new();
    while resets.len() < FEEDS - 1 {
        match next(events).await {
            Event::Reset(kind, objects) => {
                let previous = resets.insert(kind, objects);
                assert!(previous.is_none(), "two initial Resets of {kind:?}");
            }
            other => panic!("expected the initial Resets, got {}", describe(&other)),
        }
    }
    resets
}

/// The source's watches: Services, EndpointSlices, this Node, the other Nodes (one Reset of
/// Nodes for both), this node's Pods and Namespaces.
const FEEDS: usize = 6;

/// Waits until the source watches all its feeds, so that a test breaks established watches.
async fn watching(api: &FakeApiServer) {
    let wait = async {
        while api.watch_count() < FEEDS {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(WAIT, wait)
        .await
        .unwrap_or_else(|_| panic!("the source opened {} of {FEEDS} watches", api.watch_count()));
}

/// The populated API server and the source on it, past its initial lists and watching all
/// its feeds.
async fn watching_source() -> (FakeApiServer, mpsc::Receiver<Event>) {
    let api = populated();
    let mut events = start_source(&api);
    initial(&mut events).await;
    watching(&api).await;
    (api, events)
}

/// Once the source watches every feed again, the next changes are all that comes: nothing
/// was left pending ([`expect_only_sentinels`]).
async fn settles(api: &FakeApiServer, events: &mut mpsc::Receiver<Event>) {
    watching(api).await;
    expect_only_sentinels(api, events).await;
}

/// Changes one object of every feed and expects exactly those changes as the next events:
/// anything else still pending (a stray Reset, an event for a bookmark) fails the test.
async fn expect_only_sentinels(api: &FakeApiServer, events: &mut mpsc::Receiver<Event>) {
    static ROUND: AtomicU32 = AtomicU32::new(0);
    let round = ROUND.fetch_add(1, Ordering::Relaxed).to_string();
    let mark = [("sentinel", round.as_str())];
    api.apply(&service(&format!("sentinel-{round}"), 80, &[]));
    api.apply(&slice(&format!("sentinel-{round}"), "web", &[]));
    api.apply(&node(&format!("sentinel-{round}"), &[]));
    api.apply(&node(NODE, &mark));
    let expected = vec![
        format!("Applied EndpointSlice default/sentinel-{round}"),
        "Applied Node node-a".to_owned(),
        format!("Applied Node sentinel-{round}"),
        format!("Applied Service default/sentinel-{round}"),
    ];
    assert_eq!(next_set(events, 4).await, expected);
}

/// Lists, streamed or not.
fn list_count(api: &FakeApiServer) -> usize {
    api.served()
        .iter()
        .filter(|request| !request.watch || request.send_initial_events)
        .count()
}

/// How each list of Services was asked for, in order: "streamed" (a watch that sends the
/// current objects first), "cache" (`resourceVersion=0`) or "quorum" (none).
fn service_lists(api: &FakeApiServer) -> Vec<&'static str> {
    api.served()
        .into_iter()
        .filter(|r| r.path == "/api/v1/services" && (!r.watch || r.send_initial_events))
        .map(
            |r| match (r.send_initial_events, r.resource_version.as_deref()) {
                (true, _) => "streamed",
                (false, Some("0")) => "cache",
                (false, _) => "quorum",
            },
        )
        .collect()
}

fn name(object: &Object) -> String {
    let metadata = object.metadata();
    let name = metadata.name.clone().unwrap_or_default();
    match &metadata.namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name,
    }
}

fn names(objects: &[Object]) -> Vec<String> {
    let mut names: Vec<String> = objects.iter().map(name).collect();
    names.sort();
    names
}

/// "Applied Service default/web", "Reset Node [node-a, node-b]": what assertions compare.
fn describe(event: &Event) -> String {
    match event {
        Event::Reset(kind, objects) => format!("Reset {kind:?} [{}]", names(objects).join(", ")),
        Event::Applied(object) => format!("Applied {:?} {}", object.kind(), name(object)),
        Event::Deleted(object) => format!("Deleted {:?} {}", object.kind(), name(object)),
        Event::Listing(kind) => format!("Listing {kind:?}"),
        Event::Listed(kind) => format!("Listed {kind:?}"),
    }
}

fn nodes_by_name(objects: &[Object]) -> BTreeMap<String, Node> {
    objects
        .iter()
        .map(|object| match object {
            Object::Node(node) => (name(object), (**node).clone()),
            other => panic!("a {:?} in the node stream", other.kind()),
        })
        .collect()
}

fn zone(node: &Node) -> Option<&str> {
    let labels = node.metadata.labels.as_ref()?;
    labels
        .get("topology.kubernetes.io/zone")
        .map(String::as_str)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_lists_give_one_reset_per_kind_without_what_kube_proxy_skips() {
    let api = populated();
    let mut events = start_source(&api);
    let resets = initial(&mut events).await;
    assert_eq!(names(&resets[&Kind::Service]), ["default/web"]);
    assert_eq!(names(&resets[&Kind::EndpointSlice]), ["default/web-1"]);
    let nodes = nodes_by_name(&resets[&Kind::Node]);
    assert_eq!(
        nodes.keys().collect::<Vec<_>>(),
        ["node-a", "node-b", "node-c"]
    );
    // This node in full: its addresses are needed.
    let this = &nodes[NODE];
    let addresses = this.status.as_ref().and_then(|s| s.addresses.as_ref());
    assert_eq!(addresses.map(Vec::len), Some(1), "this node without status");
    assert!(this.spec.is_some());
    // The others as metadata only, labels kept for topology.
    for other in ["node-b", "node-c"] {
        let node = &nodes[other];
        assert!(
            node.spec.is_none() && node.status.is_none(),
            "{other} in full"
        );
    }
    assert_eq!(zone(&nodes["node-c"]), Some("z2"));

    watching(&api).await;
    let served = api.served();
    for request in &served {
        match request.path.as_str() {
            "/api/v1/services" | "/apis/discovery.k8s.io/v1/endpointslices" => {
                assert_eq!(
                    request.label_selector.as_deref(),
                    Some(PROXIED),
                    "{request:?}"
                );
                assert!(!request.metadata_only, "{request:?}");
            }
            "/api/v1/nodes" => {
                let fields = request.field_selector.as_deref();
                let expected = if request.metadata_only {
                    "metadata.name!=node-a"
                } else {
                    "metadata.name=node-a"
                };
                assert_eq!(fields, Some(expected), "{request:?}");
            }
            // This node's pods only, in full (their annotations and addresses).
            "/api/v1/pods" => {
                let fields = request.field_selector.as_deref();
                assert_eq!(fields, Some("spec.nodeName=node-a"), "{request:?}");
                assert!(!request.metadata_only, "{request:?}");
            }
            // Their labels only.
            "/api/v1/namespaces" => assert!(request.metadata_only, "{request:?}"),
            other => panic!("unexpected request for {other}"),
        }
    }
    // Each feed's list is streamed by its watch, which goes on with the changes.
    let lists = served.iter().filter(|r| !r.watch).count();
    let streamed = served.iter().filter(|r| r.send_initial_events).count();
    let watches = served.iter().filter(|r| r.watch).count();
    assert_eq!((lists, streamed, watches), (0, FEEDS, FEEDS), "{served:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_stream_lists_is_listed_from_its_cache() {
    let api = populated();
    api.without_watch_list();
    let mut events = start_source(&api);
    let resets = initial(&mut events).await;
    assert_eq!(names(&resets[&Kind::Service]), ["default/web"]);
    assert_eq!(names(&resets[&Kind::EndpointSlice]), ["default/web-1"]);
    watching(&api).await;
    assert_eq!(service_lists(&api), ["streamed", "cache"]);
    // And it watches on from there.
    api.apply(&service("late", 80, &[]));
    assert_eq!(
        describe(&next(&mut events).await),
        "Applied Service default/late"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_slices_are_listed_object_by_object() {
    let api = populated();
    let mut events = start_raw_source(&api);
    // Each list's own events, in order (the feeds' lists interleave with each other).
    let mut by_kind: HashMap<Kind, Vec<String>> = HashMap::new();
    let done = |by_kind: &HashMap<Kind, Vec<String>>, kind| {
        by_kind
            .get(&kind)
            .is_some_and(|events| events.last().is_some_and(|e| e.starts_with("Listed")))
    };
    while !(done(&by_kind, Kind::Service) && done(&by_kind, Kind::EndpointSlice)) {
        let event = next(&mut events).await;
        let kind = match &event {
            Event::Listing(kind) | Event::Listed(kind) => *kind,
            Event::Applied(object) => object.kind(),
            Event::Reset(..) | Event::Deleted(_) => continue,
        };
        by_kind.entry(kind).or_default().push(describe(&event));
    }
    assert_eq!(
        by_kind[&Kind::Service],
        [
            "Listing Service",
            "Applied Service default/web",
            "Listed Service"
        ]
    );
    assert_eq!(
        by_kind[&Kind::EndpointSlice],
        [
            "Listing EndpointSlice",
            "Applied EndpointSlice default/web-1",
            "Listed EndpointSlice"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_applied_and_deleted_in_order() {
    let api = populated();
    let mut events = start_source(&api);
    initial(&mut events).await;

    api.apply(&service("new", 80, &[]));
    assert_eq!(
        describe(&next(&mut events).await),
        "Applied Service default/new"
    );
    api.apply(&service("new", 8080, &[]));
    match next(&mut events).await {
        Event::Applied(Object::Service(service)) => {
            let ports = service.spec.and_then(|spec| spec.ports).unwrap_or_default();
            assert_eq!(ports.first().map(|p| p.port), Some(8080));
        }
        other => panic!("expected the modified service, got {}", describe(&other)),
    }
    api.delete::<Service>(Some("default"), "new");
    assert_eq!(
        describe(&next(&mut events).await),
        "Deleted Service default/new"
    );

    api.apply(&slice("web-2", "web", &[]));
    assert_eq!(
        describe(&next(&mut events).await),
        "Applied EndpointSlice default/web-2"
    );
    api.delete::<EndpointSlice>(Some("default"), "web-1");
    assert_eq!(
        describe(&next(&mut events).await),
        "Deleted EndpointSlice default/web-1"
    );

    // Another node changes zone: its metadata arrives, nothing else.
    api.apply(&node("node-b", &[("topology.kubernetes.io/zone", "z2")]));
    match next(&mut events).await {
        Event::Applied(Object::Node(node)) => {
            assert_eq!(node.metadata.name.as_deref(), Some("node-b"));
            assert_eq!(zone(&node), Some("z2"));
            assert!(node.spec.is_none() && node.status.is_none());
        }
        other => panic!("expected node-b, got {}", describe(&other)),
    }
    // This node changes: it arrives in full.
    let mut this = node(NODE, &[("topology.kubernetes.io/zone", "z1")]);
    if let Some(status) = this.status.as_mut() {
        status.addresses = Some(vec![NodeAddress {
            type_: "InternalIP".to_owned(),
            address: "192.168.1.99".to_owned(),
        }]);
    }
    api.apply(&this);
    match next(&mut events).await {
        Event::Applied(Object::Node(node)) => {
            let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
            let address = addresses.first().map(|a| a.address.as_str());
            assert_eq!(address, Some("192.168.1.99"));
        }
        other => panic!("expected this node, got {}", describe(&other)),
    }
    api.delete::<Node>(None, "node-c");
    assert_eq!(describe(&next(&mut events).await), "Deleted Node node-c");
    expect_only_sentinels(&api, &mut events).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_of_another_proxy_never_appear() {
    let api = populated();
    let mut events = start_source(&api);
    initial(&mut events).await;
    let other = [("service.kubernetes.io/service-proxy-name", "other")];
    api.apply(&service("elsewhere", 80, &other));
    api.apply(&service("elsewhere", 81, &other));
    api.delete::<Service>(Some("default"), "elsewhere");
    api.apply(&slice(
        "headless-2",
        "headless",
        &[("service.kubernetes.io/headless", "")],
    ));
    // A service that becomes another proxy's leaves the watch: to socklb it is deleted.
    api.apply(&service("web", 80, &other));
    assert_eq!(
        describe(&next(&mut events).await),
        "Deleted Service default/web"
    );
    expect_only_sentinels(&api, &mut events).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_watches_resume_from_the_last_version_without_a_reset() {
    let (api, mut events) = watching_source().await;

    api.drop_watches();
    api.apply(&service("late", 80, &[]));
    api.delete::<EndpointSlice>(Some("default"), "web-1");
    let expected = [
        "Applied Service default/late",
        "Deleted EndpointSlice default/web-1",
    ];
    assert_eq!(next_set(&mut events, 2).await, expected);
    settles(&api, &mut events).await;
    assert_eq!(list_count(&api), FEEDS, "a resumed watch must not relist");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_versions_relist_and_reset_with_the_current_state() {
    let (api, mut events) = watching_source().await;

    // The slice watch sees this change; the others now watch from an older version.
    api.apply(&slice("web-2", "web", &[]));
    assert_eq!(
        describe(&next(&mut events).await),
        "Applied EndpointSlice default/web-2"
    );
    api.compact();
    api.drop_watches();

    // Services, both node feeds, pods and namespaces get 410 Gone and relist; each node
    // relist resets the whole node set.
    let expected = [
        "Reset Namespace []",
        "Reset Node [node-a, node-b, node-c]",
        "Reset Node [node-a, node-b, node-c]",
        "Reset Pod []",
        "Reset Service [default/web]",
    ];
    assert_eq!(next_set(&mut events, 5).await, expected);
    assert_eq!(api.expired_count(), 5);
    settles(&api, &mut events).await;

    // The first lists were streamed from the watch cache; the relists after 410 Gone are
    // quorum reads, which never go back before what was seen.
    assert_eq!(service_lists(&api), ["streamed", "quorum"], "service lists");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_api_server_replays_what_was_missed() {
    let (mut api, mut events) = watching_source().await;

    api.stop();
    api.apply(&service("late", 80, &[]));
    api.delete::<Node>(None, "node-c");
    // Long enough for the source to find the server down (it re-watches as soon as a stream
    // breaks) and back off; meanwhile it sends nothing.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(events.is_empty(), "events while the API server was down");
    api.restart();
    let expected = ["Applied Service default/late", "Deleted Node node-c"];
    assert_eq!(next_set(&mut events, 2).await, expected);
    settles(&api, &mut events).await;
    assert_eq!(list_count(&api), FEEDS, "a resumed watch must not relist");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_api_server_with_compacted_history_relists() {
    let (mut api, mut events) = watching_source().await;

    api.stop();
    api.apply(&service("late", 80, &[]));
    api.delete::<Service>(Some("default"), "web");
    api.delete::<EndpointSlice>(Some("default"), "web-1");
    api.delete::<Node>(None, "node-c");
    api.compact();
    api.restart();

    // A relist of every feed. The first node Reset may still hold node-c from the cache of
    // the other node feed, which has not relisted yet; the last one is the current node set.
    let mut resets: HashMap<Kind, Vec<Vec<String>>> = HashMap::new();
    for _ in 0..FEEDS {
        match next(&mut events).await {
            Event::Reset(kind, objects) => resets.entry(kind).or_default().push(names(&objects)),
            other => panic!("expected a Reset, got {}", describe(&other)),
        }
    }
    assert_eq!(resets[&Kind::Service], [["default/late"]]);
    assert_eq!(resets[&Kind::EndpointSlice], [Vec::<String>::new()]);
    let nodes = &resets[&Kind::Node];
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert_eq!(nodes[1], ["node-a", "node-b"]);
    assert_eq!(resets[&Kind::Pod], [Vec::<String>::new()]);
    assert_eq!(api.expired_count(), FEEDS);
    settles(&api, &mut events).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_produce_no_events() {
    let (api, mut events) = watching_source().await;
    assert_eq!(
        api.bookmark(),
        FEEDS,
        "the source asks for bookmarks on every watch"
    );
    expect_only_sentinels(&api, &mut events).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_lists_are_streamed_first_and_paged_after_a_410() {
    let api = populated();
    // Past kube-rs's page size of 500.
    for i in 0..520 {
        api.apply(&service(&format!("svc-{i:03}"), 80, &[]));
    }
    let mut events = start_source(&api);
    let resets = initial(&mut events).await;
    assert_eq!(resets[&Kind::Service].len(), 521);
    watching(&api).await;
    api.apply(&slice("web-2", "web", &[]));
    next(&mut events).await;
    api.compact();
    api.drop_watches();
    let relisted = loop {
        if let Event::Reset(Kind::Service, objects) = next(&mut events).await {
            break objects.len();
        }
    };
    assert_eq!(relisted, 521);
    assert_eq!(
        service_lists(&api),
        ["streamed", "quorum", "quorum"],
        "one streamed list, then a quorum relist in two pages"
    );
}

/// A dual-stack Service, an IPv6 EndpointSlice and this Node's IPv6 address come through
/// the source whole: the state selects each family's frontends with that family's backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_objects_come_through_whole() {
    let api = populated();
    let mut web = service("web", 80, &[("app", "web")]);
    if let Some(spec) = web.spec.as_mut() {
        spec.cluster_ips = Some(vec!["10.96.0.10".to_owned(), "fd00:96::10".to_owned()]);
        spec.ip_families = Some(vec!["IPv4".to_owned(), "IPv6".to_owned()]);
        spec.ip_family_policy = Some("RequireDualStack".to_owned());
    }
    api.apply(&web);
    let ports = Some(vec![k8s_openapi::api::discovery::v1::EndpointPort {
        port: Some(8080),
        protocol: Some("TCP".to_owned()),
        ..Default::default()
    }]);
    let mut v4 = slice("web-1", "web", &[]);
    v4.ports.clone_from(&ports);
    api.apply(&v4);
    let mut v6 = slice("web-v6", "web", &[]);
    v6.address_type = "IPv6".to_owned();
    v6.endpoints[0].addresses = vec!["fd00:244::5".to_owned()];
    v6.ports = ports;
    api.apply(&v6);
    let mut this = node(NODE, &[("topology.kubernetes.io/zone", "z1")]);
    if let Some(status) = this.status.as_mut() {
        status.addresses = Some(vec![
            NodeAddress {
                type_: "InternalIP".to_owned(),
                address: "192.168.1.10".to_owned(),
            },
            NodeAddress {
                type_: "InternalIP".to_owned(),
                address: "fd00:168::10".to_owned(),
            },
        ]);
    }
    api.apply(&this);

    let mut events = start_source(&api);
    let mut state = socklb_agent::state::ClusterState::new(NODE);
    for (kind, objects) in initial(&mut events).await {
        state.apply(Event::Reset(kind, objects));
    }
    assert_eq!(
        state.this_node().addresses,
        [
            "192.168.1.10".parse::<std::net::IpAddr>().expect("address"),
            "fd00:168::10".parse().expect("address"),
        ]
    );
    let name = socklb_agent::select::ServiceName {
        namespace: "default".to_owned(),
        name: "web".to_owned(),
    };
    let selection = state.select(&name).expect("web is served");
    let frontends: Vec<String> = selection
        .frontends
        .iter()
        .map(|f| {
            let backends: Vec<String> = f
                .spec
                .backends
                .iter()
                .map(|b| b.address.to_string())
                .collect();
            format!("{} {}", f.frontend.address, backends.join(" "))
        })
        .collect();
    assert_eq!(
        frontends,
        ["10.96.0.10 10.244.0.5", "fd00:96::10 fd00:244::5"]
    );
    assert!(selection.skipped.is_empty(), "{:?}", selection.skipped);
}
