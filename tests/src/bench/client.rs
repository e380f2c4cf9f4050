//! The timed client and its protocol. One long-lived process for every peer, driven batch
//! by batch over a pipe: before each batch it moves into the peer's namespace and cgroup,
//! so that the peers alternate in every round and differ in nothing but the path they
//! measure.
use std::{
    fs::{self, File},
    io::{self, BufRead as _, BufReader, Write as _},
    mem::size_of,
    net::{Ipv4Addr, SocketAddrV4},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Stdio},
    ptr,
    time::Instant,
};

use anyhow::{Context as _, bail, ensure};
use serde::{Deserialize, Serialize};

use super::{
    cpu::{CLIENT_CPU, cpu_ns, pin_to_cpu},
    netns::{enter, fd_path, in_netns},
};

/// A connection not established by then fails the benchmark (an untranslated VIP would
/// otherwise hang in SYN retransmits).
const CONNECT_TIMEOUT: libc::timeval = libc::timeval {
    tv_sec: 3,
    tv_usec: 0,
};

/// The timed client process. One process for every peer: separate processes differed from
/// one another by up to 3% in connection setup whatever they measured (their memory and cache
/// placement), as much as the difference this benchmark is after.
pub struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// Where a peer's connections are made from: its network namespace and cgroup.
pub struct Place {
    /// A path that opens the namespace ([`fd_path`]).
    pub netns: String,
    pub cgroup: PathBuf,
}

impl Place {
    pub fn new(netns: &File, cgroup: &Path) -> Self {
        Self {
            netns: fd_path(netns),
            cgroup: cgroup.to_owned(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub struct BatchResult {
    /// connect() + 4 bytes read + close(), per connection.
    pub ns: Vec<u64>,
    /// The client's user + system CPU time over the batch.
    pub cpu_ns: u64,
    /// The address that answered each connection.
    pub replies: Vec<Ipv4Addr>,
    /// The index in the batch's targets of each connection's target.
    pub targets: Vec<u32>,
}

impl Client {
    /// Starts the client (this executable again, `client`) in `netns`, pinned to the
    /// client CPU.
    pub fn spawn(netns: &File) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("find this executable to run the client")?;
        let mut command = in_netns(netns, exe);
        // SAFETY: sched_setaffinity is a plain system call, safe between fork and exec.
        unsafe { command.pre_exec(|| pin_to_cpu(CLIENT_CPU)) };
        let mut child = command
            .arg("client")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start the benchmark client")?;
        let stdin = child.stdin.take().context("client stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("client stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// COUNT connections from `place`, round-robin over `targets`.
    pub fn batch(
        &mut self,
        count: u32,
        place: &Place,
        targets: &[SocketAddrV4],
    ) -> anyhow::Result<BatchResult> {
        let targets: Vec<String> = targets.iter().map(ToString::to_string).collect();
        writeln!(
            self.stdin,
            "{count} {} {} {}",
            place.netns,
            place.cgroup.display(),
            targets.join(",")
        )
        .and_then(|()| self.stdin.flush())
        .context("send a batch to the client")?;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .context("read the client's answer")?;
        ensure!(!line.is_empty(), "the client exited (its error is above)");
        serde_json::from_str(&line).context("parse the client's answer")
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `client` command of a benchmark binary: reads "COUNT NETNS CGROUP ADDR,ADDR,..." lines, moves into the namespace and
/// cgroup, makes COUNT connections round-robin over the addresses, answers with one JSON
/// line.
pub fn run() -> anyhow::Result<()> {
    let stdin = io::stdin();
    let mut stdout = io::stdout();
    // Round-robin over the targets across batches, so that short batches reach them all.
    let mut next = 0usize;
    let mut here = (String::new(), String::new());
    for line in stdin.lock().lines() {
        let line = line.context("read a command")?;
        let mut fields = line.split(' ');
        let (Some(count), Some(netns), Some(cgroup), Some(targets), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            bail!("expected COUNT NETNS CGROUP ADDR,..., got {line:?}");
        };
        let count: u32 = count.parse().context("COUNT")?;
        if (netns, cgroup) != (here.0.as_str(), here.1.as_str()) {
            // The client is single-threaded, so setns moves the whole process; sockets
            // take the cgroup they are created in, so every later socket is the peer's.
            enter(&File::open(netns).with_context(|| format!("open {netns}"))?)?;
            fs::write(Path::new(cgroup).join("cgroup.procs"), "0")
                .with_context(|| format!("move into the cgroup {cgroup}"))?;
            here = (netns.to_owned(), cgroup.to_owned());
        }
        let targets: Vec<libc::sockaddr_in> = targets
            .split(',')
            .map(|target| target.parse::<SocketAddrV4>().map(sockaddr))
            .collect::<Result<_, _>>()
            .context("ADDR")?;
        let mut result = BatchResult {
            ns: Vec::with_capacity(count as usize),
            cpu_ns: 0,
            replies: Vec::with_capacity(count as usize),
            targets: Vec::with_capacity(count as usize),
        };
        let cpu_before = cpu_ns();
        for _ in 0..count {
            next = next.wrapping_add(1);
            let target = next % targets.len();
            let (ns, reply) = connect_read_close(&targets[target])?;
            result.ns.push(ns);
            result.replies.push(reply);
            result
                .targets
                .push(u32::try_from(target).context("too many targets")?);
        }
        result.cpu_ns = cpu_ns().saturating_sub(cpu_before);
        let json = serde_json::to_string(&result).context("encode the batch")?;
        writeln!(stdout, "{json}")
            .and_then(|()| stdout.flush())
            .context("answer")?;
    }
    Ok(())
}

fn sockaddr(addr: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// Times connect(), reading the server's 4-byte answer, and close() of a fresh TCP socket
/// (socket() is not timed); returns the time and the address that answered.
fn connect_read_close(target: &libc::sockaddr_in) -> anyhow::Result<(u64, Ipv4Addr)> {
    // SAFETY: plain syscalls on a socket we create and close here.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        ensure!(fd >= 0, "socket(): {}", io::Error::last_os_error());
        for option in [libc::SO_SNDTIMEO, libc::SO_RCVTIMEO] {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                ptr::from_ref(&CONNECT_TIMEOUT).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        let started = Instant::now();
        let rc = libc::connect(
            fd,
            ptr::from_ref(target).cast(),
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        let mut error = (rc != 0).then(io::Error::last_os_error);
        let mut reply = [0u8; 4];
        let mut got = 0;
        while error.is_none() && got < reply.len() {
            let n = libc::read(fd, reply[got..].as_mut_ptr().cast(), reply.len() - got);
            match n {
                n if n > 0 => got += n as usize,
                0 => error = Some(io::Error::other("closed before answering")),
                _ => error = Some(io::Error::last_os_error()),
            }
        }
        libc::close(fd);
        let elapsed = started.elapsed();
        if let Some(error) = error {
            let address = Ipv4Addr::from(u32::from_be(target.sin_addr.s_addr));
            bail!(
                "connect({address}:{}): {error}",
                u16::from_be(target.sin_port)
            );
        }
        Ok((
            u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
            Ipv4Addr::from(reply),
        ))
    }
}
