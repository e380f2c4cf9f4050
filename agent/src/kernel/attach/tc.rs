//! Attaching the TC programs to the node's external devices and to pod devices, and
//! removing them.
//!
//! TCX (kernel >= 6.6) attaches through pinned bpf links; older kernels get clsact netlink
//! filters at one priority and a handle derived from the pin directory ([`NlFilter`],
//! `pins`), so that a new agent replaces its own filters' programs in place and never
//! touches another instance's. A filter has no pin, so the pin directory records each one
//! for cleanup. README, "Traffic from outside the node (TC)", has the rest.
use std::{
    ffi::CString,
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf,
    programs::{
        ProgramError, SchedClassifier, TcAttach, TcAttachType,
        links::Link as _,
        tc::{self, NlOptions, SchedClassifierLink, TcError},
    },
    util::KernelVersion,
};
use serde::Serialize;
use socklb_abi::program_names;
use tracing::{info, warn};

use super::Attachment;
use crate::kernel::{
    devices::{self, DeviceError},
    links::{self, PinnedLinkError},
    load::program,
    pins::{self, NlFilter},
    privileges,
};

/// How TC programs are attached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TcMode {
    /// TCX where the kernel has it (>= 6.6), netlink otherwise.
    #[default]
    Auto,
    Tcx,
    Netlink,
}

impl TcMode {
    /// The mode `Auto` stands for on this kernel.
    pub fn resolve(self) -> Self {
        match self {
            Self::Auto => match KernelVersion::current() {
                Ok(version) if version >= KernelVersion::new(6, 6, 0) => Self::Tcx,
                _ => Self::Netlink,
            },
            mode => mode,
        }
    }
}

/// What a device carries, which decides the programs on its two hooks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceRole {
    /// A device that holds the Node's addresses: traffic from outside.
    External,
    /// The host side of a workload's interface: its packets to internal frontends (the
    /// per-packet path).
    Pod,
}

impl DeviceRole {
    fn hooks(self) -> [(&'static str, TcAttachType); 2] {
        let ingress = match self {
            Self::External => program_names::TC_INGRESS,
            Self::Pod => program_names::TC_POD,
        };
        [
            (ingress, TcAttachType::Ingress),
            (program_names::TC_EGRESS, TcAttachType::Egress),
        ]
    }
}

/// The hook of each TC program.
fn hook_of(program: &str) -> Option<TcAttachType> {
    [DeviceRole::External, DeviceRole::Pod]
        .into_iter()
        .flat_map(DeviceRole::hooks)
        .find_map(|(name, hook)| (name == program).then_some(hook))
}

/// A device and what it carries.
pub type TcDevice = (String, DeviceRole);

/// Whether this network namespace has the device. Asked of the kernel (an ioctl on a
/// socket of this namespace), not of /sys/class/net, which shows the namespace that
/// mounted /sys.
fn device_exists(device: &str) -> bool {
    nix::net::if_::if_nametoindex(device).is_ok()
}

#[derive(Debug, thiserror::Error)]
pub enum TcAttachError {
    #[error(
        "device {device} does not exist in this network namespace: check --devices (`ip link` \
         lists the devices)"
    )]
    NoDevice { device: String },
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("cannot attach {program} to device {device} ({mode:?})")]
    Attach {
        program: &'static str,
        device: String,
        mode: TcMode,
        #[source]
        source: ProgramError,
    },
    #[error("cannot add the clsact qdisc to device {device}")]
    Qdisc {
        device: String,
        #[source]
        source: TcError,
    },
    #[error(transparent)]
    PinnedLink(#[from] PinnedLinkError),
    #[error("cannot list or remove TC link pins in {path}")]
    Pins {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Attaches the TC programs of its role to every device but those of `done` (attached
/// before by this agent), and detaches them from devices (or roles) socklb served before
/// but no longer should.
pub fn attach(
    ebpf: &mut Ebpf,
    pin_dir: &Path,
    devices: &[TcDevice],
    done: &[TcDevice],
    mode: TcMode,
) -> Result<TcAttached, TcAttachError> {
    let mode = mode.resolve();
    let records = match mode {
        TcMode::Netlink => pins::netlink_records_dir(pin_dir),
        _ => pins::links_dir(pin_dir),
    };
    fs::create_dir_all(&records).map_err(|source| TcAttachError::Pins {
        path: records.clone(),
        source,
    })?;
    // Programs attached the other way before (a changed --tc-attach-mode) go too.
    let (tcx_devices, netlink_devices) = match mode {
        TcMode::Netlink => (&[][..], devices),
        _ => (devices, &[][..]),
    };
    remove_stale_pins(pin_dir, tcx_devices)?;
    remove_stale_netlink_filters(pin_dir, netlink_devices)?;
    let mut outcome = TcAttached {
        devices: devices
            .iter()
            .filter(|device| done.contains(device))
            .cloned()
            .collect(),
        ..TcAttached::default()
    };
    for device in devices.iter().filter(|device| !done.contains(device)) {
        match attach_device(ebpf, pin_dir, device, mode) {
            Ok(attached) => {
                outcome.attached.extend(attached);
                outcome.devices.push(device.clone());
            }
            // A pod's device may be gone already (the pod ended), or refuse the programs:
            // that pod keeps its socket path, and every other device is served.
            Err(error) if device.1 == DeviceRole::Pod => {
                outcome.failed.push((device.0.clone(), error))
            }
            Err(error) => return Err(error),
        }
    }
    Ok(outcome)
}

/// What [`attach`] did.
#[derive(Debug, Default)]
pub struct TcAttached {
    /// Each program attached (`program@device`), and how.
    pub attached: Vec<(String, Attachment)>,
    /// The devices now served (those of `done` still wanted, and the new ones).
    pub devices: Vec<TcDevice>,
    /// Pod devices that could not be served, and why.
    pub failed: Vec<(String, TcAttachError)>,
}

/// Attaches the programs of the device's role to it.
fn attach_device(
    ebpf: &mut Ebpf,
    pin_dir: &Path,
    (device, role): &TcDevice,
    mode: TcMode,
) -> Result<Vec<(String, Attachment)>, TcAttachError> {
    let name = device_name(device)?;
    // Missing, or not Ethernet (the programs would misread every packet).
    devices::check_ethernet(device)?;
    let mut attached = Vec::new();
    for (program_name, hook) in role.hooks() {
        let target = Target::new(program_name, pin_dir, &name, device, hook);
        let attachment = attach_program(ebpf, mode, &target)?;
        info!(
            program = program_name,
            device,
            ?mode,
            ?attachment,
            "program attached"
        );
        attached.push((format!("{program_name}@{device}"), attachment));
    }
    Ok(attached)
}

/// Where one program goes: a device (`name`, for the kernel) and its hook, with the
/// instance's pin directory.
struct Target<'a> {
    program_name: &'static str,
    pin_dir: &'a Path,
    name: &'a CString,
    device: &'a str,
    hook: TcAttachType,
}

impl<'a> Target<'a> {
    fn new(
        program_name: &'static str,
        pin_dir: &'a Path,
        name: &'a CString,
        device: &'a str,
        hook: TcAttachType,
    ) -> Self {
        Self {
            program_name,
            pin_dir,
            name,
            device,
            hook,
        }
    }

    /// The error of an attach in `mode` that failed.
    fn attach_error(&self, mode: TcMode) -> impl Fn(ProgramError) -> TcAttachError + Copy + '_ {
        move |source| TcAttachError::Attach {
            program: self.program_name,
            device: self.device.to_owned(),
            mode,
            source,
        }
    }
}

/// Attaches (or swaps in) the program of `ebpf` that `target` names, in `mode`.
fn attach_program(
    ebpf: &mut Ebpf,
    mode: TcMode,
    target: &Target<'_>,
) -> Result<Attachment, TcAttachError> {
    let program = attachable(ebpf, target.program_name, target.device, mode)?;
    match mode {
        TcMode::Netlink => attach_netlink(program, target),
        _ => attach_tcx(program, target),
    }
}

/// `device` as the kernel takes it.
fn device_name(device: &str) -> Result<CString, TcAttachError> {
    CString::new(device).map_err(|_| TcAttachError::NoDevice {
        device: device.to_owned(),
    })
}

fn attach_tcx(
    program: &mut SchedClassifier,
    target: &Target<'_>,
) -> Result<Attachment, TcAttachError> {
    let pin = pins::tc_link_pin(target.pin_dir, target.program_name, target.device);
    let attach_error = target.attach_error(TcMode::Tcx);
    if pin.exists() {
        let link: SchedClassifierLink = links::open(&pin, "reuse (not a TCX link)")?;
        let id = program.attach_to_link(link).map_err(attach_error)?;
        // Dropping our handle closes the fd only; the pin keeps the link.
        drop(program.take_link(id));
        return Ok(Attachment::Replaced);
    }
    let id = program
        .attach(
            target.name.as_c_str(),
            TcAttach::Tcx {
                attach_type: target.hook,
                order: aya::programs::LinkOrder::default(),
            },
        )
        .map_err(attach_error)?;
    links::pin(program.take_link(id).map_err(attach_error)?, &pin)?;
    Ok(Attachment::Attached)
}

fn attach_netlink(
    program: &mut SchedClassifier,
    target: &Target<'_>,
) -> Result<Attachment, TcAttachError> {
    let &Target {
        program_name,
        pin_dir,
        name,
        device,
        hook,
    } = target;
    match tc::qdisc_add_clsact(name.as_c_str()) {
        Ok(()) | Err(TcError::AlreadyAttached) => {}
        // A clsact qdisc that is already there (ours from before, or another tool's).
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(source) => {
            return Err(TcAttachError::Qdisc {
                device: device.to_owned(),
                source,
            });
        }
    }
    let records: Vec<NetlinkRecord> = netlink_records(pin_dir)?
        .into_iter()
        .filter(|record| record.program == program_name && record.device == device)
        .collect();
    let filter = records
        .iter()
        .find_map(|record| record.filter)
        .unwrap_or_else(|| NlFilter::of_instance(pin_dir));
    let attach_error = target.attach_error(TcMode::Netlink);
    // Without NLM_F_CREATE the kernel swaps the program of the filter at this priority and
    // handle in place (atomic: every packet sees the old program or the new one), or
    // answers that there is none.
    let ours = SchedClassifierLink::attached(
        name.as_c_str(),
        hook.into(),
        filter.priority,
        filter.handle.into(),
        None,
    )
    .map_err(|_| TcAttachError::NoDevice {
        device: device.to_owned(),
    })?;
    let (id, attachment) = match program.attach_to_link(ours) {
        Ok(id) => (id, Attachment::Replaced),
        Err(_) => {
            let legacy = records.iter().any(|record| record.filter.is_none());
            if legacy {
                // An older agent's filter, at a priority and handle the kernel chose: it
                // goes first (a gap of milliseconds, once, at the upgrade).
                warn!(
                    program = program_name,
                    device,
                    "replacing a netlink filter of an older agent (by its program name): \
                     traffic from outside may see a gap of a few milliseconds this once"
                );
                let _ = tc::qdisc_detach_program(name.as_c_str(), hook.into(), program_name);
            }
            let options = NlOptions {
                priority: filter.priority,
                handle: filter.handle.into(),
                ..NlOptions::default()
            };
            let id = program
                .attach(
                    name.as_c_str(),
                    TcAttach::Netlink {
                        parent: hook.into(),
                        options,
                    },
                )
                .map_err(attach_error)?;
            let attachment = if legacy {
                Attachment::Replaced
            } else {
                Attachment::Attached
            };
            (id, attachment)
        }
    };
    // Netlink filters stay when the agent exits; forget the handle without detaching.
    let link = program.take_link(id);
    std::mem::forget(link);
    // bpffs holds no regular files: a record is an empty directory.
    let record = pins::netlink_record(pin_dir, program_name, device, filter);
    match fs::create_dir(&record) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            return Err(TcAttachError::Pins {
                path: record,
                source: e,
            });
        }
        _ => {}
    }
    for old in records.iter().filter(|r| r.filter != Some(filter)) {
        let _ = fs::remove_dir(&old.path);
    }
    Ok(attachment)
}

/// Swaps the programs of `ebpf` into every TC attachment this pin directory records (TCX
/// links atomically; netlink filters by replacing them), attaching nowhere new. Returns how
/// many.
pub fn replace_attached(ebpf: &mut Ebpf, pin_dir: &Path) -> Result<usize, TcAttachError> {
    let mut replaced = 0;
    for (path, device) in tc_pins(pin_dir)? {
        let name = device_name(&device)?;
        let Some((program_name, hook)) = pinned_program(&path) else {
            continue;
        };
        let target = Target::new(program_name, pin_dir, &name, &device, hook);
        attach_program(ebpf, TcMode::Tcx, &target)?;
        replaced += 1;
    }
    for record in netlink_records(pin_dir)? {
        let Some((program_name, hook)) = known_program(&record.program) else {
            continue;
        };
        let device = record.device;
        let name = device_name(&device)?;
        let target = Target::new(program_name, pin_dir, &name, &device, hook);
        attach_program(ebpf, TcMode::Netlink, &target)?;
        replaced += 1;
    }
    Ok(replaced)
}

fn attachable<'a>(
    ebpf: &'a mut Ebpf,
    program_name: &'static str,
    device: &str,
    mode: TcMode,
) -> Result<&'a mut SchedClassifier, TcAttachError> {
    program(ebpf, program_name).map_err(|_| TcAttachError::Attach {
        program: program_name,
        device: device.to_owned(),
        mode,
        source: ProgramError::NotLoaded,
    })
}

/// A TC program by name: its own name (static) and its hook.
fn known_program(program: &str) -> Option<(&'static str, TcAttachType)> {
    let name = program_names::TC
        .into_iter()
        .find(|name| *name == program)?;
    Some((name, hook_of(name)?))
}

/// The TC program of a link pin, from its file name.
fn pinned_program(path: &Path) -> Option<(&'static str, TcAttachType)> {
    let file_name = path.file_name()?.to_str()?;
    known_program(file_name.split_once('@')?.0)
}

/// Whether the program is one `devices` wants on `device`.
fn wanted(devices: &[TcDevice], program: &str, device: &str) -> bool {
    devices.iter().any(|(name, role)| {
        name == device && role.hooks().iter().any(|(wanted, _)| *wanted == program)
    })
}

/// Removes TCX link pins of programs `devices` no longer wants (which detaches them).
fn remove_stale_pins(pin_dir: &Path, devices: &[TcDevice]) -> Result<(), TcAttachError> {
    for (path, device) in tc_pins(pin_dir)? {
        let program = pinned_program(&path).map_or("", |(name, _)| name);
        if !wanted(devices, program, &device) {
            info!(
                device,
                program, "device no longer served: detaching the TC program"
            );
            fs::remove_file(&path).map_err(|source| TcAttachError::Pins {
                path: path.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// The devices this pin directory's TC programs serve and as what (by their ingress
/// program: TCX link pins and netlink records alike), sorted.
pub fn served_devices(pin_dir: &Path) -> Result<Vec<TcDevice>, TcAttachError> {
    let pinned = tc_pins(pin_dir)?
        .into_iter()
        .filter_map(|(path, device)| Some((pinned_program(&path)?.0, device)));
    let recorded = netlink_records(pin_dir)?
        .into_iter()
        .filter_map(|record| Some((known_program(&record.program)?.0, record.device)));
    let mut devices: Vec<TcDevice> = pinned
        .chain(recorded)
        .filter_map(|(program, device)| {
            [DeviceRole::External, DeviceRole::Pod]
                .into_iter()
                .find(|role| role.hooks()[0].0 == program)
                .map(|role| (device, role))
        })
        .collect();
    devices.sort();
    devices.dedup();
    Ok(devices)
}

/// The TCX link pins and their device names.
pub fn tc_pins(pin_dir: &Path) -> Result<Vec<(PathBuf, String)>, TcAttachError> {
    let found = named_entries(&pins::links_dir(pin_dir))?
        .into_iter()
        .filter_map(|(path, name)| Some((path, pins::tc_link_device(&name)?.to_owned())))
        .collect();
    Ok(found)
}

/// The entries of `dir` whose names are text, with their paths; none if `dir` does not
/// exist.
fn named_entries(dir: &Path) -> Result<Vec<(PathBuf, String)>, TcAttachError> {
    let pins_error = |source| TcAttachError::Pins {
        path: dir.to_owned(),
        source,
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(pins_error(source)),
    };
    let mut named = Vec::new();
    for entry in entries {
        let entry = entry.map_err(pins_error)?;
        if let Ok(name) = entry.file_name().into_string() {
            named.push((entry.path(), name));
        }
    }
    Ok(named)
}

/// Detaches the netlink filters of programs `devices` no longer wants.
fn remove_stale_netlink_filters(pin_dir: &Path, devices: &[TcDevice]) -> Result<(), TcAttachError> {
    let stale = netlink_records(pin_dir)?
        .into_iter()
        .filter(|record| !wanted(devices, &record.program, &record.device));
    for record in stale {
        info!(
            device = record.device,
            program = record.program,
            "device no longer served: detaching the TC program"
        );
        detach_netlink_filter(&record).map_err(|source| TcAttachError::Pins {
            path: record.path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// A netlink filter this pin directory's agent attached, as its record says.
struct NetlinkRecord {
    path: PathBuf,
    program: String,
    device: String,
    /// `None`: recorded by an older agent, which did not choose the priority and handle.
    filter: Option<NlFilter>,
}

/// The netlink filters this pin directory's agent attached.
fn netlink_records(pin_dir: &Path) -> Result<Vec<NetlinkRecord>, TcAttachError> {
    let records = named_entries(&pins::netlink_records_dir(pin_dir))?
        .into_iter()
        .filter_map(|(path, name)| {
            let (program, device, filter) = pins::parse_netlink_record(&name)?;
            known_program(program).is_some().then(|| NetlinkRecord {
                program: program.to_owned(),
                device: device.to_owned(),
                filter,
                path,
            })
        })
        .collect();
    Ok(records)
}

/// Removes one recorded netlink filter, then its record: the filter at the recorded
/// priority and handle, whatever else is attached to the device. A filter the kernel
/// refuses to remove (EPERM without CAP_NET_ADMIN) is an error: it would keep translating
/// with maps nobody updates. A device that is gone took its filters with it.
fn detach_netlink_filter(record: &NetlinkRecord) -> io::Result<()> {
    let (program, device) = (record.program.as_str(), record.device.as_str());
    let hook = hook_of(program);
    if let (Some(hook), Ok(name)) = (hook, CString::new(device))
        && device_exists(device)
    {
        let detached = match record.filter {
            Some(filter) => SchedClassifierLink::attached(
                name.as_c_str(),
                hook.into(),
                filter.priority,
                filter.handle.into(),
                None,
            )
            .map_err(ProgramError::from)
            .and_then(|link| link.detach()),
            // An older agent's record: its filter is known by the program's name only.
            None => tc::qdisc_detach_program(name.as_c_str(), hook.into(), program)
                .map_err(ProgramError::from),
        };
        match detached {
            Ok(()) => {}
            Err(error) if privileges::not_permitted(&error) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the kernel refused to remove the netlink filter {program}@{device} \
                         without CAP_NET_ADMIN: {error}"
                    ),
                ));
            }
            // Already removed (by hand, or the qdisc went): nothing left to do.
            Err(_) => {}
        }
    }
    match fs::remove_dir(&record.path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes the netlink filters this pin directory's agent attached (kernels without TCX;
/// TCX links go with their pins), and their records. Filters of other instances, at their
/// own handles, stay.
pub fn detach_netlink_filters(pin_dir: &Path) -> io::Result<Vec<String>> {
    let mut removed = Vec::new();
    for record in netlink_records(pin_dir).map_err(io::Error::other)? {
        detach_netlink_filter(&record)?;
        removed.push(format!(
            "{}@{} (netlink filter)",
            record.program, record.device
        ));
    }
    // Only if empty, like the pin directory itself: anything else in there is not ours.
    match fs::remove_dir(pins::netlink_records_dir(pin_dir)) {
        Err(e)
            if e.kind() != io::ErrorKind::NotFound && e.raw_os_error() != Some(libc::ENOTEMPTY) =>
        {
            Err(e)
        }
        _ => Ok(removed),
    }
}
