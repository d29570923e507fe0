//! MCP tasks, in each era as its specification says. The call runs as a task of the one
//! pipeline (`Tools::start_task`); this module only speaks each era's wire.
//!
//! - 2025-11-25 (sessions, experimental): a `tools/call` with `params.task` answers
//!   `{task}` at once; `tasks/get`, `tasks/result` (waits for the end, then answers the call's
//!   own result), `tasks/list` and `tasks/cancel`. rmcp 3.9 knows only the 2026 extension and
//!   drops `params.task`, so the direct route answers these requests of a session itself
//!   ([`legacy`]), from the raw JSON-RPC message.
//! - 2026-07-28 (the `io.modelcontextprotocol/tasks` extension): the server decides. A client
//!   that declared the extension gets a task handle (`resultType: "task"`) for a tool that
//!   declares `long_running` or needs approval; `tasks/get` answers the task with its result
//!   once done, `tasks/update` takes the answer to the approval question it carries, and
//!   `tasks/cancel` stops it. These come through rmcp's handler ([`Mcp::get_task`] and the
//!   others).
//!
//! A task is its caller's: another token's task is unknown, exactly like one that does not
//! exist.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolResponse, CreateTaskResult, DetailedTask, InputRequest, InputRequests, JsonObject, Task as McpTask,
    TaskPayload, TaskStatus as McpStatus,
};
use rmcp::ErrorData as McpError;
use serde_json::{json, Map, Value as Json};

use super::{approve, principal, Mcp};
use crate::contract::Principal;
use crate::tasks::{Seen, TaskError};
use crate::tools::{CallOptions, Tools};
use crate::types::{Task, TaskStatus};

/// The `_meta` key that ties a message to its task (2025-11-25).
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

fn owner(principal: Option<&Principal>) -> String {
    principal.map(|p| p.name().to_string()).unwrap_or_default()
}

fn status_text(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Working => "working",
        TaskStatus::InputRequired => "input_required",
        TaskStatus::Completed => "completed",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
    }
}

fn iso(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn not_found(e: &TaskError) -> McpError {
    match e {
        TaskError::NotFound(_) | TaskError::Ended { .. } => McpError::invalid_params(e.to_string(), None),
        TaskError::NotInstalled | TaskError::Store(_) => McpError::internal_error(e.to_string(), None),
    }
}

/// Waits until `owner`'s task `id` ends (or `within` passes) and reads it.
async fn settle(tools: &Tools, owner: &str, id: &str, within: Option<Duration>) -> Result<Seen, TaskError> {
    let state = Arc::clone(tools.current().state());
    let started = std::time::Instant::now();
    loop {
        let mut watch = state.tasks.watch(owner, id);
        let seen = read(tools, owner, id).await?;
        if seen.outcome.is_some() || within.is_some_and(|w| started.elapsed() >= w) {
            return Ok(seen);
        }
        match watch.as_mut() {
            Some(w) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), w.changed()).await;
            }
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

async fn read(tools: &Tools, owner: &str, id: &str) -> Result<Seen, TaskError> {
    let state = Arc::clone(tools.current().state());
    let (owner, id) = (owner.to_string(), id.to_string());
    tokio::task::spawn_blocking(move || state.tasks.get(&owner, &id))
        .await
        .unwrap_or_else(|_| Err(TaskError::Store("the task failed".into())))
}

async fn cancel(tools: &Tools, owner: &str, id: &str) -> Result<Seen, TaskError> {
    let state = Arc::clone(tools.current().state());
    state.tasks.cancel(owner, id).await?;
    read(tools, owner, id).await
}

// ---- 2025-11-25 -------------------------------------------------------------------------

/// The task as the 2025-11-25 wire has it.
/// `status` is MCP's reading of it ([`Seen::mcp_status`]).
fn legacy_task(task: &Task, status: TaskStatus) -> Json {
    let mut out = json!({
        "taskId": task.id,
        "status": status_text(status),
        "createdAt": iso(&task.created_at),
        "lastUpdatedAt": iso(&task.updated_at),
        "ttl": (task.expires_at - task.created_at).num_milliseconds(),
        "pollInterval": task.poll_interval_ms,
    });
    if let Some(message) = &task.status_message {
        out["statusMessage"] = Json::String(message.clone());
    }
    out
}

/// A session's request this module answers: `tasks/*`, or a `tools/call` asking for a task.
pub struct Legacy {
    id: Json,
    method: String,
    params: Map<String, Json>,
}

/// Whether `body` is a request of a 2025 session that this module answers (see [`answer`]).
pub fn legacy(body: &[u8]) -> Option<Legacy> {
    // The byte search keeps the parse off the path of every other message.
    let mentions = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
    if !(mentions(b"\"tasks/") || mentions(b"\"task\"") || body.contains(&b'\\')) {
        return None;
    }
    let Json::Object(mut message) = serde_json::from_slice::<Json>(body).ok()? else { return None };
    let id = message.remove("id")?;
    let Json::String(method) = message.remove("method")? else { return None };
    let params = match message.remove("params") {
        Some(Json::Object(params)) => params,
        None => Map::new(),
        Some(_) => return None,
    };
    let ours = match method.as_str() {
        "tools/call" => params.get("task").is_some_and(Json::is_object),
        "tasks/get" | "tasks/result" | "tasks/list" | "tasks/cancel" => true,
        _ => false,
    };
    ours.then_some(Legacy { id, method, params })
}

/// The JSON-RPC response to a session's task request.
pub async fn answer(mcp: &Mcp, session: &str, principal: Option<Arc<Principal>>, request: Legacy) -> Json {
    let tools = &mcp.inner.tools;
    let Legacy { id, method, params } = request;
    let owner = owner(principal.as_deref());
    let task_id = || params.get("taskId").and_then(Json::as_str).map(str::to_string);
    let missing = || McpError::invalid_params(format!("{method} needs params {{\"taskId\": string}}"), None);
    let result: Result<Json, McpError> = match method.as_str() {
        "tools/call" => {
            let started = legacy_call(tools, principal, &params).await;
            if let Some(task) = started.as_ref().ok().and_then(|r| r.pointer("/task/taskId")).and_then(Json::as_str) {
                tell_status(mcp, session, owner.clone(), task.to_string());
            }
            started
        }
        "tasks/get" => match task_id() {
            Some(task) => read(tools, &owner, &task)
                .await
                .map(|seen| legacy_task(&seen.task, seen.mcp_status))
                .map_err(|e| not_found(&e)),
            None => Err(missing()),
        },
        "tasks/result" => match task_id() {
            Some(task) => match settle(tools, &owner, &task, None).await {
                Ok(Seen { outcome: Some(outcome), .. }) if outcome.mcp_error => {
                    Err(serde_json::from_value(outcome.mcp)
                        .unwrap_or_else(|e| McpError::internal_error(e.to_string(), None)))
                }
                Ok(Seen { outcome: Some(outcome), .. }) => Ok(legacy_result(outcome.mcp, &task)),
                Ok(Seen { outcome: None, .. }) => Err(McpError::internal_error("the task has not ended", None)),
                Err(e) => Err(not_found(&e)),
            },
            None => Err(missing()),
        },
        "tasks/list" => {
            let state = Arc::clone(tools.current().state());
            let listed = tokio::task::spawn_blocking(move || state.tasks.list(&owner)).await;
            match listed {
                Ok(Ok(tasks)) => {
                    Ok(json!({ "tasks": tasks.iter().map(|t| legacy_task(&t.task, t.mcp_status)).collect::<Vec<_>>() }))
                }
                Ok(Err(e)) => Err(not_found(&e)),
                Err(e) => Err(McpError::internal_error(e.to_string(), None)),
            }
        }
        "tasks/cancel" => match task_id() {
            Some(task) => match cancel(tools, &owner, &task).await {
                Ok(seen) => Ok(legacy_task(&seen.task, seen.mcp_status)),
                Err(e @ TaskError::Ended { .. }) => {
                    Err(McpError::invalid_params(format!("cannot cancel a task in a terminal status: {e}"), None))
                }
                Err(e) => Err(not_found(&e)),
            },
            None => Err(missing()),
        },
        other => {
            Err(McpError::new(rmcp::model::ErrorCode::METHOD_NOT_FOUND, format!("unknown method {other:?}"), None))
        }
    };
    match result {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err(error) => json!({ "jsonrpc": "2.0", "id": id, "error": error }),
    }
}

async fn legacy_call(
    tools: &Arc<Tools>,
    principal: Option<Arc<Principal>>,
    params: &Map<String, Json>,
) -> Result<Json, McpError> {
    let Some(name) = params.get("name").and_then(Json::as_str) else {
        return Err(McpError::invalid_params(
            "tools/call needs params {\"name\": string, \"arguments\": object (optional)}",
            None,
        ));
    };
    let arguments = match params.get("arguments") {
        None | Some(Json::Null) => Json::Object(Map::new()),
        Some(args @ Json::Object(_)) => args.clone(),
        Some(_) => return Err(McpError::invalid_params("tools/call: arguments must be an object", None)),
    };
    let options = CallOptions { caller: "mcp", principal, ..Default::default() };
    match tools.start_task(name.to_string(), arguments, options).await {
        Ok(task) => {
            let wire = tools.current().state().tasks.wire_of(&task);
            Ok(json!({ "task": legacy_task(&wire, wire.status) }))
        }
        Err(e) => Err(super::convert::protocol_error(&e)),
    }
}

/// Sends `notifications/tasks/status` to session `session` at each change of the task's
/// status, until it ends (2025-11-25 makes them optional; clients that poll lose nothing).
fn tell_status(mcp: &Mcp, session: &str, owner: String, id: String) {
    let Some(peer) = mcp.inner.session_peers.session(session) else { return };
    let tools = Arc::clone(&mcp.inner.tools);
    tokio::spawn(async move {
        let mut told = None;
        loop {
            let watch = tools.current().state().tasks.watch(&owner, &id);
            let Ok(seen) = read(&tools, &owner, &id).await else { return };
            if told != Some(seen.mcp_status) {
                told = Some(seen.mcp_status);
                let params = legacy_task(&seen.task, seen.mcp_status);
                let notice = rmcp::model::CustomNotification::new("notifications/tasks/status", Some(params));
                let send = peer.send_notification(rmcp::model::ServerNotification::CustomNotification(notice));
                // A client that does not read its stream holds up no one.
                if !matches!(tokio::time::timeout(Duration::from_secs(5), send).await, Ok(Ok(()))) {
                    return;
                }
            }
            if seen.outcome.is_some() || crate::tasks::is_terminal(status_text(seen.task.status)) {
                return;
            }
            match watch {
                Some(mut w) => {
                    if w.changed().await.is_err() {
                        continue;
                    }
                }
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
}

/// The call's result, tied to its task.
fn legacy_result(mut result: Json, task: &str) -> Json {
    if let Json::Object(map) = &mut result {
        // The 2026 era's marker; a 2025 client reads a plain CallToolResult.
        map.remove("resultType");
        let meta = map.entry("_meta").or_insert_with(|| json!({}));
        if let Json::Object(meta) = meta {
            meta.insert(RELATED_TASK.to_string(), json!({ "taskId": task }));
        }
    }
    result
}

/// The largest `initialize` answer read to add the 2025 `tasks` capability to it.
const MAX_INITIALIZE_ANSWER: usize = 64 * 1024;

/// A session's `initialize` answer with the 2025-11-25 `tasks` capability, which rmcp's
/// capabilities cannot hold: tasks of `tools/call`, `tasks/list` and `tasks/cancel`. Any other
/// response (a refusal, another era, a body too large or not ending in time) passes unchanged.
pub async fn declare_legacy_tasks(
    response: axum::http::Response<axum::body::Body>,
) -> axum::http::Response<axum::body::Body> {
    use axum::body::Body;
    if !response.headers().contains_key("mcp-session-id") {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let read = tokio::time::timeout(Duration::from_secs(5), axum::body::to_bytes(body, MAX_INITIALIZE_ANSWER)).await;
    let Ok(Ok(bytes)) = read else {
        // The body is gone by now: say so rather than hand on half an answer.
        tracing::warn!("an initialize answer could not be read to declare tasks; the client sees an empty answer");
        parts.headers.remove(axum::http::header::CONTENT_LENGTH);
        return axum::http::Response::from_parts(parts, Body::empty());
    };
    let text = String::from_utf8_lossy(&bytes);
    // A JSON answer is one message; an SSE answer has it on a `data:` line.
    let body = match with_tasks(&text) {
        Some(json) => Body::from(json),
        None => {
            let mut changed = false;
            let lines: Vec<String> = text
                .split('\n')
                .map(|line| match line.strip_prefix("data: ").and_then(with_tasks) {
                    Some(json) => {
                        changed = true;
                        format!("data: {json}")
                    }
                    None => line.to_string(),
                })
                .collect();
            match changed {
                true => Body::from(lines.join("\n")),
                false => Body::from(bytes),
            }
        }
    };
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    axum::http::Response::from_parts(parts, body)
}

/// `message` (an `initialize` answer of the 2025-11-25 era) with the `tasks` capability.
fn with_tasks(message: &str) -> Option<String> {
    let mut message = serde_json::from_str::<Json>(message).ok()?;
    if message.pointer("/result/protocolVersion").and_then(Json::as_str) != Some("2025-11-25") {
        return None;
    }
    let capabilities = message.pointer_mut("/result/capabilities").and_then(Json::as_object_mut)?;
    capabilities.insert("tasks".into(), json!({ "list": {}, "cancel": {}, "requests": { "tools": { "call": {} } } }));
    Some(message.to_string())
}

// ---- 2026-07-28 -------------------------------------------------------------------------

/// The most task ids one `subscriptions/listen` may name, and the longest id kept.
const MAX_LISTENED: usize = 64;
const MAX_ID_BYTES: usize = 128;

/// The tasks a `subscriptions/listen` asks to hear about (`notifications.taskIds`), which the
/// direct route reads from the raw request: rmcp 3.9's filter drops the key.
#[derive(Clone, Debug)]
pub struct ListenedTasks(pub Vec<String>);

/// The `taskIds` of a body that is a `subscriptions/listen` request, if it names any.
pub fn listened_tasks(body: &[u8]) -> Option<ListenedTasks> {
    if !body.windows(9).any(|w| w == b"\"taskIds\"") {
        return None;
    }
    let message: Json = serde_json::from_slice(body).ok()?;
    if message.get("method").and_then(Json::as_str) != Some("subscriptions/listen") {
        return None;
    }
    let ids = message.pointer("/params/notifications/taskIds")?.as_array()?;
    let ids: Vec<String> = ids
        .iter()
        .filter_map(Json::as_str)
        .filter(|id| id.len() <= MAX_ID_BYTES)
        .take(MAX_LISTENED)
        .map(String::from)
        .collect();
    (!ids.is_empty()).then_some(ListenedTasks(ids))
}

fn modern_status(status: TaskStatus) -> McpStatus {
    match status {
        TaskStatus::Working => McpStatus::Working,
        TaskStatus::InputRequired => McpStatus::InputRequired,
        TaskStatus::Completed => McpStatus::Completed,
        TaskStatus::Failed => McpStatus::Failed,
        TaskStatus::Cancelled => McpStatus::Cancelled,
    }
}

fn modern_task(task: &Task, status: TaskStatus) -> McpTask {
    let ttl = (task.expires_at - task.created_at).num_milliseconds().max(0) as u64;
    let mut out = McpTask::new(&task.id, modern_status(status), iso(&task.created_at), iso(&task.updated_at))
        .with_ttl_ms(ttl)
        .with_poll_interval_ms(task.poll_interval_ms);
    if let Some(message) = &task.status_message {
        out = out.with_status_message(message.clone());
    }
    out
}

impl Mcp {
    /// Whether a 2026-era `tools/call` of `name` becomes a task: the client declared the
    /// tasks extension, and the tool declares `long_running` or needs a person's approval.
    pub(super) fn runs_as_task(&self, name: &str, principal: Option<&Principal>, client_has_tasks: bool) -> bool {
        if !client_has_tasks || !self.inner.tools.current().state().tasks.available() {
            return false;
        }
        let registry = self.inner.tools.current();
        let Some(spec) = registry.spec(name) else { return false };
        crate::tools::principal::allows(principal, name) && (spec.long_running || registry.approvals().needs(spec))
    }

    /// Starts the 2026-era task of a `tools/call`.
    pub(super) async fn start_modern(
        &self,
        name: String,
        arguments: Json,
        principal: Option<Arc<Principal>>,
    ) -> Result<CallToolResponse, McpError> {
        let options = CallOptions { caller: "mcp", principal, ..Default::default() };
        match self.inner.tools.start_task(name, arguments, options).await {
            Ok(task) => {
                let wire = self.inner.tools.current().state().tasks.wire_of(&task);
                Ok(CallToolResponse::Task(CreateTaskResult::new(modern_task(&wire, wire.status))))
            }
            Err(e) => Err(super::convert::protocol_error(&e)),
        }
    }

    /// `tasks/get` (2026): the task, with its result once it ended, or the approval question
    /// while it waits.
    pub(super) async fn modern_get(&self, principal: Option<&Principal>, id: &str) -> Result<DetailedTask, McpError> {
        let owner = owner(principal);
        let seen = read(&self.inner.tools, &owner, id).await.map_err(|e| not_found(&e))?;
        let task = modern_task(&seen.task, seen.mcp_status);
        let payload = match (&seen.outcome, seen.task.status) {
            (Some(outcome), _) if outcome.mcp_error => TaskPayload::Failed { error: object(outcome.mcp.clone()) },
            (Some(outcome), TaskStatus::Cancelled) => {
                let _ = outcome;
                TaskPayload::Cancelled
            }
            (Some(outcome), _) => TaskPayload::Completed { result: object(outcome.mcp.clone()) },
            (None, TaskStatus::InputRequired) => {
                TaskPayload::InputRequired { input_requests: self.question(principal, &owner, id) }
            }
            (None, _) => TaskPayload::Working,
        };
        Ok(DetailedTask::new(task, payload))
    }

    /// What a task waiting for approval asks its client: the approval question, when this
    /// client may answer it (`[approval] ask_clients`); otherwise nothing, and a person decides.
    fn question(&self, principal: Option<&Principal>, owner: &str, id: &str) -> InputRequests {
        let mut requests = InputRequests::new();
        let registry = self.inner.tools.current();
        if !super::may_ask(registry.approvals(), principal) {
            return requests;
        }
        if let Some(pending) = registry.state().tasks.pending(owner, id) {
            if let Some(question) = approve::question(&pending) {
                requests.insert(approve::INPUT_KEY.to_string(), InputRequest::Elicitation(question));
            }
        }
        requests
    }

    /// `notifications/tasks` on a `subscriptions/listen` stream that named the caller's tasks
    /// (`taskIds`): the task at each change of its status, until each has ended. Another
    /// caller's task, or one that does not exist, is skipped silently. Returns when all ended.
    pub(super) async fn tell_listened(&self, cx: &rmcp::service::SubscriptionContext, ids: Vec<String>) {
        let request = cx.request_context();
        let principal = principal(request);
        let owner = owner(principal.as_deref());
        let mut told: std::collections::HashMap<String, TaskStatus> = Default::default();
        let mut open = ids;
        while !open.is_empty() {
            let state = Arc::clone(self.inner.tools.current().state());
            let mut watches: Vec<_> = open.iter().filter_map(|id| state.tasks.watch(&owner, id)).collect();
            let mut still = Vec::new();
            for id in std::mem::take(&mut open) {
                let Ok(seen) = read(&self.inner.tools, &owner, &id).await else { continue };
                if told.get(&id) != Some(&seen.mcp_status) {
                    told.insert(id.clone(), seen.mcp_status);
                    let Ok(detailed) = self.modern_get(principal.as_deref(), &id).await else { continue };
                    let params = rmcp::model::TaskStatusNotificationParams::new(detailed);
                    let mut notice = rmcp::model::ServerNotification::CustomNotification(
                        rmcp::model::CustomNotification::new("notifications/tasks", serde_json::to_value(params).ok()),
                    );
                    rmcp::model::GetMeta::get_meta_mut(&mut notice).set_subscription_id(request.id.clone());
                    let send = request.peer.send_notification(notice);
                    if !matches!(tokio::time::timeout(Duration::from_secs(5), send).await, Ok(Ok(()))) {
                        return;
                    }
                }
                if seen.outcome.is_none() {
                    still.push(id);
                }
            }
            open = still;
            if open.is_empty() {
                return;
            }
            // The next change of any of them, or a look every second (a watch ends with its task).
            let changed = async {
                match watches.first_mut() {
                    Some(w) => {
                        let _ = w.changed().await;
                    }
                    None => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
            watches.clear();
        }
    }

    /// `tasks/update` (2026): the client's answer to the task's approval question.
    pub(super) async fn modern_update(
        &self,
        principal: Option<Arc<Principal>>,
        id: &str,
        responses: &rmcp::model::InputResponses,
    ) -> Result<(), McpError> {
        let owner = owner(principal.as_deref());
        read(&self.inner.tools, &owner, id).await.map_err(|e| not_found(&e))?;
        let Some(response) = responses.get(approve::INPUT_KEY) else {
            return Err(McpError::invalid_params(
                format!("tasks/update: the task asks only {:?}; answer that key", approve::INPUT_KEY),
                None,
            ));
        };
        let registry = self.inner.tools.current();
        if !super::may_ask(registry.approvals(), principal.as_deref()) {
            return Err(McpError::invalid_params(
                "this client may not approve its own calls ([approval] ask_clients); a person decides with ctx approvals",
                None,
            ));
        }
        let Some(pending) = registry.state().tasks.pending(&owner, id) else {
            return Err(McpError::invalid_params("the task is not waiting for an answer now", None));
        };
        let approved = matches!(approve::answered(response), approve::Answer::Approved);
        let policy = Arc::clone(registry.approvals());
        let token = pending.token.clone();
        let decided = tokio::task::spawn_blocking(move || policy.decide_for(&token, &owner, approved, "mcp")).await;
        match decided {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(McpError::invalid_params(e.to_string(), None)),
            Err(e) => Err(McpError::internal_error(e.to_string(), None)),
        }
    }

    /// `tasks/cancel` (2026).
    pub(super) async fn modern_cancel(&self, principal: Option<&Principal>, id: &str) -> Result<(), McpError> {
        let owner = owner(principal);
        match cancel(&self.inner.tools, &owner, id).await {
            Ok(_) => Ok(()),
            Err(e @ TaskError::Ended { .. }) => Err(McpError::invalid_params(e.to_string(), None)),
            Err(e) => Err(not_found(&e)),
        }
    }
}

fn object(value: Json) -> JsonObject {
    match value {
        Json::Object(map) => map,
        other => JsonObject::from_iter([("value".to_string(), other)]),
    }
}
