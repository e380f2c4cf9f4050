//! One run of a loaded TC program on a packet, in the kernel's test harness
//! (`BPF_PROG_TEST_RUN`), with none of the network stack around it: the program's own run
//! time for that packet (`bench packets`), or the packet it made of one that arrived with a
//! NIC's full checksum (the tests). aya has no call for it; the attribute is aya-obj's
//! binding of the kernel's.
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
use aya_obj::generated::{BPF_F_TEST_SKB_CHECKSUM_COMPLETE, bpf_attr, bpf_cmd};

/// The verdict of a program that dropped the packet.
pub const TC_ACT_SHOT: u32 = 2;

/// A TC program, found through the link that attaches it.
pub struct TestRun {
    fd: ProgramFd,
}

/// What a run gave back.
pub struct Ran {
    /// The program's verdict (`TC_ACT_*`).
    pub verdict: u32,
    /// Its run time, in ns.
    pub duration_ns: u32,
    /// The packet as the program left it.
    pub frame: Vec<u8>,
}

/// The start of a `struct __sk_buff` as the harness takes it in: only `ingress_ifindex`
/// and `ifindex` set (the device the program runs on), every other field left zero.
#[repr(C)]
#[derive(Default)]
struct SkBuffStart {
    before_ingress_ifindex: [u32; 9],
    ingress_ifindex: u32,
    ifindex: u32,
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
        Ok(self.call(packet, 0, None)?.duration_ns)
    }

    /// Runs the program once on `packet` arriving on the device `ifindex` with the full
    /// checksum a NIC gives (`CHECKSUM_COMPLETE`). The harness fails the run with `EBADMSG`
    /// if the program left `skb->csum` other than the sum of the packet it made.
    pub fn run_with_full_sum(&self, packet: &[u8], ifindex: u32) -> io::Result<Ran> {
        self.call(packet, BPF_F_TEST_SKB_CHECKSUM_COMPLETE, Some(ifindex))
    }

    fn call(&self, packet: &[u8], flags: u32, ifindex: Option<u32>) -> io::Result<Ran> {
        let mut out = vec![0u8; packet.len() + 256];
        let mut context = ifindex.map(|ifindex| SkBuffStart {
            ingress_ifindex: ifindex,
            ifindex,
            ..SkBuffStart::default()
        });
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
        test.flags = flags;
        if let Some(context) = &mut context {
            test.ctx_in = (&raw mut *context) as u64;
            test.ctx_size_in = size_of::<SkBuffStart>() as u32;
        }
        // SAFETY: the attribute's buffers live across the call; the kernel writes the
        // verdict, the run time and the output's size back into it.
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
        let test = unsafe { attr.test };
        out.truncate(test.data_size_out as usize);
        Ok(Ran {
            verdict: test.retval,
            duration_ns: test.duration,
            frame: out,
        })
    }
}

/// The index of `device` in this thread's network namespace.
pub fn ifindex(device: &str) -> u32 {
    let name = std::ffi::CString::new(device).expect("a device name");
    // SAFETY: a NUL-terminated name; the call only reads it.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "no device {device}");
    index
}
