//! The manifests of the LAN's cluster for the agent's file source: its two Nodes, and
//! Services and EndpointSlices of either family.
use super::{Addresses, NODE1, NODE2, addresses, lan6};
use crate::{
    family::Family,
    manifests::{ManifestDir, endpoint_slice, service_manifest},
};

/// A Service; `kind_spec` adds to its spec (type, nodePorts, externalIPs, policies).
pub fn service(
    name: &str,
    cluster_ip: &str,
    ports: &str,
    kind_spec: &str,
    lb_ip: Option<&str>,
) -> String {
    let family = if cluster_ip.contains(':') {
        "  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]\n"
    } else {
        ""
    };
    let status = lb_ip.map_or_else(String::new, |ip| {
        format!("status: {{loadBalancer: {{ingress: [{{ip: {ip}}}]}}}}\n")
    });
    let spec = format!("{family}  ports: {ports}\n{kind_spec}\n{status}");
    service_manifest(name, cluster_ip, &spec)
}

/// node1 and node2 with their IPv4 InternalIPs.
pub fn nodes(manifests: &ManifestDir) {
    addresses(Family::V4).nodes(manifests);
}

/// (address, node) of an endpoint.
pub const POD1_ENDPOINT: (&str, &str) = ("10.244.1.10", "node1");
pub const POD2_ENDPOINT: (&str, &str) = ("10.244.2.10", "node2");

/// An IPv4 EndpointSlice of `service` for one port (`name`, `port`, `protocol`).
pub fn slice(
    name: &str,
    service: &str,
    port: (&str, u16, &str),
    endpoints: &[(&str, &str)],
) -> String {
    addresses(Family::V4).slice(name, service, port, endpoints)
}

impl Addresses {
    /// node1 and node2 with their InternalIPs: IPv4 only, or (IPv6 scenarios) both
    /// families, IPv4 first, as on a dual-stack cluster.
    pub fn nodes(&self, manifests: &ManifestDir) {
        let node = |name: &str, v4: &str, v6: &str| {
            let v6 = match self.family {
                Family::V4 => String::new(),
                Family::V6 => format!(", {{type: InternalIP, address: {v6}}}"),
            };
            format!(
                "apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{topology.kubernetes.io/zone: z1, kubernetes.io/hostname: {name}}}
status:
  addresses: [{{type: InternalIP, address: {v4}}}{v6}]
"
            )
        };
        manifests.write(
            "nodes.yaml",
            &format!(
                "{}---\n{}",
                node("node1", NODE1, lan6::NODE1),
                node("node2", NODE2, lan6::NODE2)
            ),
        );
    }

    /// A Service of this family whose cluster IP is [`Family::vip`]`(host)`, and whose
    /// LoadBalancer ingress is this family's [`lb_ip`](Self::lb_ip) if `lb`.
    pub fn service(&self, name: &str, host: u8, ports: &str, kind_spec: &str, lb: bool) -> String {
        service(
            name,
            &self.family.vip(host).to_string(),
            ports,
            kind_spec,
            lb.then_some(self.lb_ip),
        )
    }

    /// An EndpointSlice of this family.
    pub fn slice<A: AsRef<str>>(
        &self,
        name: &str,
        service: &str,
        port: (&str, u16, &str),
        endpoints: &[(A, &str)],
    ) -> String {
        let address_type = match self.family {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        };
        endpoint_slice(name, service, address_type, port, endpoints)
    }
}

/// A Service of one family reached from outside the node (NodePort unless made a
/// LoadBalancer), with an EndpointSlice per port, written as one manifest by
/// [`yaml`](Self::yaml).
#[derive(Clone, Debug)]
pub struct Exposed {
    addresses: Addresses,
    name: String,
    host: u8,
    /// (name, port, targetPort, nodePort, protocol)
    ports: Vec<(String, u16, u16, u16, String)>,
    spec: Vec<String>,
    annotations: Vec<String>,
    kind: &'static str,
    /// Whether the status names the family's LoadBalancer IP.
    ingress: bool,
    endpoints: Vec<(String, String)>,
}

impl Addresses {
    /// A NodePort Service `name` of this family on cluster IP [`Family::vip`]`(host)`,
    /// without ports or endpoints yet.
    pub fn exposed(&self, name: &str, host: u8) -> Exposed {
        Exposed {
            addresses: *self,
            name: name.to_owned(),
            host,
            ports: Vec::new(),
            spec: Vec::new(),
            annotations: Vec::new(),
            kind: "NodePort",
            ingress: false,
            endpoints: Vec::new(),
        }
    }
}

impl Exposed {
    /// A port `port` of the Service to `target` of its pods, on node port `node_port`;
    /// `protocol` is TCP or UDP.
    pub fn port(
        mut self,
        name: &str,
        port: u16,
        target: u16,
        node_port: u16,
        protocol: &str,
    ) -> Self {
        self.ports.push((
            name.to_owned(),
            port,
            target,
            node_port,
            protocol.to_owned(),
        ));
        self
    }

    /// The ports the pods' servers of [`super::LanNode::tcp_servers`] and
    /// [`super::LanNode::udp_servers`] listen on: `http` 80 to 8080 (NodePort 30080, TCP) and
    /// `dns` 53 to 5353 (NodePort 30053, UDP).
    pub fn http_and_dns(self) -> Self {
        self.port("http", 80, 8080, 30080, "TCP")
            .port("dns", 53, 5353, 30053, "UDP")
    }

    /// A line of the Service's spec, e.g. `externalTrafficPolicy: Local`.
    pub fn spec(mut self, line: &str) -> Self {
        self.spec.push(line.to_owned());
        self
    }

    /// Type LoadBalancer, whose ingress is the family's LoadBalancer IP.
    pub fn load_balancer(mut self) -> Self {
        self.kind = "LoadBalancer";
        self.ingress = true;
        self
    }

    /// Type LoadBalancer, with no LoadBalancer IP assigned yet.
    pub fn pending_load_balancer(mut self) -> Self {
        self.kind = "LoadBalancer";
        self.ingress = false;
        self
    }

    /// externalIPs of the Service.
    pub fn external_ips(self, ips: &[&str]) -> Self {
        let ips: Vec<String> = ips.iter().map(|ip| format!("\"{ip}\"")).collect();
        self.spec(&format!("externalIPs: [{}]", ips.join(", ")))
    }

    /// An annotation of the Service, e.g. `socklb.io/lb-algorithm: maglev`.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.push(format!("{key}: {value}"));
        self
    }

    /// The endpoints, (address, node), of every port's slice.
    pub fn endpoints<A: AsRef<str>>(mut self, endpoints: &[(A, &str)]) -> Self {
        self.endpoints = endpoints
            .iter()
            .map(|(address, node)| (address.as_ref().to_owned(), (*node).to_owned()))
            .collect();
        self
    }

    /// The Service alone, without EndpointSlices: a Service without endpoints.
    pub fn service_yaml(&self) -> String {
        let a = &self.addresses;
        let ports: Vec<String> = self
            .ports
            .iter()
            .map(|(name, port, target, node_port, protocol)| {
                format!(
                    "{{name: {name}, port: {port}, targetPort: {target}, nodePort: {node_port}, \
                     protocol: {protocol}}}"
                )
            })
            .collect();
        let mut spec = format!("  type: {}", self.kind);
        for line in &self.spec {
            spec.push_str(&format!("\n  {line}"));
        }
        let mut service = a.service(
            &self.name,
            self.host,
            &format!("[{}]", ports.join(", ")),
            &spec,
            self.ingress,
        );
        if !self.annotations.is_empty() {
            service = service.replace(
                "namespace: default}",
                &format!(
                    "namespace: default, annotations: {{{}}}}}",
                    self.annotations.join(", ")
                ),
            );
        }
        service
    }

    /// The Service, then its slices `<name>-<port name>`, as one manifest.
    pub fn yaml(&self) -> String {
        let endpoints: Vec<(&str, &str)> = self
            .endpoints
            .iter()
            .map(|(address, node)| (address.as_str(), node.as_str()))
            .collect();
        let mut yaml = self.service_yaml();
        for (port_name, _, target, _, protocol) in &self.ports {
            yaml.push_str("---\n");
            yaml.push_str(&self.addresses.slice(
                &format!("{}-{port_name}", self.name),
                &self.name,
                (port_name, *target, protocol),
                &endpoints,
            ));
        }
        yaml
    }
}
