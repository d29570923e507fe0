//! Tasks over REST: `POST /tools/{name}` with `Prefer: respond-async` answers 202 with the task
//! and `Location: /tasks/{id}`; with `Accept: text/event-stream` it streams the task's progress,
//! then its result, as server-sent events. `GET /tasks`, `GET /tasks/{id}`,
//! `GET /tasks/{id}/result` and `DELETE /tasks/{id}` (cancel) read and stop the caller's own
//! tasks. Also [`Renderer`]: a task's outcome in REST's and MCP's forms, kept in the store.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value as Json};

use super::guard;
use super::openapi::responses::GuardErrors;
use super::respond::{call_error, json_response, ApiError};
use super::App;
use crate::tasks::{Outcome, Render, Seen, TaskError};
use crate::tools::{CallError, Output};
use crate::types::{ErrorCode, Task, TasksList};

/// A task's outcome as REST (`POST /tools/{name}`'s status and body) and MCP (`tools/call`'s
/// result or error) answer it.
pub struct Renderer;

impl Render for Renderer {
    fn render(&self, tool: &str, result: &Result<Output, CallError>) -> Outcome {
        let (rest_status, rest_body) = rest_answer(tool, result);
        let (mcp, mcp_error) = crate::mcp::task_result(result);
        Outcome { rest_status, rest_body, mcp, mcp_error }
    }
}

/// The status and body `POST /tools/{tool}` answers for `result`.
pub fn rest_answer(tool: &str, result: &Result<Output, CallError>) -> (u16, Json) {
    match result {
        Ok(Output::Value(value)) if crate::tools::BUILTINS.contains(&tool) => (200, value.clone()),
        Ok(output) => (200, output.rest_body()),
        Err(CallError::ApprovalRequired(pending)) => (202, serde_json::to_value(pending.body()).unwrap_or_default()),
        Err(e) => (crate::tools::http_status(e.code()), e.envelope()),
    }
}

/// Whom the request's tasks belong to: a scoped token's name, or empty for the operator.
fn owner(caller: &Option<Extension<guard::Caller>>) -> String {
    caller.as_ref().and_then(|Extension(c)| c.0.as_ref()).map(|p| p.name().to_string()).unwrap_or_default()
}

/// Whether the request asks for its call to run as a task (`Prefer: respond-async`, RFC 7240).
pub fn wants_async(headers: &HeaderMap) -> bool {
    headers.get_all("prefer").iter().filter_map(|v| v.to_str().ok()).any(|v| {
        v.split(',').any(|p| p.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("respond-async")))
    })
}

/// Whether the request asks for its call's progress as server-sent events: `Accept` names
/// `text/event-stream` and not JSON (MCP clients send both to every endpoint, and a plain JSON
/// answer suits them).
pub fn wants_events(headers: &HeaderMap) -> bool {
    let accepted: Vec<String> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .collect();
    let json = accepted.iter().any(|t| t == "application/json" || t.ends_with("+json") || t == "*/*");
    accepted.iter().any(|t| t == "text/event-stream") && !json
}

fn task_error(e: TaskError) -> Response {
    let code = match &e {
        TaskError::NotFound(_) => ErrorCode::NotFound,
        TaskError::Ended { .. } => ErrorCode::Conflict,
        TaskError::NotInstalled | TaskError::Store(_) => ErrorCode::Unavailable,
    };
    ApiError::new(code, e.to_string()).into_response()
}

fn task_body(task: &Task) -> Json {
    serde_json::to_value(task).unwrap_or_default()
}

/// 202 with the task and where to find it.
pub fn accepted(task: &Task) -> Response {
    let mut response = json_response(StatusCode::ACCEPTED, &task_body(task));
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(&format!("/tasks/{}", task.id)) {
        headers.insert(header::LOCATION, location);
    }
    headers.insert("preference-applied", HeaderValue::from_static("respond-async"));
    retry_after(headers, task.poll_interval_ms);
    response
}

fn retry_after(headers: &mut HeaderMap, poll_ms: u64) {
    let secs = poll_ms.div_ceil(1000).max(1);
    if let Ok(value) = HeaderValue::from_str(&secs.to_string()) {
        headers.insert(header::RETRY_AFTER, value);
    }
}

/// Starts the call as a task: 202 (`Prefer: respond-async`), or the event stream.
pub async fn start(app: &App, name: &str, params: Json, options: crate::tools::CallOptions, events: bool) -> Response {
    let owner = options.principal.as_ref().map(|p| p.name().to_string()).unwrap_or_default();
    match app.tools.start_task(name.to_string(), params, options).await {
        Ok(task) => {
            let wire = app.tools.current().state().tasks.wire_of(&task);
            match events {
                true => event_stream(app, owner, wire),
                false => accepted(&wire),
            }
        }
        Err(e) => call_error(&e),
    }
}

/// A stream of bytes for a response body, fed from a channel.
struct Feed(tokio::sync::mpsc::Receiver<Bytes>);

impl futures_core::Stream for Feed {
    type Item = Result<Bytes, Infallible>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|item| item.map(Ok))
    }
}

fn event(name: &str, data: &Json) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {}\n\n", serde_json::to_string(data).unwrap_or_default()))
}

/// The task's events: `task` (the handle, first), `progress` at each report, `status` when
/// it waits for approval or goes on, then `result` (the body the call answered, when it
/// succeeded) or `error` (the error envelope), and the stream ends. A client that goes away
/// leaves the task running: its result stays at `GET /tasks/{id}/result`.
fn event_stream(app: &App, owner: String, first: Task) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let tools = Arc::clone(&app.tools);
    let id = first.id.clone();
    tokio::spawn(async move {
        let state = Arc::clone(tools.current().state());
        let tasks = &state.tasks;
        if tx.send(event("task", &task_body(&first))).await.is_err() {
            return;
        }
        let mut last = first;
        let mut watch = tasks.watch(&owner, &id);
        loop {
            let seen = match tasks.get(&owner, &id) {
                Ok(seen) => seen,
                Err(e) => {
                    let _ = tx
                        .send(event("error", &json!({"error": {"code": "unavailable", "message": e.to_string()}})))
                        .await;
                    return;
                }
            };
            if seen.task.progress != last.progress && seen.task.progress.is_some() {
                let progress = serde_json::to_value(&seen.task.progress).unwrap_or_default();
                if tx.send(event("progress", &progress)).await.is_err() {
                    return;
                }
            }
            let status_changed = seen.task.status != last.status && seen.outcome.is_none();
            if status_changed && tx.send(event("status", &task_body(&seen.task))).await.is_err() {
                return;
            }
            if let Some(outcome) = &seen.outcome {
                let name = if outcome.rest_status == 200 { "result" } else { "error" };
                let _ = tx.send(event(name, &outcome.rest_body)).await;
                return;
            }
            last = seen.task;
            match watch.as_mut() {
                Some(w) => {
                    // Keep-alive comments while nothing happens: proxies close quiet streams.
                    match tokio::time::timeout(Duration::from_secs(15), w.changed()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => watch = None,
                        Err(_) => {
                            if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                // Ended between two looks: the next look reads its outcome from the store.
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    let mut response = Response::new(Body::from_stream(Feed(rx)));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// The caller's tasks, newest first.
#[utoipa::path(get, path = "/tasks", operation_id = "listTasks", tag = "tasks",
    responses((status = 200, description = "The caller's own tasks that have not expired, newest first (at most 100).", body = super::openapi::schemas::TasksList),
        (status = 503, description = "This server keeps no tasks (the store failed to open).", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn list(State(app): State<Arc<App>>, caller: Option<Extension<guard::Caller>>) -> Response {
    let owner = owner(&caller);
    let tools = Arc::clone(&app.tools);
    let listed = tokio::task::spawn_blocking(move || tools.current().state().tasks.list(&owner)).await;
    match listed {
        Ok(Ok(seen)) => {
            let tasks = seen.into_iter().map(|s| s.task).collect();
            json_response(StatusCode::OK, &serde_json::to_value(TasksList { tasks }).unwrap_or_default())
        }
        Ok(Err(e)) => task_error(e),
        Err(_) => task_error(TaskError::Store("the task failed".into())),
    }
}

async fn seen(app: &App, owner: String, id: String) -> Result<Seen, TaskError> {
    let tools = Arc::clone(&app.tools);
    tokio::task::spawn_blocking(move || tools.current().state().tasks.get(&owner, &id))
        .await
        .unwrap_or_else(|_| Err(TaskError::Store("the task failed".into())))
}

/// One of the caller's tasks.
#[utoipa::path(get, path = "/tasks/{id}", operation_id = "getTask", tag = "tasks",
    params(("id" = String, Path, description = "The task's id, from the 202's body or its Location header.")),
    responses((status = 200, description = "The task: its status, progress, and the approval it waits on.", body = super::openapi::schemas::Task),
        (status = 404, description = "No such task of this caller (another caller's task is not found either), or it expired.", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn get(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    caller: Option<Extension<guard::Caller>>,
) -> Response {
    match seen(&app, owner(&caller), id).await {
        Ok(seen) => {
            let mut response = json_response(StatusCode::OK, &task_body(&seen.task));
            if seen.outcome.is_none() {
                retry_after(response.headers_mut(), seen.task.poll_interval_ms);
            }
            response
        }
        Err(e) => task_error(e),
    }
}

/// A task's result: what `POST /tools/{name}` would have answered, once the task ended.
#[utoipa::path(get, path = "/tasks/{id}/result", operation_id = "getTaskResult", tag = "tasks",
    params(("id" = String, Path, description = "The task's id.")),
    responses((status = 200, description = "The task completed: the body the call answered ({result} for a Lua, upstream or code-mode tool, a built-in's own body). A task that failed answers the error envelope with the call's own status instead.", body = inline(super::openapi::schemas::ToolAnswer)),
        (status = 202, description = "Still running or waiting for approval: the task, with Retry-After.", body = super::openapi::schemas::Task),
        (status = 404, description = "No such task of this caller, or it expired.", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn result(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    caller: Option<Extension<guard::Caller>>,
) -> Response {
    match seen(&app, owner(&caller), id).await {
        Ok(Seen { outcome: Some(outcome), .. }) => {
            let status = StatusCode::from_u16(outcome.rest_status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            json_response(status, &outcome.rest_body)
        }
        Ok(Seen { task, outcome: None, .. }) => {
            let mut response = json_response(StatusCode::ACCEPTED, &task_body(&task));
            retry_after(response.headers_mut(), task.poll_interval_ms);
            response
        }
        Err(e) => task_error(e),
    }
}

/// Cancels one of the caller's running tasks: its run stops, and the task ends `cancelled`.
#[utoipa::path(delete, path = "/tasks/{id}", operation_id = "cancelTask", tag = "tasks",
    params(("id" = String, Path, description = "The task's id.")),
    responses((status = 200, description = "The task, cancelled (or, when its run takes longer than 5 s to stop, still working with the cancel under way).", body = super::openapi::schemas::Task),
        (status = 404, description = "No such task of this caller, or it expired.", body = super::openapi::schemas::Error),
        (status = 409, description = "The task already ended: nothing to cancel.", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn cancel(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    caller: Option<Extension<guard::Caller>>,
) -> Response {
    let owner = owner(&caller);
    let state = Arc::clone(app.tools.current().state());
    if let Err(e) = state.tasks.cancel(&owner, &id).await {
        return task_error(e);
    }
    match seen(&app, owner, id).await {
        Ok(seen) => json_response(StatusCode::OK, &task_body(&seen.task)),
        Err(e) => task_error(e),
    }
}
