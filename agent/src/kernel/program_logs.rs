//! The kernel programs' diagnostics (aya-log): their rare failure paths (a map update the
//! kernel refused, a helper error) as lines in the agent's log.
//!
//! Free when off: the level is a read-only global, so the verifier removes the log calls
//! (docs/operations.md, "The kernel programs' own log").
use std::os::fd::AsRawFd as _;

use aya::Ebpf;
use aya_log::EbpfLogger;
use tokio::io::unix::AsyncFd;
use tracing::warn;

/// The most verbose program log line forwarded; the programs log failures at `warn`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum ProgramLogLevel {
    /// Nothing: the log calls are removed from the programs when they load.
    #[default]
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl ProgramLogLevel {
    /// The value of aya-log-ebpf's level global ([`aya_log::LEVEL`]), which the loader
    /// always sets: the object's own default enables every level. 0 silences every call.
    pub fn global(self) -> u8 {
        let level = match self {
            Self::Off => return 0,
            Self::Error => aya_log::Level::Error,
            Self::Warn => aya_log::Level::Warn,
            Self::Info => aya_log::Level::Info,
            Self::Debug => aya_log::Level::Debug,
            Self::Trace => aya_log::Level::Trace,
        };
        level as u8
    }
}

/// The reader of the programs' log ring buffer, while logging is on.
pub struct ProgramLogs(EbpfLogger<&'static dyn log::Log>);

#[derive(Debug, thiserror::Error)]
#[error("cannot read the kernel programs' log buffer (run without --bpf-log-level to skip it)")]
pub struct ProgramLogsError(#[source] aya_log::Error);

impl ProgramLogs {
    /// Takes the log ring buffer out of the loaded object (once); `None` when logging is
    /// off.
    pub fn take(ebpf: &mut Ebpf, level: ProgramLogLevel) -> Result<Option<Self>, ProgramLogsError> {
        if level == ProgramLogLevel::Off {
            return Ok(None);
        }
        // Records go through the `log` facade, which the agent's tracing subscriber bridges.
        EbpfLogger::init(ebpf)
            .map(|logger| Some(Self(logger)))
            .map_err(ProgramLogsError)
    }

    /// Forwards the records as they arrive, until the task is dropped.
    pub async fn forward(self) {
        let fd = self.0.as_raw_fd();
        // SAFETY: the logger owns the ring buffer's fd, and flushing it neither closes nor
        // replaces that fd, so it stays valid for as long as it is registered.
        let registered =
            unsafe { AsyncFd::register_with_interest(self.0, tokio::io::Interest::READABLE) };
        let mut reader = match registered {
            Ok(reader) => reader,
            Err(error) => {
                warn!(fd, %error, "cannot watch the kernel programs' log buffer: not forwarded");
                return;
            }
        };
        loop {
            let Ok(mut ready) = reader.readable_mut().await else {
                return;
            };
            ready.get_inner_mut().flush();
            ready.clear_ready();
        }
    }
}
