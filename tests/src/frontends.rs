//! Frontends and their specs for the tests that program the datapath through the library
//! (without the control plane).
use std::net::{Ipv4Addr, SocketAddr};

use socklb_agent::dataplane::{Frontend, FrontendSpec, Protocol, Scope};

use crate::servers::NamedServer;

/// A frontend whose backends are `servers`, without affinity, source ranges or Maglev.
pub fn spec<'a>(servers: impl IntoIterator<Item = &'a NamedServer>) -> FrontendSpec {
    FrontendSpec {
        backends: servers.into_iter().map(NamedServer::backend).collect(),
        ..FrontendSpec::default()
    }
}

/// A TCP frontend on a "cluster IP" that nothing else answers in the sandbox.
pub fn frontend(address: [u8; 4], port: u16, protocol: Protocol) -> Frontend {
    Frontend {
        address: Ipv4Addr::from(address).into(),
        port,
        protocol,
        scope: Scope::Internal,
    }
}

pub fn addr(frontend: &Frontend) -> SocketAddr {
    SocketAddr::from((frontend.address, frontend.port))
}
