//! The synthetic corpus shared by the benchmarks (`kb`, `tools`): a deterministic Zipf-distributed
//! vocabulary, markdown documents chunked by the real chunker, written through `Store::apply` as
//! sync does, and the fixed queries every benchmark uses.

#![allow(dead_code)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctx::config::Config;
use ctx::kb::chunk::{chunk, ChunkSpec};
use ctx::kb::store::{Change, NewDocument};
use ctx::kb::{document_id, unix_to_rfc3339, Kb};
use serde_json::Value;

/// Words in the vocabulary and the Zipf exponent of their frequencies.
pub const VOCAB_SIZE: usize = 40_000;
pub const ZIPF_S: f64 = 1.0;
/// Writes per `Store::apply`, as in `kb::sync`.
pub const BATCH: usize = 512;
/// One in this many corpus documents belongs to the small `filesystem:wiki` source.
pub const WIKI_ONE_IN: usize = 10;
/// Results asked for per search, as a tool call would.
pub const LIMIT: u64 = 10;

/// The most frequent words: English function words, as in real text.
pub const STOP: &[&str] = &[
    "the", "of", "and", "to", "a", "in", "is", "for", "that", "on", "with", "as", "it", "be", "by", "this", "are",
    "from", "or", "an", "at", "not", "you", "can", "if", "when", "we", "use", "should", "will", "how", "what", "which",
    "new", "all", "more", "after", "before", "must", "one",
];

/// Domain words (space-separated), most frequent first, placed at geometrically spaced ranks from
/// just after the function words down to [`DOMAIN_LAST_RANK`], so queries can name common, mid and
/// rare terms.
pub const DOMAIN: &str = "\
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
pub const DOMAIN_LAST_RANK: usize = 30_000;

/// Fixed search queries: one to three words, common to rare, some natural-language.
pub const QUERIES: &[&str] = &[
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
/// Issue 22's query classes (`kb` bench): words in most chunks, alone and together (what a
/// team's "service", "data" or product name is in real folders), three-term queries, and rare
/// words. The function words "not", "if", "use" and "should" are not on the search's stop list,
/// so they are searched like any word: this corpus has them in about half of its chunks or more
/// (the bench prints the share each class matches).
pub const SCALE_CLASSES: &[(&str, &[&str])] = &[
    ("frequent, one term", &["not", "if", "use", "should"]),
    ("frequent, two terms", &["not if", "use should", "not service", "if data"]),
    ("three terms", &["not if use", "use service data", "should team request", "database migration timeout"]),
    ("rare terms", &["kafka", "mtls", "oncall runbook", "vacuum compaction"]),
];

/// The frequent-term mix: the queries of the first two [`SCALE_CLASSES`].
pub fn frequent_mix() -> Vec<&'static str> {
    SCALE_CLASSES[..2].iter().flat_map(|(_, queries)| queries.iter().copied()).collect()
}

/// The `since` of the date-filtered classes: about the later half of the corpus's dates.
pub const SINCE: &str = "2024-11-01T00:00:00Z";

/// What a query reduces to once stop words are dropped: one term, or several (ANDed first, then
/// ORed with term starts when the page is short). Every bench reports them apart as well as mixed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryClass {
    OneTerm,
    Several,
}

impl QueryClass {
    pub const ALL: [QueryClass; 2] = [QueryClass::OneTerm, QueryClass::Several];

    pub fn of(query: &str) -> QueryClass {
        match ctx::kb::query::fts_query(query).expect("query has terms").terms.len() {
            1 => QueryClass::OneTerm,
            _ => QueryClass::Several,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            QueryClass::OneTerm => "one term",
            QueryClass::Several => "several terms",
        }
    }

    /// The indexes into [`QUERIES`] of this class.
    pub fn members(self) -> Vec<usize> {
        (0..QUERIES.len()).filter(|&i| QueryClass::of(QUERIES[i]) == self).collect()
    }
}

/// The 1, 5 and 15 minute load averages: other work on the machine skews every number here.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string())
}
// ---------------------------------------------------------------------------------------------
// Synthetic corpus

/// SplitMix64: small, seeded, deterministic across platforms.
pub struct Rng(u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
}

/// Words by frequency rank, with the cumulative Zipf distribution over them.
pub struct Vocab {
    pub words: Vec<String>,
    pub cdf: Vec<f64>,
}

impl Vocab {
    pub fn new(rng: &mut Rng) -> Vocab {
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

    pub fn sample(&self, rng: &mut Rng) -> &str {
        let u = rng.unit();
        let i = self.cdf.partition_point(|&c| c < u).min(VOCAB_SIZE - 1);
        &self.words[i]
    }

    /// A word that is not a function word, for titles and headings.
    pub fn content_word(&self, rng: &mut Rng) -> &str {
        loop {
            let word = self.sample(rng);
            if !STOP.contains(&word) {
                return word;
            }
        }
    }

    pub fn rank(&self, word: &str) -> Option<usize> {
        self.words.iter().position(|w| w == word)
    }
}

/// Markdown documents: a title, sections, paragraphs, lists and the odd code block.
pub struct Generator {
    pub rng: Rng,
    pub vocab: Vocab,
}

impl Generator {
    /// Document number `n` of the search corpus, as the write sync makes of it, and its number of
    /// chunks: one to eight chunks of text, one document in [`WIKI_ONE_IN`] in `filesystem:wiki`.
    pub fn change(&mut self, n: usize, spec: ChunkSpec) -> (Change, usize) {
        let wanted = self.rng.range(1, 8);
        let (title, body) = self.document(wanted * 1400);
        let (source, folder) =
            if n.is_multiple_of(WIKI_ONE_IN) { ("filesystem:wiki", "wiki") } else { ("filesystem:docs", "docs") };
        let source_id = format!("{folder}/{:03}/{n:07}.md", n % 1000);
        let updated_at = self.date();
        let chunks = chunk(&body, spec);
        let count = chunks.len();
        let change = Change::Upsert(Box::new(NewDocument {
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
            vectors: None,
        }));
        (change, count)
    }

    pub fn new(seed: u64) -> Generator {
        let mut rng = Rng(seed);
        let vocab = Vocab::new(&mut rng);
        Generator { rng, vocab }
    }

    pub fn words(&mut self, n: usize, content: bool, out: &mut String) {
        for i in 0..n {
            if i > 0 {
                out.push(' ');
            }
            let word = if content { self.vocab.content_word(&mut self.rng) } else { self.vocab.sample(&mut self.rng) };
            out.push_str(word);
        }
    }

    pub fn sentence(&mut self, out: &mut String) {
        let start = out.len();
        let n = self.rng.range(6, 22);
        self.words(n, false, out);
        if let Some(first) = out[start..].chars().next() {
            let upper = first.to_uppercase().to_string();
            out.replace_range(start..start + first.len_utf8(), &upper);
        }
        out.push('.');
    }

    pub fn title(&mut self) -> String {
        let mut title = String::new();
        let n = self.rng.range(2, 5);
        self.words(n, true, &mut title);
        title
    }

    /// A document of about `target` bytes.
    pub fn document(&mut self, target: usize) -> (String, String) {
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

    pub fn date(&mut self) -> String {
        let secs = 1_700_000_000 + self.rng.range(0, 60_000_000) as i64;
        unix_to_rfc3339(secs).expect("valid timestamp")
    }
}

// ---------------------------------------------------------------------------------------------
// Search

/// A knowledge base in a temp folder that grows by documents written through `Store::apply`.
pub struct Corpus {
    pub dir: tempfile::TempDir,
    pub kb: Kb,
    pub spec: ChunkSpec,
    pub gen: Generator,
    pub docs: usize,
    pub chunks: usize,
}

pub struct Growth {
    pub docs: usize,
    pub chunks: usize,
    pub generate: Duration,
    pub apply: Duration,
}

impl Corpus {
    pub fn new() -> Corpus {
        Corpus::with_files("", &[])
    }

    /// A corpus whose config ends with `extra`, with `files` (relative path, text) written next
    /// to it (tool scripts, say).
    pub fn with_files(extra: &str, files: &[(&str, &str)]) -> Corpus {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("ctx.toml");
        let text = format!(
            "[db]\npath = \"kb.sqlite\"\n\n[connectors.filesystem.docs]\nroot = \"docs\"\n\n\
             [connectors.filesystem.wiki]\nroot = \"wiki\"\n\n{extra}"
        );
        std::fs::write(&file, &text).expect("write ctx.toml");
        for (rel, body) in files {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, body).expect("write file");
        }
        let text = text.as_str();
        let config = Config::from_text(text, Path::new("ctx.toml"), &file, &|_| None).expect("valid config");
        let kb = Kb::open(Arc::new(config)).expect("open kb");
        let spec = kb.chunk_spec();
        Corpus { dir, kb, spec, gen: Generator::new(0x5EED_C0DE), docs: 0, chunks: 0 }
    }

    /// The same database opened under the config plus `extra` (another `[retrieval]`, say),
    /// and how long opening took (a change of `stemming` rebuilds the keyword index then).
    pub fn reopen_with(&self, extra: &str) -> (Kb, Duration) {
        let file = self.dir.path().join("other.toml");
        let text = format!("[db]\npath = \"kb.sqlite\"\n\n{extra}");
        std::fs::write(&file, &text).expect("write other.toml");
        let config = Config::from_text(&text, Path::new("other.toml"), &file, &|_| None).expect("valid config");
        let started = Instant::now();
        let kb = Kb::open(Arc::new(config)).expect("open kb");
        (kb, started.elapsed())
    }

    /// Adds documents of one to eight chunks until the store holds at least `target` chunks.
    pub fn grow_to(&mut self, target: usize) -> Growth {
        let mut growth = Growth { docs: 0, chunks: 0, generate: Duration::ZERO, apply: Duration::ZERO };
        let mut batch: Vec<Change> = Vec::with_capacity(BATCH);
        while self.chunks < target {
            let started = Instant::now();
            let (change, chunks) = self.gen.change(self.docs, self.spec);
            self.docs += 1;
            self.chunks += chunks;
            growth.docs += 1;
            growth.chunks += chunks;
            batch.push(change);
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

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("kb.sqlite")
    }
}
/// Writes `count` markdown notes of 200 to 1,500 bytes in 100 folders under `dir/docs` (the
/// sync benches' corpus); returns their total size.
pub fn write_notes(dir: &Path, count: usize) -> usize {
    let mut gen = Generator::new(0xF11E_5EED);
    let mut bytes = 0;
    for n in 0..count {
        let folder = dir.join(format!("docs/{:02}", n % 100));
        if n < 100 {
            std::fs::create_dir_all(&folder).expect("create folder");
        }
        let target = gen.rng.range(200, 1500);
        let (_, body) = gen.document(target);
        bytes += body.len();
        std::fs::write(folder.join(format!("note-{n:05}.md")), body).expect("write file");
    }
    bytes
}

/// Nearest-rank percentile of sorted samples.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}
