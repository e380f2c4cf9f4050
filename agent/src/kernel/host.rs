//! What the host must provide before anything is loaded (cgroup v2, bpffs) and what the
//! agent reads of it (its network namespace, addresses, forwarding, ephemeral ports).
//! Each check fails with a message that says how to fix it.
use std::{
    ffi::CString,
    fs,
    net::IpAddr,
    os::{
        fd::{AsRawFd as _, FromRawFd as _},
        unix::{
            ffi::OsStrExt as _,
            fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
        },
    },
    path::{Path, PathBuf},
};

use super::pins;

/// `statfs.f_type` of a BPF filesystem.
const BPF_FS_MAGIC: u64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(
        "cannot read this network namespace's cookie (SO_NETNS_COOKIE, Linux >= 5.14), which \
         --socket-lb-scope host needs: use --socket-lb-scope all"
    )]
    NetnsCookie(#[source] std::io::Error),
    #[error(
        "no cgroup v2 filesystem is mounted (none in /proc/self/mountinfo): mount one with \
         `mount -t cgroup2 none /sys/fs/cgroup` or pass --cgroup-path"
    )]
    NoCgroup2,
    #[error("cannot read /proc/self/mountinfo")]
    MountInfo(#[source] std::io::Error),
    #[error(
        "{path} is not a cgroup v2 directory: pass the cgroup v2 mount (or a cgroup in it) to \
         --cgroup-path{} (the chart: hostPaths.cgroupRoot, the host's cgroup v2 mount, such as \
         /sys/fs/cgroup/unified on a host with both cgroup versions)",
        mount.as_ref().map_or_else(String::new, |mount| format!(", here {}", mount.display()))
    )]
    NotCgroup2 {
        path: PathBuf,
        /// Where this process finds cgroup v2 mounted, if anywhere.
        mount: Option<PathBuf>,
    },
    #[error(
        "bpffs is not mounted at {path}: run `mount -t bpf bpf {path}` or pass --bpffs with a \
         directory on a mounted bpffs"
    )]
    NoBpffs { path: PathBuf },
    #[error(
        "{pin_dir} is not on a bpffs ({existing} is on another filesystem): pass --bpffs with a \
         directory on a mounted bpffs, such as the default /sys/fs/bpf/socklb"
    )]
    NotOnBpffs { pin_dir: PathBuf, existing: PathBuf },
    #[error("cannot create the pin directory {path}")]
    PinDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the pin directory {path} is owned by uid {owner}, not by this agent (uid {agent}): \
         another user may have created it to read or replace socklb's pins; check what it \
         holds and remove it (`rm -r {path}`), or pass another --bpffs"
    )]
    PinDirOwner {
        path: PathBuf,
        owner: u32,
        agent: u32,
    },
    #[error(
        "the pin directory {path} is not a directory (a symbolic link or a pinned object): \
         remove it or pass another --bpffs"
    )]
    PinDirNotDirectory { path: PathBuf },
    #[error(
        "{path} is a bpffs mount itself, which other programs share: pass --bpffs with a \
         directory of socklb's own below it, such as {}",
        path.join("socklb").display()
    )]
    PinDirIsMount { path: PathBuf },
    #[error(
        "the pin directory {path} holds what socklb did not pin ({others}): it is another \
         program's, which socklb must not take over; pass --bpffs with a directory of \
         socklb's own, such as {}",
        path.join("socklb").display()
    )]
    PinDirShared { path: PathBuf, others: String },
}

/// This network namespace's addresses of both families, each with the device that holds
/// it (getifaddrs, which reads them over netlink).
pub fn local_addresses() -> std::io::Result<Vec<(IpAddr, String)>> {
    Ok(nix::ifaddrs::getifaddrs()
        .map_err(std::io::Error::from)?
        .filter_map(|interface| {
            let address = interface.address.as_ref()?;
            let address = match (address.as_sockaddr_in(), address.as_sockaddr_in6()) {
                (Some(v4), _) => IpAddr::V4(v4.ip()),
                (None, Some(v6)) => IpAddr::V6(v6.ip()),
                (None, None) => return None,
            };
            Some((address, interface.interface_name))
        })
        .collect())
}

/// The kernel's ephemeral port range (`net.ipv4.ip_local_port_range`), which SNAT ports
/// must avoid.
pub fn ephemeral_ports() -> Option<std::ops::RangeInclusive<u16>> {
    let text = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut bounds = text.split_whitespace().map(str::parse::<u16>);
    Some(bounds.next()?.ok()?..=bounds.next()?.ok()?)
}

/// Whether this network namespace forwards IPv4 (`net.ipv4.ip_forward`); `None` if unknown.
/// Traffic from outside reaches a pod only through forwarding: the TC program hands a flow
/// to a local pod to the kernel's routing, and the FIB lookup that redirects a flow to a
/// remote backend refuses to forward when it is off.
pub fn ipv4_forwarding() -> Option<bool> {
    let text = fs::read_to_string("/proc/sys/net/ipv4/ip_forward").ok()?;
    Some(text.trim() != "0")
}

/// Whether this network namespace forwards IPv6 (`net.ipv6.conf.all.forwarding`); `None`
/// if unknown (IPv6 disabled). The IPv6 twin of [`ipv4_forwarding`].
pub fn ipv6_forwarding() -> Option<bool> {
    let text = fs::read_to_string("/proc/sys/net/ipv6/conf/all/forwarding").ok()?;
    Some(text.trim() != "0")
}

/// Mount point of the first cgroup v2 filesystem, from /proc/self/mountinfo.
pub fn cgroup2_mount() -> Result<PathBuf, HostError> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(HostError::MountInfo)?;
    find_cgroup2(&mountinfo).ok_or(HostError::NoCgroup2)
}

/// Parses mountinfo(5): `id parent major:minor root mountpoint options... - fstype source`.
fn find_cgroup2(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, filesystem) = line.split_once(" - ")?;
        if filesystem.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        mount.split_whitespace().nth(4).map(unescape_octal)
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

fn statfs_type(path: &Path) -> Option<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid NUL-terminated path and a properly sized out-parameter.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    // f_type is signed in glibc and unsigned in musl; the magic numbers fit both.
    (rc == 0).then(|| u64::try_from(stat.f_type).ok()).flatten()
}

/// Checks that `path` is a directory of the cgroup v2 hierarchy.
pub fn check_cgroup2(path: &Path) -> Result<(), HostError> {
    const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;
    match statfs_type(path) {
        Some(CGROUP2_SUPER_MAGIC) => Ok(()),
        _ => Err(HostError::NotCgroup2 {
            path: path.to_owned(),
            mount: cgroup2_mount().ok(),
        }),
    }
}

/// Makes sure `pin_dir` is (or can be created) on a mounted bpffs, and creates it.
pub fn prepare_pin_dir(pin_dir: &Path) -> Result<(), HostError> {
    // The nearest existing ancestor tells which filesystem the directory lands on.
    let existing = pin_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if statfs_type(existing) != Some(BPF_FS_MAGIC) {
        // Mounting is the fix only where bpffs belongs: never over a directory of another
        // filesystem that happens to be the nearest one there.
        let bpffs = Path::new("/sys/fs/bpf");
        if pin_dir.starts_with(bpffs) {
            return Err(HostError::NoBpffs {
                path: bpffs.to_owned(),
            });
        }
        return Err(HostError::NotOnBpffs {
            pin_dir: pin_dir.to_owned(),
            existing: existing.to_owned(),
        });
    }
    let pin_dir_error = |source| HostError::PinDir {
        path: pin_dir.to_owned(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(PIN_DIR_MODE)
        .create(pin_dir)
        .map_err(pin_dir_error)?;
    // A directory made earlier (a bpffs mounted 1777 lets any user make it first, and
    // agents before this check made it 0755) is used only if this agent's user owns it,
    // and only with its own access.
    let metadata = fs::symlink_metadata(pin_dir).map_err(pin_dir_error)?;
    if !metadata.is_dir() {
        return Err(HostError::PinDirNotDirectory {
            path: pin_dir.to_owned(),
        });
    }
    check_socklbs_own(pin_dir, &metadata)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let agent = unsafe { libc::geteuid() };
    if metadata.uid() != agent {
        return Err(HostError::PinDirOwner {
            path: pin_dir.to_owned(),
            owner: metadata.uid(),
            agent,
        });
    }
    if metadata.mode() & 0o777 != PIN_DIR_MODE {
        fs::set_permissions(pin_dir, fs::Permissions::from_mode(PIN_DIR_MODE))
            .map_err(pin_dir_error)?;
        tracing::info!(
            pin_dir = %pin_dir.display(),
            was = format!("{:o}", metadata.mode() & 0o777),
            "pin directory made private to the agent (0700)"
        );
    }
    Ok(())
}

/// Only the agent's user reaches the pins: no other user can open the directory, so none
/// can read the maps, hold its lock or open a pin to keep an old map alive.
pub const PIN_DIR_MODE: u32 = 0o700;

/// Whether the directory `path` (with its `metadata`) is the root of a mount: its parent
/// is on another device, or it has none.
pub fn is_mount_root(path: &Path, metadata: &fs::Metadata) -> bool {
    let parent = fs::canonicalize(path)
        .ok()
        .and_then(|path| fs::metadata(path.parent()?).ok());
    parent.is_none_or(|parent| parent.dev() != metadata.dev())
}

/// Refuses a pin directory that is not socklb's alone: a bpffs mount (`/sys/fs/bpf`
/// itself, whose mode the agent would make private to it) or a directory holding another
/// program's pins (iproute2's `/sys/fs/bpf/tc`).
fn check_socklbs_own(pin_dir: &Path, metadata: &fs::Metadata) -> Result<(), HostError> {
    if is_mount_root(pin_dir, metadata) {
        return Err(HostError::PinDirIsMount {
            path: pin_dir.to_owned(),
        });
    }
    let others: Vec<String> = fs::read_dir(pin_dir)
        .map_err(|source| HostError::PinDir {
            path: pin_dir.to_owned(),
            source,
        })?
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| !pins::is_socklbs(name))
        .collect();
    if !others.is_empty() {
        return Err(HostError::PinDirShared {
            path: pin_dir.to_owned(),
            others: crate::listed(others.iter().take(3)),
        });
    }
    Ok(())
}

/// Whether this process runs in another network namespace than the one of `cookie` (an
/// agent's, from its node map, for `inspect` and `trace`: the devices this process sees are
/// then not the ones the agent serves). False when that cannot be told (`cookie` 0: not
/// written).
pub fn outside_netns(cookie: u64) -> bool {
    cookie != 0 && netns_cookie().is_ok_and(|here| here != cookie)
}

/// The cookie of the agent's network namespace (the host's, where the agent runs with the
/// host network), as `bpf_get_netns_cookie` gives it to the programs.
pub fn netns_cookie() -> Result<u64, HostError> {
    let error = || HostError::NetnsCookie(std::io::Error::last_os_error());
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(error());
    }
    // SAFETY: a new descriptor nothing else owns.
    let socket = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    let mut cookie: u64 = 0;
    let mut length = size_of::<u64>() as libc::socklen_t;
    // SAFETY: `cookie` and `length` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            std::ptr::from_mut(&mut cookie).cast(),
            &mut length,
        )
    };
    if rc != 0 {
        return Err(error());
    }
    Ok(cookie)
}

/// CLOCK_MONOTONIC in whole seconds: the clock of the programs' `bpf_ktime_get_ns` and
/// `bpf_ktime_get_coarse_ns`, in which conntrack entries say when they were last seen.
pub fn monotonic_seconds() -> u32 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    u32::try_from(now.tv_sec).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_in_a_hybrid_layout() {
        let mountinfo = "\
25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw
31 25 0:27 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
32 31 0:28 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
33 31 0:29 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu
";
        assert_eq!(
            find_cgroup2(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn optional_fields_and_escapes_are_handled() {
        let mountinfo = "40 1 0:40 / /mnt/my\\040cgroup rw shared:5 master:1 - cgroup2 none rw\n";
        assert_eq!(
            find_cgroup2(mountinfo),
            Some(PathBuf::from("/mnt/my cgroup"))
        );
    }

    #[test]
    fn no_cgroup2_is_none() {
        assert_eq!(
            find_cgroup2("25 30 0:23 / /sys rw - sysfs sysfs rw\n"),
            None
        );
    }
}
