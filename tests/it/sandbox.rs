//! The Lua sandbox: escape and abuse probes, limits, host APIs, error hygiene, isolation.
//! Every probe must fail with a clear error while the process stays healthy.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

use ctx::config::ScriptKind;
use ctx::lua::{CancelHandle, Limits, ScriptError, ScriptInfo, Vm};
use serde_json::{json, Value};

struct Probe {
    dir: tempfile::TempDir,
    limits: Limits,
    info_edit: Box<dyn Fn(&mut ScriptInfo)>,
}

fn probe() -> Probe {
    Probe {
        dir: tempfile::tempdir().unwrap(),
        limits: Limits {
            timeout: Duration::from_millis(500),
            memory_bytes: 16 * 1024 * 1024,
            max_result_bytes: 64 * 1024,
        },
        info_edit: Box::new(|_| {}),
    }
}

impl Probe {
    fn file(&self, rel: &str, text: &str) -> &Self {
        let path = self.dir.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
        self
    }

    fn info(&self) -> ScriptInfo {
        let path = self.dir.path().join("tools/probe.lua");
        let mut info = ScriptInfo::from_path(ScriptKind::Tool, &path);
        info.display_path = "tools/probe.lua".into();
        info.name = "probe".into();
        (self.info_edit)(&mut info);
        info
    }

    /// Loads `chunk` as the script and, if it loads, calls `tool.execute()`.
    fn run_script(&self, chunk: &str, cancel: CancelHandle) -> Result<Value, ScriptError> {
        self.file("tools/probe.lua", chunk);
        let vm = Vm::new(self.info(), self.limits, cancel)?;
        let ext = vm.load_extension("tool")?;
        let execute = vm.function(&ext, "tool", "execute")?;
        let result = vm.call(&execute, ())?;
        vm.result_json(&result)
    }

    /// Runs `body` as the inside of `tool.execute`.
    fn run(&self, body: &str) -> Result<Value, ScriptError> {
        self.run_script(&format!("tool = {{}}\nfunction tool.execute()\n{body}\nend\n"), CancelHandle::new())
    }
}

#[track_caller]
fn runtime_error(result: Result<Value, ScriptError>, needle: &str) -> String {
    match result {
        Err(ScriptError::Runtime { message, .. }) => {
            assert!(message.contains(needle), "expected {needle:?} in {message:?}");
            assert!(!message.contains("stack traceback"), "{message}");
            assert!(!message.contains("/tmp/"), "no absolute paths: {message}");
            message
        }
        other => panic!("expected a runtime error containing {needle:?}, got {other:?}"),
    }
}

#[track_caller]
fn timeout(result: Result<Value, ScriptError>) {
    match result {
        Err(e @ ScriptError::Timeout { .. }) => {
            assert_eq!(e.to_string(), "tool 'probe' timed out after 0.5 seconds")
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[track_caller]
fn memory(result: Result<Value, ScriptError>) {
    match result {
        Err(e @ ScriptError::Memory { .. }) => {
            assert_eq!(e.to_string(), "tool 'probe' exceeded its memory limit of 16 MiB")
        }
        other => panic!("expected the memory limit, got {other:?}"),
    }
}

// ---- escape attempts ----

#[test]
fn no_os_execute_io_or_debug() {
    let p = probe();
    runtime_error(p.run("os.execute('touch /tmp/ctx-pwned')"), "execute");
    // The whole `io` library is absent, not just `io.open` refused: the error names the global.
    runtime_error(p.run("return io.open('/etc/passwd')"), "global 'io'");
    assert_eq!(p.run("return io == nil").unwrap(), json!(true));
    runtime_error(p.run("return debug.getinfo(1)"), "debug");
    runtime_error(p.run("return os.getenv('HOME')"), "getenv");
    runtime_error(p.run("os.exit(1)"), "exit");
    runtime_error(p.run("return dofile('/etc/passwd')"), "dofile");
    runtime_error(p.run("return loadfile('/etc/passwd')"), "loadfile");
    assert_eq!(p.run("return type(os.time()) == 'number' and type(os.date('%Y')) == 'string'").unwrap(), json!(true));
}

#[test]
fn no_package_or_native_require() {
    let p = probe();
    runtime_error(p.run("return package.loadlib('libc.so.6', 'system')"), "package");
    runtime_error(p.run("return require('os')"), "module \"os\" not found");
    runtime_error(p.run("return require('../../etc/passwd')"), "is not a module name");
}

#[test]
fn no_binary_chunks_or_string_dump() {
    let p = probe();
    runtime_error(p.run("return string.dump(function() end)"), "dump");
    runtime_error(p.run("return load('x', 'x', 'b')"), "only text chunks");
    // A binary chunk passed as text is refused by Lua itself.
    assert_eq!(p.run("local f, err = load('\\27LuaT\\0'); return f == nil and err ~= nil").unwrap(), json!(true));
    assert_eq!(p.run("return load('return 1 + 1')()").unwrap(), json!(2));
}

#[test]
fn string_metatable_is_locked() {
    let p = probe();
    runtime_error(p.run("getmetatable('').__index = function() return 'pwned' end"), "index");
    runtime_error(p.run("setmetatable('', {})"), "table expected");
    assert_eq!(p.run("return ('abc'):upper()").unwrap(), json!("ABC"));
}

#[test]
fn collectgarbage_is_restricted() {
    let p = probe();
    runtime_error(p.run("collectgarbage('stop')"), "not allowed");
    runtime_error(p.run("collectgarbage('generational')"), "not allowed");
    assert_eq!(p.run("return collectgarbage('count') > 0").unwrap(), json!(true));
}

#[test]
fn forbidden_things_fail_at_load_time_too() {
    let p = probe();
    let marker = p.dir.path().join("pwned");
    let script =
        format!("os.execute('touch {}')\ntool = {{}}\nfunction tool.execute() return 1 end\n", marker.display());
    let err = p.run_script(&script, CancelHandle::new()).unwrap_err();
    assert!(matches!(err, ScriptError::Runtime { .. }), "{err:?}");
    assert!(err.to_string().starts_with("tools/probe.lua:1:"), "{err}");
    assert!(!marker.exists());
    // Load time is bounded by the same deadline.
    timeout(p.run_script("while true do end", CancelHandle::new()));
}

// ---- the deadline cannot be outrun or swallowed ----

#[test]
fn infinite_loops_time_out_everywhere() {
    let p = probe();
    timeout(p.run("while true do end"));
    timeout(p.run("pcall(function() while true do end end) return 'survived'"));
    timeout(p.run("while true do pcall(function() while true do end end) end"));
    timeout(p.run("local co = coroutine.wrap(function() while true do end end) co()"));
    timeout(
        p.run("local co = coroutine.create(function() while true do end end) coroutine.resume(co) return 'survived'"),
    );
    timeout(p.run("xpcall(function() while true do end end, function() while true do end end) return 'survived'"));
    timeout(p.run("local ok = pcall(pcall, pcall, function() while true do end end) return 'survived'"));
    timeout(p.run("for i = 1, math.huge do local _ = tostring(i) end"));
}

/// Runs `body` on its own thread and fails the test if the run has not ended `within` (a run
/// that never stops would otherwise hang the test binary instead of failing it).
#[track_caller]
fn ends_within(body: &'static str, within: Duration) -> Result<Value, ScriptError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let p = probe();
        let _ = tx.send(p.run(body));
    });
    match rx.recv_timeout(within) {
        Ok(result) => result,
        Err(_) => panic!("the run was not stopped within {within:?} (it still spins on its thread): {body}"),
    }
}

/// A stopped run stays stopped: Lua that would run after the stop (a to-be-closed variable's
/// `__close`, a coroutine's pending closes, a message handler) is stopped by the same deadline.
/// Lua runs `__close` while it unwinds from the stop, on a thread whose hooks the stop left off.
#[test]
fn no_handler_outlives_a_stopped_run() {
    const CLOSE_SPINS: &str = "setmetatable({}, {__close = function() while true do end end})";
    let bodies: Vec<String> = vec![
        // The issue's own probe: the deadline stops the body, then `__close` would spin.
        format!("local x <close> = {CLOSE_SPINS}\nwhile true do end"),
        // A `__close` of a coroutine, closed by coroutine.wrap when the stop unwinds it.
        format!("local co = coroutine.wrap(function() local x <close> = {CLOSE_SPINS} while true do end end) co()"),
        format!(
            "local co = coroutine.create(function() local x <close> = {CLOSE_SPINS} while true do end end) coroutine.resume(co) return 'survived'"
        ),
        format!(
            "local co = coroutine.create(function() local x <close> = {CLOSE_SPINS} while true do end end) pcall(coroutine.resume, co) coroutine.close(co) return 'survived'"
        ),
        // Inside pcall, inside a coroutine inside pcall, and a close that calls back in.
        format!("pcall(function() local x <close> = {CLOSE_SPINS} while true do end end) return 'survived'"),
        format!(
            "pcall(coroutine.wrap(function() pcall(function() local x <close> = {CLOSE_SPINS} while true do end end) end)) return 'survived'"
        ),
        "local x <close> = setmetatable({}, {__close = function() pcall(function() while true do end end) while true do end end})\nwhile true do end".to_string(),
        // The metamethod put in place after the variable was marked.
        "local mt = {__close = function() end} local x <close> = setmetatable({}, mt) mt.__close = function() while true do end end while true do end".to_string(),
        // A handler that runs when the stop's error is handled.
        "xpcall(function() local x <close> = setmetatable({}, {__close = function() error('again') end}) while true do end end, function() while true do end end) return 'survived'".to_string(),
        // Nested closes: each one spins.
        format!("local a <close> = {CLOSE_SPINS}\nlocal b <close> = {CLOSE_SPINS}\nwhile true do end"),
        // A plain error (not a stop) reaches the same handler: the deadline still stops it.
        format!("local x <close> = {CLOSE_SPINS}\nerror('boom')"),
    ];
    for body in bodies {
        let started = Instant::now();
        let body: &'static str = Box::leak(body.into_boxed_str());
        timeout(ends_within(body, Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(3), "{:?} for {body}", started.elapsed());
    }
}

#[test]
fn sleep_cannot_outrun_the_deadline() {
    let p = probe();
    let started = Instant::now();
    timeout(p.run("sleep(6) return 'woke'"));
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    timeout(p.run("pcall(sleep, 6) return 'woke'"));
    assert_eq!(p.run("sleep(0.01) return 'ok'").unwrap(), json!("ok"));
    runtime_error(p.run("sleep(-1)"), "expected a number of seconds");
}

#[test]
fn http_to_a_server_that_never_answers_is_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Accept and hold connections without ever answering.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let mut p = probe();
    // The stub is on loopback, which scripts reach only when the operator allows it.
    p.info_edit = Box::new(|info| info.allow_private = true);
    let started = Instant::now();
    timeout(p.run(&format!("return http.get('http://{addr}/slow')")));
    timeout(p.run(&format!("local ok, err = pcall(http.get, 'http://{addr}/slow') return 'survived'")));
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    // A script's own shorter timeout is an ordinary, catchable error.
    let out = p
        .run(&format!("local ok, err = pcall(http.get, 'http://{addr}/slow', {{timeout = 0.1}}) return tostring(err)"))
        .unwrap();
    assert!(out.as_str().unwrap().contains("timed out after 0.1 s"), "{out}");
}

#[test]
fn cancel_handle_stops_a_running_script() {
    let p = probe();
    let cancel = CancelHandle::new();
    let remote = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        remote.cancel();
    });
    let mut long = probe();
    long.limits.timeout = Duration::from_secs(30);
    let started = Instant::now();
    let err = long
        .run_script("tool = {} function tool.execute() pcall(sleep, 20) while true do end end", cancel)
        .unwrap_err();
    assert!(matches!(err, ScriptError::Cancelled { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(p);
}

// ---- memory ----

#[test]
fn memory_bombs_hit_the_cap() {
    let p = probe();
    memory(p.run("local s = string.rep('x', 64 * 1024 * 1024) return #s"));
    memory(p.run("local t = {} for i = 1, 1e9 do t[i] = i end"));
    memory(p.run("local s = 'x' while true do s = s .. s end"));
    memory(p.run("local t = {} while true do t[#t + 1] = string.rep('y', 1024) .. #t end"));
    memory(p.run("pcall(string.rep, 'x', 64 * 1024 * 1024) return 'survived'"));
    memory(p.run("while true do pcall(function() local t = {} for i = 1, 1e9 do t[i] = i end end) end"));
    // A modest allocation after a failed one still works in a fresh VM.
    assert_eq!(p.run("return #string.rep('x', 1024)").unwrap(), json!(1024));
}

#[test]
fn a_finalizer_that_loops_cannot_hang_the_host() {
    let p = probe();
    let started = Instant::now();
    runtime_error(
        p.run("setmetatable({}, {__gc = function() while true do end end}) return 'done'"),
        "__gc finalizers are not allowed",
    );
    // Metatables without finalizers still work, and errors raised by an xpcall handler propagate.
    assert_eq!(p.run("return setmetatable({}, {__index = function() return 7 end}).x").unwrap(), json!(7));
    assert_eq!(
        p.run("return select(2, xpcall(error, function(e) return 'handled: ' .. e end, 'oops'))").unwrap(),
        json!("handled: oops")
    );
    assert_eq!(p.run("return xpcall(function(a, b) return a + b end, print, 1, 2)").unwrap(), json!(true));
    timeout(p.run("xpcall(error, function() while true do end end) return 'survived'"));
    assert!(started.elapsed() < Duration::from_secs(2));
}

// ---- files ----

#[test]
fn fs_is_confined_to_the_script_folder() {
    let p = probe();
    p.file("tools/data/notes.txt", "hello notes");
    p.file("secret.txt", "top secret");
    std::os::unix::fs::symlink(p.dir.path().join("secret.txt"), p.dir.path().join("tools/link.txt")).unwrap();
    assert_eq!(p.run("return fs.read('data/notes.txt')").unwrap(), json!("hello notes"));
    assert_eq!(p.run("return fs.list('data')").unwrap(), json!(["notes.txt"]));
    assert_eq!(p.run("return fs.list('.', '*.lua')").unwrap(), json!(["probe.lua"]));
    runtime_error(p.run("return fs.read('../secret.txt')"), "outside the script's folder");
    runtime_error(p.run("return fs.read('data/../../secret.txt')"), "outside the script's folder");
    runtime_error(p.run("return fs.read('/etc/passwd')"), "absolute paths are not allowed");
    runtime_error(p.run("return fs.read('link.txt')"), "outside the script's folder");
    runtime_error(p.run("return fs.list('..')"), "outside the script's folder");
    runtime_error(p.run("return fs.read('missing.txt')"), "does not exist");
}

#[test]
fn require_loads_from_the_script_folder_through_the_sandbox() {
    let p = probe();
    p.file("tools/lib/util.lua", "local M = {} function M.twice(x) return x * 2 end return M");
    p.file("tools/lib/evil.lua", "return os.execute('true')");
    assert_eq!(p.run("return require('lib.util').twice(21)").unwrap(), json!(42));
    runtime_error(p.run("return require('lib.evil')"), "tools/lib/evil.lua:1:");
    p.file("outside.lua", "return 1");
    runtime_error(p.run("return require('outside')"), "not found");
}

// ---- error hygiene ----

#[test]
fn lua_errors_are_relative_and_clean() {
    let p = probe();
    let message =
        runtime_error(p.run("local x = nil\nreturn x.field"), "tools/probe.lua:4: attempt to index a nil value");
    assert!(!message.contains("runtime error"), "{message}");
    let message = runtime_error(p.run("error('boom')"), "tools/probe.lua:3: boom");
    assert_eq!(message, "tools/probe.lua:3: boom");
    let err = p.run_script("tool = {\nfunction", CancelHandle::new()).unwrap_err();
    assert!(matches!(err, ScriptError::Load { .. }), "{err:?}");
    assert!(err.to_string().starts_with("tools/probe.lua:"), "{err}");
    assert!(err.detail().len() >= err.to_string().len());
}

#[test]
fn both_script_forms_work_and_contract_errors_are_clear() {
    let p = probe();
    assert_eq!(
        p.run_script("local ext = {} function ext.execute() return 'returned' end return ext", CancelHandle::new())
            .unwrap(),
        json!("returned")
    );
    assert_eq!(
        p.run_script("tool = {} function tool.execute() return 'global' end", CancelHandle::new()).unwrap(),
        json!("global")
    );
    let err = p.run_script("x = 1", CancelHandle::new()).unwrap_err();
    assert_eq!(err.to_string(), "tools/probe.lua: the script must define a global `tool` table or `return` one");
    let err = p.run_script("tool = {}", CancelHandle::new()).unwrap_err();
    assert!(err.to_string().contains("`tool.execute` is not defined"), "{err}");
}

// ---- results ----

#[test]
fn results_are_capped_and_must_be_json() {
    let p = probe();
    match p.run("return string.rep('x', 100 * 1024)") {
        Err(e @ ScriptError::ResultTooLarge { .. }) => {
            assert!(e.to_string().contains("max_result_bytes limit of 65536"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    match p.run("return { f = function() end }") {
        Err(e @ ScriptError::BadResult { .. }) => {
            assert!(e.to_string().contains("function cannot be converted to JSON at .f"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    match p.run("local t = {} t.self = t return t") {
        Err(ScriptError::BadResult { message, .. }) => assert!(message.contains("a cycle?"), "{message}"),
        other => panic!("{other:?}"),
    }
}

// ---- isolation ----

#[test]
fn each_run_starts_from_a_clean_state() {
    let p = probe();
    p.run("leaked = 'yes'; string.upper = nil; json.encode = nil; os.time = nil; coroutine.resume = nil; table.insert = nil; return 1").unwrap();
    assert_eq!(
        p.run("return os.time ~= nil and coroutine.resume ~= nil and table.insert ~= nil").unwrap(),
        json!(true)
    );
    assert_eq!(
        p.run("return { leaked = leaked == nil, upper = string.upper ~= nil, json = json.encode ~= nil }").unwrap(),
        json!({"leaked": true, "upper": true, "json": true})
    );
}

/// The isolation probe: reports leftovers of earlier runs, then pollutes everything it reaches.
pub(crate) const POLLUTER: &str = include_str!("../fixtures/lua/polluter.lua");
pub(crate) const POLLUTER_MODULE: &str = include_str!("../fixtures/lua/pollutermod.lua");

/// Checks the probe's reports of several runs: nothing left over, the same globals at the start
/// of every run, and no two runs drawing the same first random number.
pub(crate) fn assert_isolated(reports: &[Value]) {
    let mut draws = std::collections::HashSet::new();
    let mut first_globals: Option<Vec<String>> = None;
    for (run, report) in reports.iter().enumerate() {
        assert_eq!(report["leftovers"], json!([]), "run {run}: {report}");
        let mut globals: Vec<String> =
            report["globals"].as_array().unwrap().iter().map(|g| g.as_str().unwrap().to_string()).collect();
        globals.sort();
        match &first_globals {
            None => first_globals = Some(globals),
            Some(first) => assert_eq!(&globals, first, "run {run} starts with other globals"),
        }
        assert!(draws.insert(report["first_draw"].to_string()), "run {run} repeats a random draw: {report}");
    }
}

#[test]
fn a_restarted_vm_keeps_nothing_of_the_last_run() {
    let p = probe();
    p.file("tools/probe.lua", POLLUTER).file("tools/pollutermod.lua", POLLUTER_MODULE);
    let built = ctx::lua::vms_built_on_this_thread();
    let mut vm = Vm::new(p.info(), p.limits, CancelHandle::new()).unwrap();
    let mut reports = Vec::new();
    for run in 0..5 {
        if run > 0 {
            vm.restart(CancelHandle::new()).unwrap();
        }
        let ext = vm.load_extension("tool").unwrap();
        let execute = vm.function(&ext, "tool", "execute").unwrap();
        let lua = vm.lua();
        let params = lua.create_table().unwrap();
        params.set("require", true).unwrap();
        let context = lua.create_table().unwrap();
        context.set("config", lua.create_table().unwrap()).unwrap();
        let out = vm.call(&execute, (params, context)).unwrap();
        reports.push(vm.result_json(&out).unwrap());
        assert!(vm.reusable(), "run {run}: a clean run leaves the VM reusable");
    }
    assert_isolated(&reports);
    assert_eq!(ctx::lua::vms_built_on_this_thread() - built, 1, "all five runs used one VM");
    // The probe is not blind: two runs in one environment do see the pollution.
    let ext = vm.load_extension("tool").unwrap();
    let execute = vm.function(&ext, "tool", "execute").unwrap();
    let lua = vm.lua();
    let context = lua.create_table().unwrap();
    context.set("config", lua.create_table().unwrap()).unwrap();
    let out = vm.call(&execute, (lua.create_table().unwrap(), context)).unwrap();
    let left = vm.result_json(&out).unwrap()["leftovers"].as_array().unwrap().len();
    assert!(left >= 15, "without a restart the probe sees what the last run did ({left} kinds)");
}

#[test]
fn a_load_reader_cannot_swallow_the_deadline() {
    // load() catches errors raised by its reader function; the kill must still get through.
    timeout(probe().run("while true do load(function() while true do end end) end"));
    timeout(probe().run("while true do pcall(load, function() while true do end end) end"));
}

#[test]
fn an_inline_run_matches_patterns_until_its_budget_ends() {
    // Matching is ctx's own port of Lua's matcher, which checks the deadline as it goes: a short
    // match stays inline, and a pattern such as ".-.-.-b" over a long string escalates when the
    // inline budget ends instead of holding the async worker for minutes.
    let p = probe();
    let run_inline = |body: &str| {
        p.file("tools/probe.lua", &format!("tool = {{}}\nfunction tool.execute() {body} end\n"));
        let mut vm = Vm::new(p.info(), p.limits, CancelHandle::new()).unwrap();
        let ext = vm.load_extension("tool").unwrap();
        let execute = vm.function(&ext, "tool", "execute").unwrap();
        vm.make_inline(Duration::from_millis(20));
        let started = Instant::now();
        let result = vm.call(&execute, ()).and_then(|v| vm.result_json(&v));
        (result, vm.state().killed(), started.elapsed())
    };
    for call in
        ["('abc'):find('b')", "string.match('abc', 'b')", "('abc'):gsub('b', 'c')", "string.gmatch('abc', '.')()"]
    {
        let (result, killed, _) = run_inline(&format!("return (select(1, {call}))"));
        assert!(result.is_ok(), "{call}: {result:?}");
        assert_eq!(killed, ctx::lua::Kill::None, "{call}");
    }
    for call in
        ["string.find(s, '.-.-.-b')", "string.match(s, '(.-)(.-)b')", "s:gsub('.-.-b', '')", "s:gmatch('.-.-b')()"]
    {
        let (result, killed, took) =
            run_inline(&format!("local s = string.rep('a', 4000) pcall(function() return {call} end) return 1"));
        assert!(result.is_err(), "{call} finished inline");
        assert_eq!(killed, ctx::lua::Kill::Escalate, "{call}");
        assert!(took < Duration::from_millis(500), "{call} held the inline run for {took:?}");
    }
    // Anywhere else they behave as in plain Lua, and their errors still name them.
    assert_eq!(p.run("return select(2, ('abc'):find('b'))").unwrap(), json!(2));
    assert_eq!(p.run("local n = 0 for _ in ('a b c'):gmatch('%a') do n = n + 1 end return n").unwrap(), json!(3));
    runtime_error(
        p.run("return string.find('abc', {})"),
        "bad argument #2 to 'string.find' (string expected, got table)",
    );
    runtime_error(
        p.run("local i = string.find('abc', {}) return i"),
        "bad argument #2 to 'find' (string expected, got table)",
    );
    runtime_error(p.run("return ('abc'):find('[')"), "malformed pattern (missing ']')");
}

#[test]
fn a_vm_stopped_by_a_limit_is_not_reused() {
    let p = probe();
    p.file("tools/probe.lua", "tool = {}\nfunction tool.execute() while true do end end\n");
    let vm = Vm::new(p.info(), p.limits, CancelHandle::new()).unwrap();
    let ext = vm.load_extension("tool").unwrap();
    let execute = vm.function(&ext, "tool", "execute").unwrap();
    timeout(vm.call(&execute, ()).and_then(|v| vm.result_json(&v)));
    assert!(!vm.reusable());
}

// ---- host APIs ----

#[test]
fn json_round_trips_predictably() {
    let p = probe();
    assert_eq!(p.run("return json.encode({})").unwrap(), json!("{}"));
    assert_eq!(p.run("return json.encode(json.array())").unwrap(), json!("[]"));
    assert_eq!(p.run("return json.encode({1, 2, 3})").unwrap(), json!("[1,2,3]"));
    assert_eq!(p.run("return json.encode(json.parse('[]'))").unwrap(), json!("[]"));
    assert_eq!(
        p.run("return json.encode(json.parse('{\"a\":null,\"b\":[]}'))").unwrap(),
        json!("{\"a\":null,\"b\":[]}")
    );
    assert_eq!(p.run("return json.parse('{\"a\":null}').a == json.null").unwrap(), json!(true));
    assert_eq!(p.run("return json.parse('{\"n\": 1.5, \"i\": 7}')").unwrap(), json!({"n": 1.5, "i": 7}));
    runtime_error(p.run("return json.parse('{bad')"), "json.parse");
    runtime_error(p.run("return json.encode({[true] = 1})"), "cannot be a JSON key");
}

#[test]
fn env_base64_crypto_log() {
    std::env::set_var("CTX_SANDBOX_TEST_VAR", "visible");
    let mut p = probe();
    // Without allow_env, env.get reads nothing.
    runtime_error(p.run("return env.get('CTX_SANDBOX_TEST_VAR')"), "may not read environment variables");
    p.info_edit = Box::new(|info| {
        info.allow_env = Some(vec!["CTX_SANDBOX_TEST_VAR".into(), "CTX_SANDBOX_TEST_SURELY_UNSET".into()])
    });
    assert_eq!(p.run("return env.get('CTX_SANDBOX_TEST_VAR')").unwrap(), json!("visible"));
    assert_eq!(p.run("return env.get('CTX_SANDBOX_TEST_SURELY_UNSET') == nil").unwrap(), json!(true));
    p.info_edit = Box::new(|info| info.allow_env = Some(vec!["OTHER".into()]));
    runtime_error(p.run("return env.get('CTX_SANDBOX_TEST_VAR')"), "not in this script's allow_env list (OTHER)");

    let p = probe();
    assert_eq!(p.run("return base64.encode('hello')").unwrap(), json!("aGVsbG8="));
    assert_eq!(p.run("return base64.decode('aGVsbG8=')").unwrap(), json!("hello"));
    runtime_error(p.run("return base64.decode('!!!')"), "base64.decode");
    assert_eq!(
        p.run("return crypto.sha256('abc')").unwrap(),
        json!("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    );
    assert_eq!(
        p.run("return crypto.hmac_sha256('key', 'The quick brown fox jumps over the lazy dog')").unwrap(),
        json!("f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8")
    );
}

/// A tracing writer that keeps what it is given, for tests that read the log.
#[derive(Clone, Default)]
pub(crate) struct CapturedLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl CapturedLog {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Runs `f` with this thread's log going here, every level, no colours.
    pub(crate) fn during<T>(&self, f: impl FnOnce() -> T) -> T {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f)
    }
}

impl Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLog {
    type Writer = CapturedLog;
    fn make_writer(&'a self) -> CapturedLog {
        self.clone()
    }
}

/// `log.*` and `print` reach the log, each at its level, tagged with the script; stdout stays
/// clean (it carries the CLI's output and the MCP stdio transport).
#[test]
fn log_and_print_go_to_the_log_tagged_with_the_script() {
    let p = probe();
    let log = CapturedLog::default();
    let result = log.during(|| {
        p.run("log.info('hi', 1) log.warn('w-line') log.error('e-line') log.debug('d-line') print('to the', 'log') return true")
    });
    assert_eq!(result.unwrap(), json!(true));
    let text = log.text();
    let line = |needle: &str| {
        text.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no log line with {needle:?} in:\n{text}"))
    };
    for (needle, level) in [("hi 1", "INFO"), ("w-line", "WARN"), ("e-line", "ERROR"), ("d-line", "DEBUG")] {
        let found = line(needle);
        assert!(found.contains(level), "{needle:?} is logged at {level}: {found}");
        assert!(found.contains("ctx::script") && found.contains("probe"), "tagged with the script: {found}");
    }
    let printed = line("to the log");
    assert!(printed.contains("INFO") && printed.contains("probe"), "print is log.info: {printed}");
}

/// A tiny HTTP server that answers every request with a JSON echo of what it received.
fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head, body) = loop {
                    let n = stream.read(&mut chunk).unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..pos]).into_owned();
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        while buf.len() < pos + 4 + len {
                            let n = stream.read(&mut chunk).unwrap_or(0);
                            if n == 0 {
                                break;
                            }
                            buf.extend_from_slice(&chunk[..n]);
                        }
                        break (head, String::from_utf8_lossy(&buf[pos + 4..]).into_owned());
                    }
                };
                let mut lines = head.lines();
                let request_line = lines.next().unwrap_or_default().to_string();
                let headers: serde_json::Map<String, Value> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), json!(v.trim())))
                    .collect();
                let status = if request_line.contains("/missing") { "404 Not Found" } else { "200 OK" };
                let reply = json!({"request": request_line, "headers": headers, "body": body}).to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Echo: yes\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                    reply.len()
                );
            });
        }
    });
    addr
}

#[test]
fn http_methods_headers_params_and_bodies() {
    let addr = echo_server();
    let mut p = probe();
    p.info_edit = Box::new(|info| info.allow_private = true);
    let out = p
        .run(&format!(
            "local r = http.get('http://{addr}/items', {{ params = {{ q = 'a b', n = 2 }}, headers = {{ Authorization = 'Bearer t' }} }})
             return {{ status = r.status, ok = r.ok, echo = r.headers['x-echo'], req = r.json.request, auth = r.json.headers.authorization }}"
        ))
        .unwrap();
    assert_eq!(
        out,
        json!({"status": 200, "ok": true, "echo": "yes", "req": "GET /items?n=2&q=a+b HTTP/1.1", "auth": "Bearer t"})
    );
    for method in ["post", "put", "patch"] {
        let out = p
            .run(&format!("local r = http.{method}('http://{addr}/x', {{ title = 'T', tags = json.array() }}) return {{ req = r.json.request, body = r.json.body, ct = r.json.headers['content-type'] }}"))
            .unwrap();
        assert_eq!(out["req"], format!("{} /x HTTP/1.1", method.to_uppercase()));
        assert_eq!(out["body"], "{\"tags\":[],\"title\":\"T\"}");
        assert_eq!(out["ct"], "application/json");
    }
    let out = p.run(&format!("local r = http.post('http://{addr}/raw', 'plain text', {{ headers = {{ ['Content-Type'] = 'text/plain' }} }}) return r.json.body")).unwrap();
    assert_eq!(out, json!("plain text"));
    let out =
        p.run(&format!("local r = http.delete('http://{addr}/missing') return {{ s = r.status, ok = r.ok }}")).unwrap();
    assert_eq!(out, json!({"s": 404, "ok": false}));
    let out = p
        .run(&format!("local r = http.request{{ method = 'PUT', url = 'http://{addr}/r', body = 'b', headers = {{ ['X-A'] = '1' }} }} return r.json.request .. ' ' .. r.json.headers['x-a']"))
        .unwrap();
    assert_eq!(out, json!("PUT /r HTTP/1.1 1"));
    runtime_error(p.run("return http.get('file:///etc/passwd')"), "only http and https");
    runtime_error(p.run("return http.get('not a url')"), "invalid URL");
    runtime_error(p.run("return http.get('http://127.0.0.1:1/')"), "connection failed");
}

#[test]
fn http_allow_hosts_is_enforced() {
    let addr = echo_server();
    let mut p = probe();
    p.info_edit = Box::new(|info| info.allow_hosts = Some(vec!["api.example.com".into(), "*.corp.example".into()]));
    runtime_error(
        p.run(&format!("return http.get('http://{addr}/')")),
        "host \"127.0.0.1\" is not in this script's allow_hosts",
    );
    p.info_edit = Box::new(|info| info.allow_hosts = Some(vec!["127.0.0.1".into()]));
    assert_eq!(p.run(&format!("return http.get('http://{addr}/').status")).unwrap(), json!(200));
    assert!(ctx::lua::api::http::host_allowed("a.corp.example", &["*.corp.example".into()]));
    assert!(!ctx::lua::api::http::host_allowed("corp.example.evil", &["*.corp.example".into()]));
}

/// Each thread's next run is clean after its own abusive one. The server-level version, with many
/// runs and other callers served meanwhile, is `many_abusive_runs_...` in proof.rs.
#[test]
fn abusive_runs_on_four_threads_leave_each_thread_usable() {
    let handles: Vec<_> = (0..4)
        .map(|i| {
            std::thread::spawn(move || {
                let p = probe();
                match i % 2 {
                    0 => timeout(p.run("while true do end")),
                    _ => memory(p.run("local s = 'x' while true do s = s .. s end")),
                }
                assert_eq!(p.run("return 'still fine'").unwrap(), json!("still fine"));
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
