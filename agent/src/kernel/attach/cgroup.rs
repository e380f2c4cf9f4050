//! Attaching the cgroup programs (the socket-address hooks and sock_release) to the node's
//! cgroup through pinned bpf links, or swapping new programs into the links a previous agent
//! left.
use std::{fs, fs::File, path::Path};

use aya::{
    Ebpf,
    programs::{CgroupAttachMode, CgroupSockAddr, cgroup_sock_addr::CgroupSockAddrLink},
};
use socklb_abi::program_names;
use tracing::info;

use super::{Attachment, link_update};
use crate::kernel::{
    links,
    load::{LoadError, program, release_program},
    pins,
};

/// Attaches every program to `cgroup`, or swaps it into the pinned link a previous agent
/// left. The links stay pinned: the programs remain attached after this process exits.
pub fn attach(
    ebpf: &mut Ebpf,
    pin_dir: &Path,
    cgroup: &Path,
) -> Result<Vec<(&'static str, Attachment)>, LoadError> {
    let links_dir = pins::links_dir(pin_dir);
    fs::create_dir_all(&links_dir).map_err(|source| LoadError::Dir {
        path: links_dir.clone(),
        source,
    })?;
    let cgroup_file = File::open(cgroup).map_err(|source| LoadError::Cgroup {
        path: cgroup.to_owned(),
        source,
    })?;

    let mut done = Vec::new();
    for name in program_names::SOCK_ADDR {
        let program = program::<CgroupSockAddr>(ebpf, name)?;
        let pin = pins::link_pin(pin_dir, name);
        let attachment = if pin.exists() {
            replace_in_link(program, name, &pin)?;
            Attachment::Replaced
        } else {
            // bpf links to cgroups always coexist with other programs; the mode must be 0.
            let id = program
                .attach(&cgroup_file, CgroupAttachMode::Single)
                .map_err(|source| LoadError::Program { name, source })?;
            let link = program
                .take_link(id)
                .map_err(|source| LoadError::Program { name, source })?;
            links::pin(link, &pin)?;
            Attachment::Attached
        };
        info!(program = name, cgroup = %cgroup.display(), ?attachment, "program attached");
        done.push((name, attachment));
    }
    let name = program_names::SOCK_RELEASE;
    let attachment = attach_release(ebpf, pin_dir, &cgroup_file)?;
    info!(program = name, cgroup = %cgroup.display(), ?attachment, "program attached");
    done.push((name, attachment));
    Ok(done)
}

/// [`attach`] for the sock_release program, which counts the sockets that leave with a
/// record.
fn attach_release(ebpf: &mut Ebpf, pin_dir: &Path, cgroup: &File) -> Result<Attachment, LoadError> {
    let name = program_names::SOCK_RELEASE;
    let pin = pins::link_pin(pin_dir, name);
    if pin.exists() {
        replace_release(ebpf, &pin)?;
        return Ok(Attachment::Replaced);
    }
    let program = release_program(ebpf)?;
    let id = program
        .attach(cgroup, CgroupAttachMode::Single)
        .map_err(|source| LoadError::Program { name, source })?;
    let link = program
        .take_link(id)
        .map_err(|source| LoadError::Program { name, source })?;
    links::pin(link, &pin)?;
    Ok(Attachment::Attached)
}

/// Swaps the sock_release program into the pinned link at `pin`.
fn replace_release(ebpf: &mut Ebpf, pin: &Path) -> Result<(), LoadError> {
    let name = program_names::SOCK_RELEASE;
    let program = release_program(ebpf)?
        .fd()
        .map_err(|source| LoadError::Program { name, source })?;
    link_update::update_pinned(pin, program).map_err(|source| LoadError::UpdateLink {
        path: pin.to_owned(),
        source,
    })
}

/// Swaps `program` into the pinned link at `pin` (`BPF_LINK_UPDATE`: atomic, no moment
/// without a program).
fn replace_in_link(
    program: &mut CgroupSockAddr,
    name: &'static str,
    pin: &Path,
) -> Result<(), LoadError> {
    let link: CgroupSockAddrLink = links::open(pin, "reuse (not a cgroup sock_addr link)")?;
    let id = program
        .attach_to_link(link)
        .map_err(|source| LoadError::Program { name, source })?;
    // Dropping our handle closes the fd only; the pin keeps the link.
    drop(program.take_link(id));
    Ok(())
}

/// Swaps the programs of `ebpf` into every cgroup link pinned under `pin_dir`, creating
/// none: what is attached stays attached, now running these programs. Returns how many.
pub fn replace_attached(ebpf: &mut Ebpf, pin_dir: &Path) -> Result<usize, LoadError> {
    let mut replaced = 0;
    for name in program_names::SOCK_ADDR {
        let pin = pins::link_pin(pin_dir, name);
        if pin.exists() {
            replace_in_link(program::<CgroupSockAddr>(ebpf, name)?, name, &pin)?;
            replaced += 1;
        }
    }
    let pin = pins::link_pin(pin_dir, program_names::SOCK_RELEASE);
    if pin.exists() {
        replace_release(ebpf, &pin)?;
        replaced += 1;
    }
    Ok(replaced)
}
