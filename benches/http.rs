//! HTTP benchmark: the release `ctx serve` under `wrk -t2 -c8` on the same machine, over the
//! synthetic 10k-chunk corpus of `benches/kb.rs`. Prints each number next to its target with
//! PASS or MISS, and `GET /health` from the same run so the cost of the Lua path shows as a ratio.
//!
//! ```text
//! cargo bench --bench http                 # 10 s per endpoint, then 1M echo calls for the RSS check
//! cargo bench --bench http -- --quick      # 3 s per endpoint, 100k calls
//! ```
//!
//! wrk comes from Debian: when it is missing and we are root, the bench runs
//! `apt-get install -y wrk`; otherwise it says what to install.
//!
//! Every tool call's answer is read, not only its status: a REST call counts as failed unless it
//! is a 200 with the expected body, an MCP call unless it carries a JSON-RPC `result` without
//! `"isError":true` (the direct route and rmcp answer 200 either way). The summary requires 0.
//!
//! Lines (route, protocol era, corpus, query class):
//! - `GET /health`: the floor.
//! - `POST /tools/echo`; `POST /tools/search` over the 10k-chunk corpus, the 16 queries mixed, then
//!   the 6 that reduce to one term (the fast path) and the 10 of several terms apart.
//! - MCP `tools/call` echo on `/mcp`: stateless 2026-07-28 requests (answered by ctx's direct
//!   route), the same requests with one more `_meta` key (which sends them through rmcp: the cost
//!   the direct route saves), then one 2025-11-25 session shared by the 8 connections (rmcp, SSE
//!   replies).
//! - MCP over stdio, 2025-11-25, one call at a time.
//! - RSS: the server idle, after one echo and one search, after the runs and after the soak, on
//!   the bench corpus; idle and after one echo and one search on the `ctx init --sample`
//!   workspace (the README's); with where the idle bytes live (ctx's code, ctx's data,
//!   anonymous memory, shared libraries).
//!
//! Targets (issue 6): echo >= 20,000 calls/s with p50 <= 0.4 ms; search (10k chunks, the mix)
//! >= 5,000/s; RSS within 10% after 1M calls. Idle RSS is printed, no longer a target.
//!
//! Targets (issue 7): MCP `tools/call` echo over Streamable HTTP at c=8 (stateless 2026-07-28
//! requests, one JSON-RPC call per POST) >= 70% of the REST echo rate of the same run; over
//! stdio (`ctx serve mcp --stdio`) >= 5,000 sequential echo calls/s. The 2025-11-25 session rate
//! has no target; it is printed next to the stateless one.

#[path = "support/bin.rs"]
mod bin;
#[path = "support/corpus.rs"]
mod corpus;
#[path = "support/wrk.rs"]
mod wrk;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bin::ctx_bin;
use corpus::{frequent_mix, load_average, verdict, Corpus, QueryClass, QUERIES};
use wrk::{checked, find_wrk, millis, wrk_run, Load};

const CHUNKS: usize = 10_000;
const ECHO_RATE: f64 = 20_000.0;
const ECHO_P50: Duration = Duration::from_micros(400);
const SEARCH_RATE: f64 = 5_000.0;
const RSS_GROWTH: f64 = 0.10;
const MCP_RATIO: f64 = 0.70;
const STDIO_RATE: f64 = 5_000.0;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let span = if quick { 3 } else { 10 };
    let soak_calls: u64 = if quick { 100_000 } else { 1_000_000 };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("ctx HTTP benchmark ({cores} CPUs, load average {})", load_average());
    let wrk = find_wrk();
    println!("measuring {}", ctx_bin().display());

    let sample = sample_workspace_rss();

    let echo = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tools/echo.lua")).expect("tools/echo.lua");
    let extra = "[tools.script.echo]\npath = \"tools/echo.lua\"\ngreeting = \"hi\"\n";
    let mut corpus = Corpus::with_files(extra, &[("tools/echo.lua", &echo)]);
    let growth = corpus.grow_to(CHUNKS);
    println!("corpus: {} documents, {} chunks", growth.docs, growth.chunks);
    let scripts = write_wrk_scripts(corpus.dir.path());

    let server = Server::start(&corpus.dir.path().join("ctx.toml"));
    std::thread::sleep(Duration::from_millis(500));
    let idle_rss = server.rss_mb();
    println!("server pid {} on {}; idle RSS {idle_rss:.1} MB", server.child.id(), server.base);
    println!("  where it lives: {}", rss_breakdown(server.child.id()));
    one_echo_and_one_search(&server.base);
    let first_calls_rss = server.rss_mb();
    println!("RSS after one echo and one search: {first_calls_rss:.1} MB");
    let session = open_session(&server.base);
    write_session_script(corpus.dir.path(), &session);

    let run = |label: &str, path: &str, script: Option<&Path>, secs: u64| {
        let load = wrk_run(&wrk, &server.base, path, script, secs);
        println!(
            "{label:<44} {:>9.0} req/s   p50 {:>7.3} ms   p99 {:>7.3} ms   {} requests, {} errors",
            load.rate,
            millis(load.p50),
            millis(load.p99),
            load.requests,
            load.errors
        );
        assert_eq!(load.errors, 0, "{label}: wrk saw socket errors, non-2xx answers or failed calls");
        load
    };
    println!("\nwrk -t2 -c8, {span} s each:");
    let health = run("GET /health", "/health", None, span);
    let echo = run("POST /tools/echo", "/tools/echo", Some(&scripts.echo), span);
    let search = run("POST /tools/search (10k, 16 queries mixed)", "/tools/search", Some(&scripts.search), span);
    let mut search_by_class = Vec::new();
    for (class, script) in QueryClass::ALL.iter().zip(&scripts.search_by_class) {
        let label = format!("POST /tools/search (10k, {})", class.label());
        search_by_class.push((class.label(), run(&label, "/tools/search", Some(script), span)));
    }
    let frequent =
        run("POST /tools/search (10k, frequent-term mix)", "/tools/search", Some(&scripts.search_frequent), span);
    let mcp = run("MCP tools/call echo, 2026-07-28 stateless", "/mcp", Some(&scripts.mcp), span);
    let mcp_rmcp = run("MCP tools/call echo, 2026-07-28 via rmcp", "/mcp", Some(&scripts.mcp_rmcp), span);
    let mcp_session =
        run("MCP tools/call echo, 2025-11-25 session", "/mcp", Some(&corpus.dir.path().join("wrk-session.lua")), span);
    let warm_rss = server.rss_mb();

    // The soak: keep calling echo until `soak_calls` have been answered, then compare RSS.
    // Rounds of wrk until `soak_calls` have been answered (the rate drifts, so no single
    // duration is right).
    println!("\nsoak: echo until {soak_calls} calls have been answered; RSS after the runs above {warm_rss:.1} MB");
    let mut soak = Load { rate: 0.0, p50: Duration::ZERO, p99: Duration::ZERO, requests: 0, errors: 0 };
    while soak.requests < soak_calls {
        let left = soak_calls - soak.requests;
        let secs = ((left as f64 / echo.rate.max(1000.0)) * 1.2).ceil().clamp(5.0, 600.0) as u64;
        let round = run("POST /tools/echo (soak)", "/tools/echo", Some(&scripts.echo), secs);
        soak.requests += round.requests;
        soak.rate = round.rate;
    }
    let soak_rss = server.rss_mb();
    let growth = soak_rss / warm_rss - 1.0;
    println!("RSS after {} calls: {soak_rss:.1} MB ({:+.1}%)", soak.requests, growth * 100.0);
    drop(server);

    let stdio_calls = if quick { 5_000 } else { 20_000 };
    let stdio = stdio_rate(&corpus.dir.path().join("ctx.toml"), stdio_calls);
    println!(
        "\nMCP over stdio (2025-11-25): {stdio:.0} sequential echo calls/s ({stdio_calls} calls, every result checked)"
    );

    println!("\n== summary (load average now {}) ==", load_average());
    println!(
        "{} echo {:.0}/s (target >= {:.0}/s) = {:.0}% of /health ({:.0}/s)",
        verdict(echo.rate >= ECHO_RATE),
        echo.rate,
        ECHO_RATE,
        100.0 * echo.rate / health.rate,
        health.rate
    );
    println!(
        "{} echo p50 {:.3} ms (target <= {:.1} ms)",
        verdict(echo.p50 <= ECHO_P50),
        millis(echo.p50),
        millis(ECHO_P50)
    );
    println!(
        "{} search (10k chunks, 16 queries mixed) {:.0}/s (target >= {:.0}/s) = {:.0}% of /health; {}",
        verdict(search.rate >= SEARCH_RATE),
        search.rate,
        SEARCH_RATE,
        100.0 * search.rate / health.rate,
        search_by_class
            .iter()
            .map(|(label, load)| format!("{label} {:.0}/s p50 {:.3} ms", load.rate, millis(load.p50)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "{} search (10k chunks, issue 22's frequent-term mix: {}) {:.0}/s (target >= {:.0}/s), p50 {:.3} ms",
        verdict(frequent.rate >= SEARCH_RATE),
        frequent_mix().join(", "),
        frequent.rate,
        SEARCH_RATE,
        millis(frequent.p50)
    );
    println!(
        "{} MCP echo over HTTP, 2026-07-28 stateless {:.0}/s = {:.0}% of REST echo (target >= {:.0}%), \
         the same through rmcp {:.0}/s = {:.0}% of REST echo (no target); \
         2025-11-25 session {:.0}/s = {:.0}% of REST echo (no target)",
        verdict(mcp.rate >= MCP_RATIO * echo.rate),
        mcp.rate,
        100.0 * mcp.rate / echo.rate,
        MCP_RATIO * 100.0,
        mcp_rmcp.rate,
        100.0 * mcp_rmcp.rate / echo.rate,
        mcp_session.rate,
        100.0 * mcp_session.rate / echo.rate,
    );
    println!(
        "{} MCP echo over stdio {stdio:.0}/s sequential (target >= {STDIO_RATE:.0}/s)",
        verdict(stdio >= STDIO_RATE)
    );
    // Idle RSS is no target (a server resting at 20-30 MB is fine); what matters is that memory
    // stays flat under load, the soak below.
    println!(
        "     idle RSS {idle_rss:.1} MB on the bench corpus, {first_calls_rss:.1} MB after one echo and one search (no target)"
    );
    println!(
        "     idle RSS {:.1} MB on the sample workspace, {:.1} MB after one echo and one search (no target)",
        sample.0, sample.1
    );
    println!(
        "{} RSS {warm_rss:.1} -> {soak_rss:.1} MB over {} calls ({:+.1}%, target within {:.0}%)",
        verdict(soak.requests >= soak_calls && growth.abs() <= RSS_GROWTH),
        soak.requests,
        growth * 100.0,
        RSS_GROWTH * 100.0
    );
}

/// `ctx init --sample` (the README's workspace), synced, served: RSS idle and after one echo and
/// one search, in MB.
fn sample_workspace_rss() -> (f64, f64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let ws = dir.path().join("sample");
    let run = |args: &[&str]| {
        let status = Command::new(ctx_bin()).args(args).stdout(Stdio::null()).status().expect("run ctx");
        assert!(status.success(), "ctx {args:?} failed");
    };
    let ws_text = ws.to_str().expect("UTF-8 temp path");
    run(&["-q", "init", "--sample", ws_text]);
    let config = ws.join("ctx.toml");
    run(&["-q", "--config", config.to_str().expect("UTF-8"), "sync"]);
    let server = Server::start(&config);
    std::thread::sleep(Duration::from_millis(500));
    let idle = server.rss_mb();
    println!("sample workspace (ctx init --sample): idle RSS {idle:.1} MB");
    println!("  where it lives: {}", rss_breakdown(server.child.id()));
    one_echo_and_one_search(&server.base);
    let after = server.rss_mb();
    println!("  after one echo and one search: {after:.1} MB");
    (idle, after)
}

/// One `POST /tools/echo` and one `POST /tools/search`, each checked.
fn one_echo_and_one_search(base: &str) {
    let (status, body) = http_post(base, "/tools/echo", &[], &serde_json::json!({"message": "hello"}).to_string());
    assert!(status == 200 && body.contains("hello"), "echo: {status} {body}");
    let (status, body) = http_post(base, "/tools/search", &[], &serde_json::json!({"query": "deploy"}).to_string());
    assert!(status == 200 && body.contains("\"results\""), "search: {status} {body}");
    std::thread::sleep(Duration::from_millis(200));
}

/// One POST on a fresh connection (`Connection: close`); the status, the response head and the
/// body (chunked bodies are returned as sent, which is enough for `contains` checks).
fn http_post_full(base: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String, String) {
    use std::io::Read;
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to ctx");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    stream.write_all(format!("{head}\r\n{body}").as_bytes()).expect("send");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read the reply");
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

fn http_post(base: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let (status, _, body) = http_post_full(base, path, headers, body);
    (status, body)
}

/// A 2025-11-25 session: `initialize`, then `notifications/initialized`; its id.
fn open_session(base: &str) -> String {
    let accept = ("Accept", "application/json, text/event-stream");
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}});
    let (status, head, body) = http_post_full(base, "/mcp", &[accept], &init.to_string());
    assert_eq!(status, 200, "initialize: {body}");
    let id = head
        .lines()
        .find_map(|l| {
            l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id")).map(|(_, v)| v.trim())
        })
        .expect("a session id")
        .to_string();
    let note = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let headers = [accept, ("Mcp-Session-Id", id.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    let (status, body) = http_post(base, "/mcp", &headers, &note);
    assert_eq!(status, 202, "notifications/initialized: {body}");
    id
}

/// Where a process's resident memory lives, from `/proc/<pid>/smaps`: ctx's own code, ctx's
/// other pages (read-only data, relocated data), anonymous memory (heap, stacks) and shared
/// libraries with the loader.
fn rss_breakdown(pid: u32) -> String {
    let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
        return "n/a (no /proc/<pid>/smaps)".to_string();
    };
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    // KiB in: ctx's code, ctx's other pages, anonymous memory, shared libraries.
    let mut kib = [0u64; 4];
    let mut bucket = None;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let is_header =
            fields.first().is_some_and(|f| f.contains('-') && f.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
        if is_header {
            let perms = fields.get(1).copied().unwrap_or("");
            let name = fields.get(5).copied().unwrap_or("");
            let own = !exe.as_os_str().is_empty() && Path::new(name) == exe;
            bucket = Some(match name {
                _ if own && perms.contains('x') => 0,
                _ if own => 1,
                "" => 2,
                "[vdso]" | "[vvar]" | "[vsyscall]" => 3,
                _ if name.starts_with('[') => 2,
                _ => 3,
            });
        } else if let (Some(b), Some(&"Rss:")) = (bucket, fields.first()) {
            kib[b] += fields.get(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    let [code, data, anon, libs] = kib;
    let mb = |kib: u64| kib as f64 * 1024.0 / 1e6;
    format!(
        "{:.1} MB ctx code, {:.1} MB ctx data (read-only and relocated), {:.1} MB anonymous (heap, stacks), {:.1} MB shared libraries and loader",
        mb(code),
        mb(data),
        mb(anon),
        mb(libs)
    )
}

/// `ctx serve` from the release build, on a free loopback port, killed on drop.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(config: &Path) -> Server {
        let (child, base) = bin::serve(config, |_| {});
        Server { child, base }
    }

    /// Resident set size from /proc, in MB (10^6 bytes).
    fn rss_mb(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        kib * 1024.0 / 1e6
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Scripts {
    echo: PathBuf,
    search: PathBuf,
    /// One per [`QueryClass::ALL`], in that order.
    search_by_class: Vec<PathBuf>,
    /// Issue 22's frequent-term mix: words in most chunks, alone and in pairs.
    search_frequent: PathBuf,
    mcp: PathBuf,
    /// The same call with one more `_meta` key, which ctx hands to rmcp.
    mcp_rmcp: PathBuf,
}

/// wrk Lua scripts: a JSON POST for echo, a round-robin over the kb bench's queries (all, and
/// each query class), and a stateless MCP call.
fn write_wrk_scripts(dir: &Path) -> Scripts {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write wrk script");
        path
    };
    let echo = write(
        "wrk-echo.lua",
        checked(
            "\"message\":\"hello\"",
            "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
             wrk.body = '{\"message\": \"hello\"}'\n",
        ),
    );
    let round_robin = |queries: &[&str]| {
        let bodies: Vec<String> =
            queries.iter().map(|q| format!("'{}'", serde_json::json!({"query": q, "limit": 10}))).collect();
        checked(
            "\"results\"",
            &format!(
                "local bodies = {{ {} }}\nlocal i = 0\n\
                 request = function()\n  i = i + 1\n  return wrk.format(\"POST\", nil, \
                 {{[\"Content-Type\"] = \"application/json\"}}, bodies[(i % #bodies) + 1])\nend\n",
                bodies.join(", ")
            ),
        )
    };
    let search = write("wrk-search.lua", round_robin(QUERIES));
    let search_by_class = QueryClass::ALL
        .iter()
        .enumerate()
        .map(|(n, class)| {
            let queries: Vec<&str> = class.members().into_iter().map(|q| QUERIES[q]).collect();
            write(&format!("wrk-search-{n}.lua"), round_robin(&queries))
        })
        .collect();
    // A stateless (2026-07-28) tools/call: no session, so every connection is independent.
    let stateless = |body: serde_json::Value| {
        checked(
            "\"result\"",
            &format!(
                "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
                 wrk.headers[\"Accept\"] = \"application/json, text/event-stream\"\n\
                 wrk.headers[\"MCP-Protocol-Version\"] = \"2026-07-28\"\n\
                 wrk.headers[\"Mcp-Method\"] = \"tools/call\"\nwrk.headers[\"Mcp-Name\"] = \"echo\"\n\
                 wrk.body = '{body}'\n"
            ),
        )
    };
    let mcp = write("wrk-mcp.lua", stateless(mcp_call(1)));
    // Any `_meta` key beyond the version, capabilities and client info makes the request one the
    // direct route does not answer (src/mcp/direct.rs, META_KEYS): rmcp does, as it answers every
    // other request.
    let mut via_rmcp = mcp_call(1);
    via_rmcp["params"]["_meta"]["io.example/bench"] = serde_json::json!("rmcp");
    let mcp_rmcp = write("wrk-mcp-rmcp.lua", stateless(via_rmcp));
    let search_frequent = write("wrk-search-frequent.lua", round_robin(&frequent_mix()));
    Scripts { echo, search, search_by_class, search_frequent, mcp, mcp_rmcp }
}

/// `wrk-session.lua`: 2025-11-25 `tools/call` echo in the session `id`, shared by every
/// connection. Each request gets its own JSON-RPC id (one session, many calls in flight).
fn write_session_script(dir: &Path, id: &str) {
    let call = |n: &str| {
        format!(
            "'{{\"jsonrpc\":\"2.0\",\"id\":' .. {n} .. ',\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"message\":\"hello\"}}}}}}'"
        )
    };
    let rest = format!(
        "local headers = {{[\"Content-Type\"] = \"application/json\", [\"Accept\"] = \"application/json, text/event-stream\", \
         [\"Mcp-Session-Id\"] = \"{id}\", [\"MCP-Protocol-Version\"] = \"2025-11-25\"}}\n\
         local next_id = 0\n\
         local thread_no = 0\n\
         function setup_ids(thread) thread_no = thread_no + 1 thread:set(\"base\", thread_no * 1000000000) end\n\
         request = function()\n  next_id = next_id + 1\n  return wrk.format(\"POST\", nil, headers, {})\nend\n",
        call("(base + next_id)")
    );
    // `setup` is taken by the failure count: chain it.
    let text = checked("\"result\"", &rest).replacen(
        "function setup(thread) table.insert(threads, thread) end",
        "function setup(thread) table.insert(threads, thread) setup_ids(thread) end",
        1,
    );
    std::fs::write(dir.join("wrk-session.lua"), text).expect("write wrk script");
}

/// A 2026-07-28 `tools/call` of echo (it carries its protocol metadata, so it needs no session).
fn mcp_call(id: u64) -> serde_json::Value {
    serde_json::json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {
            "name": "echo", "arguments": {"message": "hello"},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
        }
    })
}

/// Sequential echo calls over `ctx serve mcp --stdio` (initialize once, then one call at a time).
fn stdio_rate(config: &Path, calls: u64) -> f64 {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(ctx_bin())
        .arg("--config")
        .arg(config)
        .args(["-q", "serve", "mcp", "--stdio", "--no-reload"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start ctx serve mcp --stdio");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let mut exchange = |message: serde_json::Value, wait: bool| {
        writeln!(stdin, "{message}").expect("write to ctx");
        stdin.flush().expect("flush");
        if wait {
            line.clear();
            stdout.read_line(&mut line).expect("read from ctx");
            // A JSON-RPC result is not a success by itself: a failed call is a result with isError.
            let answer: serde_json::Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            assert!(answer.get("result").is_some() && answer["result"]["isError"] != true, "unexpected answer: {line}");
        }
    };
    exchange(
        serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}),
        true,
    );
    exchange(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}), false);
    let call = |id: u64| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "hello"}}})
    };
    for id in 1..=200 {
        exchange(call(id), true);
    }
    let started = Instant::now();
    for id in 0..calls {
        exchange(call(1000 + id), true);
    }
    let rate = calls as f64 / started.elapsed().as_secs_f64();
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    rate
}
