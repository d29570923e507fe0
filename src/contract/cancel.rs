//! Stopping a call from another thread, and the progress it reports on the way: what every
//! caller hands a tool, a script or an upstream request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Stops a running script from another thread: the caller went away. A handle made by
/// [`CancelHandle::until`] also reads as cancelled once its deadline passes.
///
/// The deadline hook reads the flag ([`CancelHandle::is_cancelled`]); a host call that waits on
/// the runtime awaits [`CancelHandle::cancelled`] beside its work instead.
#[derive(Clone, Debug, Default)]
pub struct CancelHandle {
    signal: Arc<CancelSignal>,
    deadline: Option<Instant>,
}

/// What the clones of one handle share.
#[derive(Debug, Default)]
struct CancelSignal {
    /// One atomic load for the hook, every few hundred instructions.
    flag: AtomicBool,
    /// Wakes the tasks waiting in [`CancelHandle::cancelled`].
    wake: tokio::sync::Notify,
}

impl CancelHandle {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.signal.flag.store(true, Ordering::SeqCst);
        self.signal.wake.notify_waiters();
    }
    pub fn is_cancelled(&self) -> bool {
        self.signal.flag.load(Ordering::SeqCst) || self.deadline.is_some_and(|at| Instant::now() >= at)
    }

    /// Resolves once the handle reads as cancelled: when [`CancelHandle::cancel`] is called or
    /// its deadline passes (at once if either has happened). The deadline needs the runtime's
    /// timer.
    pub async fn cancelled(&self) {
        let flagged = async {
            let notified = self.signal.wake.notified();
            tokio::pin!(notified);
            // Registered before the flag is read: a cancel in between still wakes it.
            notified.as_mut().enable();
            if !self.signal.flag.load(Ordering::SeqCst) {
                notified.await;
            }
        };
        match self.deadline {
            Some(at) => tokio::select! {
                _ = flagged => {}
                _ = tokio::time::sleep_until(at.into()) => {}
            },
            None => flagged.await,
        }
    }

    /// The same handle, also cancelled at `at`: what a script hands a call it blocks on
    /// (`context.call`), so the callee stops when the caller's own deadline passes.
    pub fn until(&self, at: Instant) -> CancelHandle {
        let deadline = Some(self.deadline.map_or(at, |own| own.min(at)));
        CancelHandle { signal: Arc::clone(&self.signal), deadline }
    }
}

/// One `progress(done, total?, message?)` call from a script.
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub done: f64,
    pub total: Option<f64>,
    pub message: Option<String>,
}

/// Receives a script's progress reports.
pub type ProgressSink = Arc<dyn Fn(Progress) + Send + Sync>;
