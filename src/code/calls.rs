//! The inner calls of one code-mode run, all through the pipeline's one door
//! ([`Registry::enter`]). A tool function returns a pending call at once. An upstream call
//! starts on the async runtime right away; a call of ctx's own tools is put off until the
//! script awaits it, when its call is polled once on the script's own thread (it finishes
//! there if its tool can finish without blocking) and awaited on the runtime otherwise, or
//! until the script does anything else first, when it starts on the runtime. So calls started
//! before they are awaited run concurrently, up to [`CodeLimits::max_concurrent`] at a time per
//! upstream server (and per ctx's own tools): the others wait their turn (a [`Gate`] of the
//! pipeline, taken before any approval or rate is spent), and the wait is not part of a call's
//! own timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};
use tokio::sync::Semaphore;

use crate::config::code_mode::CodeLimits;
use crate::lua::{CancelHandle, Progress, ProgressSink, RunState};
use crate::tools::pipeline::Gate;
use crate::tools::{Answer, Call, CallError, CallOptions, Output, Registry};
use crate::types::ErrorCode;

/// The most inner calls a trace lists one by one; the rest are counted.
pub const TRACE_ENTRIES: usize = 200;

/// How often a blocked await looks at the run's deadline and cancel flag.
const WAKE_EVERY: Duration = Duration::from_millis(20);

/// One inner call: its result once it has one.
pub struct Slot {
    /// The registry name it called.
    pub tool: String,
    /// How the script named it (`github.search_repos`), for messages.
    pub path: String,
    /// The script line that started it: where a failure is reported (the line of the await
    /// can be lost to a tail call, as in `return x.y({}):await()`).
    pub line: Option<i64>,
    /// Its gate: the upstream server, or ctx's own tools.
    group: String,
    /// What its arguments count against the run's memory until it has run.
    args_bytes: usize,
    /// Its parameters while it is put off (see [`Calls::start`]).
    deferred: Mutex<Option<Json>>,
    done: Mutex<Option<Done>>,
    /// What its result counts against the run's memory until the script takes it.
    held_bytes: AtomicUsize,
    ready: Condvar,
    cancel: CancelHandle,
    abort: Mutex<Option<tokio::task::AbortHandle>>,
    /// When the script started it: a call cancelled before it finished is traced with the time
    /// it had had.
    since: Instant,
}

impl Slot {
    /// Stores the result unless the slot has one already; `record` traces it, only when it is
    /// the one stored, so a call that finishes as it is cancelled is traced once.
    fn finish(&self, result: Result<Output, CallError>, record: impl FnOnce(&Result<Output, CallError>)) {
        let mut done = lock(&self.done);
        if done.is_none() {
            record(&result);
            *done = Some(Done::Result(result));
            self.ready.notify_all();
        }
    }
}

/// A finished call: its result until the script awaits it, then only the fact (the script
/// keeps the value; ctx lets go of its copy and of what it counted against the memory cap).
enum Done {
    Result(Result<Output, CallError>),
    Taken,
}

/// Why a run stopped short of finishing by itself.
#[derive(Clone, Debug, PartialEq)]
pub struct Tripped {
    /// `max_calls`: the one limit the calls themselves enforce (the VM reports the others).
    pub limit: &'static str,
    pub message: String,
}

/// The inner calls of one run, and their trace.
pub struct Calls {
    registry: Arc<Registry>,
    handle: tokio::runtime::Handle,
    limits: CodeLimits,
    options: CallOptions,
    progress: Option<ProgressSink>,
    state: Arc<RunState>,
    gates: Mutex<HashMap<String, Arc<Semaphore>>>,
    slots: Mutex<Vec<Arc<Slot>>>,
    /// Finished calls' entries, in the order they finished (shared with the call tasks).
    trace: Arc<Mutex<Vec<TraceEntry>>>,
    tripped: Mutex<Option<Tripped>>,
    /// Bytes of arguments and results the run's calls hold in Rust, outside the Lua memory
    /// cap: bounded by that cap too, so 100 calls of 16 MiB each cannot pile up.
    held: Arc<AtomicUsize>,
    /// The call put off last, not yet started.
    waiting: Mutex<Option<Arc<Slot>>>,
}

/// Why a call was not started.
pub enum Refusal {
    /// A limit that stops the run (`max_calls`).
    Stop(String),
    /// A refusal the script may catch and recover from.
    Refuse(String),
}

impl Calls {
    pub fn new(
        registry: Arc<Registry>,
        handle: tokio::runtime::Handle,
        limits: CodeLimits,
        options: CallOptions,
        progress: Option<ProgressSink>,
        state: Arc<RunState>,
    ) -> Calls {
        Calls {
            registry,
            handle,
            limits,
            options,
            progress,
            state,
            gates: Mutex::new(HashMap::new()),
            slots: Mutex::new(Vec::new()),
            trace: Arc::new(Mutex::new(Vec::new())),
            tripped: Mutex::new(None),
            held: Arc::new(AtomicUsize::new(0)),
            waiting: Mutex::new(None),
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The limit that stopped the run, when one did.
    pub fn tripped(&self) -> Option<Tripped> {
        lock(&self.tripped).clone()
    }

    /// Stops the run for `limit`: the VM stops at its next check, and the calls in flight are
    /// cancelled when the run ends.
    pub fn trip(&self, limit: &'static str, message: String) {
        let mut tripped = lock(&self.tripped);
        if tripped.is_none() {
            *tripped = Some(Tripped { limit, message });
        }
        self.state.kill(crate::lua::Kill::Cancelled);
    }

    /// How many calls the run started.
    pub fn started(&self) -> usize {
        lock(&self.slots).len()
    }

    /// Starts a call of `tool` in the group `group` (the server, or ctx's own tools). Refuses
    /// it, stopping the run, once the run has started `max_calls`.
    pub fn start(
        &self,
        tool: &str,
        path: &str,
        line: Option<i64>,
        group: &str,
        params: Json,
    ) -> Result<usize, Refusal> {
        if self.started() >= self.limits.max_calls {
            let message = format!(
                "the script tried to start more than {} tool calls, its max_calls limit; do more per call, or raise max_calls in [code_mode] of ctx.toml",
                self.limits.max_calls
            );
            self.trip("max_calls", message.clone());
            return Err(Refusal::Stop(message));
        }
        let size = crate::contract::text::json_size(&params);
        if !reserve(&self.held, size, self.limits.memory_bytes) {
            return Err(Refusal::Refuse(format!(
                "{path}: the script's calls would hold more than its memory limit of {} MiB of arguments and results; \
                 pass less data, or await and drop results before starting more calls",
                self.limits.memory_bytes / (1024 * 1024)
            )));
        }
        let mut slots = lock(&self.slots);
        let slot = Arc::new(Slot {
            tool: tool.to_string(),
            path: path.to_string(),
            line,
            group: group.to_string(),
            args_bytes: size,
            deferred: Mutex::new(None),
            done: Mutex::new(None),
            held_bytes: AtomicUsize::new(0),
            ready: Condvar::new(),
            cancel: CancelHandle::new(),
            abort: Mutex::new(None),
            since: Instant::now(),
        });
        let id = slots.len();
        slots.push(Arc::clone(&slot));
        drop(slots);
        if self.registry.is_async(tool) {
            self.dispatch(&slot, Args::Fresh(params));
        } else {
            // Put off until the script awaits it (then it may run right here, with no thread
            // hand-off) or does anything else: another call, a blocking host call, or a few
            // hundred instructions of its own (the hook) start it on the runtime.
            self.flush();
            *lock(&slot.deferred) = Some(params);
            *lock(&self.waiting) = Some(slot);
            self.state.defer();
        }
        Ok(id)
    }

    /// Starts `slot`'s call on the runtime; it runs behind its group's gate.
    fn dispatch(&self, slot: &Arc<Slot>, args: Args) {
        let (entered, gate) = match args {
            Args::Fresh(params) => {
                let (call, gate) = self.call_of(slot, params);
                (self.registry.entered(call), gate)
            }
            Args::Entered(entered, gate) => (entered, gate),
        };
        let (on_task, conclude, held) = (Arc::clone(slot), self.concluder(), Arc::clone(&self.held));
        let task = self.handle.spawn(async move {
            let started = Instant::now();
            let result = entered.await.and_then(Answer::output);
            held.fetch_sub(on_task.args_bytes, Ordering::Relaxed);
            // Waiting for a turn is not part of the call's own time.
            let since = gate.running_since().unwrap_or(started);
            conclude(&on_task, result, since.elapsed());
        });
        *lock(&slot.abort) = Some(task.abort_handle());
    }

    /// The pipeline call of `slot` with `params`, behind its group's gate, and, with
    /// `[approval] in_scripts = "wait"`, waiting for a person's decision when it needs approval.
    fn call_of(&self, slot: &Slot, params: Json) -> (Call, Arc<Gate>) {
        let mut options = self.options_for(slot);
        if self.registry.approvals().wait_in_scripts {
            let policy = Arc::clone(self.registry.approvals());
            options.ask = Some(Arc::new(WaitForPerson { policy, cancel: slot.cancel.clone() }));
        }
        let gate = Gate::new(self.gate(&slot.group));
        let mut call = Call::tool(slot.tool.clone(), params, options);
        call.gate = Some(Arc::clone(&gate));
        (call, gate)
    }

    /// Starts the call put off last, if there is one.
    pub fn flush(&self) {
        let Some(slot) = lock(&self.waiting).take() else { return };
        let params = lock(&slot.deferred).take();
        if let Some(params) = params {
            self.dispatch(&slot, Args::Fresh(params));
        }
    }

    fn options_for(&self, slot: &Slot) -> CallOptions {
        let mut options = self.options.clone();
        options.cancel = slot.cancel.clone();
        options
    }

    /// What concludes a finished call: counts its result against the run's memory, stores it,
    /// and (when it is the one stored) traces it and reports progress.
    fn concluder(&self) -> impl Fn(&Slot, Result<Output, CallError>, Duration) + Send + 'static {
        let report = self.reporter();
        let (held, cap) = (Arc::clone(&self.held), self.limits.memory_bytes);
        move |slot, result, elapsed| {
            let bytes = match &result {
                Ok(output) => super::outcome::size_of(output),
                Err(_) => 0,
            };
            // The result is held as a JSON tree until the script takes it: about twice its
            // serialised size.
            let result = match result {
                Ok(_) if !reserve(&held, bytes * 2, cap) => Err(CallError::ResultTooLarge(format!(
                    "tool '{}' returned {bytes} bytes, more than the script's memory limit of {} MiB leaves for results; \
                     ask for less (a limit or a filter parameter)",
                    slot.tool,
                    cap / (1024 * 1024)
                ))),
                Ok(output) => {
                    slot.held_bytes.store(bytes * 2, Ordering::Relaxed);
                    Ok(output)
                }
                other => other,
            };
            slot.finish(result, |result| report(slot, result, elapsed, bytes));
        }
    }

    /// The call the script knows by `id`.
    pub fn slot(&self, id: usize) -> Option<Arc<Slot>> {
        lock(&self.slots).get(id).cloned()
    }

    /// The run's limits and kill flag.
    pub fn state(&self) -> Arc<RunState> {
        Arc::clone(&self.state)
    }

    /// What records a finished call: its trace entry and a progress notification.
    fn reporter(&self) -> impl Fn(&Slot, &Result<Output, CallError>, Duration, usize) + Send + 'static {
        let trace = Arc::clone(&self.trace);
        let progress = self.progress.clone();
        move |slot, result, elapsed, bytes| {
            let entry = TraceEntry::new(&slot.tool, result, elapsed, bytes);
            let message = progress.as_ref().map(|_| {
                let status = if result.is_ok() { "ok" } else { "failed" };
                format!("{} {status} in {} ms", slot.path, elapsed.as_millis())
            });
            // Reported under the trace's lock: calls that finish together on two threads would
            // otherwise send their counts out of order, and MCP progress must only go up. The
            // sink only queues the report.
            let mut trace = lock(&trace);
            trace.push(entry);
            if let (Some(progress), Some(message)) = (&progress, message) {
                progress(Progress { done: trace.len() as f64, total: None, message: Some(message) });
            }
        }
    }

    fn gate(&self, group: &str) -> Arc<Semaphore> {
        let mut gates = lock(&self.gates);
        Arc::clone(
            gates.entry(group.to_string()).or_insert_with(|| Arc::new(Semaphore::new(self.limits.max_concurrent))),
        )
    }

    /// Blocks until `slot` has its result, or the run must stop (its deadline, the caller
    /// went away, a limit): then the error that stops it.
    /// The script takes the result once (the prelude keeps what it got for a second await).
    pub fn wait(&self, slot: &Arc<Slot>) -> mlua::Result<Result<Output, CallError>> {
        self.run_here(slot);
        // Whatever else was put off starts now: this thread is about to wait.
        self.flush();
        let mut done = self.until_done(slot)?;
        match done.replace(Done::Taken) {
            Some(Done::Result(result)) => {
                self.held.fetch_sub(slot.held_bytes.swap(0, Ordering::Relaxed), Ordering::Relaxed);
                Ok(result)
            }
            _ => Err(mlua::Error::RuntimeError(format!("{}: this call was already awaited", slot.path))),
        }
    }

    /// `slot`'s outcome once it has one, or the error that stops the run first (its deadline,
    /// the caller went away, a limit).
    fn until_done<'s>(&self, slot: &'s Slot) -> mlua::Result<std::sync::MutexGuard<'s, Option<Done>>> {
        let mut done = lock(&slot.done);
        while done.is_none() {
            self.state.check()?;
            let wait = self.state.remaining().min(WAKE_EVERY).max(Duration::from_millis(1));
            done = slot.ready.wait_timeout(done, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
        Ok(done)
    }

    /// Runs `slot`'s call on this thread when it is the one put off and its tool can finish
    /// it without blocking; else starts it on the runtime.
    fn run_here(&self, slot: &Arc<Slot>) {
        let mine = {
            let mut waiting = lock(&self.waiting);
            match waiting.as_ref() {
                Some(w) if Arc::ptr_eq(w, slot) => waiting.take(),
                _ => None,
            }
        };
        let Some(params) = mine.and_then(|slot| lock(&slot.deferred).take()) else { return };
        let started = Instant::now();
        // Polled once right here: a call whose tool finishes without blocking is done, with no
        // thread hand-off; any other goes on on the runtime from where it got to.
        let (call, gate) = self.call_of(slot, params);
        let mut entered = self.registry.entered(call);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match entered.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(result) => {
                self.held.fetch_sub(slot.args_bytes, Ordering::Relaxed);
                (self.concluder())(slot, result.and_then(Answer::output), started.elapsed());
            }
            std::task::Poll::Pending => self.dispatch(slot, Args::Entered(entered, gate)),
        }
    }

    /// Waits for the calls the script started and never awaited (a message it posted and did
    /// not need the answer of): their effects are part of the run.
    pub fn settle(&self) -> mlua::Result<()> {
        self.flush();
        let slots: Vec<Arc<Slot>> = lock(&self.slots).clone();
        for slot in slots {
            drop(self.until_done(&slot)?);
        }
        Ok(())
    }

    /// Cancels every call still in flight: an upstream gets `notifications/cancelled`, a Lua
    /// tool stops at its next check. Each is traced as cancelled.
    pub fn cancel_all(&self) {
        // The call put off never starts.
        if let Some(slot) = lock(&self.waiting).take() {
            if lock(&slot.deferred).take().is_some() {
                self.held.fetch_sub(slot.args_bytes, Ordering::Relaxed);
            }
        }
        let slots: Vec<Arc<Slot>> = lock(&self.slots).clone();
        for slot in slots {
            if lock(&slot.done).is_some() {
                continue;
            }
            slot.cancel.cancel();
            if let Some(abort) = lock(&slot.abort).take() {
                abort.abort();
            }
            let cancelled = Err(CallError::Cancelled { subject: format!("tool '{}'", slot.tool) });
            let entry = TraceEntry::cancelled(&slot.tool, slot.since.elapsed());
            slot.finish(cancelled, |_| lock(&self.trace).push(entry));
        }
    }

    /// The trace: every inner call (tool, ms, status, bytes), the first [`TRACE_ENTRIES`] of
    /// them one by one, in the order they finished.
    pub fn trace(&self) -> Json {
        let calls = lock(&self.trace);
        let listed: Vec<Json> = calls.iter().take(TRACE_ENTRIES).map(TraceEntry::to_json).collect();
        let mut out = json!({ "calls": listed, "started": self.started() });
        if calls.len() > TRACE_ENTRIES {
            out["unlisted"] = json!(calls.len() - TRACE_ENTRIES);
        }
        out
    }

    /// One line per call for an error message: `ctx.search ok 3 ms; github.x failed 40 ms`.
    pub fn summary(&self) -> String {
        let trace = lock(&self.trace);
        if trace.is_empty() {
            return "no tool calls were made".to_string();
        }
        let count = |status: &str| trace.iter().filter(|c| c.status == status).count();
        let counts: Vec<String> = ["ok", "error", "cancelled"]
            .into_iter()
            .map(|status| (status, count(status)))
            .filter(|(_, n)| *n > 0)
            .map(|(status, n)| format!("{n} {status}"))
            .collect();
        let mut words: Vec<String> =
            trace.iter().take(SUMMARY_CALLS).map(|c| format!("{} {} {} ms", c.tool, c.status, c.ms())).collect();
        if trace.len() > SUMMARY_CALLS {
            words.push(format!("and {} more", trace.len() - SUMMARY_CALLS));
        }
        format!("calls made: {} ({}): {}", trace.len(), counts.join(", "), words.join("; "))
    }
}

/// How many calls an error message names one by one.
const SUMMARY_CALLS: usize = 10;

/// The trace entry of one finished call, kept as it is and written as JSON once, at the end.
struct TraceEntry {
    tool: String,
    /// Tenths of a millisecond: how long it ran, or until it was cancelled.
    tenths: u64,
    status: &'static str,
    code: Option<ErrorCode>,
    bytes: usize,
}

impl TraceEntry {
    fn new(tool: &str, result: &Result<Output, CallError>, elapsed: Duration, bytes: usize) -> TraceEntry {
        let tenths = (elapsed.as_secs_f64() * 10_000.0).round() as u64;
        let (status, code, bytes) = match result {
            // The tool answered with `isError`: a tool error, as the script's error table says.
            Ok(output) if super::outcome::failed(output) => ("error", Some(ErrorCode::ToolError), bytes),
            Ok(_) => ("ok", None, bytes),
            Err(e) => ("error", Some(e.code()), 0),
        };
        TraceEntry { tool: tool.to_string(), tenths, status, code, bytes }
    }

    /// A call cancelled `elapsed` after the script started it.
    fn cancelled(tool: &str, elapsed: Duration) -> TraceEntry {
        let tenths = (elapsed.as_secs_f64() * 10_000.0).round() as u64;
        TraceEntry { tool: tool.to_string(), tenths, status: "cancelled", code: None, bytes: 0 }
    }

    /// Milliseconds, to a tenth.
    fn ms(&self) -> Json {
        json!(self.tenths as f64 / 10.0)
    }

    fn to_json(&self) -> Json {
        match self.code {
            Some(code) => {
                json!({"tool": self.tool, "ms": self.ms(), "status": self.status, "code": code, "bytes": self.bytes})
            }
            None => json!({"tool": self.tool, "ms": self.ms(), "status": self.status, "bytes": self.bytes}),
        }
    }
}

/// Adds `bytes` to `held` if the total stays within `cap`.
fn reserve(held: &AtomicUsize, bytes: usize, cap: usize) -> bool {
    held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| now.checked_add(bytes).filter(|&total| total <= cap))
        .is_ok()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a dispatched call starts from.
enum Args {
    /// Parameters not yet through the pipeline.
    Fresh(Json),
    /// A call already polled once on the script's thread, to be awaited on the runtime.
    Entered(crate::tools::pipeline::Entered, Arc<Gate>),
}

/// How often a script's call that waits for approval looks at its decision.
const APPROVAL_POLL: Duration = Duration::from_millis(250);

/// `[approval] in_scripts = "wait"`: a script's call that needs approval waits until a person
/// decides, then is checked again with its token (an approved call runs once; any other
/// decision says why not). The script's deadline still holds: when it passes, the run aborts
/// the call, and the approval stays pending for whoever asks again.
struct WaitForPerson {
    policy: Arc<crate::approval::Policy>,
    cancel: CancelHandle,
}

impl crate::tools::Ask for WaitForPerson {
    fn ask<'a>(&'a self, pending: &'a crate::approval::Pending) -> crate::tools::pipeline::AskFuture<'a> {
        Box::pin(async move {
            loop {
                tokio::time::sleep(APPROVAL_POLL).await;
                if self.cancel.is_cancelled() {
                    return Err(CallError::cancelled(&pending.approval.tool));
                }
                let (store, id) = (Arc::clone(&self.policy), pending.approval.id.clone());
                let state = tokio::task::spawn_blocking(move || store.store.by_id(&id)).await;
                let row = match state {
                    Ok(Ok(Some(row))) => row,
                    _ => return Err(CallError::ApprovalRequired(Box::new(pending.clone()))),
                };
                // Expired without a decision counts as decided: the token check says so.
                if row.state != "pending" || row.expires_ms <= crate::approval::store::now_ms() {
                    return Ok(pending.token.clone());
                }
            }
        })
    }
}
