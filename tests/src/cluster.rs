//! Kubernetes objects for tests that feed the agent's `kube` source through the fake API
//! server: Services, EndpointSlices and Nodes built with the k8s-openapi types, in the shape
//! the API server and the EndpointSlice controller give them (a Service has its cluster IP
//! and node ports allocated; an endpoint has its conditions and node).
use std::{collections::BTreeMap, net::Ipv4Addr};

use k8s_openapi::{
    api::{
        core::v1::{
            ClientIPConfig, Node, NodeAddress, NodeStatus, Service, ServicePort, ServiceSpec,
            SessionAffinityConfig,
        },
        discovery::v1::{
            Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForNode,
            ForZone,
        },
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

/// The namespace of every namespaced object the builders make.
pub const NAMESPACE: &str = "default";
/// The label kube-proxy (and socklb) reads a Node's zone from.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The label that links an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: namespace.map(str::to_owned),
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

/// A Service as the API server stores it after creation; change it with the methods, then
/// [`build`](Self::build).
#[derive(Clone, Debug)]
pub struct ServiceBuilder(Service);

/// A ClusterIP Service `name` with `cluster_ip` allocated and no ports yet.
pub fn service(name: &str, cluster_ip: Ipv4Addr) -> ServiceBuilder {
    ServiceBuilder(Service {
        metadata: meta(Some(NAMESPACE), name),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            cluster_ip: Some(cluster_ip.to_string()),
            cluster_ips: Some(vec![cluster_ip.to_string()]),
            session_affinity: Some("None".to_owned()),
            internal_traffic_policy: Some("Cluster".to_owned()),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// A Service of type ExternalName (no cluster IP, no ports), as the API server keeps it.
pub fn external_name_service(name: &str, external_name: &str) -> Service {
    Service {
        metadata: meta(Some(NAMESPACE), name),
        spec: Some(ServiceSpec {
            type_: Some("ExternalName".to_owned()),
            external_name: Some(external_name.to_owned()),
            session_affinity: Some("None".to_owned()),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

impl ServiceBuilder {
    fn spec(&mut self) -> &mut ServiceSpec {
        self.0.spec.get_or_insert_with(ServiceSpec::default)
    }

    /// A port forwarded to the endpoints' port of the same name and protocol.
    pub fn port(mut self, name: &str, port: u16, protocol: &str) -> Self {
        self.spec()
            .ports
            .get_or_insert_with(Vec::new)
            .push(ServicePort {
                name: Some(name.to_owned()),
                port: i32::from(port),
                protocol: Some(protocol.to_owned()),
                ..ServicePort::default()
            });
        self
    }

    /// A port with its allocated NodePort; makes the Service a NodePort Service.
    pub fn node_port(mut self, name: &str, port: u16, protocol: &str, node_port: u16) -> Self {
        self = self.port(name, port, protocol);
        let spec = self.spec();
        spec.type_ = Some("NodePort".to_owned());
        spec.external_traffic_policy
            .get_or_insert_with(|| "Cluster".to_owned());
        if let Some(last) = spec.ports.as_mut().and_then(|ports| ports.last_mut()) {
            last.node_port = Some(i32::from(node_port));
        }
        self
    }

    /// Makes a NodePort Service a LoadBalancer, with the healthCheckNodePort the API server
    /// allocates for `externalTrafficPolicy: Local`.
    pub fn load_balancer(mut self, health_check_node_port: Option<u16>) -> Self {
        let spec = self.spec();
        spec.type_ = Some("LoadBalancer".to_owned());
        spec.health_check_node_port = health_check_node_port.map(i32::from);
        self
    }

    /// `sessionAffinity: ClientIP` with the timeout (the API server's default is 10,800 s).
    pub fn client_ip_affinity(mut self, timeout_seconds: i32) -> Self {
        let spec = self.spec();
        spec.session_affinity = Some("ClientIP".to_owned());
        spec.session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(timeout_seconds),
            }),
        });
        self
    }

    pub fn internal_traffic_policy(mut self, policy: &str) -> Self {
        self.spec().internal_traffic_policy = Some(policy.to_owned());
        self
    }

    pub fn external_traffic_policy(mut self, policy: &str) -> Self {
        self.spec().external_traffic_policy = Some(policy.to_owned());
        self
    }

    pub fn external_ip(mut self, ip: Ipv4Addr) -> Self {
        self.spec()
            .external_ips
            .get_or_insert_with(Vec::new)
            .push(ip.to_string());
        self
    }

    pub fn publish_not_ready_addresses(mut self) -> Self {
        self.spec().publish_not_ready_addresses = Some(true);
        self
    }

    /// `spec.trafficDistribution`: read by the EndpointSlice controller, which writes the
    /// hints proxies follow (the tests write those hints themselves).
    pub fn traffic_distribution(mut self, distribution: &str) -> Self {
        self.spec().traffic_distribution = Some(distribution.to_owned());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn build(self) -> Service {
        self.0
    }
}

/// An EndpointSlice of a Service, as the EndpointSlice controller (or a user managing
/// endpoints by hand) writes it.
#[derive(Clone, Debug)]
pub struct SliceBuilder(EndpointSlice);

/// An IPv4 EndpointSlice `name` of `service`, without ports or endpoints yet.
pub fn slice(name: &str, service: &str) -> SliceBuilder {
    let mut metadata = meta(Some(NAMESPACE), name);
    metadata.labels = Some(BTreeMap::from([(
        SERVICE_NAME_LABEL.to_owned(),
        service.to_owned(),
    )]));
    SliceBuilder(EndpointSlice {
        metadata,
        address_type: "IPv4".to_owned(),
        endpoints: Vec::new(),
        ports: Some(Vec::new()),
    })
}

impl SliceBuilder {
    /// The endpoints' port for the Service port of the same name and protocol.
    pub fn port(mut self, name: &str, port: u16, protocol: &str) -> Self {
        self.0
            .ports
            .get_or_insert_with(Vec::new)
            .push(EndpointPort {
                name: Some(name.to_owned()),
                port: Some(i32::from(port)),
                protocol: Some(protocol.to_owned()),
                app_protocol: None,
            });
        self
    }

    pub fn endpoint(mut self, endpoint: Endpoint) -> Self {
        self.0.endpoints.push(endpoint);
        self
    }

    pub fn endpoints(mut self, endpoints: impl IntoIterator<Item = Endpoint>) -> Self {
        self.0.endpoints.extend(endpoints);
        self
    }

    pub fn build(self) -> EndpointSlice {
        self.0
    }
}

/// A ready endpoint of a pod at `address` on `node`.
pub fn endpoint(address: Ipv4Addr, node: &str) -> Endpoint {
    Endpoint {
        addresses: vec![address.to_string()],
        conditions: Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }),
        node_name: Some(node.to_owned()),
        ..Endpoint::default()
    }
}

/// The endpoint of a pod being deleted that still serves (its grace period).
pub fn terminating(mut endpoint: Endpoint) -> Endpoint {
    endpoint.conditions = Some(EndpointConditions {
        ready: Some(false),
        serving: Some(true),
        terminating: Some(true),
    });
    endpoint
}

/// The endpoint of a pod being deleted that failed its readiness probe: neither ready nor
/// serving.
pub fn terminating_unready(mut endpoint: Endpoint) -> Endpoint {
    endpoint.conditions = Some(EndpointConditions {
        ready: Some(false),
        serving: Some(false),
        terminating: Some(true),
    });
    endpoint
}

/// The endpoint of a pod that is not ready yet (an init container still runs).
pub fn not_ready(mut endpoint: Endpoint) -> Endpoint {
    endpoint.conditions = Some(EndpointConditions {
        ready: Some(false),
        serving: Some(false),
        terminating: Some(false),
    });
    endpoint
}

/// The endpoint with its zone and the hints the EndpointSlice controller writes for
/// `trafficDistribution`: PreferSameZone (and PreferClose) hint the endpoint's zone,
/// PreferSameNode its node and its zone.
pub fn hinted(mut endpoint: Endpoint, zone: &str, for_node: bool) -> Endpoint {
    endpoint.zone = Some(zone.to_owned());
    let for_nodes = for_node.then(|| {
        vec![ForNode {
            name: endpoint.node_name.clone().unwrap_or_default(),
        }]
    });
    endpoint.hints = Some(EndpointHints {
        for_nodes,
        for_zones: Some(vec![ForZone {
            name: zone.to_owned(),
        }]),
    });
    endpoint
}

/// A Node `name` in `zone` with `address` as its InternalIP.
pub fn node(name: &str, zone: &str, address: Ipv4Addr) -> Node {
    let mut metadata = meta(None, name);
    metadata.labels = Some(BTreeMap::from([
        (ZONE_LABEL.to_owned(), zone.to_owned()),
        ("kubernetes.io/hostname".to_owned(), name.to_owned()),
    ]));
    Node {
        metadata,
        spec: None,
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".to_owned(),
                address: address.to_string(),
            }]),
            ..NodeStatus::default()
        }),
    }
}

/// A kubeconfig for an API server at `server` (e.g. `http://10.77.0.1:41234`), without
/// credentials (the fake API server asks for none).
pub fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters: [{{name: test, cluster: {{server: \"{server}\"}}}}]
users: [{{name: test, user: {{}}}}]
contexts: [{{name: test, context: {{cluster: test, user: test}}}}]
current-context: test
"
    )
}
