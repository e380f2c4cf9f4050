//! node-a alone: the one-node cluster of the tests that run the agent on a manifests
//! directory in the sandbox. Its Node, Service web with endpoints on loopback addresses
//! `127.0.<net>.<host>:8080`, and the servers behind them.
use std::net::SocketAddr;

use crate::{
    manifests::{ManifestDir, node_yaml, service_yaml, slice_yaml},
    sandbox::Sandbox,
    servers::{NamedServer, tcp_backends},
};

/// The EndpointSlice `web-1` of Service web: one endpoint, 127.0.`net`.`host`:8080, on
/// node-a.
pub fn web_slice(net: u8, host: u8) -> String {
    let address = format!("127.0.{net}.{host}");
    slice_yaml(
        "web-1",
        "web",
        8080,
        &[(&address, "node-a", "zone-a", "")],
        false,
    )
}

impl ManifestDir {
    /// Manifests of node-a (zone-a) at 192.168.`net`.1, the only Node.
    pub fn node_a(sandbox: &Sandbox, net: u8) -> Self {
        let manifests = Self::new(sandbox);
        let address = format!("192.168.{net}.1");
        manifests.write("node.yaml", &node_yaml("node-a", "zone-a", &address));
        manifests
    }

    /// Manifests of node-a ([`node_a`](Self::node_a)) and Service web on `vip`:80, whose
    /// one endpoint is 127.0.`net`.1 ([`web_slice`]).
    pub fn web_with_one_endpoint(sandbox: &Sandbox, net: u8, vip: &str) -> Self {
        let manifests = Self::node_a(sandbox, net);
        manifests.write("web.yaml", &service_yaml("web", vip, 80, ""));
        manifests.write("slice.yaml", &web_slice(net, 1));
        manifests
    }
}

/// Service web on 10.96.0.`vip_host`:80 served by b1 and b2 (127.0.`net`.1 and .2), and
/// the manifests of node-a that hold it; the servers stop when dropped.
pub struct TwoBackendWeb {
    pub manifests: ManifestDir,
    pub vip: SocketAddr,
    _servers: Vec<NamedServer>,
}

impl TwoBackendWeb {
    pub fn new(sandbox: &Sandbox, net: u8, vip_host: u8) -> Self {
        let servers = tcp_backends([127, 0, net], 2, 8080);
        let manifests = ManifestDir::node_a(sandbox, net);
        let vip = SocketAddr::from(([10, 96, 0, vip_host], 80));
        manifests.two_endpoint_service(
            "web",
            &vip.ip().to_string(),
            &format!("127.0.{net}.1"),
            &format!("127.0.{net}.2"),
        );
        Self {
            manifests,
            vip,
            _servers: servers,
        }
    }
}
