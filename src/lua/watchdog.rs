//! Loading a script under a watchdog, so that no script can hold the thread that loads it.
//!
//! Loading runs the script's top level under its deadline, and the sandbox bounds every library
//! call (see `bounds.rs`). Should a load still run past its deadline plus [`GRACE`] (a library
//! call the audit missed), whoever is loading (`ctx serve` starting, the reload thread,
//! `ctx schema check`) stops waiting, reports the script as failed to load, and carries on; the
//! thread with the stuck load is left to it.

use std::time::Duration;

use super::seconds;

/// How long past its deadline a load is awaited.
pub const GRACE: Duration = Duration::from_secs(1);

/// Runs `load` on its own thread and waits at most `timeout` plus [`GRACE`] for it. `what`
/// names the script in the error ("tools/x.lua").
pub fn bounded<T: Send + 'static>(
    what: &str,
    timeout: Duration,
    load: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new().name("ctx-load".into()).spawn(move || {
        let _ = tx.send(load());
    });
    if let Err(e) = spawned {
        return Err(format!("{what}: cannot start a thread to load the script: {e}"));
    }
    match rx.recv_timeout(timeout + GRACE) {
        Ok(result) => result,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            tracing::error!(
                "{what}: loading overran its {} deadline by more than {} s; abandoned",
                seconds(&timeout),
                GRACE.as_secs()
            );
            Err(format!(
                "{what}: loading did not finish within its timeout of {} (plus {} s), so ctx gave up on it; the script's top level runs a loop or library call that does not end: move work into the function that needs it",
                seconds(&timeout),
                GRACE.as_secs()
            ))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(format!("{what}: loading crashed inside ctx; the server log has the details"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_load_that_never_ends_is_given_up_at_its_deadline_plus_grace() {
        let started = Instant::now();
        let result: Result<(), String> = bounded("tools/stuck.lua", Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(20));
            Ok(())
        });
        let waited = started.elapsed();
        let message = result.unwrap_err();
        assert!(
            message.starts_with("tools/stuck.lua: loading did not finish within its timeout of 0.1 seconds"),
            "{message}"
        );
        assert!(waited >= Duration::from_millis(1100) && waited < Duration::from_secs(10), "{waited:?}");
    }

    #[test]
    fn a_load_that_ends_returns_its_result() {
        assert_eq!(bounded("tools/ok.lua", Duration::from_secs(1), || Ok(5)), Ok(5));
        assert_eq!(bounded::<()>("tools/bad.lua", Duration::from_secs(1), || Err("bad".into())), Err("bad".into()));
    }
}
