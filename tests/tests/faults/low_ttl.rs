//! A packet from outside with a TTL of 1 cannot be forwarded to a backend on another node:
//! it is dropped (counted as `ttl_exceeded`) before it takes a conntrack entry or a SNAT
//! port, so that such packets cannot use up the SNAT range; one of a flow already known is
//! dropped too, and the flow keeps its port. One to a backend on this node is
//! left to the kernel's path, which answers ICMP time exceeded as it would without socklb
//! (traceroute to a NodePort), and takes no conntrack entry either. Over IPv6 the hop limit
//! plays the TTL's part.
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use socklb_agent::inspect;
use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox,
    family::Family,
    lan::{Addresses, addresses, counters, lan},
};

#[test]
fn a_packet_with_ttl_1_takes_no_conntrack_entry_and_is_counted_over_ipv4() {
    a_packet_with_ttl_1_takes_no_conntrack_entry_and_is_counted(Family::V4);
}

#[test]
fn a_packet_with_ttl_1_takes_no_conntrack_entry_and_is_counted_over_ipv6() {
    a_packet_with_ttl_1_takes_no_conntrack_entry_and_is_counted(Family::V6);
}

fn a_packet_with_ttl_1_takes_no_conntrack_entry_and_is_counted(family: Family) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("low-ttl{}", family.tag()));
    let lan = lan(&format!("t{}", family.tag()));
    let _server = NamedServer::udp_in(&lan.pod2, "pod2", SocketAddr::new(a.pod2, 5353));
    let manifests = ManifestDir::new(&sandbox);
    dns_node_port(&a, &manifests, 95, 30053, a.pod2_endpoint());
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);

    let socket = lan.client.enter(|| client_socket(&a, 40200));
    let client_flows = || client_flows(&sandbox, &a, 40200);
    let node_port = Addresses::at(a.node1, 30053);

    let before = counters(&sandbox);
    set_hop_limit(&socket, family, 1);
    socket.send_to(b"ping", &node_port).expect("send");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let flows = client_flows();
        assert!(
            flows.is_empty(),
            "the TTL-1 datagram made a conntrack entry: {flows:?}"
        );
        if counters(&sandbox).ttl_exceeded > before.ttl_exceeded {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the TTL-1 datagram was not counted: {:?}",
            counters(&sandbox)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Counted, and still no entry.
    assert!(client_flows().is_empty());

    // The same flow with a usable TTL is translated, both ways.
    set_hop_limit(&socket, family, 64);
    socket.send_to(b"ping", &node_port).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = socket.recv_from(&mut buffer).expect("an answer");
    assert_eq!(from.to_string(), node_port);
    let answer = String::from_utf8_lossy(&buffer[..len]).into_owned();
    assert!(answer.starts_with("pod2 "), "{answer}");
    assert_eq!(client_flows().len(), 1, "the flow's forward entry");

    // A TTL-1 datagram of the flow now known is dropped and counted too, and the flow
    // keeps its SNAT port: the backend sees the next datagram from the same address.
    let counted = counters(&sandbox).ttl_exceeded;
    set_hop_limit(&socket, family, 1);
    socket.send_to(b"ping", &node_port).expect("send");
    let deadline = Instant::now() + Duration::from_secs(10);
    while counters(&sandbox).ttl_exceeded == counted {
        assert!(
            Instant::now() < deadline,
            "the TTL-1 datagram of a known flow was not counted: {:?}",
            counters(&sandbox)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    set_hop_limit(&socket, family, 64);
    socket.send_to(b"ping", &node_port).expect("send");
    let (len, from) = socket.recv_from(&mut buffer).expect("an answer");
    assert_eq!(from.to_string(), node_port);
    assert_eq!(String::from_utf8_lossy(&buffer[..len]), answer);
    assert_eq!(counters(&sandbox).errors, 0);
}

#[test]
fn a_packet_with_ttl_1_to_a_local_backend_is_left_to_the_kernel_without_a_conntrack_entry_over_ipv4()
 {
    a_packet_with_ttl_1_to_a_local_backend_is_left_to_the_kernel_without_a_conntrack_entry(
        Family::V4,
    );
}

#[test]
fn a_packet_with_ttl_1_to_a_local_backend_is_left_to_the_kernel_without_a_conntrack_entry_over_ipv6()
 {
    a_packet_with_ttl_1_to_a_local_backend_is_left_to_the_kernel_without_a_conntrack_entry(
        Family::V6,
    );
}

fn a_packet_with_ttl_1_to_a_local_backend_is_left_to_the_kernel_without_a_conntrack_entry(
    family: Family,
) {
    let a = addresses(family);
    let sandbox = Sandbox::new(&format!("low-ttl-local{}", family.tag()));
    let lan = lan(&format!("k{}", family.tag()));
    let _server = NamedServer::udp_in(&lan.pod1, "pod1", SocketAddr::new(a.pod1, 5353));
    let manifests = ManifestDir::new(&sandbox);
    dns_node_port(&a, &manifests, 94, 30052, a.pod1_endpoint());
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);

    let (socket, icmp) = lan
        .client
        .enter(|| (client_socket(&a, 40201), IcmpReceiver::open(family)));
    let client_flows = || client_flows(&sandbox, &a, 40201);
    let node_port = Addresses::at(a.node1, 30052);

    let before = counters(&sandbox);
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
    let after = counters(&sandbox);
    assert_eq!(after.ttl_exceeded, before.ttl_exceeded, "not socklb's drop");
    assert_eq!(after.errors, 0);

    // The same flow with a usable TTL is translated, both ways.
    set_hop_limit(&socket, family, 64);
    socket.send_to(b"ping", &node_port).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = socket.recv_from(&mut buffer).expect("an answer");
    assert_eq!(from.to_string(), node_port);
    assert!(buffer[..len].starts_with(b"pod1 "));
    assert_eq!(client_flows().len(), 1, "the flow's forward entry");
}

/// The nodes and a UDP NodePort Service `dns` (port 53 -> 5353) with one endpoint.
fn dns_node_port(
    a: &Addresses,
    manifests: &ManifestDir,
    vip_host: u8,
    node_port: u16,
    endpoint: (String, &str),
) {
    a.nodes(manifests);
    let ports = format!(
        "[{{name: dns, port: 53, targetPort: 5353, nodePort: {node_port}, protocol: UDP}}]"
    );
    manifests.write(
        "dns.yaml",
        &format!(
            "{}---\n{}",
            a.service("dns", vip_host, &ports, "  type: NodePort", false),
            a.slice("dns-1", "dns", ("dns", 5353, "UDP"), &[endpoint])
        ),
    );
}

/// The outside client's UDP socket on `port` (in the namespace it is called in).
fn client_socket(a: &Addresses, port: u16) -> UdpSocket {
    let socket = UdpSocket::bind(Addresses::at(a.client, port)).expect("bind the client");
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    socket
}

/// Sets the TTL of the datagrams `socket` sends: `IP_TTL`, or (IPv6) the unicast hop
/// limit, which std sets only on nightly.
fn set_hop_limit(socket: &UdpSocket, family: Family, hops: u8) {
    match family {
        Family::V4 => socket.set_ttl(u32::from(hops)).expect("IP_TTL"),
        Family::V6 => {
            let hops = libc::c_int::from(hops);
            // SAFETY: setsockopt on our socket with an int of the size passed.
            let rc = unsafe {
                libc::setsockopt(
                    socket.as_raw_fd(),
                    libc::IPPROTO_IPV6,
                    libc::IPV6_UNICAST_HOPS,
                    std::ptr::from_ref(&hops).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(
                rc,
                0,
                "IPV6_UNICAST_HOPS: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// The conntrack entries of flows from the outside client's `port`.
fn client_flows(sandbox: &Sandbox, a: &Addresses, port: u16) -> Vec<inspect::ConntrackState> {
    let client = Addresses::at(a.client, port);
    inspect::inspect(&sandbox.pin_dir, None)
        .expect("inspect")
        .conntrack
        .into_iter()
        .filter(|c| c.from.to_string() == client)
        .collect()
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
        // SAFETY: plain socket creation; the descriptor is owned below.
        let fd = unsafe { libc::socket(domain, libc::SOCK_RAW, protocol) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: the descriptor was just created and is owned by nobody else.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        let timeout = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: setsockopt on our socket with a timeval of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::from_ref(&timeout).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_RCVTIMEO: {}", std::io::Error::last_os_error());
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
            // SAFETY: recv into a buffer of the length passed, on our socket.
            let len = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    packet.as_mut_ptr().cast(),
                    packet.len(),
                    0,
                )
            };
            let Ok(len) = usize::try_from(len) else {
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
