//! Code mode end to end without upstream servers: agent-sent scripts through
//! `POST /tools/execute` on a real `ctx serve` (every sandbox probe, limits, inner-call errors,
//! discovery, scripted tools, the destructive policy, host APIs), and `ctx run` / `ctx catalog`
//! through the real binary. The upstream half is in `code_mode_upstream.rs`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{Run, Workspace, BIN};
use crate::gateway::{serve, Served};

/// Generous bound on one REST call: every script here is stopped by its own limits long before.
const CALL_WAIT: Duration = Duration::from_secs(30);

/// One REST answer: its status, body, size and how long it took.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Value,
    pub(crate) bytes: usize,
    pub(crate) took: Duration,
}

impl Reply {
    /// `data.code` of a failed script (`script_error`, `timeout`, `memory`...).
    pub(crate) fn code(&self) -> &str {
        self.body["error"]["data"]["code"].as_str().unwrap_or_default()
    }

    pub(crate) fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or_default()
    }

    /// The trace of a run, whether it succeeded or failed.
    pub(crate) fn trace(&self) -> &Value {
        match self.body.get("trace") {
            Some(trace) => trace,
            None => &self.body["error"]["data"]["data"]["trace"],
        }
    }

    /// Asserts the envelope code and status of a run that failed with `data.code` = `code`:
    /// a deadline is a timeout (408) and a script that does not compile bad input (400), as
    /// for any tool; the rest is the script's own failure (500).
    #[track_caller]
    pub(crate) fn is_envelope_of(&self, code: &str) {
        let (status, envelope) = match code {
            "timeout" => (408, "timeout"),
            "syntax_error" => (400, "bad_request"),
            "memory" => (500, "memory_limit"),
            "result_too_large" => (500, "result_too_large"),
            _ => (500, "tool_error"),
        };
        assert_eq!(self.status, status, "{}", self.body);
        assert_eq!(self.body["error"]["code"], envelope, "{}", self.body);
    }

    /// Asserts a successful run and returns its result.
    #[track_caller]
    pub(crate) fn ok(&self) -> &Value {
        assert_eq!(self.status, 200, "{}", self.body);
        assert!(self.body["trace"]["calls"].is_array(), "a successful run carries its trace: {}", self.body);
        &self.body["result"]
    }

    /// Asserts a failed run with `data.code` = `code`, the envelope code and status that
    /// code maps to, and a message containing `needle`.
    #[track_caller]
    pub(crate) fn failed(&self, code: &str, needle: &str) {
        self.is_envelope_of(code);
        assert_eq!(self.code(), code, "{}", self.body);
        assert!(self.message().contains(needle), "{needle:?} not in {:?}", self.message());
    }
}

/// `POST /tools/<tool>` with `body`, bounded by [`CALL_WAIT`].
pub(crate) async fn post(client: &reqwest::Client, addr: &str, tool: &str, body: Value) -> Reply {
    let started = Instant::now();
    let response = client
        .post(format!("http://{addr}/tools/{tool}"))
        .timeout(CALL_WAIT)
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST /tools/{tool} got no answer: {e}"));
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    let took = started.elapsed();
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    Reply { status, body, bytes: text.len(), took }
}

/// Runs `script` through the script tool `tool` (`execute`, or a scripted tool) with `extra`
/// parameters (`{"timeout": 1}`).
pub(crate) fn run_script(served: &Served, tool: &str, script: &str, extra: Value) -> Reply {
    let mut body = json!({ "script": script });
    if let Value::Object(extra) = extra {
        body.as_object_mut().unwrap().extend(extra);
    }
    served.runtime.block_on(post(&served.client, &served.serve.addr, tool, body))
}

pub(crate) fn execute(served: &Served, script: &str) -> Reply {
    run_script(served, "execute", script, json!({}))
}

/// Whether the trace shows `tool`'s call cancelled (by the run's end, or seen by the call).
pub(crate) fn was_cancelled(trace: &Value, tool: &str) -> bool {
    let calls = trace["calls"].as_array().into_iter().flatten();
    calls.filter(|c| c["tool"] == tool).any(|c| c["status"] == "cancelled" || c["code"] == "cancelled")
}

/// The server answers `/health` and a plain search: nothing a script did took it down.
#[track_caller]
fn assert_healthy(served: &Served, after: &str) {
    let (status, health) = served.get("/health");
    assert_eq!(status, 200, "after {after}: /health {health}\nlog:\n{}", served.log());
    assert_eq!(health["status"], "ok", "after {after}: {health}");
    let reply = served.runtime.block_on(post(&served.client, &served.serve.addr, "search", json!({"query": "wombat"})));
    assert_eq!(reply.status, 200, "after {after}: search {}", reply.body);
    let found = reply.body.get("result").unwrap_or(&reply.body);
    let title = found["results"][0]["title"].as_str().unwrap_or_default();
    assert!(title.contains("Wombat"), "after {after}: {}", reply.body);
}

/// A workspace with one synced document about wombats, and `config` after its connector.
fn workspace(config: &str) -> Workspace {
    let ws = Workspace::new(&format!("[connectors.filesystem.docs]\nroot = \"docs\"\n\n{config}"));
    ws.write("docs/wombat.md", "# Wombats\n\nThe wombat digs burrows and sleeps by day.\n");
    ws.write("docs/quokka.md", "# Quokkas\n\nThe quokka smiles on Rottnest Island.\n");
    ws.ctx(&["sync"]).ok();
    ws
}

/// A Lua tool file.
fn lua_tool(name: &str, description: &str, extra: &str, body: &str) -> String {
    format!(
        "tool = {{ name = {name:?}, description = {description:?}{extra} }}\nfunction tool.execute(params, context)\n{body}\nend\n"
    )
}

// ---------------------------------------------------------------------------------------------
// 1. Every sandbox probe, sent as an agent script.

/// Limits small enough that every probe ends fast; `slowpoke` has no instruction budget to
/// speak of, so its loops run into the wall-clock deadline instead.
const PROBE_CONFIG: &str = r#"
[code_mode]
timeout = 5
memory_mb = 16
max_instructions = 20000000
max_output_bytes = 8192
max_log_lines = 10

[tools.scripted.slowpoke]
description = "Runs a script with a one-second deadline and no instruction budget to speak of."
tools = ["search"]
timeout = 1
max_instructions = 1000000000000
"#;

/// What a probe must end with.
enum Expect {
    /// Stopped or refused: `data.code` is one of these, and the message has the needle.
    Fails(&'static [&'static str], &'static str),
    /// Refused before any `data` (a result that is not JSON): the message has the needle.
    NotJson(&'static str),
    /// Finished with this result.
    Returns(Value),
    /// Finished, and the check holds for the whole body.
    Holds(fn(&Value) -> bool),
}

const LOOPS: &[&str] = &["timeout", "max_instructions"];

fn probes(marker: &str) -> Vec<(String, Expect)> {
    use Expect::*;
    let p = |s: &str, e| (s.to_string(), e);
    vec![
        // Escapes.
        p("return load('x', 'x', 'b')", Fails(&["script_error"], "only text chunks")),
        p("return load(string.dump(print))", Fails(&["script_error"], "dump")),
        p("return string.dump(function() end)", Fails(&["script_error"], "dump")),
        p("local f, err = load('\\27LuaT\\0') return {f == nil, err ~= nil}", Returns(json!([true, true]))),
        p("return debug.getinfo(1)", Fails(&["script_error"], "global 'debug'")),
        p("debug.sethook(print, 'l')", Fails(&["script_error"], "global 'debug'")),
        (format!("os.execute('touch {marker}')"), Fails(&["script_error"], "execute")),
        p("return os.getenv('HOME')", Fails(&["script_error"], "getenv")),
        p("os.exit(1)", Fails(&["script_error"], "exit")),
        p("return os.remove('ctx.toml')", Fails(&["script_error"], "remove")),
        p("return io.open('/etc/passwd')", Fails(&["script_error"], "global 'io'")),
        (format!("return io.popen('touch {marker}')"), Fails(&["script_error"], "global 'io'")),
        p("return package.loadlib('libc.so.6', 'system')", Fails(&["script_error"], "global 'package'")),
        p("return require('os')", Fails(&["script_error"], "require is not available to agent-sent scripts")),
        p("return dofile('/etc/passwd')", Fails(&["script_error"], "dofile")),
        p("return loadfile('/etc/passwd')", Fails(&["script_error"], "loadfile")),
        p("getmetatable('').__index = function() return 'pwned' end", Fails(&["script_error"], "index")),
        p("setmetatable('', {})", Fails(&["script_error"], "table expected")),
        p("setmetatable(_G, nil) return 1", Fails(&["script_error"], "protected metatable")),
        p("return {getmetatable(ctx), getmetatable(mcp)}", Returns(json!([false, false]))),
        p(
            "return {_G.os.execute == nil, _ENV.io == nil, rawget(_G, 'io') == nil, rawget(_G, 'debug') == nil}",
            Returns(json!([true, true, true, true])),
        ),
        p("local _ENV = {print = print} return os == nil", Returns(json!(true))),
        p("return setfenv == nil and getfenv == nil", Returns(json!(true))),
        p("return load('return os.execute')() == nil", Returns(json!(true))),
        p("return coroutine.wrap(function() return os.execute end)() == nil", Returns(json!(true))),
        p("collectgarbage('stop')", Fails(&["script_error"], "not allowed")),
        p("setmetatable({}, {__gc = function() while true do end end}) return 1", Fails(&["script_error"], "__gc")),
        p("return http.get('http://127.0.0.1:1/')", Fails(&["script_error"], "allow_hosts in [code_mode]")),
        p("return env.get('HOME')", Fails(&["script_error"], "allow_env in [code_mode]")),
        p("return fs.read('ctx.toml')", Fails(&["script_error"], "fs_root in [code_mode]")),
        // Code mode's own objects are not forgeable or writable.
        p("local p = ctx.search({query = 'x'}) p.x = 1", Fails(&["script_error"], "read-only")),
        p("local p = ctx.search({query = 'x'}) return getmetatable(p)", Returns(json!(false))),
        p("return await_all({{}})", Fails(&["script_error"], "not a pending tool call")),
        p("return mcp['nope']", Fails(&["script_error"], "no server \"nope\"")),
        // Loops: stopped by the instruction budget here (through slowpoke: by the deadline).
        p("while true do end", Fails(LOOPS, "stopped")),
        p("pcall(function() while true do end end) return 'survived'", Fails(LOOPS, "stopped")),
        p("while true do pcall(function() while true do end end) end", Fails(LOOPS, "stopped")),
        p("local co = coroutine.wrap(function() while true do end end) co()", Fails(LOOPS, "stopped")),
        p(
            "local co = coroutine.create(function() while true do end end) coroutine.resume(co) return 'survived'",
            Fails(LOOPS, "stopped"),
        ),
        p(
            "xpcall(function() while true do end end, function() while true do end end) return 'survived'",
            Fails(LOOPS, "stopped"),
        ),
        p(
            "local ok = pcall(pcall, pcall, function() while true do end end) return 'survived'",
            Fails(LOOPS, "stopped"),
        ),
        p("for i = 1, math.huge do local _ = tostring(i) end", Fails(LOOPS, "stopped")),
        // Lua that runs after the stop: to-be-closed variables, a coroutine's closes, handlers.
        p(
            "local x <close> = setmetatable({}, {__close = function() while true do end end})\nwhile true do end",
            Fails(LOOPS, "stopped"),
        ),
        p(
            "local co = coroutine.wrap(function() local x <close> = setmetatable({}, {__close = function() while true do end end}) while true do end end) co()",
            Fails(LOOPS, "stopped"),
        ),
        p(
            "pcall(function() local x <close> = setmetatable({}, {__close = function() while true do end end}) while true do end end) return 'survived'",
            Fails(LOOPS, "stopped"),
        ),
        p(
            "local co = coroutine.create(function() local x <close> = setmetatable({}, {__close = function() while true do end end}) while true do end end) pcall(coroutine.resume, co) coroutine.close(co) return 'survived'",
            Fails(LOOPS, "stopped"),
        ),
        p(
            "local mt = {__close = function() end} local x <close> = setmetatable({}, mt) mt.__close = function() while true do end end while true do end",
            Fails(LOOPS, "stopped"),
        ),
        p("while true do load(function() while true do end end) end", Fails(LOOPS, "stopped")),
        p("while true do pcall(load, function() while true do end end) end", Fails(LOOPS, "stopped")),
        // Memory bombs (memory_mb = 16).
        p("local s = string.rep('x', 64 * 1024 * 1024) return #s", Fails(&["memory"], "memory limit of 16 MiB")),
        p("local t = {} for i = 1, 1e9 do t[i] = i end", Fails(&["memory"], "memory_mb")),
        p("local s = 'x' while true do s = s .. s end", Fails(&["memory"], "memory_mb")),
        p("local t = {} while true do t[#t + 1] = string.rep('y', 1024) .. #t end", Fails(&["memory"], "memory_mb")),
        p(
            "local t = {} for i = 1, 1e7 do t[i] = tostring(i) end return table.concat(t)",
            Fails(&["memory"], "memory_mb"),
        ),
        p("pcall(string.rep, 'x', 64 * 1024 * 1024) return 'survived'", Fails(&["memory"], "memory_mb")),
        p(
            "while true do pcall(function() local t = {} for i = 1, 1e9 do t[i] = i end end) end",
            Fails(&["memory"], "memory_mb"),
        ),
        // Floods.
        p(
            "for i = 1, 100000 do print('line', i) end return 'printed'",
            Holds(|b| b["result"] == "printed" && b["trace"]["log_lines_dropped"] == 99990),
        ),
        p(
            "for i = 1, 100000 do log.error(string.rep('e', 1000)) end return 'logged'",
            Holds(|b| b["result"] == "logged" && b["trace"]["log_lines_dropped"] == 99990),
        ),
        p("error(string.rep('x', 4e6))", Fails(&["script_error"], "(truncated, 4000010 bytes)")),
        p(
            "error({message = string.rep('m', 4e6), code = string.rep('c', 4e6)})",
            Fails(&["script_error"], "(truncated,"),
        ),
        p("for i = 1, 1000 do pcall(error, string.rep('x', 1e5)) end return 'ok'", Returns(json!("ok"))),
        p("for i = 1, 1000 do ctx.search({query = 'wombat'}) end", Fails(&["max_calls"], "max_calls")),
        p(
            "return ctx.search({query = string.rep('x', 5e6)}):await()",
            Fails(&["script_error"], "cannot be sent as JSON"),
        ),
        // Huge results: cut to max_output_bytes, keeping their shape, with the note.
        p(
            "return string.rep('x', 4 * 1024 * 1024)",
            Holds(|b| {
                b["result"].as_str().is_some_and(|s| s.ends_with("more bytes cut]"))
                    && b["trace"]["truncated"]["original_bytes"] == 4 * 1024 * 1024 + 2
            }),
        ),
        p(
            "local t = {} for i = 1, 5000 do t[i] = {id = i, title = string.rep('y', 50)} end return {rows = t}",
            Holds(|b| {
                let rows = b["result"]["rows"].as_array().cloned().unwrap_or_default();
                rows.len() > 2
                    && rows[0]["id"] == 1
                    && rows.last().and_then(Value::as_str).is_some_and(|s| s.contains("more item(s) cut"))
                    && b["trace"]["truncated"]["note"].as_str().is_some_and(|n| n.contains("max_output_bytes"))
            }),
        ),
        p("local t = {} t.t = t return t", NotJson("a cycle?")),
        p("return {f = function() end}", NotJson("function cannot be converted to JSON")),
        p(
            "local t = {} local cur = t for i = 1, 1e5 do cur.x = {} cur = cur.x end return t",
            NotJson("nested more than"),
        ),
    ]
}

#[track_caller]
fn check(script: &str, reply: &Reply, expect: &Expect) {
    // Whatever a probe did, the answer stays small: floods and huge values are cut.
    assert!(reply.bytes < 32 * 1024, "{script}: a {}-byte answer", reply.bytes);
    assert!(!reply.body.to_string().contains("stack traceback"), "{script}: {}", reply.body);
    match expect {
        Expect::Fails(codes, needle) => {
            reply.is_envelope_of(reply.code());
            assert!(
                codes.contains(&reply.code()),
                "{script}: code {:?} not in {codes:?}: {}",
                reply.code(),
                reply.body
            );
            assert!(reply.message().contains(needle), "{script}: {needle:?} not in {:?}", reply.message());
            assert!(reply.trace()["started"].is_u64(), "{script}: a failure carries the trace: {}", reply.body);
        }
        Expect::NotJson(needle) => {
            assert_eq!(reply.status, 500, "{script}: {}", reply.body);
            assert!(reply.message().contains(needle), "{script}: {needle:?} not in {:?}", reply.message());
        }
        Expect::Returns(want) => {
            assert_eq!(reply.status, 200, "{script}: {}", reply.body);
            assert_eq!(&reply.body["result"], want, "{script}: {}", reply.body);
        }
        Expect::Holds(holds) => {
            assert_eq!(reply.status, 200, "{script}: {}", reply.body);
            assert!(holds(&reply.body), "{script}: {}", reply.body);
        }
    }
}

#[test]
fn every_sandbox_probe_sent_to_execute_is_stopped_and_the_server_stays_up() {
    let served = serve(workspace(PROBE_CONFIG), &[]);
    let marker = served.ws.path().join("pwned");
    for (script, expect) in probes(&marker.display().to_string()) {
        let reply = execute(&served, &script);
        check(&script, &reply, &expect);
        assert!(reply.took < Duration::from_secs(10), "{script} took {:?}", reply.took);
        assert_healthy(&served, &script);
    }
    assert!(!marker.exists(), "a probe ran a command");
    assert!(served.ws.path().join("ctx.toml").exists());

    // The wall-clock deadline, on its own: sleeps, and matching that never ends (Lua's
    // backtracking matcher on ".-.-.-b" over 100 000 characters), with a `timeout` shorter than
    // the configured 5 s.
    for script in [
        "sleep(60) return 'woke'",
        "pcall(sleep, 60) return 'woke'",
        "while true do sleep(0.05) end",
        "return string.find(string.rep('a', 1e5), '.-.-.-b')",
        "pcall(string.find, string.rep('a', 1e5), '.-.-.-b') return 'survived'",
        "local s = string.rep('a', 1e5) return (s:gsub('.-.-b', ''))",
    ] {
        let reply = run_script(&served, "execute", script, json!({"timeout": 0.5}));
        reply.failed("timeout", "time limit of 0.5 seconds");
        assert!(reply.took < Duration::from_secs(4), "{script} took {:?}", reply.took);
        assert_healthy(&served, script);
    }

    // Each run starts clean: what one script changes, the next one never sees.
    let reply = execute(
        &served,
        "rawset(ctx, 'search', function() return 'poisoned' end) leaked = 1 string.upper = nil \
         table.insert = nil json = nil result = nil await_all = nil return 1",
    );
    assert_eq!(reply.ok(), &json!(1));
    let reply = execute(
        &served,
        "return {type(leaked), type(string.upper), type(table.insert), type(json), type(result), type(await_all), \
         ctx.search({query = 'wombat'}):await().results[1].title}",
    );
    let seen = reply.ok().as_array().unwrap();
    assert_eq!(
        seen[..6],
        ["nil", "function", "function", "table", "function", "function"].map(|t| json!(t)),
        "{seen:?}"
    );
    assert!(seen[6].as_str().unwrap().contains("Wombat"), "{seen:?}");
}

/// Loops go to `slowpoke`, whose 1 s deadline (not an instruction budget) stops them.
fn is_loop(expect: &Expect) -> bool {
    matches!(expect, Expect::Fails(codes, _) if *codes == LOOPS)
}

#[test]
fn probes_four_at_a_time_leave_other_clients_served() {
    let served = serve(workspace(PROBE_CONFIG), &[]);
    let marker = served.ws.path().join("pwned");
    let all = probes(&marker.display().to_string());
    let addr = served.serve.addr.clone();
    let client = served.client.clone();
    let started = Instant::now();
    served.runtime.block_on(async {
        for batch in all.chunks(4) {
            let mut runs = tokio::task::JoinSet::new();
            for (i, (script, expect)) in batch.iter().enumerate() {
                let tool = if is_loop(expect) { "slowpoke" } else { "execute" };
                let (client, addr, script) = (client.clone(), addr.clone(), script.clone());
                runs.spawn(async move { (i, post(&client, &addr, tool, json!({"script": script})).await) });
            }
            // Meanwhile another client's plain calls are answered.
            let plain = post(&client, &addr, "search", json!({"query": "quokka"})).await;
            assert_eq!(plain.status, 200, "{}", plain.body);
            assert!(plain.took < Duration::from_secs(10), "a plain search waited {:?} behind the probes", plain.took);
            let quick = post(&client, &addr, "execute", json!({"script": "return 6 * 7"})).await;
            assert_eq!((quick.status, &quick.body["result"]), (200, &json!(42)), "{}", quick.body);
            assert!(quick.took < Duration::from_secs(10), "a small script waited {:?}", quick.took);
            let mut done = 0;
            while let Some(joined) = runs.join_next().await {
                let (i, reply) = joined.expect("a probe task");
                let (script, expect) = &batch[i];
                assert!(reply.took < Duration::from_secs(15), "{script} took {:?}", reply.took);
                if is_loop(expect) {
                    reply.failed("timeout", "time limit of 1 second");
                } else {
                    check(script, &reply, expect);
                }
                done += 1;
            }
            assert_eq!(done, batch.len());
        }
    });
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    assert!(!marker.exists(), "a probe ran a command");
    assert_healthy(&served, "the concurrent probes");
}

#[test]
fn loops_through_a_scripted_tool_hit_the_wall_clock_deadline() {
    let served = serve(workspace(PROBE_CONFIG), &[]);
    for (script, _) in probes("/nonexistent").iter().filter(|(_, e)| is_loop(e)) {
        let reply = run_script(&served, "slowpoke", script, json!({}));
        reply.failed("timeout", "time limit of 1 second");
        assert!(reply.took < Duration::from_secs(5), "{script} took {:?}", reply.took);
    }
    assert_healthy(&served, "the loops");
}

/// A result of many MiB of JSON held in little Lua memory (one string, referenced 270,000
/// times) is measured, then cut while it is converted: the server's peak memory grows by about
/// the script's own Lua memory (converting it whole first took 123 MB more). Past what a run
/// may hold, it fails with what to do.
#[test]
fn a_huge_result_is_cut_without_being_built() {
    let served = serve(workspace(""), &[]);
    let peak_kib = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", served.serve.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_string).unwrap();
        line.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()).unwrap()
    };
    let before = peak_kib();
    let rows = "local s = ('x'):rep(199) local t = {} for i = 1, 90000 do t[i] = {s, s, s} end";
    let reply = execute(&served, &format!("{rows} return t"));
    let kept = reply.ok().as_array().unwrap();
    assert_eq!(kept[0], json!(["x".repeat(199), "x".repeat(199), "x".repeat(199)]));
    assert!(kept.last().unwrap().as_str().unwrap().contains("more item(s) cut"), "{kept:?}");
    // 90,000 rows of 3 x 201 bytes, 2 commas and 2 brackets; 89,999 commas; the brackets.
    assert_eq!(reply.trace()["truncated"]["original_bytes"], 90_000 * 607 + 89_999 + 2, "{}", reply.body);
    assert!(reply.bytes < 1024 * 1024 + 4096, "{} bytes", reply.bytes);
    let grew = peak_kib().saturating_sub(before);
    assert!(grew < 40 * 1024, "the server's peak memory grew by {grew} KiB");
    // Twice that is over memory_mb (64 MiB, the default).
    let reply = execute(&served, &format!("{rows} return {{t, t}}"));
    reply.failed("result_too_large", "more than a run may hold ([code_mode] memory_mb");
    // 2^100 paths through 100 tables: measuring it stops at the run's deadline.
    let paths = "local t = {} for i = 1, 100 do t = {t, t} end return t";
    let reply = run_script(&served, "execute", paths, json!({"timeout": 1}));
    reply.failed("timeout", "time limit of 1 second");
    assert_healthy(&served, "the huge results");
}

/// A pending call sent as a value (returned, or in a call's arguments) is refused with the
/// fix, not sent as `{}`.
#[test]
fn a_pending_call_is_not_a_value() {
    let served = serve(tools_workspace(TOOLS_CONFIG), &[]);
    let bare = execute(&served, "return ctx.search({query = 'wombat'})");
    bare.failed("script_error", "a pending tool call is not a value: add :await()");
    let nested = execute(&served, "return {hits = ctx.search({query = 'wombat'})}");
    nested.failed("script_error", "a pending tool call at .hits is not a value");
    let passed = execute(&served, "return ctx.wait({seconds = ctx.search({query = 'wombat'})}):await()");
    passed.failed(
        "script_error",
        "ctx.wait: the arguments cannot be sent as JSON: a pending tool call at .seconds is not a value",
    );
    // An empty table is still {}.
    assert_eq!(execute(&served, "return {empty = {}}").ok(), &json!({"empty": {}}));
}

/// The brief's error contract: every failed run has `data.code` and the trace.
#[test]
fn a_result_that_is_not_json_fails_with_code_and_trace() {
    let served = serve(workspace(PROBE_CONFIG), &[]);
    let reply = execute(&served, "local r = ctx.search({query = 'wombat'}):await() return {f = function() end}");
    reply.failed("script_error", "function cannot be converted to JSON");
    assert_eq!(reply.trace()["started"], 1, "{}", reply.body);
    assert!(reply.message().contains("(calls made: 1 (1 ok): search ok"), "{}", reply.message());
}

// ---------------------------------------------------------------------------------------------
// 3 and 4: concurrency, inner-call errors, each limit.

const TOOLS_CONFIG: &str = r#"
[code_mode]
timeout = 10
memory_mb = 16
max_instructions = 20000000
max_calls = 20
max_output_bytes = 2048
max_log_lines = 3

[tools.script.wait]
path = "tools/wait.lua"

[tools.script.flaky]
path = "tools/flaky.lua"

[tools.script.handled]
path = "tools/handled.lua"

[tools.script.wipe]
path = "tools/wipe.lua"

[tools.scripted.pair]
description = "Two of ctx's own tools at a time."
tools = ["wait"]
max_concurrent = 2
"#;

fn tools_workspace(config: &str) -> Workspace {
    let ws = workspace(config);
    let seconds = ", parameters = { { name = \"seconds\", type = \"number\", required = true } }";
    ws.write(
        "tools/wait.lua",
        &lua_tool(
            "wait",
            "Waits the given seconds, then answers.",
            seconds,
            "sleep(params.seconds) return { waited = params.seconds }",
        ),
    );
    ws.write(
        "tools/flaky.lua",
        &lua_tool("flaky", "Always fails.", "", "error({ code = \"FLAKY\", message = \"flaky is down\" })"),
    );
    ws.write(
        "tools/handled.lua",
        &lua_tool("handled", "Reports a handled failure.", "", "return { error = \"nothing found\" }"),
    );
    // Calls the script tool it is given through context.call.
    ws.write(
        "tools/relay.lua",
        &lua_tool(
            "relay",
            "Runs a script through another tool.",
            ", parameters = { { name = \"tool\", type = \"string\", required = true } }",
            "return context.call(params.tool, { script = \"return {one = 1}\" })",
        ),
    );
    ws.write(
        "tools/wipe.lua",
        &lua_tool("wipe", "Deletes everything.", ", annotations = { destructive = true }", "return { wiped = true }"),
    );
    ws
}

#[test]
fn calls_started_before_awaiting_run_concurrently_and_max_concurrent_queues_them() {
    let served = serve(tools_workspace(TOOLS_CONFIG), &[]);
    const N: u32 = 8;
    let t = Duration::from_millis(400);
    let script = format!(
        "local calls = {{}} for i = 1, {N} do calls[i] = ctx.wait({{seconds = {}}}) end\n\
         local done = await_all(calls) return {{count = #done, first = done[1].waited}}",
        t.as_secs_f64()
    );
    let reply = execute(&served, &script);
    assert_eq!(reply.ok(), &json!({"count": N, "first": t.as_secs_f64()}), "{}", reply.body);
    assert!(reply.took < t * N / 2, "{N} calls of {t:?} took {:?}: they did not run concurrently", reply.took);
    let calls = reply.trace()["calls"].as_array().unwrap();
    assert_eq!(calls.len(), N as usize);
    assert!(
        calls.iter().all(|c| c["tool"] == "wait" && c["status"] == "ok" && c["ms"].as_f64().unwrap() >= 390.0),
        "{calls:?}"
    );

    // The scripted tool `pair` lets two of ctx's own tools run at once: about N/2 * T.
    let reply = run_script(&served, "pair", &script, json!({}));
    assert_eq!(reply.ok()["count"], N, "{}", reply.body);
    let floor = t.mul_f64(f64::from(N) / 2.0 * 0.8);
    assert!(reply.took >= floor, "max_concurrent = 2 ran {N} calls of {t:?} in {:?}", reply.took);
    // Waiting for a turn is not part of a call's own time.
    let calls = reply.trace()["calls"].as_array().unwrap();
    assert!(calls.iter().all(|c| c["ms"].as_f64().unwrap() < 1500.0), "{calls:?}");
}

#[test]
fn inner_failures_are_catchable_and_uncaught_ones_carry_line_message_and_trace() {
    let served = serve(tools_workspace(TOOLS_CONFIG), &[]);
    let reply = execute(
        &served,
        "local ok, e = pcall(function()\n  local r = ctx.flaky({}):await()\n  return r\nend)\n\
         local ok2, h = pcall(function() return ctx.handled({}):await() end)\n\
         return {ok = ok, tool = e.tool, call = e.call, message = e.message, code = e.code, line = e.line, text = tostring(e),\n\
                 handled_ok = ok2, handled = h.message}",
    );
    let result = reply.ok();
    assert_eq!(result["ok"], false);
    assert_eq!(result["tool"], "flaky");
    assert_eq!(result["call"], "ctx.flaky");
    assert!(result["message"].as_str().unwrap().contains("flaky is down"), "{result}");
    assert!(result["code"].is_string(), "{result}");
    assert_eq!(result["line"], 2, "the line that awaited: {result}");
    assert!(result["text"].as_str().unwrap().starts_with("ctx.flaky failed: "), "{result}");
    assert_eq!((&result["handled_ok"], &result["handled"]), (&json!(false), &json!("nothing found")), "{result}");
    let calls = reply.trace()["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|c| c["status"] == "error"), "{calls:?}");

    // Uncaught: the run fails at that line, with the message and the trace.
    let reply = execute(&served, "local r = ctx.search({query = 'wombat'}):await()\n\nctx.flaky({}):await()\nreturn r");
    reply.failed("script_error", "flaky is down");
    assert!(reply.message().starts_with("script:3: "), "{}", reply.message());
    assert!(reply.message().contains("(calls made: "), "{}", reply.message());
    let data = &reply.body["error"]["data"]["data"];
    assert_eq!(data["line"], 3, "{data}");
    assert_eq!(data["error"]["tool"], "flaky", "{data}");
    let calls = data["trace"]["calls"].as_array().unwrap();
    let tools: Vec<&str> = calls.iter().map(|c| c["tool"].as_str().unwrap()).collect();
    assert_eq!(tools, ["search", "flaky"], "{calls:?}");
    assert_eq!((&calls[0]["status"], &calls[1]["status"]), (&json!("ok"), &json!("error")));

    // A plain Lua error and a syntax error say where.
    let reply = execute(&served, "local x = nil\nreturn x.field");
    reply.failed("script_error", "script:2: attempt to index a nil value");
    assert_eq!(reply.body["error"]["data"]["data"]["line"], 2);
    execute(&served, "return {").failed("syntax_error", "script");
    // Seed 001's common mistake gets its hint.
    let reply = execute(&served, "local result = ctx.search({query = 'wombat'}):await()\nresult(result)");
    reply.failed("script_error", "`result` is a local variable here");
    // result() twice, and result() with nothing.
    execute(&served, "result(1) result(2)").failed("script_error", "result() was already called");
    execute(&served, "result()").failed("script_error", "result() needs a value");
    // result() and a different return value: neither is silently dropped.
    execute(&served, "result(1) return 2").failed("script_error", "also returned a value");
    assert_eq!(execute(&served, "local t = {n = 1} result(t) return t").ok()["n"], 1);
    // A full MCP result over max_output_bytes is refused, not cut into broken blocks.
    let reply = execute(&served, "return {content = {{type = 'text', text = string.rep('a', 2e6)}}}");
    reply.failed("result_too_large", "an MCP result is not cut");
    // An invalid one says which block is wrong.
    let reply = execute(&served, "return {content = {{type = 'text', text = 'a', annotations = {priority = 7}}}}");
    reply.failed("script_error", "content[1] has an annotations.priority outside 0 to 1");
    // A forgotten :await().
    execute(&served, "return ctx.search({query = 'x'}).results").failed("script_error", "add :await()");
    // Arguments that are not a table.
    let reply = execute(&served, "local ok, e = pcall(ctx.search, 'wombat') return e.message");
    assert!(reply.ok().as_str().unwrap().contains("pass the arguments as a table"), "{}", reply.body);
    // An argument that fails the tool's schema is a catchable bad_request naming the field.
    let reply =
        execute(&served, "local ok, e = pcall(function() return ctx.wait({}):await() end) return {e.code, e.message}");
    let result = reply.ok();
    assert!(result[1].as_str().unwrap().contains("seconds"), "{result}");
    assert_healthy(&served, "the failures");
}

#[test]
fn a_failed_call_awaited_in_a_return_reports_its_own_line() {
    let served = serve(tools_workspace(TOOLS_CONFIG), &[]);
    let reply = execute(&served, "local ok, e = pcall(function()\n  return ctx.flaky({}):await()\nend)\nreturn e.line");
    assert_eq!(reply.ok(), &json!(2), "{}", reply.body);
    let reply = execute(&served, "local r = ctx.search({query = 'wombat'}):await()\nreturn ctx.flaky({}):await()");
    reply.failed("script_error", "flaky is down");
    assert_eq!(reply.body["error"]["data"]["data"]["line"], 2, "{}", reply.body);
    assert!(reply.message().starts_with("script:2: "), "{}", reply.message());
}

#[test]
fn each_limit_trips_on_purpose_and_says_which() {
    let served = serve(tools_workspace(TOOLS_CONFIG), &[]);
    // timeout: a `timeout` parameter under the configured 10 s; the call in flight is cancelled.
    let reply =
        run_script(&served, "execute", "local w = ctx.wait({seconds = 30}) return w:await()", json!({"timeout": 0.5}));
    reply.failed("timeout", "time limit of 0.5 seconds");
    assert!(reply.message().contains("calls in flight were cancelled"), "{}", reply.message());
    assert!(reply.took < Duration::from_secs(5), "{:?}", reply.took);
    assert_eq!(reply.body["error"]["data"]["data"]["limit"], "timeout");
    assert!(was_cancelled(reply.trace(), "wait"), "{}", reply.body);
    // The cancelled call is traced with the time it had had, not 0.
    let ms = reply.trace()["calls"][0]["ms"].as_f64().unwrap_or_default();
    assert!(ms >= 400.0, "{}", reply.body);
    // A timeout over the configured one is refused by the schema.
    let reply = run_script(&served, "execute", "return 1", json!({"timeout": 11}));
    assert_eq!(reply.status, 400, "{}", reply.body);
    // memory (16 MiB).
    let reply = execute(&served, "local t = {} for i = 1, 1e8 do t[i] = i end");
    reply.failed("memory", "memory limit of 16 MiB");
    assert_eq!(reply.body["error"]["data"]["data"]["limit"], "memory");
    // max_instructions.
    let reply = execute(&served, "local n = 0 while true do n = n + 1 end");
    reply.failed("max_instructions", "20000000 Lua instructions");
    // max_calls (20): the 21st call stops the run; the message names the limit and the fix.
    let reply = execute(&served, "for i = 1, 25 do ctx.search({query = 'wombat'}) end return 'all'");
    reply.failed("max_calls", "more than 20 tool calls");
    assert!(reply.message().contains("raise max_calls in [code_mode]"), "{}", reply.message());
    assert_eq!(reply.trace()["started"], 20, "{}", reply.body);
    // max_calls cannot be caught by pcall.
    let reply = execute(&served, "for i = 1, 25 do pcall(ctx.search, {query = 'wombat'}) end return 'survived'");
    reply.failed("max_calls", "max_calls");
    // max_output_bytes (2048): cut, with the note.
    let reply = execute(&served, "local t = {} for i = 1, 500 do t[i] = 'item ' .. i end return t");
    let items = reply.ok().as_array().unwrap();
    assert!(items.len() < 500 && items[0] == "item 1", "{items:?}");
    assert!(items.last().unwrap().as_str().unwrap().contains("more item(s) cut"), "{items:?}");
    let truncated = &reply.trace()["truncated"];
    assert_eq!(truncated["limit_bytes"], 2048, "{truncated}");
    assert!(truncated["original_bytes"].as_u64().unwrap() > 2048, "{truncated}");
    assert!(truncated["note"].as_str().unwrap().contains("over max_output_bytes (2048)"), "{truncated}");
    assert!(reply.bytes < 4096, "{} bytes", reply.bytes);
    // max_log_lines (3): later lines are dropped and counted.
    let reply = execute(&served, "for i = 1, 10 do log.info('line ' .. i) end print('and one more') return 'logged'");
    assert_eq!(reply.ok(), &json!("logged"));
    assert_eq!(reply.trace()["log_lines_dropped"], 8, "{}", reply.body);
    // A script within every limit has none of these notes.
    let reply = execute(&served, "log.info('one') return {fine = true}");
    assert_eq!(reply.ok(), &json!({"fine": true}));
    assert!(reply.trace().get("truncated").is_none() && reply.trace().get("log_lines_dropped").is_none());
    assert_healthy(&served, "the limits");
}

#[test]
fn destructive_tools_are_refused_unless_allowed() {
    let ws = tools_workspace(TOOLS_CONFIG);
    let served = serve(ws, &[]);
    // Callable directly...
    let reply = served.runtime.block_on(post(&served.client, &served.serve.addr, "wipe", json!({})));
    assert_eq!(reply.body, json!({"result": {"wiped": true}}));
    // ...but not from a script, and the refusal says how to allow it.
    let reply = execute(&served, "return ctx.wipe({}):await()");
    reply.failed("script_error", "tool 'wipe' is destructive");
    assert!(reply.message().contains("allow_destructive = [\"wipe\"]"), "{}", reply.message());
    assert_eq!(reply.trace()["started"], 0, "a refused call is never started: {}", reply.body);
    let reply = execute(&served, "local ok, e = pcall(ctx.wipe, {}) return {ok, e.code, e.tool}");
    assert_eq!(reply.ok(), &json!([false, "refused", "wipe"]));
    drop(served);

    // Allowed by the operator: the same script runs (the CLI reads the config afresh).
    let ws = tools_workspace(&TOOLS_CONFIG.replace("[code_mode]\n", "[code_mode]\nallow_destructive = [\"wi*\"]\n"));
    ws.write("wipe-it.lua", "return ctx.wipe({}):await()");
    let run = ws.ctx(&["run", "wipe-it.lua", "--json"]);
    assert_eq!(run.json()["result"], json!({"wiped": true}), "{}", run.stderr());
    // Listed as destructive by the operator: refused, though not annotated.
    let ws = tools_workspace(&TOOLS_CONFIG.replace("[code_mode]\n", "[code_mode]\ndestructive = [\"wa*\"]\n"));
    ws.write("wait.lua", "return ctx.wait({seconds = 0}):await()");
    let run = ws.ctx(&["run", "wait.lua"]);
    assert_ne!(run.code(), 0, "{}", run.stdout());
    assert!(run.stderr().contains("tool 'wait' is destructive"), "{}", run.stderr());
}

// ---------------------------------------------------------------------------------------------
// Discovery and scripted tools.

#[test]
fn discovery_as_tools_and_inside_scripts() {
    let served = serve(tools_workspace(TOOLS_CONFIG), &[]);
    let call = |tool: &str, body: Value| served.runtime.block_on(post(&served.client, &served.serve.addr, tool, body));

    let servers = call("list_servers", json!({}));
    assert_eq!(servers.status, 200, "{}", servers.body);
    let ctx_group = &servers.body["result"]["servers"][0];
    assert_eq!((&ctx_group["name"], &ctx_group["global"]), (&json!("ctx"), &json!("ctx")), "{}", servers.body);
    // search, get, sources and three of the four Lua tools: not `wipe` (destructive: scripts
    // may not call it, so it is not offered), nor the scripted tool (no script starts another).
    assert_eq!(ctx_group["tools"], 6, "{}", servers.body);

    let tools = call("list_tools", json!({"server": "ctx"}));
    let listed = tools.body["result"]["tools"].as_array().unwrap();
    let wait = listed.iter().find(|t| t["name"] == "wait").unwrap_or_else(|| panic!("{}", tools.body));
    assert_eq!(wait["call"], "ctx.wait");
    assert_eq!(wait["summary"], "Waits the given seconds, then answers.");
    assert!(
        !listed.iter().any(|t| t["name"] == "execute" || t["name"] == "list_tools"),
        "code mode's own tools are not callable from scripts"
    );
    let missing = call("list_tools", json!({"server": "nope"}));
    assert_eq!(missing.status, 404, "{}", missing.body);

    let described = call("describe_tool", json!({"name": "ctx.wait"}));
    let described = &described.body["result"];
    assert_eq!(described["signature"], "ctx.wait({seconds: number})", "{described}");
    assert!(described["example"].as_str().unwrap().contains("ctx.wait("), "{described}");
    let by_name = call("describe_tool", json!({"name": "wait"}));
    assert_eq!(&by_name.body["result"], described);
    // What each parameter means, from the schema; the raw schemas only on request.
    let searched = call("describe_tool", json!({"name": "search"}));
    let searched = &searched.body["result"];
    assert!(searched["parameters"]["query"].as_str().unwrap().starts_with("Words to look for"), "{searched}");
    assert!(searched.get("input_schema").is_none(), "{searched}");
    // A built-in's signature shows what comes back, from its response schema.
    assert!(searched["signature"].as_str().unwrap().contains("-> {results: {id: string, "), "{searched}");
    let full = call("describe_tool", json!({"name": "search", "schemas": true}));
    assert_eq!(full.body["result"]["input_schema"]["required"], json!(["query"]), "{}", full.body);
    assert_eq!(call("describe_tool", json!({"name": "nope"})).status, 404);

    let found = call("search_tools", json!({"query": "wait some seconds", "limit": 3}));
    let found = found.body["result"]["tools"].as_array().unwrap().clone();
    assert_eq!(found[0]["name"], "wait", "the relevant tool ranks first: {found:?}");
    assert!(found.len() <= 3);
    let found = call("search_tools", json!({"query": "knowledge base documents"}));
    let first = found.body["result"]["tools"][0]["name"].as_str().unwrap().to_string();
    assert!(["search", "get", "sources"].contains(&first.as_str()), "{}", found.body);

    // The same answers inside a script.
    let reply = execute(
        &served,
        "local s = list_servers() local t = list_tools('ctx') local d = describe_tool('ctx.wait')\n\
         local f = search_tools('wait some seconds', 2)\n\
         assert(describe_tool('ctx.search').input_schema == nil and describe_tool('ctx.search', true).input_schema.required[1] == 'query')\n\
         assert(describe_tool('ctx.search', string.rep('x', 4000000)).input_schema ~= nil) -- any truthy value asks\n\
         local ok, e = pcall(list_tools, 'nope')\n\
         return {servers = #s.servers, tools = #t.tools, signature = d.signature, first = f.tools[1].name, found = #f.tools, missing = tostring(e)}",
    );
    let result = reply.ok();
    assert_eq!(result["servers"], 1, "{result}");
    assert_eq!(result["tools"], 7, "{result}");
    assert_eq!(result["signature"], "ctx.wait({seconds: number})");
    // Only wait matches, now that scripted tools are not in execute's catalog.
    assert_eq!((&result["first"], &result["found"]), (&json!("wait"), &json!(1)), "{result}");
    assert!(result["missing"].as_str().unwrap().contains("nope"), "{result}");
    // Discovery makes no inner calls.
    assert_eq!(reply.trace()["started"], 0);
}

const SCRIPTED_CONFIG: &str = r#"
[tools.script.wait]
path = "tools/wait.lua"

[tools.script.relay]
path = "tools/relay.lua"

[tools.scripted.searcher]
description = "Searches the docs, nothing else."
tools = ["search"]

[tools.scripted.loop]
description = "Lists itself among its tools."
title = "Loop back"
tools = ["loop", "search", "jira__*"]
"#;

#[test]
fn a_scripted_tool_sees_only_its_tools_and_its_description_is_its_catalog() {
    let served = serve(tools_workspace(SCRIPTED_CONFIG), &[]);
    let (_, list) = served.get("/tools/list");
    let spec = list["tools"].as_array().unwrap().iter().find(|t| t["name"] == "searcher").cloned().unwrap();
    let description = spec["description"].as_str().unwrap();
    assert!(description.starts_with("Searches the docs, nothing else.\n\n"), "{description}");
    assert!(description.contains("ctx.search({query: string"), "{description}");
    assert!(!description.contains("ctx.wait") && !description.contains("ctx.get("), "{description}");
    // It is the catalog `ctx catalog --scripted` prints.
    let printed = served.ws.ctx(&["catalog", "--scripted", "searcher"]).ok();
    assert!(description.trim_end().ends_with(printed.trim_end()), "description:\n{description}\n\ncatalog:\n{printed}");
    // Each has its own title: the section's, else its name's.
    let title = |name: &str| {
        let spec = list["tools"].as_array().unwrap().iter().find(|t| t["name"] == name).cloned().unwrap();
        spec["annotations"]["title"].clone()
    };
    assert_eq!(title("searcher"), "searcher: run a Lua script", "{list}");
    assert_eq!(title("loop"), "Loop back", "{list}");
    assert_eq!(title("execute"), "Run a Lua script", "{list}");
    // `schema check` warns of a glob that matches no tool (`loop` is the scripted tool itself,
    // which no script reaches), and still passes.
    let check = served.ws.ctx(&["schema", "check"]);
    check.ok();
    assert!(
        check.stderr().contains("warning: tools.scripted.loop: tools glob \"loop\" matches no tool"),
        "{}",
        check.stderr()
    );
    assert!(!check.stderr().contains("glob \"search\""), "{}", check.stderr());
    assert!(
        check.stderr().contains("tools glob \"jira__*\" names upstream server 'jira', which is not configured"),
        "{}",
        check.stderr()
    );

    let reply =
        run_script(&served, "searcher", "return ctx.search({query = 'wombat'}):await().results[1].title", json!({}));
    assert!(reply.ok().as_str().unwrap().contains("Wombat"), "{}", reply.body);
    let reply = run_script(&served, "searcher", "return list_servers()", json!({}));
    assert_eq!(reply.ok()["servers"][0]["tools"], 1, "{}", reply.body);
    // Any other tool does not exist in it, by any name, and the error says so.
    for script in [
        "return ctx.wait({seconds = 0}):await()",
        "return ctx['wait']({seconds = 0}):await()",
        "return mcp['ctx'].get({id = 'x'}):await()",
    ] {
        let reply = run_script(&served, "searcher", script, json!({}));
        reply.failed("script_error", "has no tool");
        assert_eq!(reply.trace()["started"], 0, "{}", reply.body);
    }
    // The same script through execute reaches the tool.
    assert_eq!(execute(&served, "return ctx.wait({seconds = 0}):await()").ok(), &json!({"waited": 0}));

    // No script reaches code mode's own tools or a scripted tool from inside a scripted tool,
    // so neither can call itself: the recursion is cut before it starts.
    run_script(&served, "loop", "return ctx.loop({script = 'return 1'}):await()", json!({}))
        .failed("script_error", "has no tool \"loop\"");
    execute(&served, "return ctx.execute({script = 'return 1'}):await()")
        .failed("script_error", "ctx.execute: a script does not start another script");
    execute(&served, "return ctx.list_tools({server = 'ctx'}):await()")
        .failed("script_error", "discovery is a global function in scripts; call list_tools(...)");
    // Nor from execute: a script never starts another script (each would get budgets of its
    // own), so execute does not list scripted tools and the registry refuses the call.
    execute(&served, "return ctx.loop({script = 'return 1'}):await()").failed("script_error", "has no tool \"loop\"");
    let listed =
        served.runtime.block_on(post(&served.client, &served.serve.addr, "list_tools", json!({"server": "ctx"})));
    assert!(!listed.body.to_string().contains("\"loop\""), "{}", listed.body);

    // The registry holds it on every path: a Lua tool that a script called, calling a script
    // tool with context.call, is refused with the chain; called directly, it may.
    let relayed = execute(&served, "return ctx.relay({tool = 'execute'}):await()");
    relayed.failed("script_error", "scripts do not start other scripts");
    assert!(relayed.message().contains("execute → relay → execute"), "{}", relayed.body);
    let relayed = execute(&served, "return ctx.relay({tool = 'searcher'}):await()");
    assert!(relayed.message().contains("tool 'searcher' runs a script"), "{}", relayed.body);
    let direct = served.runtime.block_on(post(&served.client, &served.serve.addr, "relay", json!({"tool": "execute"})));
    assert_eq!(direct.status, 200, "{}", direct.body);
    assert_eq!(direct.body["result"], json!({"one": 1}), "{}", direct.body);
}

#[test]
fn a_scripted_tools_refusal_names_the_scripted_tool() {
    let served = serve(tools_workspace(SCRIPTED_CONFIG), &[]);
    let reply = run_script(&served, "searcher", "return ctx.wait({seconds = 0}):await()", json!({}));
    reply.failed("script_error", "scripted tool 'searcher'");
    assert!(reply.message().contains("tools"), "{}", reply.message());
}

// ---------------------------------------------------------------------------------------------
// Host APIs.

#[test]
fn host_apis_are_refused_with_the_config_hint_and_work_when_allowed() {
    let refused = tools_workspace("");
    refused
        .write("host.lua", "local ok, e = pcall(function() return env.get('CTX_IT18_VISIBLE') end) return tostring(e)");
    let run = refused.ctx(&["run", "host.lua"]);
    let text = run.ok();
    assert!(text.contains("env is not available to agent-sent scripts") && text.contains("allow_env"), "{text}");
    for (api, hint) in [("http.get('http://127.0.0.1:1/')", "allow_hosts"), ("fs.read('docs/wombat.md')", "fs_root")] {
        refused.write("host.lua", &format!("return {api}"));
        let run = refused.ctx(&["run", "host.lua"]);
        assert_eq!(run.code(), 1, "{api}: {}", run.stdout());
        assert!(run.stderr().contains(&format!("{hint} in [code_mode]")), "{api}: {}", run.stderr());
    }

    let (addr, received) = crate::common::stub(|_| (200, "{\"pong\": true}".to_string()));
    let allowed = tools_workspace(
        "[code_mode]\nallow_env = [\"CTX_IT18_VISIBLE\"]\nfs_root = \"docs\"\nallow_hosts = [\"127.0.0.1\"]\nallow_private = true\n",
    );
    allowed.write(
        "host.lua",
        &format!(
            "local ok, e = pcall(function() return env.get('CTX_IT18_HIDDEN') end)\n\
             return {{ visible = env.get('CTX_IT18_VISIBLE'), hidden = tostring(e), doc = fs.read('wombat.md'),\n\
             outside = select(2, pcall(fs.read, '../ctx.toml')), pong = http.get('http://{addr}/ping').json.pong }}"
        ),
    );
    let output = Command::new(BIN)
        .current_dir(allowed.path())
        .args(["--config", "ctx.toml", "run", "host.lua", "--json"])
        .env("CTX_IT18_VISIBLE", "seen")
        .env("CTX_IT18_HIDDEN", "secret")
        .env_remove("CTX_CONFIG")
        .output()
        .unwrap();
    let run = Run(output);
    let result = run.json()["result"].clone();
    assert_eq!(result["visible"], "seen", "{result}");
    assert!(result["hidden"].as_str().unwrap().contains("allow_env"), "{result}");
    assert!(!result.to_string().contains("secret"));
    assert!(result["doc"].as_str().unwrap().contains("The wombat digs burrows"), "{result}");
    assert!(result["outside"].as_str().unwrap().contains("outside"), "{result}");
    assert_eq!(result["pong"], true, "{result}");
    assert_eq!(received.lock().unwrap().len(), 1);
}

// ---------------------------------------------------------------------------------------------
// 5. The CLI.

/// `ctx --config ctx.toml <args>` in `ws` with `input` on stdin.
fn ctx_with_stdin(ws: &Workspace, args: &[&str], input: &str) -> Run {
    let mut child = Command::new(BIN)
        .current_dir(ws.path())
        .args(["--config", "ctx.toml"])
        .args(args)
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    Run(child.wait_with_output().unwrap())
}

#[test]
fn ctx_run_and_ctx_catalog() {
    let ws = tools_workspace(SCRIPTED_CONFIG);
    ws.write(
        "script.lua",
        "local found = ctx.search({query = 'wombat'}):await()\nlocal w = ctx.wait({seconds = 0})\n\
         result({title = found.results[1].title, waited = w:await().waited})",
    );
    // Text: the result on stdout, the trace on stderr.
    let run = ws.ctx(&["run", "script.lua"]);
    let out: Value = serde_json::from_str(&run.ok()).expect("the result as JSON");
    assert!(out["title"].as_str().unwrap().contains("Wombat"), "{out}");
    assert_eq!(out["waited"], 0);
    let stderr = run.stderr();
    assert!(stderr.contains("search ok") && stderr.contains("wait ok"), "{stderr}");
    // --json: the REST body.
    let body = ws.ctx(&["run", "script.lua", "--json"]).json();
    assert_eq!(body["result"], out);
    assert_eq!(body["trace"]["started"], 2, "{body}");
    // `-` reads stdin; a text result prints as text.
    let run = ctx_with_stdin(&ws, &["run", "-"], "return 'from ' .. 'stdin'");
    assert_eq!(run.ok(), "from stdin\n");
    // A script's print and log lines show on stderr unasked (debug ones with -vv); -q hides them.
    let debugging = "print('checking the input') log.debug('fine detail') return 1";
    let run = ctx_with_stdin(&ws, &["run", "-"], debugging);
    assert_eq!(run.ok(), "1\n");
    assert!(run.stderr().contains("checking the input") && !run.stderr().contains("fine detail"), "{}", run.stderr());
    assert!(ctx_with_stdin(&ws, &["-vv", "run", "-"], debugging).stderr().contains("fine detail"));
    assert!(!ctx_with_stdin(&ws, &["-q", "run", "-"], debugging).stderr().contains("checking the input"));
    // --scripted runs it as that tool, in its scope.
    let run = ctx_with_stdin(
        &ws,
        &["run", "-", "--scripted", "searcher", "--json"],
        "return ctx.wait({seconds = 0}):await()",
    );
    assert_eq!(run.code(), 1);
    let body: Value = serde_json::from_str(&run.stdout()).unwrap();
    assert_eq!(body["error"]["data"]["code"], "script_error", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("no tool \"wait\""), "{body}");
    let run = ctx_with_stdin(
        &ws,
        &["run", "-", "--scripted", "searcher"],
        "return #ctx.search({query = 'quokka'}):await().results",
    );
    assert_eq!(run.ok(), "1\n");
    // --timeout, and a failure's trace on stderr.
    let started = Instant::now();
    let run = ctx_with_stdin(
        &ws,
        &["run", "-", "--timeout", "0.5"],
        "ctx.search({query = 'wombat'}):await() while true do sleep(0.05) end",
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(run.code(), 1);
    assert!(
        run.stderr().contains("time limit of 0.5 seconds") && run.stderr().contains("search ok"),
        "{}",
        run.stderr()
    );
    // A script that does not compile is the caller's mistake, as REST's 400 says: exit 2, with
    // its line, in text and under --json.
    let run = ctx_with_stdin(&ws, &["run", "-"], "local x = 1\nreturn {");
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert!(run.stderr().contains("script:2:"), "{}", run.stderr());
    let run = ctx_with_stdin(&ws, &["run", "-", "--json"], "local x = 1\nreturn {");
    assert_eq!(run.code(), 2, "{}", run.stderr());
    let body: Value = serde_json::from_str(&run.stdout()).unwrap();
    assert_eq!(
        (&body["error"]["code"], &body["error"]["data"]["code"]),
        (&json!("bad_request"), &json!("syntax_error"))
    );
    // A script that fails at run time is a failed command: exit 1.
    assert_eq!(ctx_with_stdin(&ws, &["run", "-"], "error('no')").code(), 1);
    // Usage errors.
    let run = ws.ctx(&["run", "missing.lua"]);
    assert_ne!(run.code(), 0);
    assert!(run.stderr().contains("missing.lua"), "{}", run.stderr());
    let run = ctx_with_stdin(&ws, &["run", "-", "--scripted", "nope"], "return 1");
    assert_ne!(run.code(), 0);
    assert!(run.stderr().contains("nope"), "{}", run.stderr());

    // ctx catalog: every tool a script can call, as Lua signatures.
    let catalog = ws.ctx(&["catalog"]).ok();
    assert!(catalog.starts_with("# execute"), "{catalog}");
    for want in ["ctx.search({query: string", "ctx.wait({seconds: number})", "await_all"] {
        assert!(catalog.contains(want), "{want:?} missing from:\n{catalog}");
    }
    // A scripted tool runs a script, which no script starts.
    assert!(!catalog.contains("ctx.searcher("), "{catalog}");
    let scoped = ws.ctx(&["catalog", "--scripted", "searcher"]).ok();
    assert!(
        scoped.starts_with("# searcher") && scoped.contains("ctx.search(") && !scoped.contains("ctx.wait("),
        "{scoped}"
    );
    let run = ws.ctx(&["catalog", "--scripted", "nope"]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("no scripted tool 'nope'") && run.stderr().contains("searcher"), "{}", run.stderr());
    // With code mode disabled, execute's catalog and `ctx run` say so.
    let off = Workspace::new("[code_mode]\nenabled = false\n");
    let run = off.ctx(&["catalog"]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("code mode is disabled"), "{}", run.stderr());
    off.write("s.lua", "return 1");
    let run = off.ctx(&["run", "s.lua"]);
    assert_ne!(run.code(), 0);
    assert!(run.stderr().contains("code mode is disabled"), "{}", run.stderr());
}

/// Names and queries handed to the lookups and the discovery functions are bounded like the
/// discovery tools' own parameters: a huge one is refused at once, not worked through.
#[test]
fn huge_names_and_queries_are_refused_at_once() {
    let served = serve(workspace(PROBE_CONFIG), &[]);
    for call in [
        "describe_tool(string.rep('a.', 4000000))",
        "search_tools(string.rep('deploy ', 1000000))",
        "list_tools(string.rep('x', 5000))",
        "ctx[string.rep('\\1', 2000000)]",
        "mcp[string.rep('y', 2000000)]",
    ] {
        let reply = execute(&served, &format!("local ok, e = pcall(function() return {call} end) return tostring(e)"));
        let text = reply.ok().as_str().unwrap_or_default().to_string();
        assert!(text.contains("names and queries have at most 1024"), "{call}: {}", reply.body);
        assert!(text.len() < 400, "{call}: the message must not quote the input: {} bytes", text.len());
    }
}
