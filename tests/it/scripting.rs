//! The Lua side: scripts as users and the reference implementation's scripts write
//! them. Empty tables where lists go (item 1), host errors caught with `pcall` (item 3),
//! validation messages (item 8), a BOM, a `#!` line and seed 003's `handler` (item 9), the
//! connector context (item 10), and every fixture of `tests/fixtures/reference_forms/` run for
//! real: tools through a real server, agents and connectors through the real binary.

use std::path::Path;
use std::sync::Arc;

use ctx::schema::{Dialect, SchemaValidator};
use ctx::server::{self, App, Security};
use ctx::tools::Tools;
use serde_json::{json, Value};

use crate::common::{repo, run_in, stub, Run, Workspace};
use crate::tools::fixture;

/// A workspace with the sample corpus indexed (and any script connectors synced), the scripts
/// of `scripts` under `tools/`, and a real server over its registry.
struct Served {
    runtime: tokio::runtime::Runtime,
    base: String,
    dir: tempfile::TempDir,
}

impl Served {
    fn start(toml: &str, scripts: &[(&str, &str)]) -> Served {
        let (dir, registry) = fixture(toml, scripts).into_parts();
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        let security = Security::new(addr, None, vec![]).unwrap();
        let app = Arc::new(App::new(Arc::new(Tools::new(registry)), security, 1 << 20));
        runtime.spawn(server::run(listener, app, std::future::pending()));
        let _ = rustls::crypto::ring::default_provider().install_default();
        Served { runtime, base: format!("http://{addr}"), dir }
    }

    fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        self.runtime.block_on(async {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        })
    }

    /// `POST /tools/{name}` with `params` as the body.
    fn call(&self, tool: &str, params: Value) -> (u16, Value) {
        self.send(reqwest::Client::new().post(format!("{}/tools/{tool}", self.base)).json(&params))
    }

    /// `POST /agents/{name}/prompt` with the arguments object as the body, or no body.
    fn prompt(&self, agent: &str, args: Option<Value>) -> (u16, Value) {
        let request = reqwest::Client::new().post(format!("{}/agents/{agent}/prompt", self.base));
        self.send(match args {
            Some(args) => request.json(&args),
            None => request,
        })
    }

    /// The load problems `/health` reports.
    fn problems(&self) -> Vec<String> {
        let (status, health) = self.send(reqwest::Client::new().get(format!("{}/health", self.base)));
        assert_eq!(status, 200, "{health}");
        // No problems: the list is left out.
        let problems = health["problems"].as_array().cloned().unwrap_or_default();
        assert_eq!(problems.len() as u64, health["problem_count"].as_u64().unwrap(), "{health}");
        problems.iter().map(|p| p["message"].as_str().unwrap().to_string()).collect()
    }

    /// The real binary, in the workspace.
    fn ctx(&self, args: &[&str]) -> Run {
        run_in(self.dir.path(), &[&["--config", "ctx.toml"], args].concat())
    }
}

/// `ctx agent test <name> --json` with `--arg`s: the resolved prompt, or the error envelope.
fn agent_test(run: impl Fn(&[&str]) -> Run, name: &str, args: &[&str]) -> (i32, Value) {
    let mut argv = vec!["agent", "test", name, "--json"];
    for arg in args {
        argv.extend(["--arg", arg]);
    }
    let out = run(&argv);
    let json = serde_json::from_str(out.stdout().trim())
        .unwrap_or_else(|e| panic!("agent test {name}: {e}\nstdout:\n{}\nstderr:\n{}", out.stdout(), out.stderr()));
    (out.code(), json)
}

fn reference(rel: &str) -> String {
    std::fs::read_to_string(repo().join("tests/fixtures/reference_forms").join(rel)).unwrap()
}

/// Nothing of ctx's own machinery may show in a message a script or a client reads.
#[track_caller]
fn assert_clean(text: &str) {
    for internal in ["raw_pcall", "sandbox", "traceback", "stack", "runtime error", "callback error", "[C]", "userdata"]
    {
        assert!(!text.contains(internal), "{internal:?} leaked into {text:?}");
    }
}

/// The 1-based line of `path`'s text that contains `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("no line has {needle:?}")) + 1
}

fn documents(dir: &Path, source: &str) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(dir.join("data/ctx.sqlite")).unwrap();
    let mut stmt = db.prepare("SELECT source_id, body FROM documents WHERE source = ?1 ORDER BY source_id").unwrap();
    stmt.query_map([source], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
}

/// The saved connector state of `source`: its last success and its key-value state.
fn saved_state(dir: &Path, source: &str) -> Option<(String, Value)> {
    let db = rusqlite::Connection::open(dir.join("data/ctx.sqlite")).unwrap();
    db.query_row("SELECT last_success, state_json FROM connector_state WHERE source = ?1", [source], |r| {
        Ok((r.get::<_, String>(0)?, serde_json::from_str(&r.get::<_, String>(1)?).unwrap()))
    })
    .ok()
}

const LISTS_TOOL: &str = r#"
tool = {
  name = "lists",
  description = "Echoes its parameters; a JSON Schema whose empty tables are lists and objects.",
  parameters = {
    type = "object",
    properties = {
      tags = { type = "array", items = { type = "string" }, default = {} },
      extra = { type = "object", default = {} },
    },
    required = {},
  },
}
function tool.execute(params) return params end
"#;

const EMPTY_AGENT: &str = r#"
agent = { name = "empty-lists", description = "Declares and returns nothing but empty lists.", tools = {}, arguments = {} }
function agent.resolve(args, config, context)
  return { system = "Nothing to add.", messages = {}, tools = {} }
end
"#;

#[test]
fn empty_table_is_an_empty_list() {
    let toml = r#"
[tools.script.no-params]
path = "tools/no-params.lua"

[tools.script.lists]
path = "tools/lists.lua"

[agents.script.empty-lists]
path = "tools/empty-lists.lua"

[tools.script.no-blocks]
path = "tools/no-blocks.lua"
"#;
    let served = Served::start(
        toml,
        &[
            ("no-params.lua", &reference("tools/no-params.lua")),
            ("lists.lua", LISTS_TOOL),
            ("empty-lists.lua", EMPTY_AGENT),
            ("no-blocks.lua", "tool = { name = \"no-blocks\", description = \"Shows nothing.\" }\nfunction tool.execute() return MCP.content({}) end\n"),
        ],
    );
    assert_eq!(served.problems(), Vec::<String>::new());

    // `parameters = {}` is a tool with no parameters: callable with none, and only with none.
    let (status, body) = served.call("no-params", json!({}));
    assert_eq!((status, &body["result"]), (200, &json!({"sources": 1})), "{body}");
    let (status, body) = served.call("no-params", json!({"x": 1}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["details"][0]["path"], "/x", "{body}");

    // In a JSON Schema, `required = {}` is an empty list, and so is the `default = {}` of an
    // array; the `default = {}` of an object stays an object.
    let (status, body) = served.call("lists", json!({}));
    assert_eq!((status, &body["result"]), (200, &json!({"tags": [], "extra": {}})), "{body}");

    // `MCP.content({})`: no content blocks.
    assert_eq!(served.call("no-blocks", json!({})), (200, json!({"result": {"content": []}})));

    // An agent declaring `tools = {}`, `arguments = {}` and returning empty `messages`/`tools`.
    let (code, prompt) = agent_test(|a| served.ctx(a), "empty-lists", &[]);
    assert_eq!(code, 0, "{prompt}");
    assert_eq!((&prompt["messages"], &prompt["tools"]), (&json!([]), &json!([])), "{prompt}");
}

#[test]
fn agent_init_template_works_when_the_search_finds_nothing() {
    let ws = Workspace::new("[connectors.filesystem.docs]\nroot = \"docs\"\n");
    ws.write("docs/deploys.md", "# Deploys\n\nRoll back a deploy with `deploy rollback`.\n");
    ws.ctx(&["agent", "init", "helper"]).ok();
    let config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    std::fs::write(ws.path().join("ctx.toml"), config + "\n[agents.script.helper]\npath = \"agents/helper.lua\"\n")
        .unwrap();
    ws.ctx(&["sync"]).ok();

    let (code, prompt) = agent_test(|a| ws.ctx(a), "helper", &["topic=zebra-quasar"]);
    assert_eq!(code, 0, "{prompt}");
    assert_eq!(prompt["messages"], json!([]), "{prompt}");
    // And when it finds something, the document opens the conversation.
    let (code, prompt) = agent_test(|a| ws.ctx(a), "helper", &["topic=rollback"]);
    assert_eq!(code, 0, "{prompt}");
    assert!(prompt["messages"][0]["content"].as_str().unwrap().starts_with("# Deploys"), "{prompt}");
}

#[test]
fn pcall_around_every_tool_host_api_catches_a_plain_string() {
    let source = reference("tools/pcall-everything.lua");
    let served = Served::start(
        "[tools.script.pcall-everything]\npath = \"tools/pcall-everything.lua\"\n",
        &[("pcall-everything.lua", &source)],
    );
    let (status, body) = served.call("pcall-everything", json!({}));
    assert_eq!(status, 200, "{body}");
    let caught = body["result"].as_object().unwrap();
    // Each probe and the name its message must carry.
    let probes = [
        ("http.get", "http.get"),
        ("http.post", "http.post"),
        ("http.put", "http.put"),
        ("http.patch", "http.patch"),
        ("http.delete", "http.delete"),
        ("http.request", "http.request"),
        ("json.parse", "json.parse"),
        ("json.encode", "json.encode"),
        ("json.array", "json.array"),
        ("env.get", "env.get"),
        ("fs.read", "fs.read"),
        ("fs.list", "fs.list"),
        ("base64.encode", "base64.encode"),
        ("base64.decode", "base64.decode"),
        ("crypto.sha256", "crypto.sha256"),
        ("crypto.hmac_sha256", "crypto.hmac_sha256"),
        ("log.info", "log.info"),
        ("print", "print"),
        ("sleep", "sleep"),
        ("progress", "progress"),
        ("MCP.text", "MCP.text"),
        ("MCP.error", "MCP.error"),
        ("MCP.content", "MCP.content"),
        ("context.search", "context.search"),
        ("context.get", "context.get"),
        ("require", "require"),
        ("inside a function", "json.parse"),
        ("xpcall", "json.parse"),
        ("coroutine", "base64.decode"),
    ];
    assert_eq!(caught.len(), probes.len(), "{body}");
    for (probe, function) in probes {
        let got = &caught[probe];
        assert_eq!((&got["ok"], &got["kind"]), (&json!(false), &json!("string")), "{probe}: {got}");
        let text = got["text"].as_str().unwrap();
        let line = line_of(&source, &format!("note(\"{probe}\""));
        let place = format!("tools/pcall-everything.lua:{line}: {function}: ");
        let expected = if probe == "xpcall" { format!("down: handled: {place}") } else { format!("down: {place}") };
        assert!(text.starts_with(&expected), "{probe}: {text:?} should start with {expected:?}");
        assert_clean(text);
    }
    // A few messages in full: the argument, the reason, what to do.
    let text = |probe: &str| caught[probe]["text"].as_str().unwrap().split_once(": ").unwrap().1.to_string();
    let line = |probe: &str| line_of(&source, &format!("note(\"{probe}\""));
    assert_eq!(
        text("http.post"),
        format!(
            "tools/pcall-everything.lua:{}: http.post: bad argument #1 (string expected, got nil)",
            line("http.post")
        )
    );
    assert_eq!(
        text("json.parse"),
        format!(
            "tools/pcall-everything.lua:{}: json.parse: EOF while parsing an object at line 1 column 1",
            line("json.parse")
        )
    );
    assert!(text("env.get").contains("allow_env"), "{}", text("env.get"));
}

#[test]
fn an_uncaught_host_error_reaches_the_client_sanitised_with_the_line() {
    let script = "tool = { name = \"uncaught\", description = \"Parses bad JSON.\" }\nfunction tool.execute()\n  return json.parse(\"{\")\nend\n";
    let served = Served::start("[tools.script.uncaught]\npath = \"tools/uncaught.lua\"\n", &[("uncaught.lua", script)]);
    let (status, body) = served.call("uncaught", json!({}));
    assert_eq!(status, 500, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert_eq!(message, "tools/uncaught.lua:3: json.parse: EOF while parsing an object at line 1 column 1");
    assert_clean(message);
}

const PCALL_AGENT: &str = r#"
agent = { name = "careful", description = "Catches what the host APIs raise.",
  arguments = { { name = "raise", description = "yes: let one error through" } } }
function agent.resolve(args, config, context)
  if args.raise == "yes" then
    return context.get(7)
  end
  local ok1, e1 = pcall(context.search, 42)
  local ok2, e2 = pcall(http.get, "ftp://example.com/")
  return { system = "careful", messages = {
    { role = "user", content = "down: " .. e1 },
    { role = "user", content = "down: " .. e2 },
  } }
end
"#;

const BROKEN_CONNECTOR: &str =
    "connector = { name = \"broken\" }\nfunction connector.scan(config)\n  return json.parse(\"{\")\nend\n";

#[test]
fn agents_and_connectors_catch_plain_strings_too() {
    let toml = r#"
[agents.script.careful]
path = "tools/careful.lua"

[connectors.script.changes]
path = "tools/changes-since.lua"

[connectors.script.broken]
path = "tools/broken.lua"
"#;
    let served = Served::start(
        toml,
        &[
            ("careful.lua", PCALL_AGENT),
            ("changes-since.lua", &reference("connectors/changes-since.lua")),
            ("broken.lua", BROKEN_CONNECTOR),
        ],
    );
    let (code, prompt) = agent_test(|a| served.ctx(a), "careful", &[]);
    assert_eq!(code, 0, "{prompt}");
    let line = |needle: &str| line_of(PCALL_AGENT, needle);
    assert_eq!(
        prompt["messages"][0]["content"],
        format!(
            "down: tools/careful.lua:{}: context.search: expected (query, opts?) or a table {{query=..., limit=...}}, got integer",
            line("pcall(context.search")
        )
    );
    let http = prompt["messages"][1]["content"].as_str().unwrap();
    assert!(http.starts_with(&format!("down: tools/careful.lua:{}: http.get: ", line("pcall(http.get"))), "{http}");
    assert_clean(http);
    // Uncaught, the agent's error names its line.
    let (code, envelope) = agent_test(|a| served.ctx(a), "careful", &["raise=yes"]);
    assert_ne!(code, 0);
    let message = envelope["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("tools/careful.lua:{}: context.get: ", line("context.get(7)"))), "{message}");
    assert_clean(message);

    // The connector caught `context.state.set`'s error as a string and saved it.
    let (_, state) = saved_state(served.dir.path(), "script:changes").expect("the first sync saved a state");
    let source = reference("connectors/changes-since.lua");
    assert_eq!(
        state["last_error"],
        format!(
            "tools/changes-since.lua:{}: context.state.set: a key is 1 to 256 bytes, got 0",
            line_of(&source, "pcall(context.state.set")
        )
    );
    // An uncaught one fails the source's sync with the script's line.
    let db = rusqlite::Connection::open(served.dir.path().join("data/ctx.sqlite")).unwrap();
    let error: String =
        db.query_row("SELECT last_error FROM sync_state WHERE source = 'script:broken'", [], |r| r.get(0)).unwrap();
    assert_eq!(error, "tools/broken.lua:3: json.parse: EOF while parsing an object at line 1 column 1");
}

#[test]
fn validation_messages_point_at_the_problem() {
    let bad_estimate = r#"
tool = { name = "estimate", description = "Four parameters, the third of a type JSON has not got.",
  parameters = {
    { name = "title", type = "string", required = true },
    { name = "points", type = "integer" },
    { name = "estimate", type = "float" },
    { name = "done", type = "boolean" },
  } }
function tool.execute(params) return params end
"#;
    let tags = r#"
tool = { name = "tags", description = "At most three tags, and a target of one of two shapes.",
  parameters = { type = "object", properties = {
    tags = { type = "array", items = { type = "string" }, maxItems = 3 },
    target = { oneOf = { { type = "string" }, { type = "array", items = { type = "integer" } } } },
  } } }
function tool.execute(params) return params end
"#;
    let toml =
        "[tools.script.estimate]\npath = \"tools/estimate.lua\"\n\n[tools.script.tags]\npath = \"tools/tags.lua\"\n";
    let served = Served::start(toml, &[("estimate.lua", bad_estimate), ("tags.lua", tags)]);
    assert_eq!(
        served.problems(),
        [
            r#"tools/estimate.lua: tool/parameters/2/type: expected one of ["string","integer","number","boolean","array","object"], got "float""#
        ]
    );

    // Request bodies (the JSON dialect): the constraint that broke, and the branch that fits.
    let details = |params: Value| {
        let (status, body) = served.call("tags", params);
        assert_eq!(status, 400, "{body}");
        body["error"]["details"].clone()
    };
    assert_eq!(
        details(json!({"tags": ["a", "b", "c", "d"]})),
        json!([{"path": "/tags", "message": "expected at most 3 items, got 4"}])
    );
    assert_eq!(
        details(json!({"target": [1, "x"]})),
        json!([{"path": "/target/1", "message": "expected integer, got \"x\""}])
    );
    assert_eq!(
        details(json!({"target": true})),
        json!([{"path": "/target", "message": "expected string or array of integer, got true"}])
    );

    // Config (the TOML dialect).
    let config = json!({"tools": {"script": {"jira": {"path": "jira.lua", "allow_hosts": []}}}});
    let problems = SchemaValidator::for_definition("Config").problems(&config, Dialect::Toml);
    let words: Vec<String> = problems.iter().map(|p| format!("{}: {}", p.dotted(), p.message)).collect();
    assert_eq!(words, ["tools.script.jira.allow_hosts: expected at least 1 item, got 0"]);

    // Connector items: `updated_at` is text or unix seconds; a negative number is the second.
    let ws = Workspace::new("");
    ws.write(
        "items.lua",
        "connector = {}\nfunction connector.scan()\n  return { { source_id = \"a\", body = \"b\", updated_at = -5 } }\nend\n",
    );
    let run = ws.ctx(&["connector", "test", "items.lua"]);
    assert!(run.stderr().contains("updated_at: expected integer at least 0, got -5"), "{}", run.stderr());
}

#[test]
fn a_bom_a_shebang_and_seed_003s_handler_load() {
    let both = "tool = { name = \"both\", description = \"Two entry points.\" }\nfunction tool.execute() end\nfunction tool.handler() end\n";
    let broken = "\u{feff}#!/usr/bin/env lua\n-- line two\nlocal broken = = 1\n";
    let requires = "#!/usr/bin/env lua\ntool = { name = \"requires\", description = \"Uses a module saved with a BOM.\" }\nfunction tool.execute() return require(\"helper\").answer end\n";
    let helper = "\u{feff}#!/usr/bin/env lua\nreturn { answer = 42 }\n";
    let toml = r#"
[tools.script.bom-shebang]
path = "tools/bom-shebang.lua"

[tools.script.seed-handler]
path = "tools/seed-handler.lua"

[tools.script.both]
path = "tools/both.lua"

[tools.script.broken]
path = "tools/broken.lua"

[tools.script.requires]
path = "tools/requires.lua"
"#;
    let served = Served::start(
        toml,
        &[
            ("bom-shebang.lua", &reference("tools/bom-shebang.lua")),
            ("seed-handler.lua", &reference("tools/seed-handler.lua")),
            ("both.lua", both),
            ("broken.lua", broken),
            ("requires.lua", requires),
            ("helper.lua", helper),
        ],
    );
    let mut problems = served.problems();
    problems.sort();
    assert_eq!(
        problems,
        [
            "tools/both.lua: `tool.execute` and `tool.handler` are both defined; `handler` is another name for `execute`, so keep one of them",
            "tools/broken.lua:3: unexpected symbol near '='",
        ]
    );

    assert_eq!(served.call("bom-shebang", json!({})), (200, json!({"result": {"ok": true}})));
    // Line numbers are those of the file, the `#!` line counted.
    let (status, body) = served.call("bom-shebang", json!({"fail": true}));
    let line = line_of(&reference("tools/bom-shebang.lua"), "failed on purpose");
    assert_eq!(
        (status, body["error"]["message"].clone()),
        (500, json!(format!("tools/bom-shebang.lua:{line}: failed on purpose")))
    );
    assert_eq!(served.call("requires", json!({})), (200, json!({"result": 42})));

    let (status, body) = served.call("seed-handler", json!({"buffer_id": 3}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], json!({"buffer_id": 3, "message": "Buffer checked", "parse_error_caught": true}));
    let (status, body) = served.call("seed-handler", json!({"buffer_id": 500}));
    assert_eq!((status, &body["error"]["message"]), (500, &json!("Buffer 500 is not open")), "{body}");
    let (status, _) = served.call("seed-handler", json!({"buffer_id": 0}));
    assert_eq!(status, 400, "the handler's JSON Schema is enforced");
}

const STATE_TOML: &str = r#"
[connectors.script.changes]
path = "connectors/changes-since.lua"

[connectors.script.other]
path = "connectors/changes-since.lua"

[connectors.script.big]
path = "connectors/big.lua"
"#;

const BIG_STATE: &str = r#"
connector = {}
function connector.scan(config, context)
  local ok, err = pcall(context.state.set, "blob", string.rep("x", 70000))
  context.state.set("refused", err)
  context.state.set("blob_kept", context.state.get("blob") ~= nil)
  return {}
end
"#;

#[test]
fn connectors_get_their_last_sync_and_a_state_kept_across_syncs() {
    let ws = Workspace::new(STATE_TOML);
    ws.write("connectors/changes-since.lua", &reference("connectors/changes-since.lua"));
    ws.write("connectors/big.lua", BIG_STATE);
    let sync = |target: &str| ws.ctx(&["sync", target]);
    let ids = |source: &str| documents(ws.path(), source).into_iter().map(|(id, _)| id).collect::<Vec<_>>();

    // The first sync: no last sync, a full scan.
    sync("script:changes").ok();
    assert_eq!(ids("script:changes"), ["a", "b", "c"]);
    let (first_success, state) = saved_state(ws.path(), "script:changes").unwrap();
    assert_eq!((&state["revision"], &state["first_sync"]), (&json!(1), &json!(true)), "{state}");

    // The second (another process: the state survived it): incremental, `c` deleted, `a` kept.
    sync("script:changes").ok();
    assert_eq!(ids("script:changes"), ["a", "b"]);
    assert!(documents(ws.path(), "script:changes")[1].1.contains("revision 2"));
    let (second_success, state) = saved_state(ws.path(), "script:changes").unwrap();
    assert_eq!((&state["revision"], &state["first_sync"]), (&json!(2), &json!(false)), "{state}");
    assert!(second_success >= first_success);

    // A failed sync keeps the last good state and last success, whatever the script set.
    let changes = "path = \"connectors/changes-since.lua\"\n";
    let failing = STATE_TOML.replacen(changes, &format!("{changes}fail = \"yes\"\n"), 1);
    std::fs::write(ws.path().join("ctx.toml"), failing).unwrap();
    sync("script:changes");
    let error: String = ws
        .db()
        .query_row("SELECT last_error FROM sync_state WHERE source = 'script:changes'", [], |r| r.get(0))
        .unwrap();
    assert!(error.ends_with("the simulated API is down"), "{error}");
    assert_eq!(saved_state(ws.path(), "script:changes").unwrap(), (second_success.clone(), state.clone()));
    assert_eq!(ids("script:changes"), ["a", "b"]);

    // Fixed again: it carries on from the last good state.
    std::fs::write(ws.path().join("ctx.toml"), STATE_TOML).unwrap();
    sync("script:changes").ok();
    assert_eq!(ids("script:changes"), ["a", "b", "d"]);
    assert_eq!(saved_state(ws.path(), "script:changes").unwrap().1["revision"], 3);

    // `--full` starts the script over, as on its first sync: a full scan again.
    ws.ctx(&["sync", "script:changes", "--full"]).ok();
    assert_eq!(ids("script:changes"), ["a", "b", "c"]);
    let (_, state) = saved_state(ws.path(), "script:changes").unwrap();
    assert_eq!((&state["revision"], &state["first_sync"]), (&json!(1), &json!(true)), "{state}");

    // Each source has its own state, although both run the same script.
    sync("script:other").ok();
    assert_eq!(saved_state(ws.path(), "script:other").unwrap().1["revision"], 1);
    assert_eq!(ids("script:other"), ["a", "b", "c"]);

    // The state is bounded: a value that would pass 64 KiB is refused, the state kept as it was.
    sync("script:big").ok();
    let (_, state) = saved_state(ws.path(), "script:big").unwrap();
    assert_eq!(state["blob_kept"], false);
    let refused = state["refused"].as_str().unwrap();
    assert!(refused.starts_with("connectors/big.lua:4: context.state.set: the state would be "), "{refused}");
    assert!(refused.contains("over its limit of 65536"), "{refused}");

    // `ctx connector test` runs as a first sync would, and says what it would save.
    let test = ws.ctx(&["connector", "test", "connectors/changes-since.lua"]).ok();
    assert!(test.contains("a sync would save this state for the next one: {"), "{test}");
    assert!(test.contains(r#""first_sync":true"#) && test.contains(r#""revision":1"#), "{test}");
}

/// Every script of `tests/fixtures/reference_forms/` loads, and runs as its form expects.
#[test]
fn reference_forms_load_and_run() {
    let fixtures = repo().join("tests/fixtures/reference_forms");
    let (addr, received) = stub(|_| (201, r#"{"key": "OPS-7"}"#.to_string()));
    let extra = |name: &str| match name {
        "echo-back" => "greeting = \"Hi\"\n".to_string(),
        "ticket-draft" => format!(
            "url = \"http://{addr}\"\nuser = \"bot@example.com\"\ntoken = \"t0ken\"\nallow_hosts = [\"127.0.0.1\"]\n"
        ),
        "incident-briefer" => "search_limit = \"3\"\n".to_string(),
        "sample-items" => "prefix = \"case\"\ncount = \"3\"\n".to_string(),
        _ => String::new(),
    };
    let mut toml = String::new();
    let mut scripts = Vec::new();
    let mut names = Vec::new();
    for (folder, kind) in [("agents", "agents"), ("tools", "tools"), ("connectors", "connectors")] {
        let mut files: Vec<_> = std::fs::read_dir(fixtures.join(folder)).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for path in files {
            let file = path.file_name().unwrap().to_str().unwrap().to_string();
            let name = file.trim_end_matches(".lua").to_string();
            toml += &format!("[{kind}.script.{name}]\npath = \"tools/{file}\"\n{}\n", extra(&name));
            scripts.push((file, std::fs::read_to_string(&path).unwrap()));
            names.push(name);
        }
    }
    let borrowed: Vec<(&str, &str)> = scripts.iter().map(|(f, t)| (f.as_str(), t.as_str())).collect();
    let served = Served::start(&toml, &borrowed);
    assert_eq!(served.problems(), Vec::<String>::new());
    let mut ran = Vec::new();
    let mut ran_ok = |name: &str| ran.push(name.to_string());

    // Agents: resolve with hybrid search; empty messages where nothing is asked.
    let (code, prompt) = agent_test(|a| served.ctx(a), "incident-briefer", &["service=payments", "symptom=latency"]);
    assert_eq!(code, 0, "{prompt}");
    assert_eq!(prompt["tools"], json!(["search", "get"]));
    assert!(prompt["messages"][0]["content"].as_str().unwrap().contains("score"), "{prompt}");
    let (code, nothing) = agent_test(|a| served.ctx(a), "incident-briefer", &["service=zebra-quasar"]);
    assert_eq!((code, &nothing["messages"]), (0, &json!([])), "{nothing}");
    ran_ok("incident-briefer");
    let (code, prompt) = agent_test(|a| served.ctx(a), "release-planner", &[]);
    assert_eq!((code, &prompt["messages"], &prompt["tools"]), (0, &json!([]), &json!([])), "{prompt}");
    let (code, prompt) = agent_test(|a| served.ctx(a), "release-planner", &["feature=deploy"]);
    assert_eq!(code, 0, "{prompt}");
    ran_ok("release-planner");
    // The same agents over REST, with the flat body the reference clients send (and no body at
    // all where nothing is required).
    let (status, prompt) = served.prompt("incident-briefer", Some(json!({"service": "payments"})));
    assert_eq!(status, 200, "{prompt}");
    assert_eq!(prompt["tools"], json!(["search", "get"]));
    assert!(prompt["messages"][0]["content"].as_str().unwrap().contains("score"), "{prompt}");
    let (status, prompt) = served.prompt("incident-briefer", Some(json!({"service": "zebra-quasar"})));
    assert_eq!((status, &prompt["messages"]), (200, &json!([])), "{prompt}");
    let (status, prompt) = served.prompt("release-planner", None);
    assert_eq!((status, &prompt["messages"], &prompt["tools"]), (200, &json!([]), &json!([])), "{prompt}");

    // Tools.
    let (status, body) = served.call("echo-back", json!({"message": "deploy", "search": true}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["echo"], "Hi, deploy");
    assert_eq!(body["result"]["params"], json!({"message": "deploy", "search": true, "limit": 2}));
    assert_eq!(body["result"]["document_count"], 2);
    ran_ok("echo-back");
    let (status, body) =
        served.call("ticket-draft", json!({"summary": "Deploys are slow", "details": "Since Monday."}));
    assert_eq!((status, &body["result"]["key"]), (200, &json!("OPS-7")), "{body}");
    let sent = received.lock().unwrap()[0].clone();
    assert_eq!(sent.headers["authorization"], "Basic Ym90QGV4YW1wbGUuY29tOnQwa2Vu");
    let payload: Value = serde_json::from_str(&sent.body).unwrap();
    assert_eq!((&payload["queue"]["key"], &payload["urgency"]["name"]), (&json!("OPS"), &json!("normal")));
    ran_ok("ticket-draft");
    assert_eq!(served.call("no-params", json!({})).0, 200);
    ran_ok("no-params");
    let (status, body) = served.call("raises-table", json!({}));
    assert_eq!((status, &body["error"]["message"]), (500, &json!("the tracker quota is used up for today")), "{body}");
    ran_ok("raises-table");
    let (status, body) = served.call("pcall-everything", json!({}));
    assert_eq!(status, 200, "{body}");
    assert!(body["result"].as_object().unwrap().values().all(|v| v["kind"] == "string"), "{body}");
    ran_ok("pcall-everything");
    assert_eq!(served.call("bom-shebang", json!({})).0, 200);
    ran_ok("bom-shebang");
    assert_eq!(served.call("seed-handler", json!({"buffer_id": 1})).0, 200);
    ran_ok("seed-handler");

    // Connectors: synced when the workspace was made.
    let cases = documents(served.dir.path(), "script:sample-items");
    assert_eq!(cases.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["case-1", "case-2", "case-3"]);
    ran_ok("sample-items");
    assert_eq!(documents(served.dir.path(), "script:changes-since").len(), 3);
    ran_ok("changes-since");

    names.sort();
    ran.sort();
    assert_eq!(ran, names, "every fixture is run");
}

/// Library functions run inside the sandbox's wrappers (sized checks, tables with metatables, the
/// pattern port): their errors must still read as Lua's would, at the script's line and naming
/// the function, never `sandbox:N:` or `'?'`.
#[test]
fn library_errors_caught_or_not_carry_the_script_line_and_the_function() {
    let script = r#"tool = { name = "libs", description = "Misuses the standard library.",
  parameters = { { name = "raise", type = "boolean" } } }
function tool.execute(p)
  local out = {}
  local function try(f) local ok, err = pcall(f) out[#out + 1] = err end
  try(function() local s = string.upper({}) return s end)
  try(function() local s = ("x"):rep({}) return s end)
  try(function() local t = setmetatable({}, {}) table.insert(t, 1, 2, 3) end)
  try(function() table.sort({3, 2, 1}, 5) end)
  try(function() local n = tonumber("10", 99) return n end)
  try(function() local a = string.find("x", "[") return a end)
  if p.raise then
    local s = string.rep("x", "y")
    return s
  end
  return out
end
"#;
    let served = Served::start("[tools.script.libs]\npath = \"tools/libs.lua\"\n", &[("libs.lua", script)]);
    let (status, body) = served.call("libs", json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["result"],
        json!([
            "tools/libs.lua:6: bad argument #1 to 'upper' (string expected, got table)",
            "tools/libs.lua:7: bad argument #2 to 'rep' (number expected, got table)",
            "tools/libs.lua:8: wrong number of arguments to 'insert'",
            "tools/libs.lua:9: bad argument #2 to 'sort' (function expected, got number)",
            "tools/libs.lua:10: bad argument #2 to 'tonumber' (base out of range)",
            "tools/libs.lua:11: malformed pattern (missing ']')",
        ]),
        "{body}"
    );
    let (status, body) = served.call("libs", json!({"raise": true}));
    assert_eq!(status, 500, "{body}");
    assert_eq!(
        body["error"]["message"], "tools/libs.lua:13: bad argument #2 to 'rep' (number expected, got string)",
        "{body}"
    );
}
