//! kube-proxy's iptables mode (pkg/proxy/iptables/proxier.go, syncProxyRules): what one
//! sync hands to iptables-restore (--noflush) for ClusterIP services with Cluster traffic
//! policy, a pod CIDR (local traffic detector) and no session affinity, and NodePorts with
//! externalTrafficPolicy Local.
use std::fmt::Write as _;

use super::{Config, MASQ_MARK, name_hash};
use crate::bench::cluster::Service;

#[derive(Clone, Copy)]
pub enum IptablesSync {
    /// The first sync: also the jump rules from the built-in chains, which kube-proxy
    /// ensures with `iptables -I` before its first restore.
    Initial,
    /// A full sync: every chain and rule.
    Full,
    /// A partial sync (kube-proxy >= 1.27, the default): the top-level chains (KUBE-SERVICES
    /// with every service's rule) and the chains of the one service that changed.
    Partial { changed: usize },
}

fn svc_chain(service: &Service) -> String {
    format!(
        "KUBE-SVC-{}",
        name_hash(&format!("{}tcp", service.port_name()), 16)
    )
}

/// The NodePort's chains: external traffic (KUBE-EXT) and the Local policy (KUBE-SVL)
/// share the service chain's hash.
fn ext_chain(service: &Service) -> String {
    svc_chain(service).replacen("KUBE-SVC-", "KUBE-EXT-", 1)
}

fn svl_chain(service: &Service) -> String {
    svc_chain(service).replacen("KUBE-SVC-", "KUBE-SVL-", 1)
}

fn sep_chain(service: &Service, endpoint: usize) -> String {
    let text = format!("{}tcp{}", service.port_name(), service.endpoint(endpoint));
    format!("KUBE-SEP-{}", name_hash(&text, 16))
}

pub fn restore_input(config: &Config, services: &[Service], sync: IptablesSync) -> String {
    let pod_cidr = config.pod_cidr;
    let total_endpoints: usize = services.iter().map(|service| service.endpoints.len()).sum();
    // kube-proxy's largeClusterMode: no comments on the per-endpoint rules above 1,000.
    let large = total_endpoints > 1_000;
    let mut out = String::with_capacity(services.len() * 3_000);
    out.push_str("*filter\n");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-FIREWALL",
    ] {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    if matches!(sync, IptablesSync::Initial) {
        for (chain, extra, comment, target) in [
            (
                "INPUT",
                "-m conntrack --ctstate NEW ",
                "kubernetes load balancer firewall",
                "KUBE-PROXY-FIREWALL",
            ),
            (
                "INPUT",
                "",
                "kubernetes health check service ports",
                "KUBE-NODEPORTS",
            ),
            (
                "INPUT",
                "-m conntrack --ctstate NEW ",
                "kubernetes externally-visible service portals",
                "KUBE-EXTERNAL-SERVICES",
            ),
            (
                "FORWARD",
                "-m conntrack --ctstate NEW ",
                "kubernetes load balancer firewall",
                "KUBE-PROXY-FIREWALL",
            ),
            ("FORWARD", "", "kubernetes forwarding rules", "KUBE-FORWARD"),
            (
                "FORWARD",
                "-m conntrack --ctstate NEW ",
                "kubernetes service portals",
                "KUBE-SERVICES",
            ),
            (
                "FORWARD",
                "-m conntrack --ctstate NEW ",
                "kubernetes externally-visible service portals",
                "KUBE-EXTERNAL-SERVICES",
            ),
            (
                "OUTPUT",
                "-m conntrack --ctstate NEW ",
                "kubernetes load balancer firewall",
                "KUBE-PROXY-FIREWALL",
            ),
            (
                "OUTPUT",
                "-m conntrack --ctstate NEW ",
                "kubernetes service portals",
                "KUBE-SERVICES",
            ),
        ] {
            let _ = writeln!(
                out,
                "-A {chain} {extra}-m comment --comment \"{comment}\" -j {target}"
            );
        }
    }
    let _ = writeln!(
        out,
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP"
    );
    let _ = writeln!(
        out,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark \
         {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"
    );
    let _ = writeln!(
        out,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m \
         conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
    out.push_str("COMMIT\n*nat\n");
    for chain in [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ] {
        let _ = writeln!(out, ":{chain} - [0:0]");
    }
    let written: Vec<usize> = match sync {
        IptablesSync::Partial { changed } => vec![changed],
        _ => (0..services.len()).collect(),
    };
    for &index in &written {
        let service = &services[index];
        let _ = writeln!(out, ":{} - [0:0]", svc_chain(service));
        if service.node_port.is_some() {
            let _ = writeln!(out, ":{} - [0:0]", ext_chain(service));
            let _ = writeln!(out, ":{} - [0:0]", svl_chain(service));
        }
        for endpoint in 0..service.endpoints.len() {
            let _ = writeln!(out, ":{} - [0:0]", sep_chain(service, endpoint));
        }
    }
    if matches!(sync, IptablesSync::Initial) {
        for (chain, comment, target) in [
            ("OUTPUT", "kubernetes service portals", "KUBE-SERVICES"),
            ("PREROUTING", "kubernetes service portals", "KUBE-SERVICES"),
            (
                "POSTROUTING",
                "kubernetes postrouting rules",
                "KUBE-POSTROUTING",
            ),
        ] {
            let _ = writeln!(
                out,
                "-A {chain} -m comment --comment \"{comment}\" -j {target}"
            );
        }
    }
    let _ = writeln!(
        out,
        "-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" \
         -j MASQUERADE --random-fully\n\
         -A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}"
    );
    // KUBE-SERVICES holds one rule per service port in every sync, partial ones included.
    for service in services {
        let _ = writeln!(
            out,
            "-A KUBE-SERVICES -m comment --comment \"{} cluster IP\" -m tcp -p tcp -d {} \
             --dport {} -j {}",
            service.port_name(),
            service.vip,
            service.port,
            svc_chain(service)
        );
    }
    // So does KUBE-NODEPORTS, one rule per NodePort.
    for service in services {
        if let Some(node_port) = service.node_port {
            let _ = writeln!(
                out,
                "-A KUBE-NODEPORTS -m comment --comment {} -m tcp -p tcp --dport {node_port} -j {}",
                service.port_name(),
                ext_chain(service)
            );
        }
    }
    for &index in &written {
        let service = &services[index];
        let name = service.port_name();
        let chain = svc_chain(service);
        let _ = writeln!(
            out,
            "-A {chain} -m comment --comment \"{name} cluster IP\" -m tcp -p tcp -d {} --dport \
             {} ! -s {pod_cidr} -j KUBE-MARK-MASQ",
            service.vip, service.port
        );
        endpoint_jumps(&mut out, &chain, service, large);
        if service.node_port.is_some() {
            let (ext, svl) = (ext_chain(service), svl_chain(service));
            let _ = writeln!(
                out,
                "-A {ext} -m comment --comment \"pod traffic for {name} external destinations\" \
                 -s {pod_cidr} -j {chain}\n\
                 -A {ext} -m comment --comment \"masquerade LOCAL traffic for {name} external \
                 destinations\" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ\n\
                 -A {ext} -m comment --comment \"route LOCAL traffic for {name} external \
                 destinations\" -m addrtype --src-type LOCAL -j {chain}\n\
                 -A {ext} -j {svl}"
            );
            endpoint_jumps(&mut out, &svl, service, large);
        }
        let count = service.endpoints.len();
        for endpoint in 0..count {
            let sep = sep_chain(service, endpoint);
            let comment = if large {
                String::new()
            } else {
                format!(" -m comment --comment {name}")
            };
            let target = service.endpoint(endpoint);
            let _ = writeln!(
                out,
                "-A {sep}{comment} -s {} -j KUBE-MARK-MASQ\n\
                 -A {sep}{comment} -m tcp -p tcp -j DNAT --to-destination {target}",
                target.ip()
            );
        }
    }
    let _ = writeln!(
        out,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must \
         be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
    out.push_str("COMMIT\n");
    out
}

/// A policy chain's jumps to the endpoint chains: kube-proxy's
/// writeServiceToEndpointRules, 1/n probabilities with ten decimals, the last unconditional.
fn endpoint_jumps(out: &mut String, chain: &str, service: &Service, large: bool) {
    let name = service.port_name();
    let count = service.endpoints.len();
    for endpoint in 0..count {
        let target = service.endpoint(endpoint);
        let _ = write!(out, "-A {chain}");
        if !large {
            let _ = write!(out, " -m comment --comment \"{name} -> {target}\"");
        }
        if endpoint + 1 < count {
            let probability = 1.0 / (count - endpoint) as f64;
            let _ = write!(
                out,
                " -m statistic --mode random --probability {probability:.10}"
            );
        }
        let _ = writeln!(out, " -j {}", sep_chain(service, endpoint));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cluster::cluster;

    const CONFIG: Config = Config {
        pod_cidr: "10.0.0.0/8",
        node_ip: "192.168.0.1",
    };

    #[test]
    fn hashes_have_kube_proxy_lengths() {
        let service = &cluster(4)[1];
        assert_eq!(svc_chain(service).len(), "KUBE-SVC-".len() + 16);
        assert_eq!(sep_chain(service, 0).len(), "KUBE-SEP-".len() + 16);
        assert_ne!(sep_chain(service, 0), sep_chain(service, 1));
    }

    #[test]
    fn iptables_partial_sync_keeps_every_dispatch_rule() {
        let services = cluster(8);
        let partial = restore_input(&CONFIG, &services, IptablesSync::Partial { changed: 2 });
        let dispatch = partial
            .lines()
            .filter(|line| line.starts_with("-A KUBE-SERVICES"))
            .count();
        // One per service (the iperf3 one included) and the nodeports rule.
        assert_eq!(dispatch, services.len() + 1);
        assert_eq!(
            partial
                .lines()
                .filter(|line| line.starts_with(":KUBE-SVC-"))
                .count(),
            1
        );
        assert!(partial.contains("--probability 0.1000000000"));
    }

    #[test]
    fn node_port_with_local_policy_has_kube_proxy_chains() {
        let mut services = cluster(2);
        services[1].node_port = Some(30080);
        let rules = restore_input(&CONFIG, &services, IptablesSync::Full);
        let ext = ext_chain(&services[1]);
        assert!(rules.contains(&format!("--dport 30080 -j {ext}\n")));
        assert_eq!(rules.matches(&format!("-A {ext} ")).count(), 4);
        assert!(rules.contains(&format!("-A {ext} -j {}\n", svl_chain(&services[1]))));
        assert_eq!(rules.matches("-A KUBE-NODEPORTS ").count(), 1);
    }
}
