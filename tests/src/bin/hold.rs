//! A client that holds one connected socket for the tests of closing the sockets of removed
//! backends: it connects (TCP, connected UDP, or a DNS resolver over connected UDP), prints
//! one JSON line (the TCP server's greeting, or the reply to a first request), then acts on
//! commands read from stdin, one JSON line each:
//!
//! - `wait`: one blocking receive (30 s at most): what a client idle on its socket sees.
//! - `ping`: a request and its reply on the same socket. The `dns` resolver, like a real
//!   one, replaces its socket after an error and asks again (`reconnected`).
//!
//! socklb-hold udp|tcp|dns ADDR:PORT (`[::ffff:a.b.c.d]:PORT`: an AF_INET6 socket talking to
//! an IPv4-mapped address)
//!
//! `socklb-hold many-udp ADDR:PORT COUNT` instead connects COUNT UDP sockets (no exchange),
//! prints one line, and holds them until stdin closes: the benchmark's open sockets.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use serde::Serialize;

const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Serialize, Default)]
struct Line {
    event: String,
    /// The server's reply (a resolved address for `dns`).
    reply: Option<String>,
    /// The first error, by errno name where it matters.
    error: Option<String>,
    /// getpeername() of the socket.
    peer: Option<String>,
    /// `dns`: the resolver replaced its socket after an error.
    reconnected: bool,
}

enum Socket {
    Udp(UdpSocket),
    Tcp(BufReader<TcpStream>),
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let [_, mode, target, count] = args.as_slice()
        && mode == "many-udp"
    {
        many(target, count);
        return;
    }
    let [_, mode, target] = args.as_slice() else {
        eprintln!("usage: socklb-hold udp|tcp|dns ADDR:PORT");
        std::process::exit(2);
    };
    let target: SocketAddr = target.parse().unwrap_or_else(|e| {
        eprintln!("bad address {target}: {e}");
        std::process::exit(2);
    });
    let dns = mode == "dns";
    let mut socket = match connect(mode, target) {
        Ok(socket) => socket,
        Err(error) => {
            print(&Line {
                event: "connected".to_owned(),
                error: Some(errno(&error)),
                ..Line::default()
            });
            std::process::exit(1);
        }
    };
    // A TCP server greets first; UDP and DNS servers answer a request.
    let mut first = match socket {
        Socket::Tcp(_) => wait(&mut socket),
        Socket::Udp(_) => ping(&mut socket, dns),
    };
    first.event = "connected".to_owned();
    print(&first);
    for command in std::io::stdin().lock().lines() {
        let Ok(command) = command else { break };
        let line = match command.trim() {
            "wait" => wait(&mut socket),
            "ping" if dns => resolve_recovering(&mut socket, target),
            "ping" => ping(&mut socket, false),
            other => {
                eprintln!("unknown command {other}");
                std::process::exit(2);
            }
        };
        print(&Line {
            event: command.trim().to_owned(),
            ..line
        });
    }
}

fn connect(mode: &str, target: SocketAddr) -> std::io::Result<Socket> {
    match mode {
        "udp" | "dns" => {
            // An IPv6 target (an IPv4-mapped one too) takes an AF_INET6 socket.
            let any: SocketAddr = if target.is_ipv6() {
                "[::]:0".parse().expect("the IPv6 any address")
            } else {
                "0.0.0.0:0".parse().expect("the IPv4 any address")
            };
            let socket = UdpSocket::bind(any)?;
            socket.connect(target)?;
            socket.set_read_timeout(Some(TIMEOUT))?;
            Ok(Socket::Udp(socket))
        }
        "tcp" => {
            let stream = TcpStream::connect_timeout(&target, TIMEOUT)?;
            stream.set_read_timeout(Some(TIMEOUT))?;
            Ok(Socket::Tcp(BufReader::new(stream)))
        }
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
}

fn peer(socket: &Socket) -> Option<String> {
    match socket {
        Socket::Udp(s) => s.peer_addr(),
        Socket::Tcp(s) => s.get_ref().peer_addr(),
    }
    .ok()
    .map(|a| a.to_string())
}

fn outcome(result: std::io::Result<String>, socket: &Socket) -> Line {
    match result {
        Ok(reply) => Line {
            reply: Some(reply),
            peer: peer(socket),
            ..Line::default()
        },
        Err(error) => Line {
            error: Some(errno(&error)),
            peer: peer(socket),
            ..Line::default()
        },
    }
}

/// One receive, no request.
fn wait(socket: &mut Socket) -> Line {
    let result = match socket {
        Socket::Udp(s) => {
            let mut buffer = [0u8; 512];
            s.recv(&mut buffer)
                .map(|n| String::from_utf8_lossy(&buffer[..n]).into_owned())
        }
        Socket::Tcp(s) => read_line(s),
    };
    outcome(result, socket)
}

/// A request and its reply; `dns` asks for `who.test`.
fn ping(socket: &mut Socket, dns: bool) -> Line {
    let result = match socket {
        Socket::Udp(s) if dns => resolve(s),
        Socket::Udp(s) => s.send(b"ping").and_then(|_| {
            let mut buffer = [0u8; 512];
            s.recv(&mut buffer)
                .map(|n| String::from_utf8_lossy(&buffer[..n]).into_owned())
        }),
        Socket::Tcp(s) => s.get_mut().write_all(b"ping\n").and_then(|()| read_line(s)),
    };
    outcome(result, socket)
}

fn read_line(stream: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    let mut line = String::new();
    match stream.read_line(&mut line)? {
        0 => Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "EOF",
        )),
        _ => Ok(line.trim_end().to_owned()),
    }
}

/// What a resolver does: on an error, a new socket through the same address, once.
fn resolve_recovering(socket: &mut Socket, target: SocketAddr) -> Line {
    let first = ping(socket, true);
    if first.error.is_none() {
        return first;
    }
    match connect("dns", target) {
        Ok(fresh) => {
            *socket = fresh;
            let second = ping(socket, true);
            Line {
                error: first.error,
                reconnected: true,
                ..second
            }
        }
        Err(error) => Line {
            error: Some(errno(&error)),
            ..first
        },
    }
}

/// An A query for who.test; returns the first answer's address.
fn resolve(socket: &UdpSocket) -> std::io::Result<String> {
    let id: u16 = (std::process::id() & 0xffff) as u16;
    let mut query = Vec::new();
    query.extend(id.to_be_bytes());
    // Recursion desired, one question.
    query.extend([0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in ["who", "test"] {
        query.push(label.len() as u8);
        query.extend(label.as_bytes());
    }
    // End of name, type A, class IN.
    query.extend([0, 0, 1, 0, 1]);
    socket.send(&query)?;
    let mut answer = [0u8; 512];
    let n = socket.recv(&mut answer)?;
    let answer = &answer[..n];
    let answers = u16::from_be_bytes([answer[6], answer[7]]);
    if n < query.len() + 16 || answers == 0 || answer[..2] != query[..2] {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "no answer",
        ));
    }
    // The A record's address ends the reply.
    let a = &answer[n - 4..];
    Ok(format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]))
}

fn errno(error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(libc::ECONNABORTED) => "ECONNABORTED".to_owned(),
        Some(libc::EDESTADDRREQ) => "EDESTADDRREQ".to_owned(),
        Some(libc::ECONNRESET) => "ECONNRESET".to_owned(),
        Some(libc::ECONNREFUSED) => "ECONNREFUSED".to_owned(),
        Some(libc::EPIPE) => "EPIPE".to_owned(),
        Some(libc::EAGAIN) => "EAGAIN (timed out)".to_owned(),
        _ => error.to_string(),
    }
}

fn print(line: &Line) {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let _ = serde_json::to_writer(&mut out, line);
    let _ = writeln!(out);
    let _ = out.flush();
}

/// COUNT connected UDP sockets to ADDR:PORT, held until stdin closes.
fn many(target: &str, count: &str) {
    let (Ok(target), Ok(count)) = (target.parse::<SocketAddr>(), count.parse::<usize>()) else {
        eprintln!("usage: socklb-hold many-udp ADDR:PORT COUNT");
        std::process::exit(2);
    };
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        match UdpSocket::bind("0.0.0.0:0").and_then(|s| s.connect(target).map(|()| s)) {
            Ok(socket) => sockets.push(socket),
            Err(error) => {
                print(&Line {
                    event: "connected".to_owned(),
                    error: Some(format!(
                        "after {} sockets: {}",
                        sockets.len(),
                        errno(&error)
                    )),
                    ..Line::default()
                });
                std::process::exit(1);
            }
        }
    }
    print(&Line {
        event: "connected".to_owned(),
        reply: Some(sockets.len().to_string()),
        ..Line::default()
    });
    // Until the benchmark closes stdin (or dies).
    for _ in std::io::stdin().lock().lines() {}
}
