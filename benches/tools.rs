//! Tool-call benchmark over the synthetic 10k-chunk corpus of `benches/kb.rs`, in process.
//! Prints each number next to its target with PASS or MISS.
//!
//! ```text
//! cargo bench --bench tools                 # everything
//! cargo bench --bench tools -- echo         # or search, scaling: one part
//! ```
//!
//! Two call paths are timed, and every line says which:
//! - `Tools::call` is what the servers take (REST, MCP over HTTP and stdio): lookup and
//!   validation, then a short inline run on the calling async worker; a run that blocks (a host
//!   call such as `context.search`) or outlasts the inline budget moves to the blocking pool.
//!   Timed on a worker of a 2-thread tokio runtime, as `ctx serve` runs it.
//! - `Registry::call` is the blocking path: what `ctx tool test` takes and what the blocking
//!   pool runs. The scaling part uses it from plain threads.
//!
//! Parts:
//! - echo: a trivial Lua tool (`tools/echo.lua`). Target p50 <= 100 µs through `Tools::call`.
//! - kb-search: a Lua tool whose `execute` runs `context.search` (limit 10) over 10k chunks,
//!   round-robin over the 16 queries of the kb bench, and per query class (one term after stop
//!   words, or several). Target p50 <= 1.5 ms through `Tools::call`. The plain `Kb::search` p50
//!   of the same queries is printed beside it.
//! - scaling: echo and kb-search through `Registry::call` from 1, 2, 4 and 8 threads at once for
//!   a fixed time each, and as a control, 8 separate processes with one caller each on the same
//!   database: what this machine gives 8 callers that share nothing at all (no lock, no
//!   allocator, no cache line). Target (no lock serialises callers): 8 callers in one process
//!   reach at least 90% of the 8-process rate. Also printed: the callers' voluntary context
//!   switches per 1,000 calls (a thread that waits, on a lock or anything else, sleeps and
//!   counts one; one that only shares the cores is preempted, which does not count), and 8
//!   callers against cores x the single-caller rate.

#[path = "support/corpus.rs"]
mod corpus;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctx::tools::{CallOptions, Registry, Tools};
use serde_json::{json, Value};

use corpus::{load_average, pct, verdict, Corpus, QueryClass, QUERIES};

const ECHO_TARGET: Duration = Duration::from_micros(100);
const SEARCH_TARGET: Duration = Duration::from_micros(1500);
const SCALING_TARGET: f64 = 0.9;
const CHUNKS: usize = 10_000;

const KB_SEARCH: &str = r#"
tool = {
  name = "kb-search",
  description = "context.search with limit 10.",
  parameters = { { name = "query", type = "string", required = true } },
}
function tool.execute(params, context)
  local hits = context.search(params.query, { limit = 10 })
  return { count = #hits, top = hits[1] and hits[1].title }
end
"#;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--one-caller") {
        return one_caller(&args[at + 1..]);
    }
    // `cargo bench --bench tools -- echo` runs only the parts named: echo, search, scaling.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let run = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("ctx tool-call benchmark ({cores} CPUs, load average {})", load_average());

    let echo = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tools/echo.lua")).expect("tools/echo.lua");
    let extra = "[tools.script.echo]\npath = \"tools/echo.lua\"\ngreeting = \"hi\"\n\n\
                 [tools.script.kb-search]\npath = \"tools/kb-search.lua\"\n";
    let mut corpus = Corpus::with_files(extra, &[("tools/echo.lua", &echo), ("tools/kb-search.lua", KB_SEARCH)]);
    let growth = corpus.grow_to(CHUNKS);
    println!("corpus: {} documents, {} chunks", growth.docs, growth.chunks);
    let registry = Arc::new(ctx::app::build(corpus.kb.clone(), None));
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    let options = CallOptions { caller: "bench", ..Default::default() };
    let mut verdicts = Vec::new();

    // Echo, one caller.
    let echo_params = json!({"message": "hello"});
    let queries: Vec<Value> = QUERIES.iter().map(|q| json!({"query": q})).collect();
    // What the servers run on: tokio workers, with the blocking pool behind them.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let tools = Arc::new(Tools::new(ctx::app::build(corpus.kb.clone(), None)));
    if run("echo") {
        let params = echo_params.clone();
        let served = time_served(&runtime, &tools, 20_000, move |_| ("echo", params.clone()));
        let blocking = time_calls(20_000, |_| call(&registry, "echo", echo_params.clone(), &options));
        let p50 = pct(&served, 50.0);
        println!(
            "\necho through Tools::call (the servers' path, on a tokio worker): p50 {} µs, p95 {} µs, p99 {} µs over {} calls",
            micros(p50),
            micros(pct(&served, 95.0)),
            micros(pct(&served, 99.0)),
            served.len()
        );
        println!(
            "echo through Registry::call (the blocking path: ctx tool test, the blocking pool): p50 {} µs, p95 {} µs",
            micros(pct(&blocking, 50.0)),
            micros(pct(&blocking, 95.0)),
        );
        verdicts.push(format!(
            "{} echo through Tools::call p50 {} µs (target <= {} µs); Registry::call p50 {} µs",
            verdict(p50 <= ECHO_TARGET),
            micros(p50),
            micros(ECHO_TARGET),
            micros(pct(&blocking, 50.0))
        ));
    }

    // kb-search, one caller, and the plain search it wraps: the mix, then each query class.
    if run("search") {
        let mut classes: Vec<(String, Vec<usize>)> = vec![("all 16 queries".to_string(), (0..QUERIES.len()).collect())];
        classes.extend(QueryClass::ALL.map(|c| (c.label().to_string(), c.members())));
        println!("\nkb-search (context.search, limit 10, {CHUNKS} chunks), p50 / p95:");
        for (label, members) in &classes {
            let n = members.len() * 150;
            let texts: Vec<&'static str> = members.iter().map(|&q| QUERIES[q]).collect();
            let query = move |i: usize| texts[i % texts.len()];
            let plain = time_calls(n, |i| {
                let request = serde_json::from_value(json!({"query": query(i), "limit": 10})).unwrap();
                corpus.kb.search(&request).expect("search");
            });
            let served = time_served(&runtime, &tools, n, {
                let query = query.clone();
                move |i| ("kb-search", json!({"query": query(i)}))
            });
            let blocking = time_calls(n, |i| call(&registry, "kb-search", json!({"query": query(i)}), &options));
            let p50 = pct(&served, 50.0);
            println!(
                "  {label:<16} Tools::call {} / {} ms   Registry::call {} / {} ms   plain Kb::search {} / {} ms",
                millis(p50),
                millis(pct(&served, 95.0)),
                millis(pct(&blocking, 50.0)),
                millis(pct(&blocking, 95.0)),
                millis(pct(&plain, 50.0)),
                millis(pct(&plain, 95.0)),
            );
            verdicts.push(format!(
                "{} kb-search tool, {label}: Tools::call p50 {} ms (target <= {} ms); Registry::call {} ms; plain Kb::search {} ms",
                verdict(p50 <= SEARCH_TARGET),
                millis(p50),
                millis(SEARCH_TARGET),
                millis(pct(&blocking, 50.0)),
                millis(pct(&plain, 50.0))
            ));
        }
    }

    // Scaling: calls per second from 1, 2, 4 and 8 concurrent callers.
    let registry = Arc::new(registry);
    for (tool, params) in [("echo", vec![echo_params.clone()]), ("kb-search", queries.clone())] {
        if !run("scaling") {
            break;
        }
        println!("\n{tool}: concurrent callers through Registry::call (2 s each)");
        let mut single = 0.0;
        let mut eight = 0.0;
        for threads in [1, 2, 4, 8] {
            let (calls, switches) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let rate = throughput_counted(&registry, tool, &params, threads, Duration::from_secs(2), &calls, &switches);
            let per_1000 =
                switches.load(Ordering::Relaxed) as f64 * 1000.0 / calls.load(Ordering::Relaxed).max(1) as f64;
            println!(
                "  {threads} caller(s): {rate:>9.0} calls/s   {per_1000:.3} voluntary context switches per 1,000 calls"
            );
            if threads == 1 {
                single = rate;
            }
            if threads == 8 {
                eight = rate;
            }
        }
        let control = separate_processes(corpus.dir.path(), tool, 8, Duration::from_secs(2));
        println!("  8 processes x 1 caller (control): {control:>9.0} calls/s");
        let ideal = single * cores.min(8) as f64;
        let ratio = eight / control;
        verdicts.push(format!(
            "{} {tool}: 8 callers {:.0}/s = {:.0}% of 8 separate processes x 1 caller ({control:.0}/s) (target >= {:.0}%); \
             {:.0}% of {cores} x 1 caller ({single:.0}/s)",
            verdict(ratio >= SCALING_TARGET),
            eight,
            ratio * 100.0,
            SCALING_TARGET * 100.0,
            100.0 * eight / ideal,
        ));
    }

    println!("\n== summary (load average now {}) ==", load_average());
    for line in &verdicts {
        println!("{line}");
    }
}

/// The control run: `processes` copies of this bench, each one caller on its own registry over
/// the same database, started together; returns their summed rate.
fn separate_processes(dir: &std::path::Path, tool: &str, processes: usize, span: Duration) -> f64 {
    let exe = std::env::current_exe().expect("the bench's own path");
    // Every process starts measuring at the same moment, after its warm-up.
    let start = unix_millis() + 2_000;
    let children: Vec<_> = (0..processes)
        .map(|_| {
            std::process::Command::new(&exe)
                .arg("--one-caller")
                .arg(dir.join("ctx.toml"))
                .arg(tool)
                .arg(span.as_millis().to_string())
                .arg(start.to_string())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start a control process")
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().expect("control process");
            assert!(out.status.success(), "the control process failed");
            String::from_utf8_lossy(&out.stdout).trim().parse::<f64>().expect("a rate")
        })
        .sum()
}

/// Child side of [`separate_processes`]: `--one-caller <ctx.toml> <tool> <millis> <start>`.
/// Builds its registry, warms up until the shared start time, and prints calls/s.
fn one_caller(args: &[String]) {
    let file = std::path::PathBuf::from(&args[0]);
    let config = ctx::config::Config::load(&ctx::config::locate(Some(&file))).expect("config");
    let registry = Arc::new(ctx::app::build(ctx::kb::Kb::open(Arc::new(config)).expect("kb"), None));
    let params: Vec<Value> = match args[1].as_str() {
        "echo" => vec![json!({"message": "hello"})],
        _ => QUERIES.iter().map(|q| json!({"query": q})).collect(),
    };
    // Warm up (VM, statement cache) until the shared start.
    let start: u128 = args[3].parse().expect("start time");
    let options = CallOptions { caller: "bench", ..Default::default() };
    let mut i = 0;
    while unix_millis() < start {
        call(&registry, &args[1], params[i % params.len()].clone(), &options);
        i += 1;
    }
    let span = Duration::from_millis(args[2].parse().expect("millis"));
    println!("{}", throughput(&registry, &args[1], &params, 1, span));
}

fn call(registry: &Arc<Registry>, tool: &str, params: Value, options: &CallOptions) {
    if let Err(e) = registry.call(tool, params, options) {
        panic!("{tool} failed: {e}");
    }
}

/// Times `n` calls through [`Tools::call`] after 200 warm-up calls, each awaited in turn by one
/// task on a runtime worker (where `ctx serve` runs a request); returns the sorted samples.
fn time_served(
    runtime: &tokio::runtime::Runtime,
    tools: &Arc<Tools>,
    n: usize,
    call: impl Fn(usize) -> (&'static str, Value) + Send + 'static,
) -> Vec<Duration> {
    let tools = Arc::clone(tools);
    let task = runtime.spawn(async move {
        let options = CallOptions { caller: "bench", ..Default::default() };
        let mut samples = Vec::with_capacity(n);
        for i in 0..200 + n {
            let (tool, params) = call(i);
            let started = Instant::now();
            if let Err(e) = tools.call(tool.to_string(), params, options.clone()).await {
                panic!("{tool} failed: {e}");
            }
            if i >= 200 {
                samples.push(started.elapsed());
            }
        }
        samples.sort();
        samples
    });
    runtime.block_on(task).expect("the timing task")
}

/// Times `n` calls after 200 warm-up calls; returns the sorted samples.
fn time_calls(n: usize, mut f: impl FnMut(usize)) -> Vec<Duration> {
    for i in 0..200 {
        f(i);
    }
    let mut samples: Vec<Duration> = (0..n)
        .map(|i| {
            let started = Instant::now();
            f(i);
            started.elapsed()
        })
        .collect();
    samples.sort();
    samples
}

/// Voluntary context switches of the calling thread so far: a thread that waits for a lock (or
/// anything else) sleeps, and each sleep counts one.
fn voluntary_switches() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:").and_then(|v| v.trim().parse::<u64>().ok()))
        })
        .unwrap_or(0)
}

fn throughput(registry: &Arc<Registry>, tool: &str, params: &[Value], threads: usize, span: Duration) -> f64 {
    let zero = || Arc::new(AtomicU64::new(0));
    throughput_counted(registry, tool, params, threads, span, &zero(), &zero())
}

/// Calls per second from `threads` callers for `span`; `count` ends up with the calls made and
/// `switches` with the callers' voluntary context switches.
fn throughput_counted(
    registry: &Arc<Registry>,
    tool: &str,
    params: &[Value],
    threads: usize,
    span: Duration,
    count: &Arc<AtomicU64>,
    switches: &Arc<AtomicU64>,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (stop, count, switches, registry) = (stop.clone(), count.clone(), switches.clone(), registry.clone());
            scope.spawn(move || {
                let options = CallOptions { caller: "bench", ..Default::default() };
                let mut i = t;
                let before = voluntary_switches();
                while !stop.load(Ordering::Relaxed) {
                    call(&registry, tool, params[i % params.len()].clone(), &options);
                    count.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                switches.fetch_add(voluntary_switches() - before, Ordering::Relaxed);
            });
        }
        std::thread::sleep(span);
        stop.store(true, Ordering::Relaxed);
    });
    count.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn unix_millis() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
}

fn micros(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e6)
}

fn millis(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}
