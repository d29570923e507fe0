//! Code-mode benchmark (issue 18): what running tools from one agent-sent script costs, and how
//! many bytes it keeps out of the model's context. Prints each number next to its target with
//! PASS or MISS.
//!
//! ```text
//! cargo bench --bench code_mode                 # everything
//! cargo bench --bench code_mode -- --quick      # fewer samples: under a minute
//! cargo bench --bench code_mode -- calls        # or overhead, upstream, context: one part
//! CTX_SPIN=together cargo bench --bench code_mode -- calls   # for a profiler, see below
//! ```
//!
//! `CTX_SPIN` runs one line of `calls` 3,000 times and prints its p50, for `perf record`:
//! `together` and `echo1` (the two 100-call scripts), `sources` (100 inner `sources` calls),
//! `direct` (100 echo calls without a script).
//!
//! Parts:
//! - calls: `execute` with a script that makes 100 inner calls of the echo Lua tool
//!   (`tools/echo.lua`), all started then awaited together, and awaited one by one. In process:
//!   a registry over a temp config and `Tools::call` from a task on a 2-thread tokio runtime, as
//!   `ctx serve` runs a request (as `benches/tools.rs` does). Target p50 <= 2 ms. Then where
//!   the time goes: the same 100 echo calls made directly, 100 inner calls of `sources` (a
//!   built-in that answers inline without a Lua VM, so what is left is code mode's own work per
//!   call) against 100 direct ones, and a bare wake-up round trip (a thread outside the runtime
//!   spawns a task and sleeps until it wakes it, as `:await()` does).
//! - overhead: `execute` whose script makes one inner echo call against echo called directly;
//!   also `execute` of a script that calls nothing, to split the difference into the script's
//!   own cost and the inner call's. Target: one inner call adds <= 0.2 ms p50.
//! - upstream: one script starts 10 calls of `slow(100 ms)` on the fault upstream
//!   (`tests/upstream/fault.rs`, built with the release profile), a real MCP server over stdio
//!   behind ctx's gateway (`Upstreams`), then awaits them. Target <= 130 ms. Run with the default
//!   `[code_mode] max_concurrent` (16 per server) and with 10; the same 10 calls made directly
//!   through `Tools::call` at once are the control.
//! - context: five tasks done two ways over `ctx serve mcp --stdio` (the release binary) on two
//!   synced workspaces, counting the bytes that reach the model: plain tool calls (the
//!   `tools/list` entries of the tools used, every call's `params` and every `result` as the
//!   server sends them) against one `execute` call (its `tools/list` entry, its `params` with the
//!   script, its `result` less `_meta`, whose trace is printed apart), and that plus discovery
//!   (`describe_tool`'s entry and one `describe_tool` call per tool the script uses). Each
//!   answer is checked to be the same both ways. Target: >= 80% fewer bytes on each
//!   multi-step task; the one-step task is reported too.

#[path = "support/corpus.rs"]
mod corpus;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ctx::tools::{CallOptions, Output, Tools};
use ctx::upstream::Upstreams;
use serde_json::{json, Value};

use corpus::{load_average, pct, verdict, Corpus, Generator};

const CALLS_TARGET: Duration = Duration::from_millis(2);
const OVERHEAD_TARGET: Duration = Duration::from_micros(200);
const UPSTREAM_TARGET: Duration = Duration::from_millis(130);
const SAVED_TARGET: f64 = 0.80;
/// What each upstream call waits, and how many one script starts at once.
const SLOW_MS: u64 = 100;
const FANOUT: usize = 10;

const ALL_AT_ONCE: &str = r#"
local pending = {}
for i = 1, 100 do pending[i] = ctx.echo({message = "hello"}) end
local done = await_all(pending)
return {n = #done}
"#;

const ONE_BY_ONE: &str = r#"
local n = 0
for i = 1, 100 do
  if ctx.echo({message = "hello"}):await().message == "hello" then n = n + 1 end
end
return {n = n}
"#;

const ONE_CALL: &str = r#"return ctx.echo({message = "hello"}):await()"#;
const NO_CALL: &str = r#"return {n = 1}"#;

/// Sample counts: (runs of each 100-call script, runs of each overhead line, upstream runs).
struct Samples {
    calls: usize,
    overhead: usize,
    upstream: usize,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let run = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    let samples = if quick {
        Samples { calls: 300, overhead: 3_000, upstream: 8 }
    } else {
        Samples { calls: 2_000, overhead: 20_000, upstream: 30 }
    };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!(
        "ctx code-mode benchmark{} ({cores} CPUs, load average {})",
        if quick { " --quick" } else { "" },
        load_average()
    );
    // What the servers run on: tokio workers, with the blocking pool behind them.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut verdicts = Vec::new();

    if run("calls") || run("overhead") {
        let echo = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tools/echo.lua")).expect("echo.lua");
        let extra = "[tools.script.echo]\npath = \"tools/echo.lua\"\ngreeting = \"hi\"\n";
        let corpus = Corpus::with_files(extra, &[("tools/echo.lua", &echo)]);
        let registry = ctx::app::build(corpus.kb.clone(), None);
        assert!(registry.problems().is_empty(), "{:?}", registry.problems());
        let tools = Arc::new(Tools::new(registry));
        if let Ok(which) = std::env::var("CTX_SPIN") {
            if which == "direct" {
                let s = hundred_direct(&runtime, &tools, 3000, "echo", json!({"message": "hello"}));
                println!("spin direct: p50 {} ms", millis(pct(&s, 50.0)));
                return;
            }
            let script = match which.as_str() {
                "sources" => "local p = {}\nfor i = 1, 100 do p[i] = ctx.sources({}) end\nreturn {n = #await_all(p)}",
                "echo1" => ONE_BY_ONE,
                _ => ALL_AT_ONCE,
            };
            let s = time_served(&runtime, &tools, 3000, "execute", json!({"script": script}), |v| v["n"] == 100);
            println!("spin {which}: p50 {} ms", millis(pct(&s, 50.0)));
            return;
        }
        if run("calls") {
            inner_calls(&runtime, &tools, samples.calls, &mut verdicts);
        }
        if run("overhead") {
            overhead(&runtime, &tools, samples.overhead, &mut verdicts);
        }
    }
    if run("upstream") {
        upstream(&runtime, samples.upstream, &mut verdicts);
    }
    if run("context") {
        context(&mut verdicts);
    }

    println!("\n== summary (load average now {}) ==", load_average());
    for line in &verdicts {
        println!("{line}");
    }
}

// ---------------------------------------------------------------------------------------------
// Timing, in process

/// 100 inner echo calls in one script, both ways, and a breakdown: the same 100 calls made
/// directly, 100 inner calls of a built-in that needs no Lua VM, and a bare wake-up round trip.
fn inner_calls(runtime: &tokio::runtime::Runtime, tools: &Arc<Tools>, runs: usize, verdicts: &mut Vec<String>) {
    println!("\n100 inner calls of the echo Lua tool in one `execute` script ({runs} runs each, Tools::call on a tokio worker):");
    let hundred = |v: &Value| v["n"] == 100;
    let lines =
        [("started together, then await_all", ALL_AT_ONCE), ("each awaited before the next starts", ONE_BY_ONE)];
    let mut per_call = Vec::new();
    for (label, script) in lines {
        let samples = time_served(runtime, tools, runs, "execute", json!({"script": script}), hundred);
        let p50 = pct(&samples, 50.0);
        per_call.push(p50 / 100);
        println!("  {label:<44} p50 {} ms  p95 {} ms", millis(p50), millis(pct(&samples, 95.0)));
        verdicts.push(format!(
            "{} 100 inner echo calls, {label}: p50 {} ms, p95 {} ms (target p50 <= {} ms)",
            verdict(p50 <= CALLS_TARGET),
            millis(p50),
            millis(pct(&samples, 95.0)),
            millis(CALLS_TARGET)
        ));
    }

    // Where the time goes. The same calls without a script: what the tool costs by itself.
    let direct = hundred_direct(runtime, tools, runs, "echo", json!({"message": "hello"}));
    println!(
        "  {:<44} p50 {} ms  p95 {} ms",
        "(no script) 100 direct calls of echo in a row",
        millis(pct(&direct, 50.0)),
        millis(pct(&direct, 95.0))
    );
    // A built-in that answers inline without a Lua VM: nearly all that is left is code mode's
    // own work per call (arguments to JSON, the task, the trace entry, the result into Lua).
    let script = "local p = {}\nfor i = 1, 100 do p[i] = ctx.sources({}) end\nreturn {n = #await_all(p)}";
    let sources = time_served(runtime, tools, runs, "execute", json!({"script": script}), hundred);
    let sources_direct = hundred_direct(runtime, tools, runs, "sources", json!({}));
    // The floor of awaiting one by one: a thread outside the runtime starts a task and sleeps
    // until the task wakes it, as a script's :await() does.
    let floor = wake_round_trips(runtime, runs);
    println!(
        "  breakdown, p50 per call: inner echo {} µs started together, {} µs one by one; echo called directly {} µs",
        micros(per_call[0]),
        micros(per_call[1]),
        micros(pct(&direct, 50.0) / 100)
    );
    println!(
        "    sources (a built-in, no Lua VM): inner {} µs (started together), directly {} µs; a bare wake-up round trip {} µs",
        micros(pct(&sources, 50.0) / 100),
        micros(pct(&sources_direct, 50.0) / 100),
        micros(pct(&floor, 50.0) / 100)
    );
}

/// 100 calls of `tool` in a row through [`Tools::call`] per sample, after a tenth as many
/// warm-up samples; the sorted samples.
fn hundred_direct(
    runtime: &tokio::runtime::Runtime,
    tools: &Arc<Tools>,
    runs: usize,
    tool: &'static str,
    params: Value,
) -> Vec<Duration> {
    let tools = Arc::clone(tools);
    let task = runtime.spawn(async move {
        let options = CallOptions { caller: "bench", ..Default::default() };
        let mut samples = Vec::with_capacity(runs);
        for round in 0..runs + runs / 10 {
            let started = Instant::now();
            for _ in 0..100 {
                if let Err(e) = tools.call(tool.to_string(), params.clone(), options.clone()).await {
                    panic!("{tool} failed: {e}");
                }
            }
            if round >= runs / 10 {
                samples.push(started.elapsed());
            }
        }
        samples.sort();
        samples
    });
    runtime.block_on(task).expect("the timing task")
}

/// 100 round trips per sample: a plain thread spawns a task on the runtime and waits on a
/// condition variable until the task has set it. The sorted samples.
fn wake_round_trips(runtime: &tokio::runtime::Runtime, runs: usize) -> Vec<Duration> {
    let handle = runtime.handle().clone();
    std::thread::spawn(move || {
        let mut samples = Vec::with_capacity(runs);
        for round in 0..runs + runs / 10 {
            let started = Instant::now();
            for _ in 0..100 {
                let pair = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
                let on_task = Arc::clone(&pair);
                handle.spawn(async move {
                    *on_task.0.lock().expect("lock") = true;
                    on_task.1.notify_all();
                });
                let mut done = pair.0.lock().expect("lock");
                while !*done {
                    done = pair.1.wait(done).expect("wait");
                }
            }
            if round >= runs / 10 {
                samples.push(started.elapsed());
            }
        }
        samples.sort();
        samples
    })
    .join()
    .expect("the round-trip thread")
}

/// One inner call through `execute` against the same call made directly.
fn overhead(runtime: &tokio::runtime::Runtime, tools: &Arc<Tools>, runs: usize, verdicts: &mut Vec<String>) {
    println!("\n`execute` with one inner call against calling the tool directly ({runs} runs each):");
    let echoed = |v: &Value| v["message"] == "hello";
    let direct = time_served(runtime, tools, runs, "echo", json!({"message": "hello"}), echoed);
    let empty = time_served(runtime, tools, runs, "execute", json!({"script": NO_CALL}), |v| v["n"] == 1);
    let one = time_served(runtime, tools, runs, "execute", json!({"script": ONE_CALL}), echoed);
    let line = |label: &str, s: &[Duration]| {
        println!("  {label:<44} p50 {:>7} µs  p95 {:>7} µs", micros(pct(s, 50.0)), micros(pct(s, 95.0)));
    };
    line("echo called directly", &direct);
    line("execute, a script that calls nothing", &empty);
    line("execute, a script that calls echo once", &one);
    let (d, e, o) = (pct(&direct, 50.0), pct(&empty, 50.0), pct(&one, 50.0));
    let added = o.saturating_sub(d);
    println!(
        "  added by execute at p50: {} µs = the script run itself {} µs + the inner call {} µs (direct call {} µs)",
        micros(added),
        micros(e),
        micros(o.saturating_sub(e)),
        micros(d)
    );
    verdicts.push(format!(
        "{} execute with one inner call adds {} ms p50 over calling echo directly (target <= {} ms); a script with no call costs {} ms",
        verdict(added <= OVERHEAD_TARGET),
        millis(added),
        millis(OVERHEAD_TARGET),
        millis(e)
    ));
}

/// Times `runs` calls of `tool` through [`Tools::call`] after a tenth as many warm-up calls, each
/// awaited in turn by one task on a runtime worker; checks the first result with `ok`.
fn time_served(
    runtime: &tokio::runtime::Runtime,
    tools: &Arc<Tools>,
    runs: usize,
    tool: &'static str,
    params: Value,
    ok: fn(&Value) -> bool,
) -> Vec<Duration> {
    let tools = Arc::clone(tools);
    let task = runtime.spawn(async move {
        let options = CallOptions { caller: "bench", ..Default::default() };
        let warm = (runs / 10).max(10);
        let mut samples = Vec::with_capacity(runs);
        for i in 0..warm + runs {
            let started = Instant::now();
            let output = match tools.call(tool.to_string(), params.clone(), options.clone()).await {
                Ok(output) => output,
                Err(e) => panic!("{tool} failed: {e}"),
            };
            let elapsed = started.elapsed();
            if i == 0 {
                let value = output.value();
                assert!(ok(&value), "{tool} answered {value}");
            }
            if i >= warm {
                samples.push(elapsed);
            }
        }
        samples.sort();
        samples
    });
    runtime.block_on(task).expect("the timing task")
}

/// 10 calls of the fault upstream's `slow` started together from one script, at the default
/// concurrency cap and at 10, with the same calls made directly as the control.
fn upstream(runtime: &tokio::runtime::Runtime, runs: usize, verdicts: &mut Vec<String>) {
    let fault = fault_bin();
    println!(
        "\n{FANOUT} calls of slow({SLOW_MS} ms) on a stdio MCP upstream (fault_upstream via ctx's gateway), started together ({runs} runs):"
    );
    let script = format!(
        "local pending = {{}}\nfor i = 1, {FANOUT} do pending[i] = f.slow({{ms = {SLOW_MS}}}) end\n\
         return {{n = #await_all(pending)}}\n"
    );
    let configs = [
        ("default [code_mode] (max_concurrent = 16)", ""),
        ("[code_mode] max_concurrent = 10", "\n[code_mode]\nmax_concurrent = 10\n"),
    ];
    for (label, extra) in configs {
        let config = format!("[mcp.servers.f]\ncommand = {:?}\n{extra}", fault.display().to_string());
        let corpus = Corpus::with_files(&config, &[]);
        let tools = Arc::new(Tools::new(ctx::app::build(corpus.kb.clone(), None)));
        let sections = corpus.kb.config().upstreams.clone();
        let upstreams = {
            let _inside = runtime.enter();
            Upstreams::start(&sections, Arc::new(|_| {}))
        };
        tools.attach_upstreams(Arc::clone(&upstreams));
        let deadline = Instant::now() + Duration::from_secs(30);
        while tools.current().spec("f__slow").is_none() {
            assert!(Instant::now() < deadline, "the fault upstream never listed its tools: {:?}", upstreams.status());
            std::thread::sleep(Duration::from_millis(20));
            tools.refresh_upstreams();
        }

        let fanned = |tools: &Arc<Tools>| {
            let tools = Arc::clone(tools);
            runtime.block_on(async move {
                let started = Instant::now();
                let calls: Vec<_> = (0..FANOUT)
                    .map(|_| {
                        let tools = Arc::clone(&tools);
                        tokio::spawn(async move {
                            let options = CallOptions { caller: "bench", ..Default::default() };
                            tools.call("f__slow".to_string(), json!({"ms": SLOW_MS}), options).await
                        })
                    })
                    .collect();
                for call in calls {
                    call.await.expect("task").expect("f__slow");
                }
                started.elapsed()
            })
        };
        let mut direct: Vec<Duration> = (0..runs).map(|_| fanned(&tools)).collect();
        direct.sort();
        let ok = |v: &Value| v["n"] == FANOUT;
        let samples = time_served_n(runtime, &tools, runs, json!({"script": script}), ok);
        let p50 = pct(&samples, 50.0);
        println!(
            "  {label:<42} execute p50 {:>6} ms  max {:>6} ms   direct Tools::call x{FANOUT} at once: p50 {:>6} ms",
            millis(p50),
            millis(*samples.last().unwrap()),
            millis(pct(&direct, 50.0))
        );
        verdicts.push(format!(
            "{} {FANOUT} upstream slow({SLOW_MS} ms) calls from one script, {label}: p50 {} ms (target <= {} ms); direct at once {} ms",
            verdict(p50 <= UPSTREAM_TARGET),
            millis(p50),
            millis(UPSTREAM_TARGET),
            millis(pct(&direct, 50.0))
        ));
        runtime.block_on(upstreams.shutdown());
    }
}

/// [`time_served`] of `execute` with 2 warm-up runs (each run here takes 100 ms or more).
fn time_served_n(
    runtime: &tokio::runtime::Runtime,
    tools: &Arc<Tools>,
    runs: usize,
    params: Value,
    ok: impl Fn(&Value) -> bool + Send + 'static,
) -> Vec<Duration> {
    let tools = Arc::clone(tools);
    let task = runtime.spawn(async move {
        let options = CallOptions { caller: "bench", ..Default::default() };
        let mut samples = Vec::with_capacity(runs);
        for i in 0..2 + runs {
            let started = Instant::now();
            let output: Output = match tools.call("execute".to_string(), params.clone(), options.clone()).await {
                Ok(output) => output,
                Err(e) => panic!("execute failed: {e}"),
            };
            let elapsed = started.elapsed();
            let value = output.value();
            assert!(ok(&value), "execute answered {value}");
            if i >= 2 {
                samples.push(elapsed);
            }
        }
        samples.sort();
        samples
    });
    runtime.block_on(task).expect("the timing task")
}

// ---------------------------------------------------------------------------------------------
// Context saved, over the real binary

/// A synced workspace and what its tasks ask about.
struct Workspace {
    _dir: tempfile::TempDir,
    config: PathBuf,
    label: String,
    /// The word the single-query tasks look for.
    topic: &'static str,
    /// The five queries of the "top hit of each" task.
    queries: [&'static str; 5],
}

/// Bytes that reach the model on one side of a task.
#[derive(Default, Clone, Copy)]
struct Tally {
    definitions: usize,
    arguments: usize,
    /// Each result as sent, less its `_meta`.
    results: usize,
    /// Each result's `_meta` (code mode's trace): MCP metadata meant for the client rather than
    /// the model's context, counted apart.
    meta: usize,
    calls: usize,
}

impl Tally {
    fn total(&self) -> usize {
        self.definitions + self.arguments + self.results
    }
}

struct Row {
    task: String,
    multi_step: bool,
    plain: Tally,
    code: Tally,
    discovery: Tally,
}

fn context(verdicts: &mut Vec<String>) {
    let ctx = ctx_bin();
    println!(
        "\ncontext saved: bytes that reach the model, plain tool calls against one execute script ({})",
        ctx.display()
    );
    println!("  plain = tools/list entries of the tools used + each call's params + each result, as `ctx serve mcp --stdio` sends them");
    println!(
        "  code = execute's tools/list entry + its params (the script) + its result (content and structuredContent)"
    );
    println!("  trace = the result's _meta (code mode's trace of inner calls): MCP metadata meant for the client, not");
    println!("    the model's context, so it is printed apart and not counted in `saved`");
    println!("  no defs = params and results only (tools/list entries are sent once per session, not per task)");
    println!("  +discovery = code + describe_tool's entry + one describe_tool call per tool the script uses");
    for workspace in [sample_workspace(&ctx), synthetic_workspace(&ctx)] {
        let mut session = Session::start(&ctx, &workspace.config);
        let rows = tasks(&mut session, &workspace);
        let sources = session.call(&mut Tally::default(), "sources", json!({}));
        let counts: Vec<String> = sources["sources"]
            .as_array()
            .expect("sources")
            .iter()
            .map(|s| {
                let health = if s["healthy"] == true { "" } else { ", failing" };
                format!("{} {} docs / {} chunks{health}", text(&s["name"]), s["documents"], s["chunks"])
            })
            .collect();
        println!("\n  {} ({})", workspace.label, counts.join("; "));
        println!(
            "  {:<58} {:>13} {:>22} {:>6} {:>6} {:>9} {:>11} {:>6}",
            "task", "plain (calls)", "code (def+script+res)", "trace", "saved", "no defs", "+discovery", "saved"
        );
        for row in &rows {
            let saved = saved(row.plain.total(), row.code.total());
            let calls_only = percent(saved_calls_only(row));
            let with_discovery = percent(self::saved(row.plain.total(), row.discovery.total()));
            println!(
                "  {:<58} {:>13} {:>22} {:>6} {:>6} {:>9} {:>11} {:>6}  {}",
                row.task,
                format!("{} ({})", thousands(row.plain.total()), row.plain.calls),
                format!(
                    "{} ({}+{}+{})",
                    thousands(row.code.total()),
                    thousands(row.code.definitions),
                    thousands(row.code.arguments),
                    thousands(row.code.results)
                ),
                thousands(row.code.meta),
                percent(saved),
                calls_only,
                thousands(row.discovery.total()),
                with_discovery,
                if row.multi_step { verdict(saved >= SAVED_TARGET) } else { "(one step, no target)" },
            );
            let corpus = workspace.label.split(':').next().unwrap_or_default();
            verdicts.push(if row.multi_step {
                format!(
                    "{} context, {corpus}, task {}: {} fewer bytes ({} -> {}; target >= {:.0}%); without definitions {calls_only}, with discovery {with_discovery}",
                    verdict(saved >= SAVED_TARGET),
                    row.task,
                    percent(saved),
                    thousands(row.plain.total()),
                    thousands(row.code.total()),
                    SAVED_TARGET * 100.0,
                )
            } else {
                format!(
                    "(one step, no target) context, {corpus}, task {}: {} fewer bytes ({} -> {}); without definitions {calls_only}",
                    row.task,
                    percent(saved),
                    thousands(row.plain.total()),
                    thousands(row.code.total()),
                )
            });
        }
        // The five tasks as one session: each definition the model needs is sent once.
        let calls = |t: &Tally| t.arguments + t.results;
        let plain =
            session.defined(&["search", "get", "sources"]) + rows.iter().map(|r| calls(&r.plain)).sum::<usize>();
        let code = session.defined(&["execute"]) + rows.iter().map(|r| calls(&r.code)).sum::<usize>();
        println!(
            "  all five as one session (search, get and sources defined once; execute once): {} -> {}, {} fewer bytes",
            thousands(plain),
            thousands(code),
            percent(saved(plain, code))
        );
    }
}

/// The five tasks on one workspace, each done both ways; panics when the answers differ.
fn tasks(session: &mut Session, w: &Workspace) -> Vec<Row> {
    let topic = w.topic;
    let mut rows = Vec::new();

    // 1. The three newest documents among the 50 best hits for the topic, with title and source.
    let mut plain = Tally::default();
    session.define(&mut plain, &["search"]);
    let hits = session.call(&mut plain, "search", json!({"query": topic, "limit": 50}));
    let mut docs: Vec<(String, String, String)> = Vec::new();
    for hit in hits["results"].as_array().expect("results") {
        if !docs.iter().any(|d| d.0 == hit["id"]) {
            docs.push((text(&hit["id"]), text(&hit["title"]), text(&hit["updated_at"])));
        }
    }
    docs.sort_by(|a, b| b.2.cmp(&a.2));
    let expected: Vec<String> = docs.iter().take(3).map(|d| d.1.clone()).collect();
    let script = format!(
        r#"local r = ctx.search({{query = {topic:?}, limit = 50}}):await()
local seen, docs = {{}}, {{}}
for _, hit in ipairs(r.results) do
  if not seen[hit.id] then
    seen[hit.id] = true
    docs[#docs + 1] = {{title = hit.title, source = hit.source, updated_at = hit.updated_at}}
  end
end
table.sort(docs, function(a, b) return a.updated_at > b.updated_at end)
return {{newest = {{docs[1], docs[2], docs[3]}}}}"#
    );
    let (code, answer, discovery) = session.script(&script, &["search"]);
    let got: Vec<String> = answer["newest"].as_array().expect("newest").iter().map(|d| text(&d["title"])).collect();
    assert_eq!(got, expected, "task 1 answers differ");
    rows.push(Row {
        task: format!("1 three newest of the 50 best hits for {topic:?}"),
        multi_step: true,
        plain,
        code,
        discovery,
    });

    // 2. The top hit's title for each of five queries.
    let mut plain = Tally::default();
    session.define(&mut plain, &["search"]);
    let expected: Vec<String> = w
        .queries
        .iter()
        .map(|q| text(&session.call(&mut plain, "search", json!({"query": q, "limit": 1}))["results"][0]["title"]))
        .collect();
    let list: Vec<String> = w.queries.iter().map(|q| format!("{q:?}")).collect();
    let script = format!(
        r#"local queries = {{{}}}
local pending = {{}}
for i, q in ipairs(queries) do pending[i] = ctx.search({{query = q, limit = 1}}) end
local top = {{}}
for i, r in ipairs(await_all(pending)) do top[queries[i]] = r.results[1] and r.results[1].title end
return top"#,
        list.join(", ")
    );
    let (code, answer, discovery) = session.script(&script, &["search"]);
    let got: Vec<String> = w.queries.iter().map(|q| text(&answer[*q])).collect();
    assert_eq!(got, expected, "task 2 answers differ");
    rows.push(Row {
        task: "2 top hit's title for each of 5 queries".to_string(),
        multi_step: true,
        plain,
        code,
        discovery,
    });

    // 3. The word count of the best hit's full text.
    let mut plain = Tally::default();
    session.define(&mut plain, &["search", "get"]);
    let best = session.call(&mut plain, "search", json!({"query": topic, "limit": 1}));
    let document = session.call(&mut plain, "get", json!({"id": best["results"][0]["id"]}));
    let expected = document["body"].as_str().expect("body").split_ascii_whitespace().count();
    let script = format!(
        r#"local hit = ctx.search({{query = {topic:?}, limit = 1}}):await().results[1]
local doc = ctx.get({{id = hit.id}}):await()
local words = 0
for _ in doc.body:gmatch("%S+") do words = words + 1 end
return {{title = doc.title, words = words}}"#
    );
    let (code, answer, discovery) = session.script(&script, &["search", "get"]);
    assert_eq!(answer["words"], expected, "task 3 answers differ");
    rows.push(Row {
        task: format!("3 word count of the best hit for {topic:?} (search, get)"),
        multi_step: true,
        plain,
        code,
        discovery,
    });

    // 4. Which sources are unhealthy, with their document counts.
    let mut plain = Tally::default();
    session.define(&mut plain, &["sources"]);
    let sources = session.call(&mut plain, "sources", json!({}));
    let expected: Vec<(String, u64)> = sources["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .filter(|s| s["healthy"] == false)
        .map(|s| (text(&s["name"]), s["documents"].as_u64().unwrap_or(0)))
        .collect();
    assert!(!expected.is_empty(), "the workspace should have an unhealthy source: {sources}");
    let script = r#"local unhealthy = {}
for _, s in ipairs(ctx.sources({}):await().sources) do
  if not s.healthy then unhealthy[#unhealthy + 1] = {name = s.name, documents = s.documents} end
end
return {unhealthy = unhealthy}"#;
    let (code, answer, discovery) = session.script(script, &["sources"]);
    let got: Vec<(String, u64)> = answer["unhealthy"]
        .as_array()
        .expect("unhealthy")
        .iter()
        .map(|s| (text(&s["name"]), s["documents"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(got, expected, "task 4 answers differ");
    rows.push(Row {
        task: "4 unhealthy sources and their document counts".to_string(),
        multi_step: true,
        plain,
        code,
        discovery,
    });

    // 5. One step: a search, its result wanted as it is.
    let mut plain = Tally::default();
    session.define(&mut plain, &["search"]);
    let expected = session.call(&mut plain, "search", json!({"query": topic}));
    let script = format!("return ctx.search({{query = {topic:?}}}):await()");
    let (code, answer, discovery) = session.script(&script, &["search"]);
    assert_eq!(answer["results"], expected["results"], "task 5 answers differ");
    rows.push(Row { task: format!("5 one step: search {topic:?}"), multi_step: false, plain, code, discovery });
    rows
}

/// The README's workspace: `ctx init --sample` (six handbook pages, a day apart), plus a small
/// wiki source and an archive source whose folder went away after its first sync (unhealthy,
/// with its documents still indexed).
fn sample_workspace(ctx: &Path) -> Workspace {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("ws");
    run(Command::new(ctx).arg("init").arg("--sample").arg(&root), true);
    let mut pages: Vec<PathBuf> =
        std::fs::read_dir(root.join("docs")).expect("docs").map(|e| e.expect("entry").path()).collect();
    pages.sort();
    for (i, page) in pages.iter().enumerate() {
        set_mtime(page, 1_780_000_000 - i as u64 * 86_400);
    }
    let wiki = [
        (
            "wiki/release-calendar.md",
            "# Release calendar\n\nWe deploy on Tuesdays and Thursdays. Freeze weeks are announced in #releases.\n",
        ),
        (
            "wiki/glossary.md",
            "# Glossary\n\n- Canary: the first 5% of traffic after a deploy.\n- SEV1: customer-facing outage.\n",
        ),
    ];
    let archive = [
        (
            "archive/old-deploy.md",
            "# Deploying with fabric (2019)\n\nRun `fab deploy:prod` from the jump host. Superseded by shipit.\n",
        ),
        (
            "archive/pager-rotation.md",
            "# Pager rotation (2020)\n\nThe old rotation was weekly, handed over on Mondays.\n",
        ),
        ("archive/vpn.md", "# VPN setup\n\nInstall the client and import the profile from the IT portal.\n"),
    ];
    // Every page has its own date, so "newest" has one answer.
    for (i, (rel, body)) in wiki.iter().chain(archive.iter()).enumerate() {
        let path = root.join(rel);
        write(&path, body);
        set_mtime(&path, 1_780_000_000 - (i as u64 * 2 + 1) * 43_200);
    }
    let config = root.join("ctx.toml");
    let mut text = std::fs::read_to_string(&config).expect("ctx.toml");
    text.push_str(
        "\n[connectors.filesystem.wiki]\nroot = \"wiki\"\n\n[connectors.filesystem.archive]\nroot = \"archive\"\n",
    );
    std::fs::write(&config, text).expect("ctx.toml");
    sync(ctx, &config, true);
    std::fs::remove_dir_all(root.join("archive")).expect("remove archive");
    sync(ctx, &config, false);
    Workspace {
        _dir: dir,
        config,
        label: "sample: ctx init --sample, plus a wiki and an archive source whose folder is gone".to_string(),
        topic: "deploy",
        queries: ["deploy", "rollback", "incident", "on-call", "token"],
    }
}

/// The bench corpus's documents as files: 2,000 markdown pages (one in ten in the wiki source)
/// with spread-out dates, plus 40 in an archive source that fails after its first sync.
fn synthetic_workspace(ctx: &Path) -> Workspace {
    const DOCS: usize = 2_000;
    const ARCHIVE: usize = 40;
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().to_path_buf();
    let mut gen = Generator::new(0x5EED_C0DE);
    for n in 0..DOCS + ARCHIVE {
        let size = gen.rng.range(1, 8) * 1400;
        let (_, body) = gen.document(size);
        let folder = if n >= DOCS {
            "archive"
        } else if n % corpus::WIKI_ONE_IN == 0 {
            "wiki"
        } else {
            "docs"
        };
        let path = root.join(format!("{folder}/{:02}/{n:05}.md", n % 50));
        write(&path, &body);
        set_mtime(&path, 1_700_000_000 + gen.rng.range(0, 60_000_000) as u64);
    }
    let config = root.join("ctx.toml");
    write(
        &config,
        "[db]\npath = \"kb.sqlite\"\n\n[connectors.filesystem.docs]\nroot = \"docs\"\n\n\
         [connectors.filesystem.wiki]\nroot = \"wiki\"\n\n[connectors.filesystem.archive]\nroot = \"archive\"\n",
    );
    sync(ctx, &config, true);
    std::fs::remove_dir_all(root.join("archive")).expect("remove archive");
    sync(ctx, &config, false);
    Workspace {
        _dir: dir,
        config,
        label: "synthetic: the bench corpus's generator, written as files".to_string(),
        topic: "rollback",
        queries: ["kafka", "rotate secret", "kubernetes ingress", "oncall runbook", "canary release"],
    }
}

fn sync(ctx: &Path, config: &Path, must_succeed: bool) {
    run(Command::new(ctx).arg("--config").arg(config).args(["sync", "-q"]), must_succeed);
}

fn run(command: &mut Command, must_succeed: bool) {
    let out = command.stdout(Stdio::null()).stderr(Stdio::piped()).output().expect("run ctx");
    assert!(!must_succeed || out.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent folder")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// Sets a file's modification time, which the filesystem connector takes as `updated_at`.
fn set_mtime(path: &Path, unix: u64) {
    let file = std::fs::File::options().write(true).open(path).expect("open");
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(unix)).expect("set mtime");
}

/// `ctx serve mcp --stdio` on a workspace, with its `tools/list` entries' sizes.
struct Session {
    lines: Lines,
    definitions: HashMap<String, usize>,
}

impl Session {
    fn start(ctx: &Path, config: &Path) -> Session {
        let mut command = Command::new(ctx);
        command.arg("--config").arg(config).args(["serve", "mcp", "--stdio"]);
        let mut lines = Lines::spawn(command);
        lines.initialize();
        let list = lines.request("tools/list", json!({}));
        let tools = list["result"]["tools"].as_array().unwrap_or_else(|| panic!("tools/list: {list}"));
        let definitions = tools.iter().map(|t| (text(&t["name"]), compact(t))).collect();
        Session { lines, definitions }
    }

    /// The bytes of the `tools/list` entries of `tools`.
    fn defined(&self, tools: &[&str]) -> usize {
        let mut tally = Tally::default();
        self.define(&mut tally, tools);
        tally.definitions
    }

    /// Counts the `tools/list` entries of `tools`.
    fn define(&self, tally: &mut Tally, tools: &[&str]) {
        for tool in tools {
            tally.definitions += self.definitions.get(*tool).unwrap_or_else(|| panic!("no tool {tool} listed"));
        }
    }

    /// Calls `tool` and counts its params and result; returns the result's value
    /// (`structuredContent`).
    fn call(&mut self, tally: &mut Tally, tool: &str, arguments: Value) -> Value {
        let params = json!({"name": tool, "arguments": arguments});
        tally.arguments += compact(&params);
        tally.calls += 1;
        let reply = self.lines.request("tools/call", params);
        let result = &reply["result"];
        assert!(result.is_object() && result["isError"] != true, "{tool} failed: {reply}");
        let meta = result.get("_meta").map_or(0, |m| compact(m) + r#","_meta":"#.len());
        tally.results += compact(result) - meta;
        tally.meta += meta;
        result["structuredContent"].clone()
    }

    /// Runs `script` through `execute`: its tally, its answer, and the tally with discovery
    /// (`describe_tool` of each of `uses`).
    fn script(&mut self, script: &str, uses: &[&str]) -> (Tally, Value, Tally) {
        let mut code = Tally::default();
        self.define(&mut code, &["execute"]);
        let answer = self.call(&mut code, "execute", json!({"script": script}));
        let mut discovery = code;
        self.define(&mut discovery, &["describe_tool"]);
        for tool in uses {
            self.call(&mut discovery, "describe_tool", json!({"name": tool}));
        }
        discovery.calls = code.calls;
        (code, answer, discovery)
    }
}

/// A raw JSON-RPC client over a child's stdin/stdout, one request at a time.
struct Lines {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
}

impl Lines {
    fn spawn(mut command: Command) -> Lines {
        let mut child =
            command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Lines { child, stdin, stdout, next: 1 }
    }

    fn send(&mut self, message: Value) {
        writeln!(self.stdin, "{message}").expect("write to the server");
        self.stdin.flush().expect("flush");
    }

    /// Sends a request and reads until its reply; notifications are skipped.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("read from the server");
            assert!(n > 0, "the server closed its stdout");
            let message: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if message["id"] == id && message.get("method").is_none() {
                return message;
            }
        }
    }

    fn initialize(&mut self) {
        let init = self.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}),
        );
        assert!(init["result"]["serverInfo"].is_object(), "{init}");
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// The release `ctx`, or `CTX_BENCH_BIN`.
fn ctx_bin() -> PathBuf {
    std::env::var_os("CTX_BENCH_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ctx")))
}

/// Builds the fault upstream with the release profile and returns its path.
fn fault_bin() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut build = Command::new(cargo);
    build.current_dir(root).args(["build", "--release", "--quiet", "--example", "fault_upstream"]);
    // cargo runs a bench with the package's own variables set (CARGO_PKG_*, OUT_DIR...). Build
    // scripts rerun when those change, so passing them on would rebuild much of the tree here,
    // and again at the next `cargo bench` (tests/it/fault_upstream.rs does the same).
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let injected = ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_BIN_EXE_", "CARGO_CRATE_", "CARGO_PRIMARY_"]
            .iter()
            .any(|prefix| name.starts_with(prefix));
        if injected || name == "OUT_DIR" || name == "CARGO_TARGET_TMPDIR" {
            build.env_remove(&*name);
        }
    }
    let status = build.status().expect("run cargo");
    assert!(status.success(), "cannot build the fault_upstream example");
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    target.join("release/examples/fault_upstream")
}

/// Bytes of `value` as compact JSON (how it travels on the wire).
fn compact(value: &Value) -> usize {
    serde_json::to_vec(value).map(|v| v.len()).unwrap_or(0)
}

fn text(value: &Value) -> String {
    value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string())
}

/// The share of `plain` bytes that `code` does without (negative when it costs more).
fn saved(plain: usize, code: usize) -> f64 {
    1.0 - code as f64 / plain as f64
}

/// [`saved`] counting calls only (params and results), as when the tool definitions are
/// already in the context: they are sent once per session, not once per task.
fn saved_calls_only(row: &Row) -> f64 {
    let calls = |t: &Tally| t.arguments + t.results;
    saved(calls(&row.plain), calls(&row.code))
}

fn percent(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn micros(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn millis(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}
