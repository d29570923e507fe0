//! What scripts hand back: a connector's items against its byte budget and deadline
//! (item 10), every text a tool returns or raises against `max_result_bytes` (item 9), and error
//! tables reaching clients as their message, never a heap address (item 15a). Real scripts, a
//! real server on 127.0.0.1:0, the real binary and real SQLite.

use std::sync::Arc;

use ctx::mcp::Mcp;
use ctx::server::{self, App, Security};
use ctx::tools::{CallOptions, Tools};
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::common::Workspace;
use crate::tools::fixture;

// ---------------------------------------------------------------------------------------------
// Item 10: disk amplification in sync.

const BIG_SCAN: &str = r#"
local ext = {}
function ext.scan()
  local shared = string.rep("amplified words ", 65536) -- 1 MiB, shared by every item
  local items = {}
  for i = 1, 200 do
    items[i] = { source_id = "big-" .. i, title = "big " .. i, body = shared }
  end
  return items
end
return ext
"#;

const SMALL_SCAN: &str = r#"
local ext = {}
function ext.scan()
  return {
    { source_id = "a", title = "first", body = "the original wombat document" },
    { source_id = "b", title = "second", body = "the original quokka document" },
  }
end
return ext
"#;

/// The database and its write-ahead log, in bytes.
fn database_bytes(ws: &Workspace) -> u64 {
    ["data/ctx.sqlite", "data/ctx.sqlite-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(ws.path().join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// `(source_id, title)` of every document, in order.
fn documents(ws: &Workspace) -> Vec<(String, String)> {
    let db = ws.db();
    let mut stmt = db.prepare("SELECT source_id, title FROM documents ORDER BY source_id").unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().collect::<Result<_, _>>().unwrap()
}

/// A workspace whose script connector `big` synced two small items.
fn synced_small(config: &str) -> Workspace {
    let ws = Workspace::new(config);
    ws.write("connectors/big.lua", SMALL_SCAN);
    ws.ctx(&["sync"]).ok();
    assert_eq!(documents(&ws).len(), 2);
    ws
}

#[test]
fn items_sharing_a_string_fail_the_byte_budget_and_write_nothing() {
    let ws = synced_small("[connectors.script.big]\npath = \"connectors/big.lua\"\ntimeout = 1\n");
    let before = documents(&ws);
    let size_before = database_bytes(&ws);

    ws.write("connectors/big.lua", BIG_SCAN);
    let run = ws.ctx(&["sync", "--json"]);
    assert_eq!(run.code(), 1, "stdout: {}\nstderr: {}", run.stdout(), run.stderr());
    let summary: Value = serde_json::from_str(run.stdout().trim()).unwrap();
    let error = summary["error"].as_str().unwrap();
    // The default budget is twice the 64 MiB memory cap.
    for part in ["connector 'big'", "134217728 bytes", "max_bytes", "[connectors.script.big]", "nothing was synced"] {
        assert!(error.contains(part), "{part:?} missing from: {error}");
    }
    assert_eq!((summary["added"].as_u64(), summary["deleted"].as_u64()), (Some(0), Some(0)), "{summary}");

    assert_eq!(documents(&ws), before, "the source is as it was before the sync");
    let grown = database_bytes(&ws).saturating_sub(size_before);
    assert!(grown < 1024 * 1024, "the database grew by {grown} bytes");
}

#[test]
fn a_set_max_bytes_is_named_and_enforced() {
    let ws =
        synced_small("[connectors.script.big]\npath = \"connectors/big.lua\"\ntimeout = 30\nmax_bytes = 5000000\n");
    ws.write("connectors/big.lua", BIG_SCAN);
    let run = ws.ctx(&["sync"]);
    assert_eq!(run.code(), 1);
    let stderr = run.stderr();
    assert!(stderr.contains("script:big: connector 'big': scan() returned more than 5000000 bytes"), "{stderr}");
    assert!(stderr.contains("passed at item 5 of 200"), "{stderr}");
    assert!(stderr.contains("over its max_bytes of 5000000"), "{stderr}");
    assert_eq!(documents(&ws).len(), 2);
}

#[test]
fn the_deadline_stops_indexing_and_rolls_the_source_back() {
    // Within a large budget, the same 200 MiB of documents take far longer than 1 s to convert,
    // chunk and write: the deadline, checked between items, stops it, and nothing is kept.
    let ws =
        synced_small("[connectors.script.big]\npath = \"connectors/big.lua\"\ntimeout = 1\nmax_bytes = 1073741824\n");
    let before = documents(&ws);
    ws.write("connectors/big.lua", BIG_SCAN);
    let run = ws.ctx(&["sync", "--json"]);
    assert_eq!(run.code(), 1, "stderr: {}", run.stderr());
    let summary: Value = serde_json::from_str(run.stdout().trim()).unwrap();
    assert_eq!(summary["error"], "connector 'big' timed out after 1 second", "{summary}");
    assert_eq!(documents(&ws), before, "a timed-out sync keeps nothing of what it converted");
    assert!(database_bytes(&ws) < 16 * 1024 * 1024, "{} bytes", database_bytes(&ws));
}

#[test]
fn a_script_source_within_its_budget_still_syncs_and_deletes() {
    let ws = synced_small("[connectors.script.big]\npath = \"connectors/big.lua\"\n");
    ws.write(
        "connectors/big.lua",
        "local ext = {}\nfunction ext.scan() return { { source_id = 'b', title = 'second', body = 'a new quokka text' } } end\nreturn ext\n",
    );
    let summary = ws.ctx(&["sync", "--json"]).json();
    assert_eq!((summary["updated"].as_u64(), summary["deleted"].as_u64()), (Some(1), Some(1)), "{summary}");
    assert_eq!(documents(&ws), vec![("b".to_string(), "second".to_string())]);
}

// ---------------------------------------------------------------------------------------------
// Items 9 and 15a over a real server.

const TOML: &str = r#"
[tools.script.big-text]
path = "tools/big-text.lua"
max_result_bytes = 1024

[tools.script.big-message]
path = "tools/big-message.lua"
max_result_bytes = 1024

[tools.script.big-code]
path = "tools/big-code.lua"
max_result_bytes = 1024

[tools.script.big-raise]
path = "tools/big-raise.lua"
max_result_bytes = 1024

[tools.script.big-handled]
path = "tools/big-handled.lua"
max_result_bytes = 1024

[tools.script.big-content]
path = "tools/big-content.lua"
max_result_bytes = 1024

[tools.script.raise-table]
path = "tools/raise-table.lua"

[tools.script.reraise-table]
path = "tools/reraise-table.lua"

[tools.script.raise-bare-table]
path = "tools/raise-bare-table.lua"

[tools.script.raise-huge-table]
path = "tools/raise-huge-table.lua"
max_result_bytes = 1024

[agents.script.raising-agent]
path = "tools/raising-agent.lua"
"#;

/// A tool whose `execute` is `body`; `big` is a 10 MiB string.
fn tool(name: &str, body: &str) -> String {
    format!(
        "tool = {{ name = \"{name}\", description = \"Hands back too much.\" }}\n\
         function tool.execute()\n  local big = string.rep(\"x\", 10 * 1024 * 1024)\n  {body}\nend\n"
    )
}

fn scripts() -> Vec<(&'static str, String)> {
    vec![
        ("big-text.lua", tool("big-text", "return MCP.text(big)")),
        ("big-message.lua", tool("big-message", "return MCP.error(\"E\", big)")),
        ("big-code.lua", tool("big-code", "return MCP.error(big, \"m\")")),
        ("big-raise.lua", tool("big-raise", "error(big)")),
        ("big-handled.lua", tool("big-handled", "return { error = big }")),
        ("big-content.lua", tool("big-content", "return MCP.content({ { type = \"text\", text = big } })")),
        (
            "raise-table.lua",
            tool("raise-table", "error({ code = \"JIRA_DOWN\", message = \"Jira is down\", status = 503 })"),
        ),
        (
            "reraise-table.lua",
            tool(
                "reraise-table",
                "local ok, e = pcall(function() error({ code = \"INNER\", message = \"inner failure\" }) end)\n  error(e)",
            ),
        ),
        ("raise-bare-table.lua", tool("raise-bare-table", "error({ reason = \"no message here\" })")),
        ("raise-huge-table.lua", tool("raise-huge-table", "error({ message = big, code = big, blob = big })")),
        (
            "raising-agent.lua",
            "agent = { name = \"raising-agent\", description = \"Fails with a table.\" }\n\
             function agent.resolve() error({ code = \"NO_CONTEXT\", message = \"no context found\" }) end\n"
                .to_string(),
        ),
    ]
}

/// A real server over the fixture's registry, with a blocking client.
struct Served {
    base: String,
    runtime: tokio::runtime::Runtime,
    tools: Arc<Tools>,
    _dir: tempfile::TempDir,
}

fn serve() -> Served {
    let scripts = scripts();
    let scripts: Vec<(&str, &str)> = scripts.iter().map(|(n, s)| (*n, s.as_str())).collect();
    let (dir, registry) = fixture(TOML, &scripts).into_parts();
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    let tools = Arc::new(Tools::new(registry));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let security = Security::new(addr, None, vec![]).unwrap();
    let app = Arc::new(App::new(Arc::clone(&tools), security, 4096));
    runtime.spawn(server::run(listener, app, std::future::pending()));
    let _ = rustls::crypto::ring::default_provider().install_default();
    Served { base: format!("http://{addr}"), runtime, tools, _dir: dir }
}

impl Served {
    /// `POST /tools/{name}`: the status and the raw body.
    fn post(&self, name: &str) -> (u16, String) {
        let url = format!("{}/tools/{name}", self.base);
        self.runtime.block_on(async move {
            let response = reqwest::Client::new().post(url).json(&json!({})).send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        })
    }

    /// `tools/call` over MCP (raw JSON-RPC over an in-memory pipe): the call's result.
    fn mcp_call(&self, name: &str) -> Value {
        let mcp = Mcp::with_page_size(Arc::clone(&self.tools), 50);
        self.runtime.block_on(async move {
            let (server_io, client_io) = tokio::io::duplex(1 << 20);
            tokio::spawn(async move {
                if let Ok(running) = mcp.serve(server_io).await {
                    let _ = running.waiting().await;
                }
            });
            let (reader, mut writer) = tokio::io::split(client_io);
            let mut lines = tokio::io::BufReader::new(reader).lines();
            let messages = [
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}}),
                json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": name, "arguments": {}}}),
            ];
            for message in messages {
                writer.write_all(format!("{message}\n").as_bytes()).await.unwrap();
            }
            let wait = std::time::Duration::from_secs(30);
            loop {
                let line = tokio::time::timeout(wait, lines.next_line()).await.unwrap().unwrap().unwrap();
                let message: Value = serde_json::from_str(&line).unwrap();
                if message["id"] == 2 {
                    return message["result"].clone();
                }
            }
        })
    }
}

fn assert_no_heap_address(text: &str) {
    assert!(!text.contains("table: 0x"), "a heap address reached the client: {text}");
}

#[test]
fn every_text_a_script_hands_back_counts_against_max_result_bytes() {
    let served = serve();
    // Each form returned 10 MiB against a 1 KiB cap; the bodies stay a few KiB at most.
    for (name, want_code) in [
        ("big-text", "result_too_large"),
        ("big-message", "tool_error"),
        ("big-code", "tool_error"),
        ("big-raise", "tool_error"),
        ("big-handled", "result_too_large"),
        ("big-content", "result_too_large"),
    ] {
        let (status, body) = served.post(name);
        assert!(body.len() < 4096, "{name}: a {}-byte body", body.len());
        assert_eq!(status, 500, "{name}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["code"], want_code, "{name}: {body}");
        let problems =
            ctx::schema::SchemaValidator::for_definition("Error").problems(&body, ctx::schema::Dialect::Json);
        assert!(problems.is_empty(), "{name}: {problems:?}");
    }
    // What was cut says so, with the size the script asked for.
    let (_, body) = served.post("big-message");
    let body: Value = serde_json::from_str(&body).unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.ends_with("… (truncated, 10485760 bytes)"), "{message}");
    assert_eq!(body["error"]["data"]["code"], "E");
    let (_, body) = served.post("big-code");
    let body: Value = serde_json::from_str(&body).unwrap();
    let code = body["error"]["data"]["code"].as_str().unwrap();
    assert!(code.len() < 200 && code.ends_with("(truncated, 10485760 bytes)"), "{code}");
    assert_eq!(body["error"]["message"], "m");
    let (_, body) = served.post("big-raise");
    let body: Value = serde_json::from_str(&body).unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("tools/big-raise.lua:4: xxxx"), "{message}");
    assert!(message.ends_with("… (truncated, 10485783 bytes)"), "{message}");
    let (_, body) = served.post("big-text");
    assert!(body.contains("over its max_result_bytes limit of 1024"), "{body}");
}

#[test]
fn verbose_logs_carry_a_bounded_message() {
    let ws = Workspace::new(
        "[tools.script.big-raise]\npath = \"tools/big-raise.lua\"\nmax_result_bytes = 1024\n\n\
         [tools.script.big-message]\npath = \"tools/big-message.lua\"\nmax_result_bytes = 1024\n",
    );
    for (file, text) in scripts() {
        if file == "big-raise.lua" || file == "big-message.lua" {
            ws.write(&format!("tools/{file}"), &text);
        }
    }
    for name in ["big-raise", "big-message"] {
        let run = ws.ctx(&["-vv", "tool", "test", &format!("tools/{name}.lua"), "--source", name, "--json"]);
        assert_ne!(run.code(), 0, "{}", run.stderr());
        let (out, err) = (run.stdout(), run.stderr());
        assert!(out.len() + err.len() < 64 * 1024, "{name}: {} bytes of output and log", out.len() + err.len());
        assert!(out.contains("… (truncated, 104857"), "{name}: {out}");
    }
}

#[test]
fn and_hardening_15a_a_raised_table_reaches_rest_and_mcp_as_its_message() {
    let served = serve();

    let (status, body) = served.post("raise-table");
    assert_no_heap_address(&body);
    assert_eq!(status, 500);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body,
        json!({"error": {"code": "tool_error", "message": "Jira is down", "data": {
            "code": "JIRA_DOWN", "data": {"code": "JIRA_DOWN", "message": "Jira is down", "status": 503}
        }}})
    );
    let result = served.mcp_call("raise-table");
    assert_no_heap_address(&result.to_string());
    assert_eq!((result["isError"].as_bool(), &result["content"][0]["text"]), (Some(true), &json!("Jira is down")));

    // A table caught by pcall and raised again is the same table.
    let (_, body) = served.post("reraise-table");
    assert_no_heap_address(&body);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["message"], "inner failure");
    assert_eq!(body["error"]["data"]["code"], "INNER");
    let result = served.mcp_call("reraise-table");
    assert_eq!(result["content"][0]["text"], "inner failure", "{result}");

    // Without a message field, the message says so and the table is in the data.
    let (_, body) = served.post("raise-bare-table");
    assert_no_heap_address(&body);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["error"]["message"],
        "tools/raise-bare-table.lua: the script raised a table without a 'message' field"
    );
    assert_eq!(body["error"]["data"], json!({"data": {"reason": "no message here"}}));
    let result = served.mcp_call("raise-bare-table");
    assert_no_heap_address(&result.to_string());

    // A huge table is cut like any other text: message, code and data.
    let (status, body) = served.post("raise-huge-table");
    assert_eq!(status, 500);
    assert!(body.len() < 4096, "a {}-byte body", body.len());
    let body: Value = serde_json::from_str(&body).unwrap();
    assert!(body["error"]["message"].as_str().unwrap().ends_with("(truncated, 10485760 bytes)"), "{body}");
    assert!(body["error"]["data"]["data"].as_str().unwrap().contains("left out"), "{body}");
}

#[test]
fn and_hardening_15a_agents_connectors_and_the_cli_report_a_raised_tables_message() {
    let served = serve();
    let registry = served.tools.current();
    let err =
        registry.prompt("raising-agent", json!({}), &CallOptions { caller: "test", ..Default::default() }).unwrap_err();
    let envelope = err.envelope();
    assert_no_heap_address(&envelope.to_string());
    assert_eq!(envelope["error"]["message"], "no context found", "{envelope}");
    assert_eq!(envelope["error"]["data"]["code"], "NO_CONTEXT", "{envelope}");

    let ws = Workspace::new(
        "[connectors.script.feed]\npath = \"connectors/feed.lua\"\n\n[tools.script.raise-table]\npath = \"tools/raise-table.lua\"\n",
    );
    let raise_table = scripts().into_iter().find(|(f, _)| *f == "raise-table.lua").unwrap().1;
    ws.write("tools/raise-table.lua", &raise_table);
    let run = ws.ctx(&["tool", "test", "tools/raise-table.lua", "--source", "raise-table"]);
    assert_eq!(run.code(), 1);
    assert_no_heap_address(&run.stderr());
    assert!(run.stderr().contains("Jira is down"), "{}", run.stderr());

    ws.write(
        "connectors/feed.lua",
        "local ext = {}\nfunction ext.scan() error({ code = \"FEED_DOWN\", message = \"the feed is down\" }) end\nreturn ext\n",
    );
    let run = ws.ctx(&["sync"]);
    assert_eq!(run.code(), 1);
    assert_no_heap_address(&run.stderr());
    assert!(run.stderr().contains("script:feed: the feed is down"), "{}", run.stderr());
}
