//! Keyword top-k from posting lists is exact. On generated corpora with a skewed
//! vocabulary and many ties, under both tokenizers, for one-, two- and three-term queries joined
//! by AND and by OR, with term starts, source and date filters, and after updates and deletions,
//! `keyword_candidates` gives the chunks, the scores (bit for bit) and the order of FTS5's
//! `bm25()` scoring every match.

use std::time::{Duration, SystemTime};

use ctx::kb::store::{Candidate, SearchFilter};

use crate::common::Workspace;

const CONFIG: &str =
    "[connectors.filesystem.docs]\nroot = \"docs\"\n\n[connectors.filesystem.notes]\nroot = \"notes\"\n";

/// Zipf-like: the first words are in most chunks, the last in a few. Stemming folds several.
const WORDS: &[&str] = &[
    "service",
    "deploy",
    "data",
    "deployed",
    "deploying",
    "services",
    "rollback",
    "cluster",
    "replica",
    "config",
    "walrus",
    "latency",
    "queue",
    "deployment",
    "token",
    "migrate",
    "ocelot",
    "zebu",
    "quoll",
    "numbat",
];

/// A deterministic generator, so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as usize
    }

    /// A word, the earlier ones far more often (about 1/rank).
    fn word(&mut self) -> &'static str {
        let r = (self.next() % 10_000) as f64 / 10_000.0;
        let at = ((WORDS.len() as f64 + 1.0).powf(r) - 1.0) as usize;
        WORDS[at.min(WORDS.len() - 1)]
    }
}

/// `count` files per folder. Every fifth file of a folder is the same text (ties of every
/// score), the rest are 3 to 80 skewed words; a title heading on some (the title weighs 1.5).
/// Half of the files are dated 2020 for the `since` filter.
fn write_corpus(ws: &Workspace, count: usize, seed: u64) {
    let mut rng = Rng(seed);
    for folder in ["docs", "notes"] {
        for n in 0..count {
            let text = if n % 5 == 0 {
                "# Deploy notes\n\nservice deploy data service rollback\n".to_string()
            } else {
                let mut text = if n % 3 == 0 { format!("# {} {}\n\n", rng.word(), rng.word()) } else { String::new() };
                for _ in 0..(3 + rng.next() % 78) {
                    text.push_str(rng.word());
                    text.push(' ');
                }
                text
            };
            let rel = format!("{folder}/f{n}.md");
            ws.write(&rel, &text);
            if n % 2 == 0 {
                let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_590_000_000 + n as u64 * 60);
                std::fs::File::options().write(true).open(ws.path().join(&rel)).unwrap().set_modified(old).unwrap();
            }
        }
    }
}

fn pairs(list: &[Candidate]) -> Vec<(i64, f64)> {
    list.iter().map(|c| (c.chunk_id, c.score)).collect()
}

/// Every query of `queries` under every filter and several k: posting lists against bm25().
fn compare(kb: &ctx::kb::Kb, label: &str) -> usize {
    let queries = [
        "\"service\"",
        "\"walrus\"",
        "\"numbat\"",
        "\"nosuchword\"",
        "\"service\" AND \"deploy\"",
        "\"service\" AND \"deploy\" AND \"data\"",
        "\"deploy\" AND \"deployed\"",
        "\"service\" AND \"numbat\"",
        "\"service\" OR \"deploy\"",
        "\"service\" OR \"deploy\" OR \"data\"",
        "\"walrus\" OR \"quoll\" OR \"nosuchword\"",
        "\"deplo\"*",
        "\"serv\"* AND \"data\"",
        "\"service\"* OR \"walrus\" OR \"q\"*",
        "\"Service\" AND \"DEPLOY\"",
    ];
    let filters = [
        SearchFilter::default(),
        SearchFilter { sources: Some(vec!["filesystem:notes".into()]), since: None },
        SearchFilter { sources: None, since: Some("2021-01-01T00:00:00Z".into()) },
        SearchFilter {
            sources: Some(vec!["filesystem:docs".into(), "filesystem:nope".into()]),
            since: Some("2020-05-20T21:00:00Z".into()),
        },
    ];
    let mut nonempty = 0;
    for fts in queries {
        for (f, filter) in filters.iter().enumerate() {
            for k in [1, 10, 30, 5000] {
                let ours = kb.store().keyword_candidates(fts, filter, k).unwrap();
                let theirs = kb.store().keyword_candidates_by_fts5(fts, filter, k).unwrap();
                assert_eq!(pairs(&ours), pairs(&theirs), "{label}: {fts}, filter {f}, k {k}");
                nonempty += usize::from(!ours.is_empty());
            }
        }
    }
    nonempty
}

#[test]
fn posting_lists_equal_bm25_of_every_match_under_both_tokenizers() {
    for stemming in ["english", "none"] {
        let ws = Workspace::new(&format!("{CONFIG}\n[retrieval]\nstemming = \"{stemming}\"\n"));
        write_corpus(&ws, 150, 22);
        ws.ctx(&["sync"]).ok();
        let config = ctx::config::Config::load(&ctx::config::locate(Some(&ws.path().join("ctx.toml")))).unwrap();
        let kb = ctx::kb::Kb::open(std::sync::Arc::new(config)).unwrap();
        let found = compare(&kb, &format!("{stemming}, first sync"));
        // Most of the 240 comparisons find something: the test is not comparing empty lists.
        assert!(found > 150, "{stemming}: {found} comparisons found chunks");

        // New lengths and counts, deletions, a folder gone: the cached lists must follow.
        write_corpus(&ws, 110, 23);
        for n in 110..150 {
            std::fs::remove_file(ws.path().join(format!("docs/f{n}.md"))).unwrap();
            std::fs::remove_file(ws.path().join(format!("notes/f{n}.md"))).unwrap();
        }
        ws.ctx(&["sync"]).ok();
        let found = compare(&kb, &format!("{stemming}, after a re-sync"));
        assert!(found > 150, "{stemming}: {found} comparisons found chunks after the re-sync");
    }
}

/// The tie rule: 60 identical chunks tie on every query; the top k are the lowest ids, in order.
#[test]
fn ties_are_broken_by_the_lower_chunk_id() {
    let ws = Workspace::new("[connectors.filesystem.docs]\nroot = \"docs\"\n");
    for n in 0..60 {
        ws.write(&format!("docs/same{n:02}.md"), "alpha beta gamma\n");
    }
    ws.write("docs/other.md", "alpha alpha beta\n");
    ws.ctx(&["sync"]).ok();
    let config = ctx::config::Config::load(&ctx::config::locate(Some(&ws.path().join("ctx.toml")))).unwrap();
    let kb = ctx::kb::Kb::open(std::sync::Arc::new(config)).unwrap();
    for fts in ["\"beta\"", "\"alpha\" AND \"beta\"", "\"gamma\" OR \"beta\""] {
        let all = kb.store().keyword_candidates_by_fts5(fts, &SearchFilter::default(), 5000).unwrap();
        for k in [1, 5, 17, 59] {
            let ours = kb.store().keyword_candidates(fts, &SearchFilter::default(), k).unwrap();
            assert_eq!(pairs(&ours), pairs(&all[..k]), "{fts}, k {k}");
            let ids: Vec<i64> = ours.iter().map(|c| c.chunk_id).collect();
            let tied: Vec<&Candidate> = ours.iter().filter(|c| c.score == ours[ours.len() - 1].score).collect();
            assert!(tied.windows(2).all(|w| w[0].chunk_id < w[1].chunk_id), "{fts}: ties by id: {ids:?}");
        }
    }
}

/// An embedding backfill writes vectors only: it moves the vector counter, which the vector index
/// reloads on, and leaves the generation the keyword posting lists are cached on alone (a backfill
/// of a large folder would otherwise make every keyword query read its lists again).
#[test]
fn writing_vectors_leaves_the_keyword_generation_alone() {
    let ws = Workspace::new("[connectors.filesystem.docs]\nroot = \"docs\"\n");
    ws.write("docs/a.md", "alpha beta\n");
    ws.ctx(&["sync"]).ok();
    let config = ctx::config::Config::load(&ctx::config::locate(Some(&ws.path().join("ctx.toml")))).unwrap();
    let db = rusqlite::Connection::open(config.db_path()).unwrap();
    let kb = ctx::kb::Kb::open(std::sync::Arc::new(config)).unwrap();
    let counters = || -> (i64, i64) {
        let read =
            |key: &str| db.query_row("SELECT value FROM store_meta WHERE key = ?1", [key], |r| r.get(0)).unwrap();
        (read("generation"), read("vector_generation"))
    };
    let chunk = kb.store().keyword_candidates("\"alpha\"", &SearchFilter::default(), 1).unwrap()[0].chunk_id;
    let before = counters();
    kb.store().put_vectors("test-model", 2, &[(chunk, vec![0.6, 0.8])]).unwrap();
    let after = counters();
    assert_eq!(after.0, before.0, "the keyword generation is unchanged");
    assert_eq!(after.1, before.1 + 1, "the vector counter moved");
}
