//! Behaviours that had no test. Hot reload through the real file
//! watcher, the last good version of a broken script, calls in flight during a reload, a sync
//! running under searches and tool calls, the outbound HTTP response-size cap, the Host and
//! Origin guards on `/mcp`, and many abusive runs while the server keeps serving others.
//!
//! Waits are bounded generously (a loaded machine shares 2 cores): the tests poll for a state and
//! fail only when it never comes, they never assert a speed.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{Workspace, BIN};
use crate::hardening_server::{initialize_body, Conn, Reply, MCP_POST};

/// How long any state the tests wait for may take to come.
const PATIENCE: Duration = Duration::from_secs(60);

/// `ctx serve` on 127.0.0.1:0 in a workspace, with or without the file watcher; killed on drop.
struct Serve {
    child: Child,
    addr: SocketAddr,
    ws: Workspace,
}

impl Serve {
    fn start(ws: Workspace, reload: bool) -> Serve {
        let mut args = vec!["--config", "ctx.toml", "serve", "--bind", "127.0.0.1:0"];
        if !reload {
            args.push("--no-reload");
        }
        let (child, addr) = crate::common::spawn_listening(Command::new(BIN).args(&args), ws.path());
        Serve { child, addr, ws }
    }

    fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        Conn::open(self.addr).send(method, path, headers, body)
    }

    /// `POST /tools/<name>`: the status and the JSON body.
    fn call(&self, tool: &str, params: Value) -> (u16, Value) {
        let reply =
            self.send("POST", &format!("/tools/{tool}"), &[("Content-Type", "application/json")], &params.to_string());
        (reply.status, serde_json::from_str(&reply.body).unwrap_or(Value::String(reply.body)))
    }

    fn get(&self, path: &str) -> Value {
        let reply = self.send("GET", path, &[], "");
        assert_eq!(reply.status, 200, "GET {path}: {}", reply.body);
        serde_json::from_str(&reply.body).expect("JSON")
    }

    /// The description `/tools/list` gives `tool`, if it lists it.
    fn description(&self, tool: &str) -> Option<String> {
        let list = self.get("/tools/list");
        list["tools"].as_array()?.iter().find(|t| t["name"] == tool)?["description"].as_str().map(str::to_string)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `probe` until `done` holds; fails with `what` and the last value after [`PATIENCE`].
#[track_caller]
fn wait_for<T: std::fmt::Debug>(what: &str, mut probe: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let started = Instant::now();
    loop {
        let value = probe();
        if done(&value) {
            return value;
        }
        assert!(started.elapsed() < PATIENCE, "{what}: still {value:?} after {} s", PATIENCE.as_secs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A tool named `name` that says which version it is.
fn versioned(name: &str, version: &str) -> String {
    format!(
        "tool = {{ name = \"{name}\", description = \"Version {version}.\" }}\nfunction tool.execute() return \"{version}\" end\n"
    )
}

// ---------------------------------------------------------------------------------------------
// Item 4: hot reload

/// The watcher itself, not a registry swap done by hand: an edit on disk changes the tool
/// (listing and result), and a section appended to ctx.toml adds one.
#[test]
fn the_file_watcher_reloads_an_edited_script_and_a_new_section() {
    let ws = Workspace::new("[tools.script.greet]\npath = \"tools/greet.lua\"\n");
    ws.write("tools/greet.lua", &versioned("greet", "one"));
    let server = Serve::start(ws, true);
    assert_eq!(server.call("greet", json!({})), (200, json!({"result": "one"})));

    server.ws.write("tools/greet.lua", &versioned("greet", "two"));
    wait_for("the listing after the edit", || server.description("greet"), |d| d.as_deref() == Some("Version two."));
    assert_eq!(server.call("greet", json!({})), (200, json!({"result": "two"})));

    server.ws.write("tools/added.lua", &versioned("added", "new"));
    let mut config = std::fs::OpenOptions::new().append(true).open(server.ws.path().join("ctx.toml")).unwrap();
    config.write_all(b"\n[tools.script.added]\npath = \"tools/added.lua\"\n").unwrap();
    drop(config);
    wait_for("the new section's tool", || server.description("added"), |d| d.is_some());
    assert_eq!(server.call("added", json!({})), (200, json!({"result": "new"})));
    assert_eq!(server.call("greet", json!({})), (200, json!({"result": "two"})), "the other tool stays");
}

/// A script that stops loading keeps serving its last good version; `/health` names the problem
/// meanwhile, and a fixed script replaces it.
#[test]
fn hot_reload_keeps_the_last_good_version_of_a_broken_script() {
    let ws = Workspace::new("[tools.script.greet]\npath = \"tools/greet.lua\"\n");
    ws.write("tools/greet.lua", &versioned("greet", "good"));
    let server = Serve::start(ws, true);
    assert_eq!(server.get("/health")["status"], "ok");

    server.ws.write("tools/greet.lua", "tool = { name = \"greet\", description = \n");
    let health =
        wait_for("/health to report the broken script", || server.get("/health"), |h| h["status"] == "degraded");
    let problems = health["problems"].as_array().expect("problems");
    assert!(
        problems.iter().any(|p| p["name"] == "greet" && p["message"].as_str().is_some_and(|m| m.contains("greet.lua"))),
        "{health}"
    );
    assert_eq!(server.call("greet", json!({})), (200, json!({"result": "good"})), "the last good version");
    assert_eq!(server.description("greet").as_deref(), Some("Version good."));

    server.ws.write("tools/greet.lua", &versioned("greet", "fixed"));
    wait_for("the fixed version", || server.call("greet", json!({})), |r| r.1 == json!({"result": "fixed"}));
    assert_eq!(server.get("/health")["status"], "ok");
}

/// A gate for a stub: requests block in it until the test opens it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    changed: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        let started = Instant::now();
        while !*open && started.elapsed() < PATIENCE {
            open = self.changed.wait_timeout(open, Duration::from_millis(100)).unwrap().0;
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.changed.notify_all();
    }
}

/// A call that is running when a reload lands finishes on the script it started with, while new
/// calls get the new one. The old call is held inside `http.get` by a stub until the test has
/// seen the reload, so the two really overlap.
#[test]
fn calls_in_flight_finish_on_the_old_registry_while_a_reload_lands() {
    let gate = Arc::new(Gate::default());
    // The stub logs a request once it has answered; this counts them as they arrive.
    let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (stub, received) = {
        let (gate, arrived) = (Arc::clone(&gate), Arc::clone(&arrived));
        crate::common::stub(move |_| {
            arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            gate.wait();
            (200, "{\"from\": \"stub\"}".to_string())
        })
    };
    let ws = Workspace::new(&format!(
        "[tools.script.gate]\npath = \"tools/gate.lua\"\ntimeout = 120\nallow_private = true\nurl = \"http://{stub}/\"\n"
    ));
    ws.write(
        "tools/gate.lua",
        "tool = { name = \"gate\", description = \"Old.\" }\n\
         function tool.execute(_, context) local r = http.get(context.config.url, { timeout = 120 }) return \"old \" .. r.json.from end\n",
    );
    let server = Serve::start(ws, true);
    let addr = server.addr;
    let in_flight = std::thread::spawn(move || {
        let reply = Conn::open(addr).send("POST", "/tools/gate", &[("Content-Type", "application/json")], "{}");
        (reply.status, reply.body)
    });
    let arrivals = || arrived.load(std::sync::atomic::Ordering::SeqCst);
    wait_for("the old call to reach the stub", arrivals, |n| *n == 1);

    server.ws.write(
        "tools/gate.lua",
        "tool = { name = \"gate\", description = \"New.\" }\nfunction tool.execute() return \"new\" end\n",
    );
    wait_for("the reload", || server.description("gate"), |d| d.as_deref() == Some("New."));
    assert_eq!(server.call("gate", json!({})), (200, json!({"result": "new"})), "new calls take the new script");
    assert!(!in_flight.is_finished(), "the old call is still held by the stub");

    gate.open();
    let (status, body) = in_flight.join().unwrap();
    assert_eq!((status, body.as_str()), (200, "{\"result\":\"old stub\"}"), "the old call finished on the old script");
    assert_eq!((arrivals(), received.lock().unwrap().len()), (1, 1), "the new script never called the stub");
}

// ---------------------------------------------------------------------------------------------
// Item 4: a sync under load

const COUNTER: &str = r#"
tool = { name = "counter", description = "context.search from Lua.", parameters = { { name = "query", type = "string", required = true } } }
function tool.execute(params, context)
  local hits = context.search(params.query, { limit = 5 })
  return { count = #hits, first = hits[1] and hits[1].id }
end
"#;

/// `ctx sync` (another process, the way users run it) writes the database a running server reads
/// from. Meanwhile searches, a Lua tool calling `context.search`, `/tools/get` of what a search
/// found and `/tools/sources` all succeed; the document count only grows, every hit can be
/// fetched whole, and at the end everything is there. The test also checks that it saw the sync
/// half-way (a count strictly between 0 and the total), so the overlap really happened.
#[test]
fn a_sync_runs_while_searches_and_tool_calls_go_on() {
    let total = 4000usize;
    let ws = Workspace::new(
        "[connectors.filesystem.docs]\nroot = \"docs\"\n\n[tools.script.counter]\npath = \"tools/counter.lua\"\n",
    );
    ws.write("tools/counter.lua", COUNTER);
    for i in 0..total {
        ws.write(
            &format!("docs/d{i:05}.md"),
            &format!("# Doc {i}\n\nThe capybara of document {i} guards the wombat{i}.\n"),
        );
    }
    let server = Serve::start(ws, false);
    let mut sync = Command::new(BIN)
        .args(["--config", "ctx.toml", "-q", "sync"])
        .current_dir(server.ws.path())
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ctx sync");

    let documents = |server: &Serve| -> u64 {
        let sources = server.get("/tools/sources");
        sources["sources"].as_array().unwrap().iter().map(|s| s["documents"].as_u64().unwrap()).sum()
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    let (counts, calls) = std::thread::scope(|scope| {
        // Searches and tool calls on two threads, as fast as they go, until the sync ends.
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (server, done) = (&server, &done);
                scope.spawn(move || {
                    let mut calls = 0u64;
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        let (status, body) = if w == 0 {
                            server.call("search", json!({"query": "capybara", "limit": 5}))
                        } else {
                            server.call("counter", json!({"query": "capybara guards"}))
                        };
                        assert_eq!(status, 200, "worker {w}: {body}");
                        let first = if w == 0 {
                            body["results"].as_array().unwrap().first().map(|r| r["id"].clone())
                        } else {
                            assert!(body["result"]["count"].as_u64().unwrap() <= 5, "{body}");
                            body["result"].get("first").cloned()
                        };
                        if let Some(id) = first.filter(|id| !id.is_null()) {
                            let (status, doc) = server.call("get", json!({"id": id}));
                            assert_eq!(status, 200, "a hit that cannot be fetched: {doc}");
                            assert!(doc["body"].as_str().unwrap().contains("capybara"), "{doc}");
                        }
                        calls += 1;
                    }
                    calls
                })
            })
            .collect();
        // The document count, read over and over: it only grows.
        let mut counts = vec![0u64];
        let exited = loop {
            if let Some(status) = sync.try_wait().unwrap() {
                break status;
            }
            let now = documents(&server);
            assert!(now >= *counts.last().unwrap(), "the document count went down: {counts:?} then {now}");
            counts.push(now);
        };
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let calls: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(exited.success(), "ctx sync failed while the server ran");
        (counts, calls)
    });
    assert!(
        counts.iter().any(|&n| n > 0 && n < total as u64),
        "never saw the sync half-way, so nothing overlapped: {counts:?}"
    );
    assert!(calls > 0, "the workers made no call during the sync");
    assert_eq!(documents(&server), total as u64);
    let (status, body) = server.call("search", json!({"query": "wombat3999"}));
    assert_eq!((status, body["results"][0]["title"].as_str()), (200, Some("Doc 3999")), "{body}");
}

// ---------------------------------------------------------------------------------------------
// Item 4: the outbound HTTP response-size cap

/// A local server that answers one request per connection with `total` bytes of body, sent in
/// 64 KiB pieces without a Content-Length (so only the reader can stop it). Reports, per
/// connection, how many body bytes it got out before the client hung up.
fn streaming_stub(total: usize) -> (SocketAddr, std::sync::mpsc::Receiver<usize>) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n");
                let piece = vec![b'x'; 64 * 1024];
                let mut sent = 0;
                while sent < total {
                    let n = piece.len().min(total - sent);
                    if stream.write_all(&piece[..n]).is_err() {
                        break;
                    }
                    sent += n;
                }
                let _ = tx.send(sent);
            });
        }
    });
    (addr, rx)
}

/// `http.get` stops reading a body once it outgrows what the script may still allocate (its
/// memory cap, 8 MiB here), says so, and the server hangs up on a sender that would go on to
/// 256 MiB; a body under the cap arrives whole.
#[test]
fn the_http_response_size_cap_stops_reading_a_large_body() {
    let (big, big_sent) = streaming_stub(256 << 20);
    let (small, small_sent) = streaming_stub(1 << 20);
    let toml = "[tools.script.fetch]\npath = \"tools/fetch.lua\"\nmemory_mb = 8\ntimeout = 60\nallow_private = true\n";
    let fetch = r#"
tool = { name = "fetch", description = "Fetches a URL.", parameters = { { name = "url", type = "string", required = true } } }
function tool.execute(params) return #http.get(params.url, { timeout = 60 }).body end
"#;
    let (_dir, registry) = crate::tools::fixture(toml, &[("fetch.lua", fetch)]).into_parts();
    let options = ctx::tools::CallOptions { caller: "test", ..Default::default() };

    let error = registry.call("fetch", json!({"url": format!("http://{big}/")}), &options).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("the response body is over"), "{message}");
    assert!(message.contains("memory limit"), "{message}");
    let sent = big_sent.recv_timeout(PATIENCE).expect("the big stub finished");
    assert!(sent < 64 << 20, "the client read on: the stub sent {sent} bytes of 256 MiB");

    let size = registry.call("fetch", json!({"url": format!("http://{small}/")}), &options).expect("1 MiB fits");
    assert_eq!(size.value(), json!(1 << 20));
    assert_eq!(small_sent.recv_timeout(PATIENCE).unwrap(), 1 << 20);
}

// ---------------------------------------------------------------------------------------------
// Item 4: Host and Origin guards on /mcp

/// Against the real `ctx serve` with one allowed origin: on `/mcp`, in both protocol eras, a
/// foreign Host or a foreign Origin is refused with the 403 envelope, the allowed origin gets
/// through with its CORS header, and a request without Origin from a loopback Host passes.
#[test]
fn host_and_origin_guards_on_mcp() {
    let ws = Workspace::new(
        "[server]\nallowed_origins = [\"https://app.example.com\"]\n\n[tools.script.echo]\npath = \"tools/echo.lua\"\n",
    );
    ws.write("tools/echo.lua", &crate::tools::shipped("echo.lua"));
    let server = Serve::start(ws, false);
    let port = server.addr.port();
    let stateless = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"message": "guarded"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}})
    .to_string();
    let post = |body: &str, era: &str, extra: &[(&str, &str)]| {
        let mut headers = MCP_POST.to_vec();
        if era == "2026-07-28" {
            headers.extend([("MCP-Protocol-Version", era), ("Mcp-Method", "tools/call"), ("Mcp-Name", "echo")]);
        }
        headers.extend_from_slice(extra);
        server.send("POST", "/mcp", &headers, body)
    };
    let forbidden = |reply: &Reply, what: &str| {
        assert_eq!(reply.status, 403, "{what}: {}", reply.body);
        let body: Value = serde_json::from_str(&reply.body).unwrap_or_else(|_| panic!("{what}: {}", reply.body));
        assert_eq!(body["error"]["code"], "forbidden", "{what}: {body}");
    };
    let initialize = initialize_body();
    let bad_host = format!("attacker.example:{port}");
    for (era, body) in [("2025-11-25", initialize.as_str()), ("2026-07-28", stateless.as_str())] {
        let foreign = post(body, era, &[("Origin", "https://evil.example")]);
        forbidden(&foreign, &format!("{era}: foreign Origin"));
        assert!(
            !foreign.headers.contains_key("access-control-allow-origin"),
            "{era}: no CORS grant to a foreign Origin"
        );
        forbidden(&post(body, era, &[("Host", &bad_host)]), &format!("{era}: foreign Host"));
        forbidden(
            &post(body, era, &[("Host", &bad_host), ("Origin", "https://app.example.com")]),
            &format!("{era}: foreign Host with the allowed Origin"),
        );
        let allowed = post(body, era, &[("Origin", "https://app.example.com")]);
        assert_eq!(allowed.status, 200, "{era}: allowed Origin: {}", allowed.body);
        assert_eq!(allowed.headers["access-control-allow-origin"], "https://app.example.com");
        let plain = post(body, era, &[]);
        assert_eq!(plain.status, 200, "{era}: no Origin: {}", plain.body);
        assert!(plain.body.contains("\"result\""), "{era}: {}", plain.body);
    }
    let echoed = post(&stateless, "2026-07-28", &[("Origin", "https://app.example.com")]);
    assert!(echoed.body.contains("guarded") && !echoed.body.contains("\"isError\":true"), "{}", echoed.body);
}

// ---------------------------------------------------------------------------------------------
// Item 1: many abusive runs while the server serves others

const SPIN: &str = "tool = { name = \"spin\", description = \"Loops until its deadline.\" }\nfunction tool.execute() while true do end end\n";
const HOG: &str = "tool = { name = \"hog\", description = \"Allocates until its cap.\" }\nfunction tool.execute() local t = {} for i = 1, 1e9 do t[i] = string.rep('x', 1024) .. i end end\n";

/// 24 scripts that spin to their deadline and 24 that allocate to their memory cap, against the
/// real server. Once `/health` counts every spinner's connection open, the hogs go in too, and
/// from then until the first spinner's deadline answer the server keeps answering echo calls.
/// Every abusive call gets its own error; the process, its health and echo are fine afterwards.
#[test]
fn many_abusive_runs_in_parallel_while_the_server_keeps_serving() {
    let per_kind = 24;
    let ws = Workspace::new(
        "[tools.script.spin]\npath = \"tools/spin.lua\"\ntimeout = 5\n\n\
         [tools.script.hog]\npath = \"tools/hog.lua\"\nmemory_mb = 8\ntimeout = 60\n\n\
         [tools.script.echo]\npath = \"tools/echo.lua\"\n",
    );
    ws.write("tools/spin.lua", SPIN);
    ws.write("tools/hog.lua", HOG);
    ws.write("tools/echo.lua", &crate::tools::shipped("echo.lua"));
    let mut server = Serve::start(ws, false);
    let addr = server.addr;
    let started = Instant::now();
    let launch = |tool: &'static str| {
        std::thread::spawn(move || {
            let reply =
                Conn::open(addr).send("POST", &format!("/tools/{tool}"), &[("Content-Type", "application/json")], "{}");
            (tool, reply.status, reply.body, started.elapsed())
        })
    };
    let mut abusive: Vec<_> = (0..per_kind).map(|_| launch("spin")).collect();
    let connections = || server.get("/health")["load"]["connections"].as_u64().unwrap_or(0);
    wait_for("every spinner's connection", connections, |&n| n > per_kind as u64);
    let window_opened = started.elapsed();
    abusive.extend((0..per_kind).map(|_| launch("hog")));
    // Echo, one call after another, until every abusive call has answered.
    let mut echoes = Vec::new();
    while !abusive.iter().all(|h| h.is_finished()) {
        let (status, body) = server.call("echo", json!({"message": "still here"}));
        assert_eq!((status, &body["result"]["message"]), (200, &json!("still here")), "{body}");
        echoes.push(started.elapsed());
        assert!(started.elapsed() < PATIENCE * 2, "the abusive calls never all answered");
    }
    let mut first_spin_answer = Duration::MAX;
    for handle in abusive {
        let (tool, status, body, at) = handle.join().unwrap();
        let body: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{tool}: {body}"));
        let want = if tool == "spin" { (408, "timeout") } else { (500, "memory_limit") };
        assert_eq!((status, body["error"]["code"].as_str().unwrap_or_default()), want, "{tool}: {body}");
        if tool == "spin" {
            first_spin_answer = first_spin_answer.min(at);
        }
    }
    let meanwhile = echoes.iter().filter(|&&at| at > window_opened && at < first_spin_answer).count();
    assert!(
        meanwhile >= 3,
        "only {meanwhile} echo calls answered while the {per_kind} spinners were in flight \
         ({window_opened:?} to {first_spin_answer:?}): {echoes:?}"
    );
    assert_eq!(server.child.try_wait().unwrap(), None, "the server process is still running");
    let health = wait_for("/health after the abuse", || server.get("/health"), |h| h["status"] == "ok");
    assert_eq!(health["status"], "ok");
    assert_eq!(server.call("echo", json!({"message": "after"})).0, 200);
}
