//! Upstream servers' tasks, passed through: a tool whose listing says `execution.taskSupport =
//! "required"` is called as an MCP task on its server, its task shown as `<server>:<task id>`
//! in the ctx call's progress, cancelled upstream when the ctx call is abandoned, bounded by the
//! server section's timeout. Against the real `@modelcontextprotocol/server-everything`
//! (`simulate-research-query`), and `tests/upstream/task_server.py` for the ends it never
//! reaches with ctx (input required, failed, a 2026-07-28 inline result).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{test_command, Workspace};
use crate::gateway::{serve, Served};
use crate::real_upstreams::stdio_section;

const RESEARCH: &str = "everything__simulate-research-query";

/// ctx with server-everything over stdio as `everything` (`extra` goes into its section), its
/// info log kept for the lines about upstream tasks.
fn everything(extra: &str) -> Option<Served> {
    let words = test_command("CTX_TEST_EVERYTHING")?;
    let section = format!("{}{extra}\n", stdio_section("everything", &words, &["stdio"]));
    let served = serve(Workspace::new(&section), &[("CTX_LOG", "ctx=info")]);
    served.ready("everything");
    Some(served)
}

/// ctx with `tests/upstream/task_server.py` as `tasks`; the file it logs each `tasks/cancel` to.
fn task_server() -> (Served, std::path::PathBuf) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upstream/task_server.py");
    let ws = Workspace::new("");
    let log = ws.path().join("cancels.log");
    let section = format!(
        "[mcp.servers.tasks]\ncommand = \"python3\"\nargs = [{script:?}, {:?}]\ntimeout = 10\n",
        log.display().to_string()
    );
    std::fs::write(
        ws.path().join("ctx.toml"),
        format!("{}\n{section}", std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap()),
    )
    .unwrap();
    let served = serve(ws, &[("CTX_LOG", "ctx=info")]);
    served.ready("tasks");
    (served, log)
}

/// `POST /tools/{tool}` with `Prefer: respond-async`: the task ctx answered with.
fn start_task(served: &Served, tool: &str, arguments: Value) -> Value {
    let url = format!("http://{}/tools/{tool}", served.serve.addr);
    let (status, task) = served.runtime.block_on(async {
        let response = served.client.post(url).header("Prefer", "respond-async").json(&arguments).send().await.unwrap();
        (response.status().as_u16(), response.json::<Value>().await.unwrap())
    });
    assert_eq!(status, 202, "{task}");
    task
}

/// Polls `GET /tasks/{id}` until `done` says so; every status message seen on the way, in order.
fn poll(served: &Served, id: &str, done: impl Fn(&Value) -> bool) -> (Value, Vec<String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut messages: Vec<String> = Vec::new();
    loop {
        let (status, task) = served.get(&format!("/tasks/{id}"));
        assert_eq!(status, 200, "{task}");
        if let Some(message) = task["status_message"].as_str() {
            if messages.last().is_none_or(|m| m != message) {
                messages.push(message.to_string());
            }
        }
        if done(&task) {
            return (task, messages);
        }
        assert!(Instant::now() < deadline, "the task never got there: {task}\nlog:\n{}", served.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The call log's latest entry for `tool`.
fn logged(served: &Served, tool: &str) -> Value {
    let (status, page) = served.get(&format!("/calls?tool={tool}&limit=1"));
    assert_eq!(status, 200, "{page}");
    page["calls"][0].clone()
}

/// Waits until ctx's log has a line with every one of `words`; that line.
fn log_line(served: &Served, words: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = served.log();
        if let Some(line) = log.lines().find(|l| words.iter().all(|w| l.contains(w))) {
            return line.to_string();
        }
        assert!(Instant::now() < deadline, "no log line with {words:?}:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_ctx_task_shows_the_namespaced_upstream_task_while_it_runs_and_completes_with_its_result() {
    let Some(served) = everything("") else { return };
    let task = start_task(&served, RESEARCH, json!({"topic": "tides"}));
    let id = task["id"].as_str().unwrap();
    let (running, _) = poll(&served, id, |t| {
        t["status"] == "working"
            && t["status_message"].as_str().is_some_and(|m| m.starts_with("upstream task everything:"))
    });
    let message = running["status_message"].as_str().unwrap();
    // `upstream task everything:<id> working: <the upstream's statusMessage>`.
    let upstream_id = message["upstream task everything:".len()..].split(' ').next().unwrap();
    assert!(!upstream_id.is_empty(), "{message}");
    assert!(message.contains(" working: ") && message.ends_with("..."), "the upstream's stage: {message}");
    let (done, messages) = poll(&served, id, |t| t["status"] != "working");
    assert_eq!(done["status"], "completed", "{done}\nlog:\n{}", served.log());
    // The stages the upstream went through reached the ctx task, under the same namespaced id.
    let prefix = format!("upstream task everything:{upstream_id} ");
    let stages: Vec<&String> = messages.iter().filter(|m| m.starts_with(&prefix)).collect();
    assert!(stages.len() >= 2, "more than one stage seen: {messages:?}");
    assert!(stages.iter().any(|m| m.contains("Generating report")), "{messages:?}");

    let (status, result) = served.get(&format!("/tasks/{id}/result"));
    assert_eq!(status, 200, "{result}");
    assert!(result["result"].as_str().is_some_and(|r| r.starts_with("# Research Report: tides")), "{result}");
    assert_eq!(logged(&served, RESEARCH)["outcome"], "ok");
    log_line(&served, &["upstream tool runs as an upstream task", &format!("everything:{upstream_id}")]);
}

#[test]
fn cancelling_a_ctx_task_cancels_its_upstream_task() {
    let Some(served) = everything("") else { return };
    let task = start_task(&served, RESEARCH, json!({"topic": "kelp"}));
    let id = task["id"].as_str().unwrap();
    let (running, _) =
        poll(&served, id, |t| t["status_message"].as_str().is_some_and(|m| m.starts_with("upstream task everything:")));
    let message = running["status_message"].as_str().unwrap();
    let upstream = message["upstream task ".len()..].split(' ').next().unwrap().to_string();

    let url = format!("http://{}/tasks/{id}", served.serve.addr);
    let status = served.runtime.block_on(async { served.client.delete(url).send().await.unwrap().status().as_u16() });
    assert!((200..300).contains(&status), "{status}");
    let (ended, _) = poll(&served, id, |t| t["status"] != "working");
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert_eq!(logged(&served, RESEARCH)["outcome"], "cancelled");
    // ctx sent tasks/cancel for the namespaced task, and the upstream answered that it is
    // cancelled (MCP 2025-11-25 answers tasks/cancel with the task).
    let line = log_line(&served, &["upstream task cancelled", &upstream]);
    assert!(line.contains("status=\"cancelled\"") || line.contains("status=cancelled"), "{line}");
}

#[test]
fn an_upstream_task_longer_than_the_servers_timeout_fails_as_a_timeout_and_is_cancelled() {
    // The research takes four stages of a second each: past a 2 s timeout.
    let Some(served) = everything("timeout = 2") else { return };
    let started = Instant::now();
    let (status, body) = served.post(&format!("/tools/{RESEARCH}"), json!({"topic": "slow"}));
    assert_eq!((status, &body["error"]["code"]), (408, &json!("timeout")), "{body}");
    assert!(started.elapsed() < Duration::from_secs(4), "bounded by the timeout: {:?}", started.elapsed());
    log_line(&served, &["upstream task cancelled", "everything:"]);
}

#[test]
fn an_upstream_task_that_needs_input_fails_saying_ctx_cannot_answer_and_is_cancelled() {
    let (served, cancels) = task_server();
    let (status, body) = served.post("/tools/tasks__asks", json!({}));
    assert_eq!((status, &body["error"]["code"]), (500, &json!("tool_error")), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("its task tasks:asks-1 needs input (Which topic did you mean?)"), "{message}");
    assert!(
        message.contains("which ctx cannot give") && message.contains("Call the tool on the server directly"),
        "{message}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&cancels).unwrap_or_default() != "cancel asks-1\n" {
        assert!(Instant::now() < deadline, "no tasks/cancel reached the server\nlog:\n{}", served.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_upstream_task_that_failed_passes_its_error_on_and_is_not_cancelled() {
    let (served, cancels) = task_server();
    let (status, body) = served.post("/tools/tasks__fails", json!({}));
    assert_eq!((status, &body["error"]["code"]), (500, &json!("tool_error")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("the work broke"), "{body}");
    // A task that ended needs no cancel.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(std::fs::read_to_string(&cancels).unwrap_or_default(), "");
}

#[test]
fn an_upstream_task_in_the_2026_shape_completes_with_its_inline_result() {
    let (served, _) = task_server();
    let (status, body) = served.post("/tools/tasks__inline", json!({}));
    assert_eq!((status, body), (200, json!({"result": "inline done"})));
}

#[test]
fn a_tool_that_may_run_as_a_task_runs_as_one_upstream_only_when_the_ctx_call_is_a_task() {
    let (served, _) = task_server();
    let (status, body) = served.post("/tools/tasks__either", json!({}));
    assert_eq!((status, body), (200, json!({"result": "plain either"})));
    let task = start_task(&served, "tasks__either", json!({}));
    let id = task["id"].as_str().unwrap();
    let (done, messages) = poll(&served, id, |t| t["status"] == "completed");
    assert!(messages.iter().any(|m| m.starts_with("upstream task tasks:either-")), "{messages:?} {done}");
    let (status, result) = served.get(&format!("/tasks/{id}/result"));
    assert_eq!((status, result), (200, json!({"result": "task either"})));
}
