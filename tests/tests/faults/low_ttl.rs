//! A packet from outside with a TTL of 1 cannot be forwarded to a backend on another node:
//! it is dropped (counted as `ttl_exceeded`) before it takes a conntrack entry or a SNAT
//! port, so that such packets cannot use up the SNAT range; one of a flow already known is
//! dropped too, and the flow keeps its port. One to a backend on this node is
//! left to the kernel's path, which answers ICMP time exceeded as it would without socklb
//! (traceroute to a NodePort), and takes no conntrack entry either. Over IPv6 the hop limit
//! plays the TTL's part.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use socklb_agent::inspect;
use socklb_tests::{
    Agent, NamedServer, eventually,
    family::Family,
    interrupted::uninterrupted,
    lan::{Addresses, LanNode},
    raw_socket,
};

socklb_tests::for_each_family!(
    a_packet_with_ttl_1_takes_no_conntrack_entry_and_is_counted,
    a_packet_with_ttl_1_to_a_local_backend_is_left_to_the_kernel_without_a_conntrack_entry,
);

fn a_packet_with_ttl_1_takes_no_conntrack_entry_and_is_counted(family: Family) {
    // pod2, behind node2: a remote backend.
    let dns = DnsNodePort::start(family, ("low-ttl", "t"), 2, (95, 30053));
    let (node, a) = (&dns.node, &dns.node.a);
    let socket = node.udp_client(40200);
    let client_flows = || forward_flows(node, 40200);
    let node_port = Addresses::at(a.node1, 30053);

    let before = node.counters();
    set_hop_limit(&socket, family, 1);
    socket.send_to(b"ping", &node_port).expect("send");
    eventually(
        "the TTL-1 datagram counted",
        Duration::from_secs(10),
        || {
            let flows = client_flows();
            assert!(
                flows.is_empty(),
                "the TTL-1 datagram made a conntrack entry: {flows:?}"
            );
            ttl_exceeded_since(node, before.ttl_exceeded)
        },
    );
    // Counted, and still no entry.
    assert!(client_flows().is_empty());

    // The same flow with a usable TTL is translated, both ways.
    set_hop_limit(&socket, family, 64);
    socket.send_to(b"ping", &node_port).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = receive(&socket, &mut buffer);
    assert_eq!(from.to_string(), node_port);
    let answer = String::from_utf8_lossy(&buffer[..len]).into_owned();
    assert!(answer.starts_with("pod2 "), "{answer}");
    assert_eq!(client_flows().len(), 1, "the flow's forward entry");

    // A TTL-1 datagram of the flow now known is dropped and counted too, and the flow
    // keeps its SNAT port: the backend sees the next datagram from the same address.
    let counted = node.counters().ttl_exceeded;
    set_hop_limit(&socket, family, 1);
    socket.send_to(b"ping", &node_port).expect("send");
    eventually(
        "the TTL-1 datagram of a known flow counted",
        Duration::from_secs(10),
        || ttl_exceeded_since(node, counted),
    );
    set_hop_limit(&socket, family, 64);
    socket.send_to(b"ping", &node_port).expect("send");
    let (len, from) = receive(&socket, &mut buffer);
    assert_eq!(from.to_string(), node_port);
    assert_eq!(String::from_utf8_lossy(&buffer[..len]), answer);
    assert_eq!(node.counters().errors, 0);
}

fn a_packet_with_ttl_1_to_a_local_backend_is_left_to_the_kernel_without_a_conntrack_entry(
    family: Family,
) {
    let dns = DnsNodePort::start(family, ("low-ttl-local", "k"), 1, (94, 30052));
    let (node, a) = (&dns.node, &dns.node.a);
    let socket = node.udp_client(40201);
    let icmp = node.lan.client.enter(|| IcmpReceiver::open(family));
    let client_flows = || forward_flows(node, 40201);
    let node_port = Addresses::at(a.node1, 30052);

    let before = node.counters();
    set_hop_limit(&socket, family, 1);
    socket.send_to(b"ping", &node_port).expect("send");
    // The kernel forwarding the translated datagram to pod1 answers time exceeded, quoting
    // it as translated.
    let quoted = icmp.time_exceeded(40201);
    assert_eq!(quoted, SocketAddr::new(a.pod1, 5353));
    assert!(
        client_flows().is_empty(),
        "the TTL-1 datagram made a conntrack entry: {:?}",
        client_flows()
    );
    let after = node.counters();
    assert_eq!(after.ttl_exceeded, before.ttl_exceeded, "not socklb's drop");
    assert_eq!(after.errors, 0);

    // The same flow with a usable TTL is translated, both ways.
    set_hop_limit(&socket, family, 64);
    socket.send_to(b"ping", &node_port).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = receive(&socket, &mut buffer);
    assert_eq!(from.to_string(), node_port);
    assert!(buffer[..len].starts_with(b"pod1 "));
    assert_eq!(client_flows().len(), 1, "the flow's forward entry");
}

/// node1 on the LAN, a UDP server in one pod, and Service dns (port 53 -> 5353) whose only
/// endpoint it is, reached through its NodePort; the agent runs.
struct DnsNodePort {
    _agent: Agent,
    _server: NamedServer,
    node: LanNode,
}

impl DnsNodePort {
    /// The LAN of (`test`, `tag`), the server in pod `pod` (1 or 2), and Service dns on
    /// (cluster IP [`Family::vip`]`(host)`, `node_port`).
    fn start(
        family: Family,
        (test, tag): (&str, &str),
        pod: u8,
        (host, node_port): (u8, u16),
    ) -> Self {
        let node = LanNode::new(family, test, tag);
        let server = node.udp_server(pod, 5353);
        let endpoint = if pod == 1 {
            node.a.pod1_endpoint()
        } else {
            node.a.pod2_endpoint()
        };
        let service = node
            .a
            .exposed("dns", host)
            .port("dns", 53, 5353, node_port, "UDP");
        node.write("dns.yaml", &service.endpoints(&[endpoint]).yaml());
        Self {
            _agent: node.agent(&[]),
            _server: server,
            node,
        }
    }
}

/// Ok once socklb counted a packet whose TTL ran out since it counted `before`.
fn ttl_exceeded_since(node: &LanNode, before: u64) -> Result<(), String> {
    match node.counters() {
        now if now.ttl_exceeded > before => Ok(()),
        now => Err(format!("not counted: {now:?}")),
    }
}

/// The forward conntrack entries of the client's flows from `port`.
fn forward_flows(node: &LanNode, port: u16) -> Vec<inspect::ConntrackState> {
    node.client_flows(port)
        .into_iter()
        .filter(|c| c.direction == "forward")
        .collect()
}

/// Sets the TTL of the datagrams `socket` sends: `IP_TTL`, or (IPv6) the unicast hop
/// limit, which std sets only on nightly.
fn set_hop_limit(socket: &UdpSocket, family: Family, hops: u8) {
    match family {
        Family::V4 => socket.set_ttl(u32::from(hops)).expect("IP_TTL"),
        Family::V6 => {
            let hops = libc::c_int::from(hops);
            raw_socket::set_option(socket, libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, &hops)
                .expect("IPV6_UNICAST_HOPS");
        }
    }
}

/// A raw ICMP (ICMPv6) socket of the namespace it was opened in: sees every ICMP message
/// arriving.
struct IcmpReceiver {
    socket: OwnedFd,
    family: Family,
}

impl IcmpReceiver {
    fn open(family: Family) -> Self {
        let (domain, protocol) = match family {
            Family::V4 => (libc::AF_INET, libc::IPPROTO_ICMP),
            Family::V6 => (libc::AF_INET6, libc::IPPROTO_ICMPV6),
        };
        let socket = raw_socket::open(domain, protocol);
        raw_socket::set_receive_timeout(&socket, Duration::from_secs(1)).expect("SO_RCVTIMEO");
        Self { socket, family }
    }

    /// The destination quoted by the first ICMP time exceeded about a UDP datagram from
    /// `source_port`, waiting up to 10 s.
    fn time_exceeded(&self, source_port: u16) -> SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut packet = [0u8; 1500];
        loop {
            assert!(
                Instant::now() < deadline,
                "no ICMP time exceeded about the datagram from port {source_port}"
            );
            let Ok(len) = raw_socket::receive(&self.socket, &mut packet, 0) else {
                continue;
            };
            if let Some(quoted) = self.quoted_destination(&packet[..len], source_port) {
                return quoted;
            }
        }
    }

    /// The destination of the UDP datagram from `source_port` that `packet` quotes, if it
    /// is a time exceeded about one. A raw IPv4 socket receives the IP header, an ICMPv6
    /// one the ICMP message alone; after the ICMP header (8 bytes) comes the quoted IP
    /// header (without extension headers here) and 8 bytes of UDP.
    fn quoted_destination(&self, packet: &[u8], source_port: u16) -> Option<SocketAddr> {
        let (icmp, time_exceeded) = match self.family {
            Family::V4 => {
                let ihl = usize::from(packet.first()? & 0x0f) * 4;
                (packet.get(ihl..)?, 11)
            }
            Family::V6 => (packet, 3),
        };
        if icmp.first() != Some(&time_exceeded) {
            return None;
        }
        let quoted = icmp.get(8..)?;
        let (protocol, destination, udp) = match self.family {
            Family::V4 => {
                let ihl = usize::from(quoted.first()? & 0x0f) * 4;
                let octets: [u8; 4] = quoted.get(16..20)?.try_into().ok()?;
                (*quoted.get(9)?, IpAddr::from(Ipv4Addr::from(octets)), ihl)
            }
            Family::V6 => {
                let octets: [u8; 16] = quoted.get(24..40)?.try_into().ok()?;
                (*quoted.get(6)?, IpAddr::from(Ipv6Addr::from(octets)), 40)
            }
        };
        let ports = quoted.get(udp..udp + 4)?;
        (protocol == libc::IPPROTO_UDP as u8
            && u16::from_be_bytes([ports[0], ports[1]]) == source_port)
            .then(|| SocketAddr::new(destination, u16::from_be_bytes([ports[2], ports[3]])))
    }
}

/// The next datagram `socket` receives, within its read timeout.
fn receive(socket: &UdpSocket, buffer: &mut [u8]) -> (usize, SocketAddr) {
    uninterrupted(|| socket.recv_from(buffer)).expect("an answer")
}
