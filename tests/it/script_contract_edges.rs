//! The script contract at its edges (from an attacker's review): host errors as plain strings, empty tables read
//! as lists by the schema, the connector context and incremental deletes, BOM and `#` lines,
//! the open REST pages and `load_failed` answers, and `${VAR}` isolation. Each test is one
//! attack; the ones that found a hole name it in their comment. Everything runs through the
//! real binary, a real server and real SQLite.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{listening_address, Run, Workspace, BIN};

/// A variable no test environment sets.
const UNSET: &str = "CTX_REVIEW16_NEVER_SET";

/// `ctx <args>` in the workspace with extra environment variables.
fn ctx_with_env(ws: &Workspace, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut command = Command::new(BIN);
    command
        .args(["--config", "ctx.toml"])
        .args(args)
        .current_dir(ws.path())
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG");
    for (k, v) in env {
        command.env(k, v);
    }
    Run(command.output().expect("run ctx"))
}

/// `ctx tool test <script> --json`: the response body the call would get.
fn tool_test(ws: &Workspace, env: &[(&str, &str)], script: &str) -> Value {
    let out = ctx_with_env(ws, env, &["tool", "test", script, "--json"]);
    serde_json::from_str(out.stdout().trim())
        .unwrap_or_else(|e| panic!("{e}\nstdout:\n{}\nstderr:\n{}", out.stdout(), out.stderr()))
}

/// Nothing of ctx's own machinery may show in a message a script or a client reads.
#[track_caller]
fn assert_clean(text: &str) {
    for internal in ["raw_pcall", "sandbox", "traceback", "runtime error", "callback error", "[C]"] {
        assert!(!text.contains(internal), "{internal:?} leaked into {text:?}");
    }
}

fn documents(ws: &Workspace, source: &str) -> Vec<String> {
    let db = ws.db();
    let mut stmt = db.prepare("SELECT source_id FROM documents WHERE source = ?1 ORDER BY source_id").unwrap();
    stmt.query_map([source], |r| r.get(0)).unwrap().map(Result::unwrap).collect()
}

fn last_error(ws: &Workspace, source: &str) -> String {
    ws.db()
        .query_row("SELECT last_error FROM sync_state WHERE source = ?1", [source], |r| r.get::<_, Option<String>>(0))
        .unwrap()
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// Host errors: `api::function` and the sandbox's pcall

/// Found: a host function's error quoted its argument whole (`fs.read`, `env.get`, `http.get`,
/// `require`), and the message was then copied several times in Rust (placed at the line,
/// sanitised, redacted) before it went back into Lua: a 100 MB string took 1.2 GB of the
/// process's memory, outside the script's cap. Now a host error quotes a short cut of its
/// argument, and no host error message is longer than a script error's cap.
#[test]
fn host_errors_quote_only_a_short_cut_of_their_arguments() {
    let ws = Workspace::new("[tools.script.probe]\npath = \"probe.lua\"\n");
    ws.write(
        "probe.lua",
        r#"tool = { name = "probe", description = "Feeds a long string to every host API that names its argument.", parameters = {} }
function tool.execute()
  local long = string.rep("a", 1000000)
  local out = {}
  for _, name in ipairs({ "env.get", "fs.read", "fs.list", "http.get", "require" }) do
    local module, field = name:match("^(%w+)%.?(%w*)$")
    local f = field ~= "" and _G[module][field] or _G[module]
    local ok, err = pcall(f, long)
    out[name] = { ok = ok, kind = type(err), err = type(err) == "string" and err or "", length = type(err) == "string" and #err or 0 }
  end
  return out
end
"#,
    );
    let body = tool_test(&ws, &[], "probe.lua");
    let result = body["result"].as_object().unwrap_or_else(|| panic!("{body}"));
    assert_eq!(result.len(), 5, "{body}");
    for (name, caught) in result {
        assert_eq!((&caught["ok"], &caught["kind"]), (&json!(false), &json!("string")), "{name}: {caught}");
        let err = caught["err"].as_str().unwrap();
        assert!(err.starts_with(&format!("probe.lua:8: {name}: ")), "{name}: {}", &err[..err.len().min(200)]);
        // The error says what it was given, cut: enough to recognise it, not a megabyte.
        assert!(caught["length"].as_u64().unwrap() <= 1024, "{name}: {} bytes", caught["length"]);
        assert_clean(err);
    }
}

/// Found: the sandbox's pcall turns a host error into a plain string, but Lua 5.4 hands the
/// error to the `__close` metamethod of a to-be-closed variable first, as mlua's error value:
/// `tostring` of it showed `raw_pcall`, `sandbox:123` and a stack traceback, unredacted. Its
/// text now reads as the caught message wherever it is read. (It is still a userdata there:
/// raising host errors as Lua strings would need a Lua wrapper around each host function, and
/// a script's `return http.get(...)` tail call would then lose the line the message names.)
#[test]
fn a_close_handler_gets_the_plain_message_too() {
    let ws =
        Workspace::new(&format!("[tools.script.probe]\npath = \"probe.lua\"\napi_token = \"${{{UNSET}_TOKEN}}\"\n"));
    ws.write(
        "probe.lua",
        r#"tool = { name = "probe", description = "Captures a host error in a __close handler.", parameters = {} }
function tool.execute(params, context)
  local seen
  local ok, caught = pcall(function()
    local guard <close> = setmetatable({}, { __close = function(_, err) seen = err end })
    http.get("not a url " .. context.config.api_token)
  end)
  return { kind = type(seen), seen = tostring(seen), formatted = string.format("%s", seen), caught = caught }
end
"#,
    );
    let secret = "review16-close-secret-value";
    let body = tool_test(&ws, &[(&format!("{UNSET}_TOKEN"), secret)], "probe.lua");
    let result = &body["result"];
    assert_eq!(result["seen"], result["caught"], "{body}");
    assert_eq!(result["formatted"], result["caught"], "{body}");
    let seen = result["seen"].as_str().unwrap();
    assert!(seen.starts_with("probe.lua:6: http.get: "), "{seen}");
    assert_clean(seen);
    assert!(!body.to_string().contains(secret), "{body}");
}

// ---------------------------------------------------------------------------------------------
// `lists_where_expected`

/// Found: each empty table was settled with two or three validations of the whole value, up to
/// 64 of them, all in Rust after the script returned, where no deadline is checked: an agent
/// with a 2 s timeout returning 64 `content = {}` among 60,000 messages took 24 s of CPU. The
/// rule now costs a few validations whatever the number of empty tables.
#[test]
fn empty_tables_settle_in_a_few_validations() {
    let schema = json!({
        "type": "object",
        "properties": {
            "messages": {"type": "array", "items": {
                "type": "object",
                "properties": {"role": {"enum": ["user"]}, "content": {"type": "string"}, "tags": {"type": "array"}},
            }},
        },
    });
    let validator = ctx::schema::SchemaValidator::compile(schema).unwrap();
    // 64 empty tables, the most the rule looks at: half where no list helps, half where one does.
    let mut messages: Vec<Value> = (0..32).map(|_| json!({"role": "user", "content": {}})).collect();
    messages.extend((0..32).map(|_| json!({"role": "user", "content": "x", "tags": {}})));
    messages.extend((0..1000).map(|_| json!({"role": "bot", "content": "y"})));
    let mut value = json!({ "messages": messages });
    let calls = std::cell::Cell::new(0);
    ctx::lua::convert::lists_where_expected(&mut value, &|v| {
        calls.set(calls.get() + 1);
        validator.problems(v, ctx::schema::Dialect::Json).into_iter().map(|p| p.path).collect()
    });
    assert!(calls.get() <= 4, "{} validations for 64 empty tables", calls.get());
    // The rule still holds: a list where a list fixes it, an object where nothing does.
    assert_eq!(value["messages"][0]["content"], json!({}));
    assert_eq!(value["messages"][31]["content"], json!({}));
    assert_eq!(value["messages"][32]["tags"], json!([]));
    assert_eq!(value["messages"][63]["tags"], json!([]));
}

// ---------------------------------------------------------------------------------------------
// The connector context

const TWO_SOURCES: &str = r#"
[connectors.filesystem.docs]
root = "docs"

[connectors.script.sneaky]
path = "sneaky.lua"
"#;

/// Proves fine: an incremental scan deletes only documents of its own source, whatever the ids
/// it names (another source's ids, paths, SQL wildcards).
#[test]
fn an_incremental_scan_cannot_delete_another_sources_documents() {
    let ws = Workspace::new(TWO_SOURCES);
    ws.write("docs/a.md", "# A\nalpha");
    ws.write("docs/b.md", "# B\nbeta");
    ws.write(
        "sneaky.lua",
        r#"connector = { name = "sneaky" }
function connector.scan(config, context)
  local mine = { { source_id = "mine", title = "Mine", body = "mine", updated_at = 0 } }
  if context.last_sync == nil then return mine end
  return { items = {}, deleted = { "a.md", "docs/a.md", "./b.md", "%", "filesystem:docs", "../docs/b.md", "b.md' OR '1'='1", "mine" } }
end
"#,
    );
    ws.ctx(&["sync"]).ok();
    let docs = documents(&ws, "filesystem:docs");
    assert_eq!(docs.len(), 2, "{docs:?}");
    ws.ctx(&["sync", "script:sneaky"]).ok();
    assert_eq!(documents(&ws, "filesystem:docs"), docs);
    // Its own document it may delete.
    assert!(documents(&ws, "script:sneaky").is_empty());
}

/// Found: the ids of `deleted` were all copied out of Lua before the budget was looked at, so a
/// list of two million references to one 1 KiB string (32 MiB of Lua) became 2 GiB of Rust
/// strings. Now they count against `max_bytes` as they are read. The sync runs with its address
/// space capped: before the fix it died of an allocation failure.
#[test]
fn deleted_ids_count_against_max_bytes_as_they_are_read() {
    let ws = Workspace::new("[connectors.script.eraser]\npath = \"eraser.lua\"\nmax_bytes = 1048576\n");
    ws.write(
        "eraser.lua",
        r#"connector = { name = "eraser" }
function connector.scan(config, context)
  local id, ids = string.rep("x", 1000), {}
  for i = 1, 2000000 do ids[i] = id end
  return { items = {}, deleted = ids }
end
"#,
    );
    let output = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v 1500000 && exec {BIN} --config ctx.toml sync script:eraser"))
        .current_dir(ws.path())
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .output()
        .unwrap();
    let run = Run(output);
    assert_eq!(run.code(), 1, "stdout:\n{}\nstderr:\n{}", run.stdout(), run.stderr());
    let error = last_error(&ws, "script:eraser");
    assert!(error.contains("more than 1048576 bytes"), "{error}");
}

/// Found: `{deleted = {...}}` without `items` (a typo, or `items = changed` with `changed` nil)
/// read as a full scan that returned nothing, and deleted every document of the source. Now
/// it fails the sync and says what is missing; the documents stay.
#[test]
fn deleted_without_items_fails_the_sync_instead_of_emptying_the_source() {
    let ws = Workspace::new("[connectors.script.forgetful]\npath = \"forgetful.lua\"\n");
    ws.write(
        "forgetful.lua",
        r#"connector = { name = "forgetful" }
function connector.scan(config, context)
  if context.last_sync == nil then
    return { { source_id = "one", title = "One", body = "one", updated_at = 0 },
             { source_id = "two", title = "Two", body = "two", updated_at = 0 } }
  end
  local changed -- nil: the script meant `items = changed`
  return { items = changed, deleted = { "one" } }
end
"#,
    );
    ws.ctx(&["sync"]).ok();
    assert_eq!(documents(&ws, "script:forgetful"), ["one", "two"]);
    let second = ws.ctx(&["sync"]);
    assert_eq!(second.code(), 1, "{}\n{}", second.stdout(), second.stderr());
    assert_eq!(documents(&ws, "script:forgetful"), ["one", "two"]);
    let error = last_error(&ws, "script:forgetful");
    assert!(error.contains("`deleted` without `items`"), "{error}");
}

/// Proves fine: `context.state.set` takes JSON values only, refuses a function, a cycle and a
/// key over 256 bytes whole (the state keeps its last value), and `nil` removes a key.
#[test]
fn connector_state_takes_json_values_only() {
    let ws = Workspace::new("[connectors.script.stateful]\npath = \"stateful.lua\"\n");
    ws.write(
        "stateful.lua",
        r#"connector = { name = "stateful" }
function connector.scan(config, context)
  local set = context.state.set
  set("kept", "v1")
  set("gone", 1)
  set("gone", nil)
  local cycle = {} cycle.self = cycle
  local refused = {}
  for _, case in ipairs({ { "kept", function() end }, { "kept", cycle }, { string.rep("k", 257), 1 },
                          { "kept", setmetatable({}, { __index = function() error("never read") end }) } }) do
    local ok, err = pcall(set, case[1], case[2])
    refused[#refused + 1] = ok and "accepted" or err
  end
  set("refused", refused)
  set("kept_value", context.state.get("kept"))
  return {}
end
"#,
    );
    ws.ctx(&["sync"]).ok();
    let state: Value = ws
        .db()
        .query_row("SELECT state_json FROM connector_state WHERE source = 'script:stateful'", [], |r| {
            Ok(serde_json::from_str(&r.get::<_, String>(0)?).unwrap())
        })
        .unwrap();
    assert!(state.get("gone").is_none(), "{state}");
    let refused: Vec<&str> = state["refused"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for (i, err) in refused.iter().take(3).enumerate() {
        assert!(err.starts_with("stateful.lua:11: context.state.set: "), "case {i}: {err}");
        assert_clean(err);
    }
    assert!(refused[2].contains("a key is 1 to 256 bytes, got 257"), "{}", refused[2]);
    // An empty table with a metatable is just an empty object: its __index never runs.
    assert_eq!(refused[3], "accepted");
    assert_eq!(state["kept"], json!({}), "the last accepted value");
    assert_eq!(state["kept_value"], json!({}));
}

// ---------------------------------------------------------------------------------------------
// BOM and `#` lines

/// Proves fine: a BOM and a first line starting with `#` that is not a shebang are dropped and
/// every later line keeps its number, in a script and in a module it requires.
#[test]
fn a_hash_first_line_keeps_every_line_number() {
    let ws = Workspace::new("[tools.script.hashed]\npath = \"hashed.lua\"\n");
    ws.write(
        "hashed.lua",
        "\u{feff}# a comment line, as some editors write one\r\ntool = { name = \"hashed\", description = \"d\", parameters = {} }\nlocal lib = require(\"lib\")\nfunction tool.execute()\n  return lib.fail()\nend\n",
    );
    ws.write(
        "lib.lua",
        "# not a shebang either\nlocal lib = {}\nfunction lib.fail()\n  error(\"line four\")\nend\nreturn lib\n",
    );
    let body = tool_test(&ws, &[], "hashed.lua");
    assert_eq!(body["error"]["message"], "lib.lua:4: line four", "{body}");
}

// ---------------------------------------------------------------------------------------------
// REST: what a caller without the token learns, and what `load_failed` says

/// A `ctx serve` child, stopped when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(ws: &Workspace, env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(BIN);
        command
            .args(["--config", "ctx.toml", "serve", "--bind", "127.0.0.1:0"])
            .current_dir(ws.path())
            .env_remove("CTX_CONFIG")
            .env_remove("CTX_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn ctx serve");
        let addr = listening_address(&mut child).unwrap_or_else(|line| panic!("no address in {line:?}"));
        Server { child, addr }
    }

    /// One request on a fresh connection: the status and the body as text.
    fn request(&self, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\n{auth}Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    }
}

const TOKEN: &str = "review16-server-token-0123456789";
const TOOL_SECRET: &str = "review16-tool-secret-abcdef";

/// Proves fine: with `server.auth_token` set, a caller without it gets `/health`'s status and
/// count, the published OpenAPI document and the Swagger UI, and nothing else: no tool or agent
/// name, no load problem, no config block, no 405 that says which routes exist. With the token,
/// `load_failed` and `/health` name the problem, with the config's secrets redacted.
#[test]
fn a_caller_without_the_token_learns_nothing_private() {
    let ws = Workspace::new(&format!(
        "[server]\nauth_token = \"${{{UNSET}_SERVER}}\"\n\n[tools.script.secretive-tool]\npath = \"secretive.lua\"\napi_token = \"${{{UNSET}_TOOL}}\"\nallow_env = [\"{UNSET}_TOOL_COPY\"]\n\n[agents.inline.hidden-agent]\ndescription = \"Private.\"\nsystem_prompt = \"Hi.\"\n"
    ));
    // The script fails to load with the secret (read from its allowed variable) in its message.
    ws.write(
        "secretive.lua",
        &format!("tool = {{ name = \"secretive-tool\", description = \"d\" }}\nerror(\"cannot start with \" .. env.get(\"{UNSET}_TOOL_COPY\"))\n"),
    );
    let env = [
        (format!("{UNSET}_SERVER"), TOKEN),
        (format!("{UNSET}_TOOL"), TOOL_SECRET),
        (format!("{UNSET}_TOOL_COPY"), TOOL_SECRET),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let server = Server::start(&ws, &env);

    let (status, health) = server.request("GET", "/health", None, "");
    assert_eq!(status, 200);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health, json!({"status": "degraded", "problem_count": 1}));
    let (status, document) = server.request("GET", "/openapi.json", None, "");
    assert_eq!(status, 200);
    for private in ["secretive", "hidden-agent", TOOL_SECRET, TOKEN] {
        assert!(!document.contains(private), "{private} in the open document");
    }
    for (method, path) in [
        ("POST", "/tools/secretive-tool"),
        ("GET", "/tools/secretive-tool"),
        ("POST", "/agents/hidden-agent/prompt"),
        ("DELETE", "/tools/list"),
        ("DELETE", "/mcp"),
        ("GET", "/docs/../tools/list"),
        ("GET", "/openapi.json/"),
    ] {
        let (status, body) = server.request(method, path, None, "{}");
        assert!(matches!(status, 401 | 404), "{method} {path}: {status} {body}");
        assert!(!body.contains("secretive") || status == 404, "{method} {path}: {body}");
        assert!(!body.contains("cannot start"), "{method} {path}: {body}");
    }

    // With the token: the reason, without the secret.
    let (status, body) = server.request("POST", "/tools/secretive-tool", Some(TOKEN), "{}");
    assert_eq!(status, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "load_failed");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("cannot start with [redacted"), "{message}");
    let (_, health) = server.request("GET", "/health", Some(TOKEN), "");
    assert!(health.contains("cannot start with [redacted"), "{health}");
    assert!(!health.contains(TOOL_SECRET) && !health.contains(TOKEN), "{health}");
}

/// Proves fine: a secret from the config that a script puts in an error (a raised table's
/// message, code and fields, or a host error quoting a URL that carries it) reaches the REST
/// client redacted.
#[test]
fn errors_that_carry_a_config_secret_reach_the_client_redacted() {
    let ws =
        Workspace::new(&format!("[tools.script.leaky]\npath = \"leaky.lua\"\napi_token = \"${{{UNSET}_LEAKY}}\"\n"));
    ws.write(
        "leaky.lua",
        r#"tool = { name = "leaky", description = "Raises its token.", parameters = { { name = "how", type = "string", required = true } } }
function tool.execute(params, context)
  local t = context.config.api_token
  if params.how == "table" then
    error({ code = "auth_" .. t, message = "cannot log in with " .. t, token = t, nested = { t } })
  end
  -- An invalid URL: the error quotes it.
  http.get("login with " .. t)
end
"#,
    );
    let secret = "review16-leaky-secret-value";
    let server = Server::start(&ws, &[(&format!("{UNSET}_LEAKY"), secret)]);
    for how in ["table", "host"] {
        let (status, body) = server.request("POST", "/tools/leaky", None, &json!({ "how": how }).to_string());
        assert!(status >= 400, "{how}: {status} {body}");
        assert!(!body.contains(secret), "{how}: {body}");
        assert!(body.contains("[redacted ${CTX_REVIEW16_NEVER_SET_LEAKY}]"), "{how}: {body}");
        assert_clean(&body);
    }
}

// ---------------------------------------------------------------------------------------------
// `${VAR}` isolation

/// Proves fine: a section whose name holds dots, quotes or brackets is disabled alone by its
/// unset variable (not the section whose name is its prefix), the message shows no set
/// variable's value, and an unset variable in a core section whose *name* looks like a script
/// section still stops the command.
#[test]
fn odd_section_names_are_isolated_exactly() {
    let script = |name: &str| {
        format!("tool = {{ name = \"{name}\", description = \"d\", parameters = {{}} }}\nfunction tool.execute(p, c) return c.config.url end\n")
    };
    let set_var = format!("{UNSET}_SET_URL");
    let toml = format!(
        r#"
[tools.script.a]
path = "a.lua"
url = "${{{set_var}}}"

[tools.script."a.b"]
path = "ab.lua"
url = "${{{set_var}}}"
token = "${{{UNSET}}}"

[tools.script."we \"ird] [x"]
path = "weird.lua"
token = "${{{UNSET}}}"
"#
    );
    let ws = Workspace::new(&toml);
    ws.write("a.lua", &script("a"));
    ws.write("ab.lua", &script("ab"));
    ws.write("weird.lua", &script("weird"));
    let url = "https://internal.example/review16-set-value";
    let env = [(set_var.as_str(), url)];
    let list = ctx_with_env(&ws, &env, &["tool", "list"]);
    let text = format!("{}{}", list.stdout(), list.stderr());
    assert!(!text.contains(url), "{text}");
    assert!(text.contains("tools.script.\"a.b\".token") || text.contains("[tools.script.a.b]"), "{text}");
    assert!(text.contains("we \\\"ird] [x") || text.contains("we \"ird] [x"), "{text}");
    // `a` works, and has its own value.
    let call = ctx_with_env(&ws, &env, &["tool", "call", "a", "--json"]);
    let body: Value = serde_json::from_str(call.stdout().trim()).unwrap_or_else(|e| panic!("{e}: {}", call.stderr()));
    assert_eq!(body["result"], url);
    // Two disabled sections, nothing else.
    for broken in ["ab", "weird"] {
        let call = ctx_with_env(&ws, &env, &["tool", "call", broken, "--json"]);
        assert_ne!(call.code(), 0, "{broken}: {}", call.stdout());
    }

    // A core section named like a script table still stops everything.
    let core = format!(
        "[connectors.filesystem.\"tools.script.x\"]\nroot = \"${{{UNSET}}}\"\n\n[tools.script.a]\npath = \"a.lua\"\n"
    );
    std::fs::write(ws.path().join("ctx.toml"), core).unwrap();
    let stopped = ctx_with_env(&ws, &[], &["tool", "list"]);
    assert_eq!(stopped.code(), 2, "{}\n{}", stopped.stdout(), stopped.stderr());
    assert!(stopped.stderr().contains(&format!("environment variable {UNSET} is not set")), "{}", stopped.stderr());
}

/// Found (older than issue 16, on the path it extended): an item with many unknown fields was
/// skipped with every problem in its warning, one line of 11 MB for 80,000 fields. The warning
/// now lists the first few and counts the rest.
#[test]
fn an_invalid_items_warning_stays_one_short_line() {
    let ws = Workspace::new("[connectors.script.wide]\npath = \"wide.lua\"\n");
    ws.write(
        "wide.lua",
        r#"connector = { name = "wide" }
function connector.scan(config, context)
  local item = { source_id = "w", title = "t", body = "b", updated_at = 0 }
  for i = 1, 5000 do item["unknown" .. i] = 1 end
  return { item }
end
"#,
    );
    // Issue 20: skips are counted, and `-v` lists each with its reason.
    let run = ws.ctx(&["sync", "-v"]);
    run.ok();
    let warning =
        run.stderr().lines().find(|l| l.contains("(script:wide): invalid item")).unwrap_or_default().to_string();
    assert!(warning.contains("and 4995 more problem(s)"), "{}", &warning[..warning.len().min(500)]);
    assert!(warning.len() < 2000, "{} bytes", warning.len());
}

/// Worst-case arguments for `context.state`: a key and a value as large as a string can be, and a
/// state that would pass its limit. Each is refused with what to do, before it is copied, and the
/// state stays as it was.
#[test]
fn connector_state_refuses_worst_case_arguments_before_copying_them() {
    let ws = Workspace::new("[connectors.script.greedy]\npath = \"greedy.lua\"\n");
    ws.write(
        "greedy.lua",
        r#"connector = { name = "greedy" }
function connector.scan(config, context)
  local huge = string.rep("k", 32 << 20)
  local errors = {}
  local function try(f, ...) local ok, err = pcall(f, ...) errors[#errors + 1] = ok and "accepted" or err end
  try(context.state.get, huge)
  try(context.state.set, huge, 1)
  try(context.state.set, "value", huge)
  try(context.state.set, "first", string.rep("a", 40 * 1024))
  try(context.state.set, "second", string.rep("b", 40 * 1024))
  huge = nil
  context.state.set("errors", errors)
  return {}
end
"#,
    );
    ws.ctx(&["sync"]).ok();
    let state: Value = ws
        .db()
        .query_row("SELECT state_json FROM connector_state WHERE source = 'script:greedy'", [], |r| {
            Ok(serde_json::from_str(&r.get::<_, String>(0)?).unwrap())
        })
        .unwrap();
    let errors: Vec<&str> = state["errors"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(errors[0], "greedy.lua:5: context.state.get: a key is 1 to 256 bytes, got 33554432");
    assert_eq!(errors[1], "greedy.lua:5: context.state.set: a key is 1 to 256 bytes, got 33554432");
    assert!(errors[2].starts_with("greedy.lua:5: context.state.set: the state would be"), "{}", errors[2]);
    assert!(errors[2].contains("keep cursors and ids there, not documents"), "{}", errors[2]);
    assert_eq!(errors[3], "accepted");
    assert!(errors[4].contains("over its limit of 65536"), "{}", errors[4]);
    // The refused calls left nothing behind; the accepted one is kept.
    assert!(state.get("value").is_none() && state.get("second").is_none(), "{state}");
    assert_eq!(state["first"].as_str().map(str::len), Some(40 * 1024));
}
