//! The services every peer is programmed with, and their address plan: N services of
//! ENDPOINTS endpoints (port 80 -> 8080, VIPs from 10.96.0.1, endpoints in 10.128.0.0/9),
//! plus one service of one endpoint for iperf3 (5201 -> 5201), last in rule order. The same
//! objects become manifests for the agent and rules for kube-proxy's two modes.
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::{service_yaml, slice_yaml};

pub const ENDPOINTS: u32 = 10;
pub const SERVICE_PORT: u16 = 80;
pub const ENDPOINT_PORT: u16 = 8080;
pub const IPERF_PORT: u16 = 5201;
pub const NAMESPACE: &str = "default";
pub const NODE: &str = "node-a";
pub const ZONE: &str = "zone-a";
/// Keeps the address plan (VIPs in 10.96.0.0/12, endpoints in 10.128.0.0/9) valid.
pub const MAX_SERVICES: u32 = 100_000;
/// Where the endpoint addresses are: a server namespace routes it to itself.
pub const ENDPOINT_RANGE: &str = "10.128.0.0/9";

/// One service port (kube-proxy's unit: a Service with two ports is two of these).
#[derive(Clone)]
pub struct Service {
    pub name: String,
    pub vip: Ipv4Addr,
    pub port: u16,
    pub target_port: u16,
    /// A NodePort, with externalTrafficPolicy Local (every endpoint is on this node).
    pub node_port: Option<u16>,
    pub endpoints: Vec<Ipv4Addr>,
}

impl Service {
    /// kube-proxy's ServicePortName string: "namespace/name:port-name".
    pub fn port_name(&self) -> String {
        format!("{NAMESPACE}/{}:http", self.name)
    }

    pub fn endpoint(&self, endpoint: usize) -> SocketAddrV4 {
        SocketAddrV4::new(self.endpoints[endpoint], self.target_port)
    }
}

pub fn vip(service: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a60_0001 + service)
}

pub fn endpoint_address(service: u32, endpoint: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a80_0000 + service * 16 + endpoint)
}

/// N ClusterIP services of ENDPOINTS endpoints each.
pub fn services(services: u32) -> Vec<Service> {
    (0..services)
        .map(|service| Service {
            name: format!("svc-{service:05}"),
            vip: vip(service),
            port: SERVICE_PORT,
            target_port: ENDPOINT_PORT,
            node_port: None,
            endpoints: (0..ENDPOINTS)
                .map(|endpoint| endpoint_address(service, endpoint))
                .collect(),
        })
        .collect()
}

/// N services and the iperf3 service after them.
pub fn cluster(count: u32) -> Vec<Service> {
    let mut cluster = services(count);
    cluster.push(Service {
        name: "iperf".to_owned(),
        vip: vip(count),
        port: IPERF_PORT,
        target_port: IPERF_PORT,
        node_port: None,
        endpoints: vec![endpoint_address(count, 0)],
    });
    cluster
}

/// The measured services: first, middle and last in rule order (the iperf3 service after
/// them is not timed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Position {
    First,
    Middle,
    Last,
}

pub const POSITIONS: [Position; 3] = [Position::First, Position::Middle, Position::Last];

impl Position {
    pub fn index(self, services: u32) -> u32 {
        match self {
            Self::First => 0,
            Self::Middle => services / 2,
            Self::Last => services - 1,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Middle => "middle",
            Self::Last => "last",
        }
    }
}

/// The service whose endpoints the change measurements replace: none of the measured ones.
pub fn changed_service(services: u32) -> usize {
    (services / 4).max(1) as usize
}

/// An address never used before for the k-th change (no traffic goes to it).
pub fn changed_address(change: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0afa_0000 + change)
}

/// One manifest file: the services in `range` and their slices, all endpoints on `NODE`.
pub fn manifest_file(cluster: &[Service], range: std::ops::Range<usize>) -> String {
    let mut documents = Vec::new();
    for service in &cluster[range] {
        documents.push(match service.node_port {
            None => service_yaml(&service.name, &service.vip.to_string(), service.port, ""),
            Some(node_port) => node_port_yaml(service, node_port),
        });
        let addresses: Vec<String> = service.endpoints.iter().map(ToString::to_string).collect();
        let endpoints: Vec<(&str, &str, &str, &str)> = addresses
            .iter()
            .map(|address| (address.as_str(), NODE, ZONE, ""))
            .collect();
        documents.push(slice_yaml(
            &format!("{}-1", service.name),
            &service.name,
            service.target_port,
            &endpoints,
            false,
        ));
    }
    documents.join("---\n")
}

fn node_port_yaml(service: &Service, node_port: u16) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {NAMESPACE}}}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  clusterIP: {vip}
  clusterIPs: [{vip}]
  ports: [{{name: http, port: {port}, nodePort: {node_port}, protocol: TCP}}]
",
        name = service.name,
        vip = service.vip,
        port = service.port,
    )
}

/// The agent's map capacities for `services` service ports of up to ENDPOINTS endpoints,
/// with room to spare (the defaults hold about 6,000 such services).
pub fn agent_capacity_flags(services: usize) -> Vec<String> {
    let room = |entries: usize| (entries + entries / 8).next_power_of_two().to_string();
    vec![
        "--max-service-entries".to_owned(),
        room(services * (1 + ENDPOINTS as usize)),
        "--max-backends".to_owned(),
        room(services * ENDPOINTS as usize),
    ]
}
