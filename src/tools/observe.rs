//! Observation: the one place where a call (or an MCP request that is not a tool call) is logged
//! and counted. [`Observed`] starts with the call; it writes the log line, the metrics and the
//! call-log entry when the call ends, or, when it is dropped first (the client went away, an MCP
//! cancellation), as cancelled: every call that started is in the log exactly once.
//!
//! A call that may change something must be in the call log before its answer leaves: the
//! pipeline takes its place in the log's queue before it runs ([`Observed::must_be_logged`],
//! which refuses the call when the log cannot take it), and awaits the [`Commit`] that
//! [`Observed::end`] returns before it answers.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use serde_json::Value as Json;

use super::{CallError, CallOptions, CallState, Output, Principal};

/// An id for each call, so inner calls can name their parent. It starts from the process's
/// start time in microseconds, so ids stay unique in a log that several processes (a server,
/// then another, the CLI) write over time.
fn next_call_id() -> u64 {
    // Static: an id counter, not state: two servers in one process must not hand out the same id either.
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicU64> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let now = SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        std::sync::atomic::AtomicU64::new(now.as_micros() as u64)
    });
    next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A call or request being observed. Dropped before [`Observed::end`] or [`Observed::finish`],
/// it is logged as cancelled.
pub struct Observed<'a> {
    open: Option<Open<'a>>,
    /// The application's call log and metrics.
    state: &'a CallState,
}

/// What the log needs of a call that started. Borrowed and unboxed: observing a call costs no
/// allocation of its own and touches no shared reference count.
struct Open<'a> {
    name: &'a str,
    /// Whether the name is a registered tool or a method of ctx's own: only those become
    /// metrics labels.
    known: bool,
    via: &'static str,
    parent: Option<u64>,
    /// Whom the call is for (a reference count only for a scoped token's calls).
    principal: Option<Arc<Principal>>,
    id: u64,
    at: Instant,
    wall: SystemTime,
    /// The call-log entry (parameters rendered), when a log runs.
    entry: Option<Box<crate::calllog::Entry>>,
    /// The entry's place in the log's queue, for a call that must be logged before it answers.
    reservation: Option<crate::calllog::Reservation>,
}

/// Resolves once a call's entry is committed to the call log: `Ok(true)`; `Ok(false)` or an
/// error when it could not be written.
pub type Commit = tokio::sync::oneshot::Receiver<bool>;

impl<'a> Observed<'a> {
    /// Starts observing a request that is not a tool call under its MCP method's name
    /// (`prompts/get`, `resources/read`): names with a `/`, which no tool can have.
    pub fn start(state: &'a CallState, method: &'a str, params: &Json, options: &CallOptions) -> Observed<'a> {
        Observed::open(state, method, true, params, options)
    }

    /// Starts observing a call of `name`, with its parameters as sent. Whether the name is known
    /// is decided when the call ends.
    pub(super) fn call(state: &'a CallState, name: &'a str, params: &Json, options: &CallOptions) -> Observed<'a> {
        Observed::open(state, name, false, params, options)
    }

    fn open(state: &'a CallState, name: &'a str, known: bool, params: &Json, options: &CallOptions) -> Observed<'a> {
        Observed {
            state,
            open: Some(Open {
                name,
                known,
                via: options.caller,
                parent: options.parent,
                principal: options.principal.clone(),
                id: next_call_id(),
                at: Instant::now(),
                wall: SystemTime::now(),
                entry: state.log.begin(params),
                reservation: None,
            }),
        }
    }

    /// Marks the call as one the log must hold before it answers, taking its place in the log's
    /// queue; refused (nothing runs) when the log cannot take it. Without a log (turned off),
    /// there is nothing to keep.
    pub fn must_be_logged(&mut self) -> Result<(), CallError> {
        let Some(open) = &mut self.open else { return Ok(()) };
        if open.entry.is_none() {
            return Ok(());
        }
        match self.state.log.reserve() {
            Ok(reservation) => {
                open.reservation = reservation;
                Ok(())
            }
            Err(why) => Err(CallError::AuditUnavailable(format!(
                "tool '{}' did not run: a call that may change something is written to the tool-call log before it answers, and {why}",
                open.name
            ))),
        }
    }

    /// The call's id: the parent of the calls its run makes.
    pub fn id(&self) -> u64 {
        self.open.as_ref().map_or(0, |o| o.id)
    }

    /// Marks the name as one ctx knows (a registered tool), so its metrics have a label of
    /// their own.
    pub(super) fn known(&mut self, known: bool) {
        if let Some(open) = &mut self.open {
            open.known |= known;
        }
    }

    /// Starts the call's duration again (after a person's decision it waited for).
    pub(super) fn restart(&mut self) {
        if let Some(open) = &mut self.open {
            open.at = Instant::now();
        }
    }

    /// Lets the request go unlogged: it is handed to a path that logs it itself.
    pub fn forget(mut self) {
        self.open = None;
    }

    /// Logs a request's outcome: a small summary of what was served, or the error.
    pub fn finish(mut self, result: Result<Json, &CallError>) {
        if let Some(open) = self.open.take() {
            let result = match result {
                Ok(summary) => Ok(Output::Value(summary)),
                Err(e) => Err(e.clone()),
            };
            let _ = record(self.state, open, &result);
        }
    }

    /// Logs a request's outcome like [`Observed::finish`]; for a request marked
    /// [`Observed::must_be_logged`] (an operator's act, such as a sync started through the
    /// server), the [`Commit`] to await before it takes effect.
    pub fn finish_logged(mut self, result: Result<Json, &CallError>) -> Option<Commit> {
        let open = self.open.take()?;
        let result = match result {
            Ok(summary) => Ok(Output::Value(summary)),
            Err(e) => Err(e.clone()),
        };
        record(self.state, open, &result)
    }

    /// Logs a call's outcome; for a call that must be logged, the [`Commit`] to await before
    /// answering.
    pub(super) fn end(mut self, result: &Result<Output, CallError>) -> Option<Commit> {
        let open = self.open.take()?;
        record(self.state, open, result)
    }
}

impl Drop for Observed<'_> {
    fn drop(&mut self) {
        if let Some(open) = self.open.take() {
            let cancelled = Err(CallError::cancelled(open.name));
            // Nobody waits for an answer; the entry is still written.
            let _ = record(self.state, open, &cancelled);
        }
    }
}

/// The output's value, as the call log keeps it as the result.
fn output_value(output: &Output) -> std::borrow::Cow<'_, Json> {
    match output {
        Output::Value(v) | Output::HandledError(v) => std::borrow::Cow::Borrowed(v),
        Output::Traced { output, .. } => output_value(output),
        other => std::borrow::Cow::Owned(other.value()),
    }
}

/// The end of every call: its log line, its metrics, and its entry in the call log (with the
/// [`Commit`] to await when the call must be logged before it answers).
fn record(state: &CallState, open: Open<'_>, result: &Result<Output, CallError>) -> Option<Commit> {
    let name = open.name;
    let micros = open.at.elapsed().as_micros() as u64;
    let outcome = match result {
        Ok(output) if output.is_error() => "tool_error",
        Ok(_) => "ok",
        Err(e) => super::error::code_name(e.code()),
    };
    state.metrics.call(name, open.known, outcome, micros);
    match result {
        Ok(_) => tracing::debug!(tool = name, caller = open.via, micros, "tool call ok"),
        Err(e) => {
            let text = e.log_text();
            let text = crate::lua::api::log::one_line(&text);
            tracing::info!(tool = name, caller = open.via, micros, code = %e.code(), "tool call failed: {text}")
        }
    }
    let mut entry = open.entry?;
    match result {
        Ok(output) => {
            entry.set_result(&state.log, &output_value(output));
            entry.message = None;
        }
        Err(e) => {
            entry.has_result = false;
            entry.message = Some(e.log_text());
        }
    }
    entry.id = open.id;
    entry.parent = open.parent;
    entry.at = open.wall;
    entry.tool.clear();
    entry.tool.push_str(name);
    entry.caller.clear();
    if let Some(principal) = &open.principal {
        entry.caller.push_str(principal.name());
    }
    entry.via = open.via;
    entry.micros = micros;
    entry.outcome = outcome;
    match open.reservation {
        Some(reservation) => Some(state.log.record_durable(entry, reservation)),
        None => {
            state.log.record(entry);
            None
        }
    }
}
