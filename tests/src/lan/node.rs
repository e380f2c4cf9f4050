//! node1 of the LAN as a test uses it: the sandbox (node1's namespace, where the agent
//! runs), the LAN around it, the manifests of the agent's file source with both Nodes in
//! them, and the servers in the pods.
use std::{
    io::ErrorKind,
    net::{SocketAddr, UdpSocket},
    time::Duration,
};

use socklb_agent::inspect::{self, ConntrackState};

use super::{Addresses, Lan, addresses, counters, lan};
use crate::{
    agent::Agent, family::Family, interrupted::uninterrupted, manifests::ManifestDir,
    privileges::ContainerPrivileges, sandbox::Sandbox, servers::NamedServer,
};

/// Fields drop in order: the manifests, the LAN's namespaces, then the sandbox. Servers
/// and the agent, made after it, are dropped before it.
pub struct LanNode {
    pub manifests: ManifestDir,
    pub lan: Lan,
    pub a: Addresses,
    pub sandbox: Sandbox,
}

impl LanNode {
    /// The sandbox `<test><family tag>` and the LAN `<lan><family tag>` (namespace names:
    /// unique among the tests of one binary, and short), with the Nodes' manifest written.
    pub fn new(family: Family, test: &str, lan_tag: &str) -> Self {
        let sandbox = Sandbox::new(&format!("{test}{}", family.tag()));
        let lan = lan(&format!("{lan_tag}{}", family.tag()));
        let a = addresses(family);
        let manifests = ManifestDir::new(&sandbox);
        a.nodes(&manifests);
        Self {
            manifests,
            lan,
            a,
            sandbox,
        }
    }

    /// Writes (or replaces) one manifest.
    pub fn write(&self, file: &str, yaml: &str) {
        self.manifests.write(file, yaml);
    }

    /// The agent on node1, started on the manifests (and ready).
    pub fn agent(&self, extra: &[&str]) -> Agent {
        Agent::start(&self.sandbox, &self.manifests.path, "node1", extra)
    }

    /// The agent on node1 with a container's `privileges` (the chart's, say).
    pub fn agent_as(&self, privileges: &ContainerPrivileges, extra: &[&str]) -> Agent {
        Agent::start_as(
            privileges,
            &self.sandbox,
            &self.manifests.path,
            "node1",
            extra,
        )
    }

    /// A TCP server in pod1 or pod2 (`pod` 1 or 2) on `port`, answering `<podN> <client>`.
    pub fn tcp_server(&self, pod: u8, port: u16) -> NamedServer {
        let (netns, address) = self.pod(pod);
        NamedServer::tcp_in(netns, &format!("pod{pod}"), SocketAddr::new(address, port))
    }

    /// A UDP server in pod1 or pod2 (`pod` 1 or 2) on `port`, answering `<podN> <client>`.
    pub fn udp_server(&self, pod: u8, port: u16) -> NamedServer {
        let (netns, address) = self.pod(pod);
        NamedServer::udp_in(netns, &format!("pod{pod}"), SocketAddr::new(address, port))
    }

    /// TCP servers in both pods on `port`.
    pub fn tcp_servers(&self, port: u16) -> [NamedServer; 2] {
        [self.tcp_server(1, port), self.tcp_server(2, port)]
    }

    /// UDP servers in both pods on `port`.
    pub fn udp_servers(&self, port: u16) -> [NamedServer; 2] {
        [self.udp_server(1, port), self.udp_server(2, port)]
    }

    /// socklb's counters on node1.
    pub fn counters(&self) -> socklb_agent::inspect::CountersView {
        counters(&self.sandbox)
    }

    fn pod(&self, pod: u8) -> (&crate::netns::Netns, std::net::IpAddr) {
        match pod {
            1 => (&self.lan.pod1, self.a.pod1),
            2 => (&self.lan.pod2, self.a.pod2),
            other => panic!("the LAN has pod1 and pod2, not pod{other}"),
        }
    }
}

impl LanNode {
    /// Writes `<name>.yaml`: NodePort Service `name` (cluster IP [`Family::vip`]`(host)`) of
    /// one port (name, port, targetPort, nodePort, protocol) whose only endpoint is pod2,
    /// behind node2: its flows from outside are SNATed to node1's address.
    pub fn expose_pod2(&self, name: &str, host: u8, port: (&str, u16, u16, u16, &str)) {
        let (port_name, port, target, node_port, protocol) = port;
        let service = self.a.exposed(name, host);
        let service = service.port(port_name, port, target, node_port, protocol);
        let yaml = service.endpoints(&[self.a.pod2_endpoint()]).yaml();
        self.write(&format!("{name}.yaml"), &yaml);
    }

    /// Two NodePort Services in `file`, one port each (name, port, targetPort, protocol):
    /// `local`, whose endpoint is pod1 (on node1), on cluster IP [`Family::vip`]`(host)` and
    /// node port `node_port`, and `remote`, whose endpoint is pod2 (behind node2), on the
    /// next ones.
    pub fn local_and_remote(
        &self,
        file: &str,
        host: u8,
        port: (&str, u16, u16, &str),
        node_port: u16,
    ) {
        let (name, port, target, protocol) = port;
        let a = &self.a;
        let services = [("local", a.pod1_endpoint()), ("remote", a.pod2_endpoint())]
            .into_iter()
            .zip(0..)
            .map(|((service, endpoint), i)| {
                a.exposed(service, host + i)
                    .port(name, port, target, node_port + u16::from(i), protocol)
                    .endpoints(&[endpoint])
                    .yaml()
            })
            .collect::<Vec<_>>();
        self.write(file, &services.join("---\n"));
    }
}

impl LanNode {
    /// A UDP socket of the outside client on `port`, reading with a 3 s timeout.
    pub fn udp_client(&self, port: u16) -> UdpSocket {
        let address = Addresses::at(self.a.client, port);
        self.lan.client.enter(|| {
            let socket = UdpSocket::bind(&address).expect("bind the client");
            socket
                .set_read_timeout(Some(Duration::from_secs(3)))
                .expect("timeout");
            socket
        })
    }

    /// The first answer to a query from the outside client's UDP socket connected to
    /// `frontend`: its length, or the error its socket got (ECONNREFUSED is an ICMP error
    /// that reached it).
    pub fn udp_query(&self, frontend: &str, timeout: Duration) -> Result<usize, ErrorKind> {
        let bind = Addresses::at(self.a.client, 0);
        self.lan.client.enter(|| {
            let socket = UdpSocket::bind(&bind).expect("bind the client");
            socket.connect(frontend).expect("connect");
            socket
                .set_read_timeout(Some(timeout))
                .expect("read timeout");
            socket.send(b"query").expect("send");
            uninterrupted(|| socket.recv(&mut [0u8; 64])).map_err(|e| e.kind())
        })
    }

    /// The conntrack entries of the outside client's flows from `port`, both directions.
    pub fn client_flows(&self, port: u16) -> Vec<ConntrackState> {
        let client = Addresses::at(self.a.client, port);
        inspect::inspect(&self.sandbox.pin_dir, None)
            .expect("inspect")
            .conntrack
            .into_iter()
            .filter(|c| c.from.to_string() == client || c.rewritten_to.to_string() == client)
            .collect()
    }
}
