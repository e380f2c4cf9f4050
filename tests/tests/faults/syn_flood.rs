//! A SYN flood from spoofed sources against a NodePort whose backend is on another node
//! (every flow SNATed): established idle connections survive it, the SNAT ports it takes
//! come back after the SYN timeout, and exhaustion is counted meanwhile.
//!
//! The SNAT range (2,000 ports) is small enough for the flood to exhaust it once the 1,000
//! idle connections hold their ports, and the main conntrack table is sized for those
//! connections with little room to spare, so that flood entries in it would evict them.
//! The SYN timeout is 3 s instead of 60 s, to keep the test short.
use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpStream},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use socklb_tests::{
    Agent, ManifestDir, Sandbox,
    echo::{EchoServer, echo},
    lan::{NODE1, POD2, POD2_ENDPOINT, counters, lan, nodes, service, slice},
};

const IDLE_CONNECTIONS: usize = 1_000;
const SPOOFED_SYNS: u32 = 20_000;
const NODE_PORT: u16 = 30120;
const SYN_TIMEOUT_S: u64 = 3;

#[test]
fn a_syn_flood_neither_evicts_established_flows_nor_keeps_the_snat_ports() {
    let sandbox = Sandbox::new("syn-flood");
    let lan = lan("y");
    let _echo = EchoServer::start(&lan.pod2, SocketAddrV4::new(POD2, 8080));
    let manifests = ManifestDir::new(&sandbox);
    nodes(&manifests);
    manifests.write(
        "web.yaml",
        &format!(
            "{}---\n{}",
            service(
                "web",
                "10.96.0.120",
                &format!(
                    "[{{name: http, port: 80, targetPort: 8080, nodePort: {NODE_PORT}, protocol: TCP}}]"
                ),
                "  type: NodePort",
                None
            ),
            slice("web-1", "web", ("http", 8080, "TCP"), &[POD2_ENDPOINT])
        ),
    );
    let syn_timeout = format!("{SYN_TIMEOUT_S}s");
    let agent = Agent::start(
        &sandbox,
        &manifests.path,
        "node1",
        &[
            "--snat-port-range",
            "61000-62999",
            "--max-conntrack-entries",
            "2560",
            "--conntrack-tcp-timeout-syn",
            &syn_timeout,
        ],
    );
    let frontend = SocketAddrV4::new(NODE1.parse().expect("node address"), NODE_PORT);

    let mut idle: Vec<TcpStream> = lan.client.enter(|| {
        (0..IDLE_CONNECTIONS)
            .map(|i| {
                let mut stream =
                    TcpStream::connect_timeout(&frontend.into(), Duration::from_secs(5))
                        .unwrap_or_else(|e| panic!("idle connection {i}: {e}"));
                echo(&mut stream).unwrap_or_else(|e| panic!("idle connection {i}: {e}"));
                stream
            })
            .collect()
    });

    let before = counters(&sandbox);
    lan.client.enter(|| syn_flood(frontend, SPOOFED_SYNS));
    let flooded = Instant::now();
    let after = counters(&sandbox);
    assert!(
        after.snat_exhausted > before.snat_exhausted,
        "the flood exhausted the SNAT range: {after:?}"
    );

    // Every idle connection echoes a byte; one deadline for all, so that a broken run fails
    // in seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    let failed: Vec<String> = idle
        .iter_mut()
        .map(|stream| stream.write_all(b"x"))
        .collect::<Vec<_>>()
        .into_iter()
        .zip(idle.iter_mut())
        .enumerate()
        .filter_map(|(i, (written, stream))| {
            let left = deadline.saturating_duration_since(Instant::now());
            let result = written.and_then(|()| {
                stream.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte)
            });
            result.err().map(|e| format!("{i}: {e}"))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {IDLE_CONNECTIONS} idle connections broke (resets: {}): {:?}\n{}",
        failed.len(),
        failed.iter().filter(|f| f.contains("reset")).count(),
        &failed[..failed.len().min(5)],
        agent.log()
    );

    // A new client gets a SNAT port once the flood's unconfirmed flows time out: after the
    // configured SYN timeout, not the 60 s default (the margin is for a loaded machine;
    // with the default, or a timeout never written to the node map, this fails).
    let within = Duration::from_secs(SYN_TIMEOUT_S + 10);
    let deadline = flooded + within;
    let attempts = lan.client.enter(|| {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match TcpStream::connect_timeout(&frontend.into(), Duration::from_secs(5)) {
                Ok(mut stream) => {
                    echo(&mut stream).expect("the new connection echoes");
                    break attempts;
                }
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "no new connection within {within:?} of the flood: {e}; {:?}",
                    counters(&sandbox)
                ),
            }
        }
    });
    println!(
        "new connection after {:?} and {attempts} attempts; counters {:?}",
        flooded.elapsed(),
        counters(&sandbox)
    );
    assert_eq!(counters(&sandbox).errors, 0);
}

/// `count` TCP SYNs to `target` from spoofed sources (198.18.0.0/15, the benchmarking
/// range) through a raw socket of this thread's namespace.
fn syn_flood(target: SocketAddrV4, count: u32) {
    // SAFETY: plain socket creation; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
    // SAFETY: the descriptor was just created and is owned by nobody else.
    let socket = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let destination = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(*target.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 0));
    for i in 0..count {
        let source = Ipv4Addr::from(base + i);
        let port = 1024 + u16::try_from(i % 60_000).expect("port");
        let packet = syn_packet(source, port, target);
        loop {
            // SAFETY: sendto with our socket, a buffer of the length passed and a
            // sockaddr_in of the size passed.
            let sent = unsafe {
                libc::sendto(
                    socket.as_raw_fd(),
                    packet.as_ptr().cast(),
                    packet.len(),
                    0,
                    std::ptr::from_ref(&destination).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            };
            if sent == packet.len() as isize {
                break;
            }
            let error = std::io::Error::last_os_error();
            // The device queue is full: a flood outpaces it; send on.
            assert_eq!(error.raw_os_error(), Some(libc::ENOBUFS), "sendto: {error}");
            std::thread::yield_now();
        }
    }
}

/// An IPv4 TCP SYN (20-byte headers, no options) with its TCP checksum; the kernel fills
/// in the IP checksum of a raw IP_HDRINCL packet.
fn syn_packet(source: Ipv4Addr, source_port: u16, target: SocketAddrV4) -> [u8; 40] {
    let mut packet = [0u8; 40];
    packet[0] = 0x45;
    packet[2..4].copy_from_slice(&40u16.to_be_bytes());
    packet[8] = 64;
    packet[9] = libc::IPPROTO_TCP as u8;
    packet[12..16].copy_from_slice(&source.octets());
    packet[16..20].copy_from_slice(&target.ip().octets());
    let tcp = &mut packet[20..];
    tcp[0..2].copy_from_slice(&source_port.to_be_bytes());
    tcp[2..4].copy_from_slice(&target.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&u32::from(source).to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02;
    tcp[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    let mut sum: u32 = 0;
    for pair in packet[12..20].chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    sum += u32::from(libc::IPPROTO_TCP as u16) + 20;
    for pair in packet[20..].chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let checksum = !(sum as u16);
    packet[36..38].copy_from_slice(&checksum.to_be_bytes());
    packet
}
