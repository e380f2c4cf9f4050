//! The benchmark's cluster: Services svc-00000... with ENDPOINTS_PER_SERVICE endpoints each
//! on this node, the changes made to it, and how the agent gets it (manifests, or the fake
//! API server).
use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use socklb_agent::source::{Object, file::parse};
use socklb_tests::{
    ManifestDir, fake_apiserver::FakeApiServer, node_yaml, service_yaml, slice_yaml,
};

use crate::{ENDPOINT_PORT, ENDPOINTS_PER_SERVICE, NODE, SERVICE_PORT, ZONE};

/// The manifests are split into files of this many Services (and their slices).
const SERVICES_PER_FILE: u32 = 1_000;

pub struct Cluster {
    /// Every service's current endpoint addresses.
    endpoints: Vec<Vec<Ipv4Addr>>,
    /// Changes made so far; also numbers the replacement addresses.
    changes: u32,
}

/// One EndpointSlice change: which service, its new slice, and the address it brings.
pub struct Change {
    pub service: u32,
    pub slice: Object,
    pub address: Ipv4Addr,
}

impl Cluster {
    pub fn new(services: u32) -> Self {
        let endpoints = (0..services)
            .map(|service| {
                (0..ENDPOINTS_PER_SERVICE)
                    .map(|endpoint| Ipv4Addr::from(0x0a80_0000 + service * 16 + endpoint))
                    .collect()
            })
            .collect();
        Self {
            endpoints,
            changes: 0,
        }
    }

    /// The Node and the Services with their slices, in files of SERVICES_PER_FILE Services
    /// in `format`, in place of what `manifests` held.
    pub fn write_manifests(&self, manifests: &ManifestDir, format: Format) {
        let services = self.len();
        eprintln!(
            "file source: writing {services} services x {ENDPOINTS_PER_SERVICE} endpoints to {} \
             ({format:?})",
            manifests.path.display()
        );
        manifests.clear();
        manifests.write("node.yaml", &node_yaml(NODE, ZONE, "192.168.0.1"));
        for first in (0..services).step_by(SERVICES_PER_FILE as usize) {
            let documents: Vec<String> = (first..services.min(first + SERVICES_PER_FILE))
                .flat_map(|service| [self.service_yaml(service), self.slice_yaml(service)])
                .collect();
            match format {
                Format::Yaml => manifests.write(
                    &format!("services-{first:05}.yaml"),
                    &documents.join("---\n"),
                ),
                Format::Json => manifests.write(
                    &format!("services-{first:05}.json"),
                    &json_lines(&documents.join("---\n")),
                ),
            }
        }
    }

    /// The service's endpoint addresses now.
    pub fn endpoints(&self, service: u32) -> &[Ipv4Addr] {
        &self.endpoints[service as usize]
    }

    pub fn len(&self) -> u32 {
        u32::try_from(self.endpoints.len()).unwrap_or(u32::MAX)
    }

    pub fn service_yaml(&self, service: u32) -> String {
        service_yaml(
            &service_name(service),
            &vip(service).to_string(),
            SERVICE_PORT,
            "",
        )
    }

    pub fn slice_yaml(&self, service: u32) -> String {
        let addresses: Vec<String> = self.endpoints[service as usize]
            .iter()
            .map(ToString::to_string)
            .collect();
        let endpoints: Vec<(&str, &str, &str, &str)> = addresses
            .iter()
            .map(|address| (address.as_str(), NODE, ZONE, ""))
            .collect();
        let name = service_name(service);
        slice_yaml(
            &format!("{name}-1"),
            &name,
            ENDPOINT_PORT,
            &endpoints,
            false,
        )
    }

    /// Replaces one endpoint of a service with an address never used before (11.0.0.0/8),
    /// so that seeing it in the maps can only mean this change. Consecutive changes hit
    /// services far apart, as unrelated deployments would.
    pub fn change(&mut self) -> Change {
        let number = self.changes;
        self.changes += 1;
        let service = u32::try_from((u64::from(number) * 7_919 + 13) % u64::from(self.len()))
            .unwrap_or_default();
        let address = Ipv4Addr::from(0x0b00_0000 + number);
        let slot = (number % ENDPOINTS_PER_SERVICE) as usize;
        self.endpoints[service as usize][slot] = address;
        let slice = objects(&self.slice_yaml(service))
            .pop()
            .expect("a slice manifest holds one object");
        Change {
            service,
            slice,
            address,
        }
    }
}

/// How the manifests are written: as YAML, or as JSON (as `kubectl get -o json` writes an
/// object, one per line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

/// The objects of `yaml` in JSON, one per line.
fn json_lines(yaml: &str) -> String {
    let mut out = String::new();
    for object in objects(yaml) {
        let json = match object {
            Object::Service(service) => serde_json::to_string(&service),
            Object::EndpointSlice(slice) => serde_json::to_string(&slice),
            other => panic!("the benchmark writes Services and slices only, not {other:?}"),
        };
        out.push_str(&json.expect("k8s objects serialize"));
        out.push('\n');
    }
    out
}

pub fn service_name(service: u32) -> String {
    format!("svc-{service:05}")
}

/// The service's cluster IP, from 10.96.0.1 upwards.
pub fn vip(service: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x0a60_0001 + service)
}

/// The objects of a manifest, for the fake API server (parsed as the file source does).
pub fn objects(yaml: &str) -> Vec<Object> {
    parse(Path::new("bench.yaml"), yaml).expect("the generated manifests parse")
}

/// The fake API server's sockets do not set TCP_NODELAY (a real API server's do: Go sets
/// it on every TCP connection). With Nagle on the server and delayed ACKs (40 ms) on the
/// agent, a watch event written while the previous one is unacknowledged waits for that
/// ACK: 1 in 10 changes paced 20 ms apart took ~21 ms instead of ~0.7 ms, and changes at
/// 100/s arrived in bursts. Quick ACKs on the sandbox's loopback route (its own network
/// namespace) release each event at once, as TCP_NODELAY on the server would.
pub fn ack_at_once_on_loopback() {
    let route = "route replace local 127.0.0.1 dev lo table local proto kernel scope host src \
                 127.0.0.1 quickack 1";
    socklb_tests::run(Command::new("ip").args(route.split_whitespace()));
}

pub fn apply(api: &FakeApiServer, object: &Object) {
    api.apply_object(object);
}

/// The fake API server, started inside the sandbox (the agent reaches it on the sandbox's
/// 127.0.0.1) and holding the cluster, and a kubeconfig for it in the manifests directory.
pub fn fake_cluster(manifests: &ManifestDir, cluster: &Cluster) -> (FakeApiServer, PathBuf) {
    ack_at_once_on_loopback();
    let api = FakeApiServer::start();
    eprintln!(
        "kube source: {} services in the fake API server",
        cluster.len()
    );
    api.apply_manifests(&node_yaml(NODE, ZONE, "192.168.0.1"));
    for service in 0..cluster.len() {
        let yaml = format!(
            "{}---\n{}",
            cluster.service_yaml(service),
            cluster.slice_yaml(service)
        );
        api.apply_manifests(&yaml);
    }
    let kubeconfig = manifests.path.join("kubeconfig");
    fs::write(&kubeconfig, api.kubeconfig()).expect("write the kubeconfig");
    (api, kubeconfig)
}
