//! The process's one async runtime: the CLI builds it once and runs every command on it, and sync
//! code that must wait on a future (a script's `http.*` and `sleep`, an embedding request) waits
//! on it here.
//!
//! The CLI owns the runtime and hands its handle to the commands; this module keeps a copy of the
//! handle only for the code that is called from a script or a provider and has no way to be
//! given one. A library caller that never built a runtime (the tests) gets one on first use.

use std::future::Future;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::runtime::{Builder, Handle, Runtime};

/// The runtime [`wait`] runs futures on: the one [`build`] made, else the one made for a library
/// caller that built none.
// Static: the one async runtime of the process, which the host I/O of every application runs on;
// a script's `http` and `sleep` and an embedding provider reach it from threads that hold no
// application to ask.
static PROCESS: OnceLock<Handle> = OnceLock::new();

/// How long [`stop`] waits for threads of the blocking pool that are still running.
pub const STOP_WAIT: Duration = Duration::from_secs(3);

/// Builds the process's runtime, which [`wait`] then uses too. The CLI calls it once, first:
/// anything that waited before would have started a runtime of its own.
pub fn build() -> std::io::Result<Runtime> {
    let runtime = Builder::new_multi_thread().enable_all().build()?;
    if PROCESS.set(runtime.handle().clone()).is_err() {
        tracing::warn!("a second async runtime was built; host I/O stays on the first");
    }
    Ok(runtime)
}

/// The process's runtime.
pub fn handle() -> Handle {
    PROCESS
        .get_or_init(|| {
            // A library caller with no runtime of ctx's (the tests, which run scripts and
            // providers from plain threads and from runtimes of their own): one for the rest of
            // the process, never dropped, as `build`'s would live until the process ends.
            let runtime = Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("ctx-io")
                .enable_all()
                .build()
                .expect("the async runtime starts");
            let handle = runtime.handle().clone();
            std::mem::forget(runtime);
            handle
        })
        .clone()
}

/// Runs `future` on the process's runtime and blocks this thread until it is done: `None` if the
/// runtime stopped first (the process is shutting down).
///
/// For a thread that may block: the CLI's main thread, the runtime's blocking pool (where
/// scripts and providers run), a thread of ctx's own. Never an async worker: it would sit idle,
/// and the inline path of a script (`Vm::make_inline`) escalates before any host call that
/// comes here. The output comes back over a channel rather than through `Handle::block_on`,
/// which panics inside any runtime's async context: a caller inside a runtime of its own (an
/// embedding from a test's `block_on`) waits like any other.
pub fn wait<F>(future: F) -> Option<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    handle().spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv().ok()
}

/// Stops the runtime without waiting for ever: dropping it would wait for every thread of its
/// blocking pool, and one stuck in a library call (a script past its deadline in a call the
/// sandbox audit missed, which `tools::stuck` quarantines) would then keep the process from
/// exiting on SIGTERM. Such a thread ends with the process.
pub fn stop(runtime: Runtime) {
    let started = Instant::now();
    runtime.shutdown_timeout(STOP_WAIT);
    if started.elapsed() >= STOP_WAIT {
        tracing::warn!("a blocking thread was still running {} s after shutdown; exiting anyway", STOP_WAIT.as_secs());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stuck_blocking_thread_does_not_hold_the_stop() {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.spawn_blocking(|| std::thread::sleep(std::time::Duration::from_secs(3600)));
        let started = std::time::Instant::now();
        stop(runtime);
        let took = started.elapsed();
        assert!(took >= STOP_WAIT && took < STOP_WAIT + std::time::Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn wait_works_from_a_plain_thread_and_inside_another_runtime() {
        assert_eq!(wait(async { 7 }), Some(7));
        let other = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let inside = other.block_on(async {
            wait(async {
                tokio::time::sleep(Duration::from_millis(5)).await;
                8
            })
        });
        assert_eq!(inside, Some(8));
    }
}
