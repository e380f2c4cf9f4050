//! A packet from outside with a TTL of 1 cannot be forwarded to a backend on another node:
//! it is dropped (counted as `ttl_exceeded`) before it takes a conntrack entry or a SNAT
//! port, so that such packets cannot use up the SNAT range. One to a backend on this node is
//! left to the kernel's path, which answers ICMP time exceeded as it would without socklb
//! (traceroute to a NodePort), and takes no conntrack entry either.
use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use socklb_agent::inspect;
use socklb_tests::{
    Agent, ManifestDir, NamedServer, Sandbox,
    lan::{
        CLIENT, NODE1, POD1, POD1_ENDPOINT, POD2, POD2_ENDPOINT, counters, lan, nodes, service,
        slice,
    },
};

#[test]
fn a_packet_with_ttl_1_takes_no_conntrack_entry_and_is_counted() {
    let sandbox = Sandbox::new("low-ttl");
    let lan = lan("t");
    let _server = NamedServer::udp_in(&lan.pod2, "pod2", SocketAddrV4::new(POD2, 5353));
    let manifests = ManifestDir::new(&sandbox);
    dns_node_port(&manifests, "10.96.0.95", 30053, POD2_ENDPOINT);
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);

    let socket = lan.client.enter(|| client_socket(40200));
    let client_flows = || client_flows(&sandbox, 40200);

    let before = counters(&sandbox);
    socket.set_ttl(1).expect("IP_TTL");
    socket.send_to(b"ping", (NODE1, 30053)).expect("send");
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
    socket.set_ttl(64).expect("IP_TTL");
    socket.send_to(b"ping", (NODE1, 30053)).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = socket.recv_from(&mut buffer).expect("an answer");
    assert_eq!(from.to_string(), format!("{NODE1}:30053"));
    assert!(buffer[..len].starts_with(b"pod2 "));
    assert_eq!(client_flows().len(), 1, "the flow's forward entry");
    assert_eq!(counters(&sandbox).errors, 0);
}

#[test]
fn a_packet_with_ttl_1_to_a_local_backend_is_left_to_the_kernel_without_a_conntrack_entry() {
    let sandbox = Sandbox::new("low-ttl-local");
    let lan = lan("k");
    let _server = NamedServer::udp_in(&lan.pod1, "pod1", SocketAddrV4::new(POD1, 5353));
    let manifests = ManifestDir::new(&sandbox);
    dns_node_port(&manifests, "10.96.0.94", 30052, POD1_ENDPOINT);
    let _agent = Agent::start(&sandbox, &manifests.path, "node1", &[]);

    let (socket, icmp) = lan
        .client
        .enter(|| (client_socket(40201), IcmpReceiver::open()));
    let client_flows = || client_flows(&sandbox, 40201);

    let before = counters(&sandbox);
    socket.set_ttl(1).expect("IP_TTL");
    socket.send_to(b"ping", (NODE1, 30052)).expect("send");
    // The kernel forwarding the translated datagram to pod1 answers time exceeded, quoting
    // it as translated.
    let quoted = icmp.time_exceeded(40201);
    assert_eq!(quoted, SocketAddrV4::new(POD1, 5353));
    assert!(
        client_flows().is_empty(),
        "the TTL-1 datagram made a conntrack entry: {:?}",
        client_flows()
    );
    let after = counters(&sandbox);
    assert_eq!(after.ttl_exceeded, before.ttl_exceeded, "not socklb's drop");
    assert_eq!(after.errors, 0);

    // The same flow with a usable TTL is translated, both ways.
    socket.set_ttl(64).expect("IP_TTL");
    socket.send_to(b"ping", (NODE1, 30052)).expect("send");
    let mut buffer = [0u8; 128];
    let (len, from) = socket.recv_from(&mut buffer).expect("an answer");
    assert_eq!(from.to_string(), format!("{NODE1}:30052"));
    assert!(buffer[..len].starts_with(b"pod1 "));
    assert_eq!(client_flows().len(), 1, "the flow's forward entry");
}

/// The nodes and a UDP NodePort Service `dns` (port 53 -> 5353) with one endpoint.
fn dns_node_port(manifests: &ManifestDir, vip: &str, node_port: u16, endpoint: (&str, &str)) {
    nodes(manifests);
    let ports = format!(
        "[{{name: dns, port: 53, targetPort: 5353, nodePort: {node_port}, protocol: UDP}}]"
    );
    manifests.write(
        "dns.yaml",
        &format!(
            "{}---\n{}",
            service("dns", vip, &ports, "  type: NodePort", None),
            slice("dns-1", "dns", ("dns", 5353, "UDP"), &[endpoint])
        ),
    );
}

/// The outside client's UDP socket on `port` (in the namespace it is called in).
fn client_socket(port: u16) -> UdpSocket {
    let socket = UdpSocket::bind((CLIENT, port)).expect("bind the client");
    socket
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    socket
}

/// The conntrack entries of flows from the outside client's `port`.
fn client_flows(sandbox: &Sandbox, port: u16) -> Vec<inspect::ConntrackState> {
    inspect::inspect(&sandbox.pin_dir, None)
        .expect("inspect")
        .conntrack
        .into_iter()
        .filter(|c| c.from.to_string() == format!("{CLIENT}:{port}"))
        .collect()
}

/// A raw ICMP socket of the namespace it was opened in: sees every ICMP message arriving.
struct IcmpReceiver(OwnedFd);

impl IcmpReceiver {
    fn open() -> Self {
        // SAFETY: plain socket creation; the descriptor is owned below.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: the descriptor was just created and is owned by nobody else.
        let socket = Self(unsafe { OwnedFd::from_raw_fd(fd) });
        let timeout = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: setsockopt on our socket with a timeval of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                socket.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::from_ref(&timeout).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_RCVTIMEO: {}", std::io::Error::last_os_error());
        socket
    }

    /// The destination quoted by the first ICMP time exceeded about a UDP datagram from
    /// `source_port`, waiting up to 10 s.
    fn time_exceeded(&self, source_port: u16) -> SocketAddrV4 {
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
                    self.0.as_raw_fd(),
                    packet.as_mut_ptr().cast(),
                    packet.len(),
                    0,
                )
            };
            let Ok(len) = usize::try_from(len) else {
                continue;
            };
            let packet = &packet[..len];
            // IP header, ICMP header (8 bytes), the quoted IP header and 8 bytes of UDP.
            let ihl = usize::from(packet.first().copied().unwrap_or(0) & 0x0f) * 4;
            let Some(icmp) = packet.get(ihl..) else {
                continue;
            };
            if icmp.first() != Some(&11) {
                continue;
            }
            let Some(quoted) = icmp.get(8..) else {
                continue;
            };
            let quoted_ihl = usize::from(quoted.first().copied().unwrap_or(0) & 0x0f) * 4;
            let (Some(addresses), Some(ports)) =
                (quoted.get(16..20), quoted.get(quoted_ihl..quoted_ihl + 4))
            else {
                continue;
            };
            if quoted.get(9) != Some(&(libc::IPPROTO_UDP as u8))
                || u16::from_be_bytes([ports[0], ports[1]]) != source_port
            {
                continue;
            }
            return SocketAddrV4::new(
                Ipv4Addr::new(addresses[0], addresses[1], addresses[2], addresses[3]),
                u16::from_be_bytes([ports[2], ports[3]]),
            );
        }
    }
}
