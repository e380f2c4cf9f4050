//! A TCP echo server in a network namespace, for long-lived connections whose every byte
//! must come back (flows that must survive a flood or a map growth).
use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    os::fd::AsRawFd as _,
    time::Duration,
};

use crate::{netns::Netns, servers::ServerThread};

/// Sends a byte and expects it back.
pub fn echo(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"x")?;
    let mut byte = [0u8; 1];
    stream.read_exact(&mut byte)?;
    if byte != *b"x" {
        return Err(std::io::Error::new(ErrorKind::InvalidData, "wrong echo"));
    }
    Ok(())
}

/// A TCP echo server in `netns` with a listen backlog for thousands of connections, a
/// thread per connection; stops accepting when dropped (connections end with their
/// clients).
pub struct EchoServer {
    _thread: ServerThread,
}

impl EchoServer {
    pub fn start(netns: &Netns, addr: impl Into<SocketAddr>) -> Self {
        let listener = netns.tcp_listener(addr.into());
        // SAFETY: listen again on our listening socket: only raises its backlog.
        let rc = unsafe { libc::listen(listener.as_raw_fd(), 4096) };
        assert_eq!(rc, 0, "listen: {}", std::io::Error::last_os_error());
        let thread = ServerThread::accept(listener, |mut stream, _| {
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    let mut buffer = [0u8; 512];
                    while let Ok(n) = stream.read(&mut buffer) {
                        if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                })
                .expect("spawn an echo thread");
        });
        Self { _thread: thread }
    }
}
