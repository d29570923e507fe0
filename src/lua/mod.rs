//! The Lua sandbox: the only place a Lua state is created.
//!
//! Every script (connector, tool, agent) runs in a [`Vm`] with a curated standard library, the
//! host APIs of [`api`], a memory cap, and a wall-clock deadline. Each run sees new globals, so a
//! VM restarted for the next run of the same script (see [`reuse`]) keeps nothing of the last. The deadline is checked by
//! a global instruction hook (so coroutines are covered too), bounds every blocking host call,
//! and cannot be swallowed: once a VM is killed, the wrapped `pcall`, `xpcall` and
//! `coroutine.resume` re-raise. Loading a script runs under the same VM and limits as running it.

pub mod api;
mod bounds;
pub mod convert;
mod error;
mod guard;
mod pattern;
pub(crate) mod precompiled;
pub mod reuse;
pub mod script;
pub mod watchdog;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use mlua::{Function, Lua, LuaOptions, StdLib, Table, Value};
use serde_json::{Map, Value as Json};

pub(crate) use crate::contract::text::seconds;
pub use error::ScriptError;
// Plain data of the contract, used here first: re-exported where scripts are run.
pub use crate::contract::cancel::{CancelHandle, Progress, ProgressSink};
pub use crate::contract::Limits;

use crate::config::{ScriptKind, ScriptSection};

/// The most data an inline run may hand one host function (see [`RunState::check_data`]).
const INLINE_DATA: usize = 64 * 1024;

/// How often (in VM instructions) the hook checks the deadline and the cancel flag. One
/// instruction can cost a pass over a long string (`==` on two 32 MiB strings is ~4 ms), so this
/// bounds how far a run can get past its deadline: 256 such instructions are about 1 s. Checking
/// every 256 instead of 1000 instructions costs a tight arithmetic loop about 8%.
const HOOK_EVERY: u32 = 256;

/// The hook interval of an inline run: short, so that an async worker is held for little past the
/// budget (an inline run's data is capped by [`INLINE_MEMORY`], so one instruction is at most a
/// pass over 512 KiB, about 20 us: 64 of them are about 1.3 ms). A VM that has run inline keeps
/// this interval.
const HOOK_EVERY_INLINE: u32 = 64;

/// The memory an inline run may allocate before it escalates: it bounds the data any one
/// instruction of the run can touch while it holds an async worker.
const INLINE_MEMORY: usize = 512 * 1024;

// `Limits` is plain data in the contract (config fills it in too); what a config section or a
// kind of script means for it is said here.
impl Limits {
    /// The defaults for a kind of script: 64 MiB, 4 MiB of result, 30 s (tools, agents) or
    /// 300 s (connectors).
    pub fn default_for(kind: ScriptKind) -> Self {
        Limits::with_timeout(kind.default_timeout())
    }

    pub fn for_section(section: &ScriptSection) -> Self {
        Limits {
            timeout: section.timeout,
            memory_bytes: section.memory_limit_bytes,
            max_result_bytes: section.max_result_bytes,
        }
    }
}

/// Who a script is: used for its permissions, its messages and its log lines.
#[derive(Clone, Debug, PartialEq)]
pub struct ScriptInfo {
    pub kind: ScriptKind,
    pub name: String,
    /// Absolute path of the script file.
    pub path: PathBuf,
    /// The path as the user wrote it; the only path that appears in messages.
    pub display_path: String,
    pub allow_hosts: Option<Vec<String>>,
    pub allow_env: Option<Vec<String>>,
    /// `http.*` may reach private, loopback and link-local addresses.
    pub allow_private: bool,
    /// Variables `env.get` never reads: ctx uses them for a secret elsewhere.
    pub reserved_env: Vec<crate::config::ReservedVar>,
    /// The free keys of the config section: the script's `config` table.
    pub config: Map<String, Json>,
}

impl ScriptInfo {
    pub fn from_section(section: &ScriptSection) -> Self {
        ScriptInfo {
            kind: section.kind,
            name: section.name.clone(),
            path: section.path.clone(),
            display_path: section.display_path.clone(),
            allow_hosts: section.allow_hosts.clone(),
            allow_env: section.allow_env.clone(),
            allow_private: section.allow_private,
            reserved_env: section.reserved_env.clone(),
            config: section.config.clone(),
        }
    }

    /// A script run straight from a path (`ctx connector test`), with no config section.
    pub fn from_path(kind: ScriptKind, path: &Path) -> Self {
        Self::from_section(&ScriptSection::from_path(kind, path))
    }

    /// The folder the script may read (`fs.*`, `require`).
    pub fn dir(&self) -> PathBuf {
        self.path.parent().map(Path::to_path_buf).unwrap_or_default()
    }

    /// "tool 'jira'" and the like, for messages.
    pub fn what(&self) -> String {
        format!("{} '{}'", self.kind.as_str(), self.name)
    }
}

/// Why a VM was stopped. Once set it stays set until the VM is restarted for another run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kill {
    None = 0,
    Timeout = 1,
    Memory = 2,
    Cancelled = 3,
    /// An inline run (on an async worker, see [`Vm::make_inline`]) reached a host call that blocks
    /// or has effects, or used up its short budget. Nothing visible has happened yet, so the
    /// caller runs the call again, from the start, where blocking is allowed.
    Escalate = 4,
    /// A code-mode script ran its instruction budget down (see [`Vm::set_instruction_limit`]).
    Instructions = 5,
}

/// The clock the deadlines are stored against (an `Instant` does not fit an atomic).
fn epoch() -> Instant {
    // Static: the origin the atomic deadlines count from: any fixed instant serves every application.
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Shared between the VM, its hook and its host functions. One VM serves one run at a time;
/// [`Vm::restart`] resets the per-run parts for the next one.
pub struct RunState {
    pub info: ScriptInfo,
    pub limits: Limits,
    /// Nanoseconds after [`epoch`] at which the run stops.
    deadline: AtomicU64,
    cancel: Mutex<CancelHandle>,
    /// Where `progress(...)` reports, when the caller asked for progress.
    progress: Mutex<Option<ProgressSink>>,
    killed: AtomicU8,
    /// The run is an inline attempt: blocking host calls and the end of its budget escalate.
    inline: AtomicBool,
    /// The Lua state's memory limit for this run, in bytes (the state's own figure, which
    /// mlua does not read back).
    memory_limit: AtomicUsize,
    /// The sandbox's live size when the run started (its globals included): what
    /// `collectgarbage("count")` and the memory cap count from.
    run_base: AtomicUsize,
    /// The idle sandbox's live size, as of its last full collection.
    floor: AtomicUsize,
    /// Log lines this run wrote, and those it dropped past the per-run limit.
    log_lines: std::sync::atomic::AtomicU32,
    log_dropped: std::sync::atomic::AtomicU32,
    /// The log lines one run may write ([`api::log::LINES_PER_RUN`] unless set for the run).
    log_limit: std::sync::atomic::AtomicU32,
    /// VM instructions this run may still execute, and the budget it started with (`u64::MAX`:
    /// no budget). Counted by the deadline hook, so in steps of its interval.
    instructions_left: AtomicU64,
    instruction_limit: AtomicU64,
    /// Work the run has put off that must start before the run goes on for long or blocks
    /// (code mode's last started call, see `code::calls`): run by the hook and before any
    /// blocking host call.
    /// 0: nothing put off; 1: put off, due at the hook's check after next; 2: due at its next.
    deferred: AtomicU8,
    on_deferred: Mutex<Option<DeferredWork>>,
    /// How many slots a run's globals table starts with (what the last `new_env` reported):
    /// sized once instead of grown through every power of two.
    env_slots: AtomicUsize,
    /// Instructions between two calls of the deadline hook (what each call spends).
    hook_every: std::sync::atomic::AtomicU32,
}

/// What [`RunState::defer`] runs.
pub type DeferredWork = Arc<dyn Fn() + Send + Sync>;

impl RunState {
    fn new(info: ScriptInfo, limits: Limits, cancel: CancelHandle) -> RunState {
        let state = RunState {
            info,
            limits,
            deadline: AtomicU64::new(0),
            cancel: Mutex::new(cancel),
            progress: Mutex::new(None),
            killed: AtomicU8::new(0),
            inline: AtomicBool::new(false),
            memory_limit: AtomicUsize::new(0),
            run_base: AtomicUsize::new(0),
            floor: AtomicUsize::new(0),
            log_lines: Default::default(),
            log_dropped: Default::default(),
            log_limit: std::sync::atomic::AtomicU32::new(api::log::LINES_PER_RUN),
            instructions_left: AtomicU64::new(u64::MAX),
            instruction_limit: AtomicU64::new(u64::MAX),
            deferred: AtomicU8::new(0),
            on_deferred: Mutex::new(None),
            env_slots: AtomicUsize::new(0),
            hook_every: std::sync::atomic::AtomicU32::new(HOOK_EVERY),
        };
        state.set_deadline(Instant::now() + limits.timeout);
        state
    }

    fn set_deadline(&self, at: Instant) {
        let nanos = at.saturating_duration_since(epoch()).as_nanos().min(u64::MAX as u128) as u64;
        self.deadline.store(nanos, Ordering::SeqCst);
    }

    /// When the run stops.
    pub fn deadline(&self) -> Instant {
        epoch() + Duration::from_nanos(self.deadline.load(Ordering::SeqCst))
    }

    pub fn kill(&self, why: Kill) {
        let _ = self.killed.compare_exchange(0, why as u8, Ordering::SeqCst, Ordering::SeqCst);
    }

    pub fn killed(&self) -> Kill {
        match self.killed.load(Ordering::SeqCst) {
            1 => Kill::Timeout,
            2 => Kill::Memory,
            3 => Kill::Cancelled,
            4 => Kill::Escalate,
            5 => Kill::Instructions,
            _ => Kill::None,
        }
    }

    /// The caller's cancel handle for this run.
    pub fn cancel(&self) -> CancelHandle {
        lock(&self.cancel).clone()
    }

    /// Passes a `progress(...)` call on, when the caller asked for progress.
    pub fn report(&self, progress: Progress) {
        if let Some(sink) = lock(&self.progress).as_ref() {
            sink(progress);
        }
    }

    /// Time left before the deadline (zero once past it).
    pub fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// Marks the VM killed if the deadline passed or the caller cancelled; errors if killed.
    pub fn check(&self) -> mlua::Result<()> {
        if self.killed() == Kill::None {
            if lock(&self.cancel).is_cancelled() {
                self.kill(Kill::Cancelled);
            } else if Instant::now() >= self.deadline() {
                self.kill(if self.inline.load(Ordering::Relaxed) { Kill::Escalate } else { Kill::Timeout });
            }
        }
        match self.killed() {
            Kill::None => Ok(()),
            why => Err(mlua::Error::RuntimeError(format!("ctx: script stopped ({why:?})"))),
        }
    }

    /// For host functions that work on data in one go (hashing, encoding): an inline run is
    /// escalated before it works on more than [`INLINE_DATA`] bytes, which could hold the async
    /// worker longer than its budget with no hook to stop it.
    pub fn check_data(&self, bytes: usize) -> mlua::Result<()> {
        if bytes > INLINE_DATA {
            self.check_blocking()
        } else {
            self.check()
        }
    }

    /// How much data a host function may convert in this run: `limit`, or less in an inline run,
    /// which escalates (through [`RunState::check_blocking`]) when the work would be larger.
    pub fn data_limit(&self, limit: usize) -> usize {
        if self.inline.load(Ordering::Relaxed) {
            limit.min(INLINE_DATA)
        } else {
            limit
        }
    }

    /// Counts one log line of the run: false once the run has written its share, and the line
    /// is then dropped (counted, and reported when the run ends).
    pub fn note_log_line(&self) -> bool {
        let n = self.log_lines.fetch_add(1, Ordering::Relaxed);
        let limit = self.log_limit.load(Ordering::Relaxed);
        if n < limit {
            return true;
        }
        if self.log_dropped.fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(
                "{}: more than {limit} log lines in one run; the rest of this run's lines are dropped",
                self.info.what(),
            );
        }
        false
    }

    /// Log lines this run dropped past its limit.
    pub fn log_lines_dropped(&self) -> u32 {
        self.log_dropped.load(Ordering::Relaxed)
    }

    /// Charges `n` instructions to the run's budget: false once the budget is spent.
    fn spend_instructions(&self, n: u64) -> bool {
        let left = self.instructions_left.load(Ordering::Relaxed);
        if left == u64::MAX {
            return true;
        }
        self.instructions_left.store(left.saturating_sub(n), Ordering::Relaxed);
        left > n
    }

    /// The instruction budget the run started with, when it has one.
    pub fn instruction_limit(&self) -> Option<u64> {
        Some(self.instruction_limit.load(Ordering::Relaxed)).filter(|&n| n != u64::MAX)
    }

    /// Sets the work [`RunState::defer`] marks as due (`None` at the end of the run: the work
    /// may hold the run's own state).
    pub fn set_deferred_work(&self, work: Option<DeferredWork>) {
        self.deferred.store(0, Ordering::SeqCst);
        *lock(&self.on_deferred) = work;
    }

    /// Marks the deferred work as due: it runs once the script has gone on for at least one
    /// hook interval (a few hundred instructions), or before the next blocking host call,
    /// whichever comes first.
    pub fn defer(&self) {
        self.deferred.store(1, Ordering::SeqCst);
    }

    /// At a hook check: the deferred work runs at the second check after it was put off.
    fn tick_deferred(&self) {
        if self.deferred.compare_exchange(1, 2, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            self.run_deferred();
        }
    }

    /// Runs the deferred work now, if any is put off.
    pub fn run_deferred(&self) {
        if self.deferred.swap(0, Ordering::SeqCst) != 0 {
            let work = lock(&self.on_deferred).clone();
            if let Some(work) = work {
                work();
            }
        }
    }

    /// Reports what the ending run dropped, and readies the counters for the next one.
    pub(crate) fn end_run(&self) {
        self.set_deferred_work(None);
        self.log_limit.store(api::log::LINES_PER_RUN, Ordering::Relaxed);
        self.instructions_left.store(u64::MAX, Ordering::Relaxed);
        self.instruction_limit.store(u64::MAX, Ordering::Relaxed);
        let dropped = self.log_dropped.swap(0, Ordering::Relaxed);
        self.log_lines.store(0, Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!("{}: {dropped} log line(s) of one run were dropped", self.info.what());
        }
    }

    /// The bytes this run may still allocate.
    pub fn memory_left(&self, lua: &Lua) -> usize {
        self.memory_limit.load(Ordering::Relaxed).saturating_sub(lua.used_memory())
    }

    /// The bytes in use, for `collectgarbage("count")`: collected first, so what an earlier run
    /// of a reused VM left behind is gone and cannot be measured.
    pub fn run_memory(&self, lua: &Lua) -> usize {
        let _ = lua.gc_collect();
        lua.used_memory()
    }

    /// Whether this run is an inline attempt on an async worker.
    pub fn is_inline(&self) -> bool {
        self.inline.load(Ordering::Relaxed)
    }

    /// Stops the run for running out of memory: an inline run escalates (its allowance is
    /// smaller than the real cap), any other stops with the memory error.
    pub fn out_of_memory(&self) {
        self.kill(if self.is_inline() { Kill::Escalate } else { Kill::Memory });
    }

    /// Like [`RunState::check`], for host calls that block or have effects (network, files,
    /// sleep, logs, the knowledge base) and for Lua's pattern matching, which the deadline hook
    /// cannot interrupt: an inline run stops here and is escalated.
    pub fn check_blocking(&self) -> mlua::Result<()> {
        if self.inline.load(Ordering::Relaxed) {
            self.kill(Kill::Escalate);
        }
        self.run_deferred();
        self.check()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A sandboxed Lua state with host APIs and limits installed.
///
/// Scripts never see the state's own globals: each run gets a new environment table whose
/// library tables are copied on first use (see `guard.rs`), so a VM can be restarted for another
/// run of the same script without anything of the last run showing through.
pub struct Vm {
    lua: Lua,
    state: Arc<RunState>,
    /// The globals of the current run.
    env: Table,
    /// Makes a new run environment (the `new_env` of the guard chunk).
    new_env: Function,
    /// An empty table that stands in for `env` while the VM is idle.
    idle_env: Table,
    /// Lua's own `pcall` (scripts get a wrapped one), for calling into a script.
    /// Lua's own `xpcall`, and the message handler a call into the script runs under.
    raw_xpcall: Function,
    locate: Function,
    /// Memory in use right after the sandbox was built.
    baseline: usize,
    /// The hook runs at the inline interval (the VM has run inline).
    inline_hook: bool,
}

/// The most memory a finished run may leave behind for its VM to be reused.
const REUSE_SLACK: usize = 2 * 1024 * 1024;

impl Vm {
    /// Builds a fresh VM. The deadline starts now and covers loading and running the script.
    pub fn new(info: ScriptInfo, limits: Limits, cancel: CancelHandle) -> Result<Vm, ScriptError> {
        let state = Arc::new(RunState::new(info, limits, cancel));
        let setup = |e: mlua::Error| ScriptError::Load {
            message: format!("{}: cannot set up the Lua sandbox: {e}", state.info.display_path),
            detail: e.to_string(),
        };
        let (lua, new_env) = build(&state).map_err(setup)?;
        state.floor.store(lua.used_memory(), Ordering::Relaxed);
        let idle_env = lua.create_table().map_err(setup)?;
        let raw_xpcall = lua.named_registry_value(guard::RAW_XPCALL).map_err(setup)?;
        let locate = lua.named_registry_value(guard::LOCATE).map_err(setup)?;
        let baseline = lua.used_memory();
        let env = begin_run(&lua, &new_env, &state).map_err(setup)?;
        BUILT.with(|b| b.set(b.get() + 1));
        Ok(Vm { lua, state, env, new_env, idle_env, raw_xpcall, locate, baseline, inline_hook: false })
    }

    /// Readies a VM whose last run has finished for a new run of the same script: a new
    /// deadline, cancel handle and memory cap, no progress sink, and new globals.
    pub fn restart(&mut self, cancel: CancelHandle) -> Result<(), ScriptError> {
        let state = &self.state;
        state.end_run();
        state.killed.store(0, Ordering::SeqCst);
        state.inline.store(false, Ordering::SeqCst);
        *lock(&state.cancel) = cancel;
        *lock(&state.progress) = None;
        state.set_deadline(Instant::now() + state.limits.timeout);
        let fail = |e: mlua::Error| ScriptError::Load {
            message: format!("{}: cannot reset the Lua sandbox: {e}", state.info.display_path),
            detail: e.to_string(),
        };
        self.env = begin_run(&self.lua, &self.new_env, &self.state).map_err(fail)?;
        Ok(())
    }

    /// Ends a run whose VM may be reused (see [`reuse::put`]): reports what it dropped, lets go
    /// of its globals, and collects once garbage has piled up. The next run cannot measure what
    /// this one left either way (see `begin_run`). A full collection after every run, and a
    /// generational collector, were both tried: each cost the echo call about 6% of its CPU.
    pub(crate) fn finish_run(&mut self) {
        self.state.end_run();
        let _ = self.lua.set_memory_limit(0);
        // Nothing of the sandbox's may keep the run's tables alive for the collector.
        let _ = self.lua.unset_named_registry_value(RUN_ENV);
        guard::end_run(&self.lua);
        self.env = self.idle_env.clone();
        if self.lua.used_memory() > self.baseline + REUSE_SLACK / 2 {
            let _ = self.lua.gc_collect();
            self.state.floor.store(self.lua.used_memory(), Ordering::Relaxed);
        }
    }

    /// Makes this run an inline attempt of at most `budget`: the first host call that blocks or
    /// has effects, or the end of the budget, stops it with [`Kill::Escalate`].
    pub fn make_inline(&mut self, budget: Duration) {
        self.state.inline.store(true, Ordering::SeqCst);
        let at = (Instant::now() + budget).min(self.state.deadline());
        self.state.set_deadline(at);
        // A smaller allowance and a tighter hook bound what one instruction or library call can
        // do while the run holds an async worker; running into either escalates.
        let limit = self.lua.used_memory() + INLINE_MEMORY.min(self.state.limits.memory_bytes);
        if self.lua.set_memory_limit(limit).is_ok() {
            self.state.memory_limit.store(limit, Ordering::Relaxed);
        }
        // The tighter hook stays for later runs of this VM: reinstalling it costs more than it
        // saves, and a VM that ran inline once mostly runs inline again.
        if !self.inline_hook && set_hook(&self.lua, &self.state, HOOK_EVERY_INLINE).is_ok() {
            self.inline_hook = true;
        }
    }

    /// Brings the run's deadline forward to `within` from now, if that is sooner (a call's own
    /// `timeout`, below the tool's limit).
    pub fn shorten_deadline(&self, within: Duration) {
        let at = Instant::now() + within;
        if at < self.state.deadline() {
            self.state.set_deadline(at);
        }
    }

    /// Limits this run to `n` VM instructions (code mode); the run stops with
    /// [`Kill::Instructions`] once they are spent. Counted in steps of the hook's interval.
    pub fn set_instruction_limit(&self, n: u64) {
        self.state.instructions_left.store(n, Ordering::Relaxed);
        self.state.instruction_limit.store(n, Ordering::Relaxed);
    }

    /// Limits this run to `n` log lines; later lines are dropped and counted.
    pub fn set_log_limit(&self, n: u32) {
        self.state.log_limit.store(n, Ordering::Relaxed);
    }

    /// Whether the VM may serve another run: the last one was not stopped by a limit or a
    /// cancel, and left little memory behind.
    pub fn reusable(&self) -> bool {
        matches!(self.state.killed(), Kill::None | Kill::Escalate)
            && self.lua.used_memory() <= self.baseline + REUSE_SLACK
    }

    pub fn lua(&self) -> &Lua {
        &self.lua
    }

    /// The globals of the current run.
    pub fn env(&self) -> &Table {
        &self.env
    }

    pub fn state(&self) -> &Arc<RunState> {
        &self.state
    }

    /// Runs `work` (host code walking this VM's values after the script returned) as part of
    /// the run: its deadline and cancellation still stop the walks that check them.
    pub fn bounded<T>(&self, work: impl FnOnce() -> T) -> T {
        let _running = bounds::enter(self.state());
        work()
    }

    /// Lua's own `xpcall` and the handler that places errors at the script's line.
    pub(crate) fn protected(&self) -> (&Function, &Function) {
        (&self.raw_xpcall, &self.locate)
    }

    /// Sends the script's `progress(...)` calls to `sink`.
    pub fn set_progress(&self, sink: ProgressSink) {
        *lock(&self.state.progress) = Some(sink);
    }

    /// Turns an error from running Lua into a [`ScriptError`]: the limit that was hit, or the
    /// sanitised Lua message.
    pub fn classify(&self, err: &mlua::Error) -> ScriptError {
        let what = self.state.info.what();
        match self.state.killed() {
            Kill::Timeout => return ScriptError::Timeout { what, limit: self.state.limits.timeout },
            Kill::Memory => return ScriptError::Memory { what, limit_bytes: self.state.limits.memory_bytes },
            Kill::Instructions => {
                let limit = self.state.instruction_limit().unwrap_or_default();
                return ScriptError::Instructions { what, limit };
            }
            // An escalated inline run is never reported: its caller runs the call again.
            Kill::Cancelled | Kill::Escalate => return ScriptError::Cancelled { what },
            Kill::None => {}
        }
        if is_memory_error(err) {
            self.state.out_of_memory();
            if self.state.killed() == Kill::Escalate {
                return ScriptError::Cancelled { what };
            }
            return ScriptError::Memory { what, limit_bytes: self.state.limits.memory_bytes };
        }
        let message = sanitize(err, &self.state.info);
        match err {
            mlua::Error::SyntaxError { .. } => ScriptError::Load { message, detail: err.to_string() },
            _ => ScriptError::Runtime { message, detail: err.to_string() },
        }
    }

    /// Converts a value the script returned to JSON, enforcing `max_result_bytes`.
    pub fn result_json(&self, value: &Value) -> Result<Json, ScriptError> {
        let what = self.state.info.what();
        let limit = self.state.limits.max_result_bytes;
        // On an async worker, a large result is converted on the blocking pool instead: the run
        // escalates (it has had no visible effect) and runs again there.
        // The value is walked once: within the smaller budget, what it gives is the result.
        let first = self.state.data_limit(limit);
        let json = convert::to_json(&self.lua, value, first).map_err(|e| match e {
            convert::ConvertError::TooLarge { .. } if first < limit => {
                self.state.kill(Kill::Escalate);
                ScriptError::Cancelled { what: what.clone() }
            }
            convert::ConvertError::TooLarge { size } => ScriptError::ResultTooLarge { what: what.clone(), size, limit },
            convert::ConvertError::Invalid(message) => ScriptError::BadResult { what: what.clone(), message },
            // The kill flag says which limit stopped it.
            convert::ConvertError::Stopped => self.classify(&script::stopped()),
        })?;
        let size = convert::json_size(&json);
        if size > limit {
            return Err(ScriptError::ResultTooLarge { what, size, limit });
        }
        Ok(json)
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        // Pending `__gc` finalizers run when the state closes; a killed state makes the hook
        // abort them at once instead of letting one loop forever.
        self.state.kill(Kill::Cancelled);
        self.state.end_run();
    }
}

// Static: per thread, a count of the VMs this thread built (for tests); holds nothing of a config.
thread_local! {
    static BUILT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many VMs this thread has built (tests use it to see that a VM was reused).
pub fn vms_built_on_this_thread() -> u64 {
    BUILT.with(|b| b.get())
}

/// Registry key of the current run's globals (for `require`).
pub(crate) const RUN_ENV: &str = "ctx.run_env";

/// New globals for the next run, and its memory cap counted from here: neither the sandbox nor
/// what an earlier run left for the collector is charged to the script.
fn begin_run(lua: &Lua, new_env: &Function, state: &RunState) -> mlua::Result<Table> {
    // 0 lifts the last run's cap while the globals are built.
    lua.set_memory_limit(0)?;
    let before = lua.used_memory();
    let slots = state.env_slots.load(Ordering::Relaxed);
    let (env, next): (Table, usize) = new_env.call(lua.create_table_with_capacity(0, slots)?)?;
    state.env_slots.store(next, Ordering::Relaxed);
    lua.set_named_registry_value(RUN_ENV, &env)?;
    // Counted from the sandbox's live size, not from what is in use: what an earlier run left
    // for the collector is neither charged to this run nor visible to it (the collector frees
    // it before an allocation would fail, and `collectgarbage("count")` collects first).
    let base = state.floor.load(Ordering::Relaxed) + lua.used_memory().saturating_sub(before);
    let limit = base + state.limits.memory_bytes;
    lua.set_memory_limit(limit.max(lua.used_memory()))?;
    state.memory_limit.store(limit, Ordering::Relaxed);
    state.run_base.store(base, Ordering::Relaxed);
    Ok(env)
}

/// Installs the deadline hook, checking every `every` instructions (in coroutines too: a
/// coroutine takes the hook of the thread that creates it).
///
/// The hook is Lua's own C hook, not mlua's `set_global_hook`. When mlua's hook callback returns
/// an error, mlua sets the stack top before raising it; inside a hook the stack is the
/// interrupted Lua function's, and Lua 5.4's `lua_settop` runs the `__close` handlers of the
/// to-be-closed variables it drops, there and then, inside the hook, where Lua calls no hooks.
/// A `__close` that loops thus ran forever after the deadline stopped its run. This hook only
/// pushes the message and raises it: the variables are closed while the error unwinds, after the
/// protected call has turned hooks back on, so the same deadline stops every handler.
fn set_hook(lua: &Lua, state: &Arc<RunState>, every: u32) -> mlua::Result<()> {
    // The state the hook reads lives as long as the Lua state (app data is dropped after
    // `lua_close`, which may still run the hook while it closes variables).
    if lua.app_data_ref::<HookState>().is_none() {
        lua.set_app_data(HookState(Arc::clone(state)));
    }
    state.hook_every.store(every, Ordering::Relaxed);
    let run_state = Arc::as_ptr(state) as *mut std::ffi::c_void;
    // SAFETY: the closure only uses Lua's C API on the state mlua hands it, with balanced stack
    // use; the pointer it stores stays valid as long as the Lua state (see `HookState`).
    unsafe {
        lua.exec_raw::<()>((), |l| {
            mlua::ffi::lua_pushlightuserdata(l, run_state);
            mlua::ffi::lua_rawsetp(l, mlua::ffi::LUA_REGISTRYINDEX, hook_key());
            mlua::ffi::lua_sethook(l, Some(deadline_hook), mlua::ffi::LUA_MASKCOUNT, every as std::ffi::c_int);
        })
    }
}

/// Keeps the [`RunState`] the deadline hook points at alive as long as its Lua state.
struct HookState(#[allow(dead_code)] Arc<RunState>);

/// The registry key of the hook's [`RunState`] pointer: the address of a static, unique per
/// process, which is how Lua's C API names private registry entries.
fn hook_key() -> *const std::ffi::c_void {
    // Static: an address only, never read or written; two servers in one process share nothing by it.
    // Every VM's registry keeps its own pointer under it.
    static KEY: u8 = 0;
    &KEY as *const u8 as *const std::ffi::c_void
}

/// Lua's count hook: spends the run's instructions, runs put-off work, and raises once the run
/// is stopped (deadline, cancel, memory, instruction budget).
unsafe extern "C-unwind" fn deadline_hook(l: *mut mlua::ffi::lua_State, _ar: *mut mlua::ffi::lua_Debug) {
    mlua::ffi::lua_rawgetp(l, mlua::ffi::LUA_REGISTRYINDEX, hook_key());
    let state = mlua::ffi::lua_touserdata(l, -1) as *const RunState;
    mlua::ffi::lua_settop(l, -2);
    if state.is_null() {
        return;
    }
    // SAFETY: set by `set_hook`, kept alive by `HookState`.
    let stopped = hook_check(&*state);
    if let Some(message) = stopped {
        // Nothing that needs dropping is alive here: `lua_error` does not return.
        mlua::ffi::lua_pushlstring(l, message.as_ptr() as *const std::ffi::c_char, message.len());
        mlua::ffi::lua_error(l);
    }
}

/// The hook's work; `Some(message)` when the run must stop. A panic (in put-off work) stops the
/// run rather than unwind through Lua's C frames.
fn hook_check(state: &RunState) -> Option<&'static str> {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if !state.spend_instructions(u64::from(state.hook_every.load(Ordering::Relaxed))) {
            state.kill(Kill::Instructions);
        }
        if state.deferred.load(Ordering::Relaxed) != 0 {
            state.tick_deferred();
        }
        state.check().is_err()
    }));
    match outcome {
        Ok(false) => None,
        Ok(true) => Some("ctx: script stopped"),
        Err(_) => {
            tracing::error!("{}: the deadline hook panicked; the run is stopped", state.info.what());
            state.kill(Kill::Cancelled);
            Some("ctx: script stopped")
        }
    }
}

fn build(state: &Arc<RunState>) -> mlua::Result<(Lua, Function)> {
    // math, utf8, coroutine and os load on first use (see guard::load_std).
    let libs = StdLib::TABLE | StdLib::STRING;
    // The only Lua state constructor in the crate; clippy.toml forbids it everywhere else.
    #[allow(clippy::disallowed_methods)]
    let first = Lua::new_with(libs, LuaOptions::default())?;
    // Dropping the handle `new_with` returns runs a full garbage collection before the state is
    // closed, which closing makes pointless. A handle upgraded from a weak one skips it, so the
    // VM keeps that one; the collection here runs on an empty state and costs next to nothing.
    let lua = first.weak().upgrade();
    drop(first);
    set_hook(&lua, state, HOOK_EVERY)?;
    api::register_all(&lua, state)?;
    let new_env = guard::install(&lua, state)?;
    Ok((lua, new_env))
}

pub fn is_memory_error(err: &mlua::Error) -> bool {
    match err {
        mlua::Error::MemoryError(_) => true,
        mlua::Error::CallbackError { cause, .. } => is_memory_error(cause),
        mlua::Error::WithContext { cause, .. } => is_memory_error(cause),
        mlua::Error::RuntimeError(m) => m.contains("not enough memory"),
        _ => false,
    }
}

/// The Lua message without stack traces, Rust error chains, absolute paths or secrets (see
/// [`crate::config::redact`]).
pub fn sanitize(err: &mlua::Error, info: &ScriptInfo) -> String {
    let raw = innermost(err);
    let first: Vec<&str> = raw.lines().take_while(|l| !l.trim_start().starts_with("stack traceback:")).collect();
    let mut message = first.join(" ").trim().to_string();
    for prefix in ["runtime error: ", "syntax error: ", "callback error: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            message = rest.to_string();
        }
    }
    // An error raised by a library function through one of the sandbox's wrappers is placed at
    // the wrapper ("sandbox:2: too many results to unpack"): that place means nothing to a user.
    while let Some(at) = message.find("sandbox:") {
        let digits = message[at + 8..].bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || !message[at + 8 + digits..].starts_with(": ") {
            break;
        }
        message.replace_range(at..at + 8 + digits + 2, "");
    }
    let dir = info.dir().display().to_string();
    if !dir.is_empty() && dir != "/" {
        message = message.replace(&format!("{dir}/"), "").replace(&dir, ".");
    }
    if message.is_empty() {
        format!("{}: the script raised an error without a message", info.display_path)
    } else {
        crate::config::redact::string(message)
    }
}

fn innermost(err: &mlua::Error) -> String {
    match err {
        mlua::Error::CallbackError { cause, .. } => innermost(cause),
        mlua::Error::WithContext { cause, .. } => innermost(cause),
        mlua::Error::RuntimeError(m) => m.clone(),
        mlua::Error::SyntaxError { message, .. } => message.clone(),
        mlua::Error::MemoryError(m) => m.clone(),
        mlua::Error::ExternalError(e) => e.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cancelled_resolves_on_cancel_and_at_the_deadline() {
        let handle = CancelHandle::new();
        let waiting = tokio::spawn({
            let handle = handle.clone();
            async move { handle.cancelled().await }
        });
        tokio::task::yield_now().await;
        handle.cancel();
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken by cancel").unwrap();
        handle.cancelled().await;

        let started = Instant::now();
        let bounded = CancelHandle::new().until(started + Duration::from_millis(30));
        bounded.cancelled().await;
        assert!(started.elapsed() >= Duration::from_millis(30) && bounded.is_cancelled());
    }
}
