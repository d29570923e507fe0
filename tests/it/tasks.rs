//! Long-running calls as tasks over REST, against a real `ctx serve` and real Lua tools:
//! `Prefer: respond-async` (202 and `Location`), polling, `Accept: text/event-stream` read by a
//! real SSE parser (`sse-stream`, the one rmcp's client uses), cancel, approval, another
//! caller's tasks, the per-caller cap, the result cap, and a restart with a task running.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{ServeChild, Workspace, BIN};

const ADMIN: &str = "admin-token-0123456789abcdef";
const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdefgh";
const APPROVER: &str = "approver-secret-0123456789";

/// Reports progress after each of `count` steps of `delay` seconds, then answers.
const DEPLOY: &str = r#"
tool = {
    name = "deploy",
    description = "Deploys in steps, reporting progress after each.",
    long_running = true,
    parameters = {
        { name = "count", type = "integer", default = 3, description = "Steps" },
        { name = "delay", type = "number", default = 0.2, description = "Seconds per step" },
        { name = "size", type = "integer", default = 0, description = "Bytes of padding in the answer" },
    },
}

function tool.execute(params)
    for i = 1, params.count do
        sleep(params.delay)
        progress(i, params.count, "step " .. i .. " of " .. params.count)
    end
    return { steps = params.count, padding = string.rep("x", params.size) }
end
"#;

fn config(extra: &str) -> String {
    format!(
        r#"[db]
path = "data/ctx.sqlite"

[server]
auth_token = "{ADMIN}"
tokens = [
  {{ name = "alice", token = "{ALICE}", tools = ["*"] }},
  {{ name = "bob", token = "{BOB}", tools = ["*"] }},
]

[approval]
tools = ["guarded"]
approver_token = "{APPROVER}"

[tasks]
max_running_per_caller = 2
max_kept_per_caller = 4
max_result_bytes = 4096
poll_interval_ms = 200

[tools.script.deploy]
path = "tools/deploy.lua"
timeout = 120

[tools.script.guarded]
path = "tools/guarded.lua"
{extra}"#
    )
}

fn workspace(extra: &str) -> Workspace {
    let ws = Workspace::new(&config(extra));
    ws.write("tools/deploy.lua", DEPLOY);
    ws.write("tools/guarded.lua", &DEPLOY.replace("name = \"deploy\"", "name = \"guarded\""));
    ws
}

struct Server {
    serve: ServeChild,
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

struct Reply {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Server {
    fn start(ws: &Workspace) -> Server {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let serve = ServeChild::spawn(
            Command::new(BIN).current_dir(ws.path()).env_remove("CTX_CONFIG").env_remove("CTX_LOG").args([
                "serve",
                "--bind",
                "127.0.0.1:0",
            ]),
        );
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Server { serve, runtime, client: reqwest::Client::new() }
    }

    fn request(&self, token: &str, method: &str, path: &str) -> reqwest::RequestBuilder {
        let url = format!("http://{}{path}", self.serve.addr);
        self.client.request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url).bearer_auth(token)
    }

    fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        self.runtime.block_on(async {
            let response = request.send().await.unwrap();
            let (status, headers) = (response.status().as_u16(), response.headers().clone());
            Reply { status, headers, body: response.json().await.unwrap_or(Value::Null) }
        })
    }

    fn start_task(&self, token: &str, tool: &str, params: Value) -> Reply {
        let request = self.request(token, "POST", &format!("/tools/{tool}")).header("prefer", "respond-async");
        self.send(request.json(&params))
    }

    fn get(&self, token: &str, path: &str) -> Reply {
        self.send(self.request(token, "GET", path))
    }

    /// Polls the task until `done` holds for it (or panics after `within`).
    fn poll(&self, token: &str, id: &str, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let task = self.get(token, &format!("/tasks/{id}"));
            assert_eq!(task.status, 200, "{}", task.body);
            if done(&task.body) {
                return task.body;
            }
            assert!(started.elapsed() < within, "task {id} never got there: {}", task.body);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn ended(task: &Value) -> bool {
    matches!(task["status"].as_str(), Some("completed" | "failed" | "cancelled"))
}

#[test]
fn a_call_that_prefers_respond_async_answers_202_and_its_result_waits_at_its_location() {
    let ws = workspace("");
    let server = Server::start(&ws);
    let started = server.start_task(ALICE, "deploy", json!({"count": 6, "delay": 0.5}));
    assert_eq!(started.status, 202, "{}", started.body);
    let id = started.body["id"].as_str().expect("a task id").to_string();
    assert_eq!(started.headers["location"], format!("/tasks/{id}").as_str());
    assert_eq!(started.headers["preference-applied"], "respond-async");
    assert_eq!(started.body["status"], "working");
    assert_eq!(started.body["tool"], "deploy");

    // While it runs: 202 at the result's address, and progress at the task's.
    let early = server.get(ALICE, &format!("/tasks/{id}/result"));
    assert_eq!(early.status, 202, "{}", early.body);
    assert!(early.headers.contains_key("retry-after"));
    let reported = server.poll(ALICE, &id, Duration::from_secs(10), |t| t["progress"]["done"].as_f64() >= Some(1.0));
    assert_eq!(reported["progress"]["total"], 6.0, "{reported}");
    assert!(reported["status_message"].as_str().unwrap_or("").starts_with("step "), "{reported}");

    let done = server.poll(ALICE, &id, Duration::from_secs(20), ended);
    assert_eq!(done["status"], "completed", "{done}");
    let result = server.get(ALICE, &format!("/tasks/{id}/result"));
    assert_eq!((result.status, &result.body), (200, &json!({"result": {"steps": 6, "padding": ""}})));
    // The same answer a plain call gets.
    let plain = server.send(server.request(ALICE, "POST", "/tools/deploy").json(&json!({"count": 1, "delay": 0})));
    assert_eq!(plain.body, json!({"result": {"steps": 1, "padding": ""}}));
    let listed = server.get(ALICE, "/tasks");
    assert_eq!(listed.body["tasks"][0]["id"], id.as_str(), "{}", listed.body);
}

#[test]
fn an_event_stream_call_sends_its_task_then_progress_then_the_result() {
    use futures_core::Stream;
    let ws = workspace("");
    let server = Server::start(&ws);
    let events: Vec<(String, Value)> = server.runtime.block_on(async {
        let response = server
            .request(ALICE, "POST", "/tools/deploy")
            .header("accept", "text/event-stream")
            .json(&json!({"count": 3, "delay": 0.2}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let mut stream = std::pin::pin!(sse_stream::SseStream::from_bytes_stream(response.bytes_stream()));
        let mut events = Vec::new();
        while let Some(event) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
            let event = event.expect("a well-formed event");
            let (Some(name), Some(data)) = (event.event, event.data) else { continue };
            events.push((name, serde_json::from_str(&data).expect("JSON data")));
        }
        events
    });
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"task"), "{names:?}");
    assert_eq!(names.last(), Some(&"result"), "{names:?}");
    let progress: Vec<f64> =
        events.iter().filter(|(n, _)| n == "progress").filter_map(|(_, d)| d["done"].as_f64()).collect();
    assert!(!progress.is_empty() && progress.windows(2).all(|w| w[0] < w[1]), "{events:?}");
    assert_eq!(progress.last(), Some(&3.0), "the last report comes before the result: {events:?}");
    assert_eq!(events.last().unwrap().1, json!({"result": {"steps": 3, "padding": ""}}));
    // The stream was a task: its result stays at its address.
    let id = events[0].1["id"].as_str().unwrap();
    assert_eq!(server.get(ALICE, &format!("/tasks/{id}/result")).status, 200);

    // A call that fails streams the error envelope.
    let failed: String = server.runtime.block_on(async {
        let response = server
            .request(ALICE, "POST", "/tools/deploy")
            .header("accept", "text/event-stream")
            .json(&json!({"count": "three"}))
            .send()
            .await
            .unwrap();
        response.text().await.unwrap()
    });
    assert!(failed.contains("event: error\ndata: {\"error\":{\"code\":\"bad_request\""), "{failed}");
}

#[test]
fn a_cancelled_task_stops_its_lua_run_and_ends_cancelled() {
    let ws = workspace("");
    let server = Server::start(&ws);
    let started = server.start_task(ALICE, "deploy", json!({"count": 100, "delay": 0.1}));
    let id = started.body["id"].as_str().unwrap().to_string();
    server.poll(ALICE, &id, Duration::from_secs(10), |t| t["progress"]["done"].as_f64() >= Some(2.0));
    let cancelled = server.send(server.request(ALICE, "DELETE", &format!("/tasks/{id}")));
    assert_eq!((cancelled.status, cancelled.body["status"].as_str()), (200, Some("cancelled")), "{}", cancelled.body);
    let result = server.get(ALICE, &format!("/tasks/{id}/result"));
    assert_eq!((result.status, result.body["error"]["code"].as_str()), (499, Some("cancelled")), "{}", result.body);
    // The run stopped: the call log has it cancelled after far less than its 10 s.
    let calls = server.get(ADMIN, "/calls?tool=deploy");
    let entry = &calls.body["calls"][0];
    assert_eq!(entry["outcome"], "cancelled", "{}", calls.body);
    assert!(entry["ms"].as_f64().unwrap() < 5000.0, "{entry}");
    // Once ended, there is nothing left to cancel.
    let again = server.send(server.request(ALICE, "DELETE", &format!("/tasks/{id}")));
    assert_eq!((again.status, again.body["error"]["code"].as_str()), (409, Some("conflict")), "{}", again.body);
}

#[test]
fn a_task_that_needs_approval_waits_in_input_required_and_runs_once_approved() {
    let ws = workspace("");
    let server = Server::start(&ws);
    let started = server.start_task(ALICE, "guarded", json!({"count": 1, "delay": 0}));
    assert_eq!(started.status, 202, "{}", started.body);
    let id = started.body["id"].as_str().unwrap().to_string();
    let waiting = server.poll(ALICE, &id, Duration::from_secs(10), |t| t["status"] == "input_required");
    let approval = waiting["approval_id"].as_str().expect("the approval it waits on").to_string();
    assert!(waiting["status_message"].as_str().unwrap().contains(&approval), "{waiting}");
    // A person approves, through REST.
    let approve =
        server.request(ADMIN, "POST", &format!("/approvals/{approval}/approve")).header("ctx-approver", APPROVER);
    assert_eq!(server.send(approve).status, 200);
    let done = server.poll(ALICE, &id, Duration::from_secs(10), ended);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(server.get(ALICE, &format!("/tasks/{id}/result")).body["result"]["steps"], 1);

    // Denied: the task fails with the refusal, and nothing ran.
    let started = server.start_task(ALICE, "guarded", json!({"count": 2, "delay": 0}));
    let id = started.body["id"].as_str().unwrap().to_string();
    let waiting = server.poll(ALICE, &id, Duration::from_secs(10), |t| t["status"] == "input_required");
    let approval = waiting["approval_id"].as_str().unwrap();
    let deny = server.request(ADMIN, "POST", &format!("/approvals/{approval}/deny")).header("ctx-approver", APPROVER);
    assert_eq!(server.send(deny.json(&json!({"reason": "not today"}))).status, 200);
    let done = server.poll(ALICE, &id, Duration::from_secs(10), ended);
    assert_eq!(done["status"], "failed", "{done}");
    let result = server.get(ALICE, &format!("/tasks/{id}/result"));
    assert_eq!(result.body["error"]["code"], "approval_refused", "{}", result.body);
}

#[test]
fn another_callers_task_is_not_found_and_not_listed() {
    let ws = workspace("");
    let server = Server::start(&ws);
    let started = server.start_task(ALICE, "deploy", json!({"count": 20, "delay": 0.1}));
    let id = started.body["id"].as_str().unwrap().to_string();
    for path in [format!("/tasks/{id}"), format!("/tasks/{id}/result")] {
        let seen = server.get(BOB, &path);
        assert_eq!((seen.status, seen.body["error"]["code"].as_str()), (404, Some("not_found")), "{path}");
        // The operator's own tasks are another caller's too.
        assert_eq!(server.get(ADMIN, &path).status, 404, "{path}");
    }
    let cancel = server.send(server.request(BOB, "DELETE", &format!("/tasks/{id}")));
    assert_eq!(cancel.status, 404, "{}", cancel.body);
    assert_eq!(server.get(BOB, "/tasks").body, json!({"tasks": []}));
    // Alice's task ran on, untouched.
    assert_eq!(server.poll(ALICE, &id, Duration::from_secs(10), ended)["status"], "completed");
}

#[test]
fn a_caller_past_its_running_tasks_cap_gets_429_and_a_too_large_result_fails_its_task() {
    let ws = workspace("");
    let server = Server::start(&ws);
    let slow = json!({"count": 50, "delay": 0.1});
    let first = server.start_task(ALICE, "deploy", slow.clone());
    let second = server.start_task(ALICE, "deploy", slow.clone());
    assert_eq!((first.status, second.status), (202, 202));
    let third = server.start_task(ALICE, "deploy", slow.clone());
    assert_eq!((third.status, third.body["error"]["code"].as_str()), (429, Some("rate_limited")), "{}", third.body);
    assert!(third.body["error"]["message"].as_str().unwrap().contains("max_running_per_caller"), "{}", third.body);
    assert!(third.headers.contains_key("retry-after"));
    // The cap is per caller.
    assert_eq!(server.start_task(BOB, "deploy", json!({"count": 1, "delay": 0})).status, 202);
    // A tool the caller cannot call makes no task: the plain call's answer.
    let unknown = server.start_task(BOB, "nonexistent", json!({}));
    assert_eq!((unknown.status, unknown.body["error"]["code"].as_str()), (404, Some("not_found")), "{}", unknown.body);
    for reply in [first, second] {
        let id = reply.body["id"].as_str().unwrap();
        server.send(server.request(ALICE, "DELETE", &format!("/tasks/{id}")));
    }
    // A place is free again; a result over [tasks] max_result_bytes fails its task.
    let big = server.start_task(ALICE, "deploy", json!({"count": 1, "delay": 0, "size": 10000}));
    assert_eq!(big.status, 202, "{}", big.body);
    let id = big.body["id"].as_str().unwrap();
    let done = server.poll(ALICE, id, Duration::from_secs(10), ended);
    assert_eq!(done["status"], "failed", "{done}");
    assert!(done["status_message"].as_str().unwrap().contains("max_result_bytes"), "{done}");
    let result = server.get(ALICE, &format!("/tasks/{id}/result"));
    assert_eq!(result.body["error"]["code"], "result_too_large", "{}", result.body);
    // The store keeps [tasks] max_kept_per_caller of a caller's tasks: the oldest ended go.
    for _ in 0..3 {
        let quick = server.start_task(ALICE, "deploy", json!({"count": 1, "delay": 0}));
        server.poll(ALICE, quick.body["id"].as_str().unwrap(), Duration::from_secs(10), ended);
    }
    let kept = server.get(ALICE, "/tasks").body;
    assert_eq!(kept["tasks"].as_array().unwrap().len(), 4, "{kept}");
    assert_eq!(server.get(ALICE, &format!("/tasks/{id}")).status, 200, "the 4th newest is kept");
}

#[test]
fn a_task_running_when_the_server_dies_reads_failed_after_the_restart() {
    let ws = workspace("");
    let mut server = Server::start(&ws);
    let started = server.start_task(ALICE, "deploy", json!({"count": 100, "delay": 0.1}));
    let id = started.body["id"].as_str().unwrap().to_string();
    server.poll(ALICE, &id, Duration::from_secs(10), |t| t["progress"]["done"].as_f64() >= Some(1.0));
    let finished = server.start_task(ALICE, "deploy", json!({"count": 1, "delay": 0}));
    let finished = finished.body["id"].as_str().unwrap().to_string();
    server.poll(ALICE, &finished, Duration::from_secs(10), ended);
    // SIGKILL: no shutdown hook runs.
    server.serve.child.kill().unwrap();
    server.serve.child.wait().unwrap();
    drop(server);
    let server = Server::start(&ws);
    let lost = server.get(ALICE, &format!("/tasks/{id}"));
    assert_eq!(lost.body["status"], "failed", "{}", lost.body);
    assert!(lost.body["status_message"].as_str().unwrap().contains("ctx stopped while this task ran"), "{}", lost.body);
    let result = server.get(ALICE, &format!("/tasks/{id}/result"));
    assert_eq!((result.status, result.body["error"]["code"].as_str()), (503, Some("unavailable")), "{}", result.body);
    // A task that ended before keeps its result.
    let kept = server.get(ALICE, &format!("/tasks/{finished}/result"));
    assert_eq!((kept.status, &kept.body["result"]["steps"]), (200, &json!(1)), "{}", kept.body);
}

#[test]
fn a_code_mode_script_awaits_long_calls_like_any_other_and_can_itself_run_as_a_task() {
    let ws = workspace("");
    let server = Server::start(&ws);
    let script = "local a = ctx.deploy({count = 3, delay = 0.2}) local b = ctx.deploy({count = 3, delay = 0.2}) \
                  local r = await_all({a, b}) return {a = r[1].steps, b = r[2].steps}";
    let started = Instant::now();
    let plain = server.send(server.request(ALICE, "POST", "/tools/execute").json(&json!({"script": script})));
    assert_eq!((plain.status, &plain.body["result"]), (200, &json!({"a": 3, "b": 3})), "{}", plain.body);
    // The two long calls ran side by side: well under their 1.2 s one after the other.
    assert!(started.elapsed() < Duration::from_millis(1100), "{:?}", started.elapsed());
    // The script itself as a task: its inner calls report to no one, and it completes.
    let task = server.send(
        server
            .request(ALICE, "POST", "/tools/execute")
            .header("prefer", "respond-async")
            .json(&json!({"script": script})),
    );
    assert_eq!(task.status, 202, "{}", task.body);
    let id = task.body["id"].as_str().unwrap();
    assert_eq!(server.poll(ALICE, id, Duration::from_secs(10), ended)["status"], "completed");
    let result = server.get(ALICE, &format!("/tasks/{id}/result"));
    assert_eq!(result.body["result"], json!({"a": 3, "b": 3}), "{}", result.body);
    assert!(result.body["trace"]["calls"].as_array().is_some_and(|c| c.len() == 2), "{}", result.body);
}

/// Runs `tests/clients/mcp_tasks.py` (the official Python SDK) for one era and check against
/// `server`; returns its stdout. `None` when no test Python is installed.
fn sdk(server: &Server, era: &str, args: &[&str]) -> Option<String> {
    let python = crate::common::test_python()?;
    let output = Command::new(python)
        .arg(crate::common::repo().join("tests/clients/mcp_tasks.py"))
        .args(["--url", &format!("http://{}", server.serve.addr), "--era", era])
        .args(["--token", ALICE, "--other-token", BOB, "--admin", ADMIN, "--approver", APPROVER])
        .args(args)
        .output()
        .expect("run mcp_tasks.py");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "{era} {args:?}:\n{stdout}\n{stderr}\nserver log:\n{}",
        server.serve.stderr.lock().unwrap()
    );
    Some(stdout.into_owned())
}

#[test]
fn mcp_tasks_of_the_2025_session_era_report_progress_cancel_wait_for_approval_and_stay_with_their_caller() {
    let ws = workspace("");
    let server = Server::start(&ws);
    for check in ["progress", "cancel", "approval", "others"] {
        let Some(out) = sdk(&server, "2025", &[check]) else { return };
        assert!(out.contains(&format!("ok: 2025 {check}")), "{out}");
    }
}

#[test]
fn mcp_tasks_of_the_2026_extension_report_progress_cancel_wait_for_approval_and_stay_with_their_caller() {
    let ws = workspace("");
    let server = Server::start(&ws);
    for check in ["progress", "cancel", "approval", "others"] {
        let Some(out) = sdk(&server, "2026", &[check]) else { return };
        assert!(out.contains(&format!("ok: 2026 {check}")), "{out}");
    }
}

#[test]
fn an_mcp_task_running_when_the_server_dies_reads_failed_after_the_restart() {
    let ws = workspace("");
    let mut server = Server::start(&ws);
    let Some(out) = sdk(&server, "2025", &["start"]) else { return };
    let id = out.lines().find_map(|l| l.strip_prefix("task: ")).expect("a task id").to_string();
    server.serve.child.kill().unwrap();
    server.serve.child.wait().unwrap();
    drop(server);
    let server = Server::start(&ws);
    sdk(&server, "2025", &["lost", &id]);
    sdk(&server, "2026", &["lost", &id]);
}
