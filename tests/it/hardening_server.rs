//! The server's part: regression tests against the real `ctx serve` binary over raw
//! HTTP (items 4, 6, 7, 8, 13 and 15b). Raw sockets, because the attacks are malformed or
//! unfinished requests that a real client library would never send.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{Workspace, BIN};

/// `ctx serve` on 127.0.0.1:0 in a workspace; killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    _ws: Workspace,
}

impl Server {
    fn start(config: &str, scripts: &[(&str, &str)]) -> Server {
        Server::start_with_file_limit(config, scripts, None)
    }

    /// `file_limit`: the server's open-file limit (`ulimit -n` in a shell that then execs ctx).
    fn start_with_file_limit(config: &str, scripts: &[(&str, &str)], file_limit: Option<u32>) -> Server {
        let ws = Workspace::new(config);
        for (path, text) in scripts {
            ws.write(path, text);
        }
        let mut command = match file_limit {
            Some(limit) => {
                let mut sh = Command::new("sh");
                sh.arg("-c").arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\"")).arg(BIN);
                sh
            }
            None => Command::new(BIN),
        };
        command.args(["--config", "ctx.toml", "serve", "--no-reload", "--bind", "127.0.0.1:0"]);
        let (child, addr) = crate::common::spawn_listening(&mut command, ws.path());
        Server { child, addr, _ws: ws }
    }

    fn connect(&self) -> Conn {
        Conn::open(self.addr)
    }

    /// GET /health on a fresh connection.
    fn health(&self) -> Value {
        let reply = self.connect().send("GET", "/health", &[], "");
        assert_eq!(reply.status, 200, "{}", reply.body);
        serde_json::from_str(&reply.body).expect("health is JSON")
    }

    /// The server's resident memory, in KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("proc status");
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
        line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("a number")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) body: String,
}

/// One keep-alive HTTP/1.1 connection.
pub(crate) struct Conn {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub(crate) fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        stream.set_nodelay(true).unwrap();
        Conn { addr, reader: BufReader::new(stream) }
    }

    pub(crate) fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        let mut head = format!("{method} {path} HTTP/1.1\r\nContent-Length: {}\r\n", body.len());
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            head.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(body);
        // One write: a head and a body in two small writes wait for the server's delayed ACK.
        self.reader.get_mut().write_all(head.as_bytes()).expect("write the request");
        self.read_reply()
    }

    fn read_reply(&mut self) -> Reply {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("status line");
        let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
        let mut headers = BTreeMap::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("header line");
            let Some((name, value)) = line.trim_end().split_once(':') else { break };
            headers.insert(name.to_ascii_lowercase(), value.trim().to_string());
        }
        let mut body = Vec::new();
        if headers.get("transfer-encoding").is_some_and(|t| t == "chunked") {
            loop {
                line.clear();
                self.reader.read_line(&mut line).expect("chunk size");
                let size = usize::from_str_radix(line.trim(), 16).expect("hex size");
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).expect("chunk");
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            let length = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
            body.resize(length, 0);
            self.reader.read_exact(&mut body).expect("body");
        }
        Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
    }

    /// Waits until the server closes the connection; how long that took, or `None` if it did
    /// not within `limit`.
    fn closed_within(&mut self, limit: Duration) -> Option<Duration> {
        let started = Instant::now();
        let stream = self.reader.get_mut();
        stream.set_read_timeout(Some(limit)).unwrap();
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => Some(started.elapsed()),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionReset) => Some(started.elapsed()),
            _ => None,
        }
    }
}

const SESSION_VERSION: &str = "2025-11-25";

pub(crate) fn initialize_body() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": SESSION_VERSION, "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}})
    .to_string()
}

pub(crate) const MCP_POST: [(&str, &str); 2] =
    [("Accept", "application/json, text/event-stream"), ("Content-Type", "application/json")];

/// A session-era handshake (initialize, then `notifications/initialized`); the session id.
fn open_session(conn: &mut Conn) -> String {
    let reply = conn.send("POST", "/mcp", &MCP_POST, &initialize_body());
    assert_eq!(reply.status, 200, "{}", reply.body);
    let id = reply.headers.get("mcp-session-id").expect("a session id").clone();
    let mut headers = MCP_POST.to_vec();
    headers.extend([("Mcp-Session-Id", id.as_str()), ("MCP-Protocol-Version", SESSION_VERSION)]);
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let reply = conn.send("POST", "/mcp", &headers, &note);
    assert_eq!(reply.status, 202, "{}", reply.body);
    id
}

fn close_session(conn: &mut Conn, id: &str) {
    let headers = [("Mcp-Session-Id", id), ("MCP-Protocol-Version", SESSION_VERSION)];
    let reply = conn.send("DELETE", "/mcp", &headers, "");
    assert!(matches!(reply.status, 200 | 202 | 204), "DELETE: {} {}", reply.status, reply.body);
}

/// Polls until `check` holds or `limit` passes; the last value either way.
fn eventually<T>(limit: Duration, mut probe: impl FnMut() -> T, check: impl Fn(&T) -> bool) -> T {
    let started = Instant::now();
    loop {
        let value = probe();
        if check(&value) || started.elapsed() > limit {
            return value;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------------------
// 4. DNS rebinding

#[test]
fn dns_rebinding_hosts_are_refused_on_rest_and_mcp() {
    let server = Server::start("", &[]);
    let port = server.addr.port();
    let request = |host: &str, path: &str| {
        // The attack: a page on the attacker's name (rebound to 127.0.0.1) calls with its own
        // Origin, which equals the Host.
        let origin = format!("http://{host}");
        let mut headers = vec![("Host", host), ("Origin", origin.as_str())];
        if path == "/mcp" {
            headers.extend(MCP_POST);
            server.connect().send("POST", path, &headers, &initialize_body()).status
        } else {
            server.connect().send("GET", path, &headers, "").status
        }
    };
    let with_port = |name: &str| format!("{name}:{port}");
    for host in [
        with_port("127.0.0.1.attacker.example"),
        "127.0.0.1.attacker.example".to_string(),
        with_port("127.attacker.example"),
        with_port("localhost.attacker.example"),
        with_port("attacker.example"),
    ] {
        assert_eq!(request(&host, "/tools/list"), 403, "REST with Host {host}");
        assert_eq!(request(&host, "/mcp"), 403, "/mcp with Host {host}");
    }
    // Every loopback name is one check's answer: REST and /mcp agree.
    for host in
        [with_port("127.0.0.1"), with_port("127.0.0.2"), with_port("localhost"), with_port("[::1]"), "localhost".into()]
    {
        assert_eq!(request(&host, "/tools/list"), 200, "REST with Host {host}");
        assert_eq!(request(&host, "/mcp"), 200, "/mcp with Host {host}");
    }
}

// ---------------------------------------------------------------------------------------------
// 6. progress() floods a slow client

const FLOOD: &str = r#"
tool = { name = "flood", description = "Reports progress 1,500 times with a 1 MiB message." }
function tool.execute()
  local big = string.rep("x", 1024 * 1024)
  for i = 1, 1500 do progress(i, 1500, big) end
  return "flooded"
end
"#;

#[test]
fn progress_to_a_slow_client_is_bounded_and_capped() {
    let ws = Workspace::new("[tools.script.flood]\npath = \"tools/flood.lua\"\ntimeout = 60\n");
    ws.write("tools/flood.lua", FLOOD);
    let mut child = Command::new(BIN)
        .args(["--config", "ctx.toml", "serve", "--stdio", "--no-reload"])
        .current_dir(ws.path())
        .env_remove("CTX_CONFIG")
        .env_remove("CTX_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ctx serve --stdio");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut stderr = child.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut send = |message: Value| writeln!(stdin, "{message}").expect("write stdin");
    send(json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": SESSION_VERSION, "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}}));
    let init: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(init["id"], 0, "{init}");
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "flood", "arguments": {}, "_meta": {"progressToken": "p"}}}));
    // The client reads nothing for a while: the pipe fills and the script keeps reporting.
    let pid = child.id();
    let mut peak_kib = 0;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(100));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let rss = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        peak_kib = peak_kib.max(rss.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap());
    }
    let mut notes = 0;
    let result = loop {
        let message: Value = serde_json::from_str(&lines.next().expect("a message").unwrap()).unwrap();
        if message["id"] == 1 {
            break message;
        }
        assert_eq!(message["method"], "notifications/progress", "{message}");
        let text = message["params"]["message"].as_str().expect("a message");
        assert!(text.len() <= 1100, "one progress message is capped: {} bytes", text.len());
        assert!(text.ends_with("(progress message truncated from 1048576 bytes)"), "{}", &text[text.len() - 80..]);
        notes += 1;
    };
    eprintln!("progress flood: {notes} reports arrived, peak RSS {peak_kib} KiB");
    assert_eq!(result["result"]["content"][0]["text"], "flooded", "{result}");
    assert!(notes > 0 && notes < 1500, "reports beyond the queue are dropped, not queued: {notes} arrived");
    // Before the fix the queue held every 1 MiB message: 1.5 GiB in 2 s.
    assert!(peak_kib < 300 * 1024, "the server grew to {peak_kib} KiB while the client did not read");
    drop(stdin);
    let _ = child.wait();
    let log = log.join().unwrap();
    assert!(log.contains("dropped") && log.contains("progress reports"), "the drops are logged once: {log}");
    assert_eq!(log.matches("progress reports").count(), 1, "{log}");
}

// ---------------------------------------------------------------------------------------------
// 7. MCP sessions

#[test]
fn sessions_over_the_cap_are_refused_clearly_and_closing_frees_a_place() {
    let server = Server::start("[server]\nmax_mcp_sessions = 3\n", &[]);
    let mut conn = server.connect();
    let ids: Vec<String> = (0..3).map(|_| open_session(&mut conn)).collect();
    let refused = conn.send("POST", "/mcp", &MCP_POST, &initialize_body());
    assert_eq!(refused.status, 503, "{}", refused.body);
    let error: Value = serde_json::from_str(&refused.body).expect("a JSON-RPC error");
    assert_eq!(error["id"], 1, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("3 MCP sessions") && message.contains("server.max_mcp_sessions"), "{message}");
    assert!(message.contains("DELETE /mcp"), "it says what to do: {message}");
    assert_eq!(server.health()["load"]["mcp_sessions"], 3);
    close_session(&mut conn, &ids[0]);
    let again = conn.send("POST", "/mcp", &MCP_POST, &initialize_body());
    assert_eq!(again.status, 200, "a closed session frees its place: {}", again.body);
}

#[test]
fn idle_sessions_expire_and_are_freed() {
    let server = Server::start("[server]\nmcp_session_idle_secs = 1\n", &[]);
    let mut conn = server.connect();
    let id = open_session(&mut conn);
    assert_eq!(server.health()["load"]["mcp_sessions"], 1);
    let health = eventually(Duration::from_secs(15), || server.health(), |h| h["load"]["mcp_sessions"] == 0);
    assert_eq!(health["load"]["mcp_sessions"], 0, "the idle session expired: {health}");
    let mut headers = MCP_POST.to_vec();
    headers.extend([("Mcp-Session-Id", id.as_str()), ("MCP-Protocol-Version", SESSION_VERSION)]);
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}).to_string();
    assert_eq!(conn.send("POST", "/mcp", &headers, &ping).status, 404, "an expired session is gone");
}

#[test]
fn opening_and_closing_5000_sessions_returns_to_the_baseline() {
    let server = Server::start("", &[]);
    let mut conn = server.connect();
    let cycle = |conn: &mut Conn, n: usize| {
        for _ in 0..n {
            let id = open_session(conn);
            close_session(conn, &id);
        }
    };
    let settled =
        |server: &Server| eventually(Duration::from_secs(10), || server.health(), |h| h["load"]["mcp_sessions"] == 0);
    // The warm-up grows the allocator's pools and rmcp's caches to their working size.
    cycle(&mut conn, 200);
    let before = settled(&server);
    let (tasks_before, rss_before) = (before["load"]["tasks"].as_u64().unwrap(), server.rss_kib());
    cycle(&mut conn, 5000);
    let after = settled(&server);
    assert_eq!(after["load"]["mcp_sessions"], 0, "{after}");
    let tasks_after = after["load"]["tasks"].as_u64().unwrap();
    // Before the fix every closed session left its notification task running.
    assert!(tasks_after <= tasks_before + 5, "live tasks went from {tasks_before} to {tasks_after}");
    let rss_after = server.rss_kib();
    eprintln!("5,000 sessions: tasks {tasks_before} -> {tasks_after}, RSS {rss_before} -> {rss_after} KiB");
    // The leak was about 60 MiB per 5,000 sessions.
    assert!(
        rss_after <= rss_before + 12 * 1024,
        "resident memory went from {rss_before} KiB to {rss_after} KiB over 5,000 sessions"
    );
}

// ---------------------------------------------------------------------------------------------
// 8. Slowloris

/// Opens `n` connections that each send half a request and stop.
fn half_open(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut stream = TcpStream::connect(addr).expect("connect");
            stream.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").expect("write");
            stream
        })
        .collect()
}

/// The test's own open-file limit, which bounds how many connections it can hold.
fn own_file_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap_or_default();
    line.split_whitespace().nth(3).and_then(|n| n.parse().ok()).unwrap_or(1024)
}

#[test]
fn half_open_connections_past_the_file_limit_do_not_starve_health() {
    // The report: 1,100 connections stopped mid-header against a 1,024 file limit, and /health
    // answered "Too many open files" until restart. Here the server gets 512 files, the default
    // cap (fitted under that limit) and the default 10 s header timeout.
    let server = Server::start_with_file_limit("", &[], Some(512));
    let count = 1000.min(own_file_limit().saturating_sub(100));
    assert!(count > 512, "the test needs more open files than the server has (ulimit -n: {})", own_file_limit());
    let _held = half_open(server.addr, count);
    for _ in 0..5 {
        let started = Instant::now();
        let health = server.health();
        assert_eq!(health["status"], "ok");
        assert!(started.elapsed() < Duration::from_secs(5), "/health took {:?}", started.elapsed());
        let open = health["load"]["connections"].as_u64().unwrap();
        assert!(open <= 512 - 128, "the cap stays under the file limit: {open} open");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn health_answers_while_1000_half_open_connections_are_held() {
    // 4,096 files leave room for 2,000 connections whatever the machine's default limit is.
    // Every connection here comes from 127.0.0.1, which by default may hold only half of them
    // unauthenticated (the address share, tested in `security_connections`): lift it.
    let config = "[server]\nmax_connections = 2000\nmax_connections_per_address = 2000\nheader_timeout_secs = 60\n";
    let server = Server::start_with_file_limit(config, &[], Some(4096));
    let count = 1000.min(own_file_limit().saturating_sub(100));
    let _held = half_open(server.addr, count);
    let health = eventually(
        Duration::from_secs(10),
        || server.health(),
        |h| h["load"]["connections"].as_u64() > Some(count as u64),
    );
    assert!(
        health["load"]["connections"].as_u64() > Some(count as u64),
        "all {count} half-open connections are held, and /health still answers: {health}"
    );
}

#[test]
fn stalled_headers_and_idle_connections_are_closed_after_their_timeouts() {
    let server = Server::start("[server]\nheader_timeout_secs = 1\nidle_timeout_secs = 2\n", &[]);
    // Stops mid-header.
    let mut stalled = server.connect();
    stalled.reader.get_mut().write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").unwrap();
    let closed = stalled.closed_within(Duration::from_secs(15));
    assert!(closed.is_some(), "a connection that stalls mid-header is closed");
    assert!(closed.unwrap() >= Duration::from_millis(500), "not before its timeout: {closed:?}");
    // Connects and sends nothing.
    let mut silent = server.connect();
    assert!(silent.closed_within(Duration::from_secs(15)).is_some(), "a silent connection is closed");
    // Keeps a connection alive after one request; trickling header bytes does not reset the clock.
    let mut idle = server.connect();
    assert_eq!(idle.send("GET", "/health", &[], "").status, 200);
    let closed = idle.closed_within(Duration::from_secs(15));
    assert!(closed.is_some_and(|d| d >= Duration::from_secs(1)), "an idle keep-alive connection is closed: {closed:?}");
    let mut trickle = server.connect();
    let started = Instant::now();
    let mut cut = false;
    for byte in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
        if trickle.reader.get_mut().write_all(&[*byte]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cut = cut || trickle.closed_within(Duration::from_secs(15)).is_some();
    assert!(cut, "a trickled header is cut off");
    assert!(started.elapsed() < Duration::from_secs(15));
    // The server still answers.
    assert_eq!(server.health()["status"], "ok");
}

// ---------------------------------------------------------------------------------------------
// 13. /health without the token

const BROKEN: &str = r#"
tool = { name = "broken", description = "Fails to load." }
local secret_plan = "DROP TABLE customers" ..
"#;

#[test]
fn health_without_the_token_says_only_status_and_problem_count() {
    let token = "a-long-enough-token-123";
    let config = format!("[server]\nauth_token = \"{token}\"\n\n[tools.script.broken]\npath = \"tools/broken.lua\"\n");
    let server = Server::start(&config, &[("tools/broken.lua", BROKEN)]);
    for headers in [vec![], vec![("Authorization", "Bearer wrong-token-wrong-token")]] {
        let reply = server.connect().send("GET", "/health", &headers, "");
        assert_eq!(reply.status, 200);
        let body: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(body, json!({"status": "degraded", "problem_count": 1}), "no messages, no source text");
        assert!(!reply.body.contains("DROP TABLE"));
        assert_eq!(server.connect().send("GET", "/tools/list", &headers, "").status, 401);
    }
    let bearer = format!("Bearer {token}");
    let reply = server.connect().send("GET", "/health", &[("Authorization", bearer.as_str())], "");
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!((body["status"].as_str(), body["problem_count"].as_u64()), (Some("degraded"), Some(1)), "{body}");
    assert_eq!(body["problems"][0]["name"], "broken", "the token shows everything: {body}");
    assert!(body["version"].is_string() && body["load"].is_object(), "{body}");
    for body in [body, json!({"status": "degraded", "problem_count": 1})] {
        let problems =
            ctx::schema::SchemaValidator::for_definition("Health").problems(&body, ctx::schema::Dialect::Json);
        assert!(problems.is_empty(), "{problems:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// 15b. JSON-RPC batches

#[test]
fn hardening_15b_a_batch_gets_a_clear_json_rpc_error_over_http_and_stdio() {
    let batch = json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "ping"}]);
    let server = Server::start("", &[]);
    let reply = server.connect().send("POST", "/mcp", &MCP_POST, &batch.to_string());
    assert_eq!(reply.status, 400, "{}", reply.body);
    let error: Value = serde_json::from_str(&reply.body).expect("a JSON-RPC error");
    assert_eq!(error["error"]["code"], -32600, "{error}");
    assert!(error["error"]["message"].as_str().unwrap().contains("batches are not supported"), "{error}");
    assert_eq!(error["id"], Value::Null);

    let ws = Workspace::new("");
    let mut child = Command::new(BIN)
        .args(["--config", "ctx.toml", "serve", "--stdio", "--no-reload"])
        .current_dir(ws.path())
        .env_remove("CTX_CONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ctx serve --stdio");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || -> Value { serde_json::from_str(&lines.next().expect("a reply").unwrap()).unwrap() };
    writeln!(
        stdin,
        "{}",
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": SESSION_VERSION, "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}})
    )
    .unwrap();
    assert_eq!(next()["id"], 0);
    writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).unwrap();
    writeln!(stdin, "{batch}").unwrap();
    writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": 3, "method": "ping"})).unwrap();
    let replies = [next(), next()];
    let refusal = replies.iter().find(|r| r.get("error").is_some()).expect("the batch is answered");
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    assert!(refusal["error"]["message"].as_str().unwrap().contains("send one request per message"), "{refusal}");
    assert!(replies.iter().any(|r| r["id"] == 3 && r["result"] == json!({})), "and the server goes on: {replies:?}");
    drop(stdin);
    let _ = child.wait();
}
