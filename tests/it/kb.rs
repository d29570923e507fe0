//! Knowledge base through the real binary: sync propagation, queries, filters, crash safety.

use std::process::Command;
use std::time::Duration;

use crate::common::Workspace;

const FS_CONFIG: &str = "[connectors.filesystem.docs]\nroot = \"docs\"\n";

fn titles(ws: &Workspace, query: &str, extra: &[&str]) -> Vec<String> {
    let response = ws.ctx(&[&["search", "--json"], extra, &["--", query]].concat()).json();
    response["results"].as_array().unwrap().iter().map(|r| r["title"].as_str().unwrap().to_string()).collect()
}

fn summary(ws: &Workspace, args: &[&str]) -> serde_json::Value {
    let out = ws.ctx(&[&["sync", "--json"], args].concat()).ok();
    serde_json::from_str(out.lines().next().expect("one summary line")).unwrap()
}

#[test]
fn add_change_delete_rename_propagate() {
    Workspace::each_backend(FS_CONFIG, |ws, backend| {
        ws.write("docs/alpha.md", "# Alpha\n\nThe walrus guards the deploy pipeline.\n");
        ws.write("docs/beta.md", "# Beta\n\nPenguins run the incident rota.\n");
        let s = summary(ws, &[]);
        assert_eq!((s["added"].as_u64(), s["deleted"].as_u64()), (Some(2), Some(0)));
        assert_eq!(titles(ws, "walrus", &[]), vec!["Alpha"]);

        // Unchanged files are skipped by hash.
        let s = summary(ws, &[]);
        assert_eq!((s["added"].as_u64(), s["unchanged"].as_u64()), (Some(0), Some(2)));

        // Change: new text is found, old text is gone.
        ws.write("docs/alpha.md", "# Alpha\n\nThe narwhal guards the deploy pipeline.\n");
        let s = summary(ws, &[]);
        assert_eq!(s["updated"].as_u64(), Some(1));
        assert!(titles(ws, "walrus", &[]).is_empty());
        assert_eq!(titles(ws, "narwhal", &[]), vec!["Alpha"]);

        // Rename: the old path is deleted, the new one added.
        std::fs::rename(ws.path().join("docs/beta.md"), ws.path().join("docs/gamma.md")).unwrap();
        let s = summary(ws, &[]);
        assert_eq!((s["added"].as_u64(), s["deleted"].as_u64()), (Some(1), Some(1)));
        let hits = ws.ctx(&["search", "penguins", "--json"]).json();
        assert_eq!(hits["results"].as_array().unwrap().len(), 1);
        let id = hits["results"][0]["id"].as_str().unwrap();
        let doc = ws.ctx(&["get", id, "--json"]).json();
        assert_eq!(doc["source_id"], "gamma.md");

        // Delete: document, chunks and index rows all go.
        std::fs::remove_file(ws.path().join("docs/gamma.md")).unwrap();
        let s = summary(ws, &[]);
        assert_eq!(s["deleted"].as_u64(), Some(1));
        assert!(titles(ws, "penguins", &[]).is_empty());
        // The file: on PostgreSQL, the replica's copy.
        let file = if backend == "sqlite" { "data/ctx.sqlite" } else { "data/replica-kb.sqlite" };
        let db = rusqlite::Connection::open(ws.path().join(file)).unwrap();
        let chunks: i64 = db.query_row("SELECT COUNT(*) FROM chunks", [], |r| r.get(0)).unwrap();
        let fts: i64 = db
            .query_row("SELECT COUNT(*) FROM chunks_fts WHERE chunks_fts MATCH 'penguins'", [], |r| r.get(0))
            .unwrap();
        assert_eq!((chunks, fts), (1, 0), "{backend}");
        db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('integrity-check')", []).unwrap();
    });
}

#[test]
fn file_with_old_mtime_added_after_a_sync_is_indexed() {
    Workspace::each_backend(FS_CONFIG, |ws, _backend| {
        ws.write("docs/new.md", "fresh content\n");
        summary(ws, &[]);
        ws.write("docs/old.md", "# Archive\n\nquokka notes from long ago\n");
        let status =
            Command::new("touch").args(["-d", "2001-02-03", "docs/old.md"]).current_dir(ws.path()).status().unwrap();
        assert!(status.success());
        let s = summary(ws, &[]);
        assert_eq!(s["added"].as_u64(), Some(1));
        let hits = ws.ctx(&["search", "quokka", "--json"]).json();
        assert_eq!(hits["results"][0]["updated_at"], "2001-02-03T00:00:00Z");
        // --since filters on updated_at inside the query.
        assert!(titles(ws, "quokka", &["--since", "2020-01-01"]).is_empty());
    });
}

#[test]
fn any_text_is_a_valid_query() {
    Workspace::each_backend(FS_CONFIG, |ws, _backend| {
        ws.write("docs/ops.md", "# Ops\n\nDo NOT restart the database AND OR the cache.\n");
        ws.write("docs/lang.md", "# Languages\n\nWe write c++ and foo:bar configs, with -x flags. Café in 東京.\n");
        summary(ws, &[]);
        assert_eq!(titles(ws, "NOT", &[]), vec!["Ops"]);
        // Terms are OR-ed: both documents contain "and", the one with both words ranks first.
        assert_eq!(titles(ws, "\"AND OR\"", &[])[0], "Ops");
        assert!(titles(ws, "c++", &[]).contains(&"Languages".to_string()));
        assert_eq!(titles(ws, "foo:bar", &[]), vec!["Languages"]);
        assert_eq!(titles(ws, "-x", &[]), vec!["Languages"]);
        assert_eq!(titles(ws, "cafe", &[]), vec!["Languages"], "diacritics fold");
        assert_eq!(titles(ws, "東京", &[]), vec!["Languages"]);
        assert_eq!(titles(ws, "restar*", &[]), vec!["Ops"], "a trailing * is a prefix");
        assert_eq!(titles(ws, "NEAR(a b) ^x \"", &[]).len(), 1);

        let empty = ws.ctx(&["search", "  "]);
        assert_eq!(empty.code(), 2);
        assert!(empty.stderr().contains("the search query is empty"), "{}", empty.stderr());
        let symbols = ws.ctx(&["search", "--", "--- +++"]);
        assert_eq!(symbols.code(), 2);
    });
}

#[test]
fn source_filter_applies_before_top_k() {
    Workspace::each_backend(
        "[connectors.filesystem.loud]\nroot = \"loud\"\n[connectors.filesystem.quiet]\nroot = \"quiet\"\n",
        |ws, _backend| {
            for i in 0..40 {
                ws.write(&format!("loud/doc{i}.md"), &format!("# Loud {i}\n\nbanana banana banana banana split {i}\n"));
            }
            ws.write("quiet/one.md", "# Quiet\n\nA long note that mentions a banana only once among many other words about nothing in particular at all.\n");
            let out = ws.ctx(&["sync", "--json"]).ok();
            assert_eq!(out.lines().count(), 2);
            assert_eq!(titles(ws, "banana", &["--source", "filesystem:quiet", "--limit", "1"]), vec!["Quiet"]);
            assert_eq!(titles(ws, "banana", &["--source", "quiet", "--limit", "3"]), vec!["Quiet"]);
            assert_eq!(titles(ws, "banana", &["--limit", "5"]).len(), 5);

            let unknown = ws.ctx(&["search", "banana", "--source", "nope"]);
            assert_eq!(unknown.code(), 2);
            assert!(
                unknown.stderr().contains("known sources: filesystem:loud, filesystem:quiet"),
                "{}",
                unknown.stderr()
            );
        },
    );
}

#[test]
fn one_document_cannot_fill_the_page() {
    Workspace::each_backend("[chunking]\nmax_tokens = 32\noverlap_tokens = 4\n[retrieval]\nmax_chunks_per_doc = 2\n[connectors.filesystem.docs]\nroot = \"docs\"\n", |ws, _backend| {
    let long: String = (0..30).map(|i| format!("Paragraph {i} talks about the zebra migration.\n\n")).collect();
    ws.write("docs/long.md", &format!("# Long\n\n{long}"));
    ws.write("docs/short.md", "# Short\n\nOne zebra.\n");
    summary(ws, &[]);
    let results = titles(ws, "zebra", &["--limit", "10"]);
    assert_eq!(results.iter().filter(|t| *t == "Long").count(), 2, "{results:?}");
    assert!(results.contains(&"Short".to_string()));
    });
}

#[test]
fn semantic_needs_a_provider_and_hybrid_falls_back() {
    let ws = Workspace::new(FS_CONFIG);
    ws.write("docs/a.md", "otter\n");
    summary(&ws, &[]);
    let semantic = ws.ctx(&["search", "otter", "--mode", "semantic"]);
    assert_eq!(semantic.code(), 2);
    assert!(semantic.stderr().contains("[embedding]"), "{}", semantic.stderr());
    let hybrid = ws.ctx(&["search", "otter", "--mode", "hybrid", "--json", "--explain"]).json();
    assert_eq!(hybrid["mode"], "keyword");
    assert_eq!(hybrid["explain"]["requested_mode"], "hybrid");
    assert!(hybrid["explain"]["notes"][0].as_str().unwrap().contains("fell back to keyword"));
}

#[test]
fn bad_files_are_skipped_and_counted() {
    Workspace::each_backend(
        "[connectors.filesystem.docs]\nroot = \"docs\"\nmax_file_bytes = 1000\n",
        |ws, _backend| {
            ws.write("docs/good.md", "# Good\n\nfine\n");
            ws.write("docs/big.md", &"x".repeat(5000));
            std::fs::write(ws.path().join("docs/blob.md"), b"abc\0def").unwrap();
            std::fs::write(ws.path().join("docs/latin1.md"), b"caf\xe9 au lait ocelot\n").unwrap();
            std::os::unix::fs::symlink("missing-target.md", ws.path().join("docs/dangling.md")).unwrap();
            let s = summary(ws, &[]);
            assert_eq!(s["added"].as_u64(), Some(2), "{s}");
            assert_eq!(s["skipped"].as_u64(), Some(3), "{s}");
            let hit = ws.ctx(&["search", "ocelot", "--json"]).json();
            let doc = ws.ctx(&["get", hit["results"][0]["id"].as_str().unwrap(), "--json"]).json();
            assert_eq!(doc["metadata"]["lossy_utf8"], true);
            assert!(doc["body"].as_str().unwrap().contains('\u{FFFD}'));
        },
    );
}

#[test]
fn a_failing_source_does_not_stop_the_others() {
    Workspace::each_backend(
        "[connectors.filesystem.gone]\nroot = \"nowhere\"\n[connectors.filesystem.docs]\nroot = \"docs\"\n",
        |ws, _backend| {
            ws.write("docs/a.md", "lynx\n");
            let run = ws.ctx(&["sync"]);
            assert_eq!(run.code(), 1);
            assert!(
                run.stderr().contains("filesystem:gone: root folder \"nowhere\" does not exist"),
                "{}",
                run.stderr()
            );
            assert_eq!(titles(ws, "lynx", &[]), vec!["a.md"]);
            let sources = ws.ctx(&["sources", "--json"]).json();
            let gone = sources["sources"].as_array().unwrap().iter().find(|s| s["name"] == "filesystem:gone").unwrap();
            assert_eq!(gone["healthy"], false);
        },
    );
}

#[test]
fn dry_run_writes_nothing_and_unknown_target_lists_sources() {
    Workspace::each_backend(FS_CONFIG, |ws, _backend| {
        ws.write("docs/a.md", "heron\n");
        let s = summary(ws, &["--dry-run"]);
        assert_eq!((s["added"].as_u64(), s["dry_run"].as_bool()), (Some(1), Some(true)));
        assert!(titles(ws, "heron", &[]).is_empty());
        let bad = ws.ctx(&["sync", "filesystem:nope"]);
        assert_eq!(bad.code(), 2);
        assert!(bad.stderr().contains("filesystem:docs"), "{}", bad.stderr());
        summary(ws, &["filesystem:docs"]);
        assert_eq!(titles(ws, "heron", &[]), vec!["a.md"]);
    });
}

/// The kill must land mid-sync: the child is still running when it is killed and some, not all,
/// documents are committed. A sync that finished before the first poll fails this test.
#[test]
fn killed_sync_leaves_a_consistent_database_and_resync_completes() {
    let ws = Workspace::new(FS_CONFIG);
    let total = 6000;
    for i in 0..total {
        ws.write(&format!("docs/d{i:05}.md"), &format!("# Doc {i}\n\nbody of document {i} about capybaras\n"));
    }
    // Wait until some, but not all, batches are committed, then kill -9.
    let (seen, running) = crate::common::kill_mid_sync(&ws);
    assert!(seen > 0, "the sync wrote something before the kill");
    assert!(running, "the sync had already exited when it was killed: the kill proved nothing");

    let db = ws.db();
    let integrity: String = db.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(integrity, "ok");
    db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES('integrity-check')", []).unwrap();
    let orphans: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM chunks c LEFT JOIN documents d ON d.id = c.document_id WHERE d.id IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(orphans, 0);
    let committed: i64 = db.query_row("SELECT COUNT(*) FROM documents", [], |r| r.get(0)).unwrap();
    drop(db);
    assert!(0 < committed && committed < total as i64, "the kill landed mid-sync: {committed} of {total} committed");

    let s = summary(&ws, &[]);
    assert_eq!(s["added"].as_u64().unwrap() + s["unchanged"].as_u64().unwrap(), total as u64);
    assert_eq!(s["unchanged"].as_u64().unwrap(), committed as u64, "committed batches are not redone");
    let count: i64 = ws.db().query_row("SELECT COUNT(*) FROM documents", [], |r| r.get(0)).unwrap();
    assert_eq!(count, total as i64);
}

fn git(dir: &std::path::Path, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=Ada", "-c", "user.email=ada@example.com"])
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_DATE", "2026-03-01T10:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-03-01T10:00:00Z")
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

#[test]
fn git_source_syncs_history_and_deletions() {
    Workspace::each_backend(
        "[connectors.git.handbook]\nurl = \"repo\"\nbranch = \"main\"\nsource_url = \"https://git.example.com/handbook/blob/{branch}/{path}\"\ninclude = [\"**/*.md\"]\n", |ws, _backend| {
    let repo = ws.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("guide.md"), "# Guide\n\nThe mongoose handles escalations.\n").unwrap();
    std::fs::write(repo.join("old.md"), "# Old\n\nobsolete platypus page\n").unwrap();
    std::fs::write(repo.join("code.rs"), "fn main() {}\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "first"]);
    let s = summary(ws, &[]);
    assert_eq!(s["added"].as_u64(), Some(2), "{s}");
    let hits = ws.ctx(&["search", "mongoose", "--json"]).json();
    let hit = &hits["results"][0];
    assert_eq!(hit["source"], "git:handbook");
    assert_eq!(hit["source_url"], "https://git.example.com/handbook/blob/main/guide.md");
    assert_eq!(hit["updated_at"], "2026-03-01T10:00:00Z");
    let doc = ws.ctx(&["get", hit["id"].as_str().unwrap(), "--json"]).json();
    assert_eq!(doc["author"], "Ada");

    git(&repo, &["rm", "-q", "old.md"]);
    git(&repo, &["commit", "-q", "-m", "drop old"]);
    let s = summary(ws, &["git"]);
    assert_eq!((s["deleted"].as_u64(), s["unchanged"].as_u64()), (Some(1), Some(1)), "{s}");
    assert!(titles(ws, "platypus", &[]).is_empty());
    });
}

#[test]
fn lua_connector_syncs_end_to_end_with_deletions_and_invalid_items() {
    Workspace::each_backend(
        "[connectors.script.tickets]\npath = \"connectors/tickets.lua\"\ntimeout = 10\nproject = \"OPS\"\n",
        |ws, _backend| {
            ws.write(
                "connectors/tickets.lua",
                r#"
local ext = { name = "tickets" }
function ext.scan(config)
  local items = {}
  for _, t in ipairs(json.parse(fs.read("tickets.json"))) do
    items[#items + 1] = {
      source_id = t.id, title = config.project .. "-" .. t.id, body = t.text,
      updated_at = t.when, source_url = "https://tickets.example/" .. t.id,
      metadata_json = { priority = t.priority },
    }
  end
  items[#items + 1] = { source_id = "broken", title = 42 }
  return items
end
return ext
"#,
            );
            ws.write(
        "connectors/tickets.json",
        r#"[{"id":"1","text":"the gerbil escaped the datacenter","when":"2026-02-01T09:00:00+01:00","priority":"high"},
            {"id":"2","text":"replace the hamster wheel","when":1767225600,"priority":"low"}]"#,
    );
            let s = summary(ws, &["script:tickets"]);
            assert_eq!((s["added"].as_u64(), s["skipped"].as_u64()), (Some(2), Some(1)), "{s}");
            let hits = ws.ctx(&["search", "gerbil", "--json"]).json();
            let hit = &hits["results"][0];
            assert_eq!((hit["title"].as_str(), hit["source"].as_str()), (Some("OPS-1"), Some("script:tickets")));
            assert_eq!(hit["updated_at"], "2026-02-01T08:00:00Z");
            let doc = ws.ctx(&["get", hit["id"].as_str().unwrap(), "--json"]).json();
            assert_eq!(doc["metadata"], serde_json::json!({"priority": "high"}));
            assert_eq!(doc["content_type"], "text/plain");

            // The invalid item is counted, and `-v` names it with its field.
            let run = ws.ctx(&["sync", "script"]);
            assert!(run.stdout().contains("  skipped 1 invalid item (-v lists them)"), "{}", run.stdout());
            let run = ws.ctx(&["sync", "script", "-v"]);
            assert!(run.stderr().contains("item 3: body: missing"), "{}", run.stderr());

            ws.write(
                "connectors/tickets.json",
                r#"[{"id":"2","text":"replace the hamster wheel","when":1767225600,"priority":"low"}]"#,
            );
            let s = summary(ws, &[]);
            assert_eq!((s["deleted"].as_u64(), s["unchanged"].as_u64()), (Some(1), Some(1)), "{s}");
            assert!(titles(ws, "gerbil", &[]).is_empty());

            // A script error fails this source only, with a relative path and line.
            ws.write(
                "connectors/tickets.lua",
                "local ext = {}\nfunction ext.scan() error('api down') end\nreturn ext\n",
            );
            let run = ws.ctx(&["sync"]);
            assert_eq!(run.code(), 1);
            assert!(run.stderr().contains("script:tickets: connectors/tickets.lua:2: api down"), "{}", run.stderr());
            assert_eq!(titles(ws, "hamster", &[]), vec!["OPS-2"], "a failed scan deletes nothing");
        },
    );
}

#[test]
fn connector_init_and_test_commands() {
    let ws = Workspace::new("");
    let out = ws.ctx(&["connector", "init", "wiki"]).ok();
    assert!(out.contains("[connectors.script.wiki]"), "{out}");
    assert!(ws.path().join("connectors/wiki.lua").is_file());
    let again = ws.ctx(&["connector", "init", "wiki"]);
    assert_eq!(again.code(), 2);
    let test = ws.ctx(&["connector", "test", "connectors/wiki.lua"]).ok();
    assert!(test.contains("example-1 (Example item)"), "{test}");
    assert!(test.contains("1 valid item(s) and 0 invalid"), "{test}");
    let unknown = ws.ctx(&["connector", "test", "connectors/wiki.lua", "--source", "nope"]);
    assert_eq!(unknown.code(), 2);
    assert!(unknown.stderr().contains("no [connectors.script.nope]"), "{}", unknown.stderr());
}

/// Writes `count` documents of words drawn (deterministically, skewed toward the first words)
/// from a small vocabulary, so common and rare terms both occur.
fn write_word_corpus(ws: &Workspace, count: usize, seed: u64) {
    const WORDS: &[&str] = &[
        "deploy", "service", "rollback", "kafka", "latency", "token", "cluster", "canary", "vacuum", "ledger",
        "oncall", "runbook", "shard", "quota", "ingress", "walrus", "pager", "sprint", "audit", "replica",
    ];
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    for doc in 0..count {
        let mut text = format!("# {} {}\n\n", WORDS[next() % WORDS.len()], doc);
        for _ in 0..(5 + next() % 60) {
            // Squaring skews the draw toward the first words.
            let r = next() % 1000;
            text.push_str(WORDS[(r * r / 1000) * WORDS.len() / 1000]);
            text.push(' ');
        }
        ws.write(&format!("docs/d{doc}.md"), &text);
    }
}

/// Syncs the workspace with the binary, then opens its knowledge base in this process.
fn synced_kb(ws: &Workspace) -> ctx::kb::Kb {
    ws.ctx(&["sync"]).ok();
    let config = ctx::config::Config::load(&ctx::config::locate(Some(&ws.path().join("ctx.toml")))).unwrap();
    ctx::kb::Kb::open(std::sync::Arc::new(config)).unwrap()
}

/// One-term searches are ranked in Rust from posting lists (kb::term_rank); FTS5's bm25() over
/// every match is the reference. Same chunks, same scores, also after a re-sync changed and
/// deleted documents (the cached lists and token counts are refreshed).
#[test]
fn one_term_scores_equal_fts5_bm25() {
    let ws = Workspace::new(FS_CONFIG);
    write_word_corpus(&ws, 300, 7);
    let kb = synced_kb(&ws);
    let compare = |round: &str| {
        for word in ["deploy", "service", "rollback", "walrus", "replica", "nosuchword"] {
            let fts = format!("\"{word}\"");
            let ours = kb.store().keyword_candidates(&fts, &Default::default(), 5000).unwrap();
            let theirs = kb.store().keyword_candidates_by_fts5(&fts, &Default::default(), 5000).unwrap();
            let pairs =
                |list: &[ctx::kb::store::Candidate]| list.iter().map(|c| (c.chunk_id, c.score)).collect::<Vec<_>>();
            assert_eq!(pairs(&ours), pairs(&theirs), "{round}: {word}: the same chunks, scores and order");
            if word != "nosuchword" {
                assert!(ours.len() > 3, "{round}: {word} matches several chunks");
            }
        }
    };
    compare("first sync");
    // Change lengths and term counts, and delete some documents: the generation moves.
    write_word_corpus(&ws, 200, 99);
    for doc in 250..300 {
        std::fs::remove_file(ws.path().join(format!("docs/d{doc}.md"))).unwrap();
    }
    ws.ctx(&["sync"]).ok();
    compare("after a re-sync");
}

/// A budgeted (inline) search that runs out of time is interrupted and reported as not done, so
/// the caller runs it again on the blocking pool; one within its budget answers normally.
#[test]
fn a_search_over_its_inline_budget_is_interrupted_not_failed() {
    let ws = Workspace::new(FS_CONFIG);
    write_word_corpus(&ws, 300, 3);
    let kb = synced_kb(&ws);
    let request: ctx::types::SearchRequest = serde_json::from_value(serde_json::json!({"query": "deploy"})).unwrap();
    let out_of_time = ctx::kb::budget::within(Duration::ZERO, || kb.search(&request));
    assert!(out_of_time.is_none(), "a zero budget interrupts the query");
    let answered = ctx::kb::budget::within(Duration::from_secs(30), || kb.search(&request)).expect("within budget");
    assert!(!answered.unwrap().results.is_empty());
    // Outside `within` nothing is budgeted.
    assert!(!kb.search(&request).unwrap().results.is_empty());
}
