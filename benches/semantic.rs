//! Semantic search benchmark: local embedding throughput, semantic and hybrid search latency
//! over synthetic corpora embedded with the default local model, index size per chunk, and
//! `ctx sync` of 10,000 markdown files with local embeddings (rate and peak RSS). Plain
//! `Instant` timing; every number is printed next to its target with PASS or MISS.
//!
//! ```text
//! scripts/get-model                          # the default model (wordllama's, from PyPI)
//! cargo bench --bench semantic               # 10k chunks, embedding, sync
//! cargo bench --bench semantic -- --full     # also 1M chunks (minutes: it embeds them all)
//! cargo bench --bench semantic -- embed | search | sync | models
//! ```
//!
//! `models` compares the local models side by side: the default static one and, when
//! `scripts/get-model minilm` installed it (`CTX_MINILM_DIR`, or `CTX_TEST_MINILM`), the
//! all-MiniLM-L6-v2 transformer: load time, embedding throughput, and `ctx sync` of
//! [`MODEL_FILES`] files with each, embedding inline or with `[embedding] background` (then
//! `ctx embed` fills the vectors), with peak RSS.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/corpus.rs"]
mod corpus;

use corpus::*;
use ctx::embed::{Embedder, StaticModel};
use ctx::kb::embedding::{backfill, embed_all};
use ctx::types::{SearchMode, SearchRequest};

const EMBED_TARGET_PER_SEC: f64 = 10_000.0;
const SYNC_FILES: usize = 10_000;
const SYNC_TARGET_FILES_PER_SEC: f64 = 3_000.0;
const QUERIES: usize = 200;
/// Files of the `models` part's syncs: few enough for the transformer (about ten chunks a second).
const MODEL_FILES: usize = 300;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let full = args.iter().any(|a| a == "--full");
    let only: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let run = |part: &str| only.is_empty() || only.iter().any(|o| *o == part);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("ctx semantic-search benchmark ({cores} CPUs, load average {})", load_average());
    let Some(model_dir) = model_dir() else {
        println!("no embedding model: run scripts/get-model (or set CTX_MODEL_DIR to a model folder)");
        std::process::exit(2);
    };
    println!("model: {}", model_dir.display());
    let mut verdicts = Vec::new();
    if run("embed") {
        bench_embed(&model_dir, &mut verdicts);
    }
    if run("search") {
        let mut sizes = vec![10_000];
        if full {
            sizes.push(1_000_000);
        }
        for chunks in sizes {
            bench_search(&model_dir, chunks, &mut verdicts);
        }
    }
    if run("sync") {
        bench_sync(&model_dir, &mut verdicts);
    }
    if run("models") {
        bench_models(&model_dir, &mut verdicts);
    }
    println!("\n== summary (load average now {}) ==", load_average());
    for line in &verdicts {
        println!("{line}");
    }
}

fn model_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CTX_MODEL_DIR").or_else(|| std::env::var_os("CTX_TEST_MODEL")) {
        return Some(PathBuf::from(dir));
    }
    ctx::embed::default_model_dirs(Path::new(".")).into_iter().find(|d| d.join("model.safetensors").is_file())
}

/// Chunk-sized texts (about 100 to 250 words) from the corpus generator.
fn texts(n: usize, seed: u64) -> Vec<String> {
    let mut gen = Generator::new(seed);
    (0..n)
        .map(|_| {
            let mut text = String::new();
            while text.len() < 700 {
                gen.sentence(&mut text);
            }
            text
        })
        .collect()
}

fn bench_embed(model_dir: &Path, verdicts: &mut Vec<String>) {
    let started = Instant::now();
    let model = StaticModel::load(model_dir, "wordllama-l2-256", None).expect("load the model");
    let load = started.elapsed();
    let texts = texts(20_000, 0xE3BE_D000);
    let words: usize = texts.iter().map(|t| t.split_whitespace().count()).sum();
    println!(
        "\n== local embedding: {} texts of {} words on average; model loaded in {:.0} ms, {} dims, piece-by-piece tokenizing {} ==",
        texts.len(),
        words / texts.len(),
        load.as_secs_f64() * 1000.0,
        model.dims(),
        model.tokenizes_by_piece()
    );
    // Warm the per-thread piece caches as a sync's first batch would.
    embed_all(&model, &texts[..2_000]).expect("embed");
    let rate = |threads: &str, f: &dyn Fn() -> usize| {
        let started = Instant::now();
        let n = f();
        let per_sec = n as f64 / started.elapsed().as_secs_f64();
        println!("  {threads:<28} {per_sec:>9.0} chunks/s");
        per_sec
    };
    let one = rate("one thread", &|| {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        model.embed(&refs).expect("embed").len()
    });
    let all = rate("every core (embed_all)", &|| embed_all(&model, &texts).expect("embed").len());
    verdicts.push(format!(
        "{} local embedding {all:.0} chunks/s on every core, {one:.0} on one (target >= {EMBED_TARGET_PER_SEC:.0} on 2 cores)",
        verdict(all >= EMBED_TARGET_PER_SEC)
    ));
}

fn bench_search(model_dir: &Path, chunks: usize, verdicts: &mut Vec<String>) {
    let extra = format!("[embedding]\nprovider = \"local\"\npath = {:?}\n", model_dir.display().to_string());
    let mut corpus = Corpus::with_files(&extra, &[]);
    let started = Instant::now();
    let growth = corpus.grow_to(chunks);
    let grown = started.elapsed();
    let bytes_before = db_bytes(&corpus.db_path());
    let embedder = corpus.kb.embedder().expect("embedder").expect("configured");
    let started = Instant::now();
    let done = backfill(corpus.kb.store(), embedder.as_ref(), &mut |_, _| {}).expect("backfill");
    let embedded = started.elapsed();
    let bytes_after = db_bytes(&corpus.db_path());
    println!(
        "\n== search over {} chunks ({} documents, written in {:.1} s; embedded by `ctx embed`'s backfill in {:.1} s = {:.0} chunks/s) ==",
        growth.chunks,
        growth.docs,
        grown.as_secs_f64(),
        embedded.as_secs_f64(),
        done.embedded as f64 / embedded.as_secs_f64()
    );
    println!(
        "  index size: {:.0} bytes per chunk without vectors, {:.0} with ({:.0} for the vector: {} f32 dims)",
        bytes_before as f64 / growth.chunks as f64,
        bytes_after as f64 / growth.chunks as f64,
        (bytes_after.saturating_sub(bytes_before)) as f64 / growth.chunks as f64,
        embedder.dims()
    );
    // Queries: two or three words of the corpus vocabulary.
    let mut gen = Generator::new(0x0E51_7E55);
    let queries: Vec<String> = (0..QUERIES)
        .map(|i| {
            let mut q = String::new();
            gen.words(2 + i % 2, true, &mut q);
            q.trim().to_string()
        })
        .collect();
    let mut report = |mode: SearchMode, label: &str, target: Option<Duration>| {
        // The first query loads the vectors into memory: timed apart.
        let request = |q: &str| SearchRequest {
            query: q.try_into().expect("query"),
            mode: Some(mode),
            limit: Some(10),
            source: None,
            since: None,
            explain: false,
        };
        let started = Instant::now();
        corpus.kb.search(&request(&queries[0])).expect("search");
        let first = started.elapsed();
        let mut samples: Vec<Duration> = queries
            .iter()
            .map(|q| {
                let started = Instant::now();
                let found = corpus.kb.search(&request(q)).expect("search");
                assert!(mode == SearchMode::Keyword || !found.results.is_empty(), "{label} found nothing for {q:?}");
                started.elapsed()
            })
            .collect();
        samples.sort();
        let (p50, p95) = (pct(&samples, 50.0), pct(&samples, 95.0));
        println!(
            "  {label:<10} p50 {:>7.3} ms  p95 {:>7.3} ms  (first query, loading the vectors: {:.1} ms)",
            ms(p50),
            ms(p95),
            ms(first)
        );
        if let Some(target) = target {
            verdicts.push(format!(
                "{} {label} p50 {:.3} ms at {} chunks (target <= {} ms); p95 {:.3} ms",
                verdict(p50 <= target),
                ms(p50),
                growth.chunks,
                ms(target),
                ms(p95)
            ));
        }
    };
    let big = chunks >= 1_000_000;
    report(SearchMode::Keyword, "keyword", None);
    report(SearchMode::Semantic, "semantic", Some(Duration::from_millis(if big { 50 } else { 2 })));
    report(SearchMode::Hybrid, "hybrid", (!big).then_some(Duration::from_millis(3)));
    // A filtered semantic search: the wiki source holds about one document in eight.
    let mut filtered: Vec<Duration> = queries
        .iter()
        .map(|q| {
            let request = SearchRequest {
                query: q.as_str().try_into().expect("query"),
                mode: Some(SearchMode::Semantic),
                limit: Some(10),
                source: Some("wiki".try_into().expect("source")),
                since: None,
                explain: false,
            };
            let started = Instant::now();
            let found = corpus.kb.search(&request).expect("search");
            assert!(found.results.iter().all(|r| r.source == "filesystem:wiki"));
            started.elapsed()
        })
        .collect();
    filtered.sort();
    println!(
        "  semantic, --source wiki: p50 {:.3} ms  p95 {:.3} ms",
        ms(pct(&filtered, 50.0)),
        ms(pct(&filtered, 95.0))
    );
    let rss = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
    });
    println!("  this process's RSS now (corpus, model, vectors in memory): {} KiB", rss.unwrap_or_default());
}

fn bench_sync(model_dir: &Path, verdicts: &mut Vec<String>) {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ctx"));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ctx.toml");
    std::fs::write(
        &config,
        format!(
            "[connectors.filesystem.docs]\nroot = \"docs\"\n\n[embedding]\nprovider = \"local\"\npath = {:?}\n",
            model_dir.display().to_string()
        ),
    )
    .expect("write ctx.toml");
    let bytes = write_notes(dir.path(), SYNC_FILES);
    println!(
        "\n== ctx sync of {SYNC_FILES} markdown files ({:.1} MB) with [embedding] provider = \"local\" ({}) ==",
        bytes as f64 / 1e6,
        bin.display()
    );
    let mut rates = Vec::new();
    let mut peak = 0u64;
    for run in 1..=3 {
        let _ = std::fs::remove_dir_all(dir.path().join("data"));
        let rss_file = dir.path().join("rss.txt");
        let timed = Path::new("/usr/bin/time").is_file();
        let mut command = if timed {
            let mut c = Command::new("/usr/bin/time");
            c.arg("-f").arg("%M").arg("-o").arg(&rss_file).arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        command
            .arg("--config")
            .arg(&config)
            .args(["sync", "--json", "-q"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let out = command.output().expect("run ctx sync");
        let wall = started.elapsed();
        assert!(out.status.success(), "ctx sync failed: {}", String::from_utf8_lossy(&out.stderr));
        let summary: serde_json::Value =
            serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap_or_default()).expect("summary");
        assert_eq!(summary["added"], SYNC_FILES, "{summary}");
        let kib: u64 = std::fs::read_to_string(&rss_file).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
        peak = peak.max(kib);
        let rate = SYNC_FILES as f64 / wall.as_secs_f64();
        println!(
            "  run {run}: {:.3} s = {rate:.0} files/s, {} chunks embedded, peak RSS {:.1} MB",
            wall.as_secs_f64(),
            summary["embedded"],
            kib as f64 / 1024.0
        );
        rates.push(rate);
    }
    rates.sort_by(f64::total_cmp);
    let median = rates[1];
    let size = db_bytes(&dir.path().join("data/ctx.sqlite"));
    println!("  database: {:.1} MB", size as f64 / 1e6);
    verdicts.push(format!(
        "{} sync of {SYNC_FILES} files with local embeddings: {median:.0} files/s (median of 3; target >= {SYNC_TARGET_FILES_PER_SEC:.0}), peak RSS {:.1} MB",
        verdict(median >= SYNC_TARGET_FILES_PER_SEC),
        peak as f64 / 1024.0
    ));
}

/// The local models side by side (see the module comment).
fn bench_models(static_dir: &Path, verdicts: &mut Vec<String>) {
    let minilm = std::env::var_os("CTX_MINILM_DIR").or_else(|| std::env::var_os("CTX_TEST_MINILM")).map(PathBuf::from);
    let mut models = vec![("wordllama-l2-256 (static)", static_dir.to_path_buf())];
    match minilm {
        Some(dir) => models.push(("all-minilm-l6-v2 (transformer)", dir)),
        None => println!("\n(no all-MiniLM-L6-v2: scripts/get-model minilm, then CTX_MINILM_DIR=<its folder>)"),
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ctx"));
    let texts = texts(256, 0x30DE_1500);
    println!(
        "\n== local models: {} texts of ~120 words embedded with embed_all; ctx sync of {MODEL_FILES} markdown files ==",
        texts.len()
    );
    println!(
        "{:<32} {:>8} {:>10} {:>13} {:>10} {:>15} {:>12} {:>10}",
        "model", "load ms", "chunks/s", "sync inline", "RSS MB", "sync background", "then embed", "RSS MB"
    );
    for (label, dir) in models {
        let started = Instant::now();
        let model = ctx::embed::load_local(&dir, "bench").expect("load the model");
        let load = started.elapsed();
        embed_all(model.as_ref(), &texts[..16]).expect("embed");
        let started = Instant::now();
        let n = embed_all(model.as_ref(), &texts).expect("embed").len();
        let rate = n as f64 / started.elapsed().as_secs_f64();
        drop(model);
        let work = tempfile::tempdir().expect("temp dir");
        write_notes(work.path(), MODEL_FILES);
        let config = |background: bool| {
            format!(
                "[connectors.filesystem.docs]\nroot = \"docs\"\n\n[embedding]\nprovider = \"local\"\npath = {:?}\nbackground = {background}\n",
                dir.display().to_string()
            )
        };
        let run = |background: bool, args: &[&str]| -> (Duration, u64) {
            std::fs::write(work.path().join("ctx.toml"), config(background)).expect("write ctx.toml");
            timed_ctx(&bin, work.path(), args)
        };
        let (inline, inline_rss) = run(false, &["sync", "-q"]);
        let _ = std::fs::remove_dir_all(work.path().join("data"));
        let (background, _) = run(true, &["sync", "-q"]);
        let (filled, fill_rss) = run(true, &["embed", "-q"]);
        println!(
            "{label:<32} {:>8.0} {rate:>10.1} {:>11.1} s {:>10.1} {:>13.2} s {:>10.1} s {:>10.1}",
            ms(load),
            inline.as_secs_f64(),
            inline_rss as f64 / 1024.0,
            background.as_secs_f64(),
            filled.as_secs_f64(),
            fill_rss as f64 / 1024.0
        );
        verdicts.push(format!(
            "INFO {label}: {rate:.1} chunks/s; sync of {MODEL_FILES} files {:.1} s inline, {:.2} s with background (vectors after, {:.1} s)",
            inline.as_secs_f64(),
            background.as_secs_f64(),
            filled.as_secs_f64()
        ));
    }
}

/// Runs `ctx <args>` in `dir`: its wall time and peak RSS in KiB (0 without /usr/bin/time).
fn timed_ctx(bin: &Path, dir: &Path, args: &[&str]) -> (Duration, u64) {
    let rss_file = dir.join("rss.txt");
    let mut command = if Path::new("/usr/bin/time").is_file() {
        let mut c = Command::new("/usr/bin/time");
        c.arg("-f").arg("%M").arg("-o").arg(&rss_file).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    command.current_dir(dir).args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    let started = Instant::now();
    let out = command.output().expect("run ctx");
    let wall = started.elapsed();
    assert!(out.status.success(), "ctx {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let kib = std::fs::read_to_string(&rss_file).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    (wall, kib)
}

fn db_bytes(path: &Path) -> u64 {
    let wal = path.with_extension("sqlite-wal");
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) + std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
