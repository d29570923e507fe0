//! MCP: in-process protocol tests (raw JSON-RPC over `tokio::io::duplex`, so the wire shapes are
//! exactly what a client sees), then the official clients and the conformance suite against the
//! real `ctx serve` binary.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctx::mcp::Mcp;
use ctx::tools::Tools;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::common::{repo, run_ok, test_python, BIN};
use crate::tools::{fixture, shipped};

const TOML: &str = r#"
[tools.script.echo]
path = "tools/echo.lua"
greeting = "hello"

[tools.script.fails]
path = "tools/fails.lua"

[tools.script.blocks]
path = "tools/blocks.lua"

[tools.script.steps]
path = "tools/steps.lua"

[tools.script.poller]
path = "tools/poller.lua"
timeout = 30
allow_hosts = ["127.0.0.1"]
"#;

const FAILS: &str = r#"
tool = { name = "fails", description = "Fails on purpose." }
function tool.execute() error("the backend said no") end
"#;

const BLOCKS: &str = r#"
tool = { name = "blocks", description = "Returns MCP content blocks.", annotations = { read_only = true } }
function tool.execute()
  return MCP.content({
    { type = "text", text = "a picture:" },
    { type = "image", data = "iVBORw0KGgo=", mimeType = "image/png" },
    { type = "resource", resource = { uri = "test://doc", mimeType = "text/plain", text = "inline" } },
  })
end
"#;

const STEPS: &str = r#"
tool = { name = "steps", description = "Reports progress three times.", annotations = { destructive = true, open_world = true } }
function tool.execute()
  for i = 1, 3 do progress(i, 3, "step " .. i) end
  return "done"
end
"#;

/// Calls the stub every 50 ms until stopped: the stub's request log shows whether it still runs.
const POLLER: &str = r#"
tool = { name = "poller", description = "Polls a URL until cancelled.", parameters = { { name = "url", type = "string", required = true } } }
function tool.execute(params)
  while true do http.get(params.url) sleep(0.05) end
end
"#;

/// A raw JSON-RPC client on one end of a duplex pipe, the MCP server on the other.
struct Raw {
    runtime: tokio::runtime::Runtime,
    writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    tools: Arc<Tools>,
    mcp: Mcp,
    _dir: tempfile::TempDir,
}

fn connect(page_size: usize) -> Raw {
    let scripts = [
        ("echo.lua", shipped("echo.lua")),
        ("fails.lua", FAILS.to_string()),
        ("blocks.lua", BLOCKS.to_string()),
        ("steps.lua", STEPS.to_string()),
        ("poller.lua", POLLER.to_string()),
    ];
    let scripts: Vec<(&str, &str)> = scripts.iter().map(|(n, s)| (*n, s.as_str())).collect();
    let (dir, registry) = fixture(TOML, &scripts).into_parts();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let tools = Arc::new(Tools::new(registry));
    let mcp = Mcp::with_page_size(Arc::clone(&tools), page_size);
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    let handler = mcp.clone();
    runtime.spawn(async move {
        if let Ok(running) = handler.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let (reader, writer) = tokio::io::split(client_io);
    let lines = tokio::io::BufReader::new(reader).lines();
    let mut raw = Raw { runtime, writer, lines, tools, mcp, _dir: dir };
    let init = raw.request(
        0,
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}),
    );
    assert_eq!(init.0["result"]["serverInfo"]["name"], "ctx", "{init:?}");
    raw.notify("notifications/initialized", json!({}));
    // rmcp handles messages in order: once the ping is answered, `on_initialized` has run and
    // the session is subscribed to list changes.
    let (pong, _) = raw.request(999, "ping", json!({}));
    assert_eq!(pong["result"], json!({}), "{pong}");
    raw
}

impl Raw {
    fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    fn send(&mut self, message: Value) {
        let line = format!("{message}\n");
        self.runtime.block_on(self.writer.write_all(line.as_bytes())).unwrap();
    }

    /// Sends a request and returns its response, with the notifications that came before it.
    fn request(&mut self, id: u64, method: &str, params: Value) -> (Value, Vec<Value>) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.until(|m| m["id"] == id, Duration::from_secs(10))
    }

    fn until(&mut self, want: impl Fn(&Value) -> bool, limit: Duration) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .runtime
                .block_on(async { tokio::time::timeout(left, self.lines.next_line()).await })
                .expect("no answer in time")
                .unwrap()
                .expect("the server closed the stream");
            let message: Value = serde_json::from_str(&line).unwrap();
            if want(&message) {
                return (message, before);
            }
            before.push(message);
        }
    }

    fn call(&mut self, id: u64, name: &str, arguments: Value) -> Value {
        self.request(id, "tools/call", json!({"name": name, "arguments": arguments})).0
    }
}

#[test]
fn tools_list_pages_through_every_tool_with_true_annotations() {
    let mut c = connect(3);
    let mut tools = Vec::new();
    let mut cursor: Option<Value> = None;
    let mut pages = 0;
    loop {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let (page, _) = c.request(10 + pages, "tools/list", params);
        pages += 1;
        tools.extend(page["result"]["tools"].as_array().unwrap().clone());
        match page["result"].get("nextCursor") {
            Some(next) => cursor = Some(next.clone()),
            None => break,
        }
    }
    assert_eq!(pages, 5);
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    let code_mode = ["execute", "list_servers", "list_tools", "describe_tool", "search_tools"];
    assert_eq!(names[3..8], code_mode);
    assert_eq!(
        [&names[..3], &names[8..]].concat(),
        ["search", "get", "sources", "blocks", "echo", "fails", "poller", "steps"]
    );
    // inputSchema is exactly the REST parameter schema.
    let rest = c.tools.current().listing();
    let rest = serde_json::to_value(rest).unwrap();
    for (mcp, rest) in tools.iter().zip(rest["tools"].as_array().unwrap()) {
        assert_eq!(mcp["inputSchema"], rest["parameters"], "{}", mcp["name"]);
    }
    // Built-ins are read-only and closed-world; a script that declares nothing claims nothing.
    assert_eq!(tools[0]["annotations"]["readOnlyHint"], true);
    assert_eq!(tools[0]["annotations"]["openWorldHint"], false);
    assert!(tools[10].get("annotations").is_none(), "fails declares nothing: {}", tools[10]);
    assert_eq!(tools[12]["annotations"], json!({"destructiveHint": true, "openWorldHint": true}));
    let (bad, _) = c.request(20, "tools/list", json!({"cursor": "zzz"}));
    assert_eq!(bad["error"]["code"], -32602);
    insta::assert_json_snapshot!("mcp_tools_list", tools);
}

#[test]
fn tools_call_maps_every_outcome() {
    let mut c = connect(50);
    let mut shapes = serde_json::Map::new();
    let echo = c.call(1, "echo", json!({"message": "hi", "repeat": 2}));
    assert_eq!(echo["result"]["structuredContent"], json!({"greeting": "hello", "message": "hi hi"}));
    assert_eq!(echo["result"]["isError"], false);
    shapes.insert("echo".into(), echo);

    let invalid = c.call(2, "echo", json!({"repeat": "x"}));
    assert_eq!(invalid["error"]["code"], -32602);
    assert_eq!(invalid["error"]["data"]["details"][0]["path"], "/repeat", "{invalid}");
    shapes.insert("invalid_params".into(), invalid);

    let unknown = c.call(3, "nope", json!({}));
    assert_eq!(unknown["error"]["code"], -32602);
    shapes.insert("unknown_tool".into(), unknown);

    let malformed = c.request(4, "tools/call", json!({"arguments": {}})).0;
    assert_eq!(malformed["error"]["code"], -32602, "{malformed}");
    shapes.insert("malformed_call".into(), malformed);

    let failed = c.call(5, "fails", json!({}));
    assert_eq!(failed["result"]["isError"], true);
    assert!(failed["result"]["content"][0]["text"].as_str().unwrap().contains("the backend said no"));
    shapes.insert("tool_error".into(), failed);

    let blocks = c.call(6, "blocks", json!({}));
    let kinds: Vec<&str> =
        blocks["result"]["content"].as_array().unwrap().iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["text", "image", "resource"]);
    shapes.insert("content_blocks".into(), blocks);

    // No `arguments` at all is the same as {}.
    let (no_args, _) = c.request(7, "tools/call", json!({"name": "blocks"}));
    assert_eq!(no_args["result"]["isError"], false);
    insta::assert_json_snapshot!("mcp_call_shapes", shapes);
}

#[test]
fn progress_is_sent_before_the_result_with_the_clients_token() {
    let mut c = connect(50);
    let (result, before) =
        c.request(1, "tools/call", json!({"name": "steps", "arguments": {}, "_meta": {"progressToken": "tok-1"}}));
    assert_eq!(result["result"]["content"][0]["text"], "done");
    let progress: Vec<&Value> = before.iter().filter(|m| m["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 3, "{before:?}");
    assert_eq!(
        progress[2]["params"],
        json!({"progressToken": "tok-1", "progress": 3.0, "total": 3.0, "message": "step 3"})
    );
    // A numeric token comes back as a number; no token, no notifications.
    let (_, before) =
        c.request(2, "tools/call", json!({"name": "steps", "arguments": {}, "_meta": {"progressToken": 7}}));
    assert_eq!(before[0]["params"]["progressToken"], 7);
    let (_, before) = c.request(3, "tools/call", json!({"name": "steps", "arguments": {}}));
    assert!(before.is_empty(), "{before:?}");
}

#[test]
fn each_inner_call_of_a_script_sends_progress_and_the_trace_rides_in_meta() {
    let mut c = connect(50);
    let script = "local a = ctx.echo({message = 'a'}) local b = ctx.echo({message = 'b'}) local r = await_all({a, b}) return {n = #r}";
    let (result, before) = c.request(
        1,
        "tools/call",
        json!({"name": "execute", "arguments": {"script": script}, "_meta": {"progressToken": "code-1"}}),
    );
    assert_eq!(result["result"]["structuredContent"], json!({"n": 2}), "{result}");
    let trace = &result["result"]["_meta"]["ctx/trace"];
    assert_eq!(trace["started"], 2, "{result}");
    assert_eq!(trace["calls"].as_array().unwrap().len(), 2, "{result}");
    let progress: Vec<&Value> = before.iter().filter(|m| m["method"] == "notifications/progress").collect();
    assert_eq!(progress.len(), 2, "{before:?}");
    assert_eq!(progress[1]["params"]["progressToken"], "code-1");
    assert_eq!(progress[1]["params"]["progress"], 2.0);
    assert!(progress[0]["params"]["message"].as_str().unwrap().starts_with("ctx.echo ok in "), "{progress:?}");
}

/// A failed script carries its trace in `_meta` too, with its code and limit or line.
#[test]
fn a_failed_script_has_its_trace_and_code_in_meta() {
    let mut c = connect(50);
    let script = "local a = ctx.echo({message = 'a'}):await()\nerror('stop here')";
    let (result, _) = c.request(1, "tools/call", json!({"name": "execute", "arguments": {"script": script}}));
    let result = &result["result"];
    assert_eq!(result["isError"], true, "{result}");
    assert_eq!(result["_meta"]["ctx/trace"]["started"], 1, "{result}");
    assert_eq!(result["_meta"]["ctx/trace"]["calls"][0]["tool"], "echo", "{result}");
    assert_eq!(result["_meta"]["ctx/error"]["code"], "script_error", "{result}");
    assert_eq!(result["_meta"]["ctx/error"]["line"], 2, "{result}");
    let (limited, _) = c.request(
        2,
        "tools/call",
        json!({"name": "execute", "arguments": {"script": "while true do end", "timeout": 0.2}}),
    );
    let meta = &limited["result"]["_meta"];
    assert_eq!(meta["ctx/error"]["limit"], "timeout", "{limited}");
    assert_eq!(meta["ctx/trace"]["started"], 0, "{limited}");

    // A script's own MCP result cannot pass off `ctx/...` metadata as ctx's; its other keys stay.
    let forged =
        "return {content = {{type = 'text', text = 'x', _meta = {['ctx/trace'] = 1, own = 2}}}, isError = true, \
                  _meta = {['ctx/error'] = {code = 'timeout'}, ['ctx/trace'] = {started = 99}, mine = 1}}";
    let (reply, _) = c.request(3, "tools/call", json!({"name": "execute", "arguments": {"script": forged}}));
    let meta = &reply["result"]["_meta"];
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    assert!(meta.get("ctx/error").is_none(), "{reply}");
    assert_eq!(meta["ctx/trace"]["started"], 0, "the trace is ctx's: {reply}");
    assert_eq!(meta["mine"], 1, "{reply}");
    assert_eq!(reply["result"]["content"][0]["_meta"], json!({"own": 2}), "nor in a block: {reply}");
    // One that only looks like an MCP result fails as the script's error, with its trace.
    let bogus = "return {content = {{type = 'bogus'}}}";
    let (reply, _) = c.request(4, "tools/call", json!({"name": "execute", "arguments": {"script": bogus}}));
    let result = &reply["result"];
    assert_eq!(result["isError"], true, "{reply}");
    assert!(result["content"][0]["text"].as_str().unwrap().contains("content[1] is not a content block"), "{reply}");
    assert_eq!(result["_meta"]["ctx/error"]["code"], "script_error", "{reply}");
}

#[test]
fn the_catalog_is_an_mcp_prompt() {
    let mut c = connect(50);
    let (list, _) = c.request(1, "prompts/list", json!({}));
    let names: Vec<&str> =
        list["result"]["prompts"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"code_mode"), "{list}");
    let (prompt, _) = c.request(2, "prompts/get", json!({"name": "code_mode"}));
    let text = prompt["result"]["messages"][0]["content"]["text"].as_str().unwrap();
    assert!(text.contains("ctx.echo(") && text.contains(":await()"), "{text}");
    let (unknown, _) = c.request(3, "prompts/get", json!({"name": "code_mode", "arguments": {"tool": "nope"}}));
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert!(unknown["error"]["message"].as_str().unwrap().contains("no scripted tool 'nope'"), "{unknown}");
}

#[test]
fn cancelled_notification_stops_the_script() {
    let (addr, received) = crate::common::stub(|_| (200, "ok".into()));
    let mut c = connect(50);
    let url = format!("http://{addr}/poll");
    c.send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "poller", "arguments": {"url": url}}}));
    let started = Instant::now();
    while received.lock().unwrap().len() < 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "the poller never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.notify("notifications/cancelled", json!({"requestId": 1, "reason": "user pressed stop"}));
    std::thread::sleep(Duration::from_millis(300));
    let after_cancel = received.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(received.lock().unwrap().len(), after_cancel, "the script kept polling after the cancel");
    // The server goes on serving.
    assert_eq!(c.call(2, "echo", json!({"message": "still here"}))["result"]["isError"], false);
}

#[test]
fn a_registry_swap_sends_list_changed_and_the_new_tool_is_callable() {
    let mut c = connect(50);
    let dir = c._dir.path().to_path_buf();
    std::fs::write(
        dir.join("tools/added.lua"),
        "tool = { name = \"added\", description = \"New.\" }\nfunction tool.execute() return \"fresh\" end\n",
    )
    .unwrap();
    let section = ctx::config::ScriptSection::from_path(ctx::config::ScriptKind::Tool, &dir.join("tools/added.lua"));
    let registry = ctx::app::with_script(c.tools.current().kb().clone(), &section).unwrap();
    c.tools.replace(registry);
    {
        let _guard = c.runtime.enter();
        c.mcp.tools_changed();
    }
    let (note, _) = c.until(|m| m["method"] == "notifications/tools/list_changed", Duration::from_secs(5));
    assert_eq!(note["method"], "notifications/tools/list_changed");
    let added = c.call(2, "added", json!({}));
    assert_eq!(added["result"]["content"][0]["text"], "fresh", "{added}");
}

/// Serves `c.mcp` over HTTP on a free port; returns the address.
fn serve_http(c: &Raw) -> std::net::SocketAddr {
    let runtime = &c.runtime;
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let local = listener.local_addr().unwrap();
    let security = ctx::server::Security::new(local, None, vec![]).unwrap();
    let app = Arc::new(ctx::server::App::with_mcp(c.mcp.clone(), security, 1 << 20));
    runtime.spawn(ctx::server::run(listener, app, std::future::pending()));
    let _ = rustls::crypto::ring::default_provider().install_default();
    local
}

/// The headers and body of a stateless (2026-07-28) `tools/call` as 2026 clients send them.
fn stateless_request(request: reqwest::RequestBuilder, body: &Value) -> reqwest::RequestBuilder {
    let name = body["params"]["name"].as_str().unwrap_or_default().to_string();
    request
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", name)
        .json(body)
}

/// A stateless (2026-07-28) `tools/call` POST as 2026 clients send it: status, content type and
/// body of the reply.
fn stateless_call(c: &Raw, local: std::net::SocketAddr, body: &Value) -> (u16, String, String) {
    let request = stateless_request(reqwest::Client::new().post(format!("http://{local}/mcp")), body);
    c.runtime.block_on(async move {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let kind = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        (status, kind, response.text().await.unwrap())
    })
}

#[test]
fn the_direct_http_route_answers_exactly_like_rmcp() {
    let c = connect(50);
    let local = serve_http(&c);
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}});
    let cases = [
        (json!(7), "echo", json!({"message": "hi"}), false),
        (json!("call-a"), "echo", json!({"message": "with a string id"}), false),
        (json!(12), "echo", json!({}), true),
        (json!(8), "fails", json!({}), false),
        (json!(9), "blocks", json!({}), false),
        (json!(10), "nosuchtool", json!({}), true),
        (json!(11), "echo", json!({"message": 5}), true),
    ];
    // Every plain call is answered on the direct route, protocol errors included: the call went
    // through the pipeline there, and is never made a second time by rmcp.
    for (id, tool, arguments, protocol_error) in cases {
        let plain = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta}});
        // One more `_meta` key is enough to send the same call through rmcp.
        let mut via_rmcp = plain.clone();
        via_rmcp["params"]["_meta"]["io.example/trace"] = json!("t");
        let before = c.mcp.direct_calls();
        let answered_directly = stateless_call(&c, local, &plain);
        assert_eq!(c.mcp.direct_calls() - before, 1, "{tool} {id}: which route answered");
        let answered_by_rmcp = stateless_call(&c, local, &via_rmcp);
        assert_eq!(c.mcp.direct_calls() - before, 1, "{tool} {id}: rmcp answered the second");
        assert_eq!(answered_directly, answered_by_rmcp, "{tool} {id}: the same status, type and bytes");
        assert_eq!(answered_directly.0, 200, "{tool} {id}");
        let reply: Value = serde_json::from_str(&answered_directly.2).unwrap();
        assert_eq!(reply["id"], id);
        assert_eq!(reply.get("error").is_some(), protocol_error, "{tool}: {reply}");
    }
    // Only a POST is a call: the same headers and body on a PUT are rmcp's to refuse.
    let before = c.mcp.direct_calls();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "hi"}, "_meta": meta}});
    let put = stateless_request(reqwest::Client::new().put(format!("http://{local}/mcp")), &body);
    let status = c.runtime.block_on(async move { put.send().await.unwrap().status().as_u16() });
    assert_eq!((status, c.mcp.direct_calls()), (405, before), "a PUT is not answered directly");
}

#[test]
fn a_closed_http_request_stops_the_script() {
    let (addr, received) = crate::common::stub(|_| (200, "ok".into()));
    let c = connect(50);
    let runtime = &c.runtime;
    let local = serve_http(&c);
    // A stateless (2026-07-28) call: no session, the reply belongs to this request alone.
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "poller", "arguments": {"url": format!("http://{addr}/poll")},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    let request = reqwest::Client::new()
        .post(format!("http://{local}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "poller")
        .json(&body)
        .send();
    let pending = runtime.spawn(request);
    let started = Instant::now();
    while received.lock().unwrap().len() < 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "the poller never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    pending.abort(); // the client hangs up
    std::thread::sleep(Duration::from_millis(300));
    let after_close = received.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(received.lock().unwrap().len(), after_close, "the script kept polling after the client left");
}

// ---------------------------------------------------------------------------------------------
// The real binary with third-party clients.

/// `ctx serve` on port 0 in a copy of `workspace`; killed on drop.
struct Served {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Copies a fixture workspace (and the shipped echo tool) into a temp dir and indexes it.
fn workspace(from: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(from, dir.path());
    std::fs::create_dir_all(dir.path().join("tools")).unwrap();
    std::fs::write(dir.path().join("tools/echo.lua"), shipped("echo.lua")).unwrap();
    run_ok(Command::new(BIN).arg("--config").arg(dir.path().join("ctx.toml")).args(["-q", "sync"]));
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

fn serve(from: &Path) -> Served {
    let dir = workspace(from);
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(dir.path().join("ctx.toml"))
        .args(["serve", "--bind", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let addr = crate::common::listening_address(&mut child).unwrap_or_else(|line| panic!("no address in {line:?}"));
    Served { child, url: format!("http://{addr}/mcp"), dir }
}

fn node() -> Option<(std::path::PathBuf, String)> {
    test_python()?;
    let node = std::env::var_os("CTX_TEST_NODE").expect("scripts/test-env sets CTX_TEST_NODE");
    let modules = std::env::var("CTX_TEST_NODE_MODULES").expect("scripts/test-env sets CTX_TEST_NODE_MODULES");
    Some((node.into(), modules))
}

fn mcp_workspace() -> std::path::PathBuf {
    repo().join("tests/clients/mcp_workspace")
}

#[test]
fn python_sdk_over_streamable_http() {
    let Some(python) = test_python() else { return };
    let served = serve(&mcp_workspace());
    let out = run_ok(
        Command::new(python)
            .arg(repo().join("tests/clients/mcp_client.py"))
            .arg("--workdir")
            .arg(served.dir.path())
            .args(["--http", &served.url]),
    );
    for check in [
        "tools/list (",
        "invalid arguments -> -32602 with data",
        "timeout -> isError",
        "progress (",
        "tools/list_changed",
        "2026 era call echo",
    ] {
        assert!(out.contains(&format!("ok: {check}")), "missing {check:?}:\n{out}");
    }
}

#[test]
fn python_sdk_over_stdio() {
    let Some(python) = test_python() else { return };
    let dir = workspace(&mcp_workspace());
    let config = dir.path().join("ctx.toml");
    let out = run_ok(
        Command::new(python)
            .arg(repo().join("tests/clients/mcp_client.py"))
            .arg("--workdir")
            .arg(dir.path())
            .args(["--stdio", "--", BIN, "--config"])
            .arg(&config)
            .args(["serve", "mcp", "--stdio"]),
    );
    for check in ["initialize", "unknown tool -> -32602", "script error -> isError", "tools/list_changed", "call added"]
    {
        assert!(out.contains(&format!("ok: {check}")), "missing {check:?}:\n{out}");
    }
}

#[test]
fn typescript_sdk_over_streamable_http() {
    let Some((node, modules)) = node() else { return };
    let served = serve(&mcp_workspace());
    let out = run_ok(
        Command::new(node)
            .arg(repo().join("tests/clients/mcp_ts_client.mjs"))
            .arg(&served.url)
            .env("CTX_TEST_NODE_MODULES", modules),
    );
    assert!(out.contains("ok:"), "{out}");
}

/// The official conformance suite, both versions; the summary lands in target/conformance. Each
/// version's pass count must equal its list in tests/conformance/must-pass.txt (run.sh also
/// fails when a listed scenario does not pass), so a count that falls, even to 0, fails here.
#[test]
fn conformance_suite_passes_every_applicable_scenario() {
    let Some((node, _)) = node() else { return };
    let served = serve(&repo().join("tests/conformance"));
    let results = repo().join("target/conformance");
    let _ = std::fs::remove_dir_all(&results);
    let nodebin = node.parent().unwrap().to_path_buf();
    let path = format!("{}:{}", nodebin.display(), std::env::var("PATH").unwrap_or_default());
    let out = run_ok(
        Command::new("bash")
            .arg(repo().join("tests/conformance/run.sh"))
            .args(["--with-2026", "--strict-baseline"])
            .arg(&served.url)
            .arg(&results)
            .env("PATH", path),
    );
    let summary: Vec<&str> = out.lines().filter(|l| l.starts_with("conformance ")).collect();
    assert_eq!(summary.len(), 3, "{out}");
    let must_pass = must_pass_lists();
    for line in &summary {
        let (label, counts) = line.split_once(": ").unwrap_or_else(|| panic!("{line}"));
        let passed: usize =
            counts.split(" passed").next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"));
        let listed = must_pass.get(label).unwrap_or_else(|| panic!("no [{label}] in tests/conformance/must-pass.txt"));
        assert!(passed > 0 && passed == listed.len(), "{line}: must-pass.txt lists {}\n{out}", listed.len());
        assert!(line.contains(" 0 failed"), "{line}\n{out}");
    }
    std::fs::write(results.join("summary.txt"), summary.join("\n") + "\n").unwrap();
}

/// `tests/conformance/must-pass.txt`: the scenarios each summary line (by label) must pass.
fn must_pass_lists() -> std::collections::BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(repo().join("tests/conformance/must-pass.txt")).unwrap();
    let mut lists = std::collections::BTreeMap::<String, Vec<String>>::new();
    let mut current = None;
    for line in text.lines().map(|l| l.split('#').next().unwrap_or_default().trim()).filter(|l| !l.is_empty()) {
        if let Some(label) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = Some(label.to_string());
            lists.entry(label.to_string()).or_default();
        } else if let Some(label) = &current {
            lists.get_mut(label).unwrap().push(line.to_string());
        }
    }
    lists
}

/// The "Last run" figures of `docs/mcp.md` are the checked-in pass counts, and no list is empty
/// or repeats a scenario. This runs without Node, so a bare `cargo test` sees an edited list too.
#[test]
fn the_conformance_pass_counts_are_pinned() {
    let lists = must_pass_lists();
    assert_eq!(lists.len(), 3, "one list per summary line of run.sh: {:?}", lists.keys());
    let page = std::fs::read_to_string(repo().join("docs/mcp.md")).unwrap();
    for (label, list) in &lists {
        assert!(!list.is_empty(), "[{label}] is empty");
        let unique: std::collections::BTreeSet<&String> = list.iter().collect();
        assert_eq!(unique.len(), list.len(), "[{label}] lists a scenario twice");
        let figure = format!("`{label}: {} passed, 0 failed", list.len());
        assert!(page.contains(&figure), "docs/mcp.md should quote {figure}` (the must-pass list of that run)");
    }
}

/// Runs `tests/conformance/summarize.mjs` on a crafted run: one scenario per `(name, statuses of
/// its checks)`, under the label `t`, with `must_pass` as that label's list. Exit code and output.
fn summarize(scenarios: &[(&str, &[&str])], must_pass: &[&str]) -> Option<(i32, String)> {
    let node = crate::common::test_command("CTX_TEST_NODE")?;
    let dir = tempfile::tempdir().unwrap();
    for (name, statuses) in scenarios {
        let run = dir.path().join(format!("results/server-{name}-2026-01-01T00-00-00-000Z"));
        std::fs::create_dir_all(&run).unwrap();
        let checks: Vec<Value> =
            statuses.iter().enumerate().map(|(i, s)| json!({"id": format!("check-{i}"), "status": s})).collect();
        std::fs::write(run.join("checks.json"), serde_json::to_vec(&checks).unwrap()).unwrap();
    }
    std::fs::write(dir.path().join("must-pass.txt"), format!("[t]\n{}\n", must_pass.join("\n"))).unwrap();
    let output = Command::new(&node[0])
        .args(&node[1..])
        .arg(repo().join("tests/conformance/summarize.mjs"))
        .args(["--label", "t", "--results"])
        .arg(dir.path().join("results"))
        .arg("--log")
        .arg(dir.path().join("suite.log"))
        .arg("--must-pass")
        .arg(dir.path().join("must-pass.txt"))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    Some((output.status.code().unwrap_or(-1), text))
}

/// A scenario whose checks were all skipped or informational proved nothing: named in the
/// must-pass list, it fails the run; not named, it is not applicable rather than passed.
#[test]
fn a_must_pass_scenario_with_only_skipped_checks_fails_the_summary() {
    let Some((code, out)) =
        summarize(&[("ping", &["SUCCESS"]), ("tools-list", &["SKIPPED", "INFO"])], &["ping", "tools-list"])
    else {
        return;
    };
    assert_eq!(code, 1, "{out}");
    assert!(out.starts_with("t: 1 passed, 1 failed, 0 not applicable\n"), "{out}");
    assert!(out.contains("✗ tools-list: only SKIPPED/INFO checks, but it must pass (must-pass.txt)"), "{out}");
    assert!(out.contains("✗ tools-list must pass (must-pass.txt) but failed"), "{out}");

    // The same run with a check of tools-list that succeeded passes: the skipping made the failure.
    let (code, out) =
        summarize(&[("ping", &["SUCCESS"]), ("tools-list", &["SKIPPED", "SUCCESS"])], &["ping", "tools-list"]).unwrap();
    assert_eq!((code, out.lines().next()), (0, Some("t: 2 passed, 0 failed, 0 not applicable")), "{out}");

    // Not on the list: not applicable, and the run passes.
    let (code, out) = summarize(&[("ping", &["SUCCESS"]), ("tools-list", &["SKIPPED"])], &["ping"]).unwrap();
    assert_eq!((code, out.lines().next()), (0, Some("t: 1 passed, 0 failed, 1 not applicable")), "{out}");
}
