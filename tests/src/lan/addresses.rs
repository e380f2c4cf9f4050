//! The LAN's addresses, of either family: the constants, and [`Addresses`], one family's
//! set as text (what manifests and probes take).
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::family::Family;

pub const NODE1: &str = "10.77.0.1";
pub const NODE2: &str = "10.77.0.2";
pub const CLIENT: &str = "10.77.0.10";
pub const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 10);
pub const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 10);
pub const LB_IP: &str = "192.0.2.100";
pub const EXTERNAL_IP: &str = "198.51.100.7";

/// The IPv6 twins of the addresses above.
pub mod lan6 {
    use std::net::Ipv6Addr;

    pub const NODE1: &str = "fd00:77::1";
    pub const NODE2: &str = "fd00:77::2";
    pub const CLIENT: &str = "fd00:77::10";
    pub const POD1: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 0x10);
    pub const POD2: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 0x10);
    pub const LB_IP: &str = "fd00:192::100";
    pub const EXTERNAL_IP: &str = "fd00:198::7";
    /// LoadBalancer IPs and externalIPs: blackholed on node1, so that a packet the
    /// programs did not translate goes nowhere.
    pub const FRONTEND_CIDRS: [&str; 2] = ["fd00:192::/64", "fd00:198::/64"];
}

/// The LAN's addresses of one family, as text (what manifests and probes take).
#[derive(Clone, Copy, Debug)]
pub struct Addresses {
    pub family: Family,
    pub node1: &'static str,
    pub node2: &'static str,
    pub client: &'static str,
    pub pod1: IpAddr,
    pub pod2: IpAddr,
    pub lb_ip: &'static str,
    pub external_ip: &'static str,
    /// The pod network (what a CNI's rules name).
    pub pod_cidr: &'static str,
    /// A second externalIP and a client range that excludes the client, for scenarios that
    /// need more than one.
    pub external_ip2: &'static str,
    pub other_clients: &'static str,
    /// A range holding the client (and little else).
    pub client_range: &'static str,
}

pub fn addresses(family: Family) -> Addresses {
    match family {
        Family::V4 => Addresses {
            family,
            node1: NODE1,
            node2: NODE2,
            client: CLIENT,
            pod1: POD1.into(),
            pod2: POD2.into(),
            lb_ip: LB_IP,
            external_ip: EXTERNAL_IP,
            pod_cidr: "10.244.0.0/16",
            external_ip2: "198.51.100.8",
            other_clients: "203.0.113.0/24",
            client_range: "10.77.0.0/28",
        },
        Family::V6 => Addresses {
            family,
            node1: lan6::NODE1,
            node2: lan6::NODE2,
            client: lan6::CLIENT,
            pod1: lan6::POD1.into(),
            pod2: lan6::POD2.into(),
            lb_ip: lan6::LB_IP,
            external_ip: lan6::EXTERNAL_IP,
            pod_cidr: "fd00:244::/32",
            external_ip2: "fd00:198::8",
            other_clients: "fd00:203::/48",
            client_range: "fd00:77::/120",
        },
    }
}

impl Addresses {
    /// `address:port` as a socket address (brackets around IPv6).
    pub fn at(address: &str, port: u16) -> String {
        let address: IpAddr = address
            .parse()
            .unwrap_or_else(|e| panic!("address {address}: {e}"));
        SocketAddr::new(address, port).to_string()
    }

    /// The endpoint of pod1 (on node1) and of pod2 (on node2), as [`Addresses::slice`] takes
    /// them.
    pub fn pod1_endpoint(&self) -> (String, &'static str) {
        (self.pod1.to_string(), "node1")
    }

    pub fn pod2_endpoint(&self) -> (String, &'static str) {
        (self.pod2.to_string(), "node2")
    }
}
