//! The Lua sandbox: the only place a Lua state is created.
//!
//! Every script (connector, tool, agent) runs in a fresh [`Vm`] with a curated standard library,
//! the host APIs of [`api`], a memory cap, and a wall-clock deadline. The deadline is checked by
//! a global instruction hook (so coroutines are covered too), bounds every blocking host call,
//! and cannot be swallowed: once a VM is killed, the wrapped `pcall`, `xpcall` and
//! `coroutine.resume` re-raise. Loading a script runs under the same VM and limits as running it.

pub mod api;
pub mod convert;
mod error;
mod guard;
pub mod script;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use mlua::{HookTriggers, Lua, LuaOptions, StdLib, Value, VmState};
use serde_json::{Map, Value as Json};

pub(crate) use error::seconds;
pub use error::ScriptError;

use crate::config::{ScriptKind, ScriptSection};

/// How often (in VM instructions) the hook checks the deadline and the cancel flag.
const HOOK_EVERY: u32 = 1000;

/// Resource limits of one script run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub timeout: Duration,
    pub memory_bytes: usize,
    pub max_result_bytes: usize,
}

impl Limits {
    /// The defaults for a kind of script: 64 MiB, 4 MiB of result, 30 s (tools, agents) or
    /// 300 s (connectors).
    pub fn default_for(kind: ScriptKind) -> Self {
        Limits { timeout: kind.default_timeout(), memory_bytes: 64 * 1024 * 1024, max_result_bytes: 4 * 1024 * 1024 }
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

/// Stops a running script from another thread: the caller went away.
#[derive(Clone, Debug, Default)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Why a VM was stopped. Once set it never clears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kill {
    None = 0,
    Timeout = 1,
    Memory = 2,
    Cancelled = 3,
}

/// Shared between the VM, its hook and its host functions.
pub struct RunState {
    pub info: ScriptInfo,
    pub limits: Limits,
    pub deadline: Instant,
    pub cancel: CancelHandle,
    /// Where `progress(...)` reports, when the caller asked for progress.
    pub progress: OnceLock<ProgressSink>,
    killed: AtomicU8,
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

impl RunState {
    pub fn kill(&self, why: Kill) {
        let _ = self.killed.compare_exchange(0, why as u8, Ordering::SeqCst, Ordering::SeqCst);
    }

    pub fn killed(&self) -> Kill {
        match self.killed.load(Ordering::SeqCst) {
            1 => Kill::Timeout,
            2 => Kill::Memory,
            3 => Kill::Cancelled,
            _ => Kill::None,
        }
    }

    /// Time left before the deadline (zero once past it).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Marks the VM killed if the deadline passed or the caller cancelled; errors if killed.
    pub fn check(&self) -> mlua::Result<()> {
        if self.killed() == Kill::None {
            if self.cancel.is_cancelled() {
                self.kill(Kill::Cancelled);
            } else if Instant::now() >= self.deadline {
                self.kill(Kill::Timeout);
            }
        }
        match self.killed() {
            Kill::None => Ok(()),
            why => Err(mlua::Error::RuntimeError(format!("ctx: script stopped ({why:?})"))),
        }
    }
}

/// A sandboxed Lua state with host APIs and limits installed, ready to load one script.
pub struct Vm {
    lua: Lua,
    state: Arc<RunState>,
}

impl Vm {
    /// Builds a fresh VM. The deadline starts now and covers loading and running the script.
    pub fn new(info: ScriptInfo, limits: Limits, cancel: CancelHandle) -> Result<Vm, ScriptError> {
        let state = Arc::new(RunState {
            info,
            limits,
            deadline: Instant::now() + limits.timeout,
            cancel,
            progress: OnceLock::new(),
            killed: AtomicU8::new(0),
        });
        let lua = build(&state).map_err(|e| ScriptError::Load {
            message: format!("{}: cannot set up the Lua sandbox: {e}", state.info.display_path),
            detail: e.to_string(),
        })?;
        Ok(Vm { lua, state })
    }

    pub fn lua(&self) -> &Lua {
        &self.lua
    }

    pub fn state(&self) -> &Arc<RunState> {
        &self.state
    }

    /// Sends the script's `progress(...)` calls to `sink`.
    pub fn set_progress(&self, sink: ProgressSink) {
        let _ = self.state.progress.set(sink);
    }

    /// Turns an error from running Lua into a [`ScriptError`]: the limit that was hit, or the
    /// sanitised Lua message.
    pub fn classify(&self, err: &mlua::Error) -> ScriptError {
        let what = self.state.info.what();
        match self.state.killed() {
            Kill::Timeout => return ScriptError::Timeout { what, limit: self.state.limits.timeout },
            Kill::Memory => return ScriptError::Memory { what, limit_bytes: self.state.limits.memory_bytes },
            Kill::Cancelled => return ScriptError::Cancelled { what },
            Kill::None => {}
        }
        if is_memory_error(err) {
            self.state.kill(Kill::Memory);
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
        let json = convert::to_json(&self.lua, value, limit).map_err(|e| match e {
            convert::ConvertError::TooLarge { size } => ScriptError::ResultTooLarge { what: what.clone(), size, limit },
            convert::ConvertError::Invalid(message) => ScriptError::BadResult { what: what.clone(), message },
        })?;
        let size = serde_json::to_vec(&json).map(|v| v.len()).unwrap_or(0);
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
    }
}

fn build(state: &Arc<RunState>) -> mlua::Result<Lua> {
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
    let hook_state = Arc::clone(state);
    lua.set_global_hook(HookTriggers::new().every_nth_instruction(HOOK_EVERY), move |_, _| {
        hook_state.check().map(|_| VmState::Continue)
    })?;
    guard::install(&lua, state)?;
    api::register_all(&lua, state)?;
    // The cap counts from here: the sandbox itself is not charged to the script.
    lua.set_memory_limit(lua.used_memory() + state.limits.memory_bytes)?;
    Ok(lua)
}

fn is_memory_error(err: &mlua::Error) -> bool {
    match err {
        mlua::Error::MemoryError(_) => true,
        mlua::Error::CallbackError { cause, .. } => is_memory_error(cause),
        mlua::Error::WithContext { cause, .. } => is_memory_error(cause),
        mlua::Error::RuntimeError(m) => m.contains("not enough memory"),
        _ => false,
    }
}

/// The Lua message without stack traces, Rust error chains or absolute paths.
pub fn sanitize(err: &mlua::Error, info: &ScriptInfo) -> String {
    let raw = innermost(err);
    let first: Vec<&str> = raw.lines().take_while(|l| !l.trim_start().starts_with("stack traceback:")).collect();
    let mut message = first.join(" ").trim().to_string();
    for prefix in ["runtime error: ", "syntax error: ", "callback error: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            message = rest.to_string();
        }
    }
    let dir = info.dir().display().to_string();
    if !dir.is_empty() && dir != "/" {
        message = message.replace(&format!("{dir}/"), "").replace(&dir, ".");
    }
    if message.is_empty() {
        format!("{}: the script raised an error without a message", info.display_path)
    } else {
        message
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
