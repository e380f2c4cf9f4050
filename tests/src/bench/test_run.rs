//! One run of a loaded TC program on a packet, in the kernel's test harness
//! (`BPF_PROG_TEST_RUN`): the program's own run time for that packet, with none of the
//! network stack around it. aya has no call for it; the attribute is aya-obj's binding of
//! the kernel's.
use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use anyhow::Context as _;
use aya::programs::{
    ProgramFd,
    links::{FdLink, PinnedLink},
    loaded_programs,
};
use aya_obj::generated::{bpf_attr, bpf_cmd};

/// A TC program, found through the link that attaches it.
pub struct TestRun {
    fd: ProgramFd,
}

impl TestRun {
    /// The program of the pinned link `program@device` in `pin_dir`.
    pub fn of_link(pin_dir: &Path, program: &str, device: &str) -> anyhow::Result<Self> {
        let pin = socklb_agent::dataplane::link_pin(pin_dir, &format!("{program}@{device}"));
        let link = PinnedLink::from_pin(&pin)
            .with_context(|| format!("open the link pin {}", pin.display()))?;
        let id = FdLink::from(link)
            .info()
            .with_context(|| format!("read the link {}", pin.display()))?
            .program_id();
        let info = loaded_programs()
            .flatten()
            .find(|info| info.id() == id)
            .with_context(|| format!("program {id} of {}", pin.display()))?;
        let fd = info
            .fd()
            .with_context(|| format!("open program {id} ({program})"))?;
        Ok(Self { fd })
    }

    /// Runs the program once on `packet` (an Ethernet frame); its run time in ns.
    pub fn run(&self, packet: &[u8]) -> io::Result<u32> {
        let mut out = vec![0u8; packet.len() + 256];
        // SAFETY: an all-zero bpf_attr is the kernel's "nothing set".
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the union's test-run member, which BPF_PROG_TEST_RUN reads.
        let test = unsafe { &mut attr.test };
        test.prog_fd = self.fd.as_fd().as_raw_fd().cast_unsigned();
        test.data_in = packet.as_ptr() as u64;
        test.data_size_in = u32::try_from(packet.len()).unwrap_or(u32::MAX);
        test.data_out = out.as_mut_ptr() as u64;
        test.data_size_out = u32::try_from(out.len()).unwrap_or(u32::MAX);
        test.repeat = 1;
        // SAFETY: the attribute's buffers live across the call; the kernel writes the run
        // time back into it.
        let result = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                bpf_cmd::BPF_PROG_TEST_RUN as libc::c_long,
                &raw mut attr,
                std::mem::size_of::<bpf_attr>(),
            )
        };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        Ok(unsafe { attr.test.duration })
    }
}
