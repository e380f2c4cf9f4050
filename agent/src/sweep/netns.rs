//! The network namespaces of the node, and entering them.
//!
//! A namespace is found through a process inside it (`/proc/<pid>/ns/net`, which needs
//! ptrace-read access to that process: same user, or CAP_SYS_PTRACE) or through a bind
//! mount (`/run/netns`, `/var/run/netns`: where CNI plugins and `ip netns add` pin pod
//! namespaces). Each is kept once, by inode. Why enumerating after the maps were written
//! misses no namespace that matters, and which are not found: docs/operations.md, "Sockets
//! of removed backends" (Namespaces, Limits).
use std::{
    collections::HashSet,
    fs::{self, File},
    io,
    os::{fd::AsFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

/// Directories of pinned network namespaces.
const PIN_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];

/// The inode of the initial PID namespace (the kernel's `PROC_PID_INIT_INO`): a process in
/// it sees every process of the node in /proc.
const INIT_PID_NAMESPACE: &str = "pid:[4026531836]";

/// Which network namespaces a sweep with this process's capabilities reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Coverage {
    /// setns into other namespaces (CAP_SYS_ADMIN); without it, the agent's own only.
    pub enters_others: bool,
    /// In the node's PID namespace (hostPID): the namespaces of every process are found,
    /// not only those of the agent's own pod.
    pub host_processes: bool,
    /// CAP_SYS_PTRACE: the namespaces of every process are readable, not only those of
    /// processes of the agent's user with no capability the agent lacks.
    pub other_users: bool,
}

impl Coverage {
    pub fn probe(enters_others: bool, ptrace: bool) -> Self {
        let host_processes = fs::read_link("/proc/self/ns/pid")
            .is_ok_and(|link| link.as_os_str() == INIT_PID_NAMESPACE);
        Self {
            enters_others,
            host_processes,
            other_users: ptrace,
        }
    }
}

impl std::fmt::Display for Coverage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.enters_others {
            return f.write_str(
                "the agent's own network namespace only (no CAP_SYS_ADMIN to enter others)",
            );
        }
        f.write_str("the agent's network namespace, those pinned under /run/netns and /var/run/netns (CNI's pod namespaces)")?;
        match (self.host_processes, self.other_users) {
            (true, true) => f.write_str(" and those of every process on the node"),
            (true, false) => f.write_str(
                " and those of the processes of the agent's user with no capability it lacks \
                 (no CAP_SYS_PTRACE for the others)",
            ),
            (false, _) => f.write_str(
                "; not those of processes outside the agent's PID namespace, found only \
                 with hostPID",
            ),
        }
    }
}

/// An open network namespace.
#[derive(Debug)]
pub struct Namespace {
    pub inode: u64,
    /// Where it was found, for logs.
    pub path: PathBuf,
    pub file: File,
}

/// What one enumeration found.
#[derive(Debug, Default)]
pub struct Found {
    pub namespaces: Vec<Namespace>,
    /// Processes whose namespace could not be read (ptrace access denied).
    pub unreadable: usize,
}

/// The calling thread's namespace.
pub fn current() -> io::Result<Namespace> {
    open(Path::new("/proc/thread-self/ns/net"))
}

fn open(path: &Path) -> io::Result<Namespace> {
    let file = File::open(path)?;
    let inode = file.metadata()?.ino();
    Ok(Namespace {
        inode,
        path: path.to_owned(),
        file,
    })
}

/// The inode in a `net:[4026531840]` link.
fn link_inode(path: &Path) -> io::Result<u64> {
    let link = fs::read_link(path)?;
    link.to_str()
        .and_then(|l| l.strip_prefix("net:["))
        .and_then(|l| l.strip_suffix(']'))
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a net namespace link"))
}

/// Every network namespace found, `first` (the caller's own) first.
pub fn enumerate(first: Namespace) -> Found {
    let mut seen = HashSet::from([first.inode]);
    let mut found = Found {
        namespaces: vec![first],
        unreadable: 0,
    };
    found.namespaces.extend(
        pinned()
            .into_iter()
            .filter(|namespace| seen.insert(namespace.inode)),
    );
    let Ok(processes) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in processes.flatten() {
        if !entry
            .file_name()
            .as_encoded_bytes()
            .iter()
            .all(u8::is_ascii_digit)
        {
            continue;
        }
        let path = entry.path().join("ns/net");
        // readlink first: most processes share a namespace already seen, and it opens
        // nothing.
        match link_inode(&path) {
            Ok(inode) if seen.contains(&inode) => continue,
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                found.unreadable += 1;
                continue;
            }
            // The process exited meanwhile, or is a kernel thread without one.
            Err(_) => continue,
        }
        if let Ok(namespace) = open(&path)
            && seen.insert(namespace.inode)
        {
            found.namespaces.push(namespace);
        }
    }
    found
}

/// The network namespaces pinned under /run/netns and /var/run/netns: where CNI runtimes
/// (containerd, CRI-O) and `ip netns add` keep them. Each once: /var/run is most often a
/// link to /run, which shows every pin twice.
pub fn pinned() -> Vec<Namespace> {
    let mut seen = HashSet::new();
    PIN_DIRS
        .iter()
        .filter_map(|dir| fs::read_dir(dir).ok())
        .flat_map(|entries| entries.flatten())
        // A file there that is not a namespace (nothing mounted on it) costs one open.
        .filter_map(|entry| open(&entry.path()).ok())
        .filter(|namespace| is_net_namespace(&namespace.file) && seen.insert(namespace.inode))
        .collect()
}

/// Whether `file` is a network namespace (NS_GET_NSTYPE), not any file under a pin dir.
fn is_net_namespace(file: &File) -> bool {
    // _IO(0xb7, 0x3): NS_GET_NSTYPE.
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
    // SAFETY: an ioctl without argument on a file we own.
    let kind = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&file.as_fd()),
            NS_GET_NSTYPE as _,
        )
    };
    kind == libc::CLONE_NEWNET
}

/// Moves the calling thread into `namespace`: needs CAP_SYS_ADMIN.
pub fn enter(namespace: &Namespace) -> io::Result<()> {
    nix::sched::setns(namespace.file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(io::Error::from)
}

#[cfg(test)]
mod coverage_tests {
    use super::Coverage;

    #[test]
    fn coverage_says_which_namespaces_each_capability_set_reaches() {
        let rows = [
            // (CAP_SYS_ADMIN, hostPID, CAP_SYS_PTRACE, said)
            (
                false,
                true,
                true,
                "own network namespace only (no CAP_SYS_ADMIN",
            ),
            (true, true, true, "and those of every process on the node"),
            (true, true, false, "no CAP_SYS_PTRACE for the others"),
            (true, false, true, "found only with hostPID"),
        ];
        for (enters_others, host_processes, other_users, said) in rows {
            let coverage = Coverage {
                enters_others,
                host_processes,
                other_users,
            };
            let text = coverage.to_string();
            assert!(text.contains(said), "{coverage:?}: {text}");
            assert_eq!(
                text.contains("/run/netns"),
                enters_others,
                "{coverage:?}: {text}"
            );
        }
    }
}
