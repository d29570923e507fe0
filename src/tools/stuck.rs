//! The last line of defence behind the sandbox's bounds: calls that outlive their deadline.
//!
//! Every library call a script can make is bounded before it runs (see `lua/bounds.rs`), but
//! that is an audit, and audits miss things. A call on the blocking pool whose tool has a
//! deadline is therefore awaited for at most that deadline plus [`GRACE`]. Past it, the caller
//! gets a timeout and the run is abandoned: its thread keeps the run (a thread stuck in C cannot
//! be stopped from outside), and the tool is quarantined until that run ends or the script is
//! reloaded, so one bad tool holds at most one thread instead of one per call. `/health` counts
//! the abandoned runs.
//!
//! Measured (tests/it/limits.rs): an abandoned call answers 1 s after its deadline, and other
//! callers, `/health` included, are not slowed, since the run never held an async worker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::ToolRef;

/// How long past its deadline a call is awaited before it is abandoned.
pub const GRACE: Duration = Duration::from_secs(1);

/// The abandoned runs of one tool version that have not ended yet.
#[derive(Clone, Debug)]
pub struct StuckRun {
    /// "tool 'x'" or "agent 'x'".
    pub tool: String,
    /// When the oldest of them was abandoned.
    pub since: Instant,
    /// How many (two calls can be abandoned before the quarantine starts).
    pub runs: usize,
}

/// The quarantine of one application (see `super::CallState`): abandoned runs that have not
/// ended, by the identity of the tool version they belong to.
#[derive(Default)]
pub struct Quarantine {
    runs: Mutex<HashMap<usize, StuckRun>>,
    /// How many tool versions are quarantined now (the fast path of [`Quarantine::quarantined`]).
    stuck: AtomicUsize,
}

impl Quarantine {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, StuckRun>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The abandoned run of the tool version with this [`identity`], if one is still going.
    pub fn quarantined(&self, identity: usize) -> Option<StuckRun> {
        // Every call asks; almost always nothing is stuck, and then no lock is taken.
        if self.stuck.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.lock().get(&identity).cloned()
    }

    /// Every abandoned run still going, oldest first.
    pub fn all(&self) -> Vec<StuckRun> {
        if self.stuck.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut runs: Vec<StuckRun> = self.lock().values().cloned().collect();
        runs.sort_by_key(|r| r.since);
        runs
    }
}

/// The identity of a tool version: a reloaded script is a new `Arc`, so it starts clean.
pub fn identity(tool: &ToolRef) -> usize {
    Arc::as_ptr(tool) as *const () as usize
}

/// How one call on the blocking pool ended, shared by the caller and the thread.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Done,
    Abandoned,
}

/// Calls [`Watch::finished`] when dropped, so a run that panics still lifts its quarantine.
pub struct Finish(pub Watch);

impl Drop for Finish {
    fn drop(&mut self) {
        self.0.finished();
    }
}

/// Links one call's waiting caller with the thread running it.
#[derive(Clone)]
pub struct Watch {
    phase: Arc<Mutex<Phase>>,
    key: usize,
    quarantine: Arc<Quarantine>,
}

impl Watch {
    /// Watches one call of the tool version with this [`identity`], for `quarantine`.
    pub fn new(quarantine: &Arc<Quarantine>, identity: usize) -> Watch {
        Watch { phase: Arc::new(Mutex::new(Phase::Running)), key: identity, quarantine: Arc::clone(quarantine) }
    }

    /// Awaits `task` for at most `limit` plus [`GRACE`] (forever without a limit). `None`: the
    /// run was abandoned, and the tool is quarantined until it ends.
    pub async fn wait<T>(
        &self,
        task: &mut tokio::task::JoinHandle<T>,
        limit: Option<Duration>,
        tool: &str,
    ) -> Option<Result<T, tokio::task::JoinError>> {
        let Some(limit) = limit else { return Some(task.await) };
        match tokio::time::timeout(limit + GRACE, &mut *task).await {
            Ok(joined) => Some(joined),
            // The run ended just now: its result is on its way.
            Err(_) if !self.abandon(tool) => Some(task.await),
            Err(_) => None,
        }
    }

    /// Called by the thread when the run ends, however late: lifts the quarantine it caused.
    pub fn finished(&self) {
        let mut phase = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        if *phase == Phase::Abandoned {
            let mut runs = self.quarantine.lock();
            if let Some(run) = runs.get_mut(&self.key) {
                run.runs -= 1;
                let (tool, waited, left) = (run.tool.clone(), run.since.elapsed().as_secs_f64(), run.runs);
                if left == 0 {
                    runs.remove(&self.key);
                    self.quarantine.stuck.fetch_sub(1, Ordering::AcqRel);
                    tracing::warn!(
                        "an abandoned call of {tool} finally ended after {waited:.1} s; it takes calls again"
                    );
                }
            }
        }
        *phase = Phase::Done;
    }

    /// Called by the caller when it stops waiting. Returns false if the run ended meanwhile (its
    /// result is then about to arrive and should be awaited).
    fn abandon(&self, tool: &str) -> bool {
        let mut phase = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        if *phase == Phase::Done {
            return false;
        }
        *phase = Phase::Abandoned;
        self.quarantine.lock().entry(self.key).and_modify(|run| run.runs += 1).or_insert_with(|| {
            self.quarantine.stuck.fetch_add(1, Ordering::AcqRel);
            StuckRun { tool: tool.to_string(), since: Instant::now(), runs: 1 }
        });
        tracing::error!(
            "a call of {tool} overran its deadline by more than {} s without stopping (stuck in a library call); the caller got a timeout, and it is quarantined until that call ends or its script changes",
            GRACE.as_secs()
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run that ignores its deadline (as a thread stuck in C would) is abandoned at deadline
    /// plus grace, quarantines its tool while it runs, and lifts the quarantine when it ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_past_its_deadline_is_abandoned_and_quarantines_until_it_ends() {
        let id = 0x5eed_0001;
        let quarantine = Arc::new(Quarantine::default());
        let watch = Watch::new(&quarantine, id);
        let on_thread = watch.clone();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let mut task = tokio::task::spawn_blocking(move || {
            let _ = release_rx.recv_timeout(Duration::from_secs(30));
            on_thread.finished();
            "late"
        });
        let started = Instant::now();
        let outcome = watch.wait(&mut task, Some(Duration::from_millis(100)), "stuck_probe").await;
        let waited = started.elapsed();
        assert!(outcome.is_none(), "the caller must stop waiting");
        assert!(waited >= Duration::from_millis(1100) && waited < Duration::from_secs(10), "{waited:?}");
        let run = quarantine.quarantined(id).expect("quarantined while the run is stuck");
        assert_eq!(run.tool, "stuck_probe");
        assert!(quarantine.all().iter().any(|r| r.tool == "stuck_probe"));
        assert!(Quarantine::default().quarantined(id).is_none(), "another application's quarantine is its own");
        release_tx.send(()).unwrap();
        assert_eq!(task.await.unwrap(), "late");
        assert!(quarantine.quarantined(id).is_none(), "the quarantine lifts when the run ends");
    }

    /// A run that ends in time is simply awaited, and leaves no trace.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_within_its_deadline_is_awaited() {
        let id = 0x5eed_0002;
        let quarantine = Arc::new(Quarantine::default());
        let watch = Watch::new(&quarantine, id);
        let on_thread = watch.clone();
        let mut task = tokio::task::spawn_blocking(move || {
            on_thread.finished();
            7
        });
        let outcome = watch.wait(&mut task, Some(Duration::from_millis(100)), "quick_probe").await;
        assert_eq!(outcome.map(|r| r.unwrap()), Some(7));
        assert!(quarantine.quarantined(id).is_none());
    }
}
