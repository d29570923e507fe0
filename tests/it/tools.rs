//! The tool registry and its one call path, with real scripts and a real store: listing,
//! validation, every error code, helper results, the context bridge, a write tool against a
//! local HTTP stub, and concurrent calls.

use std::sync::Arc;
use std::time::Duration;

use ctx::config::{self, Config};
use ctx::kb::sync::{sync_target, SyncOptions};
use ctx::kb::Kb;
use ctx::lua::CancelHandle;
use ctx::schema::{Dialect, SchemaValidator};
use ctx::tools::{http_status, CallError, CallOptions, Output, Registry};
use serde_json::{json, Value};

use crate::common::{repo, stub};

pub struct Fixture {
    _dir: tempfile::TempDir,
    registry: std::sync::Arc<Registry>,
}

impl Fixture {
    /// The workspace folder (keep it alive) and the registry.
    pub fn into_parts(self) -> (tempfile::TempDir, std::sync::Arc<Registry>) {
        (self._dir, self.registry)
    }
}

/// A workspace with the sample corpus indexed, `tools_toml` appended to its config and each
/// `(file, text)` written under `tools/`.
/// A full listing: the built-ins (code mode's included), then `rest`.
pub fn listed(rest: &[&'static str]) -> Vec<&'static str> {
    let builtins = ctx::tools::BUILTINS.into_iter().chain(ctx::config::code_mode::CODE_MODE_TOOLS);
    builtins.chain(rest.iter().copied()).collect()
}

pub fn fixture(tools_toml: &str, scripts: &[(&str, &str)]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    for entry in std::fs::read_dir(repo().join("examples/corpus")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, root.join("docs").join(path.file_name().unwrap())).unwrap();
    }
    std::fs::create_dir_all(root.join("tools")).unwrap();
    for (file, text) in scripts {
        std::fs::write(root.join("tools").join(file), text).unwrap();
    }
    let file = root.join("ctx.toml");
    std::fs::write(&file, format!("[connectors.filesystem.docs]\nroot = \"docs\"\n\n{tools_toml}")).unwrap();
    let config = Config::load(&config::locate(Some(&file))).unwrap();
    let kb = Kb::open(Arc::new(config)).unwrap();
    let summaries = sync_target(&kb, "all", SyncOptions::default(), &mut |_| {}).unwrap();
    assert_eq!(summaries[0].added, 6, "the sample corpus is indexed");
    Fixture { _dir: dir, registry: std::sync::Arc::new(ctx::app::build(kb, None)) }
}

pub fn shipped(name: &str) -> String {
    std::fs::read_to_string(repo().join("tools").join(name)).unwrap()
}

impl Fixture {
    fn call(&self, name: &str, params: Value) -> Result<Output, CallError> {
        self.registry.call(name, params, &CallOptions { caller: "test", ..Default::default() })
    }

    fn ok(&self, name: &str, params: Value) -> Value {
        match self.call(name, params) {
            Ok(output) => output.value(),
            Err(e) => panic!("{name} failed: {e}"),
        }
    }

    fn err(&self, name: &str, params: Value) -> CallError {
        match self.call(name, params) {
            Ok(output) => panic!("{name} should fail, returned {:?}", output),
            Err(e) => e,
        }
    }
}

/// The REST status and body, and the MCP result, of one call: what the snapshots pin.
fn wire(result: &Result<Output, CallError>) -> Value {
    match result {
        Ok(output) => json!({"rest": {"status": 200, "body": output.rest_body()}, "mcp": output.mcp()}),
        Err(e) => {
            let mcp = if e.is_protocol_error() { json!({"jsonrpc_error": -32602}) } else { json!(e.mcp()) };
            json!({"rest": {"status": http_status(e.code()), "body": e.envelope()}, "mcp": mcp})
        }
    }
}

/// Each wire body must match its schema: the error envelope, the tool result, the MCP result.
fn assert_schema_valid(wire: &Value) {
    let rest = &wire["rest"]["body"];
    let name = if rest.get("error").is_some() { "Error" } else { "ToolResult" };
    let problems = SchemaValidator::for_definition(name).problems(rest, Dialect::Json);
    assert!(problems.is_empty(), "{name}: {problems:?} in {rest}");
    if wire["mcp"].get("content").is_some() {
        let problems = SchemaValidator::for_definition("McpCallResult").problems(&wire["mcp"], Dialect::Json);
        assert!(problems.is_empty(), "McpCallResult: {problems:?}");
    }
}

const SHIPPED_TOML: &str = r#"
[tools.script.echo]
path = "tools/echo.lua"
greeting = "hello"
api_token = "s3cret-token-value"

[tools.script.find-runbook]
path = "tools/find-runbook.lua"

[tools.script.create-jira-ticket]
path = "tools/create-jira-ticket.lua"
url = "https://example.atlassian.net"
email = "bot@example.com"
api_token = "another-s3cret"

[tools.script.nested]
path = "tools/nested.lua"
"#;

/// The seed 003 form: a full JSON Schema with a nested object, bounds and nested defaults.
const NESTED: &str = r#"
tool = {
  name = "nested",
  description = "Takes a nested object.",
  parameters = {
    type = "object",
    properties = {
      target = {
        type = "object",
        properties = {
          buffer_id = { type = "integer", minimum = 1, description = "Buffer to act on" },
          mode = { type = "string", enum = { "save", "discard" }, default = "save" },
        },
        required = { "buffer_id" },
        additionalProperties = false,
      },
      dry_run = { type = "boolean", default = false },
    },
    required = { "target" },
  },
  annotations = { destructive = true },
}
function tool.execute(params) return params end
"#;

fn shipped_fixture() -> Fixture {
    fixture(
        SHIPPED_TOML,
        &[
            ("echo.lua", &shipped("echo.lua")),
            ("find-runbook.lua", &shipped("find-runbook.lua")),
            ("create-jira-ticket.lua", &shipped("create-jira-ticket.lua")),
            ("nested.lua", NESTED),
        ],
    )
}

#[test]
fn listing_is_ordered_complete_and_free_of_config_values() {
    let f = shipped_fixture();
    assert!(f.registry.problems().is_empty(), "{:?}", f.registry.problems());
    let listing = serde_json::to_value(f.registry.listing()).unwrap();
    let names: Vec<&str> = listing["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, crate::tools::listed(&["create-jira-ticket", "echo", "find-runbook", "nested"]));
    let text = listing.to_string();
    for secret in ["s3cret-token-value", "another-s3cret", "bot@example.com", "hello"] {
        assert!(!text.contains(secret), "config value {secret:?} leaked into the listing");
    }
    let problems = SchemaValidator::for_definition("ToolsList").problems(&listing, Dialect::Json);
    assert!(problems.is_empty(), "{problems:?}");
    insta::assert_json_snapshot!("tools_list", listing);
}

#[test]
fn validation_reports_every_field_and_injects_defaults() {
    let f = shipped_fixture();
    let details = |e: CallError| -> Vec<String> {
        assert_eq!(e.code().to_string(), "bad_request");
        e.body().details.iter().map(|d| format!("{}: {}", d.path, d.message)).collect()
    };
    // Missing required, wrong type, enum, unknown parameter: all at once.
    let all = details(
        f.err("create-jira-ticket", json!({"body": 5, "priority": "urgent", "labels": ["ok", 3], "colour": "red"})),
    );
    assert!(all.contains(&"/title: missing; expected string".to_string()), "{all:?}");
    assert!(all.contains(&"/body: expected string, got 5".to_string()), "{all:?}");
    assert!(
        all.contains(
            &r#"/priority: expected one of ["Lowest","Low","Medium","High","Highest"], got "urgent""#.to_string()
        ),
        "{all:?}"
    );
    assert!(all.contains(&"/labels/1: expected string, got 3".to_string()), "{all:?}");
    assert!(all.iter().any(|l| l.starts_with("/colour: unknown field; expected one of: title, body")), "{all:?}");
    assert_eq!(all.len(), 5, "{all:?}");

    // Not an object at all.
    let top = details(f.err("echo", json!(["hi"])));
    assert_eq!(top, vec![": expected an object of named parameters, got an array".to_string()]);

    // Defaults are injected; null means "no parameters".
    assert_eq!(f.ok("echo", json!({"message": "hi"}))["message"], "hi");
    assert_eq!(f.ok("echo", json!({"message": "hi", "repeat": 3}))["message"], "hi hi hi");
    let none = details(f.err("echo", Value::Null));
    assert_eq!(none, vec!["/message: missing; expected string".to_string()]);

    // Nested schema (seed 003 form): nested bounds, nested defaults, nested unknown keys.
    let echoed = f.ok("nested", json!({"target": {"buffer_id": 2}}));
    assert_eq!(echoed, json!({"target": {"buffer_id": 2, "mode": "save"}, "dry_run": false}));
    let nested = details(f.err("nested", json!({"target": {"buffer_id": 0, "extra": 1}})));
    assert!(nested.contains(&"/target/buffer_id: expected integer at least 1, got 0".to_string()), "{nested:?}");
    assert!(nested.iter().any(|l| l.starts_with("/target/extra: unknown field")), "{nested:?}");

    // Built-ins validate the same way.
    let search = details(f.err("search", json!({"query": "", "limit": 0, "mode": "fuzzy"})));
    assert_eq!(search.len(), 3, "{search:?}");
    assert!(search.iter().any(|l| l.starts_with("/limit: expected integer between 1 and 1000")), "{search:?}");
}

const FAILING_TOML: &str = r#"
# A model that is not there: semantic search is unavailable (503), not a client error.
[embedding]
provider = "local"
path = "no-model-here"

[tools.script.fail]
path = "tools/fail.lua"
timeout = 1
memory_mb = 16
max_result_bytes = 2048
"#;

const FAILING: &str = r#"
tool = {
  name = "fail",
  description = "Fails in the way it is asked to.",
  parameters = {
    { name = "how", type = "string", required = true,
      enum = { "raise", "loop", "pcall_loop", "memory", "big", "sleep", "helper", "handled", "semantic", "no_source" } },
  },
}
function tool.execute(params, context)
  local how = params.how
  if how == "raise" then
    local t = nil
    return t.field
  elseif how == "loop" then
    while true do end
  elseif how == "pcall_loop" then
    while true do pcall(function() while true do end end) end
  elseif how == "memory" then
    local t = {}
    for i = 1, 1e9 do t[i] = string.rep("x", 1024) .. i end
  elseif how == "big" then
    return string.rep("x", 10000)
  elseif how == "sleep" then
    sleep(30)
  elseif how == "helper" then
    return MCP.error("jira_http_403", "Jira returned HTTP 403: Forbidden", { status = 403 })
  elseif how == "handled" then
    return { success = false, error = "Jira returned 403" }
  elseif how == "semantic" then
    return context.search("deploy", { mode = "semantic" })
  elseif how == "no_source" then
    return context.search{ query = "deploy", filters = { source = "git:nowhere" } }
  end
end
"#;

#[test]
fn every_error_code_has_its_envelope() {
    let f = fixture(FAILING_TOML, &[("fail.lua", FAILING)]);
    let mut bodies = serde_json::Map::new();
    let mut record = |label: &str, result: Result<Output, CallError>| {
        let w = wire(&result);
        assert_schema_valid(&w);
        bodies.insert(label.to_string(), w);
    };
    record("not_found", f.call("nope", json!({})));
    record("bad_request", f.call("fail", json!({"how": "sideways", "extra": true})));
    record("bad_request_unknown_source", f.call("search", json!({"query": "deploy", "source": "git:nowhere"})));
    record("not_found_document", f.call("get", json!({"id": "0000"})));
    record("unavailable", f.call("search", json!({"query": "deploy", "mode": "semantic"})));
    record("timeout", f.call("fail", json!({"how": "loop"})));
    record("timeout_through_pcall", f.call("fail", json!({"how": "pcall_loop"})));
    record("memory_limit", f.call("fail", json!({"how": "memory"})));
    record("result_too_large", f.call("fail", json!({"how": "big"})));
    record("tool_error", f.call("fail", json!({"how": "raise"})));
    record("tool_error_from_bridge", f.call("fail", json!({"how": "semantic"})));
    record("tool_error_bridge_source", f.call("fail", json!({"how": "no_source"})));
    record("tool_error_mcp_helper", f.call("fail", json!({"how": "helper"})));
    let cancel = CancelHandle::new();
    let stopper = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        stopper.cancel();
    });
    let started = std::time::Instant::now();
    let cancelled =
        f.registry.call("fail", json!({"how": "sleep"}), &CallOptions { cancel, caller: "test", ..Default::default() });
    assert!(started.elapsed() < Duration::from_secs(2), "cancel stops the script promptly");
    record("cancelled", cancelled);

    let code = |label: &str| bodies[label]["rest"]["body"]["error"]["code"].as_str().unwrap().to_string();
    for (label, expected) in [
        ("not_found", "not_found"),
        ("bad_request", "bad_request"),
        ("timeout", "timeout"),
        ("timeout_through_pcall", "timeout"),
        ("memory_limit", "memory_limit"),
        ("result_too_large", "result_too_large"),
        ("tool_error", "tool_error"),
        ("cancelled", "cancelled"),
        ("unavailable", "unavailable"),
    ] {
        assert_eq!(code(label), expected, "{label}");
    }
    let message = |label: &str| bodies[label]["rest"]["body"]["error"]["message"].as_str().unwrap().to_string();
    assert_eq!(message("timeout"), "tool 'fail' timed out after 1 second");
    // Sanitised: script-relative path and line, no absolute path, no traceback.
    let raised = message("tool_error");
    assert!(raised.starts_with("tools/fail.lua:14:"), "{raised}");
    assert!(!raised.contains("traceback") && !raised.contains(f._dir.path().to_str().unwrap()), "{raised}");
    assert!(message("not_found").contains(
        "available tools: search, get, sources, execute, list_servers, list_tools, describe_tool, search_tools, fail"
    ));
    insta::assert_json_snapshot!("tool_error_bodies", bodies);
}

const HELPERS: &str = r#"
tool = {
  name = "helpers",
  description = "Returns each kind of result.",
  parameters = { { name = "kind", type = "string", required = true } },
}
function tool.execute(params)
  local k = params.kind
  if k == "plain_table" then return { answer = 42, items = json.array({ "a", "b" }) }
  elseif k == "plain_string" then return "just text"
  elseif k == "plain_number" then return 7
  elseif k == "nothing" then return nil
  elseif k == "handled_error" then return { success = false, error = "Jira returned 403" }
  elseif k == "success" then return MCP.success({ saved = 3 })
  elseif k == "json" then return MCP.json({ 1, 2, 3 })
  elseif k == "text" then return MCP.text("Saved 3 buffers")
  elseif k == "error" then return MCP.error("INVALID_PARAMS", "Buffer 9 is not valid", { buffer_id = 9 })
  elseif k == "forged" then
    -- Looks like a helper result but is a plain table: it stays plain data.
    return { kind = "text", text = "not a helper" }
  end
end
"#;

#[test]
fn helper_results_map_to_rest_and_mcp_as_the_schema_says() {
    let f = fixture("[tools.script.helpers]\npath = \"tools/helpers.lua\"\n", &[("helpers.lua", HELPERS)]);
    let mut mappings = serde_json::Map::new();
    for kind in [
        "plain_table",
        "plain_string",
        "plain_number",
        "nothing",
        "handled_error",
        "success",
        "json",
        "text",
        "error",
        "forged",
    ] {
        let w = wire(&f.call("helpers", json!({"kind": kind})));
        assert_schema_valid(&w);
        mappings.insert(kind.to_string(), w);
    }
    assert_eq!(mappings["handled_error"]["rest"]["status"], 200);
    assert_eq!(mappings["handled_error"]["mcp"]["isError"], true);
    assert_eq!(mappings["error"]["rest"]["status"], 500);
    assert_eq!(
        mappings["error"]["rest"]["body"]["error"]["data"],
        json!({"code": "INVALID_PARAMS", "data": {"buffer_id": 9}})
    );
    assert_eq!(mappings["text"]["mcp"]["content"][0]["text"], "Saved 3 buffers");
    assert_eq!(mappings["success"]["mcp"]["structuredContent"], json!({"saved": 3}));
    assert_eq!(mappings["forged"]["rest"]["body"]["result"], json!({"kind": "text", "text": "not a helper"}));
    insta::assert_json_snapshot!("tool_result_mappings", mappings);
}

const SHADOW_TOML: &str = r#"
[tools.script.a-first]
path = "tools/first.lua"

[tools.script.b-second]
path = "tools/second.lua"

[tools.script.my-search]
path = "tools/search.lua"

[tools.script.broken]
path = "tools/broken.lua"

[tools.script.bad-meta]
path = "tools/bad-meta.lua"

[tools.script.good]
path = "tools/good.lua"
"#;

fn named(name: &str) -> String {
    format!(
        "tool = {{ name = {name:?}, description = \"d\" }}\nfunction tool.execute() return {{ from = {name:?} }} end\n"
    )
}

#[test]
fn shadowing_duplicates_and_broken_scripts_are_reported_while_the_rest_load() {
    let f = fixture(
        SHADOW_TOML,
        &[
            ("first.lua", &named("dup")),
            ("second.lua", &named("dup")),
            ("search.lua", &named("search")),
            ("broken.lua", "tool = {\n  name = 'broken',\n  description = 'x'\n"),
            ("bad-meta.lua", "tool = { name = 'bad meta', description = '', parameters = { { name = 'p', type = 'text' } } }\nfunction tool.execute() end\n"),
            ("good.lua", &named("good")),
        ],
    );
    let names: Vec<String> = f.registry.specs().map(|s| s.name.clone()).collect();
    assert_eq!(names, crate::tools::listed(&["dup", "good"]));
    assert_eq!(f.ok("dup", json!({}))["from"], "dup");
    assert_eq!(f.ok("good", json!({}))["from"], "good");
    // The built-in search is still the built-in.
    assert!(f.ok("search", json!({"query": "rollback"}))["results"].is_array());

    let problems: Vec<(String, String)> =
        f.registry.problems().iter().map(|p| (p.name.clone(), p.message.clone())).collect();
    let find = |name: &str| problems.iter().find(|(n, _)| n == name).map(|(_, m)| m.clone()).unwrap_or_default();
    assert_eq!(
        find("b-second"),
        "tools/second.lua ([tools.script.b-second]) declares the name 'dup', already taken by tools/first.lua ([tools.script.a-first]); tool names must be unique, so rename one"
    );
    assert_eq!(
        find("my-search"),
        "tools/search.lua ([tools.script.my-search]) declares the name 'search', which is a built-in tool; built-ins cannot be shadowed, so rename tool.name"
    );
    let broken = find("broken");
    assert!(broken.starts_with("tools/broken.lua:4:") && broken.contains("'}' expected"), "{broken}");
    let meta = find("bad-meta");
    assert!(meta.contains("tool/name: expected string matching"), "{meta}");
    assert!(meta.contains("tool/description: expected non-empty string"), "{meta}");
    assert!(meta.contains("tool/parameters"), "{meta}");
    assert_eq!(problems.len(), 4, "{problems:?}");
}

#[test]
fn bad_defaults_and_duplicate_parameters_fail_at_load() {
    let f = fixture(
        "[tools.script.d]\npath = \"tools/d.lua\"\n[tools.script.e]\npath = \"tools/e.lua\"\n",
        &[
            ("d.lua", "tool = { name = 'd', description = 'x', parameters = { { name = 'p', type = 'integer', default = 'ten' } } }\nfunction tool.execute() end\n"),
            ("e.lua", "tool = { name = 'e', description = 'x', parameters = { { name = 'p', type = 'string' }, { name = 'p', type = 'string' } } }\nfunction tool.execute() end\n"),
        ],
    );
    let problems: Vec<String> = f.registry.problems().iter().map(|p| p.message.clone()).collect();
    assert_eq!(
        problems,
        [
            "tools/d.lua: the default of p: expected integer, got \"ten\"",
            "tools/e.lua: tool.parameters declares \"p\" twice; remove one"
        ]
    );
}

const BRIDGE: &str = r#"
tool = { name = "bridge", description = "Uses every context function." }
function tool.execute(params, context)
  local hits = context.search("deploy", { limit = 2 })
  local table_form = context.search{ query = "deploy", limit = 1, filters = { source = "filesystem:docs" } }
  local doc = context.get(hits[1].id)
  local missing, why = context.get("does-not-exist")
  local sources = context.sources()
  return {
    hits = #hits, top = hits[1].title, table_form = #table_form, same_top = table_form[1].id == hits[1].id,
    doc_title = doc.title, chunks = #doc.chunks, missing = missing == nil, why = why,
    source = sources[1].name, documents = sources[1].documents, region = context.config.region,
  }
end
"#;

#[test]
fn the_context_bridge_reaches_the_store_in_both_call_forms() {
    let f = fixture(
        "[tools.script.bridge]\npath = \"tools/bridge.lua\"\nregion = \"eu-west-1\"\n",
        &[("bridge.lua", BRIDGE)],
    );
    let out = f.ok("bridge", json!({}));
    assert_eq!(out["hits"], 2);
    assert_eq!(out["top"], "Deploy runbook");
    assert_eq!(out["table_form"], 1);
    assert_eq!(out["same_top"], true);
    assert_eq!(out["doc_title"], "Deploy runbook");
    assert!(out["chunks"].as_u64().unwrap() >= 1);
    assert_eq!(out["missing"], true);
    assert_eq!(out["why"], "no document with id \"does-not-exist\"");
    assert_eq!(out["source"], "filesystem:docs");
    assert_eq!(out["documents"], 6);
    assert_eq!(out["region"], "eu-west-1");
}

#[test]
fn the_shipped_search_tool_finds_the_runbook() {
    let f = shipped_fixture();
    let out = f.ok("find-runbook", json!({"query": "roll back a failed deploy"}));
    assert_eq!(out["results"][0]["title"], "Deploy runbook");
    assert!(out["count"].as_u64().unwrap() >= 1);
    assert!(out["top_excerpt"].as_str().unwrap().len() > 50);
    let none = f.ok("find-runbook", json!({"query": "zebra quartz", "source": "filesystem:docs"}));
    assert_eq!(none["count"], 0);
    assert_eq!(none["results"], json!([]));
}

#[test]
fn the_jira_tool_sends_an_authenticated_json_request() {
    let (addr, received) = stub(|request| {
        if request.body.contains("\"FORBIDDEN\"") {
            (
                403,
                r#"{"errorMessages":["You do not have permission to create issues in this project."],"errors":{}}"#
                    .into(),
            )
        } else {
            (201, r#"{"id":"10001","key":"ENG-7","self":"x"}"#.into())
        }
    });
    let toml = format!(
        "[tools.script.jira]\npath = \"tools/create-jira-ticket.lua\"\nurl = \"http://{addr}\"\nemail = \"bot@example.com\"\napi_token = \"tok-123\"\nallow_hosts = [\"127.0.0.1\"]\n"
    );
    let f = fixture(&toml, &[("create-jira-ticket.lua", &shipped("create-jira-ticket.lua"))]);
    let out = f.ok(
        "create-jira-ticket",
        json!({"title": "Roll back the deploy", "body": "Line one.\n\nLine two.", "labels": ["ops"]}),
    );
    assert_eq!(out["key"], "ENG-7");
    assert_eq!(out["url"], format!("http://{addr}/browse/ENG-7"));
    assert!(out["related"].as_u64().unwrap() >= 1, "enrich found related docs: {out}");

    let requests = received.lock().unwrap().clone();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!((request.method.as_str(), request.path.as_str()), ("POST", "/rest/api/3/issue"));
    // base64("bot@example.com:tok-123")
    assert_eq!(request.headers["authorization"], "Basic Ym90QGV4YW1wbGUuY29tOnRvay0xMjM=");
    assert!(request.headers["content-type"].starts_with("application/json"));
    let body: Value = serde_json::from_str(&request.body).unwrap();
    let fields = &body["fields"];
    assert_eq!(fields["project"]["key"], "ENG");
    assert_eq!(fields["summary"], "Roll back the deploy");
    assert_eq!(fields["priority"]["name"], "Medium");
    assert_eq!(fields["labels"], json!(["ops"]));
    assert_eq!(fields["description"]["type"], "doc");
    let text = fields["description"].to_string();
    assert!(text.contains("Line one.") && text.contains("Related documentation") && text.contains("Deploy runbook"));

    // A refusal from Jira is a tool error carrying the status, not a crash.
    let err = f.err("create-jira-ticket", json!({"title": "t", "body": "b", "project": "FORBIDDEN", "enrich": false}));
    let body = err.envelope();
    assert_eq!(body["error"]["code"], "tool_error");
    assert_eq!(
        body["error"]["message"],
        "Jira returned HTTP 403: You do not have permission to create issues in this project."
    );
    assert_eq!(body["error"]["data"]["code"], "jira_http_403");
    assert_eq!(body["error"]["data"]["data"]["status"], 403);
}

const ISOLATION: &str = r#"
tool = { name = "iso", description = "Keeps a value in a global across a sleep.",
         parameters = { { name = "n", type = "integer", required = true } } }
function tool.execute(params)
  assert(shared == nil, "a global leaked in from another call")
  shared = params.n
  sleep(0.05)
  return { n = shared }
end
"#;

#[test]
fn concurrent_calls_are_isolated_and_a_timeout_does_not_disturb_others() {
    let f = fixture(
        &format!("[tools.script.iso]\npath = \"tools/iso.lua\"\n{FAILING_TOML}"),
        &[("iso.lua", ISOLATION), ("fail.lua", FAILING)],
    );
    let registry = &f.registry;
    std::thread::scope(|scope| {
        let looping = scope.spawn(|| registry.call("fail", json!({"how": "loop"}), &CallOptions::default()));
        let workers: Vec<_> = (0..8)
            .map(|n| scope.spawn(move || registry.call("iso", json!({"n": n}), &CallOptions::default())))
            .collect();
        for (n, worker) in workers.into_iter().enumerate() {
            let out = worker.join().unwrap().expect("isolated call succeeds");
            assert_eq!(out.value(), json!({"n": n}));
        }
        assert_eq!(looping.join().unwrap().unwrap_err().code().to_string(), "timeout");
    });
}

const POLLUTER_TOML: &str = "[tools.script.polluter]\npath = \"tools/polluter.lua\"\nsecret = \"s\"\n";

fn polluter_fixture() -> Fixture {
    fixture(
        POLLUTER_TOML,
        &[("polluter.lua", crate::sandbox::POLLUTER), ("pollutermod.lua", crate::sandbox::POLLUTER_MODULE)],
    )
}

#[test]
fn reused_vms_keep_calls_isolated_across_threads() {
    let f = polluter_fixture();
    let registry = &f.registry;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|n| {
                scope.spawn(move || {
                    let built = ctx::lua::vms_built_on_this_thread();
                    let reports: Vec<Value> = (0..40)
                        .map(|call| {
                            // Half the calls also pollute a required module.
                            let out =
                                registry.call("polluter", json!({"require": call % 2 == 0}), &CallOptions::default());
                            out.unwrap_or_else(|e| panic!("thread {n}, call {call}: {e}")).value()
                        })
                        .collect();
                    crate::sandbox::assert_isolated(&reports);
                    ctx::lua::vms_built_on_this_thread() - built
                })
            })
            .collect();
        for worker in workers {
            assert_eq!(worker.join().unwrap(), 1, "each thread reuses one VM for its 40 calls");
        }
    });
}

#[test]
fn inline_and_escalated_calls_are_isolated_too() {
    let f = polluter_fixture();
    let tools = ctx::tools::Tools::new(f.registry);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let built = ctx::lua::vms_built_on_this_thread();
        let mut reports = Vec::new();
        for _ in 0..20 {
            reports.push(tools.call("polluter".into(), json!({}), CallOptions::default()).await.unwrap().value());
        }
        // A pure script finishes inline, on this thread, in one reused VM.
        assert_eq!(ctx::lua::vms_built_on_this_thread() - built, 1);
        // `require` reads a file: the inline run stops there and the call runs on the pool.
        for _ in 0..10 {
            let params = json!({"require": true});
            reports.push(tools.call("polluter".into(), params, CallOptions::default()).await.unwrap().value());
        }
        // After an escalation the next calls skip the inline attempt, and stay isolated.
        for _ in 0..10 {
            reports.push(tools.call("polluter".into(), json!({}), CallOptions::default()).await.unwrap().value());
        }
        crate::sandbox::assert_isolated(&reports);
    });
}

/// An escalated call has its effects exactly once: the inline attempt stops before the request
/// goes out, and the run on the pool sends it.
#[test]
fn an_escalated_call_sends_its_request_once() {
    let (addr, received) = stub(|_| (200, "{\"ok\": true}".into()));
    let script = r#"
tool = { name = "notify", description = "Posts after some work.", parameters = { { name = "url", type = "string", required = true } } }
function tool.execute(params)
  local words = {}
  for i = 1, 200 do words[i] = ("w" .. i):upper() end
  log.info("posting", #words)
  return http.post(params.url, { words = #words }).json
end
"#;
    let toml = "[tools.script.notify]\npath = \"tools/notify.lua\"\nallow_hosts = [\"127.0.0.1\"]\n";
    let f = fixture(toml, &[("notify.lua", script)]);
    let tools = ctx::tools::Tools::new(f.registry);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        for call in 1..=5 {
            let params = json!({"url": format!("http://{addr}/hook")});
            let out = tools.call("notify".into(), params, CallOptions::default()).await.unwrap();
            assert_eq!(out.value(), json!({"ok": true}));
            assert_eq!(received.lock().unwrap().len(), call, "one request per call");
        }
    });
}

#[test]
fn async_callers_run_on_the_blocking_pool_and_cancel_on_drop() {
    let f = fixture(FAILING_TOML, &[("fail.lua", FAILING)]);
    let tools = ctx::tools::Tools::new(f.registry);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let out = tools.call("search".into(), json!({"query": "deploy"}), CallOptions::default()).await.unwrap();
        assert!(out.value()["results"].as_array().unwrap().len() > 1);
        // The caller gives up after 100 ms; the script (sleep 30) is cancelled, not left running.
        let started = std::time::Instant::now();
        let gave_up = tokio::time::timeout(
            Duration::from_millis(100),
            tools.call("fail".into(), json!({"how": "sleep"}), CallOptions::default()),
        )
        .await;
        assert!(gave_up.is_err());
        // The blocking pool is free again well before the script's own 1 s deadline.
        let out = tools.call("search".into(), json!({"query": "deploy"}), CallOptions::default()).await.unwrap();
        assert!(out.value()["results"].is_array());
        assert!(started.elapsed() < Duration::from_secs(1));
    });
}

#[test]
fn progress_reports_reach_the_caller() {
    let script = r#"
tool = { name = "slow", description = "Reports progress." }
function tool.execute()
  for i = 1, 3 do progress(i, 3, "step " .. i) end
  return "done"
end
"#;
    let f = fixture("[tools.script.slow]\npath = \"tools/slow.lua\"\n", &[("slow.lua", script)]);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let options = CallOptions {
        progress: Some(Arc::new(move |p: ctx::lua::Progress| sink.lock().unwrap().push((p.done, p.total, p.message)))),
        ..Default::default()
    };
    let out = f.registry.call("slow", json!({}), &options).unwrap();
    assert_eq!(out, Output::Value(json!("done")));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2], (3.0, Some(3.0), Some("step 3".to_string())));
    // Without a sink, progress is a no-op.
    assert!(f.call("slow", json!({})).is_ok());
}

#[test]
fn ctx_tool_cli_init_test_and_list() {
    let ws =
        crate::common::Workspace::new("[tools.script.hello]\npath = \"tools/hello.lua\"\nsecret = \"zzz-hidden\"\n");
    let init = ws.ctx(&["tool", "init", "hello"]).ok();
    assert!(init.contains("[tools.script.hello]"), "{init}");
    assert!(ws.path().join("tools/hello.lua").is_file());
    let defs = std::fs::read_to_string(ws.path().join("tools/ctx.meta.lua")).unwrap();
    assert!(defs.starts_with("---@meta"));
    assert!(defs.contains("MCP") && defs.contains("context") && defs.contains("http"));
    assert_eq!(ws.ctx(&["tool", "init", "search"]).code(), 2, "built-in names are refused");
    assert_eq!(ws.ctx(&["tool", "init", "hello"]).code(), 2, "no overwrite without --force");

    // The scaffold works as written, through the real call path; --param is typed by the schema.
    let run = ws.ctx(&[
        "tool",
        "test",
        "tools/hello.lua",
        "--param",
        "query=deploy",
        "--param",
        "limit=2",
        "--source",
        "hello",
    ]);
    let out = run.ok();
    assert!(out.contains("✓ Script loaded") && out.contains("✓ 2 parameter(s) declared"), "{out}");
    assert!(
        out.contains(r#"execute({"limit":2,"query":"deploy"})"#)
            || out.contains(r#"execute({"query":"deploy","limit":2})"#),
        "{out}"
    );
    let json_out = ws.ctx(&["tool", "test", "tools/hello.lua", "--param", "query=deploy", "--json"]).json();
    assert_eq!(json_out["result"]["query"], "deploy");

    let bad = ws.ctx(&["tool", "test", "tools/hello.lua", "--param", "limit=2", "--json"]);
    assert_eq!(bad.code(), 2);
    let envelope: Value = serde_json::from_str(&bad.stdout()).unwrap();
    assert_eq!(envelope["error"]["details"][0]["path"], "/query");
    let typed = ws.ctx(&["tool", "test", "tools/hello.lua", "--param", "query=x", "--param", "limit=two"]);
    assert_eq!(typed.code(), 2);
    assert!(typed.stderr().contains("--param limit=two: expected an integer"), "{}", typed.stderr());

    ws.write("tools/broken.lua", "tool = {");
    std::fs::write(
        ws.path().join("ctx.toml"),
        "[tools.script.hello]\npath = \"tools/hello.lua\"\nsecret = \"zzz-hidden\"\n[tools.script.broken]\npath = \"tools/broken.lua\"\n",
    )
    .unwrap();
    let listed = ws.ctx(&["tool", "list", "--json"]).json();
    let names: Vec<&str> = listed["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, crate::tools::listed(&["hello"]));
    assert_eq!(listed["problems"][0]["name"], "broken");
    assert!(!listed.to_string().contains("zzz-hidden"));
    let text = ws.ctx(&["tool", "list"]).ok();
    assert!(text.contains("hello  (tools/hello.lua)") && text.contains("broken  (broken"), "{text}");
    let check = ws.ctx(&["schema", "check"]);
    assert_eq!(check.code(), 2);
    assert!(check.stderr().contains("tools.script.broken: tools/broken.lua:1:"), "{}", check.stderr());
}

#[test]
fn shipped_scripts_pass_schema_check() {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    for name in ["echo.lua", "find-runbook.lua", "create-jira-ticket.lua"] {
        std::fs::copy(repo().join("tools").join(name), tools.join(name)).unwrap();
    }
    std::fs::write(
        dir.path().join("ctx.toml"),
        SHIPPED_TOML.replace("[tools.script.nested]\npath = \"tools/nested.lua\"\n", ""),
    )
    .unwrap();
    let run = crate::common::run_in(dir.path(), &["schema", "check"]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
}

const CHAIN: &str = r#"
tool = {
  name = "chain",
  description = "Calls search through context.call, or itself when asked.",
  parameters = { { name = "again", type = "boolean", default = false } },
  execute = function(params, context)
    if params.again then
      return context.call("chain", { again = true })
    end
    local r = context.call("search", { query = "deploy" })
    local ok, err = pcall(context.call, "nope", {})
    return { hits = #r.results, unknown = tostring(err) }
  end,
}
"#;

#[test]
fn context_call_chains_tools_and_bounds_recursion() {
    let f = fixture("[tools.script.chain]\npath = \"tools/chain.lua\"\n", &[("chain.lua", CHAIN)]);
    let out = f.ok("chain", json!({}));
    assert!(out["hits"].as_u64().is_some(), "{out}");
    assert!(
        out["unknown"].as_str().unwrap().contains("context.call: tool 'nope' failed: unknown tool 'nope'"),
        "{out}"
    );
    // chain → chain → chain: the third time on the chain is refused, and the message shows it.
    let err = f.err("chain", json!({"again": true})).to_string();
    assert!(err.contains("it would be running 3 times at once"), "{err}");
    assert!(err.contains("chain: chain → chain → chain"), "{err}");
}

/// A principal (a scoped token) reaches only its tools: directly, and through the calls a tool
/// makes for it (`context.call`), which carry its principal. Out of scope is unknown.
#[test]
fn a_principal_reaches_only_its_tools_also_through_inner_calls() {
    let f = fixture("[tools.script.chain]\npath = \"tools/chain.lua\"\n", &[("chain.lua", CHAIN)]);
    let scoped = |patterns: &[&str]| CallOptions {
        caller: "test",
        principal: Some(Arc::new(
            ctx::tools::Principal::new("ci", &patterns.iter().map(|p| p.to_string()).collect::<Vec<_>>()).unwrap(),
        )),
        ..Default::default()
    };
    let err = f.registry.call("search", json!({"query": "deploy"}), &scoped(&["chain"])).unwrap_err();
    assert!(matches!(err, CallError::UnknownTool(_)), "{err}");
    assert!(err.to_string().contains("available tools: chain"), "{err}");
    // The inner search is refused as unknown, and the script sees that.
    let inner = f.registry.call("chain", json!({}), &scoped(&["chain"])).unwrap_err().to_string();
    assert!(inner.contains("context.call: tool 'search' failed: unknown tool 'search'"), "{inner}");
    // In scope, the same call works.
    assert!(f.registry.call("chain", json!({}), &scoped(&["chain", "search"])).is_ok());
}

const WAITER: &str = r#"
tool = {
  name = "waiter",
  description = "Calls a slow tool through context.call.",
  parameters = { { name = "name", type = "string", default = "slow" } },
  execute = function(params, context)
    return context.call(params.name, {})
  end,
}
"#;

const SLOW: &str = r#"
tool = { name = "slow", description = "Sleeps 10 s." }
function tool.execute() sleep(10) return "late" end
"#;

/// `context.call` blocks its caller, so the callee stops at the caller's deadline (1 s here),
/// not at its own (20 s); and a huge tool name is refused before it is copied.
#[test]
fn context_call_holds_the_callers_deadline_and_bounds_the_name() {
    let f = fixture(
        "[tools.script.waiter]\npath = \"tools/waiter.lua\"\ntimeout = 1\n[tools.script.slow]\npath = \"tools/slow.lua\"\ntimeout = 20\n",
        &[("waiter.lua", WAITER), ("slow.lua", SLOW)],
    );
    let started = std::time::Instant::now();
    let err = f.err("waiter", json!({}));
    assert!(started.elapsed() < std::time::Duration::from_secs(6), "ran {:?}: {err}", started.elapsed());
    assert_eq!(err.to_string(), "tool 'waiter' timed out after 1 second");
    let err = f.err("waiter", json!({"name": "x".repeat(10_000_000)})).to_string();
    assert!(err.contains("the tool name is 10000000 bytes long; tool names have at most 256"), "{err}");
}
