//! An upstream tool called as an MCP task on its server: created with a task-augmented
//! `tools/call`, polled with `tasks/get` (at the server's `pollInterval`, bounded), its result
//! fetched with `tasks/result` once it ends (MCP 2025-11-25), or read from `tasks/get` when the
//! server inlines it (the 2026-07-28 tasks extension). The upstream's task id is shown
//! namespaced, `<server>:<task id>`, in the call's progress; a call abandoned before the task
//! ended (cancelled, timed out, its caller gone) sends `tasks/cancel`.
//!
//! rmcp 3.9's typed `tools/call` has no `task` parameter, so these requests go out as custom
//! requests with their JSON as the spec writes it; answers come back through rmcp's untagged
//! result type, whose task shapes lose `pollInterval`: what is missing falls back to the last
//! interval seen.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{ClientRequest, CustomRequest};
use rmcp::service::{Peer, RoleClient};
use serde_json::{json, Map, Value as Json};

use super::client::{self, Cut, Failure};
use super::supervisor::Shared;
use super::UpstreamError;
use crate::contract::{Progress, ProgressSink};

/// The quickest and slowest polls, whatever the server suggests: a server that asks for 0 ms
/// would be polled in a busy loop, and one that asks for an hour would outlive the call.
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(5);
/// The poll interval until the server suggests one.
const POLL_DEFAULT: Duration = Duration::from_millis(500);
/// How long a `tasks/cancel` sent for an abandoned task may take; it runs on its own, so an
/// abandoned call never waits for it.
pub const CANCEL_WITHIN: Duration = Duration::from_secs(5);
/// Related-task metadata of a result (MCP 2025-11-25): it names the upstream's own task, which
/// is no task of ctx's caller.
const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// One answer's view of an upstream task.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Seen {
    pub id: String,
    pub status: String,
    pub message: Option<String>,
    pub poll: Option<Duration>,
    /// The final result, when the server inlines it in `tasks/get` (2026-07-28).
    pub result: Option<Map<String, Json>>,
    /// The JSON-RPC error of a failed task, when inlined (2026-07-28).
    pub error: Option<Map<String, Json>>,
}

/// What a task-augmented `tools/call` answered.
#[derive(Debug, PartialEq)]
pub enum Created {
    /// A task handle: `{task: {...}}` (2025-11-25) or `{resultType: "task", ...}` (2026-07-28).
    Task(Seen),
    /// A plain result: the server ran the call at once (it may ignore the augmentation).
    Result(Map<String, Json>),
}

/// Reads the answer of a task-augmented `tools/call`.
pub fn created(answer: Map<String, Json>) -> Created {
    if let Some(seen) = answer.get("task").and_then(Json::as_object).and_then(seen) {
        return Created::Task(seen);
    }
    if answer.get("resultType").and_then(Json::as_str) == Some("task") {
        if let Some(seen) = seen(&answer) {
            return Created::Task(seen);
        }
    }
    Created::Result(answer)
}

/// The longest task id and status message kept from an upstream: both go into every status
/// of the ctx task, its store and its answers.
const MAX_ID_BYTES: usize = 256;
const MAX_MESSAGE_CHARS: usize = 1024;

/// An upstream's text as one plain line: control characters (newlines, ANSI escapes) would
/// forge log lines or hide the `upstream task` prefix of the status a client shows.
fn plain(text: &str, chars: usize) -> String {
    let clean: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    head(clean.trim(), chars)
}

/// A task's fields, in either era's spelling; `None` without a task id and status, or with an
/// id no task of ctx's would keep (over 256 bytes, or with control characters).
pub fn seen(task: &Map<String, Json>) -> Option<Seen> {
    let text = |key: &str| task.get(key).and_then(Json::as_str).map(str::to_string);
    let poll = ["pollInterval", "pollIntervalMs"].iter().find_map(|k| task.get(*k).and_then(Json::as_u64));
    let id = text("taskId").filter(|id| id.len() <= MAX_ID_BYTES && !id.chars().any(char::is_control))?;
    Some(Seen {
        id,
        status: plain(&text("status")?, 32),
        message: text("statusMessage").map(|m| plain(&m, MAX_MESSAGE_CHARS)).filter(|m| !m.is_empty()),
        poll: poll.map(Duration::from_millis),
        result: task.get("result").and_then(Json::as_object).cloned(),
        error: task.get("error").and_then(Json::as_object).cloned(),
    })
}

/// `upstream task <server>:<id> <status>: <message>`: how the call's progress names the task.
pub fn describe(server: &str, seen: &Seen) -> String {
    let mut text = format!("upstream task {server}:{} {}", seen.id, seen.status);
    if let Some(message) = &seen.message {
        text.push_str(": ");
        text.push_str(message);
    }
    text
}

/// The result without the related-task metadata of the upstream's own task.
pub fn unrelated(mut result: Map<String, Json>) -> Map<String, Json> {
    let empty = match result.get_mut("_meta") {
        Some(Json::Object(meta)) => {
            meta.remove(RELATED_TASK);
            meta.is_empty()
        }
        _ => false,
    };
    if empty {
        result.remove("_meta");
    }
    result
}

/// One ready connection, as the call found it.
pub struct Conn {
    pub server: String,
    pub shared: Arc<Shared>,
    pub peer: Peer<RoleClient>,
    pub cut: Option<Cut>,
}

impl Conn {
    fn error(&self, limit: Duration, failure: Failure) -> UpstreamError {
        super::upstream_error(&self.server, limit, &self.shared, self.cut.as_ref(), failure)
    }

    /// The message reaches every caller, as an RPC error's does: without the section's secrets.
    fn task_error(&self, seen: &Seen, message: String) -> UpstreamError {
        let message = self.shared.sanitise(&message);
        UpstreamError::Task { server: self.server.clone(), task: format!("{}:{}", self.server, seen.id), message }
    }
}

/// Calls `tool` with `arguments` as a task on the upstream and waits for its end, all within
/// the section's timeout. The upstream's status changes and progress go to `progress`.
pub async fn call(
    conn: Conn,
    tool: &str,
    arguments: Map<String, Json>,
    progress: Option<ProgressSink>,
) -> Result<Map<String, Json>, UpstreamError> {
    let limit = conn.shared.section.timeout;
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + limit;
    let result = match tokio::time::timeout_at(deadline, drive(&conn, tool, arguments, progress, deadline)).await {
        Ok(result) => result,
        // The whole task had the call's time: dropping `drive` cancels it upstream.
        Err(_) => Err(UpstreamError::Timeout { server: conn.server.clone(), limit }),
    };
    conn.shared.record_call(started.elapsed());
    result
}

/// The last progress the upstream reported, so a status report carries the same numbers
/// rather than inventing some.
#[derive(Clone, Default)]
struct Last(Arc<Mutex<(f64, Option<f64>)>>);

impl Last {
    fn get(&self) -> (f64, Option<f64>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, done: f64, total: Option<f64>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = (done, total);
    }
}

async fn drive(
    conn: &Conn,
    tool: &str,
    arguments: Map<String, Json>,
    progress: Option<ProgressSink>,
    deadline: tokio::time::Instant,
) -> Result<Map<String, Json>, UpstreamError> {
    let limit = conn.shared.section.timeout;
    let last = Last::default();
    let forward = progress.clone().map(|outer| {
        let last = last.clone();
        Arc::new(move |p: Progress| {
            last.set(p.done, p.total);
            outer(p);
        }) as ProgressSink
    });
    let report = |text: String| {
        if let Some(sink) = &progress {
            let (done, total) = last.get();
            sink(Progress { done, total, message: Some(text) });
        }
    };
    let remaining = || deadline.saturating_duration_since(tokio::time::Instant::now());
    // The task is of no use to ctx past the call's deadline: the server may drop it then.
    let ttl = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
    let params = json!({"name": tool, "arguments": arguments, "task": {"ttl": ttl}});
    let create = custom("tools/call", params);
    // Keeps routing progress with the creating request's token while the task runs.
    let (answer, _route) =
        client::request_routed(&conn.peer, create, remaining(), forward.map(|sink| (&conn.shared.progress, sink)))
            .await
            .map_err(|f| conn.error(limit, f))?;
    let mut seen = match created(answer) {
        Created::Result(result) => return Ok(unrelated(result)),
        Created::Task(seen) => seen,
    };
    let mut pending = CancelOnDrop::new(conn, &seen.id);
    tracing::info!(server = %conn.server, tool, task = ?pending.name, "upstream tool runs as an upstream task");
    report(describe(&conn.server, &seen));
    let mut interval = seen.poll.unwrap_or(POLL_DEFAULT);
    loop {
        match seen.status.as_str() {
            "working" => {}
            "input_required" => {
                // ctx's client declares no elicitation or sampling, so nothing it could send
                // would let the task go on; `pending` cancels it on the way out.
                let why = seen.message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default();
                return Err(conn.task_error(&seen, format!(
                    "needs input{why}, which ctx cannot give inside an upstream task (it answers no elicitation or sampling request of an upstream), so ctx cancels it upstream. Call the tool on the server directly, or with arguments that need no answer"
                )));
            }
            "completed" | "failed" => {
                pending.disarm();
                if let Some(error) = seen.error.take() {
                    let code = error.get("code").and_then(Json::as_i64).and_then(|c| i32::try_from(c).ok());
                    let message = error.get("message").and_then(Json::as_str).unwrap_or("the task failed");
                    let failure = Failure::Rpc {
                        code: code.unwrap_or(-32603),
                        message: message.to_string(),
                        data: error.get("data").cloned(),
                    };
                    return Err(conn.error(limit, failure));
                }
                let result = match seen.result.take() {
                    Some(result) => result,
                    None => client::request(
                        &conn.peer,
                        custom("tasks/result", json!({"taskId": seen.id})),
                        remaining(),
                        None,
                    )
                    .await
                    .map_err(|f| conn.error(limit, f))?,
                };
                return Ok(unrelated(result));
            }
            "cancelled" => {
                pending.disarm();
                let why = seen.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default();
                return Err(conn.task_error(&seen, format!("was cancelled on the upstream server{why}")));
            }
            other => {
                return Err(conn.task_error(&seen, format!(
                    "has status '{other}', which MCP does not define; ctx stopped waiting for it. Check the server's MCP version"
                )));
            }
        }
        tokio::time::sleep(interval.clamp(POLL_MIN, POLL_MAX)).await;
        let answer = client::request(&conn.peer, custom("tasks/get", json!({"taskId": seen.id})), remaining(), None)
            .await
            .map_err(|f| conn.error(limit, f))?;
        let Some(next) = seen_answer(&answer, &seen.id) else {
            return Err(conn.task_error(&seen, format!(
                "could not be followed: the upstream's answer to tasks/get has no task status ({}); ctx stopped waiting for it",
                head(&Json::Object(answer).to_string(), 200)
            )));
        };
        if (&next.status, &next.message) != (&seen.status, &seen.message) {
            report(describe(&conn.server, &next));
        }
        interval = next.poll.unwrap_or(interval);
        seen = next;
    }
}

/// A `tasks/get` answer's task; a server may leave out the id it was asked for, but not name
/// another (ctx would follow a task it did not start, perhaps another caller's).
fn seen_answer(answer: &Map<String, Json>, id: &str) -> Option<Seen> {
    match answer.get("taskId") {
        Some(Json::String(named)) if named != id => return None,
        Some(Json::String(_)) => return seen(answer),
        _ => {}
    }
    let mut answer = answer.clone();
    answer.insert("taskId".into(), Json::String(id.to_string()));
    seen(&answer)
}

/// The first `chars` characters of `text`, marked when cut: an answer quoted in a message.
fn head(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

fn custom(method: &str, params: Json) -> ClientRequest {
    ClientRequest::CustomRequest(CustomRequest::new(method, Some(params)))
}

/// Sends `tasks/cancel` for a task nobody waits for any more, unless disarmed: the call was
/// dropped (its ctx task cancelled, its client gone) or timed out before the task ended.
struct CancelOnDrop {
    peer: Peer<RoleClient>,
    id: String,
    /// `<server>:<task id>`.
    name: String,
    armed: bool,
}

impl CancelOnDrop {
    fn new(conn: &Conn, id: &str) -> CancelOnDrop {
        CancelOnDrop { peer: conn.peer.clone(), id: id.to_string(), name: format!("{}:{id}", conn.server), armed: true }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (peer, id, name) = (self.peer.clone(), self.id.clone(), self.name.clone());
        runtime.spawn(async move {
            match client::request(&peer, custom("tasks/cancel", json!({"taskId": id})), CANCEL_WITHIN, None).await {
                // MCP 2025-11-25 answers with the task: its status says whether it stopped.
                Ok(answer) => {
                    let status = answer.get("status").and_then(Json::as_str).unwrap_or("unknown").to_string();
                    tracing::info!(task = ?name, status, "upstream task cancelled: ctx's call was abandoned before it ended");
                }
                Err(e) => tracing::warn!(
                    task = ?name,
                    "could not cancel the upstream task of an abandoned call ({e:?}); it runs on upstream until it ends or its ttl passes"
                ),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(value: Json) -> Map<String, Json> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn a_created_task_is_read_in_either_era_and_a_plain_result_passes() {
        let legacy = map(json!({"task": {"taskId": "t1", "status": "working", "statusMessage": "",
            "createdAt": "2026-01-01T00:00:00Z", "ttl": 300000, "pollInterval": 1000}}));
        let Created::Task(seen) = created(legacy) else { panic!("a task") };
        assert_eq!((seen.id.as_str(), seen.status.as_str(), seen.message), ("t1", "working", None));
        assert_eq!(seen.poll, Some(Duration::from_millis(1000)));
        let extension = map(json!({"resultType": "task", "taskId": "t2", "status": "working", "pollIntervalMs": 250}));
        let Created::Task(seen) = created(extension) else { panic!("a task") };
        assert_eq!((seen.id.as_str(), seen.poll), ("t2", Some(Duration::from_millis(250))));
        let plain = map(json!({"content": [{"type": "text", "text": "done"}]}));
        assert_eq!(created(plain.clone()), Created::Result(plain));
    }

    #[test]
    fn the_task_is_named_with_its_server_and_its_status() {
        let seen = Seen {
            id: "abc".into(),
            status: "working".into(),
            message: Some("Gathering sources...".into()),
            ..Seen::default()
        };
        assert_eq!(describe("everything", &seen), "upstream task everything:abc working: Gathering sources...");
        let quiet = Seen { message: None, ..seen };
        assert_eq!(describe("everything", &quiet), "upstream task everything:abc working");
    }

    #[test]
    fn a_result_loses_the_upstream_tasks_metadata_and_keeps_the_rest() {
        let only = map(json!({"content": [], "_meta": {RELATED_TASK: {"taskId": "t1"}}}));
        assert!(!unrelated(only).contains_key("_meta"));
        let more = map(json!({"content": [], "_meta": {RELATED_TASK: {"taskId": "t1"}, "other": 1}}));
        assert_eq!(unrelated(more)["_meta"], json!({"other": 1}));
    }

    #[test]
    fn a_tasks_get_answer_without_its_id_is_the_task_asked_for() {
        let seen = seen_answer(&map(json!({"status": "completed", "result": {"content": []}})), "t9").unwrap();
        assert_eq!((seen.id.as_str(), seen.status.as_str()), ("t9", "completed"));
        assert_eq!(seen.result, Some(map(json!({"content": []}))));
        assert!(seen_answer(&map(json!({"resultType": "complete"})), "t9").is_none());
    }
}
