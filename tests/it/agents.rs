//! Agents: inline and Lua agents over a real store and real scripts, through the registry, REST
//! (a real server), MCP prompts (raw JSON-RPC over duplex) and the CLI.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ctx::mcp::Mcp;
use ctx::server::{self, App, Security};
use ctx::tools::{CallOptions, Tools};
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::common::{repo, Workspace};
use crate::tools::fixture;

const TOML: &str = r#"
[agents.inline.incident-responder]
description = "Walks through an incident on one service."
system_prompt = "You are the incident responder for {{service}} (severity {{severity}})."
tools = ["search", "get"]
arguments = [
  { name = "service", description = "The affected service", required = true },
  { name = "severity", description = "sev1 to sev3" },
]

[agents.script.runbook-guide]
path = "tools/runbook-guide.lua"
documents = 2

[agents.script.looper]
path = "tools/looper.lua"
timeout = 1
"#;

const LOOPER: &str = r#"
agent = { name = "looper", description = "Never finishes resolving." }
function agent.resolve() while true do end end
"#;

fn guide() -> String {
    std::fs::read_to_string(repo().join("agents/runbook-guide.lua")).unwrap()
}

fn registry_fixture() -> crate::tools::Fixture {
    fixture(TOML, &[("runbook-guide.lua", &guide()), ("looper.lua", LOOPER)])
}

#[test]
fn inline_and_lua_agents_resolve_through_the_registry() {
    let (_dir, registry) = registry_fixture().into_parts();
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    let names: Vec<&str> = registry.agents().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["incident-responder", "looper", "runbook-guide"]);
    let options = CallOptions { caller: "test", ..Default::default() };

    let inline = registry.prompt("incident-responder", json!({"service": "payments"}), &options).unwrap();
    assert_eq!(inline.system, "You are the incident responder for payments (severity ).");
    assert_eq!(inline.tools, ["search", "get"]);

    let lua = registry.prompt("runbook-guide", json!({"question": "how do I roll back a deploy"}), &options).unwrap();
    assert_eq!(lua.tools, ["search", "get"], "the declared tools when resolve returns none");
    assert!(lua.messages[0].content.starts_with("Document: Deploy runbook"), "{}", lua.messages[0].content);
    assert_eq!(lua.messages.last().unwrap().content, "how do I roll back a deploy");
    // A broad question matches many documents: config.documents = 2 caps what is injected.
    let broad = registry.prompt("runbook-guide", json!({"question": "incident"}), &options).unwrap();
    let docs: Vec<&str> = broad
        .messages
        .iter()
        .filter_map(|m| m.content.strip_prefix("Document: "))
        .map(|c| c.lines().next().unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "{docs:?}");
    assert_ne!(docs[0], docs[1]);

    let started = Instant::now();
    let err = registry.prompt("looper", json!({}), &options).unwrap_err();
    assert_eq!(err.to_string(), "agent 'looper' timed out after 1 second");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn agent_arguments_are_checked_with_every_problem_named() {
    let (_dir, registry) = registry_fixture().into_parts();
    let options = CallOptions { caller: "test", ..Default::default() };
    let err = registry.prompt("incident-responder", json!({"sev": "1", "severity": 2}), &options).unwrap_err();
    let body = serde_json::to_value(err.body()).unwrap();
    assert_eq!(body["code"], "bad_request");
    let details: Vec<(&str, &str)> = body["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d["path"].as_str().unwrap(), d["message"].as_str().unwrap()))
        .collect();
    assert_eq!(
        details,
        [
            ("/arguments/sev", "unknown argument; this agent takes: service, severity"),
            ("/arguments/severity", "expected string, got number"),
            ("/arguments/service", "missing; required argument (The affected service)"),
        ]
    );
    let err = registry.prompt("nope", json!({}), &options).unwrap_err();
    assert_eq!(err.to_string(), "unknown agent 'nope'; available agents: incident-responder, looper, runbook-guide");
}

#[test]
fn a_broken_agent_script_and_unknown_tools_are_reported() {
    let toml = r#"
[agents.inline.helper]
description = "Uses a tool that does not exist."
system_prompt = "Help."
tools = ["search", "deploy-prod"]

[agents.script.broken]
path = "tools/broken.lua"
"#;
    let (_dir, registry) = fixture(
        toml,
        &[("broken.lua", "agent = { name = \"broken\", description = 3 }\nfunction agent.resolve() end\n")],
    )
    .into_parts();
    let problems = registry.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].message.contains("agent/description: expected non-empty string, got 3"),
        "{}",
        problems[0].message
    );
    // The unknown tool is a warning at start (the agent still loads) and an error in schema check.
    assert_eq!(registry.agents().count(), 1);
    let config = registry.kb().config();
    let checked = ctx::app::check(config);
    assert!(
        checked.problems.iter().any(|p| p.message.contains("names tools that are not registered: deploy-prod")),
        "{checked:?}"
    );
}

/// A real server for REST.
fn serve() -> (tokio::runtime::Runtime, String, tempfile::TempDir) {
    let (dir, registry) = registry_fixture().into_parts();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let security = Security::new(addr, None, vec![]).unwrap();
    let app = Arc::new(App::new(Arc::new(Tools::new(registry)), security, 1 << 20));
    runtime.spawn(server::run(listener, app, std::future::pending()));
    let _ = rustls::crypto::ring::default_provider().install_default();
    (runtime, format!("http://{addr}"), dir)
}

#[test]
fn rest_lists_and_resolves_agents_with_every_error_status() {
    let (runtime, base, _dir) = serve();
    let client = reqwest::Client::new();
    let send = |request: reqwest::RequestBuilder| {
        runtime.block_on(async {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        })
    };
    let (status, list) = send(client.get(format!("{base}/agents/list")));
    assert_eq!(status, 200);
    insta::assert_json_snapshot!("agents_list", list);
    let prompt = |name: &str, body: Value| send(client.post(format!("{base}/agents/{name}/prompt")).json(&body));
    let (status, resolved) = prompt("runbook-guide", json!({"question": "how do I roll back a deploy"}));
    assert_eq!(status, 200, "{resolved}");
    assert_eq!(resolved["agent"], "runbook-guide");
    insta::assert_json_snapshot!("agent_prompt_runbook_guide", resolved);
    let (status, inline) = prompt("incident-responder", json!({"service": "search-api"}));
    assert_eq!((status, inline["system"].as_str().unwrap().contains("search-api")), (200, true));

    let mut errors = serde_json::Map::new();
    let mut check = |label: &str, (status, body): (u16, Value), want: u16, code: &str| {
        assert_eq!(status, want, "{label}: {body}");
        assert_eq!(body["error"]["code"], code, "{label}: {body}");
        errors.insert(label.into(), json!({"status": status, "body": body}));
    };
    check("unknown_agent", prompt("nope", json!({})), 404, "not_found");
    check("missing_argument", prompt("incident-responder", json!({})), 400, "bad_request");
    check("extra_field", prompt("incident-responder", json!({"args": {}})), 400, "bad_request");
    check("timeout", prompt("looper", json!({})), 408, "timeout");
    insta::assert_json_snapshot!("agent_errors", errors);
    // Still serving after the timeout.
    assert_eq!(send(client.get(format!("{base}/health"))).1["agents"], 3);
}

/// MCP prompts over raw JSON-RPC.
#[test]
fn mcp_prompts_list_and_get() {
    let (_dir, registry) = registry_fixture().into_parts();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mcp = Mcp::new(Arc::new(Tools::new(registry)));
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    runtime.spawn(async move {
        if let Ok(running) = mcp.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let (reader, mut writer) = tokio::io::split(client_io);
    let mut lines = tokio::io::BufReader::new(reader).lines();
    let mut request = |id: u64, method: &str, params: Value| -> Value {
        runtime.block_on(async {
            let line = format!("{}\n", json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
            writer.write_all(line.as_bytes()).await.unwrap();
            loop {
                let line =
                    tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.unwrap().unwrap().unwrap();
                let message: Value = serde_json::from_str(&line).unwrap();
                if message["id"] == id {
                    return message;
                }
            }
        })
    };
    let init = request(
        0,
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}),
    );
    assert_eq!(init["result"]["capabilities"]["prompts"]["listChanged"], true);
    let list = request(1, "prompts/list", json!({}));
    let prompts = &list["result"]["prompts"];
    assert_eq!(prompts[0]["name"], "incident-responder");
    assert_eq!(
        prompts[0]["arguments"][0],
        json!({"name": "service", "description": "The affected service", "required": true})
    );
    let got = request(2, "prompts/get", json!({"name": "incident-responder", "arguments": {"service": "payments"}}));
    let messages = got["result"]["messages"].as_array().unwrap();
    assert!(messages[0]["content"]["text"].as_str().unwrap().contains("payments"), "{got}");
    // The tools to use close the system text, so the agent's own messages stay last.
    assert!(messages[0]["content"]["text"].as_str().unwrap().ends_with("\n\nTools to use: search, get."), "{got}");
    assert_eq!(messages.len(), 1, "{got}");
    let mut shapes = serde_json::Map::new();
    shapes.insert("get".into(), got);
    let unknown = request(3, "prompts/get", json!({"name": "nope"}));
    assert_eq!(unknown["error"]["code"], -32602);
    shapes.insert("unknown".into(), unknown);
    let missing = request(4, "prompts/get", json!({"name": "incident-responder"}));
    assert_eq!(missing["error"]["code"], -32602);
    assert_eq!(missing["error"]["data"]["details"][0]["path"], "/arguments/service");
    shapes.insert("missing_argument".into(), missing);
    insta::assert_json_snapshot!("mcp_prompt_shapes", shapes);
}

/// The shipped examples against the sample corpus, through the CLI.
#[test]
fn cli_agent_list_and_test_on_the_sample_workspace() {
    let ws = Workspace::sample();
    let listed = ws.ctx(&["agent", "list"]).ok();
    assert!(listed.contains("incident-responder  (ctx.toml)"), "{listed}");
    assert!(listed.contains("runbook-guide  (lua)"), "{listed}");
    let inline = ws.ctx(&["agent", "test", "incident-responder", "--arg", "service=payments"]).ok();
    assert!(inline.contains("You are the incident responder for payments"), "{inline}");
    let lua =
        ws.ctx(&["agent", "test", "runbook-guide", "--arg", "question=how do I roll back a deploy", "--json"]).json();
    assert!(lua["messages"][0]["content"].as_str().unwrap().starts_with("Document: Deploy runbook"), "{lua}");
    let missing = ws.ctx(&["agent", "test", "incident-responder"]);
    assert_eq!(missing.code(), 2);
    assert!(missing.stderr().contains("/arguments/service: missing"), "{}", missing.stderr());
    let init = ws.ctx(&["agent", "init", "triage"]).ok();
    assert!(init.contains("[agents.script.triage]"), "{init}");
}

#[test]
fn a_returned_agent_table_works_and_a_bad_resolve_result_is_a_clear_error() {
    let toml = r#"
[agents.script.returned]
path = "tools/returned.lua"

[agents.script.sloppy]
path = "tools/sloppy.lua"
"#;
    let returned = r#"
local a = { name = "returned", description = "Returned, not global.", arguments = { { name = "who" } } }
function a.resolve(args) return { system = "Hello " .. (args.who or "world") } end
return a
"#;
    let sloppy = r#"
agent = { name = "sloppy", description = "Returns the wrong shape." }
function agent.resolve() return { system = 42, messages = { { role = "robot", content = "x" } } } end
"#;
    let (_dir, registry) = fixture(toml, &[("returned.lua", returned), ("sloppy.lua", sloppy)]).into_parts();
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    let options = CallOptions { caller: "test", ..Default::default() };
    let prompt = registry.prompt("returned", json!({"who": "team"}), &options).unwrap();
    assert_eq!(prompt.system, "Hello team");
    let err = registry.prompt("sloppy", json!({}), &options).unwrap_err();
    assert_eq!(err.code(), ctx::types::ErrorCode::ToolError);
    assert!(err.to_string().starts_with("tools/sloppy.lua: agent.resolve must return"), "{err}");
}

#[test]
fn schema_check_rejects_an_agent_naming_an_unknown_tool() {
    let ws = Workspace::new(
        "[agents.inline.helper]\ndescription = \"Helps.\"\nsystem_prompt = \"Help.\"\ntools = [\"search\", \"deploy-prod\"]\n",
    );
    let run = ws.ctx(&["schema", "check"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(
        run.stderr().contains("agents.inline.helper: agent 'helper' names tools that are not registered: deploy-prod"),
        "{}",
        run.stderr()
    );
    // At start it is only a warning: the server still loads the agent.
    let listed = ws.ctx(&["agent", "list"]).ok();
    assert!(listed.contains("helper  (ctx.toml)"), "{listed}");
}
