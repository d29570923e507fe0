//! No script outruns its limits. Every library function a script can reach gets its
//! worst-case arguments under a short deadline, through a real `ctx serve`: each call must end
//! within its deadline plus 1 s, and `/health` must keep answering while it runs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{Workspace, BIN};

/// Runs whatever Lua it is given, first inline (as every pure tool does) and, after its first
/// blocking call or budget, on the blocking pool.
const WORST: &str = r#"
tool = {
  name = "worst",
  description = "Runs the Lua chunk it is given.",
  parameters = { { name = "code", type = "string", required = true } },
}
function tool.execute(p)
  local chunk = assert(load(p.code, "=case"))
  return chunk()
end
"#;

const TIMEOUT: Duration = Duration::from_secs(1);

pub struct Server {
    child: Child,
    pub addr: String,
    _ws: Workspace,
}

impl Drop for Server {
    fn drop(&mut self) {
        let exited = self.child.try_wait().ok().flatten();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            // The server's own account, for a failure that is the server's.
            let log = std::fs::read_to_string(self._ws.path().join("serve.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect();
            eprintln!("ctx serve (exited: {exited:?}) logged:\n{}", tail.join("\n"));
        }
    }
}

/// `ctx serve` on 127.0.0.1:0 with the `worst` tool (and any extra config).
pub fn serve(extra: &str, files: &[(&str, &str)]) -> Server {
    let ws = Workspace::new(&format!("{}{extra}", worst_section()));
    ws.write("tools/worst.lua", WORST);
    for (path, text) in files {
        ws.write(path, text);
    }
    let mut child = Command::new(BIN)
        .current_dir(ws.path())
        .args(["--config", "ctx.toml", "serve", "--bind", "127.0.0.1:0"])
        .env_remove("CTX_CONFIG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(ws.path().join("serve.log")).expect("serve.log"))
        .spawn()
        .expect("start ctx serve");
    let addr = crate::common::listening_address(&mut child).unwrap_or_else(|line| panic!("no address in {line:?}"));
    Server { child, addr, _ws: ws }
}

/// One HTTP/1.1 request on a new connection; the status and the JSON body.
pub fn request(addr: &str, method: &str, path: &str, body: Option<&Value>, timeout: Duration) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(timeout)).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).unwrap_or_else(|e| panic!("{method} {path}: no reply within {timeout:?}: {e}"));
    let text = String::from_utf8_lossy(&reply);
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let json = text.split_once("\r\n\r\n").and_then(|(_, b)| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
    (status, json)
}

/// Polls `/health` from its own thread and records the slowest answer.
struct HealthWatch {
    stop: Arc<AtomicBool>,
    slowest: Arc<Mutex<Duration>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HealthWatch {
    fn start(addr: &str) -> HealthWatch {
        let (stop, slowest) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Duration::ZERO)));
        let (s, w, addr) = (stop.clone(), slowest.clone(), addr.to_string());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let started = Instant::now();
                let (status, _) = request(&addr, "GET", "/health", None, Duration::from_secs(10));
                assert_eq!(status, 200, "/health must answer");
                let took = started.elapsed();
                let mut slowest = w.lock().unwrap();
                *slowest = (*slowest).max(took);
                drop(slowest);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        HealthWatch { stop, slowest, thread: Some(thread) }
    }

    /// Stops polling; the slowest `/health` answer seen.
    fn finish(mut self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().expect("the /health poller failed");
        let slowest = *self.slowest.lock().unwrap();
        slowest
    }
}

/// How a case must end: each of them within its deadline, but not all the same way.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Ends {
    /// It finishes: the arguments only look costly (an empty string repeated, a short load).
    Done,
    /// The library refuses the arguments at once (`tool_error`): the bound is checked up front.
    Refused,
    /// A limit stops the run: the deadline, the memory cap or the result cap. Which one can
    /// depend on the machine's speed (a debug build may reach the deadline before the cap).
    Stopped,
}

impl Ends {
    fn of(status: u16, body: &Value) -> Option<Ends> {
        match (status, body["error"]["code"].as_str()) {
            (200, _) => Some(Ends::Done),
            (_, Some("tool_error")) => Some(Ends::Refused),
            (_, Some("timeout" | "memory_limit" | "result_too_large")) => Some(Ends::Stopped),
            _ => None,
        }
    }
}

use Ends::{Done, Refused, Stopped};

/// Worst-case arguments for every curated library function whose cost is not O(1): each line is
/// a case name, the chunk the tool runs and how it must end. The sandbox's audit (src/lua/bounds.rs) lists why
/// each one is bounded.
const CASES: &[(&str, &str, Ends)] = &[
    ("string.rep of an empty string, 2^63 times", r#"return #string.rep(string.rep("", 1), math.maxinteger)"#, Done),
    ("string.rep with an empty separator", r#"return #string.rep("", math.maxinteger, "")"#, Done),
    ("string.rep of a byte, 2^63 times", r#"return string.rep("x", math.maxinteger)"#, Stopped),
    ("string.rep as a method", r#"return ("ab"):rep(1 << 40)"#, Stopped),
    ("string.rep after a blocking call", r#"sleep(0) return #string.rep("", math.maxinteger)"#, Done),
    ("table.move over the whole integer range", r#"table.move({}, 1, math.maxinteger, 1, {}) return 1"#, Refused),
    ("table.move after a blocking call", r#"sleep(0) table.move({}, 1, math.maxinteger, 1, {}) return 1"#, Refused),
    ("table.move from math.mininteger", r#"table.move({}, math.mininteger, -1, 1) return 1"#, Refused),
    (
        "table.insert with a __len of 2^63",
        r#"table.insert(setmetatable({}, {__len = function() return math.maxinteger - 1 end}), 1, "x")"#,
        Stopped,
    ),
    (
        "table.remove with a __len of 2^63",
        r#"return table.remove(setmetatable({}, {__len = function() return math.maxinteger - 1 end}), 1)"#,
        Stopped,
    ),
    (
        "table.concat with a C __index and the whole range",
        r#"return table.concat(setmetatable({}, {__index = rawlen}), "", 1, math.maxinteger)"#,
        Refused,
    ),
    (
        "table.concat with a Lua __index and the whole range",
        r#"return table.concat(setmetatable({}, {__index = function() return "" end}), "", 1, math.maxinteger)"#,
        Refused,
    ),
    ("table.unpack of the whole range", r##"return select("#", table.unpack({}, 1, math.maxinteger))"##, Refused),
    (
        "table.sort of a million references to one long NUL string",
        r#"local s = string.rep("\0", 1 << 20) local t = {} for i = 1, 1000000 do t[i] = s end table.sort(t) return #t"#,
        Stopped,
    ),
    (
        "comparing two 16 MiB NUL strings in a loop",
        r#"local a, b = string.rep("\0", 16 << 20), string.rep("\0", 16 << 20) while true do local _ = a < b end"#,
        Stopped,
    ),
    (
        "comparing two 16 MiB strings for equality in a loop",
        r#"local a, b = string.rep("a", 16 << 20), string.rep("a", 16 << 20) while true do local _ = a == b end"#,
        Stopped,
    ),
    ("load of a huge chunk", r#"return load(string.rep("x = 1 ", 2 << 20))"#, Refused),
    (
        "string.format of a huge string",
        r#"local s = string.rep("a", 20 << 20) while true do local _ = string.format("%s%s", s, s) end"#,
        Stopped,
    ),
    ("string.byte of a whole long string", r#"return string.byte(string.rep("a", 4 << 20), 1, -1)"#, Refused),
    ("string.pack with a huge padding", r#"return string.pack("c1000000000", "")"#, Stopped),
    ("utf8.len in a loop", r#"local s = string.rep("\u{4e2d}", 8 << 20) while true do utf8.len(s) end"#, Stopped),
    ("collectgarbage step of 2^63", r#"collectgarbage("step", math.maxinteger) while true do end"#, Stopped),
    (
        "json.parse of a 28 MiB array",
        r#"local t = json.parse("[" .. string.rep("1,", 14 << 20) .. "1]") return #t"#,
        Stopped,
    ),
    ("a loop inside a coroutine", r#"coroutine.wrap(function() while true do end end)()"#, Stopped),
    ("pcall swallowing the timeout", r#"while true do pcall(function() while true do end end) end"#, Stopped),
    ("concatenation doubling", r#"local s = "x" while true do s = s .. s end"#, Stopped),
    // Found by review: counts Lua accepts that a Rust parser would not, C functions handed to C
    // loops as metamethods or comparators, readers, nested buffers, shared tables.
    ("string.rep with a hex count", r#"return #string.rep("", "0x7fffffffffffffff")"#, Done),
    ("table.move with a hex range", r#"table.move({}, 1, "0x7ffffffffffffffe", 1, {}) return 1"#, Refused),
    (
        "table.sort with a __len of 2^31 and C metamethods",
        r#"table.sort(setmetatable({}, {__len = function() return (1 << 31) - 2 end, __index = rawlen, __newindex = rawequal})) return 1"#,
        Refused,
    ),
    (
        "table.sort with a C comparator",
        r#"local x = {} local t = {} for i = 1, 2000000 do t[i] = x end table.sort(t, rawequal) return 1"#,
        Refused,
    ),
    (
        "table.unpack with __index = next",
        r##"local s = table.pack(table.unpack({}, 1, 999999)) setmetatable(s, {__index = next}) return select("#", table.unpack(s, 1, 999999))"##,
        Refused,
    ),
    (
        "table.move into a C __newindex",
        r#"local s = table.pack(table.unpack({}, 1, 999999)) setmetatable(s, {__index = next}) table.move(s, 1, 999999, 1, setmetatable({}, {__newindex = rawequal})) return 1"#,
        Refused,
    ),
    (
        "load with a reader of 30 MiB pieces",
        r#"local s = string.rep(";", 30 << 20) return load(function() return s end)"#,
        Done,
    ),
    (
        "nested gsub buffers",
        r#"local big = ("x"):rep(16 << 20) local function f(d) local n = 0 return (("abc"):gsub(".", function() n = n + 1 if n == 3 and d < 100 then f(d + 1) end return big end)) end f(1) return 1"#,
        Stopped,
    ),
    (
        "json.encode of a table shared thousands of times",
        r#"local t = {} for d = 1, 4 do local n = {} for i = 1, 6000 do n[i] = t end t = n end return #json.encode(t)"#,
        Stopped,
    ),
    (
        "returning a table shared thousands of times",
        r#"local t = {} for d = 1, 4 do local n = {} for i = 1, 6000 do n[i] = t end t = n end return t"#,
        Stopped,
    ),
    ("string.packsize in a loop", r#"local f = (" "):rep(30 << 20) while true do string.packsize(f) end"#, Stopped),
    (
        "collectgarbage('collect') in a loop over 400,000 live tables",
        r#"local t = {} for i = 1, 400000 do t[i] = {} end while true do collectgarbage("collect") end"#,
        Stopped,
    ),
    (
        "collectgarbage('count') in a loop over 400,000 live tables",
        r#"local t = {} for i = 1, 400000 do t[i] = {} end while true do collectgarbage("count") end"#,
        Stopped,
    ),
    ("os.date in a loop", r#"local f = ("%c"):rep(1 << 20) while true do os.date(f) end"#, Stopped),
    (
        "the utf8.codes iterator on another string",
        r#"local s = ("\x80"):rep(24 << 20) local step = utf8.codes("") while true do pcall(step, s, 0) end"#,
        Stopped,
    ),
    ("string.find with a backtracking pattern", r#"return string.find(string.rep("a", 300000), ".-.-.-.-b")"#, Stopped),
    (
        "string.match with a backtracking pattern",
        r#"return string.match(string.rep("a", 300000), "(.-)(.-)(.-)b")"#,
        Stopped,
    ),
    (
        "string.gmatch with a backtracking pattern",
        r#"for m in string.gmatch(string.rep("a", 300000), ".-.-.-b") do end return 1"#,
        Stopped,
    ),
    (
        "string.gsub with a backtracking pattern",
        r#"return string.gsub(string.rep("a", 300000), ".-.-.-b", "x")"#,
        Stopped,
    ),
];

/// What the call answered, in one word, for the report.
fn outcome(status: u16, body: &Value) -> String {
    if status == 200 {
        return "ok".into();
    }
    body["error"]["code"].as_str().unwrap_or("?").to_string()
}

#[test]
fn every_library_call_ends_within_its_deadline_and_health_keeps_answering() {
    let server = serve("", &[]);
    let health = HealthWatch::start(&server.addr);
    let mut report = Vec::new();
    for (name, code, ends) in CASES {
        let started = Instant::now();
        let (status, body) =
            request(&server.addr, "POST", "/tools/worst", Some(&json!({ "code": code })), Duration::from_secs(30));
        let took = started.elapsed();
        let message = body["error"]["message"].as_str().unwrap_or_default().to_string();
        report.push(format!("{:>6} ms  {:<14} {name}", took.as_millis(), outcome(status, &body)));
        // Generous for a loaded CI machine: a call the audit missed runs on in C until it is
        // abandoned (and says "quarantined", checked below) or for far longer than this.
        assert!(took < TIMEOUT + Duration::from_secs(3), "{name}: took {took:?} (deadline {TIMEOUT:?}): {body}");
        // Ending in time by abandonment would mean the audit missed this function.
        assert!(!message.contains("quarantined"), "{name}: {message}");
        // Errors raised through the sandbox's wrappers name no sandbox internals.
        assert!(!message.contains("sandbox:"), "{name}: {message}");
        assert_eq!(Ends::of(status, &body), Some(*ends), "{name}: {status} {body}");
    }
    let slowest = health.finish();
    eprintln!("{}", report.join("\n"));
    eprintln!("slowest /health answer: {slowest:?}");
    // A stalled server would hold /health for a whole case: the deadline (1 s) or beyond. The
    // bound stays under that and leaves room for a loaded machine's scheduling.
    assert!(slowest < Duration::from_millis(900), "/health took {slowest:?} while a case ran");
    // No case left a run behind: /health still reports no problems.
    let (status, body) = request(&server.addr, "GET", "/health", None, Duration::from_secs(5));
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")), "{body}");
}

#[test]
fn the_issue_reproductions_are_refused_or_end_in_time() {
    let server = serve(
        "[tools.script.rep]\npath = \"tools/rep.lua\"\ntimeout = 2\n",
        &[(
            "tools/rep.lua",
            r#"tool = { name = "rep", description = "Repeats text.", parameters = {
                 { name = "text", type = "string", required = true }, { name = "times", type = "integer", required = true } } }
               function tool.execute(p) return string.rep(p.text, p.times) end"#,
        )],
    );
    let started = Instant::now();
    let (status, body) = request(
        &server.addr,
        "POST",
        "/tools/rep",
        Some(&json!({"text": "", "times": i64::MAX})),
        Duration::from_secs(10),
    );
    assert_eq!((status, &body["result"]), (200, &json!("")), "{body}");
    assert!(started.elapsed() < Duration::from_secs(1));
    let (status, body) = request(
        &server.addr,
        "POST",
        "/tools/rep",
        Some(&json!({"text": "x", "times": i64::MAX})),
        Duration::from_secs(10),
    );
    assert_eq!((status, &body["error"]["code"]), (500, &json!("memory_limit")), "{body}");
    // The comparison that ran 5 s under a 2 s timeout and answered 200.
    let compare = r#"local a, b = string.rep("\0", 16 << 20), string.rep("\0", 16 << 20)
                     local n = 0 for i = 1, 500 do if a < b then n = n + 1 end end return n"#;
    let started = Instant::now();
    let (status, body) =
        request(&server.addr, "POST", "/tools/worst", Some(&json!({ "code": compare })), Duration::from_secs(30));
    let took = started.elapsed();
    assert!(took < TIMEOUT + Duration::from_secs(3), "took {took:?}");
    assert_eq!(body["error"]["code"], "timeout", "{status} {body}");
}

#[test]
fn a_script_that_hangs_at_load_time_does_not_stop_serve_or_check() {
    // Top-level statements that used to spin forever in C, and one that loops in Lua.
    let hang = r#"local _ = string.rep("", math.maxinteger) table.move({}, 1, math.maxinteger, 1, {})
                  tool = { name = "hang", description = "x" } function tool.execute() return 1 end"#;
    let spin = "while true do end";
    let server = serve(
        "[tools.script.hang]\npath = \"tools/hang.lua\"\ntimeout = 1\n[tools.script.spin]\npath = \"tools/spin.lua\"\ntimeout = 1\n",
        &[("tools/hang.lua", hang), ("tools/spin.lua", spin)],
    );
    let (status, body) = request(&server.addr, "GET", "/health", None, Duration::from_secs(5));
    assert_eq!(status, 200);
    let problems = body["problems"].as_array().cloned().unwrap_or_default();
    let text = serde_json::to_string(&problems).unwrap();
    assert!(text.contains("table.move: a range of"), "{body}");
    assert!(text.contains("spin") && text.contains("timed out"), "{body}");

    let ws = Workspace::new(
        "[tools.script.hang]\npath = \"tools/hang.lua\"\ntimeout = 1\n[tools.script.spin]\npath = \"tools/spin.lua\"\ntimeout = 1\n",
    );
    ws.write("tools/hang.lua", hang);
    ws.write("tools/spin.lua", spin);
    let started = Instant::now();
    let run = ws.ctx(&["schema", "check"]);
    assert_ne!(run.code(), 0, "the check must fail: {}", run.stdout());
    assert!(started.elapsed() < Duration::from_secs(10), "schema check took {:?}", started.elapsed());
    let out = format!("{}{}", run.stdout(), run.stderr());
    assert!(out.contains("table.move: a range of") && out.contains("spin"), "{out}");
}

#[test]
fn json_parse_counts_its_memory_against_the_cap() {
    // A longer deadline than the other cases: a debug build takes over a second to reach the cap.
    let server = serve(
        "[tools.script.parse]\npath = \"tools/parse.lua\"\ntimeout = 20\n",
        &[("tools/parse.lua", &WORST.replace("\"worst\"", "\"parse\""))],
    );
    let pid = server.child.id();
    let rss = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    };
    // A 28 MiB array: the old parser built a JSON tree outside the cap (1.1 GiB per call).
    let code = r#"local t = json.parse("[" .. string.rep("1,", 14 << 20) .. "1]") return #t"#;
    for _ in 0..3 {
        let (status, body) =
            request(&server.addr, "POST", "/tools/parse", Some(&json!({ "code": code })), Duration::from_secs(30));
        assert_eq!(body["error"]["code"], "memory_limit", "{status} {body}");
    }
    let peak = rss();
    assert!(peak < 400 << 20, "peak RSS {} MiB for three 28 MiB parses under a 64 MiB cap", peak >> 20);
    // Within the cap, parsing works and yields real Lua values.
    let small = r#"local t = json.parse('{"a": [1, 2.5, "x", null, true], "b": {}}')
                   return {n = #t.a, two = t.a[2], s = t.a[3], null = t.a[4] == json.null, b = next(t.b) == nil}"#;
    let (status, body) =
        request(&server.addr, "POST", "/tools/worst", Some(&json!({ "code": small })), Duration::from_secs(10));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], json!({"n": 5, "two": 2.5, "s": "x", "null": true, "b": true}));
}

/// One VM of `worst`, reused for every call: the test calls through `Registry::call` from one
/// thread, where each run takes that thread's idle VM of the script.
#[test]
fn a_reused_vm_shows_the_next_run_nothing_of_the_last() {
    let f = crate::tools::fixture(&worst_section(), &[("worst.lua", WORST)]);
    let (_dir, registry) = f.into_parts();
    let run = |code: &str| {
        let out = registry.call("worst", json!({ "code": code }), &ctx::tools::CallOptions::default());
        out.unwrap_or_else(|e| panic!("{code}: {e}")).value()
    };
    let built = ctx::lua::vms_built_on_this_thread();
    let count = r#"return collectgarbage("count")"#;
    let fresh = run(count).as_f64().unwrap();
    // A run that leaves a lot behind for the collector, then the same probe again.
    for _ in 0..4 {
        assert_eq!(run(r#"local t = {} for i = 1, 20000 do t[i] = {i} end return #t"#), json!(20000));
        let after = run(count).as_f64().unwrap();
        assert!(
            (fresh - after).abs() < 8.0,
            "collectgarbage('count') was {fresh} KiB fresh and {after} KiB after a littering run"
        );
    }
    assert_eq!(ctx::lua::vms_built_on_this_thread() - built, 1, "the nine runs shared one VM");
}

/// `[tools.script.worst]` as [`serve`] configures it.
fn worst_section() -> String {
    format!("[tools.script.worst]\npath = \"tools/worst.lua\"\ntimeout = {}\nmemory_mb = 64\n", TIMEOUT.as_secs())
}

#[test]
fn an_http_response_is_parsed_within_the_cap() {
    // 24 MiB of JSON array: the old `.json` built the whole tree in Rust first.
    let big = format!("[{}1]", "1,".repeat(12 << 20));
    let (addr, _) = crate::common::stub(move |_| (200, big.clone()));
    let server = serve(
        "[tools.script.fetch]\npath = \"tools/fetch.lua\"\ntimeout = 20\nallow_hosts = [\"127.0.0.1\"]\n",
        &[("tools/fetch.lua", &WORST.replace("\"worst\"", "\"fetch\""))],
    );
    let code = format!("local r = http.get('http://{addr}/big') return r.json and #r.json or -1");
    for _ in 0..3 {
        let (status, body) =
            request(&server.addr, "POST", "/tools/fetch", Some(&json!({ "code": code })), Duration::from_secs(60));
        assert_eq!(body["error"]["code"], "memory_limit", "{status} {body}");
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let peak: u64 =
        status.lines().find(|l| l.starts_with("VmHWM:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(peak < 400 << 10, "peak RSS {} MiB for three 24 MiB responses under a 64 MiB cap", peak >> 10);
}

#[test]
fn a_scripts_log_lines_are_capped_and_counted() {
    let server = serve("", &[]);
    // 2,000 lines of 1 MiB each: 2 GiB of log before the cap.
    let code = r#"local s = string.rep("x", 1 << 20) for i = 1, 2000 do log.warn(s) end return 1"#;
    let (status, body) =
        request(&server.addr, "POST", "/tools/worst", Some(&json!({ "code": code })), Duration::from_secs(30));
    assert_eq!(status, 200, "{body}");
    // The run's report of what it dropped is written when its sandbox is next used or dropped.
    request(&server.addr, "POST", "/tools/worst", Some(&json!({ "code": "return 1" })), Duration::from_secs(30));
    let log = std::fs::read_to_string(server._ws.path().join("serve.log")).unwrap();
    assert!(log.len() < 8 << 20, "the log grew to {} bytes", log.len());
    assert!(log.contains("(truncated, 1048576 bytes)"), "no truncation note");
    assert!(log.contains("more than 1000 log lines in one run"), "no drop warning");
    assert!(log.contains("1000 log line(s) of one run were dropped"), "no drop count");
}

/// Through `Tools::call` on a runtime of one thread, whose blocking pool the test counts: a small
/// call finishes inline on that thread, one with 700 KiB of parameters (more than an inline run
/// may allocate) moves to the blocking pool instead of failing.
#[test]
fn parameters_larger_than_the_inline_allowance_run_on_the_pool() {
    let f = crate::tools::fixture(&worst_section(), &[("worst.lua", WORST)]);
    let (_dir, registry) = f.into_parts();
    let tools = ctx::tools::Tools::new(registry);
    let pool_threads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Arc::clone(&pool_threads);
    // On a current-thread runtime every thread it starts is a blocking-pool thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_start(move || {
            started.fetch_add(1, Ordering::SeqCst);
        })
        .build()
        .unwrap();
    let call = |code: String| {
        let params = json!({ "code": code });
        runtime.block_on(tools.call("worst".into(), params, ctx::tools::CallOptions::default())).map(|o| o.value())
    };
    assert_eq!(call("return 1".into()).unwrap(), json!(1));
    assert_eq!(pool_threads.load(Ordering::SeqCst), 0, "a small call runs inline, on the runtime's own thread");
    let big = format!("return 1 --{}", "x".repeat(700 << 10));
    assert_eq!(call(big).unwrap_or_else(|e| panic!("{e}")), json!(1));
    assert!(pool_threads.load(Ordering::SeqCst) >= 1, "the large call ran on a thread of the blocking pool");
}
