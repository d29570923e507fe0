//! Search-quality benchmark: nDCG@10, recall@10 and MRR@10 of keyword, semantic and hybrid search
//! on a labelled set nobody here wrote (Debian package descriptions, built by
//! `bench/quality/debian-set`), a sweep of the hybrid fusion's settings, a convex-combination
//! sweep to compare against, the low-overlap queries apart, and paired bootstrap intervals.
//!
//! ```text
//! bench/quality/debian-set            # once: downloads the lists (15 MB), builds the set
//! scripts/get-model                   # once: the default local model
//! cargo bench --bench quality
//! cargo bench --bench quality -- --rrf-k 2 --hybrid-weight 0.4   # hybrid at other settings
//! ```
//!
//! `CTX_QUALITY_SET` names another set folder, `CTX_QUALITY_MODEL` (or `CTX_TEST_MODEL`) another
//! model folder. What each number means: bench/README.md, "Search quality".

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use ctx::config::Config;
use ctx::kb::query::{fts_query, fts_query_rooted, terms, FtsQuery};
use ctx::kb::search::{fuse, group, FUSION_WINDOW};
use ctx::kb::store::{Candidate, SearchFilter};
use ctx::kb::sync::{sync_target, SyncOptions};
use ctx::kb::{Kb, Store};
use ctx::types::{SearchMode, SearchRequest, SearchResponse};
use serde_json::json;
use sha2::{Digest, Sha256};

/// Results per page, as an agent asks; metrics are at this cut.
const LIMIT: usize = 10;
const RRF_KS: [f64; 9] = [1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 100.0];
const WEIGHTS: [f64; 6] = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7];
const ALPHAS: [f64; 9] = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9];
const RESAMPLES: usize = 10_000;
const SEED: u64 = 19;
/// A query is low-overlap when fewer than this share of its terms occur in its document.
const LOW_OVERLAP: f64 = 0.5;
/// Grid cells this close to the best nDCG@10 are listed: a default should sit in a plateau,
/// not on a peak 300 queries can put anywhere.
const NEAR_BEST: f64 = 0.005;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("quality bench: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let started = Instant::now();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let set_dir = std::env::var_os("CTX_QUALITY_SET")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/quality/debian/set"));
    let set = LabelledSet::read(&set_dir)?;
    let model = model_dir(repo)?;
    let retrieval_toml = retrieval_override()?;
    println!("ctx search-quality benchmark (load average {})", load_average());
    println!("set: {} ({})", set_dir.display(), set.source);
    println!(
        "set sha256: {}{}",
        set.sha256,
        if set.sha256 == set.manifest_sha256 { "" } else { "  (differs from MANIFEST: the files were edited)" }
    );
    println!("{} documents, {} queries; model {}", set.docs.len(), set.queries.len(), model.display());

    // A workspace as a user has it: the documents as files, synced with the default local model.
    let work = tempfile::tempdir().map_err(|e| format!("cannot create a temp folder: {e}"))?;
    let config_file = work.path().join("ctx.toml");
    let text = format!(
        "[db]\npath = \"kb.sqlite\"\n\n[connectors.filesystem.docs]\nroot = {}\n\n\
         [embedding]\nprovider = \"local\"\npath = {}\nbackground = false\n{retrieval_toml}",
        toml_string(&set_dir.join("docs")),
        toml_string(&model)
    );
    let settings = if retrieval_toml.is_empty() { "defaults" } else { "configured" };
    std::fs::write(&config_file, &text).map_err(|e| format!("cannot write {}: {e}", config_file.display()))?;
    let config = Config::from_text(&text, Path::new("ctx.toml"), &config_file, &|_| None)
        .map_err(|e| format!("the bench's ctx.toml is invalid: {e}"))?;
    let kb = Kb::open(Arc::new(config)).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let summaries = sync_target(&kb, "all", SyncOptions::default(), &mut |_| {}).map_err(|e| e.to_string())?;
    let sync_secs = t.elapsed().as_secs_f64();
    for s in &summaries {
        if let Some(e) = s.error.as_ref().or(s.embed_error.as_ref()) {
            return Err(format!("sync of {} failed: {e}", s.source));
        }
    }
    let stats = kb.stats().map_err(|e| e.to_string())?;
    let embedded: usize = summaries.iter().map(|s| s.embedded).sum();
    // Every chunk must have its vector, or semantic and hybrid measure keyword search.
    if embedded != stats.chunks as usize {
        return Err(format!("{embedded} of {} chunks were embedded; every one must be", stats.chunks));
    }
    println!("sync: {} documents, {} chunks ({embedded} embedded) in {sync_secs:.1} s", stats.documents, stats.chunks);
    if stats.documents as usize != set.docs.len() {
        return Err(format!("{} documents were indexed, the set has {}", stats.documents, set.docs.len()));
    }

    // The candidate lists each query's search starts from, checked against Kb::search.
    let t = Instant::now();
    let retrieval = kb.config().spec.retrieval.clone();
    let embedder = kb.embedder().map_err(|e| e.to_string())?.ok_or("no embedder configured")?;
    let (run_k, run_w) = (retrieval.rrf_k as f64, ctx::kb::search::hybrid_weight(&retrieval, embedder.as_ref()));
    let per_doc = retrieval.max_chunks_per_doc as usize;
    let window = FUSION_WINDOW.max(LIMIT * per_doc);
    let texts: Vec<&str> = set.queries.iter().map(|q| q.text.as_str()).collect();
    let vectors = embedder.embed(&texts).map_err(|e| e.to_string())?;
    let filter = SearchFilter::default();
    let store = kb.store();
    let mut lists = Vec::with_capacity(set.queries.len());
    let mut and_matched = 0;
    for (q, vector) in set.queries.iter().zip(&vectors) {
        let fts = searched(store, &q.text)?;
        let all = store.keyword_candidates(&fts.all, &filter, window).map_err(|e| e.to_string())?;
        let any = match &fts.any {
            Some(any) => store.keyword_candidates(any, &filter, window).map_err(|e| e.to_string())?,
            None => all.clone(),
        };
        let wide = match &fts.wide {
            Some(wide) => store.keyword_candidates(wide, &filter, window).map_err(|e| e.to_string())?,
            None => all.clone(),
        };
        and_matched += usize::from(!all.is_empty());
        // Keyword search ranks the chunks with every term first, then those with some (or words
        // they start).
        let keyword = filled(&all, &wide);
        let (semantic, _) =
            store.semantic_candidates(embedder.name(), vector, &filter, window).map_err(|e| e.to_string())?;
        let lists_q = Lists { keyword, any, semantic, and_matched: !all.is_empty() };
        check_against_search(&kb, q, &lists_q, per_doc, run_k, run_w)?;
        lists.push(lists_q);
    }
    let lists_secs = t.elapsed().as_secs_f64();
    println!(
        "checked: for all {} queries, Kb::search's first page (limit {LIMIT}) in keyword, semantic and hybrid \
         mode is these lists grouped as search groups them (hybrid: rrf_k {run_k}, hybrid_weight {run_w})",
        set.queries.len()
    );
    println!(
        "every-term (AND) keyword query matched for {and_matched} of {} queries; pages are filled with any-term hits",
        set.queries.len()
    );

    let t = Instant::now();
    let relevant: Vec<&str> = set.queries.iter().map(|q| q.doc_id.as_str()).collect();
    let eval = |rank: &dyn Fn(&Lists) -> Vec<Candidate>| -> Scores {
        Scores::of(lists.iter().zip(&relevant).map(|(l, r)| doc_position(&rank(l), r)))
    };
    let low: Vec<bool> = set.queries.iter().map(|q| q.overlap < LOW_OVERLAP).collect();
    let keyword = eval(&|l| l.keyword.clone());
    let any = eval(&|l| l.any.clone());
    let semantic = eval(&|l| l.semantic.clone());
    let hybrid = eval(&|l| fuse(&l.keyword, &l.semantic, run_k, run_w).0);

    println!("\n== per document (a document ranks at its best chunk; one relevant document per query) ==");
    println!("{:<48} {:>8} {:>6} {:>6}   low-overlap nDCG@10", "", "nDCG@10", "R@10", "MRR@10");
    let row = |name: &str, s: &Scores| {
        println!("{name:<48} {:>8.4} {:>6.3} {:>6.4}   {:.4}", s.ndcg(), s.recall(), s.mrr(), s.subset(&low).ndcg())
    };
    row("keyword (every term, then any term)", &keyword);
    row("keyword, any term (hybrid's keyword list)", &any);
    row(&format!("semantic ({})", embedder.name()), &semantic);
    row(&format!("hybrid ({settings}: rrf_k {run_k}, hybrid_weight {run_w})"), &hybrid);

    // Weighted RRF: the fusion hybrid search runs, at other settings.
    let mut grid = Vec::new();
    for &k in &RRF_KS {
        for &w in &WEIGHTS {
            grid.push(((k, w), eval(&|l| fuse(&l.keyword, &l.semantic, k, w).0)));
        }
    }
    print_grid("nDCG@10", &grid, &Scores::ndcg, run_k, run_w);
    print_grid("recall@10", &grid, &Scores::recall, run_k, run_w);
    print_grid("MRR@10", &grid, &Scores::mrr, run_k, run_w);
    let low_ndcg = |s: &Scores| s.subset(&low).ndcg();
    print_grid("nDCG@10 on the low-overlap queries", &grid, &low_ndcg, run_k, run_w);
    let ((best_k, best_w), best_rrf) = grid.iter().max_by(|a, b| a.1.ndcg().total_cmp(&b.1.ndcg())).expect("grid");

    // Convex combination of normalised scores, for comparison (ctx does not ship it).
    println!("\n== convex combination: alpha x semantic + (1 - alpha) x keyword, scores normalised over each list's top {window} ==");
    println!("{:<6} {:>22} {:>22}", "", "min-max", "z-score");
    println!(
        "{:<6} {:>8} {:>6} {:>6} {:>8} {:>6} {:>6}",
        "alpha", "nDCG@10", "R@10", "MRR@10", "nDCG@10", "R@10", "MRR@10"
    );
    let mut convex_rows = Vec::new();
    for &alpha in &ALPHAS {
        let mm = eval(&|l| convex(&l.keyword, &l.semantic, alpha, Norm::MinMax));
        let z = eval(&|l| convex(&l.keyword, &l.semantic, alpha, Norm::Z));
        println!(
            "{alpha:<6.1} {:>8.4} {:>6.3} {:>6.4} {:>8.4} {:>6.3} {:>6.4}",
            mm.ndcg(),
            mm.recall(),
            mm.mrr(),
            z.ndcg(),
            z.recall(),
            z.mrr()
        );
        convex_rows.push((format!("convex min-max alpha {alpha:.1}"), mm));
        convex_rows.push((format!("convex z-score alpha {alpha:.1}"), z));
    }
    let (best_convex_name, best_convex) =
        convex_rows.iter().max_by(|a, b| a.1.ndcg().total_cmp(&b.1.ndcg())).expect("convex rows");

    fusion_variants(&eval, &low, &keyword, &hybrid, (run_k, run_w));

    let hybrid_name = format!("hybrid ({settings})");
    let n_low = low.iter().filter(|l| **l).count();
    println!(
        "\n== low-overlap queries: {n_low} of {} have under {:.0}% of their terms in their document ==",
        set.queries.len(),
        LOW_OVERLAP * 100.0
    );
    println!("{:<48} {:>8} {:>6} {:>6}", "", "nDCG@10", "R@10", "MRR@10");
    let best_rrf_name = format!("best RRF (rrf_k {best_k}, hybrid_weight {best_w})");
    for (name, s) in [
        ("keyword", &keyword),
        ("semantic", &semantic),
        (&hybrid_name, &hybrid),
        (best_rrf_name.as_str(), best_rrf),
        (best_convex_name.as_str(), best_convex),
    ] {
        let s = s.subset(&low);
        println!("{name:<48} {:>8.4} {:>6.3} {:>6.4}", s.ndcg(), s.recall(), s.mrr());
    }

    println!("\n== paired bootstrap ({RESAMPLES} resamples of the queries): nDCG@10 difference, 95% CI ==");
    for (name, a, b) in [
        (format!("{hybrid_name} - keyword"), &hybrid, &keyword),
        ("semantic - keyword".to_string(), &semantic, &keyword),
        (format!("{best_rrf_name} - keyword"), best_rrf, &keyword),
        (format!("{best_rrf_name} - {hybrid_name}"), best_rrf, &hybrid),
        (format!("{best_convex_name} - keyword"), best_convex, &keyword),
        (format!("{best_convex_name} - best RRF"), best_convex, best_rrf),
    ] {
        let (mean, lo, hi) = bootstrap(&a.ndcg, &b.ndcg);
        println!("{name:<64} {mean:+.4} [{lo:+.4}, {hi:+.4}]");
    }

    // Settings chosen on one half of the queries, measured on the other: how much of the best
    // cell's lead is the grid fitting noise.
    println!("\n== split halves: the best grid cell of one half, measured on the other ==");
    for (pick, other) in [(0, 1), (1, 0)] {
        let half = |h: usize| -> Vec<bool> { (0..set.queries.len()).map(|i| i % 2 == h).collect() };
        let (on_pick, on_other) = (half(pick), half(other));
        let ((k, w), s) = grid
            .iter()
            .max_by(|a, b| a.1.subset(&on_pick).ndcg().total_cmp(&b.1.subset(&on_pick).ndcg()))
            .expect("grid");
        println!(
            "best on half {pick}: rrf_k {k}, hybrid_weight {w}; on half {other}: nDCG@10 {:.4} \
             ({settings} {:.4}, keyword {:.4})",
            s.subset(&on_other).ndcg(),
            hybrid.subset(&on_other).ndcg(),
            keyword.subset(&on_other).ndcg()
        );
    }
    let metrics_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    keyword_study(&set, &set_dir, &kb, window)?;
    let study_secs = t.elapsed().as_secs_f64();

    println!("\n== summary ==");
    println!(
        "best RRF cell: rrf_k {best_k}, hybrid_weight {best_w}: nDCG@10 {:.4} ({settings} {:.4})",
        best_rrf.ndcg(),
        hybrid.ndcg()
    );
    let near: Vec<String> = grid
        .iter()
        .filter(|(_, s)| best_rrf.ndcg() - s.ndcg() <= NEAR_BEST)
        .map(|((k, w), s)| format!("k {k} w {w} ({:.4})", s.ndcg()))
        .collect();
    println!("RRF cells within {NEAR_BEST} of the best: {}", near.join(", "));
    println!("best convex: {best_convex_name}: nDCG@10 {:.4}", best_convex.ndcg());
    // Each metric's paired interval, on all queries and on the low-overlap ones.
    for (what, subset) in [("all queries", None), ("low-overlap queries", Some(&low))] {
        let (h, k) = match subset {
            Some(keep) => (hybrid.subset(keep), keyword.subset(keep)),
            None => (hybrid.subset(&vec![true; hybrid.ndcg.len()]), keyword.subset(&vec![true; keyword.ndcg.len()])),
        };
        let line: Vec<String> =
            [("nDCG@10", &h.ndcg, &k.ndcg), ("MRR@10", &h.rr, &k.rr), ("recall@10", &h.recall, &k.recall)]
                .iter()
                .map(|(name, a, b)| {
                    let (mean, lo, hi) = bootstrap(a, b);
                    format!("{name} {mean:+.4} [{lo:+.4}, {hi:+.4}]")
                })
                .collect();
        println!("{hybrid_name} - keyword, {what}: {}", line.join("; "));
    }
    let (gain, lo, hi) = bootstrap(&hybrid.ndcg, &keyword.ndcg);
    println!(
        "{hybrid_name} vs keyword: nDCG@10 {:.4} vs {:.4}, {gain:+.4} ({:+.1}%), 95% CI [{lo:+.4}, {hi:+.4}]; \
         recall@10 {:.3} vs {:.3}; MRR@10 {:.4} vs {:.4}",
        hybrid.ndcg(),
        keyword.ndcg(),
        gain / keyword.ndcg() * 100.0,
        hybrid.recall(),
        keyword.recall(),
        hybrid.mrr(),
        keyword.mrr()
    );
    println!(
        "time: sync {sync_secs:.1} s, lists and checks {lists_secs:.1} s, metrics and sweeps {metrics_secs:.1} s, \
         keyword study {study_secs:.1} s, total {:.1} s (load average {})",
        started.elapsed().as_secs_f64(),
        load_average()
    );
    Ok(())
}

/// Other fusions measured against the one ctx runs, each against keyword search: nDCG@10, MRR,
/// MRR on the low-overlap queries and the paired interval of nDCG@10. Kept to show why they
/// were not chosen (bench/README.md, Search quality).
// `eval` is main's closure: a ranking of each query's lists in, its scores out.
#[allow(clippy::type_complexity)]
fn fusion_variants(
    eval: &dyn Fn(&dyn Fn(&Lists) -> Vec<Candidate>) -> Scores,
    low: &[bool],
    keyword: &Scores,
    hybrid: &Scores,
    (k, w): (f64, f64),
) {
    println!("\n== fusion variants (nDCG@10 interval: paired bootstrap against keyword) ==");
    println!("{:<62} {:>8} {:>7} {:>10}   {:<20}", "", "nDCG@10", "MRR@10", "low MRR@10", "nDCG@10 - keyword");
    let row = |name: &str, s: &Scores| {
        let (mean, lo, hi) = bootstrap(&s.ndcg, &keyword.ndcg);
        println!(
            "{name:<62} {:>8.4} {:>7.4} {:>10.4}   {mean:+.4} [{lo:+.4}, {hi:+.4}]",
            s.ndcg(),
            s.mrr(),
            s.subset(low).mrr()
        );
    };
    row("keyword", keyword);
    row(&format!("hybrid as run (rrf_k {k}, hybrid_weight {w})"), hybrid);
    // The design before: the any-term list as the keyword side (ctx 0.x up to 2026-11).
    row("any-term list as the keyword side, rrf_k 2, weight 0.4", &eval(&|l| fuse(&l.any, &l.semantic, 2.0, 0.4).0));
    // The semantic list's share depending on whether keyword search found every term.
    for (sure, unsure) in [(0.1, 0.3), (0.2, 0.4)] {
        let s = eval(&|l| fuse(&l.keyword, &l.semantic, k, if l.and_matched { sure } else { unsure }).0);
        row(&format!("weight {sure} if every term matched, else {unsure}"), &s);
    }
    // Semantic hits kept only near the best one (a relative cosine floor).
    for keep in [0.8, 0.9] {
        let s = eval(&|l| {
            let top = l.semantic.first().map_or(0.0, |c| c.score);
            let near: Vec<Candidate> = l.semantic.iter().filter(|c| c.score >= top * keep).cloned().collect();
            fuse(&l.keyword, &near, k, w).0
        });
        row(&format!("semantic hits >= {keep} x the best cosine"), &s);
    }
}

// ---------------------------------------------------------------------------------------------
// The labelled set

struct LabelledSet {
    source: String,
    manifest_sha256: String,
    /// SHA-256 of the files as read now, computed as the set script does.
    sha256: String,
    docs: HashMap<String, String>,
    queries: Vec<Query>,
}

struct Query {
    text: String,
    /// The id of the one relevant document.
    doc_id: String,
    /// The share of the query's search terms that occur in its document.
    overlap: f64,
}

impl LabelledSet {
    fn read(dir: &Path) -> Result<LabelledSet, String> {
        let missing = |what: &str| {
            format!(
                "{what} is missing: build the labelled set with `bench/quality/debian-set` (downloads 15 MB \
                 from deb.debian.org once), or point CTX_QUALITY_SET at a set folder"
            )
        };
        let manifest = std::fs::read_to_string(dir.join("MANIFEST"))
            .map_err(|_| missing(&dir.join("MANIFEST").display().to_string()))?;
        let field = |key: &str| {
            manifest.lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(": "))).unwrap_or("?")
        };
        let tsv = std::fs::read_to_string(dir.join("queries.tsv"))
            .map_err(|_| missing(&dir.join("queries.tsv").display().to_string()))?;
        let mut hash = Sha256::new();
        hash.update(tsv.as_bytes());
        let mut names: Vec<(String, PathBuf)> = std::fs::read_dir(dir.join("docs"))
            .map_err(|_| missing(&dir.join("docs").display().to_string()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .map(|p| (p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(), p))
            .collect();
        // By package name, as the set script hashes them (not by file name: `a-b.md` < `a.md`).
        names.sort();
        let mut docs = HashMap::new();
        for (name, path) in names {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            hash.update(format!("\0{name}\0").as_bytes());
            hash.update(text.as_bytes());
            docs.insert(name, text);
        }
        let mut queries = Vec::new();
        for (n, line) in tsv.lines().enumerate().skip(1) {
            let (package, text) = line.split_once('\t').ok_or_else(|| format!("queries.tsv line {}: no tab", n + 1))?;
            let doc = docs
                .get(package)
                .ok_or_else(|| format!("queries.tsv line {}: no document docs/{package}.md; rebuild the set", n + 1))?;
            let wanted: Vec<String> =
                fts_query(text).map(|q| q.terms.into_iter().map(|(t, _)| t).collect()).unwrap_or_default();
            let present: HashSet<String> = terms(doc).into_iter().map(|(t, _)| t.to_lowercase()).collect();
            let overlap = wanted.iter().filter(|t| present.contains(*t)).count() as f64 / wanted.len().max(1) as f64;
            queries.push(Query {
                text: text.to_string(),
                doc_id: ctx::kb::document_id("filesystem:docs", &format!("{package}.md")),
                overlap,
            });
        }
        if queries.is_empty() {
            return Err(format!("{} has no queries; rebuild the set", dir.join("queries.tsv").display()));
        }
        let sha256 = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(LabelledSet {
            source: field("source").to_string(),
            manifest_sha256: field("sha256").to_string(),
            sha256,
            docs,
            queries,
        })
    }
}

/// The local model: `CTX_QUALITY_MODEL`, else `CTX_TEST_MODEL`, else where `scripts/get-model`
/// puts it.
fn model_dir(repo: &Path) -> Result<PathBuf, String> {
    for var in ["CTX_QUALITY_MODEL", "CTX_TEST_MODEL"] {
        if let Some(dir) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let dir = PathBuf::from(dir);
            return if dir.join("model.safetensors").is_file() {
                Ok(dir)
            } else {
                Err(format!("{var}={}: no model.safetensors there; run scripts/get-model", dir.display()))
            };
        }
    }
    ctx::embed::default_model_dirs(repo).into_iter().find(|d| d.join("model.safetensors").is_file()).ok_or_else(|| {
        "no local model: run scripts/get-model (downloads wordllama from PyPI once), or set CTX_QUALITY_MODEL".into()
    })
}

/// A `[retrieval]` section for `--rrf-k N` and `--hybrid-weight W`, or nothing (the defaults).
fn retrieval_override() -> Result<String, String> {
    let args: Vec<String> = std::env::args().collect();
    let mut section = String::new();
    for (flag, key) in [("--rrf-k", "rrf_k"), ("--hybrid-weight", "hybrid_weight")] {
        if let Some(at) = args.iter().position(|a| a == flag) {
            let value = args.get(at + 1).ok_or_else(|| format!("{flag} needs a value"))?;
            value.parse::<f64>().map_err(|_| format!("{flag} {value}: not a number"))?;
            section.push_str(&format!("{key} = {value}\n"));
        }
    }
    Ok(if section.is_empty() { section } else { format!("\n[retrieval]\n{section}") })
}

/// A path as a TOML string (JSON string syntax is valid TOML).
fn toml_string(path: &Path) -> String {
    serde_json::to_string(&path.to_string_lossy()).expect("a string serialises")
}

// ---------------------------------------------------------------------------------------------
// Keyword search on natural questions (issue 20): filling, stemming, question forms

/// The forms each query is asked in: as written, and as the questions agents send.
const FORMS: [(&str, &str); 4] = [
    ("as written", "{}"),
    ("what is a good ...?", "what is a good {}?"),
    ("how do I install ...?", "how do I install {}?"),
    ("which package provides ...?", "which package provides {}?"),
];

/// Keyword search before and after the two changes of issue 20, on every question form: the
/// every-term list alone with the any-term list only when it is empty (before), that list
/// filled with any-term hits ranked below (after), and the any-term list by BM25 alone (for
/// comparison), each without and with stemming. The stemmed index is the bench's main one;
/// the other is a second workspace with `stemming = "none"` and no embedding.
fn keyword_study(set: &LabelledSet, set_dir: &Path, stemmed: &Kb, window: usize) -> Result<(), String> {
    let work = tempfile::tempdir().map_err(|e| format!("cannot create a temp folder: {e}"))?;
    let config_file = work.path().join("ctx.toml");
    let text = format!(
        "[db]\npath = \"kb.sqlite\"\n\n[connectors.filesystem.docs]\nroot = {}\n\n[retrieval]\nstemming = \"none\"\n",
        toml_string(&set_dir.join("docs"))
    );
    std::fs::write(&config_file, &text).map_err(|e| format!("cannot write {}: {e}", config_file.display()))?;
    let config = Config::from_text(&text, Path::new("ctx.toml"), &config_file, &|_| None)
        .map_err(|e| format!("the study's ctx.toml is invalid: {e}"))?;
    let plain = Kb::open(Arc::new(config)).map_err(|e| e.to_string())?;
    sync_target(&plain, "all", SyncOptions::default(), &mut |_| {}).map_err(|e| e.to_string())?;
    let relevant: Vec<&str> = set.queries.iter().map(|q| q.doc_id.as_str()).collect();
    let filter = SearchFilter::default();
    println!("\n== keyword search on natural questions: before and after filling and stemming (issue 20) ==");
    println!("before: every term, else any term when no chunk has every term; filled: every term, then any term");
    println!("ranked below; any term: one BM25 list of chunks with any term; prefixes: filled, words of 4+ letters also as\n\
         prefixes (what search does). Per document, {} queries.", set.queries.len());
    println!("{:<30} {:<9} {:<10} {:>8} {:>6} {:>6}", "form", "stemming", "ranking", "nDCG@10", "R@10", "MRR@10");
    let mut table: HashMap<(&str, &str, &str), Scores> = HashMap::new();
    for (form, template) in FORMS {
        for (stemming, kb) in [("none", &plain), ("english", stemmed)] {
            let mut positions: [Vec<Option<usize>>; 4] = Default::default();
            for (q, relevant) in set.queries.iter().zip(&relevant) {
                let asked = template.replace("{}", &q.text);
                let store = kb.store();
                let fts = searched(store, &asked)?;
                let all = store.keyword_candidates(&fts.all, &filter, window).map_err(|e| e.to_string())?;
                let any = match &fts.any {
                    Some(any) => store.keyword_candidates(any, &filter, window).map_err(|e| e.to_string())?,
                    None => all.clone(),
                };
                let before = if all.is_empty() { &any } else { &all };
                positions[0].push(doc_position(before, relevant));
                let wide = match &fts.wide {
                    Some(wide) => store.keyword_candidates(wide, &filter, window).map_err(|e| e.to_string())?,
                    None => all.clone(),
                };
                // Filled from the plain any-term list, as before the fill took words as prefixes.
                positions[1].push(doc_position(&filled(&all, &any), relevant));
                positions[2].push(doc_position(&any, relevant));
                positions[3].push(doc_position(&filled(&all, &wide), relevant));
            }
            for (ranking, p) in ["before", "filled", "any term", "prefixes"].into_iter().zip(positions) {
                let s = Scores::of(p.into_iter());
                println!(
                    "{form:<30} {stemming:<9} {ranking:<10} {:>8.4} {:>6.3} {:>6.4}",
                    s.ndcg(),
                    s.recall(),
                    s.mrr()
                );
                table.insert((form, stemming, ranking), s);
            }
        }
    }
    println!("\n== keyword study: paired bootstrap ({RESAMPLES} resamples), nDCG@10 difference, 95% CI ==");
    for (form, _) in FORMS {
        let get = |s: &'static str, r: &'static str| &table[&(form, s, r)];
        for (name, a, b) in [
            ("filled - before, no stemming", get("none", "filled"), get("none", "before")),
            ("stemmed - not, both filled", get("english", "filled"), get("none", "filled")),
            ("filled+stemmed - before", get("english", "filled"), get("none", "before")),
            ("filled - any term, stemmed", get("english", "filled"), get("english", "any term")),
            ("prefix fill - plain fill, stemmed", get("english", "prefixes"), get("english", "filled")),
            ("search now - before (none, plain)", get("english", "prefixes"), get("none", "before")),
        ] {
            let (mean, lo, hi) = bootstrap(&a.ndcg, &b.ndcg);
            println!("{form:<30} {name:<34} {mean:+.4} [{lo:+.4}, {hi:+.4}]");
        }
    }
    Ok(())
}

/// The MATCH expressions search runs for `text` on `store` (prefixes searched by their root).
fn searched(store: &dyn Store, text: &str) -> Result<FtsQuery, String> {
    fts_query_rooted(text, &mut |p| store.prefix_root(p))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("query {text:?} has no searchable term"))
}

/// Keyword search's ranking: the every-term list, then the any-term hits not in it.
fn filled(all: &[Candidate], any: &[Candidate]) -> Vec<Candidate> {
    let strict: HashSet<i64> = all.iter().map(|c| c.chunk_id).collect();
    all.iter().cloned().chain(any.iter().filter(|c| !strict.contains(&c.chunk_id)).cloned()).collect()
}

// ---------------------------------------------------------------------------------------------
// Lists, fusion and the check against Kb::search

/// One query's candidates, each list its first `window` chunks.
struct Lists {
    /// What keyword search ranks: every term, then any term.
    keyword: Vec<Candidate>,
    /// Any term: hybrid's keyword list.
    any: Vec<Candidate>,
    semantic: Vec<Candidate>,
    /// Whether some chunk holds every term (the every-term query matched).
    and_matched: bool,
}

/// Fails unless Kb::search's first page in each mode is `lists` grouped the way search groups
/// them: the sweeps below then measure the search users get.
fn check_against_search(kb: &Kb, q: &Query, lists: &Lists, per_doc: usize, k: f64, w: f64) -> Result<(), String> {
    for (mode, expected) in [
        (SearchMode::Keyword, group(&lists.keyword, per_doc, LIMIT)),
        (SearchMode::Semantic, group(&lists.semantic, per_doc, LIMIT)),
        (SearchMode::Hybrid, group(&fuse(&lists.keyword, &lists.semantic, k, w).0, per_doc, LIMIT)),
    ] {
        let request: SearchRequest = serde_json::from_value(json!({ "query": q.text, "mode": mode, "limit": LIMIT }))
            .map_err(|e| e.to_string())?;
        let got = kb.search(&request).map_err(|e| format!("search {:?} ({mode:?}): {e}", q.text))?;
        if got.mode != mode || !same_page(&got, &expected) {
            return Err(format!(
                "query {:?}, {mode:?}: Kb::search returned a different page than the bench's lists; \
                 the bench no longer mirrors src/kb/search.rs",
                q.text
            ));
        }
    }
    Ok(())
}

/// The same hits in the same order; hits of equal score may swap (their order under a larger
/// window is not specified).
fn same_page(got: &SearchResponse, expected: &[Candidate]) -> bool {
    got.results.len() == expected.len()
        && got.results.iter().zip(expected).all(|(hit, c)| {
            (hit.id == c.document_id && hit.chunk_index as i64 == c.chunk_index)
                || (hit.score - c.score.max(0.0)).abs() <= 1e-9 * c.score.abs().max(1.0)
        })
}

#[derive(Clone, Copy)]
enum Norm {
    MinMax,
    Z,
}

/// Convex combination per chunk: each list's scores normalised over that list; a chunk missing
/// from a list gets that list's lowest normalised score (0 for min-max, so a list of one hit
/// does not hand everything else its score).
fn convex(keyword: &[Candidate], semantic: &[Candidate], alpha: f64, norm: Norm) -> Vec<Candidate> {
    let normalised = |list: &[Candidate]| -> HashMap<i64, f64> {
        let scores: Vec<f64> = list.iter().map(|c| c.score).collect();
        let n = scores.len().max(1) as f64;
        let values: Vec<f64> = match norm {
            Norm::MinMax => {
                let lo = scores.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                scores.iter().map(|s| if hi > lo { (s - lo) / (hi - lo) } else { 1.0 }).collect()
            }
            Norm::Z => {
                let mean = scores.iter().sum::<f64>() / n;
                let sd = (scores.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n).sqrt();
                scores.iter().map(|s| if sd > 0.0 { (s - mean) / sd } else { 0.0 }).collect()
            }
        };
        list.iter().map(|c| c.chunk_id).zip(values).collect()
    };
    let (nk, ns) = (normalised(keyword), normalised(semantic));
    let floor = |m: &HashMap<i64, f64>| m.values().copied().fold(0.0, f64::min);
    let (fk, fs) = (floor(&nk), floor(&ns));
    let mut seen = HashSet::new();
    let mut out: Vec<Candidate> = keyword
        .iter()
        .chain(semantic)
        .filter(|c| seen.insert(c.chunk_id))
        .map(|c| {
            let score = alpha * ns.get(&c.chunk_id).copied().unwrap_or(fs)
                + (1.0 - alpha) * nk.get(&c.chunk_id).copied().unwrap_or(fk);
            Candidate { score, ..c.clone() }
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.chunk_id.cmp(&b.chunk_id)));
    out
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// Where (from 0) the relevant document first appears, documents ranked by their best chunk.
fn doc_position(ranked: &[Candidate], relevant: &str) -> Option<usize> {
    let mut seen = HashSet::new();
    for c in ranked {
        if seen.insert(c.document_id.as_str()) && c.document_id == relevant {
            return Some(seen.len() - 1);
        }
    }
    None
}

/// Per-query nDCG@10, recall@10 and reciprocal rank (one relevant document, so the ideal DCG is 1).
struct Scores {
    ndcg: Vec<f64>,
    recall: Vec<f64>,
    rr: Vec<f64>,
}

impl Scores {
    fn of(positions: impl Iterator<Item = Option<usize>>) -> Scores {
        let mut s = Scores { ndcg: Vec::new(), recall: Vec::new(), rr: Vec::new() };
        for p in positions {
            let top = p.filter(|p| *p < LIMIT);
            s.ndcg.push(top.map_or(0.0, |p| 1.0 / (p as f64 + 2.0).log2()));
            s.recall.push(if top.is_some() { 1.0 } else { 0.0 });
            // MRR@10: a hit past the page counts nothing, as for nDCG@10 and recall@10.
            s.rr.push(top.map_or(0.0, |p| 1.0 / (p as f64 + 1.0)));
        }
        s
    }

    fn subset(&self, keep: &[bool]) -> Scores {
        let pick = |v: &[f64]| v.iter().zip(keep).filter(|(_, k)| **k).map(|(x, _)| *x).collect();
        Scores { ndcg: pick(&self.ndcg), recall: pick(&self.recall), rr: pick(&self.rr) }
    }

    fn ndcg(&self) -> f64 {
        mean(&self.ndcg)
    }

    fn recall(&self) -> f64 {
        mean(&self.recall)
    }

    fn mrr(&self) -> f64 {
        mean(&self.rr)
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn print_grid(metric: &str, grid: &[((f64, f64), Scores)], value: &dyn Fn(&Scores) -> f64, run_k: f64, run_w: f64) {
    println!("\n== weighted RRF sweep, {metric} (rows rrf_k, columns hybrid_weight = the semantic list's share; * best, d the settings hybrid ran with) ==");
    let best = grid.iter().map(|(_, s)| value(s)).fold(f64::NEG_INFINITY, f64::max);
    print!("{:>7}", "k \\ w");
    for w in WEIGHTS {
        print!(" {w:>8.1}");
    }
    println!();
    for k in RRF_KS {
        print!("{k:>7}");
        for ((gk, gw), s) in grid.iter().filter(|((gk, _), _)| *gk == k) {
            let v = value(s);
            let mark = if v == best {
                '*'
            } else if *gk == run_k && *gw == run_w {
                'd'
            } else {
                ' '
            };
            print!(" {v:>7.4}{mark}");
        }
        println!();
    }
}

/// Mean of `a - b` and its paired bootstrap 95% interval.
fn bootstrap(a: &[f64], b: &[f64]) -> (f64, f64, f64) {
    let diff: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    let n = diff.len();
    let mut rng = SplitMix(SEED);
    let mut means: Vec<f64> = (0..RESAMPLES)
        .map(|_| (0..n).map(|_| diff[(rng.next() % n as u64) as usize]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    (mean(&diff), means[RESAMPLES * 25 / 1000], means[RESAMPLES * 975 / 1000 - 1])
}

/// A small deterministic generator, so intervals repeat run to run.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
