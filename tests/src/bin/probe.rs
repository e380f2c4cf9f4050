//! A real client for the privileged tests: connects (TCP, connected UDP) or sends (unconnected
//! UDP) to an address, and prints one JSON line per attempt with what the kernel and the
//! server said: the peer address the socket reports, the server's reply (its name), and the
//! error if any. Run inside a test cgroup, it is "a process on the node".
//!
//! `socklb-probe tcp|udp|udp-connected ADDR:PORT [COUNT|SECONDSs] [PAUSE_MS] [SOURCE_PORT]`
//!
//! COUNT attempts, or as many as fit in SECONDS (e.g. `20s`).
//!
//! With SOURCE_PORT every attempt's new socket binds that port (as `nc -p` does), so that
//! successive attempts are one flow to conntrack.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use serde::Serialize;
use socklb_tests::monotonic_ns;

#[derive(Serialize)]
struct Attempt {
    /// CLOCK_MONOTONIC before the connect/send, in ns (comparable across processes).
    started_ns: u64,
    /// CLOCK_MONOTONIC once the attempt ended (reply read, or failed).
    finished_ns: u64,
    /// getpeername() (TCP, connected UDP) or the reply's source (unconnected UDP).
    peer: Option<String>,
    reply: Option<String>,
    error: Option<String>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, mode, target, rest @ ..] = args.as_slice() else {
        eprintln!(
            "usage: socklb-probe tcp|udp|udp-connected ADDR:PORT [COUNT|SECONDSs] [PAUSE_MS] \
             [SOURCE_PORT]"
        );
        std::process::exit(2);
    };
    let target: SocketAddr = target.parse().unwrap_or_else(|e| {
        eprintln!("bad address {target}: {e}");
        std::process::exit(2);
    });
    let (count, deadline) = match rest.first() {
        Some(seconds) if seconds.ends_with('s') => {
            let seconds: u64 = seconds.trim_end_matches('s').parse().unwrap_or_else(|e| {
                eprintln!("bad duration {seconds}: {e}");
                std::process::exit(2);
            });
            (
                u32::MAX,
                Some(Instant::now() + Duration::from_secs(seconds)),
            )
        }
        count => (count.and_then(|c| c.parse().ok()).unwrap_or(1), None),
    };
    let pause = Duration::from_millis(rest.get(1).and_then(|p| p.parse().ok()).unwrap_or(0));
    let source_port: u16 = rest.get(2).and_then(|p| p.parse().ok()).unwrap_or(0);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for _ in 0..count {
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return;
        }
        let started_ns = monotonic_ns();
        let result = match mode.as_str() {
            "tcp" => tcp(target),
            "udp" => udp(target, false, source_port),
            "udp-connected" => udp(target, true, source_port),
            other => {
                eprintln!("unknown mode {other}");
                std::process::exit(2);
            }
        };
        let finished_ns = monotonic_ns();
        let attempt = match result {
            Ok((peer, reply)) => Attempt {
                started_ns,
                finished_ns,
                peer: Some(peer.to_string()),
                reply: Some(reply),
                error: None,
            },
            Err(error) => Attempt {
                started_ns,
                finished_ns,
                peer: None,
                reply: None,
                error: Some(error_name(&error)),
            },
        };
        let line = serde_json::to_string(&attempt).unwrap_or_default();
        if writeln!(out, "{line}").is_err() {
            return;
        }
        std::thread::sleep(pause);
    }
}

fn tcp(target: SocketAddr) -> std::io::Result<(SocketAddr, String)> {
    let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let peer = stream.peer_addr()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply)?;
    Ok((peer, reply))
}

fn udp(
    target: SocketAddr,
    connected: bool,
    source_port: u16,
) -> std::io::Result<(SocketAddr, String)> {
    let any = if target.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], source_port))
    } else {
        SocketAddr::from(([0u16; 8], source_port))
    };
    let socket = UdpSocket::bind(any)?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buffer = [0u8; 512];
    if connected {
        socket.connect(target)?;
        socket.send(b"ping")?;
        let peer = socket.peer_addr()?;
        let (len, from) = socket.recv_from(&mut buffer)?;
        if from != peer {
            return Err(std::io::Error::other(format!(
                "reply from {from}, peer {peer}"
            )));
        }
        Ok((peer, String::from_utf8_lossy(&buffer[..len]).into_owned()))
    } else {
        socket.send_to(b"ping", target)?;
        let (len, from) = socket.recv_from(&mut buffer)?;
        Ok((from, String::from_utf8_lossy(&buffer[..len]).into_owned()))
    }
}

fn error_name(error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(libc::ECONNREFUSED) => "ECONNREFUSED".to_owned(),
        Some(libc::ENETUNREACH) => "ENETUNREACH".to_owned(),
        // What an unreachable route gives (the testbed's nodes with the per-packet path).
        Some(libc::EHOSTUNREACH) => "EHOSTUNREACH".to_owned(),
        Some(libc::EPERM) => "EPERM".to_owned(),
        // What a blackhole route gives: the destination was not translated.
        Some(libc::EINVAL) => "EINVAL".to_owned(),
        _ => error.to_string(),
    }
}
