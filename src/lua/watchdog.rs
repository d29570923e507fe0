//! Loading a script under a watchdog, so that no script can hold the thread that loads it.
//!
//! Loading runs the script's top level under its deadline, and the sandbox bounds every library
//! call (see `bounds.rs`). Should a load still run past its deadline plus [`GRACE`] (a library
//! call the audit missed), whoever is loading (`ctx serve` starting, the reload thread,
//! `ctx schema check`) stops waiting, reports the script as failed to load, and carries on; the
//! thread with the stuck load is left to it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::seconds;

/// How long past its deadline a load is awaited.
pub const GRACE: Duration = Duration::from_secs(1);

/// Runs `load` on its own thread and waits at most `timeout` plus [`GRACE`] for it. `file` is
/// the script's absolute path; `what` names it in the error ("tools/x.lua", as the config
/// writes it: two applications may each have a `tools/x.lua` of their own).
pub fn bounded<T: Send + 'static>(
    file: &Path,
    what: &str,
    timeout: Duration,
    load: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    // A script whose earlier load is still stuck is not loaded again: every reload would
    // otherwise leave one more spinning thread behind.
    if stuck_loads().contains(file) {
        return Err(format!(
            "{what}: an earlier load of this script overran its deadline and is still running, so ctx does not load it again; fix the script's top level and restart ctx"
        ));
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let (name, key) = (what.to_string(), file.to_path_buf());
    let spawned = std::thread::Builder::new().name("ctx-load".into()).spawn(move || {
        let result = load();
        if tx.send(result).is_err() {
            // Nobody waits any more: this load was given up on, and now it has ended.
            stuck_loads().remove(&key);
            tracing::warn!("{name}: a load given up on earlier has finally ended");
        }
    });
    if let Err(e) = spawned {
        return Err(format!("{what}: cannot start a thread to load the script: {e}"));
    }
    match rx.recv_timeout(timeout + GRACE) {
        Ok(result) => result,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            stuck_loads().insert(file);
            // The load may have ended between the timeout and the insert: then its result is
            // waiting, and nothing is stuck.
            if let Ok(result) = rx.try_recv() {
                stuck_loads().remove(file);
                return result;
            }
            drop(rx);
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

/// Scripts (by absolute path) whose load was given up on and is still running.
struct StuckLoads(std::sync::Mutex<std::collections::HashSet<PathBuf>>);

impl StuckLoads {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<PathBuf>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn contains(&self, file: &Path) -> bool {
        self.lock().contains(file)
    }
    fn insert(&self, file: &Path) {
        self.lock().insert(file.to_path_buf());
    }
    fn remove(&self, file: &Path) {
        self.lock().remove(file);
    }
}

fn stuck_loads() -> &'static StuckLoads {
    // Static: a stuck load holds a thread of the process, whoever started it; loading that file again only adds one.
    static STUCK: std::sync::OnceLock<StuckLoads> = std::sync::OnceLock::new();
    STUCK.get_or_init(|| StuckLoads(Default::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_load_that_never_ends_is_given_up_at_its_deadline_plus_grace() {
        let started = Instant::now();
        let file = Path::new("/app/one/tools/stuck.lua");
        let result: Result<(), String> = bounded(file, "tools/stuck.lua", Duration::from_millis(100), || {
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
        // While it is stuck, the script is not loaded again (no second thread).
        let again: Result<(), String> = bounded(file, "tools/stuck.lua", Duration::from_millis(100), || Ok(()));
        assert!(again.unwrap_err().contains("an earlier load of this script overran its deadline"));
        // Another application's script of the same name is another file: it loads.
        let other = Path::new("/app/two/tools/stuck.lua");
        assert_eq!(bounded(other, "tools/stuck.lua", Duration::from_millis(100), || Ok(7)), Ok(7));
    }

    #[test]
    fn a_load_that_ends_returns_its_result() {
        let (ok, bad) = (Path::new("/app/tools/ok.lua"), Path::new("/app/tools/bad.lua"));
        assert_eq!(bounded(ok, "tools/ok.lua", Duration::from_secs(1), || Ok(5)), Ok(5));
        let failed = bounded::<()>(bad, "tools/bad.lua", Duration::from_secs(1), || Err("bad".into()));
        assert_eq!(failed, Err("bad".into()));
    }
}
