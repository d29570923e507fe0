//! Semantic and hybrid search: vectors written by sync, incremental embedding, model changes,
//! filters before top-k, explain, fallbacks, `context.search` in every mode, and the default
//! local model (wordllama's, installed by scripts/test-env) against its own tokenizer.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};

use crate::common::{Workspace, BIN};

/// Topics of the tiny model: each word's row points along its topic's axis, so words of one
/// topic are paraphrases of each other and strangers to the rest.
const TOPICS: &[&[&str]] = &[
    &["deploy", "release", "ship", "rollout"],
    &["revert", "rollback", "undo", "restore"],
    &["token", "auth", "login", "password"],
    &["invoice", "billing", "payment", "refund"],
    &["the", "a", "to", "how", "do", "i", "of", "and", "is", "doc"],
];

/// Writes a tiny static model (a word-level tokenizer, one F32 row per word) to `dir`.
pub fn write_tiny_model(dir: &Path, dims: usize) {
    std::fs::create_dir_all(dir).unwrap();
    let mut vocab = serde_json::Map::new();
    vocab.insert("[UNK]".into(), json!(0));
    let mut rows: Vec<Vec<f32>> = vec![vec![0.0; dims]];
    for (topic, words) in TOPICS.iter().enumerate() {
        for (i, word) in words.iter().enumerate() {
            vocab.insert((*word).into(), json!(rows.len()));
            let mut row = vec![0.0f32; dims];
            row[topic % dims] = 1.0;
            // A little of a second axis, so words of one topic are close, not identical.
            row[(topic + 1 + i) % dims] += 0.1;
            rows.push(row);
        }
    }
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let header = json!({"embeddings": {"dtype": "F32", "shape": [rows.len(), dims], "data_offsets": [0, rows.len() * dims * 4]}})
        .to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    for v in rows.iter().flatten() {
        file.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
}

const CONFIG: &str = r#"[connectors.filesystem.docs]
root = "docs"

[connectors.filesystem.notes]
root = "notes"

[embedding]
provider = "local"
path = "model"
"#;

/// A workspace with the tiny model and a few documents, synced.
fn workspace() -> Workspace {
    fill(Workspace::new(CONFIG))
}

/// Runs `test` on [`workspace`]'s corpus on each backend (SQLite, then PostgreSQL).
fn each_backend(test: impl Fn(&Workspace)) {
    test(&workspace());
    if let Some(ws) = Workspace::on_postgres(CONFIG) {
        test(&fill(ws));
    }
}

fn fill(ws: Workspace) -> Workspace {
    write_tiny_model(&ws.path().join("model"), 8);
    ws.write("docs/release.md", "# Shipping\n\nHow to release and ship a rollout.\n");
    ws.write("docs/undo.md", "# Going back\n\nRevert the last change and restore service.\n");
    ws.write("docs/login.md", "# Sign in\n\nEvery login needs a token and a password.\n");
    ws.write("notes/refund.md", "# Money back\n\nA refund reverses a payment on the invoice.\n");
    ws.ctx(&["sync"]).ok();
    ws
}

fn search(ws: &Workspace, query: &str, args: &[&str]) -> Value {
    ws.ctx(&[&["search", "--json", "--explain"], args, &["--", query]].concat()).json()
}

fn titles(response: &Value) -> Vec<String> {
    response["results"].as_array().unwrap().iter().map(|r| r["title"].as_str().unwrap().to_string()).collect()
}

fn count(ws: &Workspace, sql: &str) -> i64 {
    ws.db().query_row(sql, [], |r| r.get(0)).unwrap()
}

#[test]
fn sync_writes_a_vector_per_chunk_and_finds_paraphrases() {
    each_backend(|ws| {
        assert_eq!(count(ws, "SELECT COUNT(*) FROM chunk_vectors"), count(ws, "SELECT COUNT(*) FROM chunks"));
        let tagged: (String, i64) =
            ws.db().query_row("SELECT name, dims FROM embedding_models", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        assert_eq!(tagged, ("local:model".to_string(), 8));
        let stats = ws.ctx(&["stats", "--json"]).json();
        assert_eq!(stats["vectors"][0]["chunks"], stats["chunks"], "{stats}");
        assert_eq!(stats["vectors"][0]["model"], "local:model");
        // No document says "rollback", but one is about reverting.
        let keyword = search(ws, "rollback", &[]);
        assert!(titles(&keyword).is_empty(), "{keyword}");
        let semantic = search(ws, "rollback", &["--mode", "semantic", "--limit", "1"]);
        assert_eq!(titles(&semantic), vec!["Going back"], "{semantic}");
        assert_eq!(semantic["mode"], "semantic");
        assert_eq!(semantic["explain"]["model"], "local:model");
        let hit = &semantic["results"][0];
        assert_eq!(hit["explain"]["semantic"]["rank"], 1);
        assert!(hit["explain"]["keyword"].is_null());
        assert!(hit["score"].as_f64().unwrap() > 0.5, "{hit}");
    });
}

#[test]
fn sync_embeds_only_new_or_changed_chunks_and_deletes_with_them() {
    each_backend(|ws| {
        let second = ws.ctx(&["sync", "--json"]).ok();
        let embedded: u64 =
            second.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["embedded"].as_u64().unwrap()).sum();
        assert_eq!(embedded, 0, "an unchanged corpus embeds nothing: {second}");
        // A long document whose second chunk changes: only that chunk is embedded again.
        let para = |word: &str| format!("{word} ").repeat(400);
        ws.write("docs/long.md", &format!("# Long\n\n{}\n\n{}\n", para("deploy"), para("token")));
        let first = ws.ctx(&["sync", "filesystem:docs", "--json"]).json();
        let chunks =
            count(ws, "SELECT COUNT(*) FROM chunks c JOIN documents d ON d.id = c.document_id WHERE d.title = 'Long'");
        assert!(chunks >= 2, "the long document has several chunks");
        assert_eq!(first["embedded"].as_i64().unwrap(), chunks);
        ws.write("docs/long.md", &format!("# Long\n\n{}\n\n{}\n", para("deploy"), para("invoice")));
        let changed = ws.ctx(&["sync", "filesystem:docs", "--json"]).json();
        assert!(
            changed["embedded"].as_i64().unwrap() < chunks,
            "the unchanged chunks keep their vectors: {changed} of {chunks} chunks"
        );
        assert_eq!(count(ws, "SELECT COUNT(*) FROM chunk_vectors"), count(ws, "SELECT COUNT(*) FROM chunks"));
        std::fs::remove_file(ws.path().join("docs/long.md")).unwrap();
        ws.ctx(&["sync"]).ok();
        assert_eq!(count(ws, "SELECT COUNT(*) FROM chunk_vectors"), count(ws, "SELECT COUNT(*) FROM chunks"));
        let orphans = count(
            ws,
            "SELECT COUNT(*) FROM chunk_vectors v LEFT JOIN chunks c ON c.id = v.chunk_id WHERE c.id IS NULL",
        );
        assert_eq!(orphans, 0);
    });
}

#[test]
fn a_model_change_re_embeds_with_a_message_and_embed_backfills() {
    let ws =
        Workspace::new(&CONFIG.replace("[embedding]\nprovider = \"local\"", "[embedding]\nprovider = \"disabled\""));
    write_tiny_model(&ws.path().join("model"), 8);
    std::fs::create_dir_all(ws.path().join("notes")).unwrap();
    ws.write("docs/undo.md", "# Going back\n\nRevert the last change.\n");
    ws.ctx(&["sync"]).ok();
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM chunk_vectors"), 0);
    let refused = ws.ctx(&["embed"]);
    assert_eq!(refused.code(), 2, "{}", refused.stderr());
    assert!(refused.stderr().contains("provider = \"local\""), "{}", refused.stderr());

    // Turning a provider on: `ctx embed` backfills what was synced before.
    std::fs::write(ws.path().join("ctx.toml"), CONFIG).unwrap();
    let out = ws.ctx(&["embed", "--json"]).json();
    assert_eq!(out["embedded"], 1, "{out}");
    assert_eq!(ws.ctx(&["embed", "--json"]).json()["embedded"], 0);

    // Another model (here: the same files cut to 4 dims): sync says so and re-embeds.
    std::fs::write(ws.path().join("ctx.toml"), format!("{CONFIG}dims = 4\nmodel = \"small\"\n")).unwrap();
    let semantic = ws.ctx(&["search", "--mode", "semantic", "--json", "--explain", "--", "rollback"]).json();
    assert!(titles(&semantic).is_empty());
    let note = semantic["explain"]["notes"].to_string();
    assert!(note.contains("no chunk has a vector of local:small") && note.contains("ctx embed"), "{note}");
    let sync = ws.ctx(&["sync"]);
    assert!(
        sync.stderr().contains("the embedding model changed") && sync.stderr().contains("local:model"),
        "{}",
        sync.stderr()
    );
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM chunk_vectors v JOIN embedding_models m ON m.id = v.model_id WHERE m.name = 'local:small' AND m.dims = 4"), 1);
    let semantic = search(&ws, "rollback", &["--mode", "semantic"]);
    assert_eq!(titles(&semantic), vec!["Going back"]);
}

#[test]
fn filters_apply_before_top_k() {
    let ws = Workspace::new(CONFIG);
    write_tiny_model(&ws.path().join("model"), 8);
    // Many close matches in docs, a few weaker ones in notes: a filter after the cut would
    // leave notes with nothing.
    for i in 0..30 {
        ws.write(&format!("docs/r{i}.md"), &format!("# Release {i}\n\nrelease ship rollout {i}\n"));
    }
    for i in 0..5 {
        ws.write(&format!("notes/n{i}.md"), &format!("# Note {i}\n\nrelease of the invoice and refund {i}\n"));
    }
    ws.write("notes/old.md", "# Old note\n\nrelease\n");
    ws.ctx(&["sync"]).ok();
    let all = search(&ws, "deploy", &["--mode", "semantic", "--limit", "5"]);
    assert!(titles(&all).iter().all(|t| t.starts_with("Release")), "{all}");
    let notes = search(&ws, "deploy", &["--mode", "semantic", "--limit", "5", "--source", "notes"]);
    assert_eq!(titles(&notes).len(), 5, "a filtered search returns limit results when that many exist: {notes}");
    assert!(notes["results"].as_array().unwrap().iter().all(|r| r["source"] == "filesystem:notes"));
    // Hybrid too.
    let hybrid = search(&ws, "deploy release", &["--mode", "hybrid", "--limit", "5", "--source", "notes"]);
    assert_eq!(titles(&hybrid).len(), 5, "{hybrid}");
    assert!(hybrid["results"].as_array().unwrap().iter().all(|r| r["source"] == "filesystem:notes"));
}

#[test]
fn hybrid_fuses_both_lists_and_explains_each_rank() {
    each_backend(|ws| {
        let hybrid = search(ws, "rollback revert", &["--mode", "hybrid"]);
        assert_eq!(hybrid["mode"], "hybrid");
        assert_eq!(titles(&hybrid)[0], "Going back", "{hybrid}");
        let top = &hybrid["results"][0]["explain"];
        assert_eq!(top["keyword"]["rank"], 1, "{top}");
        assert_eq!(top["semantic"]["rank"], 1, "{top}");
        let explain = &hybrid["explain"];
        assert_eq!(explain["rrf_k"], 2);
        assert!(explain["hybrid_weight"].is_number());
        // The terminal shows the ranks too.
        let text = ws.ctx(&["search", "--mode", "hybrid", "--explain", "rollback revert"]).ok();
        assert!(
            text.contains("keyword #1") && text.contains("semantic #1") && text.contains("fusion: reciprocal rank"),
            "{text}"
        );
        // Without --explain, neither the terminal nor the JSON carries ranks.
        let plain = ws.ctx(&["search", "--mode", "hybrid", "rollback revert"]).ok();
        assert!(!plain.contains("semantic #1"), "{plain}");
        let json = ws.ctx(&["search", "--mode", "hybrid", "--json", "rollback revert"]).json();
        assert!(json["results"][0].get("explain").is_none() && json.get("explain").is_none(), "{json}");
    });
}

#[test]
fn rest_and_context_search_take_every_mode() {
    each_backend(|ws| {
        ws.write(
            "tools/modes.lua",
            r#"tool = { name = "modes", description = "search in each mode", parameters = {} }
function tool.execute(params, context)
  local out = {}
  for _, mode in ipairs({"keyword", "semantic", "hybrid"}) do
    local hits = context.search("rollback revert", {mode = mode, limit = 1})
    out[mode] = hits[1] and hits[1].title or "none"
  end
  return out
end
"#,
        );
        let mut config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
        config.push_str("\n[tools.script.modes]\npath = \"tools/modes.lua\"\n");
        std::fs::write(ws.path().join("ctx.toml"), config).unwrap();
        let out = ws.ctx(&["tool", "call", "modes", "--json"]).json();
        let value = if out.get("result").is_some() { out["result"].clone() } else { out.clone() };
        for mode in ["keyword", "semantic", "hybrid"] {
            assert_eq!(value[mode], "Going back", "{mode}: {out}");
        }
    });
}

#[test]
fn without_a_provider_semantic_is_a_client_error_over_rest() {
    let ws = Workspace::new("[connectors.filesystem.docs]\nroot = \"docs\"\n");
    ws.write("docs/a.md", "# A\n\notter\n");
    ws.ctx(&["sync"]).ok();
    let server = crate::common::ServeChild::spawn(
        Command::new(BIN).args(["--config", "ctx.toml", "serve", "--bind", "127.0.0.1:0"]).current_dir(ws.path()),
    );
    let base = format!("http://{}", server.addr);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let post = |body: Value| {
        runtime.block_on(async {
            let reply = reqwest::Client::new().post(format!("{base}/tools/search")).json(&body).send().await.unwrap();
            (reply.status().as_u16(), reply.json::<Value>().await.unwrap())
        })
    };
    let (status, body) = post(json!({"query": "otter", "mode": "semantic"}));
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("[embedding] provider = \"local\""), "{body}");
    let (status, hybrid) = post(json!({"query": "otter", "mode": "hybrid", "explain": true}));
    assert_eq!(status, 200);
    assert_eq!(hybrid["mode"], "keyword", "{hybrid}");
    assert!(hybrid["explain"]["notes"].to_string().contains("fell back to keyword"), "{hybrid}");
}

#[test]
fn a_broken_model_costs_semantic_search_only() {
    let ws = Workspace::new(CONFIG);
    std::fs::create_dir_all(ws.path().join("model")).unwrap();
    std::fs::create_dir_all(ws.path().join("notes")).unwrap();
    ws.write("docs/a.md", "# A\n\nrelease\n");
    let sync = ws.ctx(&["sync"]);
    assert_eq!(sync.code(), 1, "{}", sync.stderr());
    assert!(
        sync.stderr().contains("cannot load the local embedding model") && sync.stderr().contains("tokenizer.json"),
        "{}",
        sync.stderr()
    );
    // Keyword search still works on what was indexed.
    assert_eq!(titles(&search(&ws, "release", &[])), vec!["A"]);
    let semantic = ws.ctx(&["search", "--mode", "semantic", "release"]);
    assert_ne!(semantic.code(), 0);
    assert!(semantic.stderr().contains("cannot load the local embedding model"), "{}", semantic.stderr());
}

/// kill -9 while sync writes chunks and vectors: every committed chunk has its vector, and
/// the next sync completes the rest.
#[test]
fn killed_embedding_sync_leaves_chunks_and_vectors_consistent() {
    let ws = Workspace::new(CONFIG);
    write_tiny_model(&ws.path().join("model"), 8);
    std::fs::create_dir_all(ws.path().join("notes")).unwrap();
    let total = 6000;
    for i in 0..total {
        ws.write(&format!("docs/d{i:05}.md"), &format!("# Doc {i}\n\nhow to release and revert doc {i}\n"));
    }
    let (seen, running) = crate::common::kill_mid_sync(&ws);
    assert!(seen > 0 && running, "the kill landed mid-sync");
    let chunks = count(&ws, "SELECT COUNT(*) FROM chunks");
    assert!(0 < chunks && chunks < total, "{chunks} of {total}");
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM chunk_vectors"), chunks, "each committed chunk has its vector");
    ws.ctx(&["sync"]).ok();
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM chunks"), total);
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM chunk_vectors"), total);
}

/// The default model: its tokenizer run piece by piece gives the tokenizer's own ids on real
/// text (this repository's sources and docs), and semantic search on the sample corpus finds
/// the rollback runbook for a paraphrase.
#[test]
fn default_model_tokenizes_like_its_tokenizer_and_finds_paraphrases() {
    let Some(dir) = crate::common::test_model() else { return };
    let model = ctx::embed::StaticModel::load(&dir, "wordllama-l2-256", None).unwrap();
    assert!(model.tokenizes_by_piece(), "the Llama tokenizer qualifies for the piece-by-piece path");
    let mut texts: Vec<String> = Vec::new();
    for entry in ["README.md", "src/kb/search.rs", "src/embed/local.rs", "schemas/config.schema.json"] {
        let text = std::fs::read_to_string(crate::common::repo().join(entry)).unwrap();
        texts.extend(text.split("\n\n").map(str::to_string));
    }
    texts.extend(["tab\there", "CRLF\r\nline", "  ", "ünïcödé 日本語 🚀", "a\u{a0}b"].map(String::from));
    for text in &texts {
        assert_eq!(model.token_ids(text), model.reference_ids(text), "{text:?}");
    }

    let ws = Workspace::sample();
    let mut config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    config = config.replacen(
        "provider = \"disabled\"",
        &format!("provider = \"local\"\npath = {:?}", dir.display().to_string()),
        1,
    );
    std::fs::write(ws.path().join("ctx.toml"), config).unwrap();
    ws.ctx(&["embed"]).ok();
    let hits = search(&ws, "how do I revert a release", &["--mode", "semantic", "--limit", "1"]);
    assert_eq!(titles(&hits), vec!["Deploy runbook"], "{hits}");
}

/// A provider that is down during a sync: the documents are indexed for keyword search without
/// vectors (no chunk with half a vector, no lost document), the error names the provider and
/// what to do, the exit code is 1; once it answers, `ctx embed` adds every missing vector and
/// semantic search uses them.
#[test]
fn a_dead_provider_costs_vectors_only_and_embed_catches_up() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = |url: &str| {
        format!(
            "[connectors.filesystem.docs]\nroot = \"docs\"\n\n[embedding]\nprovider = \"ollama\"\nmodel = \"nomic-embed-text\"\n\
             dims = 3\nurl = \"{url}\"\nmax_retries = 0\ntimeout_secs = 5\n"
        )
    };
    let ws = Workspace::new(&config(&format!("http://{dead}")));
    ws.write("docs/undo.md", "# Going back\n\nRevert the last change.\n");
    ws.write("docs/ship.md", "# Shipping\n\nRelease the build.\n");
    let sync = ws.ctx(&["sync"]);
    assert_eq!(sync.code(), 1, "{}", sync.stderr());
    let err = sync.stderr();
    assert!(err.contains("written without vectors") && err.contains("ollama") && err.contains("ollama serve"), "{err}");
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM documents"), 2);
    assert_eq!(count(&ws, "SELECT COUNT(*) FROM chunk_vectors"), 0);
    assert_eq!(titles(&search(&ws, "revert", &[])), vec!["Going back"]);

    // The service is back: a stub that embeds "revert" texts along one axis, the rest another.
    let (addr, received) = crate::common::stub(|req| {
        let body: Value = serde_json::from_str(&req.body).unwrap();
        let vectors: Vec<Value> = body["input"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let t = t.as_str().unwrap().to_lowercase();
                if t.contains("revert") || t.contains("undo") {
                    json!([1.0, 0.0, 0.0])
                } else {
                    json!([0.0, 1.0, 0.0])
                }
            })
            .collect();
        (200, json!({"model": "nomic-embed-text", "embeddings": vectors}).to_string())
    });
    std::fs::write(ws.path().join("ctx.toml"), config(&format!("http://{addr}"))).unwrap();
    let embedded = ws.ctx(&["embed", "--json"]).json();
    assert_eq!(embedded["embedded"], 2, "{embedded}");
    assert_eq!(embedded["model"], "ollama:nomic-embed-text");
    assert!(received.lock().unwrap().iter().all(|r| r.path == "/api/embed"));
    let semantic = search(&ws, "undo", &["--mode", "semantic", "--limit", "1"]);
    assert_eq!(titles(&semantic), vec!["Going back"], "{semantic}");
}

/// Review findings of issue 19: a change of dims alone re-embeds (the model's name is the
/// same); a query with no word to match still gets a hybrid answer; unknown words rank
/// nothing; long documents do not starve a hybrid page; a model installed after a failed load
/// is picked up without a restart.
#[test]
fn review_dims_change_alone_re_embeds() {
    let ws = workspace();
    std::fs::write(ws.path().join("ctx.toml"), format!("{CONFIG}dims = 4\n")).unwrap();
    ws.write("docs/undo.md", "# Going back\n\nRevert the last change and restore service, twice.\n");
    let sync = ws.ctx(&["sync"]);
    assert_eq!(sync.code(), 0, "{}", sync.stderr());
    assert!(sync.stderr().contains("the embedding model changed"), "{}", sync.stderr());
    let wrong = count(&ws, "SELECT COUNT(*) FROM chunk_vectors v JOIN embedding_models m ON m.id = v.model_id WHERE length(v.vector) != m.dims * 4");
    assert_eq!(wrong, 0, "every vector has its model's length");
    let four = count(
        &ws,
        "SELECT COUNT(*) FROM chunk_vectors v JOIN embedding_models m ON m.id = v.model_id WHERE m.dims = 4",
    );
    assert_eq!(four, count(&ws, "SELECT COUNT(*) FROM chunks"));
    assert_eq!(ws.ctx(&["embed", "--json"]).json()["embedded"], 0);
    assert_eq!(titles(&search(&ws, "rollback", &["--mode", "semantic", "--limit", "1"])), vec!["Going back"]);
}

#[test]
fn review_queries_without_words_or_known_words() {
    let ws = workspace();
    // Nothing to match by keyword: hybrid answers from the semantic list, and says so.
    let hybrid = search(&ws, "🚀", &["--mode", "hybrid"]);
    assert_eq!(hybrid["mode"], "hybrid");
    assert!(hybrid["explain"]["notes"].to_string().contains("semantic list alone"), "{hybrid}");
    // Words the model does not know: the semantic list is empty rather than arbitrary.
    let unknown = search(&ws, "zzqx wwvy", &["--mode", "semantic"]);
    assert!(titles(&unknown).is_empty(), "{unknown}");
    assert!(unknown["explain"]["notes"].to_string().contains("no word the embedding model knows"), "{unknown}");
    // Keyword mode still refuses a query with no word.
    assert_eq!(ws.ctx(&["search", "🚀"]).code(), 2);
}

#[test]
fn review_long_documents_do_not_starve_a_hybrid_page() {
    let ws = Workspace::new(CONFIG);
    write_tiny_model(&ws.path().join("model"), 8);
    std::fs::create_dir_all(ws.path().join("notes")).unwrap();
    let long = format!("{}\n", "release ship rollout deploy. ".repeat(2000));
    for i in 0..3 {
        ws.write(&format!("docs/long{i}.md"), &format!("# Long {i}\n\n{long}"));
    }
    for i in 0..30 {
        ws.write(&format!("docs/short{i}.md"), &format!("# Short {i}\n\nrelease notes {i}\n"));
    }
    ws.ctx(&["sync"]).ok();
    assert!(count(&ws, "SELECT COUNT(*) FROM chunks") > 150, "the long documents fill a window of chunks");
    let hybrid = search(&ws, "release", &["--mode", "hybrid", "--limit", "20"]);
    assert_eq!(titles(&hybrid).len(), 20, "{hybrid}");
}

#[test]
fn review_a_model_installed_after_a_failed_load_is_used() {
    let ws = Workspace::new(CONFIG);
    std::fs::create_dir_all(ws.path().join("notes")).unwrap();
    ws.write("docs/undo.md", "# Going back\n\nRevert the last change.\n");
    let text = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    let file = ws.path().join("ctx.toml");
    let config = ctx::config::Config::from_text(&text, Path::new("ctx.toml"), &file, &|_| None).unwrap();
    let kb = ctx::kb::Kb::open(std::sync::Arc::new(config)).unwrap();
    let request = |mode| ctx::types::SearchRequest {
        query: "rollback".try_into().unwrap(),
        mode: Some(mode),
        limit: Some(1),
        source: None,
        since: None,
        explain: false,
    };
    let failed = kb.search(&request(ctx::types::SearchMode::Semantic)).unwrap_err();
    assert!(failed.to_string().contains("cannot load the local embedding model"), "{failed}");
    write_tiny_model(&ws.path().join("model"), 8);
    ctx::kb::sync::sync_target(&kb, "all", Default::default(), &mut |_| {}).unwrap();
    ctx::kb::embedding::backfill(kb.store(), kb.embedder().unwrap().unwrap().as_ref(), &mut |_, _| {}).unwrap();
    let found = kb.search(&request(ctx::types::SearchMode::Semantic)).unwrap();
    assert_eq!(found.results[0].title, "Going back");
}

/// `context.search` in the vector modes with its worst arguments: a query past the schema's
/// limit is refused before any work; the longest allowed one, of text the tokenizer must split
/// byte by byte, in a loop, stops at the tool's deadline like any other work.
#[test]
fn bounds_context_search_with_worst_case_queries() {
    let ws = workspace();
    ws.write(
        "tools/worst.lua",
        r#"tool = { name = "worst", description = "worst-case vector searches", parameters = {
  { name = "how", type = "string", required = true } } }
function tool.execute(params, context)
  if params.how == "huge" then
    return context.search(string.rep("x", 100000), {mode = "semantic"})
  end
  local soup = string.rep("日🚀ß", 4096 // 3)
  local n = 0
  while true do
    for _, mode in ipairs({"semantic", "hybrid"}) do
      context.search(soup, {mode = mode, limit = 100})
      n = n + 1
    end
  end
end
"#,
    );
    let mut config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    config.push_str("\n[tools.script.worst]\npath = \"tools/worst.lua\"\ntimeout = 1\n");
    std::fs::write(ws.path().join("ctx.toml"), config).unwrap();
    let huge = ws.ctx(&["tool", "call", "worst", "--param", "how=huge", "--json"]);
    assert_eq!(huge.code(), 1, "{}", huge.stderr());
    // Refused by the parameter check, before the model sees any of it.
    let refused: serde_json::Value = serde_json::from_str(&huge.stdout()).expect("--json prints JSON");
    assert_eq!(refused["error"]["code"], "tool_error", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("context.search: /query: expected string of 1 to 4096 characters"), "{refused}");
    let started = std::time::Instant::now();
    let looped = ws.ctx(&["tool", "call", "worst", "--param", "how=loop", "--json"]);
    assert_eq!(looped.code(), 1, "{}", looped.stderr());
    assert!(looped.stdout().contains("\"timeout\""), "{}", looped.stdout());
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "the 1 s deadline held: {:?}", started.elapsed());
}
