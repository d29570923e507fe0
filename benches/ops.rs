//! Operations benchmark (issue 21): what the tool-call log and the metrics cost the call path.
//!
//! ```text
//! cargo bench --bench ops                  # 5 rounds of 8 s each way
//! cargo bench --bench ops -- --quick       # 2 rounds of 4 s
//! ```
//!
//! The release `ctx serve` on the `ctx init --sample` workspace answers `POST /tools/echo`
//! under `wrk -t2 -c8` on the same two cores, alternately with the log and metrics off
//! (`[log] enabled = false`, `server.metrics = false`) and on (the defaults), a fresh server
//! for each run. Prints each run, the median rate each way and their ratio against the target:
//! with both on, echo keeps >= 95% of the throughput it has with both off.
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

const RATIO: f64 = 0.95;

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
    // The sample config has a [server] table: turn metrics off inside it, and the log off.
    let off_text = base.replacen("[server]\n", "[server]\nmetrics = false\n", 1) + "\n[log]\nenabled = false\n";
    assert!(off_text.contains("metrics = false"), "the sample config has no [server] table");
    std::fs::write(&off, off_text).expect("write off.toml");
    let script = ws.join("wrk-echo.lua");
    std::fs::write(
        &script,
        checked(
            "\"message\":\"hello\"",
            "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
             wrk.body = '{\"message\": \"hello\"}'\n",
        ),
    )
    .expect("write wrk script");

    println!("ops bench: POST /tools/echo, wrk -t2 -c8, {rounds} rounds of {secs} s each way ({})", load_average());
    let mut rates = (Vec::new(), Vec::new());
    let mut dropped_total = 0.0;
    for round in 1..=rounds {
        for (label, config, with_log) in [("off", &off, false), ("on ", &on, true)] {
            let server = Server::start(config, &ws);
            let load = wrk_run(&wrk, &server.base, "/tools/echo", Some(&script), secs);
            assert_eq!(load.errors, 0, "echo failed {} times", load.errors);
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
                println!("      log: {written:.0} entries written, {dropped:.0} dropped, of {} calls", load.requests);
            } else {
                rates.0.push(load.rate);
            }
        }
    }
    let (off_rate, on_rate) = (median(&mut rates.0), median(&mut rates.1));
    let ratio = on_rate / off_rate;
    println!();
    println!("median echo rate, log and metrics off: {off_rate:>8.0} calls/s");
    println!("median echo rate, log and metrics on:  {on_rate:>8.0} calls/s");
    println!("ratio on/off: {:.1}%  (target >= {:.0}%)  {}", ratio * 100.0, RATIO * 100.0, verdict(ratio >= RATIO));
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
