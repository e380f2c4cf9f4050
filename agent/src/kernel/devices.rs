//! Which devices the TC programs can serve. They parse an Ethernet header first, so only
//! Ethernet devices (link type `ARPHRD_ETHER`: NICs, bonds, bridges, VLANs, veth, vxlan)
//! work; on an L3 device (WireGuard, tun, ipip, GRE, PPP) every packet would be misread and
//! NodePorts there would be silently dead, so such a device is refused by name.
use std::io;

/// `ARPHRD_ETHER`: the only link type the TC programs parse.
pub const ARPHRD_ETHER: u16 = 1;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "device {device} does not exist in this network namespace: check --devices (`ip link` \
         lists the devices)"
    )]
    Missing { device: String },
    #[error(
        "device {device} is not an Ethernet device (link type {link_type}, {}): socklb's TC \
         programs parse an Ethernet header, so no packet on it can be translated (L3 devices \
         such as WireGuard, tun and ipip are not supported)",
        link_type_name(*link_type)
    )]
    NotEthernet { device: String, link_type: u16 },
    #[error("cannot read the link type of device {device}")]
    LinkType {
        device: String,
        #[source]
        source: io::Error,
    },
}

/// Fails unless every one of `devices` exists in this network namespace and is Ethernet:
/// for `--devices`, checked before anything is created.
pub fn check_devices(devices: &[String]) -> Result<(), DeviceError> {
    devices.iter().try_for_each(|device| check_ethernet(device))
}

/// Fails unless `device` exists in this network namespace and is Ethernet.
pub fn check_ethernet(device: &str) -> Result<(), DeviceError> {
    match link_type(device) {
        Ok(ARPHRD_ETHER) => Ok(()),
        Ok(link_type) => Err(DeviceError::NotEthernet {
            device: device.to_owned(),
            link_type,
        }),
        Err(error) if error.raw_os_error() == Some(libc::ENODEV) => Err(DeviceError::Missing {
            device: device.to_owned(),
        }),
        Err(source) => Err(DeviceError::LinkType {
            device: device.to_owned(),
            source,
        }),
    }
}

/// The link type (`ARPHRD_*`) of `device`, asked of the kernel in this network namespace
/// (SIOCGIFHWADDR), not read from /sys/class/net, which shows the namespace that mounted
/// /sys.
fn link_type(device: &str) -> io::Result<u16> {
    let name = device.as_bytes();
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= request.ifr_name.len() || name.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::ENODEV));
    }
    for (slot, byte) in request.ifr_name.iter_mut().zip(name) {
        *slot = *byte as libc::c_char;
    }
    let socket = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    // SAFETY: SIOCGIFHWADDR reads the NUL-terminated name and writes the hardware address
    // into the ifreq we own; the socket stays open for the call.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::SIOCGIFHWADDR as _,
            &mut request,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR filled the hardware address member of the union.
    Ok(unsafe { request.ifr_ifru.ifru_hwaddr.sa_family })
}

/// What an `ARPHRD_*` value is, for the error message.
fn link_type_name(link_type: u16) -> &'static str {
    match link_type {
        ARPHRD_ETHER => "Ethernet",
        512 => "PPP",
        768 => "IPIP tunnel",
        769 => "IPv6-in-IPv6 tunnel",
        772 => "loopback",
        776 => "SIT tunnel",
        778 => "GRE tunnel",
        65534 => "no link-layer header: tun, WireGuard",
        _ => "not Ethernet",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_refused_by_name_and_a_missing_device_says_so() {
        match check_ethernet("lo") {
            Err(DeviceError::NotEthernet { device, link_type }) => {
                assert_eq!((device.as_str(), link_type), ("lo", 772));
            }
            other => panic!("lo: {other:?}"),
        }
        assert!(matches!(
            check_ethernet("socklb-nonexistent0"),
            Err(DeviceError::Missing { .. })
        ));
        assert!(matches!(
            check_ethernet("a-name-far-too-long-for-a-device"),
            Err(DeviceError::Missing { .. })
        ));
    }
}
