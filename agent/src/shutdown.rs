//! SIGTERM (how Kubernetes stops a pod) and SIGINT, caught from the moment the process can
//! act on them: a signal that comes while the agent waits for the pin lock or loads its
//! programs ends the start cleanly instead of killing the process with its work half done.
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};

/// Whether a stop was asked for; cheap to clone.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Installs the handlers now, inside a multi-threaded runtime, whose workers note a
    /// signal while the caller's thread is blocked. Without handlers (which only a broken
    /// system refuses) the process runs until killed.
    pub fn install() -> Self {
        let (asked, receiver) = watch::channel(false);
        if let (Ok(mut terminate), Ok(mut interrupt)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            tokio::spawn(async move {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = interrupt.recv() => {}
                }
                let _ = asked.send(true);
            });
        }
        Self(receiver)
    }

    /// Whether a stop was asked for already.
    pub fn asked(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes once a stop is asked for.
    pub async fn wait(mut self) {
        // An error is the sender gone without a signal: no stop will come.
        if self.0.wait_for(|asked| *asked).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
