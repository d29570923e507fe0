//! The gateway end to end: the real `ctx` binary with real upstream MCP servers (the
//! fault-injecting one of our own, `tests/upstream/fault.rs`), over REST and over MCP on stdio
//! with a raw JSON-RPC client, so every notification is seen as the client gets it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{ServeChild, Workspace, BIN};

/// The fault-injecting upstream (built on first use).
pub fn fault_bin() -> PathBuf {
    crate::fault_upstream::binary()
}

/// A `[mcp.servers.<name>]` section running the fault upstream with `args`.
pub fn fault_section(name: &str, args: &[&str], extra: &str) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!(
        "[mcp.servers.{name:?}]\ncommand = {:?}\nargs = [{}]\n{extra}\n",
        fault_bin().display().to_string(),
        args.join(", ")
    )
}

/// `ctx serve` on 127.0.0.1:0 with a REST client.
pub(crate) struct Served {
    pub(crate) ws: Workspace,
    pub(crate) serve: ServeChild,
    pub(crate) runtime: tokio::runtime::Runtime,
    pub(crate) client: reqwest::Client,
}

pub(crate) fn serve(ws: Workspace, env: &[(&str, &str)]) -> Served {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut command = Command::new(BIN);
    command.current_dir(ws.path()).args(["serve", "--bind", "127.0.0.1:0"]).env_remove("CTX_LOG");
    for (k, v) in env {
        command.env(k, v);
    }
    let serve = ServeChild::spawn(&mut command);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    Served { ws, serve, runtime, client: reqwest::Client::new() }
}

impl Served {
    pub(crate) fn get(&self, path: &str) -> (u16, Value) {
        let url = format!("http://{}{path}", self.serve.addr);
        self.runtime.block_on(async {
            let response = self.client.get(url).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        })
    }

    pub(crate) fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let url = format!("http://{}{path}", self.serve.addr);
        self.runtime.block_on(async {
            let response = self.client.post(url).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        })
    }

    pub(crate) fn upstream(&self, name: &str) -> Value {
        let (_, health) = self.get("/health");
        health["upstreams"].as_array().into_iter().flatten().find(|u| u["name"] == name).cloned().unwrap_or(Value::Null)
    }

    /// Waits until `/health` shows `name` in a state `want` accepts; panics with the log after `limit`.
    pub(crate) fn wait(&self, name: &str, limit: Duration, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let row = self.upstream(name);
            if want(&row) {
                return row;
            }
            assert!(
                Instant::now() < deadline,
                "upstream {name} never got there: {row}\nlog:\n{}",
                self.serve.stderr.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `name` is ready and its tools are swapped into the listing (the swap follows
    /// the state change).
    pub(crate) fn ready(&self, name: &str) -> Value {
        let row = self.connected(name);
        let prefix: String =
            format!("{name}__").chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (_, list) = self.get("/tools/list");
            let names = list["tools"].as_array().cloned().unwrap_or_default();
            if names.iter().any(|t| t["name"].as_str().is_some_and(|n| n.starts_with(&prefix))) {
                return row;
            }
            assert!(Instant::now() < deadline, "{name} is ready but none of its tools is listed: {list}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `name` is ready (its tools may not be listed yet).
    pub(crate) fn connected(&self, name: &str) -> Value {
        self.wait(name, Duration::from_secs(30), |u| u["state"] == "ready")
    }

    pub(crate) fn log(&self) -> String {
        self.serve.stderr.lock().unwrap().clone()
    }
}

/// `ctx serve mcp --stdio` driven with raw JSON-RPC lines.
pub(crate) struct McpStdio {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Value>,
    next_id: u64,
}

impl McpStdio {
    pub(crate) fn start(ws: &Workspace) -> McpStdio {
        McpStdio::start_logged(ws).0
    }

    /// Starts it, and collects its log (stderr) as it goes.
    pub(crate) fn start_logged(ws: &Workspace) -> (McpStdio, std::sync::Arc<std::sync::Mutex<String>>) {
        let mut child = Command::new(BIN)
            .current_dir(ws.path())
            .env_remove("CTX_CONFIG")
            .args(["serve", "mcp", "--stdio"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let log = crate::common::collect_stderr(&mut child);
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // stdout carries only protocol: a line that is not JSON fails the test.
                let message: Value =
                    serde_json::from_str(&line).unwrap_or_else(|e| json!({"not_json": line, "error": e.to_string()}));
                if tx.send(message).is_err() {
                    break;
                }
            }
        });
        let mut client = McpStdio { child, stdin, lines, next_id: 1 };
        let (init, _) = client.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "ctx", "{init}");
        client.notify("notifications/initialized", json!({}));
        (client, log)
    }

    fn send(&mut self, message: Value) {
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Sends a request; returns its id.
    fn start_request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// Sends a request and returns its response, with every message that came before it.
    pub(crate) fn request(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        let id = self.start_request(method, params);
        self.until(|m| m["id"] == id && m.get("method").is_none(), Duration::from_secs(30))
    }

    fn until(&mut self, want: impl Fn(&Value) -> bool, limit: Duration) -> (Value, Vec<Value>) {
        let deadline = Instant::now() + limit;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message =
                self.lines.recv_timeout(left).unwrap_or_else(|_| panic!("nothing wanted in time; saw {before:?}"));
            assert!(message.get("not_json").is_none(), "stdout carried a non-protocol line: {message}");
            if want(&message) {
                return (message, before);
            }
            before.push(message);
        }
    }

    /// Lists every tool (following cursors).
    pub(crate) fn tools(&mut self) -> Vec<Value> {
        let mut all = Vec::new();
        let mut cursor: Option<Value> = None;
        loop {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let (page, _) = self.request("tools/list", params);
            all.extend(page["result"]["tools"].as_array().cloned().unwrap_or_default());
            match page["result"].get("nextCursor") {
                Some(c) if !c.is_null() => cursor = Some(c.clone()),
                _ => return all,
            }
        }
    }

    /// Waits until `tools/list` has `name` (the upstream connects in the background).
    pub(crate) fn wait_tool(&mut self, name: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(tool) = self.tools().into_iter().find(|t| t["name"] == name) {
                return tool;
            }
            assert!(Instant::now() < deadline, "tool {name} never listed");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for McpStdio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

/// Whether process `pid` still runs (a zombie counts as gone: it has exited).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or_default().trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

fn wait_gone(pids: &[u32], limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn upstream_tools_are_listed_and_called_on_rest_mcp_openapi_and_cli() {
    let ws = Workspace::new(&fault_section("fault", &[], ""));
    let served = serve(ws, &[]);
    let row = served.ready("fault");
    assert_eq!(row["transport"], "stdio");
    assert!(row["tools"].as_u64().unwrap() >= 10, "{row}");
    assert!(row["pid"].as_u64().is_some(), "{row}");

    // REST: listed with the upstream's own schema, called through the one call path.
    let (status, list) = served.get("/tools/list");
    assert_eq!(status, 200);
    let echo = list["tools"].as_array().unwrap().iter().find(|t| t["name"] == "fault__echo").cloned().unwrap();
    assert_eq!(echo["parameters"]["properties"]["text"]["type"], "string", "{echo}");
    assert_eq!(echo["builtin"], false);
    let (status, body) = served.post("/tools/fault__echo", json!({"text": "hi"}));
    assert_eq!((status, &body), (200, &json!({"result": {"text": "hi"}})));
    // Validation against the upstream's schema happens in ctx, with the field named.
    let (status, body) = served.post("/tools/fault__echo", json!({"text": 5}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["details"][0]["path"], "/text", "{body}");
    // A handled failure of the upstream (isError) reads like a script's handled error.
    let (status, body) = served.post("/tools/fault__fail", json!({"message": "nope"}));
    assert_eq!((status, &body), (200, &json!({"result": {"error": "nope"}})));
    // The OpenAPI document has an operation for it.
    let (_, doc) = served.get("/openapi.json");
    assert!(doc["paths"]["/tools/fault__echo"]["post"].is_object(), "{}", doc["paths"]);
    // `ctx mcp list` asks the running server.
    let config_path = served.ws.path().join("ctx.toml");
    let addr = served.serve.addr.clone();
    let toml = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, format!("[server]\nbind = {addr:?}\n\n{toml}")).unwrap();
    let listed = served.ws.ctx(&["mcp", "list", "--json"]);
    let listed = listed.json();
    assert_eq!(listed["source"], "running", "{listed}");
    assert_eq!(listed["upstreams"][0]["state"], "ready", "{listed}");
}

#[test]
fn cli_lists_tests_and_calls_upstream_tools() {
    let ws = Workspace::new(&fault_section("fault", &[], ""));
    let list = ws.ctx(&["tool", "list"]);
    assert!(list.ok().contains("fault__echo  (upstream fault)"), "{}", list.stdout());
    let call = ws.ctx(&["tool", "call", "fault__add", "--param", "a=2", "--param", "b=3", "--json"]);
    assert_eq!(call.json(), json!({"result": {"sum": 5.0}}), "{}", call.stderr());
    let test = ws.ctx(&["mcp", "test", "fault"]);
    assert!(test.ok().contains("fault__progress"), "{}", test.stdout());
    let test = ws.ctx(&["mcp", "test", "fault", "--call", "echo", "--param", "text=yo", "--json"]);
    assert_eq!(test.json(), json!({"result": {"text": "yo"}}), "{}", test.stderr());
    // No server runs at server.bind: `ctx mcp list` connects once and reports.
    let listed = ws.ctx(&["mcp", "list", "--json"]).json();
    assert_eq!(listed["source"], "configured", "{listed}");
    assert_eq!(listed["upstreams"][0]["state"], "ready", "{listed}");
    assert!(listed["upstreams"][0]["tools"].as_u64().unwrap() >= 10, "{listed}");
    let human = ws.ctx(&["mcp", "list"]);
    assert!(human.ok().contains("fault  ready  (stdio"), "{}", human.stdout());
    let unknown = ws.ctx(&["mcp", "test", "nope"]);
    assert_eq!(unknown.code(), 2);
    assert!(unknown.stderr().contains("no upstream MCP server 'nope'"), "{}", unknown.stderr());
}

#[test]
fn down_at_start_never_stops_ctx_and_calls_fail_at_once() {
    let config =
        format!("{}{}", fault_section("good", &[], ""), fault_section("bad", &["--exit-at-start"], "timeout = 600"));
    let served = serve(Workspace::new(&config), &[]);
    served.ready("good");
    let bad = served.wait("bad", Duration::from_secs(30), |u| u["attempt"].as_u64().unwrap_or(0) >= 2);
    assert!(["restarting", "crash-looping"].contains(&bad["state"].as_str().unwrap()), "{bad}");
    assert!(bad["last_error"].as_str().is_some_and(|e| !e.is_empty()), "{bad}");
    // The rest of ctx serves.
    let (status, _) = served.post("/tools/fault__echo", json!({"text": "x"}));
    assert_eq!(status, 404);
    let (status, body) = served.post("/tools/good__echo", json!({"text": "x"}));
    assert_eq!(status, 200, "{body}");
    // A call to the down server's tool fails at once (its timeout is 600 s) and says why.
    let started = Instant::now();
    let (status, body) = served.post("/tools/bad__echo", json!({"text": "x"}));
    assert!(started.elapsed() < Duration::from_secs(60), "it waited");
    assert_eq!(status, 503, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("'bad'") && message.contains("attempt"), "{message}");
}

#[test]
fn required_server_that_cannot_start_stops_serve_with_its_error() {
    let ws = Workspace::new(&fault_section("must", &["--exit-at-start"], "required = true"));
    let run = ws.ctx(&["serve", "--bind", "127.0.0.1:0"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(run.stderr().contains("must"), "{}", run.stderr());
}

#[test]
fn crash_restart_list_changed_progress_and_cancel_over_mcp() {
    let dir = tempfile::tempdir().unwrap();
    let (starts, log) = (dir.path().join("starts"), dir.path().join("log"));
    let args = ["--starts", starts.to_str().unwrap(), "--log", log.to_str().unwrap(), "--resources"];
    let ws = Workspace::new(&fault_section("fault", &args, ""));
    let mut mcp = McpStdio::start(&ws);
    let echo = mcp.wait_tool("fault__echo");
    assert!(echo["outputSchema"].is_object(), "the upstream's outputSchema passes through: {echo}");

    // A result passes through whole, structuredContent and all.
    let (result, _) = mcp.request("tools/call", json!({"name": "fault__echo", "arguments": {"text": "hi"}}));
    assert_eq!(result["result"]["structuredContent"], json!({"text": "hi"}), "{result}");
    assert_eq!(result["result"]["content"][0]["text"], "hi");

    // Progress from the upstream reaches the client, with the client's own token.
    let (result, before) = mcp.request(
        "tools/call",
        json!({"name": "fault__progress", "arguments": {"steps": 3}, "_meta": {"progressToken": "p-1"}}),
    );
    let progress: Vec<&Value> = before.iter().filter(|m| m["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 3, "{before:?} {result}");
    assert_eq!(progress[2]["params"]["progressToken"], "p-1");
    assert_eq!(progress[2]["params"]["message"], "step 3");

    // Cancelling a call at ctx cancels it at the upstream.
    let id = mcp.start_request("tools/call", json!({"name": "fault__hang", "arguments": {}}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lines_of(&log).iter().any(|l| l.starts_with("call hang")) {
        assert!(Instant::now() < deadline, "the hang call never reached the upstream");
        std::thread::sleep(Duration::from_millis(20));
    }
    mcp.notify("notifications/cancelled", json!({"requestId": id, "reason": "test"}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lines_of(&log).iter().any(|l| l.starts_with("cancelled")) {
        assert!(Instant::now() < deadline, "the upstream never saw the cancel: {:?}", lines_of(&log));
        std::thread::sleep(Duration::from_millis(20));
    }

    // list_changed from the upstream: relisted, swapped, and told to the connected client.
    let (result, _) = mcp.request("tools/call", json!({"name": "fault__add_tool", "arguments": {"name": "extra"}}));
    assert_ne!(result["result"]["isError"], true, "{result}");
    mcp.until(|m| m["method"] == "notifications/tools/list_changed", Duration::from_secs(10));
    assert!(mcp.tools().iter().any(|t| t["name"] == "fault__extra"));

    // Resources: listed under mcp://<server>/, read back through ctx, and URIs in results rewritten.
    let (resources, _) = mcp.request("resources/list", json!({}));
    let uris: Vec<&str> =
        resources["result"]["resources"].as_array().unwrap().iter().filter_map(|r| r["uri"].as_str()).collect();
    assert!(uris.contains(&"mcp://fault/fault://doc/1"), "{resources}");
    let (read, _) = mcp.request("resources/read", json!({"uri": "mcp://fault/fault://doc/1"}));
    assert_eq!(read["result"]["contents"][0]["text"], "document 1", "{read}");
    assert_eq!(read["result"]["contents"][0]["uri"], "mcp://fault/fault://doc/1");
    let (templates, _) = mcp.request("resources/templates/list", json!({}));
    assert_eq!(
        templates["result"]["resourceTemplates"][0]["uriTemplate"], "mcp://fault/fault://doc/{id}",
        "{templates}"
    );
    let (linked, _) = mcp.request("tools/call", json!({"name": "fault__link", "arguments": {}}));
    let text = linked["result"]["content"].to_string();
    assert!(text.contains("mcp://fault/fault://doc/1") && text.contains("mcp://fault/fault://doc/2"), "{linked}");
    // Prompts sit beside the agents.
    let (prompts, _) = mcp.request("prompts/list", json!({}));
    assert!(prompts["result"]["prompts"].as_array().unwrap().iter().any(|p| p["name"] == "fault__greet"), "{prompts}");
    let (prompt, _) = mcp.request("prompts/get", json!({"name": "fault__greet", "arguments": {"name": "Ada"}}));
    assert_eq!(prompt["result"]["messages"][0]["content"]["text"], "Hello, Ada", "{prompt}");

    // A crash: the call fails, the server restarts with a new process, and tools come back.
    let first = lines_of(&starts);
    assert_eq!(first.len(), 1, "{first:?}");
    let (crashed, _) = mcp.request("tools/call", json!({"name": "fault__crash", "arguments": {}}));
    assert_eq!(crashed["result"]["isError"], true, "{crashed}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (result, _) = mcp.request("tools/call", json!({"name": "fault__echo", "arguments": {"text": "back"}}));
        if result["result"]["structuredContent"] == json!({"text": "back"}) {
            break;
        }
        assert!(Instant::now() < deadline, "never came back: {result}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = lines_of(&starts);
    assert_eq!(after.len(), 2, "{after:?}");
    assert_ne!(after[0], after[1], "a new process");
}

#[test]
fn hang_past_its_timeout_is_a_timeout_and_is_cancelled_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let ws = Workspace::new(&fault_section("fault", &["--log", log.to_str().unwrap()], "timeout = 1"));
    let served = serve(ws, &[]);
    served.ready("fault");
    let (status, body) = served.post("/tools/fault__hang", json!({}));
    assert_eq!(status, 408, "{body}");
    assert_eq!(body["error"]["code"], "timeout");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lines_of(&log).iter().any(|l| l.starts_with("cancelled")) {
        assert!(Instant::now() < deadline, "not cancelled upstream: {:?}", lines_of(&log));
        std::thread::sleep(Duration::from_millis(20));
    }
    // The connection is still good.
    let (status, _) = served.post("/tools/fault__echo", json!({"text": "x"}));
    assert_eq!(status, 200);
}

#[test]
fn ctx_secrets_never_reach_the_child() {
    let section = fault_section("fault", &[], "env = { GIVEN = \"yes\", FROM_VAR = \"${CTX_IT17_EXPANDED}\" }");
    let served = serve(
        Workspace::new(&section),
        &[("CTX_IT17_SECRET", "s3cret"), ("CTX_IT17_EXPANDED", "expanded"), ("AWS_SECRET_ACCESS_KEY", "k")],
    );
    served.ready("fault");
    let value = |name: &str| served.post("/tools/fault__env", json!({"name": name})).1["result"]["value"].clone();
    assert_eq!(value("CTX_IT17_SECRET"), Value::Null);
    assert_eq!(value("AWS_SECRET_ACCESS_KEY"), Value::Null);
    assert_eq!(value("GIVEN"), "yes");
    assert_eq!(value("FROM_VAR"), "expanded");
    assert!(value("PATH").is_string(), "PATH is passed through by default");
}

#[test]
fn name_collisions_are_load_problems_naming_both_sides() {
    let shadow = "tool = { name = \"a_b__echo\", description = \"A Lua tool that holds the name first.\" }\nfunction tool.execute() return \"lua\" end\n";
    let config = format!(
        "{}{}[tools.script.shadow]\npath = \"shadow.lua\"\n",
        fault_section("a.b", &[], ""),
        fault_section("a-b", &[], "")
    );
    let ws = Workspace::new(&config);
    ws.write("shadow.lua", shadow);
    let served = serve(ws, &[]);
    served.ready("a.b");
    served.ready("a-b");
    // The Lua tool keeps its name; the upstream tool that would take it is left out, and says so.
    let (_, body) = served.post("/tools/a_b__echo", json!({}));
    assert_eq!(body, json!({"result": "lua"}));
    let (_, health) = served.get("/health");
    let problems = health["problems"].to_string();
    assert!(problems.contains("tool 'echo' of upstream server 'a.b'") && problems.contains("shadow.lua"), "{problems}");
    // Two servers: `a-b` keeps its own names (a '-' is valid), so only `a.b` collides.
    let (status, _) = served.post("/tools/a-b__echo", json!({"text": "x"}));
    assert_eq!(status, 200);
}

#[test]
fn expose_discover_keeps_tools_out_of_listings_but_callable() {
    let ws = Workspace::new(&fault_section("quiet", &[], "expose = \"discover\""));
    let served = serve(ws, &[]);
    served.connected("quiet");
    // Callable by name once swapped in...
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = served.post("/tools/quiet__echo", json!({"text": "x"}));
        if status == 200 {
            assert_eq!(body, json!({"result": {"text": "x"}}));
            break;
        }
        assert!(Instant::now() < deadline, "never callable: {body}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...and in no flat listing.
    let (_, list) = served.get("/tools/list");
    assert!(!list.to_string().contains("quiet__"), "{list}");
    let (_, doc) = served.get("/openapi.json");
    assert!(!doc["paths"].to_string().contains("quiet__"));
}

#[test]
fn kill_9_of_ctx_leaves_no_child_or_grandchild() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let ws = Workspace::new(&fault_section("fault", &["--grandchild", "--starts", starts.to_str().unwrap()], ""));
    let mut served = serve(ws, &[]);
    served.ready("fault");
    let pids: Vec<u32> = lines_of(&starts)[0].split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "the upstream and its grandchild");
    assert!(pids.iter().all(|&p| alive(p)));
    served.serve.child.kill().unwrap(); // SIGKILL: ctx gets no chance to clean up
    served.serve.child.wait().unwrap();
    let left = wait_gone(&pids, Duration::from_secs(15));
    assert!(left.is_empty(), "still running after ctx was killed: {left:?}");
}

#[test]
fn hot_reload_restarts_only_the_changed_server() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let section_a = fault_section("a", &["--starts", a.to_str().unwrap()], "");
    let section_b = fault_section("b", &["--starts", b.to_str().unwrap()], "");
    let served = serve(Workspace::new(&format!("{section_a}{section_b}")), &[]);
    served.ready("a");
    served.ready("b");
    let changed_b = fault_section("b", &["--starts", b.to_str().unwrap()], "timeout = 7");
    served.ws.write(
        "ctx.toml",
        &format!("{section_a}{changed_b}[mcp.servers.c]\ncommand = {:?}\n", fault_bin().display().to_string()),
    );
    served.ready("c");
    let deadline = Instant::now() + Duration::from_secs(30);
    while lines_of(&b).len() < 2 {
        assert!(Instant::now() < deadline, "b was not restarted: {}", served.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    served.ready("b");
    assert_eq!(lines_of(&a).len(), 1, "a was left alone");
    // Removing a server stops it.
    let pid_c = served.upstream("c")["pid"].as_u64().unwrap() as u32;
    served.ws.write("ctx.toml", &format!("{section_a}{changed_b}"));
    assert!(wait_gone(&[pid_c], Duration::from_secs(15)).is_empty(), "c still runs after its section was removed");
    served.wait("c", Duration::from_secs(15), Value::is_null);
}

#[test]
fn claude_desktop_config_is_imported_as_it_is() {
    let ws = Workspace::new("[mcp]\nimport = \"claude_desktop_config.json\"\n");
    let file = json!({"mcpServers": {"fault": {"command": fault_bin(), "args": [], "env": {"GIVEN": "from claude"}}}});
    ws.write("claude_desktop_config.json", &serde_json::to_string_pretty(&file).unwrap());
    let served = serve(ws, &[]);
    served.ready("fault");
    let (_, body) = served.post("/tools/fault__env", json!({"name": "GIVEN"}));
    assert_eq!(body["result"]["value"], "from claude");
}

#[test]
fn restarts_through_ctx_serve_leave_no_process_behind() {
    // A hundred restarts are counted at the runtime's level with a short backoff
    // (gateway_runtime.rs); here ctx serve's own production backoff applies, so a few crashes,
    // each restarted by the supervisor, and then every earlier process must be gone.
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let ws = Workspace::new(&fault_section("fault", &["--grandchild", "--starts", starts.to_str().unwrap()], ""));
    let served = serve(ws, &[]);
    for round in 0..3 {
        served.ready("fault");
        let (status, body) = served.post("/tools/fault__crash", json!({}));
        // The crash is the upstream's going away mid-call: 503, naming the server.
        assert_eq!((status, &body["error"]["code"]), (503, &json!("unavailable")), "round {round}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("upstream MCP server 'fault' disconnected during the request"), "{body}");
        served.wait("fault", Duration::from_secs(60), |u| u["restarts"].as_u64() == Some(round + 1));
    }
    served.ready("fault");
    let all: Vec<u32> =
        lines_of(&starts).iter().flat_map(|l| l.split_whitespace().map(|p| p.parse::<u32>().unwrap())).collect();
    assert_eq!(all.len(), 8, "4 starts, each with a grandchild");
    let last: Vec<u32> = lines_of(&starts).last().unwrap().split_whitespace().map(|p| p.parse().unwrap()).collect();
    let old: Vec<u32> = all.into_iter().filter(|p| !last.contains(p)).collect();
    let left = wait_gone(&old, Duration::from_secs(15));
    assert!(left.is_empty(), "{} processes of earlier starts still run: {left:?}", left.len());
    assert!(last.iter().all(|&p| alive(p)));
}

#[test]
fn tool_list_names_a_server_that_did_not_connect() {
    let config = format!("{}{}", fault_section("good", &[], ""), fault_section("bad", &["--exit-at-start"], ""));
    let ws = Workspace::new(&config);
    let list = ws.ctx(&["tool", "list"]);
    let out = list.ok();
    assert!(out.contains("good__echo  (upstream good)"), "{out}");
    assert!(out.contains("bad  (broken upstream)") && out.contains("not connected"), "{out}");
    assert!(out.contains("ctx mcp test bad"), "{out}");
}

#[test]
fn mcp_list_and_test_name_a_broken_imported_server() {
    let ws = Workspace::new("[mcp]\nimport = \"claude.json\"\n");
    let file = json!({"mcpServers": {"needs": {"command": "x", "env": {"TOKEN": "${CTX_IT17_NEVER_SET}"}}}});
    ws.write("claude.json", &file.to_string());
    let listed = ws.ctx(&["mcp", "list", "--json"]).json();
    assert_eq!(listed["upstreams"][0]["name"], "needs", "{listed}");
    assert_eq!(listed["upstreams"][0]["state"], "disabled", "{listed}");
    let test = ws.ctx(&["mcp", "test", "needs"]);
    assert_eq!(test.code(), 2);
    assert!(test.stderr().contains("CTX_IT17_NEVER_SET") && test.stderr().contains("claude.json"), "{}", test.stderr());
}
