//! Config and loading: an unset `${VAR}` breaks only its section, a refused hot reload
//! shows in `/health`, a tool or agent that failed to load says so, `ctx tool test` finds its
//! section, inline agent placeholders are checked, and `ctx tool list` / `ctx schema check` show
//! what they used to hide. Everything runs through the real binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{Workspace, BIN};

/// Variables no test environment sets.
const UNSET_JIRA: &str = "CTX_IT16_NEVER_SET_JIRA_TOKEN";
const UNSET_TICKETS: &str = "CTX_IT16_NEVER_SET_TICKETS_TOKEN";
const UNSET_AGENT: &str = "CTX_IT16_NEVER_SET_AGENT_NAME";

const ECHO: &str = r#"
tool = {
  name = "echo",
  description = "Says the message back, with the greeting of its config section.",
  parameters = { { name = "message", type = "string", required = true } },
}
function tool.execute(params, context)
  return { message = params.message, greeting = context.config.greeting }
end
"#;

const JIRA: &str = r#"
tool = { name = "jira", description = "Would call Jira with its token." }
function tool.execute(params, context) return "token " .. context.config.api_token end
"#;

const TICKETS: &str = r#"
connector = { name = "tickets", description = "Would list tickets." }
function connector.scan(config)
  return { { source_id = "t-1", title = "Ticket", body = "uses " .. config.token, updated_at = 0 } }
end
"#;

/// A workspace whose jira tool, tickets connector and helper agent each reference an unset
/// variable, next to a working echo tool and a folder of documents.
fn partly_broken() -> Workspace {
    let ws = Workspace::new(&format!(
        r#"
[connectors.filesystem.docs]
root = "docs"

[connectors.script.tickets]
path = "connectors/tickets.lua"
token = "${{{UNSET_TICKETS}}}"

[tools.script.echo]
path = "tools/echo.lua"
greeting = "hello"

[tools.script.jira]
path = "tools/jira.lua"
api_token = "${{{UNSET_JIRA}}}"

[agents.inline.helper]
description = "Helps whoever is named."
system_prompt = "You help ${{{UNSET_AGENT}}}."

[agents.inline.guide]
description = "Guides."
system_prompt = "You guide."
"#
    ));
    ws.write("docs/deploy.md", "# Deploy runbook\n\nRoll back a deploy with the release switch.\n");
    ws.write("tools/echo.lua", ECHO);
    ws.write("tools/jira.lua", JIRA);
    ws.write("connectors/tickets.lua", TICKETS);
    ws
}

/// `ctx serve` on 127.0.0.1:0 in a workspace; killed on drop. Its stderr is collected.
struct Served(crate::common::ServeChild);

impl std::ops::Deref for Served {
    type Target = crate::common::ServeChild;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

fn serve(ws: &Workspace, extra: &[&str]) -> Served {
    Served(crate::common::ServeChild::spawn(
        Command::new(BIN)
            .current_dir(ws.path())
            .args(["--config", "ctx.toml", "serve", "--bind", "127.0.0.1:0"])
            .args(extra)
            .env_remove("CTX_CONFIG")
            .env_remove("CTX_LOG"),
    ))
}

impl Served {
    /// One request on a fresh connection: the status and the body as JSON.
    fn request(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut stream = TcpStream::connect(&self.addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        (status, serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_string())))
    }

    fn health(&self) -> Value {
        let (status, body) = self.request("GET", "/health", None);
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Polls /health until `done` holds, for at most a generous bound (file watching can be
    /// slow on a loaded machine); returns the last answer.
    fn health_until(&self, done: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let health = self.health();
            if done(&health) || started.elapsed() > Duration::from_secs(60) {
                return health;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `ctx serve --stdio`, spoken to line by line.
struct McpStdio {
    child: Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    next_id: u64,
}

impl McpStdio {
    fn start(ws: &Workspace) -> McpStdio {
        let mut child = Command::new(BIN)
            .args(["--config", "ctx.toml", "serve", "--stdio", "--no-reload"])
            .current_dir(ws.path())
            .env_remove("CTX_CONFIG")
            .env_remove("CTX_LOG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ctx serve --stdio");
        let stdin = child.stdin.take().expect("stdin");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut mcp = McpStdio { child, stdin, lines, next_id: 0 };
        let init = mcp.call(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}),
        );
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        writeln!(mcp.stdin, "{}", json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).unwrap();
        mcp
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        writeln!(self.stdin, "{}", json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).unwrap();
        loop {
            let line = self.lines.next().expect("a reply").expect("read stdout");
            let message: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if message["id"] == id {
                return message;
            }
        }
    }
}

impl Drop for McpStdio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// 5. One unset ${VAR} breaks only its section

#[test]
fn unset_variable_breaks_only_its_section() {
    let ws = partly_broken();

    // Sync: the folder syncs; the connector that needs the variable fails with the reason.
    let only_docs = ws.ctx(&["sync", "filesystem"]);
    assert_eq!(only_docs.code(), 0, "{}{}", only_docs.stdout(), only_docs.stderr());
    assert!(only_docs.stderr().contains(&format!("environment variable {UNSET_JIRA} is not set")), "logged");
    let all = ws.ctx(&["sync"]);
    assert_eq!(all.code(), 1, "a source failed: {}{}", all.stdout(), all.stderr());
    assert!(all.stdout().contains("synced filesystem:docs"), "{}", all.stdout());
    let err = all.stderr();
    assert!(err.contains("error: script:tickets: ctx.toml: connectors.script.tickets.token (line 7)"), "{err}");
    assert!(err.contains(&format!("environment variable {UNSET_TICKETS} is not set")), "{err}");

    // Search works.
    let found = ws.ctx(&["search", "roll back a deploy", "--json"]).json();
    assert_eq!(found["results"][0]["title"], "Deploy runbook", "{found}");

    // The tool list shows the working tool and every broken section with its reason.
    let list = ws.ctx(&["tool", "list", "--json"]).json();
    let names: Vec<&str> = list["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"echo") && !names.contains(&"jira"), "{names:?}");
    let problems: Vec<(String, String)> = list["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["kind"].as_str().unwrap().to_string(), p["name"].as_str().unwrap().to_string()))
        .collect();
    for expected in [("tool", "jira"), ("agent", "helper"), ("connector", "tickets")] {
        assert!(problems.contains(&(expected.0.to_string(), expected.1.to_string())), "{expected:?}: {list}");
    }
    let jira = list["problems"].as_array().unwrap().iter().find(|p| p["name"] == "jira").unwrap();
    let message = jira["message"].as_str().unwrap();
    assert!(message.starts_with("ctx.toml: tools.script.jira.api_token (line 15): environment variable"), "{message}");
    assert!(message.contains("[tools.script.jira] is disabled"), "{message}");
    let text = ws.ctx(&["tool", "list"]).ok();
    assert!(text.contains("jira  (broken tool)") && text.contains("tickets  (broken connector)"), "{text}");

    // The check fails, naming each variable with its key and line.
    let check = ws.ctx(&["schema", "check"]);
    assert_eq!(check.code(), 2, "{}{}", check.stdout(), check.stderr());
    for line in [
        format!("connectors.script.tickets.token (line 7): environment variable {UNSET_TICKETS} is not set"),
        format!("tools.script.jira.api_token (line 15): environment variable {UNSET_JIRA} is not set"),
        format!("agents.inline.helper.system_prompt (line 19): environment variable {UNSET_AGENT} is not set"),
    ] {
        assert!(check.stderr().contains(&line), "{line}\n{}", check.stderr());
    }
    assert!(check.stderr().contains("has 3 problem(s)"), "{}", check.stderr());

    // MCP over stdio serves the rest.
    let mut mcp = McpStdio::start(&ws);
    let tools = mcp.call("tools/list", json!({}));
    let listed: Vec<&str> =
        tools["result"]["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert!(listed.contains(&"echo") && listed.contains(&"search") && !listed.contains(&"jira"), "{tools}");
    let echoed = mcp.call("tools/call", json!({"name": "echo", "arguments": {"message": "hi"}}));
    assert_eq!(echoed["result"]["structuredContent"], json!({"message": "hi", "greeting": "hello"}), "{echoed}");
    let prompts = mcp.call("prompts/list", json!({}));
    let agents: Vec<&str> =
        prompts["result"]["prompts"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(agents, ["guide", "code_mode"], "{prompts}");
    drop(mcp);

    // /health reports the three sections as problems.
    let served = serve(&ws, &["--no-reload"]);
    let health = served.health();
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["problem_count"], 3, "{health}");
}

#[test]
fn unset_variable_in_a_core_section_still_stops_the_command() {
    let ws = Workspace::new(&format!(
        "[embedding]\napi_key = \"${{{UNSET_JIRA}}}\"\n\n[tools.script.jira]\npath = \"tools/jira.lua\"\napi_token = \"${{{UNSET_JIRA}}}\"\n"
    ));
    ws.write("tools/jira.lua", JIRA);
    for args in [&["search", "deploy"][..], &["tool", "list"], &["sync"]] {
        let run = ws.ctx(args);
        assert_eq!(run.code(), 2, "{args:?}: {}{}", run.stdout(), run.stderr());
        let err = run.stderr();
        assert!(
            err.contains(&format!("embedding.api_key (line 2): environment variable {UNSET_JIRA} is not set")),
            "{err}"
        );
        // The script section's problem is reported with it, not hidden.
        assert!(err.contains("tools.script.jira.api_token (line 6)"), "{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// 6. A refused hot reload is visible

/// The parts of /health that say which config runs, with times replaced by a marker.
fn config_view(health: &Value) -> Value {
    let mut config = health["config"].clone();
    for pointer in ["/loaded_at", "/refused/at"] {
        if let Some(at) = config.pointer_mut(pointer) {
            assert!(
                chrono::DateTime::parse_from_rfc3339(at.as_str().unwrap_or_default()).is_ok(),
                "{pointer} is RFC 3339: {at}"
            );
            *at = json!("[time]");
        }
    }
    let refused: Vec<Value> =
        health["problems"].as_array().unwrap().iter().filter(|p| p["kind"] == "config").cloned().collect();
    json!({"status": health["status"], "problem_count": health["problem_count"], "config": config, "config_problems": refused})
}

#[test]
fn failed_reload_is_visible_in_health() {
    let good = "[tools.script.echo]\npath = \"tools/echo.lua\"\ngreeting = \"hello\"\n";
    let ws = Workspace::new(good);
    ws.write("tools/echo.lua", ECHO);
    let served = serve(&ws, &[]);
    let first = served.health();
    assert_eq!(first["config"]["running"], "current", "{first}");
    assert_eq!(first["config"]["file"], "ctx.toml", "{first}");
    assert!(first["config"].get("refused").is_none(), "{first}");
    let loaded_at = first["config"]["loaded_at"].clone();

    // A TOML syntax error: refused, with the file, line and column.
    ws.write("ctx.toml", "[tools.script.echo]\npath = \"tools/echo.lua\"\ngreeting = \n");
    let refused = served.health_until(|h| h["config"]["running"] == "last_good");
    assert_eq!(refused["config"]["running"], "last_good", "the edit was refused: {refused}");
    assert_eq!(refused["config"]["loaded_at"], loaded_at, "still the config read at start: {refused}");
    let problems = refused["config"]["refused"]["problems"].as_array().unwrap();
    assert!(problems[0].as_str().unwrap().starts_with("ctx.toml:3:"), "{refused}");
    assert!(problems[0].as_str().unwrap().contains("TOML syntax error"), "{refused}");
    assert_eq!(refused["status"], "degraded", "{refused}");
    insta::assert_json_snapshot!("refused_syntax", config_view(&refused));
    // The last good config still serves.
    let (status, echoed) = served.request("POST", "/tools/echo", Some(json!({"message": "hi"})));
    assert_eq!((status, &echoed["result"]["greeting"]), (200, &json!("hello")), "{echoed}");

    // A schema error and an unset variable in a core section: refused, each with its line.
    ws.write(
        "ctx.toml",
        &format!("[server]\nauth_token = \"${{{UNSET_JIRA}}}\"\n\n[retrieval]\ndefault_limit = \"many\"\n\n{good}"),
    );
    let refused = served.health_until(|h| h["config"]["refused"]["problems"].to_string().contains("retrieval"));
    let problems = refused["config"]["refused"]["problems"].to_string();
    assert!(
        problems.contains(&format!("ctx.toml:2: server.auth_token: environment variable {UNSET_JIRA} is not set")),
        "{refused}"
    );
    assert!(problems.contains("ctx.toml:5: retrieval.default_limit: expected integer"), "{refused}");
    insta::assert_json_snapshot!("refused_schema", config_view(&refused));
    assert!(served.stderr.lock().unwrap().contains("config not reloaded"), "and the log says so");

    // A good edit clears it.
    ws.write("ctx.toml", &good.replace("hello", "welcome"));
    let cleared = served.health_until(|h| h["config"]["running"] == "current");
    assert_eq!(cleared["config"]["running"], "current", "{cleared}");
    assert!(cleared["config"].get("refused").is_none(), "{cleared}");
    assert_ne!(cleared["config"]["loaded_at"], loaded_at, "a newer config: {cleared}");
    assert_eq!((cleared["status"].as_str(), cleared["problem_count"].as_u64()), (Some("ok"), Some(0)), "{cleared}");
    let (_, echoed) = served.request("POST", "/tools/echo", Some(json!({"message": "hi"})));
    assert_eq!(echoed["result"]["greeting"], "welcome", "{echoed}");
}

// ---------------------------------------------------------------------------------------------
// 7. A tool or agent that failed to load says so

#[test]
fn failed_tool_or_agent_says_failed_to_load() {
    let ws = partly_broken();
    ws.write("tools/syntax.lua", "tool = { name = 'syntax', description = 'x' \nfunction tool.execute() end\n");
    let mut toml = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    toml.push_str("\n[tools.script.syntax]\npath = \"tools/syntax.lua\"\n");
    std::fs::write(ws.path().join("ctx.toml"), toml).unwrap();

    // REST: 503 load_failed with the reason; an unknown name stays 404.
    let served = serve(&ws, &["--no-reload"]);
    let (status, jira) = served.request("POST", "/tools/jira", Some(json!({})));
    assert_eq!((status, jira["error"]["code"].as_str()), (503, Some("load_failed")), "{jira}");
    let message = jira["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("tool 'jira' failed to load: ctx.toml: tools.script.jira.api_token (line 15)"),
        "{message}"
    );
    let (status, syntax) = served.request("POST", "/tools/syntax", Some(json!({})));
    assert_eq!(status, 503, "{syntax}");
    assert!(syntax["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("tool 'syntax' failed to load: tools/syntax.lua:"));
    let (status, unknown) = served.request("POST", "/tools/nope", Some(json!({})));
    assert_eq!((status, unknown["error"]["code"].as_str()), (404, Some("not_found")), "{unknown}");
    let (status, helper) = served.request("POST", "/agents/helper/prompt", Some(json!({})));
    assert_eq!((status, helper["error"]["code"].as_str()), (503, Some("load_failed")), "{helper}");
    assert!(helper["error"]["message"].as_str().unwrap().starts_with("agent 'helper' failed to load: ctx.toml:"));
    let schema = ctx::schema::SchemaValidator::for_definition("Error");
    for body in [&jira, &syntax, &helper] {
        assert!(schema.problems(body, ctx::schema::Dialect::Json).is_empty(), "{body}");
    }
    insta::assert_json_snapshot!("rest_bodies", json!({"tool": jira, "agent": helper}));

    // MCP: the call answers with the reason (the model can tell the user), an agent as an error.
    let mut mcp = McpStdio::start(&ws);
    let called = mcp.call("tools/call", json!({"name": "jira", "arguments": {}}));
    assert_eq!(called["result"]["isError"], true, "{called}");
    let text = called["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("tool 'jira' failed to load: "), "{called}");
    let prompt = mcp.call("prompts/get", json!({"name": "helper"}));
    assert!(prompt["error"]["message"].as_str().unwrap().starts_with("agent 'helper' failed to load: "), "{prompt}");
    assert_eq!(prompt["error"]["data"]["code"], "load_failed", "{prompt}");
    drop(mcp);

    // CLI: exit 1 with the reason, as JSON under --json; an unknown tool is a usage error.
    let run = ws.ctx(&["tool", "call", "jira"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("error: tool 'jira' failed to load: "), "{}", run.stderr());
    let run = ws.ctx(&["tool", "call", "jira", "--json"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let body: Value = serde_json::from_str(&run.stdout()).expect("JSON on stdout");
    assert_eq!(body["error"]["code"], "load_failed", "{body}");
    assert_eq!(ws.ctx(&["tool", "call", "nope"]).code(), 2);
    let echoed = ws.ctx(&["tool", "call", "echo", "--param", "message=hi", "--json"]).json();
    assert_eq!(echoed, json!({"result": {"message": "hi", "greeting": "hello"}}));
    let run = ws.ctx(&["agent", "test", "helper", "--json"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let body: Value = serde_json::from_str(&run.stdout()).expect("JSON on stdout");
    assert_eq!(body["error"]["code"], "load_failed", "{body}");
}

// ---------------------------------------------------------------------------------------------
// 11. ctx tool test PATH

const FAILS: &str = r#"
tool = {
  name = "pretty_name",
  description = "Fails when asked to.",
  parameters = { { name = "fail", type = "boolean" } },
}
function tool.execute(params, context)
  if params.fail then error("asked to fail") end
  return { greeting = context.config.greeting }
end
"#;

#[test]
fn tool_test_finds_its_section_and_exits_1_on_failure() {
    let ws = Workspace::new(&format!(
        "[tools.script.greeter]\npath = \"tools/greeter.lua\"\ngreeting = \"from the config\"\n\n[tools.script.jira]\npath = \"tools/jira.lua\"\napi_token = \"${{{UNSET_JIRA}}}\"\n"
    ));
    ws.write("tools/greeter.lua", FAILS);
    ws.write("tools/jira.lua", JIRA);
    ws.write("scratch/odd-file-name.lua", FAILS);

    // The section whose path is the file, however the path is spelled.
    for spelled in ["tools/greeter.lua", "./tools/../tools/greeter.lua"] {
        let out = ws.ctx(&["tool", "test", spelled]).ok();
        assert!(out.contains("using config section tools.script.greeter of ctx.toml"), "{out}");
        assert!(out.contains("\"greeting\": \"from the config\""), "{out}");
    }
    let body = ws.ctx(&["tool", "test", "tools/greeter.lua", "--json"]).json();
    assert_eq!(body, json!({"result": {"greeting": "from the config"}}));

    // A script not in the config is named by tool.name, with no config keys.
    let out = ws.ctx(&["tool", "test", "scratch/odd-file-name.lua"]).ok();
    assert!(out.starts_with("Testing tool: pretty_name (scratch/odd-file-name.lua)"), "{out}");
    assert!(!out.contains("using config section"), "{out}");

    // A failed call exits 1, in text and in --json (with the envelope on stdout).
    let text = ws.ctx(&["tool", "test", "tools/greeter.lua", "--param", "fail=true"]);
    assert_eq!(text.code(), 1, "{}{}", text.stdout(), text.stderr());
    assert!(text.stderr().contains("asked to fail"), "{}", text.stderr());
    let json = ws.ctx(&["tool", "test", "tools/greeter.lua", "--param", "fail=true", "--json"]);
    assert_eq!(json.code(), 1, "{}{}", json.stdout(), json.stderr());
    let body: Value = serde_json::from_str(&json.stdout()).expect("the envelope on stdout");
    assert_eq!(body["error"]["code"], "tool_error", "{body}");
    // A usage error stays 2.
    assert_eq!(ws.ctx(&["tool", "test", "tools/greeter.lua", "--param", "fail=maybe"]).code(), 2);

    // A load failure under --json prints JSON too: the section's own, and a script's.
    let json = ws.ctx(&["tool", "test", "tools/jira.lua", "--json"]);
    assert_eq!(json.code(), 1, "{}{}", json.stdout(), json.stderr());
    let body: Value = serde_json::from_str(&json.stdout()).expect("JSON on stdout");
    assert_eq!(body["error"]["code"], "load_failed", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(UNSET_JIRA), "{body}");
    ws.write("scratch/broken.lua", "tool = {");
    let json = ws.ctx(&["tool", "test", "scratch/broken.lua", "--json"]);
    assert_eq!(json.code(), 1, "{}{}", json.stdout(), json.stderr());
    let body: Value = serde_json::from_str(&json.stdout()).expect("JSON on stdout");
    assert!(body["error"]["message"].as_str().unwrap().starts_with("tool 'broken' failed to load: "), "{body}");
}

// ---------------------------------------------------------------------------------------------
// 12. Inline agent placeholders; a Lua agent's closing assistant message

const PRIMED: &str = r#"
agent = { name = "primed", description = "Primes the answer.", tools = { "search" } }
function agent.resolve(args, config, context)
  return {
    system = "You answer briefly.",
    messages = {
      { role = "user", content = "What is the rollback switch?" },
      { role = "assistant", content = "The rollback switch is" },
    },
  }
end
"#;

#[test]
fn inline_placeholders_must_be_declared_and_assistant_stays_last() {
    let ws = Workspace::new(
        r#"
[agents.inline.typo]
description = "Has a typo."
system_prompt = "You own {{servce}} and mail {{user.email}}."
arguments = [{ name = "service", required = true }]

[agents.inline.fine]
description = "Fine."
system_prompt = "You own {{ service }}; write to {{user.email}} or {{ 1 }}."
arguments = [{ name = "service", required = true }]

[agents.script.primed]
path = "agents/primed.lua"
"#,
    );
    ws.write("agents/primed.lua", PRIMED);

    let check = ws.ctx(&["schema", "check"]);
    assert_eq!(check.code(), 2, "{}{}", check.stdout(), check.stderr());
    let err = check.stderr();
    assert!(
        err.contains("agents.inline.typo: agents.inline.typo.system_prompt uses {{servce}}, which is not a declared argument (declared: service)"),
        "{err}"
    );
    assert!(err.contains("has 1 problem(s)"), "only the typo: {err}");

    // At load it is a problem of that agent: the others serve, and it says why it is missing.
    let fine = ws.ctx(&["agent", "test", "fine", "--arg", "service=payments", "--json"]).json();
    assert_eq!(fine["system"], "You own payments; write to {{user.email}} or {{ 1 }}.", "{fine}");
    let typo = ws.ctx(&["agent", "test", "typo", "--arg", "service=payments"]);
    assert_eq!(typo.code(), 1, "{}", typo.stderr());
    assert!(typo.stderr().contains("agent 'typo' failed to load: agents.inline.typo.system_prompt uses {{servce}}"));

    // MCP: the tools line joins the system text; the assistant's opening stays the last message.
    let mut mcp = McpStdio::start(&ws);
    let got = mcp.call("prompts/get", json!({"name": "primed"}));
    let messages = got["result"]["messages"].as_array().unwrap_or_else(|| panic!("{got}"));
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "user", "assistant"], "{got}");
    assert_eq!(messages[0]["content"]["text"], "You answer briefly.\n\nTools to use: search.", "{got}");
    assert_eq!(messages[2]["content"]["text"], "The rollback switch is", "{got}");
}

// ---------------------------------------------------------------------------------------------
// 13. ctx tool list shows non-string enums; required with a default warns

const ENUMS: &str = r#"
tool = {
  name = "levels",
  description = "Takes enums of every kind.",
  parameters = {
    { name = "level", type = "integer", enum = { 1, 2, 3 }, default = 2 },
    { name = "ratio", type = "number", enum = { 0.5, 1.5 } },
    { name = "flag", type = "boolean", enum = { true } },
    { name = "mode", type = "string", enum = { "fast", "slow" } },
    { name = "limit", type = "integer", required = true, default = 10 },
  },
}
function tool.execute(params) return params end
"#;

#[test]
fn tool_list_prints_every_enum_and_required_with_default_warns() {
    let ws = Workspace::new("[tools.script.levels]\npath = \"tools/levels.lua\"\n");
    ws.write("tools/levels.lua", ENUMS);
    let list = ws.ctx(&["tool", "list"]);
    let out = list.ok();
    assert!(
        out.contains("parameters: level: 1|2|3 = 2, ratio: 0.5|1.5, flag: true, mode: fast|slow, limit: integer* = 10"),
        "{out}"
    );
    let warning = "tools/levels.lua: parameter 'limit' is required and has a default; a call must give it, so the default is never used";
    assert!(list.stderr().contains(warning), "in the load log: {}", list.stderr());
    // A warning, not an error: the check passes and says it.
    let check = ws.ctx(&["schema", "check"]);
    assert_eq!(check.code(), 0, "{}{}", check.stdout(), check.stderr());
    assert!(check.stderr().contains(&format!("warning: tools.script.levels: {warning}")), "{}", check.stderr());
    // Said once: the check's own line, not the load log's too.
    assert_eq!(check.stderr().matches(warning).count(), 1, "{}", check.stderr());
    assert!(check.stdout().starts_with("ok: "), "{}", check.stdout());
}
