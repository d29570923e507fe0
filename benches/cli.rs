//! What a command that does not serve costs with ten upstream MCP servers configured: `ctx run`
//! (which starts only the servers its script names, or asks the running server), `ctx catalog`
//! (the running server's, else every server started) and `ctx tool list` (every server started).
//!
//! ```text
//! eval "$(scripts/test-env)"; cargo bench --bench cli
//! ```
//!
//! The ten servers are the real `mcp-server-time` (Python, `CTX_TEST_TIME_SERVER` from
//! `scripts/test-env`): a start costs what a real upstream's does. Each line is the median
//! wall time of 5 runs of the release binary. Target: `ctx run` of a script that names no
//! server, and every command with a server running, well under a second.

#[path = "support/bin.rs"]
#[allow(dead_code)] // its `serve` picks a port; here the server must listen at the config's bind
mod bin;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SERVERS: usize = 10;
const RUNS: usize = 5;

fn main() {
    let Some(time_server) = std::env::var("CTX_TEST_TIME_SERVER").ok().filter(|v| !v.is_empty()) else {
        eprintln!("cli bench: needs CTX_TEST_TIME_SERVER: run `eval \"$(scripts/test-env)\"` first");
        std::process::exit(2);
    };
    let ctx = bin::ctx_bin();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
    let mut config = format!("[server]\nbind = \"127.0.0.1:{port}\"\n\n");
    for i in 1..=SERVERS {
        let words: Vec<String> = time_server.split_whitespace().map(|w| format!("{w:?}")).collect();
        config.push_str(&format!("[mcp.servers.t{i}]\ncommand = {}\nargs = [{}]\n\n", words[0], words[1..].join(", ")));
    }
    std::fs::write(dir.path().join("ctx.toml"), config).unwrap();
    std::fs::write(dir.path().join("none.lua"), "return 1 + 1").unwrap();
    std::fs::write(dir.path().join("one.lua"), "return t3.get_current_time({timezone = 'UTC'}):await().timezone")
        .unwrap();
    let all: Vec<String> =
        (1..=SERVERS).map(|i| format!("t{i}.get_current_time({{timezone = 'UTC'}}):await()")).collect();
    std::fs::write(dir.path().join("all.lua"), format!("{}\nreturn 'ok'", all.join("\n"))).unwrap();

    println!(
        "cli bench: {SERVERS} configured upstream servers (mcp-server-time), median of {RUNS} runs; ctx {}",
        ctx.display()
    );
    let line = |what: &str, args: &[&str]| {
        let took = median(&ctx, dir.path(), args);
        println!("  {what:<58} {:>8.0} ms", took.as_secs_f64() * 1000.0);
        took
    };
    println!("no server running:");
    let none = line("ctx run: a script that names no server", &["run", "none.lua"]);
    line("ctx run: a script that names one server", &["run", "one.lua"]);
    line("ctx run: a script that names all ten (every run, before)", &["run", "all.lua"]);
    line("ctx catalog (starts all ten)", &["catalog"]);
    line("ctx tool list (starts all ten)", &["tool", "list"]);

    let mut serve = Command::new(&ctx)
        .current_dir(dir.path())
        .args(["-q", "serve"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start ctx serve");
    let started = Instant::now();
    while !health_ready(port) {
        assert!(started.elapsed() < Duration::from_secs(60), "ctx serve's upstreams did not all get ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("ctx serve running (its ten servers connected):");
    let remote = line("ctx run: a script that names one server", &["run", "one.lua"]);
    line("ctx run: a script that names all ten", &["run", "all.lua"]);
    let catalog = line("ctx catalog", &["catalog"]);
    line("ctx mcp list", &["mcp", "list"]);
    let _ = serve.kill();
    let _ = serve.wait();
    let fast = [none, remote, catalog].iter().all(|d| *d < Duration::from_millis(500));
    println!(
        "target: no-server script and server-backed commands under 500 ms: {}",
        if fast { "met" } else { "MISSED" }
    );
}

fn median(ctx: &Path, dir: &Path, args: &[&str]) -> Duration {
    let mut times: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            let out = Command::new(ctx).current_dir(dir).env_remove("CTX_CONFIG").args(args).output().expect("run ctx");
            assert!(out.status.success(), "ctx {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            started.elapsed()
        })
        .collect();
    times.sort();
    times[RUNS / 2]
}

/// Whether the server at `port` answers `/health` with every upstream ready.
fn health_ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = write!(stream, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text);
    let Some(body) = text.split("\r\n\r\n").nth(1) else { return false };
    let Ok(health) = serde_json::from_str::<serde_json::Value>(body) else { return false };
    health["upstreams"].as_array().is_some_and(|u| u.len() == SERVERS && u.iter().all(|s| s["state"] == "ready"))
}
