//! A time budget for queries run where blocking is not welcome (an async worker).
//!
//! [`within`] gives the queries that the closure runs on this thread a deadline. SQLite's progress
//! handler (installed on every pooled connection) interrupts a query once it is past, and
//! [`within`] then reports that the work did not fit, so the caller can run it again where it
//! may block. Reads only: an interrupted write would roll back, but nothing budgeted writes.

use std::cell::Cell;
use std::time::{Duration, Instant};

// Static: per thread, the budget of the queries this thread runs now; holds nothing of a config.
thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
    static INTERRUPTED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `work` with a budget for its queries; `None` if a query was interrupted for it.
pub fn within<T>(budget: Duration, work: impl FnOnce() -> T) -> Option<T> {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            DEADLINE.with(|d| d.set(None));
        }
    }
    INTERRUPTED.with(|i| i.set(false));
    DEADLINE.with(|d| d.set(Some(Instant::now() + budget)));
    let reset = Reset;
    let out = work();
    drop(reset);
    (!INTERRUPTED.with(|i| i.replace(false))).then_some(out)
}

/// The progress handler: true (interrupt) once this thread's budget is used up.
pub(crate) fn exceeded() -> bool {
    let Some(deadline) = DEADLINE.with(Cell::get) else { return false };
    let late = Instant::now() >= deadline;
    if late {
        INTERRUPTED.with(|i| i.set(true));
    }
    late
}

/// Whether `err` is a query interrupted by a budget (not a failure to report).
pub fn is_interrupt(err: &rusqlite::Error) -> bool {
    matches!(err, rusqlite::Error::SqliteFailure(e, _) if e.code == rusqlite::ErrorCode::OperationInterrupted)
}
