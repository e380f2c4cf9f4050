//! The servers behind the services: accept-and-answer servers that tell the client which
//! address it reached, and an iperf3 server.
use std::{
    fs::File,
    io::{self, Write as _},
    net::{Ipv4Addr, SocketAddrV4, TcpListener},
    os::fd::AsRawFd as _,
    process::{Child, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context as _;

use super::{
    cpu::{SERVER_CPU, pin_to_cpu},
    netns::{enter, in_netns},
};

/// Above what a batch can leave unaccepted (a full queue drops SYNs: 1 s stalls).
const BACKLOG: i32 = 4096;

/// Accept-and-answer servers in one namespace, counting what they accept, and an iperf3
/// server there.
pub struct Servers {
    pub netns: File,
    listeners: Vec<TcpListener>,
    threads: Vec<JoinHandle<()>>,
    accepted: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    iperf: Option<Child>,
}

impl Servers {
    /// Serves `bind` in `netns` (0.0.0.0 serves every address local there): each
    /// connection gets the 4 bytes of the address it reached.
    pub fn start(netns: File, bind: SocketAddrV4) -> anyhow::Result<Self> {
        let mut server = Self {
            netns,
            listeners: Vec::new(),
            threads: Vec::new(),
            accepted: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            iperf: None,
        };
        let netns = server.netns.try_clone().context("clone the namespace fd")?;
        let listener = std::thread::spawn(move || -> anyhow::Result<TcpListener> {
            enter(&netns)?;
            let listener = TcpListener::bind(bind)
                .with_context(|| format!("bind the endpoint servers to {bind}"))?;
            // SAFETY: a listening socket we own; listening again only raises the backlog.
            if unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) } != 0 {
                return Err(io::Error::last_os_error()).context("listen(4096)");
            }
            Ok(listener)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the server thread panicked"))??;
        for _ in 0..2 {
            let accepting = listener.try_clone().context("clone the listener")?;
            let (accepted, stop) = (server.accepted.clone(), server.stop.clone());
            server.threads.push(std::thread::spawn(move || {
                let _ = pin_to_cpu(SERVER_CPU);
                loop {
                    match accepting.accept() {
                        Ok((mut stream, _)) => {
                            // The address the connection reached: which endpoint answered.
                            if let Ok(std::net::SocketAddr::V4(local)) = stream.local_addr() {
                                let _ = stream.write_all(&local.ip().octets());
                            }
                            accepted.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) if stop.load(Ordering::Relaxed) => return,
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
            }));
        }
        server.listeners.push(listener);
        Ok(server)
    }

    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// (Re)starts the iperf3 server on `address`.
    pub fn start_iperf(&mut self, address: Ipv4Addr, port: u16) -> anyhow::Result<()> {
        self.stop_iperf();
        let child = in_netns(&self.netns, "iperf3")
            .args(["-s", "-B", &address.to_string(), "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start iperf3 -s: install iperf3 (`cargo xtask setup` does)")?;
        self.iperf = Some(child);
        // It listens within milliseconds; the clients retry once anyway.
        std::thread::sleep(Duration::from_millis(300));
        Ok(())
    }

    pub fn stop_iperf(&mut self) {
        if let Some(mut child) = self.iperf.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        self.stop_iperf();
        self.stop.store(true, Ordering::Relaxed);
        for listener in &self.listeners {
            // SAFETY: a socket we own; wakes the threads blocked in accept().
            unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RDWR) };
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
