//! The layout of a pin directory on bpffs: every path socklb pins, records or locks there.
//!
//! Loading, attaching, growth, cleanup, the lock, `socklb inspect` and `socklb trace` all
//! find their paths here and nowhere else, so that what one writes the others find, and
//! cleanup removes exactly what was made.
//!
//! ```text
//! <pin dir>/                        0700, owned by the agent's user (`host::prepare_pin_dir`)
//!   socklb_svc_v3 ...               the maps, pinned by name (as aya's default pin directory);
//!                                   another layout's (`other_layout_maps`) are removed
//!   links/<program>                 the cgroup programs' bpf links
//!   links/<program>@<device>        the TC programs' TCX links
//!   netlink-filters/<program>@<device>:<priority>:<handle>
//!                                   a record of each netlink TC filter (kernels without TCX)
//!   grow/<map>                      a larger map, until it replaces the pinned one (`growth`)
//!   carry/<map>                     an old map whose flows are carried over (`carry`)
//!   lock                            the agent's flock (`pin_lock`)
//!   trace_lease                     the flock of the one `socklb trace` session
//! ```
//!
//! bpffs holds no regular files (nor names with a dot): records, the lock and the lease are
//! empty directories.
use std::{
    fs,
    path::{Path, PathBuf},
};

use socklb_abi::map_names;

/// Default directory of socklb's pins on bpffs.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/socklb";

/// Prefix of the link pins of TC programs: `<program>@<device>`.
const TC_PIN_PREFIX: &str = "socklb_tc_";

/// Directory of the records of the netlink filters this pin directory's agent attached.
const NETLINK_RECORDS: &str = "netlink-filters";

/// Where this instance's netlink filters sit on a device's clsact hooks. Tools that
/// attach without a priority get 49152 and below; ours is fixed so that it reads the same in
/// every instance, and the handle tells instances apart.
const NETLINK_PRIORITY: u16 = 23_579;

/// One netlink filter: a priority and a handle on a device's ingress or egress hook. A
/// netlink filter carries no pin, so an instance knows its own by this identity, derived
/// from its pin directory and written into each filter's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NlFilter {
    pub priority: u16,
    pub handle: u32,
}

impl NlFilter {
    /// The filter of the instance whose pins are in `pin_dir`: a hash (FNV-1a, stable
    /// across builds) of the directory's canonical path, never 0 (which asks the kernel to
    /// choose). Two instances on one device thus use two handles.
    pub fn of_instance(pin_dir: &Path) -> Self {
        let path = fs::canonicalize(pin_dir).unwrap_or_else(|_| pin_dir.to_owned());
        let hash = path
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .fold(0x811c_9dc5_u32, |hash, byte| {
                (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
            });
        Self {
            priority: NETLINK_PRIORITY,
            handle: hash.max(1),
        }
    }
}

/// Whether an entry of a pin directory, by name, is one socklb makes: its maps' and TC
/// links' pins (`socklb_*`) and its directories. A directory holding anything else is
/// shared with another program, which socklb must neither make private nor empty.
pub fn is_socklbs(name: &str) -> bool {
    name.starts_with("socklb")
        || [
            "links",
            NETLINK_RECORDS,
            "grow",
            "carry",
            "trace_lease",
            "lock",
        ]
        .contains(&name)
}

/// Where the pinned map `name` is: directly in the pin directory, which is where the loader
/// asks aya to pin every map of the object.
pub fn map_pin(pin_dir: &Path, name: &str) -> PathBuf {
    pin_dir.join(name)
}

/// The pinned maps of a layout this agent does not know: named as socklb names its maps
/// (`socklb_<map>_v<layout>`), and neither this agent's own nor one it retired. A newer
/// agent's maps are such after a downgrade; nothing this agent runs reads them, so they are
/// removed with the retired ones (at load and by `socklb cleanup`) instead of holding their
/// memory for good.
pub fn other_layout_maps(pin_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(pin_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
        .filter(|entry| entry.file_name().to_str().is_some_and(is_other_layout_map))
        .map(|entry| entry.path())
        .collect()
}

fn is_other_layout_map(name: &str) -> bool {
    let layout = name
        .strip_prefix("socklb_")
        .and_then(|rest| rest.rsplit_once("_v"));
    let named_as_a_map = layout.is_some_and(|(map, version)| {
        !map.is_empty() && !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit())
    });
    let known = map_names::ALL
        .iter()
        .chain(&map_names::RETIRED)
        .chain(&map_names::PROGRAM_LOCAL)
        .any(|known| *known == name);
    named_as_a_map && !known
}

/// The directory of the pinned links.
pub fn links_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("links")
}

/// Where a pinned link of `program` lives.
pub fn link_pin(pin_dir: &Path, program: &str) -> PathBuf {
    links_dir(pin_dir).join(program)
}

/// Where the TCX link of the TC program `program` on `device` lives.
pub fn tc_link_pin(pin_dir: &Path, program: &str, device: &str) -> PathBuf {
    link_pin(pin_dir, &format!("{program}@{device}"))
}

/// The device of a TC program's link pin, from the pin's file name; `None` for a cgroup
/// program's link.
pub fn tc_link_device(file_name: &str) -> Option<&str> {
    let (program, device) = file_name.split_once('@')?;
    program.starts_with(TC_PIN_PREFIX).then_some(device)
}

/// The directory of the netlink filters' records.
pub fn netlink_records_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join(NETLINK_RECORDS)
}

/// The record of a netlink filter: `<program>@<device>:<priority>:<handle>` (the handle in
/// hex; a device name has no `:`).
pub fn netlink_record(pin_dir: &Path, program: &str, device: &str, filter: NlFilter) -> PathBuf {
    netlink_records_dir(pin_dir).join(format!(
        "{program}@{device}:{}:{:x}",
        filter.priority, filter.handle
    ))
}

/// A record's program, device and filter; `None` as the filter for a record an older agent
/// wrote (`<program>@<device>`), whose filter has a priority and handle the kernel chose.
pub fn parse_netlink_record(name: &str) -> Option<(&str, &str, Option<NlFilter>)> {
    let (program, rest) = name.split_once('@')?;
    let Some((device, filter)) = rest.split_once(':') else {
        return Some((program, rest, None));
    };
    let (priority, handle) = filter.split_once(':')?;
    let filter = NlFilter {
        priority: priority.parse().ok()?,
        handle: u32::from_str_radix(handle, 16).ok()?,
    };
    Some((program, device, Some(filter)))
}

/// Where a growth pins the larger maps it creates until they replace the pinned ones.
pub fn staging_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("grow")
}

/// Where a growth pins the larger map `name`.
pub fn staged_map_pin(pin_dir: &Path, name: &str) -> PathBuf {
    staging_dir(pin_dir).join(name)
}

/// Where the loader keeps old maps while their entries are carried over into new ones.
pub fn holding_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("carry")
}

/// Where the old map `name` waits while its entries are copied into the new one.
pub fn holding_pin(pin_dir: &Path, name: &str) -> PathBuf {
    holding_dir(pin_dir).join(name)
}

/// The empty directory a `socklb trace` session holds an exclusive flock on while it runs:
/// one session per pin directory, taken atomically, and freed by the kernel however the
/// session ends (bpffs holds no regular files, but its directories lock like any other).
pub fn trace_lease_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("trace_lease")
}

/// Where the agent's lock of `pin_dir` is: an empty directory made 0600 (only its owner
/// opens it; nothing is ever created in it).
pub fn lock_path(pin_dir: &Path) -> PathBuf {
    pin_dir.join("lock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netlink_records_name_their_filter_and_older_ones_do_not() {
        let filter = NlFilter {
            priority: 23_579,
            handle: 0xdead_beef,
        };
        let record = netlink_record(Path::new("/p"), "socklb_tc_in", "eth0", filter);
        assert_eq!(
            record,
            Path::new("/p/netlink-filters/socklb_tc_in@eth0:23579:deadbeef")
        );
        let name = record
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a UTF-8 name");
        assert_eq!(
            parse_netlink_record(name),
            Some(("socklb_tc_in", "eth0", Some(filter)))
        );
        assert_eq!(
            parse_netlink_record("socklb_tc_in@eth0"),
            Some(("socklb_tc_in", "eth0", None))
        );
        assert_eq!(parse_netlink_record("socklb_tc_in@eth0:x:1"), None);
    }

    #[test]
    fn tc_link_pins_name_their_device_and_cgroup_link_pins_do_not() {
        let pin = tc_link_pin(Path::new("/p"), "socklb_tc_out", "eth0");
        assert_eq!(pin, Path::new("/p/links/socklb_tc_out@eth0"));
        // (file name, device)
        let rows = [
            ("socklb_tc_out@eth0", Some("eth0")),
            ("socklb_tc_in@bond0.100", Some("bond0.100")),
            ("socklb_connect4", None),
            ("other_tool@eth0", None),
        ];
        for (name, device) in rows {
            assert_eq!(tc_link_device(name), device, "{name}");
        }
    }

    #[test]
    fn only_maps_of_a_layout_this_agent_does_not_know_are_other_layout_maps() {
        // (pin name, another layout's map)
        let rows = [
            ("socklb_svc_v9", true),
            ("socklb_newkind_v1", true),
            (map_names::SERVICES, false),
            (map_names::RETIRED[0], false),
            (map_names::SCRATCH6, false),
            ("socklb_svc", false),
            ("socklb_svc_vx", false),
            ("socklb__v1", false),
            ("other_tool_v1", false),
            ("links", false),
        ];
        for (name, other) in rows {
            assert_eq!(is_other_layout_map(name), other, "{name}");
        }
    }

    #[test]
    fn instances_get_their_own_handle_at_one_priority() {
        let a = NlFilter::of_instance(Path::new("/sys/fs/bpf/socklb"));
        let b = NlFilter::of_instance(Path::new("/sys/fs/bpf/socklb-other"));
        assert_eq!(a.priority, b.priority);
        assert_ne!(a.handle, b.handle);
        assert_ne!(a.handle, 0);
        assert_eq!(a, NlFilter::of_instance(Path::new("/sys/fs/bpf/socklb")));
    }
}
