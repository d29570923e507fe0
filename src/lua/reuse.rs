//! Idle VMs kept per thread, so the next run of the same script skips building a sandbox.
//!
//! A VM is keyed by the script it ran (a [`ScriptKey`] never handed out twice, so a reloaded
//! script never gets a VM of its old version). Each run still gets new globals
//! ([`Vm::restart`]); only the sandbox itself is kept. The lists are per thread: a VM's memory
//! stays in the cache of the core that used it, and no lock is shared between callers.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{CancelHandle, ScriptError, Vm};

/// The most idle VMs one thread keeps; the least recently used goes first.
const PER_THREAD: usize = 16;

/// Identifies one loaded version of one script.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScriptKey(u64);

impl ScriptKey {
    pub fn new() -> ScriptKey {
        // Static: an id counter: a script key must be unique across every application in the process.
        static NEXT: AtomicU64 = AtomicU64::new(1);
        ScriptKey(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for ScriptKey {
    fn default() -> Self {
        Self::new()
    }
}

// Static: per thread, idle VMs keyed by a process-unique ScriptKey: no application takes another's VM.
thread_local! {
    static IDLE: RefCell<Vec<(ScriptKey, Vm)>> = const { RefCell::new(Vec::new()) };
}

/// An idle VM of `key` restarted for a new run, or a new one from `build`.
pub fn take(
    key: ScriptKey,
    cancel: CancelHandle,
    build: impl FnOnce(CancelHandle) -> Result<Vm, ScriptError>,
) -> Result<Vm, ScriptError> {
    let idle = IDLE.with(|idle| {
        let mut idle = idle.borrow_mut();
        let at = idle.iter().rposition(|(k, _)| *k == key)?;
        Some(idle.remove(at).1)
    });
    if let Some(mut vm) = idle {
        if vm.restart(cancel.clone()).is_ok() {
            return Ok(vm);
        }
    }
    build(cancel)
}

/// Keeps `vm` for the next run of `key`, if it may be reused.
pub fn put(key: ScriptKey, mut vm: Vm) {
    if !matches!(vm.state().killed(), super::Kill::None | super::Kill::Escalate) {
        vm.state().end_run();
        return;
    }
    vm.finish_run();
    if !vm.reusable() {
        return;
    }
    // try_with: a thread being torn down simply drops the VM.
    let _ = IDLE.try_with(|idle| {
        let mut idle = idle.borrow_mut();
        if idle.len() >= PER_THREAD {
            idle.remove(0);
        }
        idle.push((key, vm));
    });
}
