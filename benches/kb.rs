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

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctx::config::Config;
use ctx::kb::chunk::{chunk, ChunkSpec};
use ctx::kb::query::fts_query;
use ctx::kb::store::{Change, NewDocument, SearchFilter};
use ctx::kb::{document_id, unix_to_rfc3339, Kb};
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

/// Words in the vocabulary and the Zipf exponent of their frequencies.
const VOCAB_SIZE: usize = 40_000;
const ZIPF_S: f64 = 1.0;
/// Writes per `Store::apply`, as in `kb::sync`.
const BATCH: usize = 512;
/// One in this many corpus documents belongs to the small `filesystem:wiki` source.
const WIKI_ONE_IN: usize = 10;
/// Results asked for per search, as a tool call would.
const LIMIT: u64 = 10;

/// The most frequent words: English function words, as in real text.
const STOP: &[&str] = &[
    "the", "of", "and", "to", "a", "in", "is", "for", "that", "on", "with", "as", "it", "be", "by", "this", "are",
    "from", "or", "an", "at", "not", "you", "can", "if", "when", "we", "use", "should", "will", "how", "what", "which",
    "new", "all", "more", "after", "before", "must", "one",
];

/// Domain words (space-separated), most frequent first, placed at geometrically spaced ranks from
/// just after the function words down to [`DOMAIN_LAST_RANK`], so queries can name common, mid and
/// rare terms.
const DOMAIN: &str = "\
    service team user request config data error deploy server release api database test build review \
    access account change policy process cluster token cache queue incident metrics alert dashboard \
    customer ticket pipeline staging production backup schema migration latency timeout retry auth \
    password certificate oncall runbook rollback postmortem billing invoice escalation replica index \
    quota webhook firewall dns ingress docker registry artifact canary feature flag tenant region \
    failover snapshot secret rotation encryption vault onboarding laptop handbook holiday expense \
    interview roadmap sprint retro changelog kubernetes terraform helm grafana prometheus kafka redis \
    postgres nginx envoy cron bucket cdn tls saml sso ldap audit compliance gdpr pentest shard throttle \
    oauth jwt vpn pager ledger reconcile payroll reimbursement deprecation sunset vacuum compaction \
    checksum istio okr soc2 mtls";
const DOMAIN_LAST_RANK: usize = 30_000;

/// Fixed search queries: one to three words, common to rare, some natural-language.
const QUERIES: &[&str] = &[
    "deploy",
    "rollback",
    "kafka",
    "mtls",
    "deploy rollback",
    "rotate secret",
    "kubernetes ingress",
    "how to deploy",
    "the service",
    "database migration timeout",
    "oncall runbook",
    "sso saml ldap",
    "expense reimbursement",
    "canary release",
    "vacuum compaction",
    "grafana alert",
];

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

/// The 1, 5 and 15 minute load averages: other work on the machine skews every number here.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}

// ---------------------------------------------------------------------------------------------
// Synthetic corpus

/// SplitMix64: small, seeded, deterministic across platforms.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// Words by frequency rank, with the cumulative Zipf distribution over them.
struct Vocab {
    words: Vec<String>,
    cdf: Vec<f64>,
}

impl Vocab {
    fn new(rng: &mut Rng) -> Vocab {
        let mut slots: Vec<Option<String>> = vec![None; VOCAB_SIZE];
        for (rank, word) in STOP.iter().enumerate() {
            slots[rank] = Some(word.to_string());
        }
        let first = STOP.len() as f64;
        let domain: Vec<&str> = DOMAIN.split_whitespace().collect();
        let ratio = (DOMAIN_LAST_RANK as f64 / first).powf(1.0 / (domain.len() - 1) as f64);
        for (i, word) in domain.iter().enumerate() {
            let mut rank = (first * ratio.powi(i as i32)).round() as usize;
            while slots[rank].is_some() {
                rank += 1;
            }
            slots[rank] = Some(word.to_string());
        }
        let mut used: HashSet<String> = slots.iter().flatten().cloned().collect();
        const ONSETS: &[&str] = &[
            "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "cr", "dr",
            "fl", "gr", "pl", "st", "tr", "sh", "ch", "th", "qu",
        ];
        const VOWELS: &[&str] = &["a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "y"];
        const CODAS: &[&str] = &["", "", "", "n", "r", "s", "l", "t", "m", "x", "nd", "st"];
        let words = slots
            .into_iter()
            .map(|slot| {
                slot.unwrap_or_else(|| loop {
                    let mut word = String::new();
                    for _ in 0..rng.range(2, 4) {
                        word.push_str(ONSETS[rng.range(0, ONSETS.len() - 1)]);
                        word.push_str(VOWELS[rng.range(0, VOWELS.len() - 1)]);
                    }
                    word.push_str(CODAS[rng.range(0, CODAS.len() - 1)]);
                    if used.insert(word.clone()) {
                        break word;
                    }
                })
            })
            .collect();
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (1..=VOCAB_SIZE)
            .map(|rank| {
                total += 1.0 / (rank as f64).powf(ZIPF_S);
                total
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= total);
        Vocab { words, cdf }
    }

    fn sample(&self, rng: &mut Rng) -> &str {
        let u = rng.unit();
        let i = self.cdf.partition_point(|&c| c < u).min(VOCAB_SIZE - 1);
        &self.words[i]
    }

    /// A word that is not a function word, for titles and headings.
    fn content_word(&self, rng: &mut Rng) -> &str {
        loop {
            let word = self.sample(rng);
            if !STOP.contains(&word) {
                return word;
            }
        }
    }

    fn rank(&self, word: &str) -> Option<usize> {
        self.words.iter().position(|w| w == word)
    }
}

/// Markdown documents: a title, sections, paragraphs, lists and the odd code block.
struct Generator {
    rng: Rng,
    vocab: Vocab,
}

impl Generator {
    fn new(seed: u64) -> Generator {
        let mut rng = Rng(seed);
        let vocab = Vocab::new(&mut rng);
        Generator { rng, vocab }
    }

    fn words(&mut self, n: usize, content: bool, out: &mut String) {
        for i in 0..n {
            if i > 0 {
                out.push(' ');
            }
            let word = if content { self.vocab.content_word(&mut self.rng) } else { self.vocab.sample(&mut self.rng) };
            out.push_str(word);
        }
    }

    fn sentence(&mut self, out: &mut String) {
        let start = out.len();
        let n = self.rng.range(6, 22);
        self.words(n, false, out);
        if let Some(first) = out[start..].chars().next() {
            let upper = first.to_uppercase().to_string();
            out.replace_range(start..start + first.len_utf8(), &upper);
        }
        out.push('.');
    }

    fn title(&mut self) -> String {
        let mut title = String::new();
        let n = self.rng.range(2, 5);
        self.words(n, true, &mut title);
        title
    }

    /// A document of about `target` bytes.
    fn document(&mut self, target: usize) -> (String, String) {
        let title = self.title();
        let mut body = format!("# {title}\n\n");
        while body.len() < target {
            if self.rng.chance(0.12) {
                body.push_str("## ");
                let n = self.rng.range(2, 4);
                self.words(n, true, &mut body);
                body.push_str("\n\n");
            }
            if self.rng.chance(0.1) {
                for _ in 0..self.rng.range(3, 6) {
                    body.push_str("- ");
                    self.sentence(&mut body);
                    body.push('\n');
                }
            } else if self.rng.chance(0.05) {
                body.push_str("```sh\n");
                for _ in 0..self.rng.range(2, 6) {
                    let n = self.rng.range(2, 5);
                    self.words(n, true, &mut body);
                    body.push_str(" --");
                    body.push_str(self.vocab.content_word(&mut self.rng));
                    body.push('\n');
                }
                body.push_str("```\n");
            } else {
                for i in 0..self.rng.range(2, 6) {
                    if i > 0 {
                        body.push(' ');
                    }
                    self.sentence(&mut body);
                }
                body.push('\n');
            }
            body.push('\n');
        }
        (title, body)
    }

    fn date(&mut self) -> String {
        let secs = 1_700_000_000 + self.rng.range(0, 60_000_000) as i64;
        unix_to_rfc3339(secs).expect("valid timestamp")
    }
}

// ---------------------------------------------------------------------------------------------
// Search

/// A knowledge base in a temp folder that grows by documents written through `Store::apply`.
struct Corpus {
    dir: tempfile::TempDir,
    kb: Kb,
    spec: ChunkSpec,
    gen: Generator,
    docs: usize,
    chunks: usize,
}

struct Growth {
    docs: usize,
    chunks: usize,
    generate: Duration,
    apply: Duration,
}

impl Corpus {
    fn new() -> Corpus {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("ctx.toml");
        let text = "[db]\npath = \"kb.sqlite\"\n\n[connectors.filesystem.docs]\nroot = \"docs\"\n\n\
                    [connectors.filesystem.wiki]\nroot = \"wiki\"\n";
        std::fs::write(&file, text).expect("write ctx.toml");
        let config = Config::from_text(text, Path::new("ctx.toml"), &file, &|_| None).expect("valid config");
        let kb = Kb::open(Arc::new(config)).expect("open kb");
        let spec = kb.chunk_spec();
        Corpus { dir, kb, spec, gen: Generator::new(0x5EED_C0DE), docs: 0, chunks: 0 }
    }

    /// Adds documents of one to eight chunks until the store holds at least `target` chunks.
    fn grow_to(&mut self, target: usize) -> Growth {
        let mut growth = Growth { docs: 0, chunks: 0, generate: Duration::ZERO, apply: Duration::ZERO };
        let mut batch: Vec<Change> = Vec::with_capacity(BATCH);
        while self.chunks < target {
            let started = Instant::now();
            let wanted = self.gen.rng.range(1, 8);
            let (title, body) = self.gen.document(wanted * 1400);
            let n = self.docs;
            let (source, folder) =
                if n % WIKI_ONE_IN == 0 { ("filesystem:wiki", "wiki") } else { ("filesystem:docs", "docs") };
            let source_id = format!("{folder}/{:03}/{n:07}.md", n % 1000);
            let updated_at = self.gen.date();
            let chunks = chunk(&body, self.spec);
            self.docs += 1;
            self.chunks += chunks.len();
            growth.docs += 1;
            growth.chunks += chunks.len();
            batch.push(Change::Upsert(Box::new(NewDocument {
                id: document_id(source, &source_id),
                source: source.to_string(),
                source_id,
                title,
                body,
                content_type: "text/markdown".to_string(),
                source_url: None,
                author: None,
                created_at: updated_at.clone(),
                updated_at,
                metadata: Value::Null,
                content_hash: format!("{n:064x}"),
                chunks,
            })));
            growth.generate += started.elapsed();
            if batch.len() == BATCH || self.chunks >= target {
                let started = Instant::now();
                self.kb.store().apply(&batch).expect("apply batch");
                growth.apply += started.elapsed();
                batch.clear();
            }
        }
        growth
    }

    fn db_path(&self) -> PathBuf {
        self.dir.path().join("kb.sqlite")
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

/// Nearest-rank percentile of sorted samples.
fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(samples: &[Vec<Duration>]) -> Vec<Duration> {
    let mut all: Vec<Duration> = samples.iter().flatten().copied().collect();
    all.sort();
    all
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
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
        if let Some(t) = target {
            verdicts.push(format!(
                "search p50 at {size} chunks: {} (target <= {}) {}; source-filtered p50 {} {}",
                ms(pct(&all, 50.0)),
                ms(t),
                verdict(pct(&all, 50.0) <= t),
                ms(pct(&wiki, 50.0)),
                verdict(pct(&wiki, 50.0) <= t)
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
        println!(
            "breakdown, p50 per call: Store::source_names() (only when a source filter is given) {}, \
             keyword_candidates(window {window}) {}, chunk_texts({LIMIT} ids, for snippets) {}",
            ms(pct(&sources, 50.0)),
            ms(pct(&candidates, 50.0)),
            ms(pct(&snippets, 50.0))
        );
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
    let mut gen = Generator::new(0xF11E_5EED);
    let mut bytes = 0;
    for n in 0..SYNC_FILES {
        let folder = dir.path().join(format!("docs/{:02}", n % 100));
        if n < 100 {
            std::fs::create_dir_all(&folder).expect("create folder");
        }
        let target = gen.rng.range(200, 1500);
        let (_, body) = gen.document(target);
        bytes += body.len();
        std::fs::write(folder.join(format!("note-{n:05}.md")), body).expect("write file");
    }
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
