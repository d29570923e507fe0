//! One MCP `tools/call` request is admitted, logged and counted exactly once, on a real
//! `ctx serve`: stateless 2026-07-28 requests on ctx's direct route and through rmcp, 2025-11-25
//! sessions, and stdio; for a plain call, a call approved through elicitation, a call whose
//! client cannot be asked, a rate-limited call and a call with invalid arguments.
//!
//! Each request is checked against the call log (entries added for its tool, read with
//! `ctx log --json` once the log's background writer has caught up) and, over HTTP, against
//! `ctx_tool_calls_total` in `/metrics`: one request, one entry, one count.
//!
//! The clients are raw JSON-RPC, so each test decides exactly what the server sees: which
//! `_meta` keys (and so which route) a stateless request takes, and whether a client declares
//! form elicitation. A stateless request with only the version and capabilities in `_meta` and
//! the headers below is what `src/mcp/direct.rs` answers itself (`tests/it/mcp.rs` proves which
//! route answers such requests); one more `_meta` key sends it to rmcp.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::scoped_tokens_and_rates::{ctx_in, serve_with, Server, ADMIN};

/// A tool that waits for approval (`[approval] tools`).
const DEPLOY: &str = r#"
tool = { name = "deploy", description = "Deploys, once approved.",
         parameters = { { name = "message", type = "string", required = true } } }
function tool.execute(params) return "deployed " .. params.message end
"#;

/// A tool with a rate of one call a day, used up before the test's requests.
const LIMITED: &str = r#"
tool = { name = "limited", description = "Answers once a day.",
         parameters = { { name = "message", type = "string", required = true } } }
function tool.execute(params) return "limited " .. params.message end
"#;

/// How a client answers ctx's approval question: accept, with the box ticked.
fn approve() -> Value {
    json!({"action": "accept", "content": {"approve": true}})
}

/// Which way a stateless (2026-07-28) request goes through `/mcp`.
#[derive(Clone, Copy, Debug)]
enum Route {
    /// Only the version and capabilities in `_meta`: ctx's direct route takes it.
    Direct,
    /// One more `_meta` key: ctx hands it to rmcp.
    Rmcp,
}

/// A served workspace with echo, deploy (needs approval; clients may be asked) and limited
/// (rate-limited), and a client for its MCP endpoint, call log and metrics.
struct Probe {
    s: Server,
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

/// What the call log and the metrics held for a tool before a request.
struct Before {
    tool: String,
    seqs: HashSet<i64>,
    counted: Option<BTreeMap<String, u64>>,
}

impl Probe {
    fn start() -> Probe {
        let extra = "\n[tools.script.deploy]\npath = \"deploy.lua\"\n\n\
                     [tools.script.limited]\npath = \"limited.lua\"\n\n\
                     [[server.rate_limits]]\ntools = [\"limited\"]\nrate = \"1/day\"\n\n\
                     [approval]\ntools = [\"deploy\"]\nask_clients = true\n";
        let s = serve_with(extra, &[("deploy.lua", DEPLOY), ("limited.lua", LIMITED)]);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Probe { s, runtime, client: reqwest::Client::new() }
    }

    /// Every entry of the call log, newest first.
    fn log(&self) -> Vec<Value> {
        let run = self.s.cli(&["log", "--json", "--limit", "100000"]);
        assert_eq!(run.code(), 0, "{}", run.stderr());
        run.json()["calls"].as_array().unwrap().clone()
    }

    fn entries(&self, tool: &str) -> Vec<Value> {
        self.log().into_iter().filter(|c| c["tool"] == tool).collect()
    }

    /// Waits until the log holds one more `sources` call than `seen`: entries are written in the
    /// order calls end, so every entry of an earlier request is in the log by then, a second
    /// entry of the same request included.
    fn wait_for_marker(&self, seen: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.entries("sources").len() <= seen {
            assert!(Instant::now() < deadline, "the marker call never reached the call log");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Lets the call log catch up with every request the HTTP server answered: a REST call of
    /// `sources` made now, and waited for.
    fn settle(&self) {
        let seen = self.entries("sources").len();
        let (status, body) = self.s.post("/tools/sources", Some(ADMIN), json!({}));
        assert_eq!(status, 200, "the marker call: {body}");
        self.wait_for_marker(seen);
    }

    /// `ctx_tool_calls_total` of `tool`, by outcome.
    fn counted(&self, tool: &str) -> BTreeMap<String, u64> {
        let text = self.runtime.block_on(async {
            let response = self.client.get(self.s.url("/metrics")).bearer_auth(ADMIN).send().await.unwrap();
            assert_eq!(response.status(), 200);
            response.text().await.unwrap()
        });
        let prefix = format!("ctx_tool_calls_total{{tool=\"{tool}\",outcome=\"");
        text.lines()
            .filter_map(|line| line.strip_prefix(&prefix))
            .filter_map(|rest| rest.split_once("\"} "))
            .map(|(outcome, n)| (outcome.to_string(), n.trim().parse().unwrap()))
            .collect()
    }

    /// The log (and, over HTTP, the metrics) of `tool` before a request.
    fn before(&self, tool: &str, metrics: bool) -> Before {
        let seqs = self.entries(tool).iter().map(seq).collect();
        Before { tool: tool.to_string(), seqs, counted: metrics.then(|| self.counted(tool)) }
    }

    /// Asserts that the request made since `before` added exactly one call-log entry for its
    /// tool, with `outcome`, and counted exactly one call, with that outcome. Call it after
    /// [`Probe::settle`] (or [`StdioClient::settle`]).
    #[track_caller]
    fn assert_once(&self, what: &str, before: &Before, outcome: &str) {
        let added: Vec<Value> =
            self.entries(&before.tool).into_iter().filter(|c| !before.seqs.contains(&seq(c))).collect();
        let seen: Vec<String> = added.iter().rev().map(summary).collect();
        let counted = before.counted.as_ref().map(|was| {
            let now = self.counted(&before.tool);
            let mut delta: BTreeMap<String, u64> = BTreeMap::new();
            for (o, n) in &now {
                let d = n - was.get(o).copied().unwrap_or(0);
                if d > 0 {
                    delta.insert(o.clone(), d);
                }
            }
            delta
        });
        let logged_once = added.len() == 1 && added[0]["outcome"] == outcome;
        let counted_once = counted.as_ref().is_none_or(|d| d.len() == 1 && d.get(outcome) == Some(&1));
        assert!(
            logged_once && counted_once,
            "{what}: one MCP request of '{}' should add one call-log entry and one count, both '{outcome}'; \
             it added {} entries {seen:#?} and counted {}",
            before.tool,
            added.len(),
            counted.map_or_else(|| "(no /metrics over stdio)".to_string(), |d| format!("{d:?}")),
        );
    }

    /// A POST to `/mcp` with the admin token and `headers`; the JSON-RPC message answering
    /// `id`, read from a JSON body or an SSE stream. An `elicitation/create` request the server
    /// sends on the stream is recorded in `asked` and answered with [`approve`] on `session`.
    fn post_mcp(&self, headers: &[(&str, &str)], body: &Value, session: Option<&str>, asked: &mut Vec<Value>) -> Value {
        self.runtime.block_on(async {
            let mut request = self
                .client
                .post(self.s.url("/mcp"))
                .bearer_auth(ADMIN)
                .header("accept", "application/json, text/event-stream")
                .json(body);
            for (k, v) in headers {
                request = request.header(*k, *v);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            assert_eq!(status, 200, "POST /mcp {body}: {}", response.text().await.unwrap_or_default());
            self.reply(response, &body["id"], session, asked).await
        })
    }

    async fn reply(
        &self,
        mut response: reqwest::Response,
        id: &Value,
        session: Option<&str>,
        asked: &mut Vec<Value>,
    ) -> Value {
        let kind = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default();
        if kind.starts_with("application/json") {
            return response.json().await.unwrap();
        }
        let mut buffer = String::new();
        loop {
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                let data: Vec<&str> =
                    event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
                if data.is_empty() || data.concat().is_empty() {
                    continue;
                }
                let message: Value = serde_json::from_str(&data.join("\n")).unwrap();
                if message["method"] == "elicitation/create" {
                    asked.push(message.clone());
                    let answer = json!({"jsonrpc": "2.0", "id": message["id"], "result": approve()});
                    let mut post = self
                        .client
                        .post(self.s.url("/mcp"))
                        .bearer_auth(ADMIN)
                        .header("accept", "application/json, text/event-stream")
                        .header("mcp-protocol-version", "2025-11-25")
                        .json(&answer);
                    if let Some(session) = session {
                        post = post.header("mcp-session-id", session);
                    }
                    let status = post.send().await.unwrap().status().as_u16();
                    assert_eq!(status, 202, "answering {message}");
                } else if message["id"] == *id && message.get("method").is_none() {
                    return message;
                }
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), response.chunk()).await;
            match chunk.expect("no answer in 30 s").unwrap() {
                Some(bytes) => buffer.push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n")),
                None => panic!("the stream ended without the answer to {id}: {buffer}"),
            }
        }
    }

    /// A stateless (2026-07-28) `tools/call` of `tool` with `params` (arguments and anything
    /// else beside the name), from a client that declares form elicitation when `elicit`.
    fn stateless(&self, route: Route, elicit: bool, tool: &str, params: Value) -> Value {
        let capabilities = if elicit { json!({"elicitation": {"form": {}}}) } else { json!({}) };
        let mut meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": capabilities});
        if let Route::Rmcp = route {
            meta["io.example/trace"] = json!("once");
        }
        let mut params = params;
        params["name"] = json!(tool);
        params["_meta"] = meta;
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
        let headers = [("mcp-protocol-version", "2026-07-28"), ("mcp-method", "tools/call"), ("mcp-name", tool)];
        let mut asked = Vec::new();
        let reply = self.post_mcp(&headers, &body, None, &mut asked);
        assert!(asked.is_empty(), "a stateless request gets no request of the server's: {asked:?}");
        reply
    }

    /// Opens a 2025-11-25 session, declaring form elicitation when `elicit`; its id.
    fn session(&self, elicit: bool) -> String {
        let capabilities = if elicit { json!({"elicitation": {"form": {}}}) } else { json!({}) };
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": capabilities,
            "clientInfo": {"name": "calls-once", "version": "1"}}});
        let (session, reply) = self.runtime.block_on(async {
            let response = self
                .client
                .post(self.s.url("/mcp"))
                .bearer_auth(ADMIN)
                .header("accept", "application/json, text/event-stream")
                .json(&init)
                .send()
                .await
                .unwrap();
            let session = response.headers().get("mcp-session-id").expect("a session id").to_str().unwrap().to_string();
            let reply = self.reply(response, &json!(0), None, &mut Vec::new()).await;
            (session, reply)
        });
        assert!(reply["result"]["protocolVersion"].is_string(), "{reply}");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let status = self.runtime.block_on(async {
            let response = self
                .client
                .post(self.s.url("/mcp"))
                .bearer_auth(ADMIN)
                .header("accept", "application/json, text/event-stream")
                .header("mcp-session-id", &session)
                .header("mcp-protocol-version", "2025-11-25")
                .json(&initialized)
                .send()
                .await
                .unwrap();
            response.status().as_u16()
        });
        assert_eq!(status, 202);
        session
    }

    /// A `tools/call` on a session: the answer, and the elicitation requests answered meanwhile.
    fn session_call(&self, session: &str, id: u64, tool: &str, arguments: Value) -> (Value, Vec<Value>) {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}});
        let headers = [("mcp-session-id", session), ("mcp-protocol-version", "2025-11-25")];
        let mut asked = Vec::new();
        let reply = self.post_mcp(&headers, &body, Some(session), &mut asked);
        (reply, asked)
    }
}

/// An entry's place in the log (unique across the processes that write it).
fn seq(entry: &Value) -> i64 {
    entry["seq"].as_i64().unwrap_or_else(|| panic!("an entry without seq: {entry}"))
}

/// One entry as a failure message shows it.
fn summary(entry: &Value) -> String {
    let message = entry["message"].as_str().unwrap_or_default();
    let message: String = message.chars().take(90).collect();
    format!("via {} outcome {} {message}", entry["via"], entry["outcome"])
}

/// `ctx serve mcp --stdio` in the probe's workspace, spoken to line by line.
struct StdioClient {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    next_id: u64,
}

impl StdioClient {
    /// Starts the server and initializes, declaring form elicitation when `elicit`.
    fn start(p: &Probe, elicit: bool) -> StdioClient {
        let mut child = ctx_in(&p.s.ws, &["serve", "mcp", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ctx serve mcp --stdio");
        let stdin = child.stdin.take().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut io = StdioClient { child, stdin, lines, next_id: 1 };
        let capabilities = if elicit { json!({"elicitation": {"form": {}}}) } else { json!({}) };
        let (reply, _) = io.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": capabilities,
                   "clientInfo": {"name": "calls-once", "version": "1"}}),
        );
        assert!(reply["result"]["protocolVersion"].is_string(), "{reply}");
        io.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        io
    }

    fn send(&mut self, message: &Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a request; its answer, and the elicitation requests answered (with [`approve`])
    /// before it.
    fn request(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut asked = Vec::new();
        loop {
            let line = self.lines.recv_timeout(Duration::from_secs(30)).expect("no answer over stdio in 30 s");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["method"] == "elicitation/create" {
                asked.push(message.clone());
                self.send(&json!({"jsonrpc": "2.0", "id": message["id"], "result": approve()}));
            } else if message["id"] == id && message.get("method").is_none() {
                return (message, asked);
            }
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> (Value, Vec<Value>) {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    /// Lets the call log catch up with this server's calls: a `sources` call over stdio (this
    /// process's log writer, in order behind the earlier calls), waited for.
    fn settle(&mut self, p: &Probe) {
        let seen = p.entries("sources").len();
        let (reply, _) = self.call("sources", json!({}));
        assert_eq!(reply["result"]["isError"], false, "the marker call: {reply}");
        p.wait_for_marker(seen);
    }
}

impl Drop for StdioClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(reply: &Value) -> String {
    reply["result"]["content"][0]["text"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_stateless_call_is_logged_and_counted_once_on_the_direct_route_and_through_rmcp() {
    let p = Probe::start();
    for route in [Route::Direct, Route::Rmcp] {
        let before = p.before("echo", true);
        let reply = p.stateless(route, false, "echo", json!({"arguments": {"message": "once"}}));
        assert_eq!(reply["result"]["isError"], false, "{route:?}: {reply}");
        p.settle();
        p.assert_once(&format!("2026-07-28 stateless, {route:?}"), &before, "ok");
    }
}

#[test]
fn a_session_call_is_logged_and_counted_once() {
    let p = Probe::start();
    let session = p.session(false);
    let before = p.before("echo", true);
    let (reply, _) = p.session_call(&session, 1, "echo", json!({"message": "once"}));
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    p.settle();
    p.assert_once("2025-11-25 session", &before, "ok");
}

/// Stdio has no `/metrics` (its server is its own process with no HTTP): the call log is the
/// witness there, and it is written at the same place the metrics are counted.
#[test]
fn a_stdio_call_is_logged_once() {
    let p = Probe::start();
    let mut io = StdioClient::start(&p, false);
    let before = p.before("echo", false);
    let (reply, _) = io.call("echo", json!({"message": "once"}));
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    io.settle(&p);
    p.assert_once("stdio", &before, "ok");
}

/// The client is asked with a request of ctx's own on the call's stream and approves: the one
/// `tools/call` runs the tool once, and is one entry (`ok`) and one count. The decision itself
/// is recorded with the approval (`decided_by: mcp elicitation`), not as a second call.
#[test]
fn a_session_call_approved_through_elicitation_is_logged_and_counted_once() {
    let p = Probe::start();
    let session = p.session(true);
    let before = p.before("deploy", true);
    let (reply, asked) = p.session_call(&session, 1, "deploy", json!({"message": "approved"}));
    assert_eq!(asked.len(), 1, "the client was asked once: {asked:?}");
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    assert!(text(&reply).contains("deployed approved"), "{reply}");
    p.settle();
    p.assert_once("2025-11-25 session, approved through elicitation", &before, "ok");
}

/// As over a session: asked on stdin/stdout, approved, one entry.
#[test]
fn a_stdio_call_approved_through_elicitation_is_logged_once() {
    let p = Probe::start();
    let mut io = StdioClient::start(&p, true);
    let before = p.before("deploy", false);
    let (reply, asked) = io.call("deploy", json!({"message": "approved"}));
    assert_eq!(asked.len(), 1, "the client was asked once: {asked:?}");
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    assert!(text(&reply).contains("deployed approved"), "{reply}");
    io.settle(&p);
    p.assert_once("stdio, approved through elicitation", &before, "ok");
}

/// 2026-07-28: the client asks, gets an input-required result (nothing ran), and calls again
/// with its answer and the request state (this runs the tool). These are two MCP requests, so
/// two entries and two counts, each request exactly one: the question as `approval_required`,
/// the approved call as `ok`.
fn stateless_approval_is_logged_once_per_request(route: Route) {
    let p = Probe::start();
    let before = p.before("deploy", true);
    let asked = p.stateless(route, true, "deploy", json!({"arguments": {"message": "approved"}}));
    assert_eq!(asked["result"]["resultType"], "input_required", "{route:?}: {asked}");
    let state = asked["result"]["requestState"].as_str().expect("a request state").to_string();
    assert!(asked["result"]["inputRequests"]["ctx_approval"].is_object(), "{asked}");
    p.settle();
    p.assert_once(&format!("2026-07-28 {route:?}, the request that is asked"), &before, "approval_required");

    let before = p.before("deploy", true);
    let answered = p.stateless(
        route,
        true,
        "deploy",
        json!({"arguments": {"message": "approved"},
               "inputResponses": {"ctx_approval": approve()}, "requestState": state}),
    );
    assert_eq!(answered["result"]["isError"], false, "{route:?}: {answered}");
    assert!(text(&answered).contains("deployed approved"), "{answered}");
    p.settle();
    p.assert_once(&format!("2026-07-28 {route:?}, the request that answers"), &before, "ok");
}

#[test]
fn a_stateless_call_approved_through_input_required_is_logged_once_per_request_through_rmcp() {
    stateless_approval_is_logged_once_per_request(Route::Rmcp);
}

/// The first request has only plain `_meta`, so the direct route takes it, finds that it needs
/// approval and that the client can be asked, and leaves the question to rmcp.
#[test]
fn a_stateless_call_approved_through_input_required_is_logged_once_per_request_on_the_direct_route() {
    stateless_approval_is_logged_once_per_request(Route::Direct);
}

/// A client that declares no elicitation gets the pending approval back, in every era; the
/// request is one entry and one count, `approval_required`.
#[test]
fn a_call_whose_client_cannot_be_asked_is_logged_once_as_waiting_for_approval_in_every_era() {
    let p = Probe::start();
    let pending = |what: &str, reply: &Value| {
        assert_eq!(reply["result"]["isError"], true, "{what}: {reply}");
        assert!(reply["result"]["structuredContent"]["approval"]["id"].is_string(), "{what}: {reply}");
    };
    for route in [Route::Direct, Route::Rmcp] {
        let before = p.before("deploy", true);
        let reply = p.stateless(route, false, "deploy", json!({"arguments": {"message": "later"}}));
        pending(&format!("{route:?}"), &reply);
        p.settle();
        p.assert_once(&format!("2026-07-28 {route:?}, not asked"), &before, "approval_required");
    }
    let session = p.session(false);
    let before = p.before("deploy", true);
    let (reply, asked) = p.session_call(&session, 1, "deploy", json!({"message": "later"}));
    assert!(asked.is_empty(), "{asked:?}");
    pending("session", &reply);
    p.settle();
    p.assert_once("2025-11-25 session, not asked", &before, "approval_required");

    let mut io = StdioClient::start(&p, false);
    let before = p.before("deploy", false);
    let (reply, asked) = io.call("deploy", json!({"message": "later"}));
    assert!(asked.is_empty(), "{asked:?}");
    pending("stdio", &reply);
    io.settle(&p);
    p.assert_once("stdio, not asked", &before, "approval_required");
}

/// Over its rate the call is refused (an error result saying when to retry): one entry and one
/// count, `rate_limited`, in every era.
#[test]
fn a_rate_limited_call_is_logged_once_in_every_era() {
    let p = Probe::start();
    // The day's one call, over REST (the same unscoped caller's bucket).
    assert_eq!(p.s.post("/tools/limited", Some(ADMIN), json!({"message": "first"})).0, 200);
    let refused = |what: &str, reply: &Value| {
        assert_eq!(reply["result"]["isError"], true, "{what}: {reply}");
        assert!(text(reply).contains("retry in"), "{what}: {reply}");
    };
    for route in [Route::Direct, Route::Rmcp] {
        let before = p.before("limited", true);
        let reply = p.stateless(route, false, "limited", json!({"arguments": {"message": "again"}}));
        refused(&format!("{route:?}"), &reply);
        p.settle();
        p.assert_once(&format!("2026-07-28 {route:?}, rate-limited"), &before, "rate_limited");
    }
    let session = p.session(false);
    let before = p.before("limited", true);
    let (reply, _) = p.session_call(&session, 1, "limited", json!({"message": "again"}));
    refused("session", &reply);
    p.settle();
    p.assert_once("2025-11-25 session, rate-limited", &before, "rate_limited");

    // The stdio server is its own process with its own buckets: its first call is the day's one.
    let mut io = StdioClient::start(&p, false);
    let (reply, _) = io.call("limited", json!({"message": "first"}));
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    let before = p.before("limited", false);
    let (reply, _) = io.call("limited", json!({"message": "again"}));
    refused("stdio", &reply);
    io.settle(&p);
    p.assert_once("stdio, rate-limited", &before, "rate_limited");
}

/// Arguments that do not fit the tool's schema are a protocol error (-32602) and nothing runs:
/// one entry and one count, `bad_request`, whichever way the request came.
fn invalid_arguments_are_logged_once(route: Route) {
    let p = Probe::start();
    let before = p.before("echo", true);
    let reply = p.stateless(route, false, "echo", json!({"arguments": {"message": 5}}));
    assert_eq!(reply["error"]["code"], -32602, "{route:?}: {reply}");
    p.settle();
    p.assert_once(&format!("2026-07-28 {route:?}, invalid arguments"), &before, "bad_request");
}

#[test]
fn a_stateless_call_with_invalid_arguments_is_logged_once_through_rmcp() {
    invalid_arguments_are_logged_once(Route::Rmcp);
}

/// The direct route has made the call (and found the arguments invalid) before it hands the
/// request to rmcp for the error in rmcp's words.
#[test]
fn a_stateless_call_with_invalid_arguments_is_logged_once_on_the_direct_route() {
    invalid_arguments_are_logged_once(Route::Direct);
}

/// The approval question the direct route answers with is the one rmcp answers with: the same
/// result, bar the request state (it carries each request's own token). The second request
/// joins the first one's pending approval, so its id and expiry are the same.
#[test]
fn the_direct_route_asks_for_approval_exactly_as_rmcp_does() {
    let p = Probe::start();
    let ask = |route| {
        let mut reply = p.stateless(route, true, "deploy", json!({"arguments": {"message": "same question"}}));
        assert_eq!(reply["result"]["resultType"], "input_required", "{route:?}: {reply}");
        let state = reply["result"]["requestState"].take();
        assert!(state.as_str().is_some_and(|s| s.contains('.')), "{route:?}: a token and its MAC: {state}");
        reply
    };
    let direct = ask(Route::Direct);
    let rmcp = ask(Route::Rmcp);
    assert_eq!(direct, rmcp, "the same question both ways");
}
