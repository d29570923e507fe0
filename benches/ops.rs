//! Operations benchmark (issue 21): what the tool-call log and the metrics cost the call path.
//!
//! ```text
//! cargo bench --bench ops                  # 5 rounds of 8 s each way
//! cargo bench --bench ops -- --quick       # 2 rounds of 4 s
//! ```
//!
//! The release `ctx serve` on the `ctx init --sample` workspace answers three workloads under
//! `wrk -t2 -c8` on the same two cores, alternately with the log and metrics off (`[log] enabled
//! = false`, `server.metrics = false`) and on (the defaults), a fresh server for each run:
//! - `POST /tools/echo`, the sample's echo, annotated read-only: its entry is queued, target
//!   >= 95% of the rate with both off;
//! - `POST /tools/note`, the same echo without the read-only annotation: a call that may change
//!   something, whose entry is committed before it answers (a group commit), target >= 80%;
//! - `POST /tools/search`, read-only, 16 queries mixed on the sample: target >= 95%.
//!
//! Then the log at that peak: after each run with the log on, `/metrics` says how many entries
//! the writer wrote and dropped against the calls made; the target is none dropped.

#[path = "support/bin.rs"]
mod bin;
#[path = "support/corpus.rs"]
mod corpus;
#[path = "support/wrk.rs"]
#[allow(dead_code)]
mod wrk;

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bin::ctx_bin;
use corpus::{load_average, verdict};
use wrk::{checked, find_wrk, millis, wrk_run};

/// One workload: the tool, the wrk script's body, what an answer holds, and the target ratio.
struct Workload {
    tool: &'static str,
    body: &'static str,
    answer: &'static str,
    target: f64,
}

const WORKLOADS: [Workload; 3] = [
    Workload { tool: "echo", body: "{\"message\": \"hello\"}", answer: "\"message\":\"hello\"", target: 0.95 },
    Workload { tool: "note", body: "{\"message\": \"hello\"}", answer: "\"message\":\"hello\"", target: 0.80 },
    Workload { tool: "search", body: "{\"query\": \"roll back a deploy\"}", answer: "\"results\"", target: 0.95 },
];

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (rounds, secs) = if quick { (2, 4) } else { (5, 8) };
    let wrk = find_wrk();
    let dir = tempfile::tempdir().expect("temp dir");
    let ws = dir.path().join("ws");
    let init = Command::new(ctx_bin()).arg("init").arg("--sample").arg(&ws).output().expect("ctx init");
    assert!(init.status.success(), "ctx init: {}", String::from_utf8_lossy(&init.stderr));
    let base = std::fs::read_to_string(ws.join("ctx.toml")).expect("ctx.toml");
    let on = ws.join("on.toml");
    let off = ws.join("off.toml");
    std::fs::write(&on, &base).expect("write on.toml");
    // Both off: set in the sample config's own tables (it writes them out with their defaults).
    let mut table: toml::Table = base.parse().expect("the sample config parses");
    let section = |table: &mut toml::Table, name: &str| -> toml::Table {
        table.get(name).and_then(toml::Value::as_table).cloned().unwrap_or_default()
    };
    let mut server = section(&mut table, "server");
    server.insert("metrics".into(), toml::Value::Boolean(false));
    table.insert("server".into(), toml::Value::Table(server));
    let mut log = section(&mut table, "log");
    log.insert("enabled".into(), toml::Value::Boolean(false));
    table.insert("log".into(), toml::Value::Table(log));
    let off_text = toml::to_string(&table).expect("the config serializes");
    std::fs::write(&off, off_text).expect("write off.toml");
    // `note`: the sample's echo without its read-only annotation.
    let echo = std::fs::read_to_string(ws.join("tools/echo.lua")).expect("tools/echo.lua");
    let note = echo.replace("name = \"echo\"", "name = \"note\"").replace("read_only = true", "read_only = false");
    assert!(note.contains("read_only = false"), "the sample's echo is no longer annotated read-only");
    std::fs::write(ws.join("tools/note.lua"), note).expect("write tools/note.lua");
    let note_section = "\n[tools.script.note]\npath = \"tools/note.lua\"\n";
    for config in [&on, &off] {
        let text = std::fs::read_to_string(config).expect("config") + note_section;
        std::fs::write(config, text).expect("write config");
    }

    println!("ops bench: wrk -t2 -c8, {rounds} rounds of {secs} s each way per workload ({})", load_average());
    let mut dropped_total = 0.0;
    let mut all_met = true;
    for workload in &WORKLOADS {
        let script = ws.join(format!("wrk-{}.lua", workload.tool));
        let lua = format!(
            "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = '{}'\n",
            workload.body
        );
        std::fs::write(&script, checked(workload.answer, &lua)).expect("write wrk script");
        let path = format!("/tools/{}", workload.tool);
        println!("POST {path}:");
        let mut rates = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            for (label, config, with_log) in [("off", &off, false), ("on ", &on, true)] {
                let server = Server::start(config, &ws);
                let load = wrk_run(&wrk, &server.base, &path, Some(&script), secs);
                assert_eq!(load.errors, 0, "{path} failed {} times", load.errors);
                println!(
                    "  round {round}, log+metrics {label}: {:>8.0} calls/s  p50 {:.3} ms  p99 {:.3} ms  ({} calls)",
                    load.rate,
                    millis(load.p50),
                    millis(load.p99),
                    load.requests
                );
                if with_log {
                    rates.1.push(load.rate);
                    let (written, dropped) = server.log_counters(load.requests as f64);
                    dropped_total += dropped;
                    println!(
                        "      log: {written:.0} entries written, {dropped:.0} dropped, of {} calls",
                        load.requests
                    );
                } else {
                    rates.0.push(load.rate);
                }
            }
        }
        let (off_rate, on_rate) = (median(&mut rates.0), median(&mut rates.1));
        let ratio = on_rate / off_rate;
        all_met &= ratio >= workload.target;
        println!(
            "  median {off_rate:.0} calls/s off, {on_rate:.0} on: {:.1}%  (target >= {:.0}%)  {}",
            ratio * 100.0,
            workload.target * 100.0,
            verdict(ratio >= workload.target)
        );
    }
    println!();
    println!("every workload at its target: {}", verdict(all_met));
    println!("log entries dropped at the peak rate: {dropped_total:.0}  (target 0)  {}", verdict(dropped_total == 0.0));
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

struct Server {
    child: Child,
    base: String,
}

impl Server {
    fn start(config: &Path, dir: &Path) -> Server {
        let (child, base) = bin::serve(config, |command| {
            command.arg("--no-reload").current_dir(dir).env("CTX_MODEL_DIR", "/nonexistent");
        });
        Server { child, base }
    }

    /// The log's written and dropped counts once the writer has caught up with `calls` (or
    /// after 10 s), from `/metrics`.
    fn log_counters(&self, calls: f64) -> (f64, f64) {
        let started = Instant::now();
        loop {
            let text = get(&self.base, "/metrics");
            let value = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse::<f64>().ok()))
                    .unwrap_or(0.0)
            };
            let (written, dropped) = (value("ctx_call_log_written_total "), value("ctx_call_log_dropped_total "));
            if written + dropped >= calls || started.elapsed() > Duration::from_secs(10) {
                return (written, dropped);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain HTTP/1.1 GET, its body.
fn get(base: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let host = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(host).expect("connect");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}
