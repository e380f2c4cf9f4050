//! kube-proxy's nftables mode (pkg/proxy/nftables/proxier.go, setupNFTables and
//! syncProxyRules), as the transaction text knftables hands to `nft -f`: ClusterIP
//! services with Cluster traffic policy, and NodePorts with externalTrafficPolicy Local.
use std::{fmt::Write as _, net::SocketAddrV4};

use super::{Config, MASQ_MARK, SERVICE_CIDR, name_hash};
use crate::bench::cluster::{NAMESPACE, Service};

const NFT: &str = "ip kube-proxy";

/// A service port's chain with `prefix`: `service-` (Cluster policy), `local-` (Local
/// policy), `external-` (traffic to its NodePort).
fn policy_chain_name(prefix: &str, service: &Service) -> String {
    let base = format!("{NAMESPACE}/{}/tcp/http", service.name);
    format!("{prefix}-{}-{base}", name_hash(&base, 8))
}

fn service_chain_name(service: &Service) -> String {
    policy_chain_name("service", service)
}

fn endpoint_chain_name(service: &Service, address: SocketAddrV4) -> String {
    let base = format!(
        "{NAMESPACE}/{}/tcp/http__{}/{}",
        service.name,
        address.ip(),
        address.port()
    );
    format!("endpoint-{}-{base}", name_hash(&base, 8))
}

fn setup(out: &mut String, config: &Config) {
    let node_ip = config.node_ip;
    let _ = writeln!(
        out,
        "add table {NFT} {{ comment \"rules for kube-proxy\" ; }}"
    );
    for (chain, kind, hook, priority) in [
        ("filter-prerouting", "filter", "prerouting", -110),
        ("filter-input", "filter", "input", -110),
        ("filter-forward", "filter", "forward", -110),
        ("filter-output", "filter", "output", -110),
        ("filter-output-post-dnat", "filter", "output", -90),
        ("nat-prerouting", "nat", "prerouting", -100),
        ("nat-output", "nat", "output", -100),
        ("nat-postrouting", "nat", "postrouting", 100),
    ] {
        let _ = writeln!(
            out,
            "add chain {NFT} {chain} {{ type {kind} hook {hook} priority {priority} ; }}\n\
             flush chain {NFT} {chain}"
        );
    }
    let mut created: Vec<&str> = Vec::new();
    for (destination, source, extra) in [
        ("nodeport-endpoints-check", "filter-input", "ct state new "),
        ("service-endpoints-check", "filter-input", "ct state new "),
        ("service-endpoints-check", "filter-forward", "ct state new "),
        ("service-endpoints-check", "filter-output", "ct state new "),
        ("firewall-check", "filter-prerouting", "ct state new "),
        ("firewall-check", "filter-output", "ct state new "),
        ("services", "nat-output", ""),
        ("services", "nat-prerouting", ""),
        ("masquerading", "nat-postrouting", ""),
        ("cluster-ips-check", "filter-forward", "ct state new "),
        (
            "cluster-ips-check",
            "filter-output-post-dnat",
            "ct state new ",
        ),
    ] {
        if !created.contains(&destination) {
            created.push(destination);
            empty_chain(out, destination);
        }
        let _ = writeln!(out, "add rule {NFT} {source} {extra}jump {destination}");
    }
    let _ = writeln!(
        out,
        "add chain {NFT} mark-for-masquerade\nflush chain {NFT} mark-for-masquerade\n\
         add rule {NFT} mark-for-masquerade mark set mark or {MASQ_MARK}\n\
         add rule {NFT} masquerading mark and {MASQ_MARK} == 0 return\n\
         add rule {NFT} masquerading mark set mark xor {MASQ_MARK}\n\
         add rule {NFT} masquerading masquerade fully-random\n\
         add set {NFT} cluster-ips {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}\n\
         add rule {NFT} cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"\n\
         add rule {NFT} cluster-ips-check ip daddr {{ {SERVICE_CIDR} }} drop comment \"Drop traffic to unallocated ClusterIPs\"\n\
         add set {NFT} nodeport-ips {{ type ipv4_addr ; comment \"IPs that accept NodePort traffic\" ; }}\n\
         flush set {NFT} nodeport-ips\n\
         add element {NFT} nodeport-ips {{ {node_ip} }}\n\
         add map {NFT} no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}\n\
         add map {NFT} no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}\n\
         add chain {NFT} reject-chain {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}\n\
         flush chain {NFT} reject-chain\n\
         add rule {NFT} reject-chain reject\n\
         add rule {NFT} service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\
         add rule {NFT} nodeport-endpoints-check ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports\n\
         add map {NFT} firewall-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}\n\
         add rule {NFT} firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips\n\
         add map {NFT} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}\n\
         add map {NFT} service-nodeports {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}\n\
         add rule {NFT} services ip daddr . meta l4proto . th dport vmap @service-ips\n\
         add rule {NFT} services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports\n\
         flush set {NFT} cluster-ips\n\
         flush map {NFT} service-ips\n\
         flush map {NFT} firewall-ips\n\
         flush map {NFT} no-endpoint-services\n\
         flush map {NFT} no-endpoint-nodeports\n\
         flush map {NFT} service-nodeports"
    );
}

/// Adds `chain`, or empties it if it is there.
fn empty_chain(out: &mut String, chain: &str) {
    let _ = writeln!(out, "add chain {NFT} {chain}\nflush chain {NFT} {chain}");
}

/// One service's chains and rules (written when the service is new or changed).
fn service_chains(out: &mut String, config: &Config, service: &Service) {
    let pod_cidr = config.pod_cidr;
    let chain = service_chain_name(service);
    let endpoints: Vec<String> = (0..service.endpoints.len())
        .map(|endpoint| endpoint_chain_name(service, service.endpoint(endpoint)))
        .collect();
    for endpoint in &endpoints {
        empty_chain(out, endpoint);
    }
    empty_chain(out, &chain);
    let _ = writeln!(
        out,
        "add rule {NFT} {chain} ip daddr {} tcp dport {} ip saddr != {pod_cidr} jump \
         mark-for-masquerade",
        service.vip, service.port
    );
    endpoint_dispatch(out, &chain, &endpoints);
    if service.node_port.is_some() {
        let (external, local) = (
            policy_chain_name("external", service),
            policy_chain_name("local", service),
        );
        empty_chain(out, &external);
        empty_chain(out, &local);
        let _ = writeln!(
            out,
            "add rule {NFT} {external} ip saddr {pod_cidr} goto {chain} comment \"short-circuit pod traffic\"\n\
             add rule {NFT} {external} fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"\n\
             add rule {NFT} {external} fib saddr type local goto {chain} comment \"short-circuit local traffic\"\n\
             add rule {NFT} {external} goto {local}"
        );
        endpoint_dispatch(out, &local, &endpoints);
    }
    for (index, endpoint) in endpoints.iter().enumerate() {
        let target = service.endpoint(index);
        let _ = writeln!(
            out,
            "add rule {NFT} {endpoint} ip saddr {} jump mark-for-masquerade\n\
             add rule {NFT} {endpoint} meta l4proto tcp dnat to {target}",
            target.ip()
        );
    }
}

/// A policy chain's one load-balancing rule: a random number picks the endpoint chain.
fn endpoint_dispatch(out: &mut String, chain: &str, endpoints: &[String]) {
    let vmap: Vec<String> = endpoints
        .iter()
        .enumerate()
        .map(|(index, endpoint)| format!("{index} : goto {endpoint}"))
        .collect();
    let _ = writeln!(
        out,
        "add rule {NFT} {chain} numgen random mod {} vmap {{ {} }}",
        endpoints.len(),
        vmap.join(" , ")
    );
}

/// The first sync's transaction: the table, then every service.
pub fn initial(config: &Config, services: &[Service]) -> String {
    let mut out = String::with_capacity(services.len() * 4_000);
    setup(&mut out, config);
    for service in services {
        service_chains(&mut out, config, service);
        let _ = writeln!(
            out,
            "add element {NFT} cluster-ips {{ {} }}\n\
             add element {NFT} service-ips {{ {} . tcp . {} : goto {} }}",
            service.vip,
            service.vip,
            service.port,
            service_chain_name(service)
        );
        if let Some(node_port) = service.node_port {
            let _ = writeln!(
                out,
                "add element {NFT} service-nodeports {{ tcp . {node_port} : goto {} }}",
                policy_chain_name("external", service)
            );
        }
    }
    out
}

/// A partial sync after one endpoint of `service` changed: its chains are rewritten, the
/// stale endpoint chain flushed (kube-proxy deletes it in a later sync); the map elements
/// did not change, so they are not in the transaction.
pub fn change(config: &Config, service: &Service, stale: SocketAddrV4) -> String {
    let mut out = String::new();
    service_chains(&mut out, config, service);
    let _ = writeln!(
        out,
        "flush chain {NFT} {}",
        endpoint_chain_name(service, stale)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cluster::cluster;

    #[test]
    fn nft_service_rule_is_one_numgen_vmap() {
        let services = cluster(4);
        let mut out = String::new();
        let config = Config {
            pod_cidr: "10.0.0.0/8",
            node_ip: "192.168.0.1",
        };
        service_chains(&mut out, &config, &services[0]);
        assert_eq!(out.matches("numgen random mod 10 vmap").count(), 1);
        assert_eq!(out.matches("dnat to 10.128.0.").count(), 10);
    }

    #[test]
    fn node_port_goes_through_the_external_chain() {
        let mut services = cluster(2);
        services[1].node_port = Some(30080);
        let config = Config {
            pod_cidr: "10.244.0.0/16",
            node_ip: "10.88.0.1",
        };
        let out = initial(&config, &services);
        let external = policy_chain_name("external", &services[1]);
        assert!(out.contains(&format!(
            "service-nodeports {{ tcp . 30080 : goto {external} }}"
        )));
        assert_eq!(
            out.matches(&format!("add rule {NFT} {external} ")).count(),
            4
        );
        // svc-0, and svc-1 twice: its Cluster and its Local policy chain.
        assert_eq!(out.matches("numgen random mod 10 vmap").count(), 3);
    }
}
