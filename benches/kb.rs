//! Knowledge-base benchmark: keyword search latency over synthetic corpora, and `ctx sync`
//! throughput and peak memory over 10,000 small markdown files. Plain `Instant` timing, no
//! framework; every number is printed next to its target with PASS or MISS.
//!
//! ```text
//! cargo bench --bench kb              # 10k and 100k chunk corpora, then sync of 10k files
//! cargo bench --bench kb -- --full    # also the 1M chunk corpus (or CTX_BENCH_FULL=1)
//! cargo bench --bench kb -- --skip-sync | --skip-search
//! ```
//!
//! What each number means: bench/README.md.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/corpus.rs"]
mod corpus;

use corpus::*;
use ctx::kb::query::fts_query;
use ctx::kb::store::SearchFilter;
use ctx::types::SearchRequest;
use serde_json::{json, Value};

/// Corpus sizes in chunks; the last one only with `--full`.
const SEARCH_SIZES: &[usize] = &[10_000, 100_000];
const FULL_SIZE: usize = 1_000_000;
/// Search p50 targets from the issue: ≤ 1 ms at 10k chunks, ≤ 20 ms at 1M chunks.
fn search_target(chunks: usize) -> Option<Duration> {
    match chunks {
        10_000 => Some(Duration::from_millis(1)),
        FULL_SIZE => Some(Duration::from_millis(20)),
        _ => None,
    }
}

const SYNC_FILES: usize = 10_000;
const SYNC_TARGET_FILES_PER_SEC: f64 = 5_000.0;
const SYNC_TARGET_RSS_MB: f64 = 100.0;
/// Cold and no-change syncs are each run this many times; the median is compared to the target.
const SYNC_RUNS: usize = 3;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let full = has("--full") || std::env::var("CTX_BENCH_FULL").is_ok_and(|v| !v.is_empty() && v != "0");
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    println!(
        "ctx knowledge-base benchmark ({threads} CPUs, load average {}; {})",
        load_average(),
        if full { "--full" } else { "default, no 1M" }
    );
    let mut verdicts = Vec::new();
    if !has("--skip-search") {
        bench_search(full, &mut verdicts);
    }
    if !has("--skip-sync") {
        bench_sync(&mut verdicts);
    }
    println!("\n== summary (load average now {}) ==", load_average());
    for line in &verdicts {
        println!("{line}");
    }
}

/// Issue 22's targets per query class: (p50, p99).
fn scale_targets(chunks: usize) -> Option<(Duration, Duration)> {
    match chunks {
        10_000 => Some((Duration::from_millis(1), Duration::from_millis(5))),
        FULL_SIZE => Some((Duration::from_millis(10), Duration::from_millis(50))),
        _ => None,
    }
}

fn request(query: &str, source: Option<&str>) -> SearchRequest {
    let mut value = json!({ "query": query, "limit": LIMIT });
    if let Some(source) = source {
        value["source"] = json!(source);
    }
    serde_json::from_value(value).expect("valid SearchRequest")
}

/// Runs `f` once per query per round, round-robin, after one warm-up round; stops after
/// `max_rounds`, or after `budget` once `min_rounds` are done. Returns samples per query.
fn sample<T>(
    n_queries: usize,
    budget: Duration,
    min_rounds: usize,
    max_rounds: usize,
    mut f: impl FnMut(usize) -> T,
) -> Vec<Vec<Duration>> {
    for q in 0..n_queries {
        std::hint::black_box(f(q));
    }
    let mut samples = vec![Vec::new(); n_queries];
    let started = Instant::now();
    let mut rounds = 0;
    while rounds < max_rounds && (rounds < min_rounds || started.elapsed() < budget) {
        for (q, out) in samples.iter_mut().enumerate() {
            let t = Instant::now();
            std::hint::black_box(f(q));
            out.push(t.elapsed());
        }
        rounds += 1;
    }
    samples
}

fn sorted(samples: &[Vec<Duration>]) -> Vec<Duration> {
    let mut all: Vec<Duration> = samples.iter().flatten().copied().collect();
    all.sort();
    all
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn bench_search(full: bool, verdicts: &mut Vec<String>) {
    let mut sizes = SEARCH_SIZES.to_vec();
    if full {
        sizes.push(FULL_SIZE);
    }
    let mut corpus = Corpus::new();
    println!(
        "\nsynthetic corpus: {VOCAB_SIZE} words, Zipf s = {ZIPF_S}, documents of 1-8 chunks \
         (chunking max_tokens {} overlap {}), 1 in {WIKI_ONE_IN} documents in filesystem:wiki",
        corpus.spec.max_tokens, corpus.spec.overlap_tokens
    );
    let plain: Vec<SearchRequest> = QUERIES.iter().map(|q| request(q, None)).collect();
    let filtered: Vec<SearchRequest> = QUERIES.iter().map(|q| request(q, Some("wiki"))).collect();
    // The expression search tries first (every term); the OR fallback only runs when it finds nothing.
    let fts: Vec<String> = QUERIES.iter().map(|q| fts_query(q).expect("query has terms").all).collect();
    for size in sizes {
        let growth = corpus.grow_to(size);
        let kb = &corpus.kb;
        let stats = kb.stats().expect("stats");
        println!(
            "\n== keyword search at {} chunks ({} documents, database {:.1} MB) ==",
            stats.chunks,
            stats.documents,
            stats.database_bytes as f64 / 1e6
        );
        println!(
            "corpus growth: +{} documents / +{} chunks; generating + chunking {:.1} s, Store::apply {:.1} s \
             ({:.0} chunks/s written), total {:.1} s",
            growth.docs,
            growth.chunks,
            growth.generate.as_secs_f64(),
            growth.apply.as_secs_f64(),
            growth.chunks as f64 / growth.apply.as_secs_f64(),
            (growth.generate + growth.apply).as_secs_f64()
        );
        let (budget, max_rounds) = if size >= FULL_SIZE {
            (Duration::from_secs(60), 200)
        } else if size >= 100_000 {
            (Duration::from_secs(20), 500)
        } else {
            (Duration::from_secs(10), 500)
        };
        let plain_samples = sample(plain.len(), budget, 5, max_rounds, |q| kb.search(&plain[q]).expect("search"));
        let filtered_samples =
            sample(filtered.len(), budget / 2, 5, max_rounds, |q| kb.search(&filtered[q]).expect("search"));

        // Per-query detail: matching chunks (read straight from the index) and hits returned.
        let db = rusqlite::Connection::open_with_flags(corpus.db_path(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open db read-only");
        let mut table = String::new();
        let _ = writeln!(
            table,
            "  {:<30} {:>22} {:>9} {:>5} {:>11} {:>11} {:>11}",
            "query", "term ranks", "matching", "hits", "p50", "p95", "wiki p50"
        );
        for (i, query) in QUERIES.iter().enumerate() {
            let matching: i64 = db
                .query_row("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?1", [&fts[i]], |r| r.get(0))
                .expect("count matches");
            let hits = kb.search(&plain[i]).expect("search").results.len();
            let ranks: Vec<String> = query
                .split_whitespace()
                .map(|w| corpus.gen.vocab.rank(w).map_or("-".to_string(), |r| (r + 1).to_string()))
                .collect();
            let mut own = plain_samples[i].clone();
            own.sort();
            let mut wiki = filtered_samples[i].clone();
            wiki.sort();
            let _ = writeln!(
                table,
                "  {:<30} {:>22} {:>9} {:>5} {:>11} {:>11} {:>11}",
                format!("{query:?}"),
                ranks.join(","),
                matching,
                hits,
                ms(pct(&own, 50.0)),
                ms(pct(&own, 95.0)),
                ms(pct(&wiki, 50.0)),
            );
        }
        print!("{table}");

        let all = sorted(&plain_samples);
        let wiki = sorted(&filtered_samples);
        let target = search_target(size);
        let target_text = |p50: Duration| match target {
            Some(t) => format!("target p50 <= {}: {}", ms(t), verdict(p50 <= t)),
            None => "no target at this size".to_string(),
        };
        println!(
            "Kb::search, all queries ({} samples): p50 {}  p95 {}  p99 {}  -> {}",
            all.len(),
            ms(pct(&all, 50.0)),
            ms(pct(&all, 95.0)),
            ms(pct(&all, 99.0)),
            target_text(pct(&all, 50.0))
        );
        println!(
            "Kb::search, source = \"wiki\" ({} samples): p50 {}  p95 {}  p99 {}  -> {}",
            wiki.len(),
            ms(pct(&wiki, 50.0)),
            ms(pct(&wiki, 95.0)),
            ms(pct(&wiki, 99.0)),
            target_text(pct(&wiki, 50.0))
        );
        // The mix above is 6 one-term queries (the fast path) and 10 of several terms: apart.
        let mut by_class = Vec::new();
        for class in QueryClass::ALL {
            let members = class.members();
            let own: Vec<Vec<Duration>> = members.iter().map(|&q| plain_samples[q].clone()).collect();
            let own = sorted(&own);
            let names: Vec<&str> = members.iter().map(|&q| QUERIES[q]).collect();
            println!(
                "Kb::search, {} ({} queries: {}): p50 {}  p95 {}",
                class.label(),
                members.len(),
                names.join(", "),
                ms(pct(&own, 50.0)),
                ms(pct(&own, 95.0))
            );
            by_class.push(format!("{} {}", class.label(), ms(pct(&own, 50.0))));
        }
        if let Some(t) = target {
            verdicts.push(format!(
                "search p50 at {size} chunks: {} (target <= {}) {}; source-filtered p50 {} {}; by class: {}",
                ms(pct(&all, 50.0)),
                ms(t),
                verdict(pct(&all, 50.0) <= t),
                ms(pct(&wiki, 50.0)),
                verdict(pct(&wiki, 50.0) <= t),
                by_class.join(", ")
            ));
        }

        // Where the time goes: the store calls Kb::search makes, timed alone.
        let store = kb.store();
        let window = 30;
        let short = budget / 4;
        let sources = sorted(&sample(1, short, 5, max_rounds * 4, |_| store.source_names().expect("sources")));
        let candidates = sorted(&sample(fts.len(), short, 5, max_rounds, |q| {
            store.keyword_candidates(&fts[q], &SearchFilter::default(), window).expect("candidates")
        }));
        let ids: Vec<Vec<i64>> = fts
            .iter()
            .map(|q| {
                let found = store.keyword_candidates(q, &SearchFilter::default(), window).expect("candidates");
                found.iter().take(LIMIT as usize).map(|c| c.chunk_id).collect()
            })
            .collect();
        let snippets =
            sorted(&sample(fts.len(), short, 5, max_rounds, |q| store.chunk_texts(&ids[q]).expect("chunk texts")));
        // One-word queries: ranked from posting lists against FTS5's bm25() over every match
        // (the results are the same: tests/it/keyword_topk_exact.rs, and the classes below).
        let words: Vec<String> = ["\"deploy\"", "\"service\"", "\"rollback\""].map(String::from).to_vec();
        let in_rust = sorted(&sample(words.len(), short, 5, max_rounds, |q| {
            store.keyword_candidates(&words[q], &SearchFilter::default(), window).expect("candidates")
        }));
        let in_fts5 = sorted(&sample(words.len(), short, 5, max_rounds, |q| {
            store.keyword_candidates_by_fts5(&words[q], &SearchFilter::default(), window).expect("candidates")
        }));
        println!(
            "breakdown, p50 per call: Store::source_names() (only when a source filter is given) {}, \
             keyword_candidates(window {window}) {}, chunk_texts({LIMIT} ids, for snippets) {}",
            ms(pct(&sources, 50.0)),
            ms(pct(&candidates, 50.0)),
            ms(pct(&snippets, 50.0))
        );
        println!(
            "one-word queries (deploy, service, rollback), keyword_candidates p50: from posting lists {}, \
             FTS5 bm25() over every match {}",
            ms(pct(&in_rust, 50.0)),
            ms(pct(&in_fts5, 50.0))
        );
        bench_scale_classes(&corpus, size, budget, max_rounds, verdicts);
        if size >= 100_000 {
            // [retrieval] stemming changed: the next open rebuilds the keyword index. Twice, to
            // leave the corpus as it was.
            let index_bytes = || -> f64 {
                db.query_row("SELECT sum(length(block)) FROM chunks_fts_data", [], |r| r.get::<_, i64>(0))
                    .expect("index size") as f64
                    / 1e6
            };
            let stemmed_bytes = index_bytes();
            let (_, plain) = corpus.reopen_with("[retrieval]\nstemming = \"none\"\n");
            let plain_bytes = index_bytes();
            let (_, stemmed) = corpus.reopen_with("[retrieval]\nstemming = \"english\"\n");
            println!(
                "keyword index rebuilt for a change of [retrieval] stemming at {} chunks: to none {:.1} s, \
                 back to english {:.1} s; FTS5 index data {stemmed_bytes:.1} MB stemmed, {plain_bytes:.1} MB not",
                stats.chunks,
                plain.as_secs_f64(),
                stemmed.as_secs_f64(),
            );
        }
    }
}

/// Issue 22: `Kb::search` per query class (words in most chunks, alone and together, three
/// terms, rare words, and the frequent ones under a source and a date filter), p50/p95/p99 next
/// to the targets; what FTS5 scoring every match costs for the same expressions; the top 30 of
/// both compared (the bench stops on a difference); and the first queries after the store is
/// opened, which read the posting lists.
fn bench_scale_classes(corpus: &Corpus, size: usize, budget: Duration, max_rounds: usize, verdicts: &mut Vec<String>) {
    let kb = &corpus.kb;
    let store = kb.store();
    let chunks = kb.stats().expect("stats").chunks as f64;
    let db = rusqlite::Connection::open_with_flags(corpus.db_path(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open db read-only");
    let frequent = frequent_mix();
    let mut classes: Vec<(String, Vec<&str>, SearchFilter)> = SCALE_CLASSES
        .iter()
        .map(|(name, queries)| (name.to_string(), queries.to_vec(), SearchFilter::default()))
        .collect();
    let wiki = SearchFilter { sources: Some(vec!["filesystem:wiki".into()]), since: None };
    classes.push(("frequent, source = wiki".into(), frequent.clone(), wiki));
    let recent = SearchFilter { sources: None, since: Some(SINCE.into()) };
    classes.push((format!("frequent, since {}", &SINCE[..10]), frequent.clone(), recent));
    let targets = scale_targets(size);
    println!(
        "\nissue 22 query classes at {size} chunks (Kb::search, limit {LIMIT}; \"matching\": chunks the query \
         matches, mean share; \"every match\": keyword_candidates through FTS5 bm25(), p50):"
    );
    println!(
        "  {:<28} {:>9} {:>11} {:>11} {:>11} {:>13}  verdict",
        "class", "matching", "p50", "p95", "p99", "every match"
    );
    let mut passed = true;
    let mut summary = Vec::new();
    for (name, queries, filter) in &classes {
        let requests: Vec<SearchRequest> = queries
            .iter()
            .map(|q| {
                let mut value = json!({ "query": q, "limit": LIMIT });
                if let Some(sources) = &filter.sources {
                    value["source"] = json!(sources[0].trim_start_matches("filesystem:"));
                }
                if let Some(since) = &filter.since {
                    value["since"] = json!(since);
                }
                serde_json::from_value(value).expect("valid SearchRequest")
            })
            .collect();
        let samples =
            sorted(&sample(requests.len(), budget / 4, 5, max_rounds, |q| kb.search(&requests[q]).expect("search")));
        let fts: Vec<String> = queries.iter().map(|q| fts_query(q).expect("query has terms").all).collect();
        let mut matching = 0.0;
        for expression in &fts {
            let ours = store.keyword_candidates(expression, filter, 30).expect("candidates");
            let theirs = store.keyword_candidates_by_fts5(expression, filter, 30).expect("candidates");
            let pairs =
                |list: &[ctx::kb::store::Candidate]| list.iter().map(|c| (c.chunk_id, c.score)).collect::<Vec<_>>();
            assert_eq!(pairs(&ours), pairs(&theirs), "{name}: {expression}: the top 30 differ from bm25()");
            let n: i64 = db
                .query_row("SELECT count(*) FROM chunks_fts WHERE chunks_fts MATCH ?1", [expression], |r| r.get(0))
                .expect("count matches");
            matching += n as f64 / chunks / fts.len() as f64;
        }
        let every_match = sorted(&sample(fts.len(), budget / 20, 3, 50, |q| {
            store.keyword_candidates_by_fts5(&fts[q], filter, 30).expect("candidates")
        }));
        let (p50, p95, p99) = (pct(&samples, 50.0), pct(&samples, 95.0), pct(&samples, 99.0));
        let ok = targets.is_none_or(|(t50, t99)| p50 <= t50 && p99 <= t99);
        passed &= ok;
        println!(
            "  {:<28} {:>8.0}% {:>11} {:>11} {:>11} {:>13}  {}",
            name,
            matching * 100.0,
            ms(p50),
            ms(p95),
            ms(p99),
            ms(pct(&every_match, 50.0)),
            if targets.is_some() { verdict(ok) } else { "no target" }
        );
        summary.push(format!("{name} {}/{}", ms(p50), ms(p99)));
    }
    // Cold: a store just opened has no posting lists; its first query of each word reads them.
    let (cold, _) = corpus.reopen_with("");
    let mut first: Vec<Duration> = frequent
        .iter()
        .map(|q| {
            let started = Instant::now();
            cold.search(&request(q, None)).expect("search");
            started.elapsed()
        })
        .collect();
    first.sort();
    println!(
        "  first queries after opening the store (they read the posting lists; a write makes the next \
         ones read them again): the frequent mix, p50 {}, max {}",
        ms(pct(&first, 50.0)),
        ms(*first.last().expect("queries"))
    );
    if let Some((t50, t99)) = targets {
        verdicts.push(format!(
            "issue 22 classes at {size} chunks, p50/p99 (targets <= {}/{}): {} {}",
            ms(t50),
            ms(t99),
            summary.join(", "),
            verdict(passed)
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Sync

/// The `ctx` binary: built by cargo with the bench profile (release) alongside this bench.
/// `CTX_BENCH_BIN` overrides it.
fn ctx_binary() -> PathBuf {
    match std::env::var_os("CTX_BENCH_BIN") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_BIN_EXE_ctx")),
    }
}

/// GNU time reports the peak RSS of the process it runs with `-f %M` (KiB).
fn gnu_time() -> Option<&'static str> {
    let path = "/usr/bin/time";
    let probe = Command::new(path)
        .args(["-f", "%M", "-o", "/dev/null", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    probe.is_ok_and(|s| s.success()).then_some(path)
}

struct SyncRun {
    wall: Duration,
    /// Peak resident set of the ctx process, KiB.
    peak_kib: Option<u64>,
    summary: Value,
}

fn run_sync(bin: &Path, config: &Path, time: Option<&str>, scratch: &Path) -> SyncRun {
    let rss_file = scratch.join("rss.txt");
    let mut cmd = match time {
        Some(time) => {
            let mut cmd = Command::new(time);
            cmd.arg("-f").arg("%M").arg("-o").arg(&rss_file).arg(bin);
            cmd
        }
        None => Command::new(bin),
    };
    cmd.arg("--config").arg(config).args(["sync", "--json", "-q"]).stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawn ctx sync");
    // Without GNU time, poll the child's high-water mark; it may miss a peak in its last moments.
    let mut polled = None;
    if time.is_none() {
        let status = format!("/proc/{}/status", child.id());
        while child.try_wait().expect("wait").is_none() {
            if let Some(kib) = std::fs::read_to_string(&status).ok().and_then(|s| vm_hwm(&s)) {
                polled = Some(kib);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let out = child.wait_with_output().expect("ctx sync output");
    let wall = started.elapsed();
    assert!(out.status.success(), "ctx sync failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = serde_json::from_str(stdout.lines().next().expect("one summary line")).expect("summary JSON");
    let peak_kib = match time {
        Some(_) => std::fs::read_to_string(&rss_file).ok().and_then(|s| s.trim().lines().last()?.parse().ok()),
        None => polled,
    };
    SyncRun { wall, peak_kib, summary }
}

fn vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn bench_sync(verdicts: &mut Vec<String>) {
    let bin = ctx_binary();
    if !bin.is_file() {
        println!("\nsync: {} not found; run `cargo build --release --bin ctx` first", bin.display());
        verdicts.push("sync: not run (binary missing)".to_string());
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ctx.toml");
    std::fs::write(&config, "[connectors.filesystem.docs]\nroot = \"docs\"\n").expect("write ctx.toml");
    let started = Instant::now();
    let bytes = write_notes(dir.path(), SYNC_FILES);
    let time = gnu_time();
    println!(
        "\n== ctx sync of {SYNC_FILES} markdown files ({:.1} MB, 100 folders; written in {:.1} s) ==",
        bytes as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    println!("binary: {}", bin.display());
    println!(
        "command: {}{} --config {} sync --json -q",
        time.map(|t| format!("{t} -f %M ")).unwrap_or_default(),
        bin.display(),
        config.display()
    );
    println!(
        "peak RSS from: {}",
        if time.is_some() { "GNU time %M (exact)" } else { "polling /proc/<pid>/status VmHWM (approximate)" }
    );

    let report = |label: &str, fresh: bool, field: &str| {
        let mut rates = Vec::new();
        let mut rss = Vec::new();
        for run in 1..=SYNC_RUNS {
            if fresh {
                let _ = std::fs::remove_dir_all(dir.path().join("data"));
            }
            let r = run_sync(&bin, &config, time, dir.path());
            assert_eq!(r.summary[field].as_u64(), Some(SYNC_FILES as u64), "unexpected summary: {}", r.summary);
            let rate = SYNC_FILES as f64 / r.wall.as_secs_f64();
            let mb = r.peak_kib.map(|k| k as f64 / 1024.0);
            println!(
                "  {label} run {run}: wall {:.3} s = {rate:.0} files/s (ctx's own timer {:.3} s), peak RSS {}",
                r.wall.as_secs_f64(),
                r.summary["seconds"].as_f64().unwrap_or(f64::NAN),
                mb.map_or("n/a".to_string(), |m| format!("{m:.1} MB"))
            );
            rates.push(rate);
            rss.extend(mb);
        }
        let rss_max = rss.iter().copied().fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        (median(&mut rates), rss_max)
    };

    let (cold_rate, cold_rss) = report("cold (empty database, 10k added)", true, "added");
    let (warm_rate, warm_rss) = report("no-change (10k unchanged)", false, "unchanged");
    let rate_ok = cold_rate >= SYNC_TARGET_FILES_PER_SEC;
    println!(
        "cold sync, median of {SYNC_RUNS}: {cold_rate:.0} files/s -> target >= {SYNC_TARGET_FILES_PER_SEC:.0} files/s: {}",
        verdict(rate_ok)
    );
    println!("no-change sync, median of {SYNC_RUNS}: {warm_rate:.0} files/s (no target)");
    verdicts.push(format!(
        "sync of {SYNC_FILES} files: {cold_rate:.0} files/s (target >= {SYNC_TARGET_FILES_PER_SEC:.0}) {}; \
         no-change re-sync {warm_rate:.0} files/s",
        verdict(rate_ok)
    ));
    match cold_rss {
        Some(mb) => {
            let ok = mb < SYNC_TARGET_RSS_MB;
            println!(
                "peak RSS of cold sync, max of {SYNC_RUNS}: {mb:.1} MB -> target < {SYNC_TARGET_RSS_MB:.0} MB: {}; \
                 no-change sync {}",
                verdict(ok),
                warm_rss.map_or("n/a".to_string(), |m| format!("{m:.1} MB"))
            );
            verdicts.push(format!("sync peak RSS: {mb:.1} MB (target < {SYNC_TARGET_RSS_MB:.0} MB) {}", verdict(ok)));
        }
        None => verdicts.push("sync peak RSS: not measured".to_string()),
    }
}
