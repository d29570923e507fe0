//! Tasks: calls that run on after their request was answered. The caller gets a handle at
//! once and polls it, streams it or comes back later (REST `Prefer: respond-async`, MCP tasks
//! in both eras). This module keeps the bookkeeping: the tasks of this process while they run
//! ([`Live`]), every task in the store ([`store`]) for `[tasks] ttl_secs`, each scoped to the
//! caller that started it, and the per-caller cap. Running a task's call is the call
//! pipeline's (`tools::task_run`); rendering its outcome is each door's ([`Render`]).

pub mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::config::Config;
use crate::contract::{CallError, CancelHandle, Output, Progress};
use crate::types::{Task, TaskProgress, TaskStatus};
pub use store::{Row, Store};

/// Tasks a caller may list at once.
const LIST_LIMIT: usize = 100;

/// How long a cancel waits for the run to stop (a Lua run stops at its next instruction, an
/// upstream call when dropped): past it, the answer shows the task still working.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// How often a running task's progress is written to the store at most: readers of this
/// process see every report at once, from memory.
const PROGRESS_WRITE_EVERY: Duration = Duration::from_secs(1);

/// What a task's run became, in every door's form, as the store keeps it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Outcome {
    /// REST: the status and body `POST /tools/{name}` would have answered.
    pub rest_status: u16,
    pub rest_body: Json,
    /// MCP: the `CallToolResult`, or the JSON-RPC error object when `mcp_error`.
    pub mcp: Json,
    pub mcp_error: bool,
}

/// Renders a finished call for every door (built by the layer that knows them all).
pub trait Render: Send + Sync {
    fn render(&self, tool: &str, result: &Result<Output, CallError>) -> Outcome;
}

/// The `[tasks]` settings in effect.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub ttl: Duration,
    pub max_running_per_caller: usize,
    pub max_result_bytes: usize,
    pub max_kept_per_caller: usize,
    pub poll_interval: Duration,
}

impl Settings {
    pub fn of(config: &Config) -> Settings {
        let spec = &config.spec.tasks;
        Settings {
            // The schema bounds every value (ttl_secs >= 60, the rest >= 1).
            ttl: Duration::from_secs(spec.ttl_secs.max(60) as u64),
            max_running_per_caller: spec.max_running_per_caller.max(1) as usize,
            max_result_bytes: spec.max_result_bytes.max(1024) as usize,
            max_kept_per_caller: spec.max_kept_per_caller.max(1) as usize,
            poll_interval: Duration::from_millis(spec.poll_interval_ms.max(100) as u64),
        }
    }
}

/// Where the tasks of `config` are kept.
pub fn store_path(config: &Config) -> std::path::PathBuf {
    config.db_path().with_file_name("tasks.sqlite")
}

/// The tasks of one application (see `tools::CallState`).
pub struct Tasks {
    installed: Mutex<Option<Installed>>,
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// This process run's id: a task of another run that never ended was lost.
    run: String,
}

#[derive(Clone)]
struct Installed {
    store: Arc<Store>,
    settings: Settings,
    render: Arc<dyn Render>,
}

impl Default for Tasks {
    fn default() -> Tasks {
        Tasks { installed: Mutex::new(None), live: Default::default(), run: new_id() }
    }
}

/// A task of this process while it runs.
pub struct Live {
    pub id: String,
    pub owner: String,
    pub tool: String,
    /// Stops the call (a Lua run stops at its next instruction).
    pub cancel: CancelHandle,
    row: Mutex<Row>,
    /// Set by a cancel: the run's end reads `cancelled`, whatever it returned.
    cancel_asked: std::sync::atomic::AtomicBool,
    last_write: Mutex<std::time::Instant>,
    /// Held while its row is written: one write at a time per task.
    writing: Mutex<()>,
    /// The approval its call waits on, while it waits: an MCP client answering the task's
    /// question (`tasks/update`) decides it with its token.
    pending: Mutex<Option<crate::contract::approval::Pending>>,
    /// Bumped at every change; the last value is the task's end.
    changed: tokio::sync::watch::Sender<u64>,
}

/// A task as one caller sees it: its wire form and, once it ended, its outcome.
#[derive(Clone, Debug)]
pub struct Seen {
    pub task: Task,
    pub outcome: Option<Outcome>,
    /// The status as MCP reads it: a call that ended with an error result of the tool's own
    /// `completed`, where REST says `failed`.
    pub mcp_status: TaskStatus,
}

/// Why a task operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("tasks need a running server (ctx serve): they are kept beside its knowledge base")]
    NotInstalled,
    #[error("no task {0:?} (it may have expired: [tasks] ttl_secs; only the caller that started a task sees it)")]
    NotFound(String),
    #[error("task {id:?} already ended ({status}); there is nothing to cancel")]
    Ended { id: String, status: String },
    #[error("the task store failed: {0}")]
    Store(String),
}

fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn status_of(text: &str) -> TaskStatus {
    match text {
        "working" => TaskStatus::Working,
        "input_required" => TaskStatus::InputRequired,
        "completed" => TaskStatus::Completed,
        "cancelled" => TaskStatus::Cancelled,
        _ => TaskStatus::Failed,
    }
}

/// The status as MCP reads it (see [`Seen::mcp_status`]); a run that was lost failed.
fn mcp_status_of(row: &Row) -> TaskStatus {
    status_of(row.mcp_status.as_deref().unwrap_or(&row.status))
}

/// The longest progress message a task keeps.
const MAX_MESSAGE_CHARS: usize = 1024;

/// A progress message as a task keeps it: control characters (newlines, escapes) as spaces,
/// at most [`MAX_MESSAGE_CHARS`].
fn one_line(text: &str) -> String {
    let clean: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).take(MAX_MESSAGE_CHARS).collect();
    clean.trim().to_string()
}

/// Whether a stored status is an end.
pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled")
}

fn wire(row: &Row, poll: Duration) -> Task {
    let at = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default();
    let progress = row.progress.as_deref().and_then(|p| serde_json::from_str::<TaskProgress>(p).ok());
    Task {
        id: row.id.clone(),
        tool: row.tool.clone(),
        status: status_of(&row.status),
        status_message: row.message.clone(),
        progress,
        approval_id: row.approval.clone(),
        created_at: at(row.created_ms),
        updated_at: at(row.updated_ms),
        expires_at: at(row.expires_ms),
        poll_interval_ms: poll.as_millis() as u64,
    }
}

impl Tasks {
    /// Opens the store of `config` (a server's), fails the tasks an earlier run left open and
    /// drops the expired ones. Called again on reload with the new settings.
    pub fn install(&self, config: &Config, render: Arc<dyn Render>) -> Result<(), String> {
        let path = store_path(config);
        let settings = Settings::of(config);
        let mut installed = self.installed.lock().unwrap_or_else(|p| p.into_inner());
        let store = match installed.take() {
            Some(old) if old.store.path() == path => old.store,
            _ => Arc::new(Store::new(path)),
        };
        let now = now_ms();
        let result = store
            .fail_lost(&self.run, "ctx stopped while this task ran, and its run was lost; call the tool again", now)
            .and_then(|_| store.purge(now).map(|_| ()));
        *installed = Some(Installed { store, settings, render });
        result
    }

    /// After a reload: the new config's settings (and store, if it moved), for a server that
    /// keeps tasks.
    pub fn reconfigure(&self, config: &Config) -> Result<(), String> {
        let render = self.installed.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|i| Arc::clone(&i.render));
        match render {
            Some(render) => self.install(config, render),
            None => Ok(()),
        }
    }

    fn installed(&self) -> Result<Installed, TaskError> {
        self.installed.lock().unwrap_or_else(|p| p.into_inner()).clone().ok_or(TaskError::NotInstalled)
    }

    /// Whether this application keeps tasks (a server does; the CLI does not).
    pub fn available(&self) -> bool {
        self.installed().is_ok()
    }

    /// The settings in effect, when installed.
    pub fn settings(&self) -> Option<Settings> {
        self.installed().ok().map(|i| i.settings)
    }

    /// Records a new working task of `tool` for `owner` (a scoped token's name, or empty),
    /// refusing one past the owner's cap. `cancel` is the handle of the call it runs.
    pub fn create(&self, owner: &str, tool: &str, via: &str, cancel: CancelHandle) -> Result<Arc<Live>, CallError> {
        let Installed { store, settings, .. } = self.installed().map_err(|e| CallError::Unavailable(e.to_string()))?;
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let running = live.values().filter(|t| t.owner == owner).count();
        if running >= settings.max_running_per_caller {
            return Err(CallError::TooManyTasks {
                limit: settings.max_running_per_caller,
                retry_after: settings.poll_interval,
            });
        }
        let now = now_ms();
        // Expired tasks go as new ones come, and the owner's oldest ended ones past its share:
        // the file holds at most a TTL's worth, and one caller cannot fill it.
        let _ = store.purge(now);
        let _ = store.keep(owner, settings.max_kept_per_caller.saturating_sub(1));
        let row = Row {
            id: new_id(),
            owner: owner.to_string(),
            tool: tool.to_string(),
            via: via.to_string(),
            status: "working".into(),
            message: None,
            progress: None,
            approval: None,
            outcome: None,
            mcp_status: None,
            created_ms: now,
            updated_ms: now,
            expires_ms: now + settings.ttl.as_millis() as i64,
            run: self.run.clone(),
        };
        store.insert(&row).map_err(|e| CallError::Unavailable(format!("the task store failed: {e}")))?;
        let task = Arc::new(Live {
            id: row.id.clone(),
            owner: owner.to_string(),
            tool: tool.to_string(),
            cancel,
            row: Mutex::new(row),
            cancel_asked: Default::default(),
            pending: Mutex::new(None),
            last_write: Mutex::new(std::time::Instant::now()),
            writing: Mutex::new(()),
            changed: tokio::sync::watch::channel(0).0,
        });
        live.insert(task.id.clone(), Arc::clone(&task));
        Ok(task)
    }

    /// The wire form of a live task now.
    pub fn wire_of(&self, task: &Live) -> Task {
        let poll = self.settings().map(|s| s.poll_interval).unwrap_or(Duration::from_secs(1));
        wire(&task.row.lock().unwrap_or_else(|p| p.into_inner()), poll)
    }

    /// Tells the task's watchers, and (`write`) writes its row to the store: on a blocking
    /// thread when called on the runtime (the store is one SQLite connection), and always the
    /// row as it is when the write runs, so writes that land out of order still leave the last.
    fn changed(&self, task: &Arc<Live>, write: bool) {
        if write {
            *task.last_write.lock().unwrap_or_else(|p| p.into_inner()) = std::time::Instant::now();
            if let Ok(Installed { store, .. }) = self.installed() {
                let task = Arc::clone(task);
                let write = move || {
                    let _one = task.writing.lock().unwrap_or_else(|p| p.into_inner());
                    let row = task.row.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    if let Err(e) = store.update(&row) {
                        tracing::warn!(task = %task.id, "cannot write the task's status: {e}");
                    }
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => drop(runtime.spawn_blocking(write)),
                    Err(_) => write(),
                }
            }
        }
        task.changed.send_modify(|n| *n += 1);
    }

    /// A progress report of the task's call.
    pub fn progress(&self, task: &Arc<Live>, progress: &Progress) {
        {
            let mut row = task.row.lock().unwrap_or_else(|p| p.into_inner());
            // Every status answer and notice carries it: one plain line, capped.
            let message = progress.message.as_deref().map(one_line);
            let report = TaskProgress { done: progress.done, total: progress.total, message: message.clone() };
            row.progress = serde_json::to_string(&report).ok();
            if let Some(message) = message {
                row.message = Some(message);
            }
            row.updated_ms = now_ms();
        }
        let due = task.last_write.lock().unwrap_or_else(|p| p.into_inner()).elapsed() >= PROGRESS_WRITE_EVERY;
        self.changed(task, due);
    }

    /// The task's call waits for a person to decide `pending` (`None`: it goes on).
    pub fn waiting(&self, task: &Arc<Live>, pending: Option<&crate::contract::approval::Pending>, message: String) {
        *task.pending.lock().unwrap_or_else(|p| p.into_inner()) = pending.cloned();
        let approval = pending.map(|p| (p.approval.id.as_str(), message));
        {
            let mut row = task.row.lock().unwrap_or_else(|p| p.into_inner());
            match approval {
                Some((id, message)) => {
                    row.status = "input_required".into();
                    row.approval = Some(id.to_string());
                    row.message = Some(message);
                }
                None => {
                    row.status = "working".into();
                    row.approval = None;
                    row.message = Some("approved; running".into());
                }
            }
            row.updated_ms = now_ms();
        }
        self.changed(task, true);
    }

    /// The task's call ended with `result`: its outcome is rendered for every door, kept (a
    /// result over `[tasks] max_result_bytes` fails the task instead), and the task leaves
    /// this process's list.
    pub fn finish(&self, task: &Arc<Live>, result: Result<Output, CallError>) {
        let cancelled = task.cancel_asked.load(std::sync::atomic::Ordering::Acquire);
        let (status, message, outcome) = match self.installed() {
            Ok(Installed { settings, render, .. }) => {
                let result = match (cancelled, result) {
                    (true, _) => Err(CallError::cancelled(&task.tool)),
                    (false, result) => result,
                };
                let mut outcome = render.render(&task.tool, &result);
                let mut text = serde_json::to_string(&outcome).unwrap_or_default();
                let mut failed = result.is_err();
                let mut message = result.as_ref().err().map(CallError::log_text);
                if text.len() > settings.max_result_bytes {
                    let too_large = CallError::ResultTooLarge(format!(
                        "the task's result is {} bytes, over [tasks] max_result_bytes ({}); ask the tool for less, or raise the limit",
                        text.len(),
                        settings.max_result_bytes
                    ));
                    message = Some(too_large.to_string());
                    outcome = render.render(&task.tool, &Err(too_large));
                    text = serde_json::to_string(&outcome).unwrap_or_default();
                    failed = true;
                }
                let status = match (cancelled, failed) {
                    (true, _) => "cancelled",
                    (false, true) => "failed",
                    (false, false) => "completed",
                };
                // MCP's reading: an error result of the tool's own completed the call.
                let mcp = match (status, outcome.mcp_error) {
                    ("failed", false) => "completed",
                    (status, _) => status,
                };
                (status, message, Some((text, mcp, settings.ttl)))
            }
            Err(e) => ("failed", Some(e.to_string()), None),
        };
        {
            let mut row = task.row.lock().unwrap_or_else(|p| p.into_inner());
            row.status = status.into();
            row.message = message.or(row.message.take().filter(|_| status == "completed"));
            row.approval = None;
            row.updated_ms = now_ms();
            if let Some((text, mcp, ttl)) = outcome {
                row.outcome = Some(text);
                row.mcp_status = Some(mcp.to_string());
                // A run longer than the TTL still leaves its result to be read.
                row.expires_ms = row.expires_ms.max(row.updated_ms + ttl.as_millis() as i64);
            }
        }
        // Written before the task leaves the list of live ones: a reader that no longer finds
        // it live finds its end in the store.
        if let Ok(Installed { store, .. }) = self.installed() {
            let _one = task.writing.lock().unwrap_or_else(|p| p.into_inner());
            let row = task.row.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Err(e) = store.update(&row) {
                tracing::warn!(task = %task.id, "cannot write the task's end: {e}");
            }
        }
        task.changed.send_modify(|n| *n += 1);
        self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(&task.id);
    }

    /// Task `id` as `owner` sees it: another caller's task is not found, exactly like one that
    /// does not exist.
    pub fn get(&self, owner: &str, id: &str) -> Result<Seen, TaskError> {
        let Installed { store, settings, render } = self.installed()?;
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned();
        let row = match live {
            Some(task) => task.row.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            None => store.get(id, now_ms()).map_err(TaskError::Store)?.ok_or_else(|| TaskError::NotFound(id.into()))?,
        };
        if row.owner != owner {
            return Err(TaskError::NotFound(id.into()));
        }
        let mut outcome = row.outcome.as_deref().and_then(|o| serde_json::from_str(o).ok());
        // A task whose run was lost ended without an outcome: its result is why, and for MCP a
        // JSON-RPC error (the call did not complete, with or without an error of the tool's).
        if outcome.is_none() && is_terminal(&row.status) {
            let why = row.message.clone().unwrap_or_else(|| "the task's run was lost".into());
            let mut lost = render.render(&row.tool, &Err(CallError::Unavailable(why.clone())));
            lost.mcp = serde_json::json!({ "code": -32603, "message": why });
            lost.mcp_error = true;
            outcome = Some(lost);
        }
        let mcp_status = mcp_status_of(&row);
        Ok(Seen { task: wire(&row, settings.poll_interval), outcome, mcp_status })
    }

    /// `owner`'s tasks, newest first.
    /// `owner`'s tasks, newest first, without their outcomes.
    pub fn list(&self, owner: &str) -> Result<Vec<Seen>, TaskError> {
        let Installed { store, settings, .. } = self.installed()?;
        let rows = store.list(owner, now_ms(), LIST_LIMIT).map_err(TaskError::Store)?;
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        Ok(rows
            .into_iter()
            .map(|row| {
                let row = match live.get(&row.id) {
                    Some(task) => task.row.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                    None => row,
                };
                Seen { task: wire(&row, settings.poll_interval), outcome: None, mcp_status: mcp_status_of(&row) }
            })
            .collect())
    }

    /// Waits until task `id` changes (or ended already); `None` once it has ended.
    pub fn watch(&self, owner: &str, id: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.get(id).filter(|t| t.owner == owner).map(|t| t.changed.subscribe())
    }

    /// Asks `owner`'s running task `id` to stop (its run is cancelled and it ends
    /// `cancelled`), and waits up to [`CANCEL_WAIT`] for the run to stop, so that what the
    /// caller reads next shows it.
    pub async fn cancel(&self, owner: &str, id: &str) -> Result<(), TaskError> {
        self.ask_cancel(owner, id)?;
        let stopping = std::time::Instant::now();
        while self.is_live(id) && stopping.elapsed() < CANCEL_WAIT {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    fn ask_cancel(&self, owner: &str, id: &str) -> Result<(), TaskError> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned();
        match live {
            Some(task) if task.owner == owner => {
                task.cancel_asked.store(true, std::sync::atomic::Ordering::Release);
                task.cancel.cancel();
                task.changed.send_modify(|n| *n += 1);
                Ok(())
            }
            _ => {
                let seen = self.get(owner, id)?;
                let status = serde_json::to_value(seen.task.status).ok();
                let status = status.as_ref().and_then(Json::as_str).unwrap_or_default().to_string();
                Err(TaskError::Ended { id: id.into(), status })
            }
        }
    }

    /// The approval `owner`'s task `id` waits on, if it waits.
    pub fn pending(&self, owner: &str, id: &str) -> Option<crate::contract::approval::Pending> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()?;
        let pending = live.pending.lock().unwrap_or_else(|p| p.into_inner()).clone();
        pending.filter(|_| live.owner == owner)
    }

    /// Whether task `id` still runs in this process.
    fn is_live(&self, id: &str) -> bool {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id)
    }
}
