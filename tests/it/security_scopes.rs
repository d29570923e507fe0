//! A scoped token holds on every surface of a real `ctx serve`: MCP prompts, resources and
//! templates, agents and what they call, `/agents/list`, `/health`, scripted tools' descriptions
//! and errors; each such request reaches the call log with its caller. And approvals: a client
//! does not approve its own calls unless the operator says so, and a script's own `approve = true`
//! holds.

use serde_json::{json, Value};

use crate::gateway::fault_section;
use crate::scoped_tokens_and_rates::{serve_with, Server, ADMIN, CI, READER};

const FAULT: &str = "fault-token-0123456789ab";
const SEARCHER: &str = "searcher-token-0123456789";

/// An agent that calls whatever tool it is told to, through `context.call`.
const RELAY_AGENT: &str = r#"
agent = {
    name = "relay-agent",
    description = "Calls the tool it is told to.",
    arguments = { { name = "tool", description = "the tool", required = true } },
}
function agent.resolve(args, config, context)
    local out = context.call(args.tool, { message = "from the agent" })
    return { system = "ran " .. args.tool, messages = { { role = "user", content = tostring(out) } } }
end
"#;

/// A Lua tool whose own table asks for approval.
const DEPLOY: &str = r#"
tool = { name = "deploy", description = "Deploys.", approve = true,
         parameters = { { name = "message", type = "string" } } }
function tool.execute(params) return "deployed " .. tostring(params.message) end
"#;

fn scoped_server() -> Server {
    let dir = tempfile::tempdir().unwrap().keep();
    let (starts, log) = (dir.join("starts"), dir.join("log"));
    let args = ["--starts", starts.to_str().unwrap(), "--log", log.to_str().unwrap(), "--resources"];
    let (starts2, log2) = (dir.join("starts2"), dir.join("log2"));
    let locked = ["--starts", starts2.to_str().unwrap(), "--log", log2.to_str().unwrap(), "--resources"];
    let extra = format!(
        "\n[[server.tokens]]\nname = \"fault-reader\"\ntoken = \"{FAULT}\"\ntools = [\"fault__*\", \"relay-agent\", \"echo\"]\n\n\
         [[server.tokens]]\nname = \"searcher\"\ntoken = \"{SEARCHER}\"\ntools = [\"searcher\", \"search\"]\n\n\
         [agents.script.relay-agent]\npath = \"agents/relay.lua\"\n\n\
         [agents.inline.helper]\ndescription = \"Helps.\"\nsystem_prompt = \"Help.\"\ntools = [\"search\"]\n\n\
         [tools.script.deploy]\npath = \"deploy.lua\"\n\n\
         [tools.scripted.searcher]\ndescription = \"Searches.\"\ntools = [\"search\", \"deploy\"]\n\n\
         {}\n{}",
        fault_section("fault", &args, ""),
        fault_section("locked", &locked, "approve = true"),
    );
    let server = serve_with(&extra, &[("agents/relay.lua", RELAY_AGENT), ("deploy.lua", DEPLOY)]);
    // Wait until both upstreams are up (their resources are listed).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let listed = server.mcp(ADMIN, "tools/list", None, json!({}));
        let names = listed.to_string();
        if names.contains("fault__echo") && names.contains("locked__echo") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the upstreams never came up: {listed}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    server
}

fn names(list: &Value, key: &str, field: &str) -> Vec<String> {
    list["result"][key]
        .as_array()
        .map_or_else(Vec::new, |items| items.iter().filter_map(|i| i[field].as_str().map(str::to_string)).collect())
}

/// The call log's entries of `tool` (an MCP method or a tool), as `ctx log --json` shows them,
/// once they hold what `done` looks for: the log's writer stores entries in the background, a
/// few milliseconds after each call (longer on a loaded machine).
fn logged(server: &Server, tool: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let listed = server.cli(&["log", "--tool", tool, "--json", "--limit", "100"]).json();
        let entries = listed["calls"].as_array().cloned().unwrap_or_default();
        if done(&entries) || std::time::Instant::now() > deadline {
            return entries;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn has_caller(entries: &[Value], caller: &str) -> bool {
    entries.iter().any(|e| e["caller"] == caller)
}

#[test]
fn a_scoped_token_sees_and_reads_only_its_prompts_and_resources_over_mcp() {
    let s = scoped_server();

    // The admin sees every agent and prompt, and the resources of the server not under approval.
    let all = s.mcp(ADMIN, "prompts/list", None, json!({}));
    let prompts = names(&all, "prompts", "name");
    for want in ["relay-agent", "helper", "code_mode", "fault__greet"] {
        assert!(prompts.contains(&want.to_string()), "{want} missing: {prompts:?}");
    }
    // A server whose every tool needs approval serves no prompts or resources at all.
    assert!(!prompts.iter().any(|p| p.starts_with("locked__")), "{prompts:?}");
    let resources = names(&s.mcp(ADMIN, "resources/list", None, json!({})), "resources", "uri");
    assert!(resources.contains(&"mcp://fault/fault://doc/1".to_string()), "{resources:?}");
    assert!(!resources.iter().any(|r| r.starts_with("mcp://locked/")), "{resources:?}");
    let locked = s.mcp(
        ADMIN,
        "resources/read",
        Some("mcp://locked/fault://doc/1"),
        json!({"uri": "mcp://locked/fault://doc/1"}),
    );
    assert!(locked["error"]["message"].as_str().unwrap().contains("needs approval"), "{locked}");

    // A token scoped to echo, search and execute: no upstream prompt, resource or template, no
    // agent; the catalog prompt lists only its tools.
    let ci = s.mcp(CI, "prompts/list", None, json!({}));
    assert_eq!(names(&ci, "prompts", "name"), ["code_mode"], "{ci}");
    assert_eq!(names(&s.mcp(CI, "resources/list", None, json!({})), "resources", "uri"), Vec::<String>::new());
    let templates = s.mcp(CI, "resources/templates/list", None, json!({}));
    assert_eq!(names(&templates, "resourceTemplates", "uriTemplate"), Vec::<String>::new(), "{templates}");
    let read =
        s.mcp(CI, "resources/read", Some("mcp://fault/fault://doc/1"), json!({"uri": "mcp://fault/fault://doc/1"}));
    assert!(read["error"]["message"].as_str().unwrap().contains("no resource"), "{read}");
    assert!(read["result"].is_null(), "{read}");
    let greet =
        s.mcp(CI, "prompts/get", Some("fault__greet"), json!({"name": "fault__greet", "arguments": {"name": "Ada"}}));
    assert!(greet["result"].is_null(), "{greet}");
    let agent = s.mcp(CI, "prompts/get", Some("helper"), json!({"name": "helper"}));
    assert!(agent["error"]["message"].as_str().unwrap().contains("unknown agent 'helper'"), "{agent}");
    let catalog = s.mcp(CI, "prompts/get", Some("code_mode"), json!({"name": "code_mode"}));
    let text = catalog["result"]["messages"][0]["content"]["text"].as_str().unwrap();
    // (`*_tool*`, one of its globs, matches the upstreams' add_tool.)
    assert!(text.contains("ctx.echo") && text.contains("fault.add_tool"), "{text}");
    assert!(!text.contains("fault.echo") && !text.contains("deploy"), "{text}");

    // A token with no script tool gets no catalog prompt either.
    let reader = s.mcp(READER, "prompts/list", None, json!({}));
    assert_eq!(names(&reader, "prompts", "name"), Vec::<String>::new(), "{reader}");
    let catalog = s.mcp(READER, "prompts/get", Some("code_mode"), json!({"name": "code_mode"}));
    assert!(catalog["result"].is_null(), "{catalog}");

    // A token scoped to the fault server reads its resources and prompts, and nothing else.
    let fault = s.mcp(FAULT, "prompts/list", None, json!({}));
    assert_eq!(names(&fault, "prompts", "name"), ["relay-agent", "fault__greet"], "{fault}");
    let read =
        s.mcp(FAULT, "resources/read", Some("mcp://fault/fault://doc/1"), json!({"uri": "mcp://fault/fault://doc/1"}));
    assert_eq!(read["result"]["contents"][0]["text"], "document 1", "{read}");
    let greet = s.mcp(
        FAULT,
        "prompts/get",
        Some("fault__greet"),
        json!({"name": "fault__greet", "arguments": {"name": "Ada"}}),
    );
    assert_eq!(greet["result"]["messages"][0]["content"]["text"], "Hello, Ada", "{greet}");

    // Every one of those requests is in the call log with its caller.
    let reads = logged(&s, "resources/read", |e| has_caller(e, "ci") && has_caller(e, "fault-reader"));
    let callers: Vec<&str> = reads.iter().filter_map(|e| e["caller"].as_str()).collect();
    assert!(callers.contains(&"ci") && callers.contains(&"fault-reader"), "{reads:?}");
    let ci_read = reads.iter().find(|e| e["caller"] == "ci").unwrap();
    assert_ne!(ci_read["outcome"], "ok", "{ci_read}");
    for method in ["prompts/list", "prompts/get", "resources/list", "resources/templates/list"] {
        let entries = logged(&s, method, |e| has_caller(e, "ci"));
        assert!(entries.iter().any(|e| e["caller"] == "ci"), "{method}: {entries:?}");
    }
}

#[test]
fn an_agent_runs_with_its_callers_scope_and_is_logged_with_it() {
    let s = scoped_server();
    // The fault token may use the relay agent and echo, not deploy or get.
    let ran =
        s.mcp(FAULT, "prompts/get", Some("relay-agent"), json!({"name": "relay-agent", "arguments": {"tool": "echo"}}));
    assert_eq!(ran["result"]["description"], "Calls the tool it is told to.", "{ran}");
    let refused =
        s.mcp(FAULT, "prompts/get", Some("relay-agent"), json!({"name": "relay-agent", "arguments": {"tool": "get"}}));
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("unknown tool 'get'"), "the agent's call of get is out of scope: {refused}");
    // Over REST the same.
    let (status, body) = s.post("/agents/relay-agent/prompt", Some(FAULT), json!({"tool": "get"}));
    assert_ne!(status, 200, "{body}");
    // The agent's inner calls are logged with the caller, and so is the prompt itself.
    let echoes = logged(&s, "echo", |e| has_caller(e, "fault-reader"));
    assert!(echoes.iter().any(|e| e["caller"] == "fault-reader" && e["parent"].is_u64()), "{echoes:?}");
    assert!(!echoes.iter().any(|e| e["caller"] == ""), "no anonymous inner call: {echoes:?}");
    let prompts = logged(&s, "prompts/get", |e| {
        e.iter()
            .filter(|e| e["caller"] == "fault-reader")
            .map(|e| &e["via"])
            .collect::<std::collections::HashSet<_>>()
            .len()
            >= 2
    });
    assert!(prompts.iter().any(|e| e["caller"] == "fault-reader" && e["via"] == "mcp"), "{prompts:?}");
    assert!(prompts.iter().any(|e| e["caller"] == "fault-reader" && e["via"] == "rest"), "{prompts:?}");
    // An agent outside the token's globs does not exist for it, on REST too.
    let (status, _) = s.post("/agents/helper/prompt", Some(FAULT), json!({}));
    assert_eq!(status, 404);
    let (_, listed) = s.get("/agents/list", Some(FAULT));
    let agents: Vec<&str> = listed["agents"].as_array().unwrap().iter().filter_map(|a| a["name"].as_str()).collect();
    assert_eq!(agents, ["relay-agent"], "{listed}");
    // Not in its OpenAPI document either, and the old body form does not tell it apart.
    let (_, openapi) = s.get("/openapi.json", Some(FAULT));
    let paths = openapi["paths"].as_object().unwrap();
    assert!(paths.contains_key("/agents/relay-agent/prompt") && !paths.contains_key("/agents/helper/prompt"));
    let (status, body) = s.post("/agents/helper/prompt", Some(FAULT), json!({"arguments": {"x": 1}}));
    assert_eq!(status, 404, "{body}");
}

#[test]
fn a_scoped_token_learns_nothing_outside_its_scope_from_health_or_scripted_tools() {
    let s = scoped_server();
    let (_, admin) = s.get("/health", Some(ADMIN));
    assert!(admin["upstreams"].as_array().is_some_and(|u| !u.is_empty()), "{admin}");
    let (status, health) = s.get("/health", Some(CI));
    assert_eq!(status, 200);
    assert!(
        health["upstreams"].as_array().is_none_or(|u| u.is_empty()),
        "no upstream process, calls or latency: {health}"
    );
    let (_, listed) = s.get("/tools/list", Some(CI));
    let visible = listed["tools"].as_array().unwrap().len() as u64;
    assert_eq!(health["tools"], json!(visible), "the tool count is its own: {health}");
    assert!(health["load"].is_null() && health["config"].is_null(), "{health}");

    // The scripted tool `searcher` may call search and deploy. The admin's listing shows both
    // signatures; a token that may call searcher and search, but not deploy, sees only search.
    let description = |token: &str| {
        let listed = s.mcp(token, "tools/list", None, json!({}));
        let tools = listed["result"]["tools"].as_array().cloned().unwrap_or_default();
        let searcher = tools.iter().find(|t| t["name"] == "searcher").cloned().unwrap_or(Value::Null);
        searcher["description"].as_str().unwrap_or_default().to_string()
    };
    let admin_view = description(ADMIN);
    assert!(admin_view.contains("deploy") && admin_view.contains("search"), "{admin_view}");
    let scoped_view = description(SEARCHER);
    assert!(scoped_view.contains("search") && !scoped_view.contains("deploy"), "{scoped_view}");
    // Its scripts' error for a tool outside the scripted tool's globs does not list the globs
    // to a scoped caller (they may name tools outside its scope).
    let (_, failed) = s.post("/tools/searcher", Some(SEARCHER), json!({"script": "return ctx.nope({})"}));
    let message = failed["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.contains("deploy"), "{failed}");
    let (_, failed) = s.post("/tools/searcher", Some(ADMIN), json!({"script": "return ctx.nope({})"}));
    assert!(failed["error"]["message"].as_str().unwrap_or_default().contains("search, deploy"), "{failed}");
}

#[test]
fn a_scripts_own_approve_holds_and_unknown_tool_table_keys_are_load_problems() {
    let s = scoped_server();
    // deploy's script says approve = true (its section does not): a call waits for a person.
    let (status, pending, _) = s.send_with("/tools/deploy", Some(ADMIN), &[], json!({"message": "now"}));
    assert_eq!(status, 202, "the script's approve = true holds: {pending}");
    assert!(pending["id"].is_string(), "{pending}");

    // A key the tool table does not take is a load problem that says where it belongs.
    let ws = crate::common::Workspace::new("[tools.script.x]\npath = \"x.lua\"\n");
    ws.write("x.lua", "tool = { name = 'x', description = 'X.', timeout = 5 }\nfunction tool.execute() return 1 end\n");
    let check = ws.ctx(&["schema", "check"]);
    assert_eq!(check.code(), 2, "{}", check.stderr());
    assert!(check.stderr().contains("tool.timeout is not a key of the tool table"), "{}", check.stderr());
    assert!(check.stderr().contains("move it to [tools.script.x]"), "{}", check.stderr());
    ws.write(
        "x.lua",
        "tool = { name = 'x', description = 'X.', owner = 'ops' }\nfunction tool.execute() return 1 end\n",
    );
    let check = ws.ctx(&["schema", "check"]);
    assert!(check.stderr().contains("tool.owner is not a key of the tool table"), "{}", check.stderr());
    // A key a metatable would answer is not read by some and missed by others: refused.
    ws.write(
        "x.lua",
        "tool = setmetatable({ name = 'x', description = 'X.' }, {__index = {approve = true}})\nfunction tool.execute() return 1 end\n",
    );
    let check = ws.ctx(&["schema", "check"]);
    assert!(check.stderr().contains("the tool table has a metatable"), "{}", check.stderr());
}

#[test]
fn a_client_approves_its_own_calls_only_when_the_operator_lets_its_token() {
    let asker = "asker-token-0123456789ab";
    let approvals = |ask: &str| {
        serve_with(
            &format!(
                "\n[[server.tokens]]\nname = \"asker\"\ntoken = \"{asker}\"\ntools = [\"echo\"]\napprove_own_calls = true\n\n\
                 [approval]\ntools = [\"echo\"]\n{ask}"
            ),
            &[],
        )
    };
    // By default nobody's client is asked: not the admin's, not a scoped one's.
    let s = approvals("");
    let Some(admin) = crate::approvals_and_call_log::mcp_client_call(&s, ADMIN, "approve", json!({"message": "m"}))
    else {
        return;
    };
    assert_eq!(admin["isError"], true, "{admin}");
    assert_eq!(admin["elicited"], json!([]), "{admin}");
    for era in ["2025", "2026"] {
        let asked =
            crate::approvals_and_call_log::mcp_client_call_in(&s, asker, "approve", era, json!({"message": "m"}))
                .unwrap();
        assert_eq!(asked["elicited"], json!([]), "{era}: {asked}");
        assert_eq!(asked["isError"], true, "{era}: {asked}");
    }
    // Turned on: the admin's client and the token that may approve its own calls are asked; a
    // scoped token without approve_own_calls is not, in either era.
    let s = approvals("ask_clients = true\n");
    for era in ["2025", "2026"] {
        let ci =
            crate::approvals_and_call_log::mcp_client_call_in(&s, CI, "approve", era, json!({"message": "m"})).unwrap();
        assert_eq!((&ci["isError"], &ci["elicited"]), (&json!(true), &json!([])), "{era}: {ci}");
        let asked =
            crate::approvals_and_call_log::mcp_client_call_in(&s, asker, "approve", era, json!({"message": "m"}))
                .unwrap();
        assert_eq!(asked["isError"], false, "{era}: {asked}");
        assert!(asked["elicited"][0]["message"].as_str().unwrap().contains("Allow the tool 'echo'"), "{era}: {asked}");
    }
    // A REST-issued approval token sent as _approval over the 2026 era gets no question that
    // the same scoped caller could answer.
    let (status, pending, _) = s.send_with("/tools/echo", Some(CI), &[], json!({"message": "rest"}));
    assert_eq!(status, 202, "{pending}");
    let token = pending["token"].as_str().unwrap();
    let sent = crate::approvals_and_call_log::mcp_client_call_in(
        &s,
        CI,
        "approve",
        "2026",
        json!({"message": "rest", "_approval": token}),
    )
    .unwrap();
    assert_eq!((&sent["isError"], &sent["elicited"]), (&json!(true), &json!([])), "{sent}");
    let listed = s.cli(&["approvals", "list", "--json"]).json();
    let still = listed["approvals"].as_array().unwrap().iter().find(|a| a["id"] == pending["id"]).unwrap();
    assert_eq!(still["state"], "pending", "{listed}");
}
