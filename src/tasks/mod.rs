//! Tasks: calls that run on after their request was answered. The caller gets a handle at
//! once and polls it, streams it or comes back later (REST `Prefer: respond-async`, MCP tasks
//! in both eras). This module keeps the bookkeeping: the tasks of this process while they run
//! ([`Live`]), every task in the store ([`store`]) for `[tasks] ttl_secs`, each scoped to the
//! caller that started it, and the per-caller cap. Running a task's call is the call
//! pipeline's (`tools::task_run`); rendering its outcome is each door's ([`Render`]).
//!
//! On the shared database (`[db] url`) replicas share the tasks: any of them reads a task and
//! asks to cancel it, caps count every replica's tasks, and a task is failed as lost only once
//! its run stopped saying it is alive (a heartbeat every [`HEARTBEAT_EVERY`], a lease of
//! [`LEASE`]); the run's own replica stops what was cancelled or failed elsewhere.

pub mod store;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

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

/// How often a run says it is alive in the shared database, and sweeps for lost runs.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// How long a run may go without a heartbeat before its open tasks are failed as lost: several
/// beats, so a slow database or a pause of the process does not fail a live run's tasks (and
/// the replicas' clocks may differ by a good part of it).
pub const LEASE: Duration = Duration::from_secs(30);

/// Why a task whose run was lost failed.
const LOST: &str = "ctx stopped while this task ran, and its run was lost; call the tool again";
/// The same, found by another replica.
const LOST_REPLICA: &str =
    "the replica running this task stopped (no heartbeat in the shared database), and its run was lost; call the tool again";

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
    /// Shared with the heartbeat thread (weakly: it ends with the application).
    installed: Arc<Mutex<Option<Installed>>>,
    live: Arc<Mutex<HashMap<String, Arc<Live>>>>,
    /// This process run's id: a task of another run that never ended was lost.
    run: String,
    /// Whether the heartbeat thread runs (started by the first install on the shared database).
    beating: Arc<AtomicBool>,
}

#[derive(Clone)]
struct Installed {
    store: Arc<Store>,
    settings: Settings,
    render: Arc<dyn Render>,
    /// The name of this replica in the shared database (empty for a file).
    replica: Arc<str>,
}

impl Default for Tasks {
    fn default() -> Tasks {
        Tasks { installed: Default::default(), live: Default::default(), run: new_id(), beating: Default::default() }
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
    /// Opens the store of `config` (a server's), in the shared database when there is one,
    /// fails the tasks an earlier run left open and drops the expired ones. Called again on
    /// reload with the new settings.
    ///
    /// On the shared database only the tasks of runs whose heartbeat stopped fail (other
    /// replicas' live runs keep theirs), and this run starts beating.
    pub fn install(
        &self,
        config: &Config,
        render: Arc<dyn Render>,
        shared: Option<&crate::db::Shared>,
    ) -> Result<(), String> {
        let path = store_path(config);
        let settings = Settings::of(config);
        let mut installed = self.installed.lock().unwrap_or_else(|p| p.into_inner());
        let (store, replica) = match (installed.take(), shared) {
            (Some(old), Some(_)) if old.store.is_shared() => (old.store, old.replica),
            (Some(old), None) if old.store.path() == Some(path.as_path()) => (old.store, old.replica),
            (_, Some(shared)) => (Arc::new(Store::shared(shared.pg.clone())), Arc::clone(&shared.replica)),
            (_, None) => (Arc::new(Store::new(path)), Arc::from("")),
        };
        let now = now_ms();
        let result = match store.is_shared() {
            // Not swept here: replicas that lost the database a moment ago may not have beaten
            // again yet. The heartbeat loop sweeps once this run has been healthy a lease long.
            true => store.beat(&self.run, &replica, now).and_then(|()| store.purge(now).map(|_| ())),
            false => store.fail_lost(&self.run, LOST, now).and_then(|_| store.purge(now).map(|_| ())),
        };
        let beat = store.is_shared();
        *installed = Some(Installed { store, settings, render, replica });
        drop(installed);
        if beat && !self.beating.swap(true, std::sync::atomic::Ordering::AcqRel) {
            self.start_heartbeat();
        }
        result
    }

    /// After a reload: the new config's settings (and store, if it moved), for a server that
    /// keeps tasks.
    pub fn reconfigure(&self, config: &Config, shared: Option<&crate::db::Shared>) -> Result<(), String> {
        let render = self.installed.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|i| Arc::clone(&i.render));
        match render {
            Some(render) => self.install(config, render, shared),
            None => Ok(()),
        }
    }

    /// Starts the thread that keeps this run alive in the shared database: a heartbeat and a
    /// sweep for lost runs every [`HEARTBEAT_EVERY`], and, at the tasks' poll interval while
    /// this run has tasks, a look for the ones to stop (cancelled through another replica, or
    /// failed as lost by one). It ends with the application.
    fn start_heartbeat(&self) {
        let (installed, live, run) = (Arc::downgrade(&self.installed), Arc::downgrade(&self.live), self.run.clone());
        let beating = Arc::clone(&self.beating);
        let started = std::thread::Builder::new().name("ctx-task-runs".into()).spawn(move || {
            heartbeat(installed, live, &run);
            beating.store(false, std::sync::atomic::Ordering::Release);
        });
        if let Err(e) = started {
            self.beating.store(false, std::sync::atomic::Ordering::Release);
            tracing::error!(
                "the tasks' heartbeat thread did not start: {e}; other replicas will fail this one's tasks as lost"
            );
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
        let Installed { store, settings, replica, .. } =
            self.installed().map_err(|e| CallError::Unavailable(e.to_string()))?;
        if store.is_shared() {
            return self.create_shared(&store, settings, &replica, owner, tool, via, cancel);
        }
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
        let row = self.new_row(owner, tool, via, &settings, "", now);
        store.insert(&row).map_err(|e| CallError::Unavailable(format!("the task store failed: {e}")))?;
        let task = Live::of(row, cancel);
        live.insert(task.id.clone(), Arc::clone(&task));
        Ok(task)
    }

    /// A task that starts now, run by this process (of `replica`, empty in a file).
    fn new_row(&self, owner: &str, tool: &str, via: &str, settings: &Settings, replica: &str, now: i64) -> Row {
        Row {
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
            replica: replica.to_string(),
        }
    }

    /// [`Tasks::create`] on the shared database: the owner's running tasks are counted there,
    /// on every replica, in the transaction that records the new one.
    #[allow(clippy::too_many_arguments)]
    fn create_shared(
        &self,
        store: &Store,
        settings: Settings,
        replica: &str,
        owner: &str,
        tool: &str,
        via: &str,
        cancel: CancelHandle,
    ) -> Result<Arc<Live>, CallError> {
        let now = now_ms();
        let row = self.new_row(owner, tool, via, &settings, replica, now);
        let keep = settings.max_kept_per_caller.saturating_sub(1);
        match store.insert_capped(&row, settings.max_running_per_caller, keep, now) {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                return Err(CallError::TooManyTasks {
                    limit: settings.max_running_per_caller,
                    retry_after: settings.poll_interval,
                })
            }
            Err(e) => return Err(CallError::Unavailable(format!("the task store failed: {e}"))),
        }
        let task = Live::of(row, cancel);
        self.live.lock().unwrap_or_else(|p| p.into_inner()).insert(task.id.clone(), Arc::clone(&task));
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
        let Installed { store, settings, render, .. } = self.installed()?;
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
    ///
    /// On the shared database a task that another replica runs is cancelled there: the cancel
    /// is written in its row, that replica's run sees it within the poll interval, and this
    /// waits (up to the same [`CANCEL_WAIT`]) for the row to show the end.
    pub async fn cancel(&self, owner: &str, id: &str) -> Result<(), TaskError> {
        if !self.is_live(id) {
            let Installed { store, .. } = self.installed()?;
            if store.is_shared() && self.ask_cancel_elsewhere(&store, owner, id).await? {
                let stopping = Instant::now();
                while stopping.elapsed() < CANCEL_WAIT {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let (store, id) = (Arc::clone(&store), id.to_string());
                    let row = tokio::task::spawn_blocking(move || store.get(&id, now_ms()))
                        .await
                        .map_err(|e| TaskError::Store(e.to_string()))?
                        .map_err(TaskError::Store)?;
                    if row.is_none_or(|row| is_terminal(&row.status)) {
                        break;
                    }
                }
                return Ok(());
            }
        }
        self.ask_cancel(owner, id)?;
        let stopping = Instant::now();
        while self.is_live(id) && stopping.elapsed() < CANCEL_WAIT {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Writes a cancel in the row of `owner`'s open task `id`, which this process does not run:
    /// `false` when there is no such task open (the caller then says why, as for a file).
    async fn ask_cancel_elsewhere(&self, store: &Arc<Store>, owner: &str, id: &str) -> Result<bool, TaskError> {
        let (store, owner, id) = (Arc::clone(store), owner.to_string(), id.to_string());
        tokio::task::spawn_blocking(move || store.request_cancel(&owner, &id, now_ms()))
            .await
            .map_err(|e| TaskError::Store(e.to_string()))?
            .map_err(TaskError::Store)
    }

    fn ask_cancel(&self, owner: &str, id: &str) -> Result<(), TaskError> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned();
        match live {
            Some(task) if task.owner == owner => {
                task.stop();
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

impl Live {
    fn of(row: Row, cancel: CancelHandle) -> Arc<Live> {
        Arc::new(Live {
            id: row.id.clone(),
            owner: row.owner.clone(),
            tool: row.tool.clone(),
            cancel,
            row: Mutex::new(row),
            cancel_asked: Default::default(),
            pending: Mutex::new(None),
            last_write: Mutex::new(Instant::now()),
            writing: Mutex::new(()),
            changed: tokio::sync::watch::channel(0).0,
        })
    }

    /// Cancels the run: it ends `cancelled`, whatever it returns.
    fn stop(&self) {
        self.cancel_asked.store(true, std::sync::atomic::Ordering::Release);
        self.cancel.cancel();
        self.changed.send_modify(|n| *n += 1);
    }
}

/// The heartbeat thread's loop (see [`Tasks::start_heartbeat`]); returns once the application
/// is gone or no longer keeps its tasks in the shared database.
fn heartbeat(installed: Weak<Mutex<Option<Installed>>>, live: Weak<Mutex<HashMap<String, Arc<Live>>>>, run: &str) {
    let mut last_beat: Option<Instant> = None;
    // Since when every beat of this run succeeded: it sweeps others' runs only after a lease of
    // that, so that after an outage the others have had the time to beat again too.
    let mut healthy_since: Option<Instant> = None;
    loop {
        let Some(Installed { store, settings, replica, .. }) =
            installed.upgrade().and_then(|i| i.lock().unwrap_or_else(|p| p.into_inner()).clone())
        else {
            return;
        };
        if !store.is_shared() {
            return;
        }
        if last_beat.is_none_or(|t| t.elapsed() >= HEARTBEAT_EVERY) {
            let now = now_ms();
            let beat = store.beat(run, &replica, now).and_then(|()| {
                let healthy = *healthy_since.get_or_insert_with(Instant::now);
                match healthy.elapsed() >= LEASE {
                    true => store.fail_stale(LOST_REPLICA, now, LEASE),
                    false => Ok(0),
                }
            });
            if beat.is_err() {
                healthy_since = None;
            }
            match beat {
                Ok(0) => {}
                Ok(n) => tracing::warn!("{n} tasks of replicas that stopped failed as lost"),
                Err(e) => tracing::warn!("the tasks' heartbeat failed: {e}"),
            }
            last_beat = Some(Instant::now());
        }
        let Some(live) = live.upgrade() else { return };
        let running: Vec<Arc<Live>> = live.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        drop(live);
        if !running.is_empty() {
            let ids = running.iter().map(|t| t.id.clone()).collect();
            match store.to_stop(run, ids) {
                Ok(stop) => {
                    let asked = |t: &&Arc<Live>| t.cancel_asked.load(std::sync::atomic::Ordering::Acquire);
                    for task in running.iter().filter(|t| stop.contains(&t.id) && !asked(t)) {
                        tracing::info!(task = %task.id, "cancelled through another replica (or failed as lost there)");
                        task.stop();
                    }
                }
                Err(e) => tracing::warn!("cannot read the tasks' cancels: {e}"),
            }
        }
        drop((store, running));
        std::thread::sleep(settings.poll_interval.min(HEARTBEAT_EVERY));
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// The outcome's bodies do not matter here, only its status.
    struct Plain;

    impl Render for Plain {
        fn render(&self, _tool: &str, result: &Result<Output, CallError>) -> Outcome {
            let rest_status = if result.is_ok() { 200 } else { 500 };
            Outcome { rest_status, rest_body: Json::Null, mcp: Json::Null, mcp_error: result.is_err() }
        }
    }

    fn config(dir: &Path) -> Config {
        let text = format!(
            "[db]\npath = \"{}\"\n\n[tasks]\npoll_interval_ms = 100\nmax_running_per_caller = 2\n",
            dir.join("kb.sqlite").display()
        );
        Config::from_text(&text, Path::new("ctx.toml"), &dir.join("ctx.toml"), &|_| None).unwrap()
    }

    /// A replica's tasks on the test's database.
    fn replica(db: &crate::db::testing::TestDb, name: &str, dir: &Path) -> Tasks {
        let tasks = Tasks::default();
        let shared = crate::db::Shared { pg: db.pg(), replica: Arc::from(name) };
        tasks.install(&config(dir), Arc::new(Plain), Some(&shared)).unwrap();
        tasks
    }

    #[test]
    fn a_task_started_through_one_replica_is_read_and_cancelled_through_another() {
        let Some(db) = crate::db::testing::database() else { return };
        store::migrated(&db);
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (replica(&db, "host-a:7391", dir.path()), replica(&db, "host-b:7391", dir.path()));
        let cancel = CancelHandle::new();
        let task = a.create("alice", "deploy", "rest", cancel.clone()).unwrap();
        // The row is the truth: B reads A's task, and only its owner does.
        assert_eq!(b.get("alice", &task.id).unwrap().task.status, TaskStatus::Working);
        assert!(matches!(b.get("bob", &task.id), Err(TaskError::NotFound(_))));
        let listed: Vec<String> = b.list("alice").unwrap().into_iter().map(|s| s.task.id).collect();
        assert_eq!(listed, [task.id.as_str()]);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        std::thread::scope(|s| {
            // A's run: it stops once cancelled, as a Lua run does at its next instruction.
            s.spawn(|| {
                let started = Instant::now();
                while !cancel.is_cancelled() && started.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                a.finish(&task, Err(CallError::cancelled("deploy")));
            });
            let asked = Instant::now();
            runtime.block_on(b.cancel("alice", &task.id)).unwrap();
            assert!(asked.elapsed() < CANCEL_WAIT, "B's cancel returned once A's run stopped");
        });
        assert!(cancel.is_cancelled(), "A's run was cancelled");
        let seen = b.get("alice", &task.id).unwrap();
        assert_eq!(seen.task.status, TaskStatus::Cancelled);
        assert!(seen.outcome.is_some());
        // Cancelling it again says it ended, through either replica.
        assert!(matches!(runtime.block_on(b.cancel("alice", &task.id)), Err(TaskError::Ended { .. })));
        assert!(matches!(runtime.block_on(a.cancel("alice", &task.id)), Err(TaskError::Ended { .. })));
    }

    #[test]
    fn the_cap_on_running_tasks_counts_both_replicas() {
        let Some(db) = crate::db::testing::database() else { return };
        store::migrated(&db);
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (replica(&db, "host-a:7391", dir.path()), replica(&db, "host-b:7391", dir.path()));
        let first = a.create("alice", "deploy", "rest", CancelHandle::new()).unwrap();
        b.create("alice", "deploy", "rest", CancelHandle::new()).unwrap();
        assert!(matches!(
            a.create("alice", "deploy", "mcp", CancelHandle::new()),
            Err(CallError::TooManyTasks { limit: 2, .. })
        ));
        b.create("bob", "deploy", "rest", CancelHandle::new()).expect("another caller has a cap of its own");
        // One ends on A: a place frees on B.
        a.finish(&first, Ok(Output::Value(Json::Null)));
        b.create("alice", "deploy", "rest", CancelHandle::new()).unwrap();
    }
}
