//! The Kubernetes API source: list then watch Services, EndpointSlices and Nodes, the way
//! kube-proxy does (and this node's Pods and the Namespaces, for the pod paths), and turn
//! what the watchers see into [`Event`]s.
//!
//! kube-rs's watcher does the protocol work (relist on 410 Gone, re-watch from the last
//! resource version, bookmarks); this module only chooses what to request, waits between
//! attempts as [`super::retry`] says, logs what is retried and merges the two node
//! feeds into one node stream.

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Debug,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use futures::{FutureExt as _, StreamExt as _, stream::BoxStream};
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Node, Pod, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Config, Resource,
    config::{InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError},
    core::PartialObjectMeta,
    runtime::watcher,
};
use serde::de::DeserializeOwned;
use tokio::{sync::mpsc, task::JoinSet};
use tracing::{debug, info, warn};

use super::{
    Event, Kind, Object,
    retry::{self, Failure, Retry},
};

/// Skips what kube-proxy skips: services another proxy implements, and headless services
/// (the endpoints controller labels their slices).
const PROXIED: &str = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// Why the source could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum KubeSourceError {
    /// The kubeconfig the user named is unreadable or invalid.
    #[error(
        "cannot use the kubeconfig {path}: {source}: check the file, or run the agent in a pod \
         with a service account and no kubeconfig"
    )]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    /// Neither a service account nor a default kubeconfig is there.
    #[error(
        "no Kubernetes API to connect to: not running in a pod ({in_cluster}) and no usable \
         kubeconfig: run the agent in a pod with a service account, or point KUBECONFIG or \
         --kubeconfig at a kubeconfig file"
    )]
    NoConfig {
        in_cluster: InClusterError,
        #[source]
        kubeconfig: KubeconfigError,
    },
    /// The configuration is unusable (e.g. a bad certificate).
    #[error("cannot build a Kubernetes client from the configuration: {0}")]
    Client(#[source] kube::Error),
    /// kube-rs watchers never end; this guards that invariant rather than spinning.
    #[error("the Kubernetes watch streams ended unexpectedly: restart the agent")]
    WatchEnded,
}

/// A Kubernetes client from the given kubeconfig; without one, from the pod's service account
/// (the agent normally runs as a DaemonSet pod), else from the default kubeconfig
/// (`KUBECONFIG`, `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeSourceError> {
    let options = KubeConfigOptions::default();
    let config = match kubeconfig {
        Some(path) => {
            let error = |source| KubeSourceError::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(error)?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(error)?
        }
        None => match Config::incluster() {
            Ok(config) => config,
            Err(in_cluster) => Config::from_kubeconfig(&options)
                .await
                .map_err(|kubeconfig| KubeSourceError::NoConfig {
                    in_cluster,
                    kubeconfig,
                })?,
        },
    };
    tracing::info!(api_server = %config.cluster_url, "reading the cluster from the API server");
    Client::try_from(config).map_err(KubeSourceError::Client)
}

/// Reads the cluster through the Kubernetes API, requesting only what socklb needs.
pub struct KubeSource {
    client: Client,
    node_name: String,
    retry_max: Duration,
}

impl KubeSource {
    /// `node_name` is this node: its full object is read (addresses, labels), the other
    /// nodes' metadata only (labels, for topology).
    pub fn new(client: Client, node_name: String) -> Self {
        Self {
            client,
            node_name,
            retry_max: retry::DEFAULT_MAX,
        }
    }

    /// The longest wait between two attempts of a watch after a failure (`--api-retry-max`).
    pub fn with_retry_max(mut self, max: Duration) -> Self {
        self.retry_max = max;
        self
    }

    /// Sends events until `events` is closed. Errors of the API (unreachable, restarted,
    /// refusing, expired resource versions) are logged and retried as [`retry`] says;
    /// meanwhile nothing is sent and the datapath keeps its state.
    pub async fn run(self, events: mpsc::Sender<Event>) -> Result<(), KubeSourceError> {
        // Dropped on return: the feeds' tasks go with it.
        let mut tasks = JoinSet::new();
        let mut feeds = spawn_feeds(self.feeds(), &mut tasks);
        let mut translator = Translator::default();
        let mut failing: HashMap<Feed, Outage> = HashMap::new();
        loop {
            let batch = tokio::select! {
                () = events.closed() => return Ok(()),
                next = feeds.recv() => next.ok_or(KubeSourceError::WatchEnded)?,
            };
            for (feed, result, wait) in batch {
                let change = match result {
                    Ok(change) => change,
                    Err(error) => {
                        log_retry(feed, &error, wait, &mut failing);
                        continue;
                    }
                };
                if !matches!(change, watcher::Event::Init)
                    && let Some(outage) = failing.remove(&feed)
                {
                    info!(
                        feed = feed.describe(),
                        failures = outage.failures,
                        since = ?outage.since.elapsed(),
                        "receiving again after failures"
                    );
                }
                if let Some(event) = translator.handle(feed, change)
                    && events.send(event).await.is_err()
                {
                    return Ok(());
                }
            }
        }
    }

    fn feeds(&self) -> Vec<FeedStream> {
        let proxied = watcher::Config::default().labels(PROXIED);
        let this_node = format!("metadata.name={}", self.node_name);
        let other_nodes = format!("metadata.name!={}", self.node_name);
        let client = &self.client;
        let retry = Retry::new(self.retry_max);
        vec![
            feed(
                Feed::Services,
                Api::<Service>::all(client.clone()),
                proxied.clone(),
                |s| Object::Service(Box::new(s)),
                retry.clone(),
            ),
            feed(
                Feed::EndpointSlices,
                Api::<EndpointSlice>::all(client.clone()),
                proxied,
                |s| Object::EndpointSlice(Box::new(s)),
                retry.clone(),
            ),
            feed(
                Feed::ThisNode,
                Api::<Node>::all(client.clone()),
                watcher::Config::default().fields(&this_node),
                |n| Object::Node(Box::new(n)),
                retry.clone(),
            ),
            // `PartialObjectMeta` makes kube-rs request metadata only (what `metadata_watcher`
            // did before kube-rs deprecated it for this).
            feed(
                Feed::OtherNodes,
                Api::<PartialObjectMeta<Node>>::all(client.clone()),
                watcher::Config::default().fields(&other_nodes),
                |n| metadata_node(n.metadata),
                retry.clone(),
            ),
            // This node's pods only, as the kubelet watches them: which path serves each.
            feed(
                Feed::Pods,
                Api::<Pod>::all(client.clone()),
                watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name)),
                |p| Object::Pod(Box::new(p)),
                retry.clone(),
            ),
            feed(
                Feed::Namespaces,
                Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
                watcher::Config::default(),
                |n| {
                    Object::Namespace(Box::new(Namespace {
                        metadata: n.metadata,
                        ..Namespace::default()
                    }))
                },
                retry,
            ),
        ]
    }
}

/// A feed that fails: since when, and how often, for the line logged when it recovers.
struct Outage {
    since: Instant,
    failures: u32,
    /// When a failure of the feed was last logged as a warning.
    warned: Instant,
}

/// At most one warning per feed in this time; the other failures are debug lines.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// One of the watches the source runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Feed {
    Services,
    EndpointSlices,
    ThisNode,
    OtherNodes,
    Pods,
    Namespaces,
}

impl Feed {
    fn describe(self) -> &'static str {
        match self {
            Self::Services => "services",
            Self::EndpointSlices => "endpointslices",
            Self::ThisNode => "this node",
            Self::OtherNodes => "other nodes (metadata)",
            Self::Pods => "this node's pods",
            Self::Namespaces => "namespaces (metadata)",
        }
    }
}

/// A feed's result, an error with the wait before the next attempt.
type FeedItem = (
    Feed,
    Result<watcher::Event<Object>, watcher::Error>,
    Option<Duration>,
);

/// A feed's results.
type FeedStream = BoxStream<'static, FeedItem>;

/// Batches of results in flight from the feeds' tasks to the source.
const FEED_QUEUE: usize = 64;

/// At most this many results go in one batch.
const FEED_BATCH: usize = 256;

/// Polls each feed on a task of its own (in `tasks`), its results sent on in order: the
/// JSON of the first lists is decoded where it is polled, and one task polling every feed
/// decoded 100,000 Services and their EndpointSlices on one core, one after the other.
/// What a feed has ready goes in one batch: a send per object woke the source's task as
/// often, through a system call each time.
fn spawn_feeds(feeds: Vec<FeedStream>, tasks: &mut JoinSet<()>) -> mpsc::Receiver<Vec<FeedItem>> {
    let (sender, receiver) = mpsc::channel(FEED_QUEUE);
    for mut feed in feeds {
        let sender = sender.clone();
        tasks.spawn(async move {
            while let Some(item) = feed.next().await {
                let mut batch = vec![item];
                while batch.len() < FEED_BATCH
                    && let Some(Some(item)) = feed.next().now_or_never()
                {
                    batch.push(item);
                }
                if sender.send(batch).await.is_err() {
                    return;
                }
            }
        });
    }
    receiver
}

/// A watcher that waits after an error as [`Retry`] says, its objects already wrapped in
/// [`Object`].
///
/// The first list is streamed from the watch cache (a watch with `sendInitialEvents`, the
/// WatchList feature): objects arrive one at a time, where a list of 100,000 Services
/// would be one response decoded whole. A server that refuses it (WatchList off, as in
/// Kubernetes 1.33) is listed from its watch cache instead (`resourceVersion=0`), as
/// client-go's informers do. A relist after 410 Gone pages quorum lists, so that it never
/// goes back before what the agent has seen (docs/operations.md, "The API server goes
/// away").
fn feed<K>(
    feed: Feed,
    api: Api<K>,
    config: watcher::Config,
    wrap: fn(K) -> Object,
    retry: Retry,
) -> FeedStream
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let start = move |config: watcher::Config| {
        watcher::watcher(api.clone(), config)
            .map(move |result| result.map(|event| map_event(event, wrap)))
            .boxed()
    };
    let from_cache = watcher::Config {
        // kube-rs asks for resourceVersion=0 only without a limit; the cache serves the
        // whole list in one answer anyway.
        page_size: None,
        ..config.clone()
    };
    let results = start(config.clone().streaming_lists());
    futures::stream::unfold(
        (results, retry, None, true),
        move |(mut results, mut retry, wait, mut streaming): (_, Retry, Option<Duration>, bool)| {
            let (start, config, from_cache) = (start.clone(), config.clone(), from_cache.clone());
            async move {
                if let Some(wait) = wait {
                    tokio::time::sleep(wait).await;
                }
                let mut result = results.next().await?;
                if streaming
                    && let Err(error) = &result
                    && refuses_streamed_lists(error)
                {
                    info!(
                        feed = feed.describe(),
                        %error,
                        "the API server does not stream lists (WatchList off): listing from its \
                         watch cache instead"
                    );
                    streaming = false;
                    results = start(from_cache.any_semantic());
                    result = results.next().await?;
                }
                if let Ok(watcher::Event::InitDone) = &result {
                    streaming = false;
                }
                if let Err(error) = &result
                    && failure(error) == Failure::Gone
                {
                    results = start(config);
                }
                let wait = match &result {
                    // Init is the watcher's own step before a list: nothing was received yet.
                    Ok(watcher::Event::Init) => None,
                    Ok(_) => {
                        retry.reset();
                        None
                    }
                    Err(error) => {
                        Some(retry.delay(failure(error), Instant::now(), fastrand::f64()))
                    }
                };
                Some(((feed, result, wait), (results, retry, wait, streaming)))
            }
        },
    )
    .boxed()
}

/// Whether the server refused a streamed list as one without the WatchList feature does
/// (422 Invalid, naming `sendInitialEvents`), rather than failing.
fn refuses_streamed_lists(error: &watcher::Error) -> bool {
    matches!(
        error,
        watcher::Error::WatchStartFailed(kube::Error::Api(status))
            if status.code == 422 || status.code == 400
    )
}

/// What kind of failure a watcher error is, for [`Retry`].
fn failure(error: &watcher::Error) -> Failure {
    let client = match error {
        watcher::Error::WatchError(status) if status.code == 410 => return Failure::Gone,
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => {
            return Failure::Refused;
        }
        watcher::Error::InitialListFailed(error)
        | watcher::Error::WatchStartFailed(error)
        | watcher::Error::WatchFailed(error) => error,
    };
    match client {
        kube::Error::Api(status) if status.code == 410 => Failure::Gone,
        kube::Error::Api(status) if status.code == 429 => Failure::Throttled,
        // An answer, even a refusal or one that does not decode: the server is there.
        kube::Error::Api(_) | kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => {
            Failure::Refused
        }
        _ => Failure::Unreachable,
    }
}

fn map_event<K>(event: watcher::Event<K>, wrap: fn(K) -> Object) -> watcher::Event<Object> {
    match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(wrap(object)),
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::Apply(object) => watcher::Event::Apply(wrap(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(wrap(object)),
    }
}

/// Another node as consumers see it: labels and the rest of its metadata, nothing else.
fn metadata_node(metadata: ObjectMeta) -> Object {
    Object::Node(Box::new(Node {
        metadata,
        spec: None,
        status: None,
    }))
}

/// A failure of a feed is a warning with what is retried and when, at most once per
/// [`WARN_EVERY`]; the others are debug lines (a 30 s outage would otherwise log dozens of
/// warnings). A watch that resumes sends nothing until something changes, so a quiet feed
/// counts as failing until then: the time limit, not its recovery, rearms the warning.
fn log_retry(
    feed: Feed,
    error: &watcher::Error,
    wait: Option<Duration>,
    failing: &mut HashMap<Feed, Outage>,
) {
    let now = Instant::now();
    let mut first = false;
    let outage = failing.entry(feed).or_insert_with(|| {
        first = true;
        Outage {
            since: now,
            failures: 0,
            warned: now,
        }
    });
    outage.failures += 1;
    if !first && now >= outage.warned + WARN_EVERY {
        first = true;
        outage.warned = now;
    }
    let feed = feed.describe();
    let retry_in = wait.unwrap_or_default();
    let what = match error {
        watcher::Error::InitialListFailed(_) => "list failed; listing again",
        watcher::Error::WatchStartFailed(_) => "watch failed to start; starting it again",
        watcher::Error::WatchError(status) if status.code == 410 => {
            "resource version expired (410 Gone); relisting"
        }
        watcher::Error::WatchError(_) => "API server reported a watch error; watching on",
        watcher::Error::WatchFailed(_) => {
            "watch stream failed; watching again from the last resource version"
        }
        watcher::Error::NoResourceVersion => "object without resource version; relisting",
    };
    // The whole chain: kube's own text stops at "client error (Connect)".
    let error = crate::error_chain(error);
    if first {
        warn!(feed, %error, ?retry_in, "{what}; the datapath keeps its state meanwhile");
    } else {
        debug!(feed, %error, ?retry_in, failures = outage.failures, "{what}");
    }
}

/// Turns the feeds' watcher events into [`Event`]s. Pure: no I/O, so it is unit tested.
#[derive(Default)]
struct Translator {
    /// Objects of each feed's list in progress, sent as one Reset when the list is done
    /// (the small kinds; Services and EndpointSlices are streamed).
    listing: HashMap<Feed, Vec<Object>>,
    nodes: NodeCache,
}

/// A watcher event once a list in progress is collected.
enum Change {
    Listed(Vec<Object>),
    Applied(Object),
    Deleted(Object),
}

impl Translator {
    fn handle(&mut self, feed: Feed, change: watcher::Event<Object>) -> Option<Event> {
        let streamed = match feed {
            Feed::Services => Some(Kind::Service),
            Feed::EndpointSlices => Some(Kind::EndpointSlice),
            _ => None,
        };
        if let Some(kind) = streamed {
            // Each object on to the state as it comes: a list of 100,000 Services with
            // their slices would take hundreds of megabytes held at once.
            return Some(match change {
                watcher::Event::Init => Event::Listing(kind),
                watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                    Event::Applied(object)
                }
                watcher::Event::InitDone => Event::Listed(kind),
                watcher::Event::Delete(object) => Event::Deleted(object),
            });
        }
        let change = self.collect(feed, change)?;
        let kind = match feed {
            Feed::Services => Kind::Service,
            Feed::EndpointSlices => Kind::EndpointSlice,
            Feed::Pods => Kind::Pod,
            Feed::Namespaces => Kind::Namespace,
            Feed::ThisNode | Feed::OtherNodes => {
                let part = usize::from(feed == Feed::OtherNodes);
                return match change {
                    Change::Listed(objects) => self.nodes.reset(part, objects),
                    Change::Applied(object) => self.nodes.apply(part, object),
                    Change::Deleted(object) => self.nodes.delete(part, object),
                };
            }
        };
        Some(match change {
            Change::Listed(objects) => {
                debug!(?kind, count = objects.len(), "listed");
                Event::Reset(kind, objects)
            }
            Change::Applied(object) => Event::Applied(object),
            Change::Deleted(object) => Event::Deleted(object),
        })
    }

    /// Gathers a (re)list's objects until it is done; passes other events through.
    fn collect(&mut self, feed: Feed, change: watcher::Event<Object>) -> Option<Change> {
        match change {
            watcher::Event::Init => {
                self.listing.remove(&feed);
                None
            }
            watcher::Event::InitApply(object) => {
                self.listing.entry(feed).or_default().push(object);
                None
            }
            watcher::Event::InitDone => Some(Change::Listed(
                self.listing.remove(&feed).unwrap_or_default(),
            )),
            watcher::Event::Apply(object) => Some(Change::Applied(object)),
            watcher::Event::Delete(object) => Some(Change::Deleted(object)),
        }
    }
}

/// The two node feeds (this node in full, the others' metadata), merged so that consumers
/// see one node stream whose Reset is always the complete node set.
#[derive(Default)]
struct NodeCache {
    /// By name; part 0 is this node's feed, part 1 the other nodes' feed.
    parts: [BTreeMap<String, Object>; 2],
    listed: [bool; 2],
}

impl NodeCache {
    /// Nothing is sent until both feeds have listed: a Reset of half the nodes would tell
    /// consumers that the other half is gone.
    fn complete(&self) -> bool {
        self.listed.iter().all(|listed| *listed)
    }

    fn reset(&mut self, part: usize, objects: Vec<Object>) -> Option<Event> {
        self.parts[part] = objects
            .into_iter()
            .map(|object| (name(&object).to_owned(), object))
            .collect();
        self.listed[part] = true;
        if !self.complete() {
            return None;
        }
        let nodes: Vec<Object> = self
            .parts
            .iter()
            .flat_map(|p| p.values())
            .cloned()
            .collect();
        debug!(count = nodes.len(), "listed nodes");
        Some(Event::Reset(Kind::Node, nodes))
    }

    fn apply(&mut self, part: usize, object: Object) -> Option<Event> {
        self.parts[part].insert(name(&object).to_owned(), object.clone());
        self.complete().then_some(Event::Applied(object))
    }

    fn delete(&mut self, part: usize, object: Object) -> Option<Event> {
        self.parts[part].remove(name(&object));
        self.complete().then_some(Event::Deleted(object))
    }
}

fn name(object: &Object) -> &str {
    object.metadata().name.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NodeStatus;

    use super::*;

    fn node(name: &str, full: bool) -> Object {
        Object::Node(Box::new(Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: full.then(NodeStatus::default),
        }))
    }

    fn service(name: &str) -> Object {
        Object::Service(Box::new(Service {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..Service::default()
        }))
    }

    fn list(t: &mut Translator, feed: Feed, objects: Vec<Object>) -> Option<Event> {
        assert_eq!(t.handle(feed, watcher::Event::Init), None);
        for object in objects {
            assert_eq!(t.handle(feed, watcher::Event::InitApply(object)), None);
        }
        t.handle(feed, watcher::Event::InitDone)
    }

    #[tokio::test]
    async fn a_client_comes_from_the_given_kubeconfig() {
        let path = std::env::temp_dir().join(format!("socklb-kubeconfig-{}", std::process::id()));
        let kubeconfig = "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
            clusters: [{name: k, cluster: {server: 'http://127.0.0.1:6443'}}]\n\
            contexts: [{name: c, context: {cluster: k, user: u}}]\n\
            users: [{name: u, user: {}}]\n";
        std::fs::write(&path, kubeconfig).expect("write the kubeconfig");
        let result = client(Some(&path)).await;
        std::fs::remove_file(&path).expect("remove the kubeconfig");
        result.expect("a client from the kubeconfig");
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_is_named_in_the_error() {
        let path = Path::new("/nonexistent/socklb/kubeconfig");
        let Err(error) = client(Some(path)).await else {
            panic!("a client from a kubeconfig that does not exist");
        };
        assert!(
            error.to_string().contains("/nonexistent/socklb/kubeconfig"),
            "{error}"
        );
    }

    #[test]
    fn services_and_slices_are_listed_object_by_object() {
        let mut t = Translator::default();
        let mut feed = |change| t.handle(Feed::Services, change);
        assert_eq!(
            feed(watcher::Event::Init),
            Some(Event::Listing(Kind::Service))
        );
        assert_eq!(
            feed(watcher::Event::InitApply(service("a"))),
            Some(Event::Applied(service("a")))
        );
        assert_eq!(
            feed(watcher::Event::InitDone),
            Some(Event::Listed(Kind::Service))
        );
        let empty = [watcher::Event::Init, watcher::Event::InitDone]
            .map(|change| t.handle(Feed::EndpointSlices, change));
        assert_eq!(
            empty,
            [
                Some(Event::Listing(Kind::EndpointSlice)),
                Some(Event::Listed(Kind::EndpointSlice))
            ]
        );
    }

    #[test]
    fn a_list_of_the_small_kinds_is_one_reset_and_a_relist_replaces_it() {
        let mut t = Translator::default();
        let first = list(&mut t, Feed::Namespaces, vec![service("a"), service("b")]);
        assert_eq!(
            first,
            Some(Event::Reset(
                Kind::Namespace,
                vec![service("a"), service("b")]
            ))
        );
        // A relist interrupted by another Init starts over.
        t.handle(Feed::Namespaces, watcher::Event::Init);
        t.handle(Feed::Namespaces, watcher::Event::InitApply(service("a")));
        let second = list(&mut t, Feed::Namespaces, vec![service("c")]);
        assert_eq!(
            second,
            Some(Event::Reset(Kind::Namespace, vec![service("c")]))
        );
    }

    #[test]
    fn applies_and_deletes_pass_through() {
        let mut t = Translator::default();
        let applied = t.handle(Feed::Services, watcher::Event::Apply(service("a")));
        assert_eq!(applied, Some(Event::Applied(service("a"))));
        let deleted = t.handle(Feed::Services, watcher::Event::Delete(service("a")));
        assert_eq!(deleted, Some(Event::Deleted(service("a"))));
    }

    #[test]
    fn nodes_wait_for_both_feeds_then_reset_with_all_nodes() {
        let mut t = Translator::default();
        assert_eq!(list(&mut t, Feed::OtherNodes, vec![node("b", false)]), None);
        // Changes before the first complete Reset only update the cache.
        let early = t.handle(Feed::OtherNodes, watcher::Event::Apply(node("c", false)));
        assert_eq!(early, None);
        let reset = list(&mut t, Feed::ThisNode, vec![node("a", true)]);
        let all = vec![node("a", true), node("b", false), node("c", false)];
        assert_eq!(reset, Some(Event::Reset(Kind::Node, all)));
    }

    #[test]
    fn a_relist_of_one_node_feed_resets_with_the_other_feeds_nodes() {
        let mut t = Translator::default();
        list(&mut t, Feed::ThisNode, vec![node("a", true)]);
        list(&mut t, Feed::OtherNodes, vec![node("b", false)]);
        let applied = t.handle(Feed::OtherNodes, watcher::Event::Apply(node("c", false)));
        assert_eq!(applied, Some(Event::Applied(node("c", false))));
        let deleted = t.handle(Feed::OtherNodes, watcher::Event::Delete(node("b", false)));
        assert_eq!(deleted, Some(Event::Deleted(node("b", false))));
        let relisted = list(&mut t, Feed::ThisNode, vec![node("a", true)]);
        let all = vec![node("a", true), node("c", false)];
        assert_eq!(relisted, Some(Event::Reset(Kind::Node, all)));
        let other_relist = list(&mut t, Feed::OtherNodes, vec![]);
        assert_eq!(
            other_relist,
            Some(Event::Reset(Kind::Node, vec![node("a", true)]))
        );
    }
}
