use std::collections::HashMap;

use futures::StreamExt as _;
use serde_json::{Value, json};

use super::{
    request::{collection_of, parse_query},
    selector::Filter,
    wire::event_line,
    *,
};

fn object(namespace: &str, name: &str, labels: Value) -> Value {
    json!({"metadata": {"namespace": namespace, "name": name, "labels": labels}})
}

fn filter(labels: &str, fields: &str) -> Filter {
    let query = HashMap::from([
        ("labelSelector".to_owned(), labels.to_owned()),
        ("fieldSelector".to_owned(), fields.to_owned()),
    ]);
    Filter::parse(&query).expect("valid selectors")
}

/// kube-rs decodes a watch event without buffering it only when `type` comes first.
#[test]
fn watch_events_name_their_type_before_their_object() {
    let object = object("default", "web", json!({"app": "web"}));
    let line = event_line("ADDED", &object);
    assert!(line.starts_with(r#"{"type":"ADDED","object":{"#), "{line}");
    let event: kube::api::WatchEvent<Value> =
        serde_json::from_str(&line).expect("a watch event kube-rs reads");
    assert!(matches!(event, kube::api::WatchEvent::Added(read) if read == object));
}

#[test]
fn selectors_follow_kubernetes_rules() {
    let plain = object("default", "web", json!({"app": "web"}));
    let proxied = object(
        "default",
        "x",
        json!({"service.kubernetes.io/service-proxy-name": "p"}),
    );
    let rows = [
        ("", "", &plain, true),
        ("app", "", &plain, true),
        ("!app", "", &plain, false),
        ("app=web", "", &plain, true),
        ("app==web", "", &plain, true),
        ("app!=web", "", &plain, false),
        ("tier!=db", "", &plain, true),
        (
            "!service.kubernetes.io/service-proxy-name",
            "",
            &proxied,
            false,
        ),
        ("!a,!service.kubernetes.io/headless", "", &plain, true),
        ("", "metadata.name=web", &plain, true),
        ("", "metadata.name!=web", &plain, false),
        ("", "metadata.namespace=kube-system", &plain, false),
        // An object without the field (a Service has no spec.nodeName) does not match.
        ("", "spec.nodeName=node-a", &plain, false),
    ];
    for (labels, fields, object, expected) in rows {
        let matched = filter(labels, fields).matches(object);
        assert_eq!(matched, expected, "labels {labels:?} fields {fields:?}");
    }
}

#[test]
fn unsupported_selectors_are_refused() {
    for (labels, fields) in [
        ("app in (a,b)", ""),
        ("", "status.phase=Running"),
        ("", "x"),
    ] {
        let query = HashMap::from([
            ("labelSelector".to_owned(), labels.to_owned()),
            ("fieldSelector".to_owned(), fields.to_owned()),
        ]);
        assert!(Filter::parse(&query).is_err(), "{labels:?} {fields:?}");
    }
}

#[test]
fn queries_are_decoded() {
    let query = parse_query("labelSelector=%21a%2C%21b&fieldSelector=metadata.name%21%3Dn&x");
    assert_eq!(query["labelSelector"], "!a,!b");
    assert_eq!(query["fieldSelector"], "metadata.name!=n");
    assert_eq!(query["x"], "");
    assert_eq!(parse_query("y=a+b%zz%4")["y"], "a b%zz%4");
}

/// kube-rs's default watch timeout is longer than a test, so the source's tests do not
/// cover this one.
#[tokio::test]
async fn watches_end_after_timeout_seconds() {
    let server = FakeApiServer::start();
    let url = server.url().parse().expect("URL");
    let client = kube::Client::try_from(kube::Config::new(url)).expect("client");
    let api = kube::Api::<Service>::all(client);
    let params = kube::api::WatchParams::default().timeout(1);
    let stream = api.watch(&params, "1").await.expect("watch");
    let ended = tokio::time::timeout(Duration::from_secs(20), stream.count()).await;
    assert_eq!(
        ended.ok(),
        Some(0),
        "the watch did not end after timeoutSeconds"
    );
}

#[test]
fn namespaced_paths_name_their_collection() {
    let rows = [
        ("/api/v1/services", ("/api/v1/services", None)),
        (
            "/api/v1/namespaces/ns/services",
            ("/api/v1/services", Some("ns")),
        ),
        (
            "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices",
            ("/apis/discovery.k8s.io/v1/endpointslices", Some("ns")),
        ),
        ("/api/v1/namespaces", ("/api/v1/namespaces", None)),
        (
            "/api/v1/namespaces/ns/services/web",
            ("/api/v1/namespaces/ns/services/web", None),
        ),
    ];
    for (path, (collection, namespace)) in rows {
        let expected = (collection.to_owned(), namespace.map(str::to_owned));
        assert_eq!(collection_of(path), expected, "{path}");
    }
}
