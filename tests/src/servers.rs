//! Real servers for the tests: threads that answer every TCP connection or UDP datagram
//! with their name (and the client address they saw), a dnsmasq process, and the thread
//! handle that stops a server's loop when dropped.
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use socklb_agent::dataplane::BackendAddr;

use crate::netns::Netns;

/// A server's loop on a thread of its own: `step` runs again and again until the handle is
/// dropped, which stops the loop and joins the thread (connections handed to threads of
/// their own end with their clients).
pub struct ServerThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ServerThread {
    /// Runs `step` until dropped; each step must return within a moment (a read timeout or
    /// a non-blocking accept), or the drop waits for it.
    pub fn run(mut step: impl FnMut() + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                step();
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Accepts connections on `listener` and hands each to `serve` (with the client's
    /// address), until dropped.
    pub fn accept(
        listener: TcpListener,
        mut serve: impl FnMut(TcpStream, SocketAddr) + Send + 'static,
    ) -> Self {
        listener.set_nonblocking(true).expect("nonblocking");
        Self::run(move || match listener.accept() {
            Ok((stream, peer)) => {
                let _ = stream.set_nonblocking(false);
                serve(stream, peer);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        })
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Placeholder in a server's reply for the client address it saw.
const PEER: &str = "{peer}";

/// A real server thread that answers every TCP connection, or every UDP datagram, with its
/// name; stops when dropped.
pub struct NamedServer {
    pub name: String,
    pub addr: SocketAddr,
    _thread: ServerThread,
}

impl NamedServer {
    pub fn tcp(name: &str, addr: SocketAddrV4) -> Self {
        Self::tcp_replying(name, addr, name)
    }

    /// Servers on 127.0.`net`.1..=`count`, port 8080, each answering its own address.
    pub fn numbered(net: u8, count: u8) -> Vec<Self> {
        (1..=count)
            .map(|i| {
                let addr = SocketAddrV4::new(Ipv4Addr::new(127, 0, net, i), 8080);
                Self::tcp(&addr.ip().to_string(), addr)
            })
            .collect()
    }

    /// A TCP server on an address of either family.
    pub fn tcp_at(name: &str, addr: SocketAddr) -> Self {
        Self::serve_tcp(name, addr, name)
    }

    /// A TCP server that answers every connection with `reply` (e.g. an HTTP response).
    pub fn tcp_replying(name: &str, addr: SocketAddrV4, reply: &str) -> Self {
        Self::serve_tcp(name, SocketAddr::V4(addr), reply)
    }

    /// A TCP server bound inside `netns` that answers `<name> <client address:port>`: which
    /// backend answered, and the source address it saw.
    pub fn tcp_in(netns: &Netns, name: &str, addr: impl Into<SocketAddr>) -> Self {
        let listener = netns.tcp_listener(addr.into());
        Self::serve_listener(name, listener, &format!("{name} {PEER}"))
    }

    fn serve_tcp(name: &str, addr: SocketAddr, reply: &str) -> Self {
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        Self::serve_listener(name, listener, reply)
    }

    /// Serves `listener`; `{peer}` in `reply` becomes the client's address.
    fn serve_listener(name: &str, listener: TcpListener, reply: &str) -> Self {
        let addr = listener.local_addr().expect("listener address");
        let reply = reply.to_owned();
        let thread = ServerThread::accept(listener, move |mut stream, peer| {
            // An HTTP client's request is read first: closing with unread data would reset
            // the connection under the response.
            if reply.starts_with("HTTP/") {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                let _ = stream.read(&mut [0u8; 2048]);
            }
            let text = reply.replace(PEER, &peer.to_string());
            let _ = stream.write_all(text.as_bytes());
            // Half-close and drain until the client closes: closing with a request unread
            // (curl's) would reset the connection under the reply.
            let _ = stream.shutdown(std::net::Shutdown::Write);
            let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
            let mut sink = [0u8; 2048];
            while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
        });
        Self {
            name: name.to_owned(),
            addr,
            _thread: thread,
        }
    }

    pub fn udp(name: &str, addr: SocketAddrV4) -> Self {
        Self::udp_at(name, SocketAddr::V4(addr))
    }

    /// A UDP server on an address of either family.
    pub fn udp_at(name: &str, addr: SocketAddr) -> Self {
        let socket = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        Self::serve_udp(name, socket, name)
    }

    /// A UDP server bound inside `netns` answering `<name> <client address:port>`.
    pub fn udp_in(netns: &Netns, name: &str, addr: impl Into<SocketAddr>) -> Self {
        let socket = netns.udp_socket(addr.into(), Duration::from_millis(50));
        Self::serve_udp(name, socket, &format!("{name} {PEER}"))
    }

    fn serve_udp(name: &str, socket: UdpSocket, reply: &str) -> Self {
        let addr = socket.local_addr().expect("socket address");
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let reply = reply.to_owned();
        let mut buffer = [0u8; 512];
        let thread = ServerThread::run(move || {
            if let Ok((_, from)) = socket.recv_from(&mut buffer) {
                let text = reply.replace(PEER, &from.to_string());
                let _ = socket.send_to(text.as_bytes(), from);
            }
        });
        Self {
            name: name.to_owned(),
            addr,
            _thread: thread,
        }
    }

    /// The server as a backend.
    pub fn backend(&self) -> BackendAddr {
        BackendAddr::local(self.addr.ip(), self.addr.port())
    }
}

/// A dnsmasq process serving `name.test -> answer` on `addr`:53; killed when dropped.
pub struct Dnsmasq {
    child: Child,
}

impl Dnsmasq {
    pub fn start(listen: impl Into<IpAddr>, answer: Ipv4Addr) -> Self {
        let listen = listen.into();
        let mut child = Command::new("dnsmasq")
            .args([
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--user=root",
                "--pid-file=",
                &format!("--listen-address={listen}"),
                "--port=53",
                &format!("--address=/who.test/{answer}"),
                "--log-facility=-",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("prerequisite missing: dnsmasq (apt-get install dnsmasq-base; ./x setup does)");
        // Ready once it logs that it started (it binds before logging).
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = BufReader::new(stderr).lines();
        let mut log = String::new();
        loop {
            match lines.next() {
                Some(Ok(line)) => {
                    let started = line.contains("started");
                    log.push_str(&line);
                    log.push('\n');
                    if started {
                        break;
                    }
                }
                _ => panic!("dnsmasq on {listen} did not start: {log}"),
            }
        }
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Self { child }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// TCP servers on `prefix.1` .. `prefix.count`, named b1 .. b`count`.
pub fn tcp_backends(prefix: [u8; 3], count: u8, port: u16) -> Vec<NamedServer> {
    named_servers(prefix, count, port, NamedServer::tcp)
}

/// UDP servers on `prefix.1` .. `prefix.count`, named b1 .. b`count`.
pub fn udp_backends(prefix: [u8; 3], count: u8, port: u16) -> Vec<NamedServer> {
    named_servers(prefix, count, port, NamedServer::udp)
}

fn named_servers(
    prefix: [u8; 3],
    count: u8,
    port: u16,
    serve: fn(&str, SocketAddrV4) -> NamedServer,
) -> Vec<NamedServer> {
    (1..=count)
        .map(|i| {
            let ip = Ipv4Addr::new(prefix[0], prefix[1], prefix[2], i);
            serve(&format!("b{i}"), SocketAddrV4::new(ip, port))
        })
        .collect()
}
