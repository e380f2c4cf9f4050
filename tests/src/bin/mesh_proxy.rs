//! A service-mesh sidecar as the tests need one: Istio's iptables REDIRECT sends a pod's
//! outbound TCP to it, and, like Envoy, it reads where each connection was going
//! (`SO_ORIGINAL_DST`, the address the pod's socket asked for before the REDIRECT), opens
//! its own connection there, and relays the server's greeting prefixed with that address:
//! `<original destination> <greeting>`. Run it as the uid the REDIRECT rules exclude, so
//! that its own connections leave the pod.
//!
//! socklb-mesh-proxy LISTEN_ADDR:PORT
use std::{
    io::{BufRead as _, BufReader, Write as _},
    mem::{size_of, zeroed},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    thread,
    time::Duration,
};

/// `SO_ORIGINAL_DST` (IPv4, `SOL_IP`) and `IP6T_SO_ORIGINAL_DST` (IPv6, `SOL_IPV6`): both 80.
const SO_ORIGINAL_DST: libc::c_int = 80;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen] = args.as_slice() else {
        eprintln!("usage: socklb-mesh-proxy LISTEN_ADDR:PORT");
        std::process::exit(2);
    };
    let listener = TcpListener::bind(listen.as_str()).unwrap_or_else(|e| {
        eprintln!("listen on {listen}: {e}");
        std::process::exit(1);
    });
    // Tells the test it listens.
    println!("listening");
    for client in listener.incoming().flatten() {
        thread::spawn(move || relay(client));
    }
}

fn relay(mut client: TcpStream) {
    let answer = match original_destination(&client) {
        Ok(destination) => match greeting(destination) {
            Ok(greeting) => format!("{destination} {greeting}"),
            Err(error) => format!("{destination} error: {error}"),
        },
        Err(error) => format!("no original destination: {error}"),
    };
    let _ = writeln!(client, "{answer}");
}

/// The server's first line, through the proxy's own connection.
fn greeting(destination: SocketAddr) -> std::io::Result<String> {
    let upstream = TcpStream::connect_timeout(&destination, Duration::from_secs(5))?;
    upstream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(upstream).read_line(&mut line)?;
    Ok(line.trim_end().to_owned())
}

fn original_destination(client: &TcpStream) -> std::io::Result<SocketAddr> {
    let fd = client.as_raw_fd();
    if client.local_addr()?.is_ipv4() {
        let address: libc::sockaddr_in = socket_option(fd, libc::SOL_IP)?;
        let ip = Ipv4Addr::from(u32::from_be(address.sin_addr.s_addr));
        Ok(SocketAddr::new(ip.into(), u16::from_be(address.sin_port)))
    } else {
        let address: libc::sockaddr_in6 = socket_option(fd, libc::SOL_IPV6)?;
        let ip = Ipv6Addr::from(address.sin6_addr.s6_addr);
        Ok(SocketAddr::new(ip.into(), u16::from_be(address.sin6_port)))
    }
}

/// `SO_ORIGINAL_DST` at `level`, as the socket address type of that level.
fn socket_option<T>(fd: libc::c_int, level: libc::c_int) -> std::io::Result<T> {
    // SAFETY: T is a plain C socket address (all zeroes is valid), and getsockopt writes at
    // most `len` bytes into it.
    unsafe {
        let mut value: T = zeroed();
        let mut len = size_of::<T>() as libc::socklen_t;
        if libc::getsockopt(
            fd,
            level,
            SO_ORIGINAL_DST,
            (&raw mut value).cast(),
            &mut len,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(value)
    }
}
