//! Gateway benchmark (issue 17): what a call through ctx costs over the same call made straight
//! to the same stdio upstream, whether concurrent callers share the one upstream connection, and
//! what each connected upstream costs in memory. Prints each number next to its target.
//!
//! ```text
//! cargo bench --bench gateway               # 5,000 calls per line
//! cargo bench --bench gateway -- --quick    # 1,000
//! ```
//!
//! The upstream is `fault_upstream` (`tests/upstream/fault.rs`, built here with the release
//! profile), whose `echo` answers at once, so the difference is ctx's. Both clients are the same
//! raw JSON-RPC line client over pipes, one call at a time:
//! - direct: client -> fault_upstream;
//! - through ctx: client -> `ctx serve mcp --stdio` -> fault_upstream as `[mcp.servers.f]`.
//!
//! Targets: added p50 <= 0.2 ms; 8 concurrent `slow` calls of 200 ms through ctx finish in well
//! under the 1.6 s they would take one after another (pipelined on the one connection). Memory:
//! ctx's RSS idle with no upstream and with 5 connected, and the RSS of each upstream's processes
//! (the guard ctx runs each child under, and the child), measured and printed.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ADDED_P50: Duration = Duration::from_micros(200);
const SLOW_MS: u64 = 200;
const CALLERS: usize = 8;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let calls = if quick { 1_000 } else { 5_000 };
    let ctx = ctx_bin();
    let fault = fault_bin();
    println!("gateway bench: {calls} sequential echo calls per line; ctx {}", ctx.display());
    println!("load average at start: {}", load_average());

    // Latency: direct, then through ctx; each after a warm-up.
    let mut direct = Lines::spawn(Command::new(&fault));
    direct.initialize();
    let direct_lat = direct.echo_calls("echo", calls);
    drop(direct);

    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ctx.toml");
    std::fs::write(
        &config,
        format!("[db]\npath = \"ctx.db\"\n\n[mcp.servers.f]\ncommand = {:?}\n", fault.display().to_string()),
    )
    .unwrap();
    let mut through = Lines::spawn({
        let mut c = Command::new(&ctx);
        c.current_dir(dir.path()).args(["--config", config.to_str().unwrap(), "serve", "mcp", "--stdio"]);
        c
    });
    through.initialize();
    through.wait_for_tool("f__echo");
    let through_lat = through.echo_calls("f__echo", calls);

    let (d50, t50) = (percentile(&direct_lat, 0.5), percentile(&through_lat, 0.5));
    let (d90, t90) = (percentile(&direct_lat, 0.9), percentile(&through_lat, 0.9));
    println!("direct echo            p50 {:>7.3} ms  p90 {:>7.3} ms", ms(d50), ms(d90));
    println!("through ctx echo       p50 {:>7.3} ms  p90 {:>7.3} ms", ms(t50), ms(t90));
    let added = t50.saturating_sub(d50);
    println!(
        "added by ctx           p50 {:>7.3} ms  (target <= {:.1} ms)  {}",
        ms(added),
        ms(ADDED_P50),
        verdict(added <= ADDED_P50)
    );

    // Pipelining: 8 callers at once on the one upstream connection.
    let started = Instant::now();
    let ids: Vec<u64> = (0..CALLERS)
        .map(|_| through.send_request("tools/call", json!({"name": "f__slow", "arguments": {"ms": SLOW_MS}})))
        .collect();
    for reply in through.wait_replies(&ids) {
        assert!(reply["result"]["content"][0]["text"].as_str().is_some_and(|t| t.starts_with("slept")), "{reply}");
    }
    let wall = started.elapsed();
    let serial = Duration::from_millis(SLOW_MS * CALLERS as u64);
    println!(
        "{CALLERS} concurrent slow({SLOW_MS} ms)  {:>7.0} ms  (one after another: {} ms)  {}",
        ms(wall),
        serial.as_millis(),
        verdict(wall < serial / 2)
    );
    drop(through);

    // Memory: ctx serve idle with no upstream, then with 5 connected.
    let idle = serve_rss(&ctx, &fault, 0);
    let five = serve_rss(&ctx, &fault, 5);
    println!("ctx serve RSS, no upstream          {:>6.1} MB", mb(idle.ctx));
    println!(
        "ctx serve RSS, 5 upstreams           {:>6.1} MB  ({:+.2} MB per upstream in ctx)",
        mb(five.ctx),
        (mb(five.ctx) - mb(idle.ctx)) / 5.0
    );
    println!(
        "per upstream, its processes          {:>6.1} MB  (guard {:.1} MB + child {:.1} MB)",
        mb(five.guards + five.children) / 5.0,
        mb(five.guards) / 5.0,
        mb(five.children) / 5.0
    );
    println!("load average at end: {}", load_average());
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The release `ctx` (what the quickstart runs), or `CTX_BENCH_BIN`.
fn ctx_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("CTX_BENCH_BIN") {
        return PathBuf::from(bin);
    }
    PathBuf::from(env!("CARGO_BIN_EXE_ctx"))
}

/// Builds the fault upstream with the release profile and returns its path.
fn fault_bin() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "--quiet", "--example", "fault_upstream"])
        .status()
        .expect("run cargo");
    assert!(status.success(), "cannot build the fault_upstream example");
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    target.join("release/examples/fault_upstream")
}

/// A raw JSON-RPC client over a child's stdin/stdout.
struct Lines {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
    line: String,
}

impl Lines {
    fn spawn(mut command: Command) -> Lines {
        let mut child =
            command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Lines { child, stdin, stdout, next: 1, line: String::new() }
    }

    fn send_request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next;
        self.next += 1;
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{message}").unwrap();
        self.stdin.flush().unwrap();
        id
    }

    fn notify(&mut self, method: &str) {
        writeln!(self.stdin, "{}", json!({"jsonrpc": "2.0", "method": method})).unwrap();
        self.stdin.flush().unwrap();
    }

    /// Reads until the reply to `id`; notifications and other replies are skipped.
    fn wait_reply(&mut self, id: u64) -> Value {
        loop {
            self.line.clear();
            let n = self.stdout.read_line(&mut self.line).unwrap();
            assert!(n > 0, "the server closed its stdout");
            let message: Value = serde_json::from_str(&self.line).expect("a JSON-RPC line");
            if message["id"] == id && message.get("method").is_none() {
                return message;
            }
        }
    }

    /// Reads until every one of `ids` is answered (in any order).
    fn wait_replies(&mut self, ids: &[u64]) -> Vec<Value> {
        let mut replies = Vec::new();
        while replies.len() < ids.len() {
            self.line.clear();
            let n = self.stdout.read_line(&mut self.line).unwrap();
            assert!(n > 0, "the server closed its stdout");
            let message: Value = serde_json::from_str(&self.line).expect("a JSON-RPC line");
            if message.get("method").is_none() && ids.iter().any(|id| message["id"] == *id) {
                replies.push(message);
            }
        }
        replies
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params);
        self.wait_reply(id)
    }

    fn initialize(&mut self) {
        let init = self.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}),
        );
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        self.notify("notifications/initialized");
    }

    fn wait_for_tool(&mut self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let list = self.request("tools/list", json!({}));
            if list["result"]["tools"].as_array().into_iter().flatten().any(|t| t["name"] == name) {
                return;
            }
            assert!(Instant::now() < deadline, "{name} never listed: {list}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `calls` sequential calls after 10% as warm-up; the sorted latencies.
    fn echo_calls(&mut self, tool: &str, calls: usize) -> Vec<Duration> {
        let call = |lines: &mut Lines| {
            let reply = lines.request("tools/call", json!({"name": tool, "arguments": {"text": "ping"}}));
            assert_eq!(reply["result"]["structuredContent"]["text"], "ping", "{reply}");
        };
        for _ in 0..calls / 10 {
            call(self);
        }
        let mut latencies: Vec<Duration> = (0..calls)
            .map(|_| {
                let started = Instant::now();
                call(self);
                started.elapsed()
            })
            .collect();
        latencies.sort();
        latencies
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Rss {
    ctx: u64,
    guards: u64,
    children: u64,
}

/// `ctx serve` with `n` fault upstreams, once they are all ready and it has settled: the RSS of
/// ctx, of its direct children (the guards) and of theirs (the upstreams).
fn serve_rss(ctx: &Path, fault: &Path, n: usize) -> Rss {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = String::from("[db]\npath = \"ctx.db\"\n\n");
    for i in 0..n {
        config.push_str(&format!("[mcp.servers.f{i}]\ncommand = {:?}\n\n", fault.display().to_string()));
    }
    std::fs::write(dir.path().join("ctx.toml"), config).unwrap();
    let mut child = Command::new(ctx)
        .current_dir(dir.path())
        .args(["serve", "--bind", "127.0.0.1:0", "--no-reload"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn ctx serve");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let addr = first.split_whitespace().find_map(|w| w.strip_prefix("http://")).expect("address").to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let health = get(&addr, "/health");
        let ready = health["upstreams"].as_array().map(|u| u.iter().filter(|s| s["state"] == "ready").count());
        if ready.unwrap_or(0) == n {
            break;
        }
        assert!(Instant::now() < deadline, "upstreams not ready: {health}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let pid = child.id();
    let guards = children_of(pid);
    let grandchildren: Vec<u32> = guards.iter().flat_map(|&g| children_of(g)).collect();
    let rss = Rss {
        ctx: rss_of(pid),
        guards: guards.iter().map(|&p| rss_of(p)).sum(),
        children: grandchildren.iter().map(|&p| rss_of(p)).sum(),
    };
    let _ = child.kill();
    let _ = child.wait();
    rss
}

fn get(addr: &str, path: &str) -> Value {
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else { return Value::Null };
    let _ = write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    text.split_once("\r\n\r\n").and_then(|(_, body)| serde_json::from_str(body).ok()).unwrap_or(Value::Null)
}

fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    kb * 1024
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        // The fields after the command name (which may hold spaces): state, then the parent.
        let parent = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if parent == Some(pid) {
            found.push(child);
        }
    }
    found
}
