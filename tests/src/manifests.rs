//! Manifests for the agent's file source: a directory removed when dropped, and the YAML of
//! Nodes, Services and EndpointSlices written into it.
use std::{fs, path::PathBuf};

use crate::sandbox::Sandbox;

/// A directory of manifests for the agent's file source; removed when dropped.
pub struct ManifestDir {
    pub path: PathBuf,
}

impl ManifestDir {
    pub fn new(sandbox: &Sandbox) -> Self {
        Self::at(std::env::temp_dir().join(format!("{}-manifests", sandbox.name)))
    }

    /// A second, empty directory next to this one, `suffix` added to its name.
    pub fn beside(&self, suffix: &str) -> Self {
        let mut name = self.path.as_os_str().to_owned();
        name.push(format!("-{suffix}"));
        Self::at(PathBuf::from(name))
    }

    fn at(path: PathBuf) -> Self {
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).expect("create the manifests directory");
        Self { path }
    }

    /// Writes (or replaces) one manifest file atomically, as an editor or a sync tool would.
    pub fn write(&self, file: &str, yaml: &str) {
        let tmp = self.path.join(format!(".{file}.tmp"));
        fs::write(&tmp, yaml).expect("write a manifest");
        fs::rename(&tmp, self.path.join(file)).expect("move a manifest into place");
    }

    /// Removes every file, so that the directory holds only what is written next.
    pub fn clear(&self) {
        let entries = fs::read_dir(&self.path).expect("list the manifests directory");
        for entry in entries {
            let path = entry.expect("list the manifests directory").path();
            fs::remove_file(&path)
                .unwrap_or_else(|e| panic!("remove the manifest {}: {e}", path.display()));
        }
    }

    pub fn remove(&self, file: &str) {
        fs::remove_file(self.path.join(file)).expect("remove a manifest");
    }

    /// A Service and its EndpointSlice in one file, `<name>.yaml`.
    pub fn service(&self, name: &str, service: &str, slice: &str) {
        self.write(&format!("{name}.yaml"), &format!("{service}---\n{slice}"));
    }

    /// Service `name` (port 80 on `vip`, `default` namespace) with one EndpointSlice of two
    /// endpoints on port 8080, `first` on node-a and `second` on node-b: files `<name>.yaml`
    /// and `<name>-slice.yaml`.
    pub fn two_endpoint_service(&self, name: &str, vip: &str, first: &str, second: &str) {
        self.write(&format!("{name}.yaml"), &service_yaml(name, vip, 80, ""));
        self.write(
            &format!("{name}-slice.yaml"),
            &slice_yaml(
                &format!("{name}-1"),
                name,
                8080,
                &[
                    (first, "node-a", "zone-a", ""),
                    (second, "node-b", "zone-b", ""),
                ],
                false,
            ),
        );
    }
}

impl Drop for ManifestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// A Node manifest: `name` in `zone`, with `address` as its InternalIP.
pub fn node_yaml(name: &str, zone: &str, address: &str) -> String {
    format!(
        "apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{topology.kubernetes.io/zone: {zone}, kubernetes.io/hostname: {name}}}
status:
  addresses: [{{type: InternalIP, address: {address}}}]
"
    )
}

/// A ClusterIP Service with one TCP port named http.
pub fn service_yaml(name: &str, cluster_ip: &str, port: u16, extra_spec: &str) -> String {
    let ports = format!("  ports: [{{name: http, port: {port}, protocol: TCP}}]\n");
    service_manifest(name, cluster_ip, &ports) + extra_spec
}

/// A Service in namespace default on `cluster_ip`, its spec continued by `spec` (lines
/// indented by two spaces: ports, type, policies).
pub fn service_manifest(name: &str, cluster_ip: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  clusterIP: {cluster_ip}
  clusterIPs: [{cluster_ip}]
{spec}"
    )
}

/// An EndpointSlice `name` of `service` (namespace default) of `address_type` (IPv4, IPv6)
/// with one port (name, port, protocol) and `endpoints` as (address, node).
pub fn endpoint_slice<A: AsRef<str>>(
    name: &str,
    service: &str,
    address_type: &str,
    (port_name, port, protocol): (&str, u16, &str),
    endpoints: &[(A, &str)],
) -> String {
    let mut yaml = format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: {name}, namespace: default, labels: {{kubernetes.io/service-name: {service}}}}}
addressType: {address_type}
ports: [{{name: {port_name}, port: {port}, protocol: {protocol}}}]
"
    );
    if endpoints.is_empty() {
        yaml.push_str("endpoints: []\n");
    } else {
        yaml.push_str("endpoints:\n");
    }
    for (address, node) in endpoints {
        let address = address.as_ref();
        yaml.push_str(&format!(
            "- addresses: [\"{address}\"]\n  nodeName: {node}\n"
        ));
    }
    yaml
}

/// `count` ClusterIP Services (`filler-N`, VIPs from 10.100.0.1) of `endpoints` endpoints
/// each on node2 (addresses from 10.200.0.0 that nobody connects to), in one manifest:
/// the load of a test that makes the maps grow.
pub fn filler_services(count: usize, endpoints: usize) -> String {
    let mut yaml = String::new();
    for i in 0..count {
        let name = format!("filler-{i}");
        let vip = format!("10.100.{}.{}", i / 250, i % 250 + 1);
        let addresses: Vec<String> = (0..endpoints)
            .map(|e| {
                let n = i * endpoints + e;
                format!("10.{}.{}.{}", 200 + n / 65_536, (n / 256) % 256, n % 256)
            })
            .collect();
        let endpoints: Vec<(&str, &str, &str, &str)> = addresses
            .iter()
            .map(|address| (address.as_str(), "node2", "z1", ""))
            .collect();
        yaml.push_str(&service_yaml(&name, &vip, 80, ""));
        yaml.push_str("---\n");
        yaml.push_str(&slice_yaml(
            &format!("{name}-1"),
            &name,
            8080,
            &endpoints,
            false,
        ));
        yaml.push_str("---\n");
    }
    yaml
}

/// An EndpointSlice of `service` whose endpoints are `(address, node, zone, conditions)`;
/// conditions is YAML like `{ready: false, serving: true, terminating: true}` or "".
pub fn slice_yaml(
    name: &str,
    service: &str,
    port: u16,
    endpoints: &[(&str, &str, &str, &str)],
    zone_hints: bool,
) -> String {
    let mut yaml = format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: default
  labels: {{kubernetes.io/service-name: {service}}}
addressType: IPv4
ports: [{{name: http, port: {port}, protocol: TCP}}]
endpoints:
"
    );
    for (address, node, zone, conditions) in endpoints {
        yaml.push_str(&format!(
            "- addresses: [{address}]\n  nodeName: {node}\n  zone: {zone}\n"
        ));
        if !conditions.is_empty() {
            yaml.push_str(&format!("  conditions: {conditions}\n"));
        }
        if zone_hints {
            yaml.push_str(&format!("  hints: {{forZones: [{{name: {zone}}}]}}\n"));
        }
    }
    yaml
}
