//! Code mode with upstream MCP servers: seed 001's example scripts against the real
//! servers of the gateway tests (server-everything, mcp-server-time) over REST and MCP, and the
//! fault-injecting upstream for concurrency, cancellation of calls in flight, and server names
//! that are Lua keywords or library names.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::code_mode::{execute, run_script, was_cancelled};
use crate::common::{test_command, Workspace};
use crate::gateway::{fault_section, serve, McpStdio};

/// A `[mcp.servers.<name>]` section running `words` (a command line from `scripts/test-env`)
/// with `args` after them.
fn section(name: &str, words: &[String], args: &[&str]) -> String {
    let args: Vec<String> =
        words[1..].iter().map(String::as_str).chain(args.iter().copied()).map(|a| format!("{a:?}")).collect();
    format!("[mcp.servers.{name}]\ncommand = {:?}\nargs = [{}]\n\n", words[0], args.join(", "))
}

// ---------------------------------------------------------------------------------------------
// Seed 001's examples, in their form, against real servers.

/// Seed 001's simple call, with the local named as its "correct pattern" says.
const SIMPLE: &str = "local sum = everything.get_sum({ a = 10, b = 20 }):await()\nresult(sum)\n";

/// Seed 001's simple call exactly as it is written there: its own "common mistake".
const SIMPLE_AS_WRITTEN: &str = "local result = everything.get_sum({ a = 10, b = 20 }):await()\nresult(result)\n";

const MULTI_SERVER: &str = r#"
-- Fetch data from one server
local now = time.get_current_time({ timezone = "Europe/Paris" }):await()

-- Process with another server
local echoed = everything.echo({ message = now.timezone }):await()
local tokyo = time.convert_time({ source_timezone = "UTC", time = "12:00", target_timezone = "Asia/Tokyo" }):await()

-- Return combined result
result({
    timezone = now.timezone,
    echoed = echoed,
    tokyo = tokyo.target.datetime,
    difference = tokyo.time_difference,
})
"#;

fn error_handling(timezone: &str) -> String {
    format!(
        r#"
local success, data = pcall(function()
    return time.get_current_time({{ timezone = "{timezone}" }}):await()
end)

if success then
    result({{ status = "ok", data = data }})
else
    result({{ status = "error", message = tostring(data) }})
end
"#
    )
}

const TRANSFORM: &str = r#"
local raw = everything.get_resource_links({ count = 4 }):await()

-- Transform in Lua
local names, uris = {}, {}
for i, block in ipairs(raw.content) do
    if block.type == "resource_link" then
        names[#names + 1] = block.name
        uris[#uris + 1] = block.uri
    end
end

result({ user_names = names, uris = uris })
"#;

fn check_simple(result: &Value) {
    assert_eq!(result, "The sum of 10 and 20 is 30.", "{result}");
}

fn check_multi(result: &Value) {
    assert_eq!(result["timezone"], "Europe/Paris", "{result}");
    assert_eq!(result["echoed"], "Echo: Europe/Paris", "{result}");
    assert!(result["tokyo"].as_str().unwrap().ends_with("T21:00:00+09:00"), "{result}");
    assert_eq!(result["difference"], "+9.0h", "{result}");
}

fn check_error(result: &Value) {
    assert_eq!(result["status"], "error", "{result}");
    let message = result["message"].as_str().unwrap();
    assert!(message.starts_with("time.get_current_time failed: ") && message.contains("Nowhere/18"), "{message}");
}

fn check_ok(result: &Value) {
    assert_eq!(result["status"], "ok", "{result}");
    assert_eq!(result["data"]["timezone"], "UTC", "{result}");
}

fn check_transform(result: &Value) {
    let names = result["user_names"].as_array().unwrap();
    assert_eq!(names.len(), 4, "{result}");
    assert!(names.iter().all(|n| n.as_str().unwrap().contains("Resource")), "{result}");
    // Resource URIs are namespaced by the server they came from, inside scripts too.
    let uris = result["uris"].as_array().unwrap();
    assert!(uris.iter().all(|u| u.as_str().unwrap().starts_with("mcp://everything/demo://")), "{result}");
}

type Seed = (&'static str, String, usize, fn(&Value));

fn seeds() -> Vec<Seed> {
    vec![
        ("simple call", SIMPLE.to_string(), 1, check_simple),
        ("multi-server orchestration", MULTI_SERVER.to_string(), 3, check_multi),
        ("error handling, failing", error_handling("Nowhere/18"), 1, check_error),
        ("error handling, working", error_handling("UTC"), 1, check_ok),
        ("data transformation", TRANSFORM.to_string(), 1, check_transform),
    ]
}

#[test]
fn seed_001_examples_run_against_real_upstreams_over_rest_and_mcp() {
    let (Some(everything), Some(time)) = (test_command("CTX_TEST_EVERYTHING"), test_command("CTX_TEST_TIME_SERVER"))
    else {
        return;
    };
    let config = format!(
        "{}{}",
        section("everything", &everything, &["stdio"]),
        section("time", &time, &["--local-timezone", "UTC"])
    );

    // REST.
    let served = serve(Workspace::new(&config), &[]);
    served.ready("everything");
    served.ready("time");
    for (name, script, calls, check) in seeds() {
        let reply = execute(&served, &script);
        check(reply.ok());
        assert_eq!(reply.trace()["calls"].as_array().unwrap().len(), calls, "{name}: {}", reply.body);
        assert_eq!(reply.trace()["started"], calls, "{name}: {}", reply.body);
    }
    let reply = execute(&served, SIMPLE_AS_WRITTEN);
    reply.failed("script_error", "`result` is a local variable here");
    assert!(reply.message().contains("local sum = ..."), "{}", reply.message());
    // Uncaught, the failing call ends the run with its line, message and trace.
    let reply = execute(
        &served,
        "local now = time.get_current_time({ timezone = \"UTC\" }):await()\nlocal bad = time.get_current_time({ timezone = \"Nowhere/18\" }):await()\nreturn bad",
    );
    reply.failed("script_error", "Nowhere/18");
    assert_eq!(reply.body["error"]["data"]["data"]["line"], 2, "{}", reply.body);
    let statuses: Vec<&str> =
        reply.trace()["calls"].as_array().unwrap().iter().map(|c| c["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["ok", "error"], "{}", reply.body);
    // Discovery over the real servers: the relevant tool ranks first.
    let reply = execute(&served, "return search_tools('current time in a timezone', 3).tools[1].call");
    assert_eq!(reply.ok(), "time.get_current_time", "{}", reply.body);
    let reply = execute(&served, "return describe_tool('everything.get_sum').signature");
    assert!(reply.ok().as_str().unwrap().starts_with("everything.get_sum({a: number, b: number"), "{}", reply.body);
    drop(served);

    // MCP (stdio): the same scripts give the same results, the trace in _meta.
    let ws = Workspace::new(&config);
    let mut mcp = McpStdio::start(&ws);
    mcp.wait_tool("everything__get-resource-links");
    mcp.wait_tool("time__convert_time");
    for (name, script, calls, check) in seeds() {
        let (response, _) = mcp.request("tools/call", json!({"name": "execute", "arguments": {"script": script}}));
        let result = &response["result"];
        assert_ne!(result["isError"], true, "{name}: {response}");
        match result.get("structuredContent") {
            Some(structured) => check(structured),
            // A text result (the simple call) is text only.
            None => check(&result["content"][0]["text"]),
        }
        let trace = &result["_meta"]["ctx/trace"];
        assert_eq!(trace["calls"].as_array().map(Vec::len), Some(calls), "{name}: {response}");
    }
    let (response, _) =
        mcp.request("tools/call", json!({"name": "execute", "arguments": {"script": SIMPLE_AS_WRITTEN}}));
    assert_eq!(response["result"]["isError"], true, "{response}");
    assert!(
        response["result"]["content"][0]["text"].as_str().unwrap().contains("`result` is a local variable here"),
        "{response}"
    );
    // Discovery is there as MCP tools too.
    let (response, _) = mcp.request("tools/call", json!({"name": "list_servers", "arguments": {}}));
    let servers = response["result"]["structuredContent"]["servers"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = servers.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["ctx", "everything", "time"], "{response}");
}

// ---------------------------------------------------------------------------------------------
// The fault upstream: concurrency and cancellation.

#[test]
fn upstream_calls_run_concurrently_and_max_concurrent_queues_them() {
    let config = format!(
        "{}[tools.scripted.pair]\ndescription = \"Two calls at a time per server.\"\ntools = [\"fault__*\"]\nmax_concurrent = 2\n",
        fault_section("fault", &[], "")
    );
    let served = serve(Workspace::new(&config), &[]);
    served.ready("fault");
    const N: u32 = 8;
    let t = Duration::from_millis(400);
    let script = format!(
        "local calls = {{}}\nfor i = 1, {N} do calls[i] = fault.slow({{ ms = {} }}) end\nreturn await_all(calls)",
        t.as_millis()
    );
    let reply = execute(&served, &script);
    let answers = reply.ok().as_array().unwrap();
    assert_eq!(answers.len(), N as usize);
    assert!(answers.iter().all(|a| a == "slept 400"), "{answers:?}");
    assert!(reply.took < t * N / 2, "{N} calls of {t:?} took {:?}: they did not run concurrently", reply.took);
    let calls = reply.trace()["calls"].as_array().unwrap();
    assert!(calls.iter().all(|c| c["tool"] == "fault__slow" && c["ms"].as_f64().unwrap() >= 390.0), "{calls:?}");

    let reply = run_script(&served, "pair", &script, json!({}));
    assert_eq!(reply.ok().as_array().unwrap().len(), N as usize);
    let floor = t.mul_f64(f64::from(N) / 2.0 * 0.8);
    assert!(reply.took >= floor, "max_concurrent = 2 ran {N} calls of {t:?} in {:?}", reply.took);
    // The wait for a turn is not part of a call's own time.
    let calls = reply.trace()["calls"].as_array().unwrap();
    assert!(calls.iter().all(|c| c["ms"].as_f64().unwrap() < 1500.0), "{calls:?}");
}

fn log_lines(path: &Path, prefix: &str) -> usize {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter(|l| l.starts_with(prefix)).count()
}

/// Waits until the upstream's log has `count` lines starting with `prefix`.
#[track_caller]
fn wait_log(path: &Path, prefix: &str, count: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while log_lines(path, prefix) < count {
        assert!(
            Instant::now() < deadline,
            "{what}: the upstream logged {} {prefix:?} lines, not {count}: {:?}",
            log_lines(path, prefix),
            std::fs::read_to_string(path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

const CANCEL_CONFIG: &str = r#"
[code_mode]
timeout = 10
memory_mb = 16
max_instructions = 50000000

[tools.scripted.few]
description = "At most three calls."
tools = ["fault__*"]
max_calls = 3
"#;

#[test]
fn a_tripped_limit_cancels_the_calls_in_flight_at_the_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let config = format!("{CANCEL_CONFIG}\n{}", fault_section("fault", &["--log", log.to_str().unwrap()], ""));
    let served = serve(Workspace::new(&config), &[]);
    served.ready("fault");
    // Each script starts a call that never answers, lets it reach the upstream, then trips a limit.
    let hang = "local h = fault.hang({})\nsleep(0.3)\n";
    let cases: Vec<(&str, String, Value, &str)> = vec![
        ("execute", "local h = fault.hang({})\nreturn h:await()".to_string(), json!({"timeout": 1}), "timeout"),
        // A call never awaited is still part of the run, which waits for it until its deadline.
        ("execute", "local h = fault.hang({})\nreturn 'done'".to_string(), json!({"timeout": 1}), "timeout"),
        ("execute", format!("{hang}while true do end"), json!({}), "max_instructions"),
        ("execute", format!("{hang}local t = {{}} for i = 1, 1e8 do t[i] = i end"), json!({}), "memory"),
        ("few", format!("{hang}for i = 1, 5 do fault.echo({{ text = 'x' }}) end"), json!({}), "max_calls"),
        ("execute", format!("{hang}error('boom')"), json!({}), "script_error"),
        (
            "execute",
            format!(
                "{hang}local ok, e = pcall(function() return fault.fail({{ message = 'no' }}):await() end)\nerror(e)"
            ),
            json!({}),
            "script_error",
        ),
    ];
    for (i, (tool, script, extra, code)) in cases.iter().enumerate() {
        let reply = run_script(&served, tool, script, extra.clone());
        assert_eq!(reply.code(), *code, "{script}: {}", reply.body);
        assert!(reply.took < Duration::from_secs(8), "{script} took {:?}", reply.took);
        assert!(was_cancelled(reply.trace(), "fault__hang"), "{script}: {}", reply.body);
        wait_log(&log, "call hang", i + 1, script);
        wait_log(&log, "cancelled ", i + 1, script);
        // The connection is still good.
        let reply = execute(&served, "return fault.echo({ text = 'still here' }):await()");
        assert_eq!(reply.ok(), &json!({"text": "still here"}), "after {script}");
    }
    assert_eq!(served.upstream("fault")["state"], "ready");
    assert_eq!(served.upstream("fault")["restarts"], 0);
}

#[test]
fn each_cancelled_call_is_traced_once() {
    let served = serve(Workspace::new(&format!("{CANCEL_CONFIG}\n{}", fault_section("fault", &[], ""))), &[]);
    served.ready("fault");
    // Seen in about one run in eight on 2 cores: the memory limit trips while the call is
    // being sent.
    for round in 0..60 {
        let reply = execute(&served, "local h = fault.hang({}) local s = string.rep('x', 1e9)");
        assert_eq!(reply.code(), "memory", "{}", reply.body);
        let trace = reply.trace();
        assert_eq!(trace["started"], 1, "{trace}");
        assert_eq!(trace["calls"].as_array().unwrap().len(), 1, "round {round}: {trace}");
    }
}

// ---------------------------------------------------------------------------------------------
// Names: a keyword, a library's name, a dash.

#[test]
fn server_names_are_sanitised_and_a_server_named_string_is_only_in_mcp() {
    let config = format!(
        "{}{}{}",
        fault_section("goto", &[], ""),
        fault_section("string", &[], ""),
        fault_section("data-server", &[], "")
    );
    let served = serve(Workspace::new(&config), &[]);
    for name in ["goto", "string", "data-server"] {
        served.ready(name);
    }
    let reply = execute(
        &served,
        r#"
local a = _goto.add({ a = 1, b = 2 }):await()
local b = mcp["goto"].add({ a = 2, b = 3 }):await()
local c = mcp["string"].echo({ text = "through mcp" }):await()
local d = data_server.echo({ text = "dash" }):await()
local e = mcp["data-server"]["echo"]({ text = "exact" }):await()
return {
  goto_sum = a.sum, exact_sum = b.sum, string_echo = c.text, dash = d.text, exact = e.text,
  formatted = string.format("%05.1f|%s", 3.14159, ("x"):upper()),
  string_is_lua = string.echo == nil and rawget(string, "add") == nil and type(string.rep) == "function",
}
"#,
    );
    assert_eq!(
        reply.ok(),
        &json!({
            "goto_sum": 3, "exact_sum": 5, "string_echo": "through mcp", "dash": "dash", "exact": "exact",
            "formatted": "003.1|X", "string_is_lua": true
        }),
        "{}",
        reply.body
    );
    // `goto` as a global is a syntax error in Lua; `string.add` is Lua's string table's.
    execute(&served, "return goto.add({ a = 1, b = 2 }):await()").failed("syntax_error", "script");
    let reply = execute(&served, "return string.add({ a = 1, b = 2 })");
    reply.failed("script_error", "attempt to call a nil value");

    let reply = execute(&served, "return list_servers()");
    let servers = reply.ok()["servers"].as_array().unwrap().clone();
    let by_name =
        |name: &str| servers.iter().find(|s| s["name"] == name).cloned().unwrap_or_else(|| panic!("{servers:?}"));
    assert_eq!(by_name("goto")["global"], "_goto");
    assert_eq!(by_name("data-server")["global"], "data_server");
    let string = by_name("string");
    assert_eq!(string["global"], Value::Null, "{string}");
    let note = string["note"].as_str().unwrap();
    assert!(note.contains("shadow") && note.contains("mcp[\"string\"]"), "{note}");
    // The catalog shows how to reach each.
    let catalog = served.ws.ctx(&["catalog"]).ok();
    assert!(catalog.contains("_goto.add(") && catalog.contains("data_server.echo("), "{catalog}");
    assert!(catalog.contains("mcp[\"string\"]"), "{catalog}");
}

/// An upstream tool annotated `destructiveHint: true` is refused to scripts, whichever name
/// the script reaches it by, and a discovery tool shows the annotation.
#[test]
fn an_upstream_tools_destructive_hint_is_honoured() {
    let config = format!("{CANCEL_CONFIG}\n{}", fault_section("fault", &[], ""));
    let served = serve(Workspace::new(&config), &[]);
    served.ready("fault");
    for script in [
        "return fault.crash({}):await()",
        "return mcp.fault.crash({}):await()",
        "return ctx['fault__crash']({}):await()",
    ] {
        let reply = execute(&served, script);
        reply.failed("script_error", "tool 'fault__crash' is destructive");
    }
    let reply = execute(&served, "return describe_tool('fault.crash')");
    assert_eq!(reply.ok()["annotations"]["destructive"], true, "{}", reply.body);
    // The server is still up: the refused call never reached it.
    let reply = execute(&served, "return fault.echo({text = 'alive'}):await()");
    assert!(reply.ok().to_string().contains("alive"), "{}", reply.body);
}

/// A result the script has taken no longer counts against its memory: ten 3 MB results
/// awaited one after another fit a 16 MiB script, while holding them all at once does not.
#[test]
fn awaited_results_stop_counting_against_the_memory_cap() {
    let config = format!("{CANCEL_CONFIG}\n{}", fault_section("fault", &[], ""));
    let served = serve(Workspace::new(&config), &[]);
    served.ready("fault");
    let one_by_one = "local n = 0\nfor i = 1, 10 do\n  local r = fault.huge({bytes = 3000000}):await()\n  n = n + #tostring(r)\n  r = nil\n  collectgarbage()\nend\nreturn n";
    let reply = execute(&served, one_by_one);
    assert!(reply.ok().as_u64().unwrap() >= 30_000_000, "{}", reply.body);
    // All ten finish (and are held) before the script takes any.
    let all_at_once = "local ps = {}\nfor i = 1, 10 do ps[i] = fault.huge({bytes = 3000000}) end\nsleep(4)\nlocal ok, e = pcall(await_all, ps)\nreturn {ok = ok, message = e.message}";
    let reply = execute(&served, all_at_once);
    assert_eq!(reply.ok()["ok"], false, "{}", reply.body);
    assert!(reply.ok()["message"].as_str().unwrap().contains("memory limit of 16 MiB"), "{}", reply.body);
}

/// Issue 21: a real upstream's tools reach the tool-call log like any other, called over REST
/// and from a script (linked to the script's call), and a failed upstream call is logged with
/// its error and no result.
#[test]
fn upstream_calls_reach_the_call_log() {
    let Some(everything) = test_command("CTX_TEST_EVERYTHING") else { return };
    let served = serve(Workspace::new(&section("everything", &everything, &["stdio"])), &[]);
    served.ready("everything");
    let (status, direct) = served.post("/tools/everything__echo", json!({"message": "logged upstream"}));
    assert_eq!(status, 200, "{direct}");
    let reply = execute(&served, "return everything.get_sum({a = 2, b = 3}):await()");
    reply.ok();
    let (status, bad) = served.post("/tools/everything__get-sum", json!({"a": "two"}));
    assert_eq!(status, 400, "a bad argument: {bad}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let calls = loop {
        let run = served.ws.ctx(&["log", "--json", "--limit", "100"]);
        assert_eq!(run.code(), 0, "{}", run.stderr());
        let calls = run.json()["calls"].as_array().unwrap().clone();
        if calls.len() >= 4 || Instant::now() > deadline {
            break calls;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let find = |tool: &str, via: &str| {
        calls
            .iter()
            .find(|c| c["tool"] == tool && c["via"] == via && c["outcome"] == "ok")
            .unwrap_or_else(|| panic!("no {tool} call via {via}: {calls:#?}"))
    };
    let echo = find("everything__echo", "rest");
    assert_eq!(echo["params"]["message"], "logged upstream", "{echo}");
    assert!(echo["result"].to_string().contains("Echo: logged upstream"), "{echo}");
    let script = find("execute", "rest");
    let inner = find("everything__get-sum", "code");
    assert_eq!(inner["parent"], script["id"], "the upstream call is linked to its script: {inner}");
    assert_eq!(inner["params"], json!({"a": 2, "b": 3}));
    let failed = calls
        .iter()
        .find(|c| c["tool"] == "everything__get-sum" && c["via"] == "rest")
        .unwrap_or_else(|| panic!("the failed call is not logged: {calls:#?}"));
    assert_eq!(failed["outcome"], "bad_request", "{failed}");
    assert!(failed["message"].as_str().unwrap().contains("/a: expected number"), "{failed}");
    assert!(failed["result"].is_null(), "a failed call has no result (not one of an earlier call): {failed}");
}

/// A configured server that is not connected yet (here it never answers `initialize`) has no
/// tools, but a script that reaches for it learns why, by its global and through `mcp`, while
/// a server nobody configured is still unknown.
#[test]
fn a_server_still_starting_says_so_in_scripts() {
    let config = fault_section("late", &["--hang-at-start"], "");
    let served = serve(Workspace::new(&config), &[]);
    for script in [
        "return late.echo({text = 'x'}):await()",
        "return mcp['late'].echo({text = 'x'}):await()",
        "local ok, e = pcall(function() return late.echo({}) end) error(e, 0)",
    ] {
        let reply = execute(&served, script);
        reply.failed("script_error", "upstream MCP server 'late' is configured but not ready (connecting");
        assert!(reply.message().contains("retry in a moment"), "{}", reply.body);
    }
    execute(&served, "return mcp['nobody'].x({}):await()").failed("script_error", "no server \"nobody\"");
}

/// The two mistakes a new user makes first get the fix and their line: a misspelt server global
/// names the servers in scope and the nearest one (Lua alone says "attempt to index a nil
/// value"), and `.await()` with a dot says to write `:await()`, even in a `return` (a tail
/// call, which leaves Lua no line of its own to report).
#[test]
fn a_misspelt_server_and_a_dotted_await_name_the_fix_and_the_line() {
    let Some(time) = test_command("CTX_TEST_TIME_SERVER") else { return };
    let served = serve(Workspace::new(&section("time", &time, &["--local-timezone", "UTC"])), &[]);
    served.ready("time");

    let reply = execute(&served, "local zone = 'UTC'\nreturn tme.get_current_time({timezone = zone}):await()");
    reply.failed("script_error", "script:2: global 'tme' is nil: no server 'tme' in this script's scope");
    assert!(reply.message().contains("did you mean 'time'? servers: ctx, time"), "{}", reply.message());
    assert_eq!(reply.body["error"]["data"]["data"]["line"], 2, "{}", reply.body);
    // A misspelt function gets the nearest one; a global that is only read stays nil.
    let reply = execute(&served, "\n\nreturn lst_tools('time')");
    reply.failed("script_error", "script:3: global 'lst_tools' is nil");
    assert!(reply.message().contains("did you mean 'list_tools'?"), "{}", reply.message());
    assert_eq!(execute(&served, "return tme == nil").ok(), &json!(true));

    for (script, line) in [
        ("local zone = 'UTC'\nlocal now = time.get_current_time({timezone = zone}).await()\nreturn now", 2),
        ("local p = time.get_current_time({timezone = 'UTC'})\n\nreturn p.await()", 3),
        ("local zone = 'UTC'\n\n\nreturn time.get_current_time({timezone = zone}).await()", 4),
    ] {
        let reply = execute(&served, script);
        reply.failed("script_error", &format!("script:{line}: .await() on a pending call of time.get_current_time"));
        assert!(reply.message().contains("write :await(), with a colon"), "{}", reply.message());
        assert_eq!(reply.body["error"]["data"]["data"]["line"], line, "{script}: {}", reply.body);
    }
    // The colon still works, and `ctx run` says the same.
    let reply = execute(&served, "return time.get_current_time({timezone = 'UTC'}):await().timezone");
    assert_eq!(reply.ok(), "UTC", "{}", reply.body);
    let ws = &served.ws;
    ws.write("dot.lua", "local zone = 'UTC'\nreturn time.get_current_time({timezone = zone}).await()");
    let run = ws.ctx(&["run", "dot.lua"]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("script:2: .await() on a pending call"), "{}", run.stderr());
}

/// Reading `p.await` walks a bounded number of stack frames for the script's line and makes one
/// small function: a script that reads it without end is stopped by its deadline, and the
/// functions it leaves behind are collected under the memory cap.
#[test]
fn reading_await_in_a_loop_is_bounded_by_the_deadline_and_the_memory_cap() {
    let Some(time) = test_command("CTX_TEST_TIME_SERVER") else { return };
    let served = serve(Workspace::new(&section("time", &time, &["--local-timezone", "UTC"])), &[]);
    served.ready("time");
    let forever = "local p = time.get_current_time({timezone = 'UTC'})\nwhile true do local f = p.await end";
    let started = Instant::now();
    let reply = run_script(&served, "execute", forever, json!({"timeout": 1}));
    reply.failed("timeout", "ran past its time limit of 1 second");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let many = "local p = time.get_current_time({timezone = 'UTC'})\nfor i = 1, 200000 do local f = p.await end\nreturn p:await().timezone";
    assert_eq!(execute(&served, many).ok(), "UTC");
}
