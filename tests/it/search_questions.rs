//! Search as people ask: whole questions, stemming, prefixes under stemming, where a hit is
//! (terminal, JSON, REST, MCP, `context.search`), queries with no words, scores that differ.

use serde_json::{json, Value};

use crate::common::Workspace;
use crate::gateway::serve;

const DOCS: &str = "[connectors.filesystem.docs]\nroot = \"docs\"\n";

fn search(ws: &Workspace, query: &str, extra: &[&str]) -> Value {
    ws.ctx(&[&["search", "--json", "--explain"], extra, &["--", query]].concat()).json()
}

fn locations(response: &Value) -> Vec<String> {
    response["results"].as_array().unwrap().iter().map(|r| r["location"].as_str().unwrap().to_string()).collect()
}

/// A small code repository, as the review met it: the words of the question are spread over
/// the files, and only the README has all of them.
fn code_repo(ws: &Workspace) {
    ws.write("docs/README.md", "# Overview\n\nHot reload: how the work of reloading the config is done.\n");
    ws.write(
        "docs/src/reload.rs",
        "//! Hot reload of the config file.\n\nfn watch() { /* the watcher notices a write and reloads */ }\n",
    );
    ws.write("docs/src/watcher.rs", "//! File watcher used by the hot reload path: debounces events, then reloads.\n");
    ws.write("docs/src/server.rs", "//! The HTTP server. Unrelated to configuration changes.\n");
    ws.write("docs/guide/install.md", "# Install\n\nDownload the binary and put it on your PATH.\n");
}

#[test]
fn a_whole_question_finds_what_the_two_word_query_finds() {
    let ws = Workspace::new(DOCS);
    code_repo(&ws);
    ws.ctx(&["sync"]).ok();
    let two_words = locations(&search(&ws, "hot reload", &[]));
    assert!(two_words.len() >= 3, "{two_words:?}");
    let question = search(&ws, "how does hot reload work", &[]);
    let found = locations(&question);
    for location in &two_words {
        assert!(found.contains(location), "{location} missing from the question's hits {found:?}");
    }
    // The README has every word and ranks first; the rest fill the page below it, marked so.
    assert_eq!(found[0], "README.md", "{question}");
    let hits = question["results"].as_array().unwrap();
    assert_eq!(hits[0]["explain"]["matched"], "all_terms", "{question}");
    assert!(hits[1..].iter().all(|h| h["explain"]["matched"] == "some_terms"), "{question}");
    let notes = question["explain"]["notes"].to_string();
    assert!(notes.contains("only 1 chunk(s) matched every term"), "{notes}");
    // Without --explain the note still reaches stderr, and the page is the same.
    let run = ws.ctx(&["search", "how does hot reload work"]);
    assert!(run.stderr().contains("note: only 1 chunk(s) matched every term"), "{}", run.stderr());
    assert!(run.stdout().starts_with("1. Overview"), "{}", run.stdout());
}

#[test]
fn stemming_finds_word_forms_and_a_config_change_rebuilds_the_index() {
    let ws = Workspace::new(DOCS);
    ws.write("docs/ops/rollbacks.md", "# Rollbacks\n\nRollbacks are deployed by the pipeline.\n");
    ws.write("docs/ops/api.md", "# API authentication\n\nTokens are rotated monthly.\n");
    ws.ctx(&["sync"]).ok();
    let hit = search(&ws, "rollback", &[]);
    assert_eq!(locations(&hit), ["ops/rollbacks.md"], "{hit}");
    assert_eq!(hit["results"][0]["explain"]["matched"], "all_terms", "{hit}");
    assert!(hit["results"][0]["snippet"].as_str().unwrap().contains("«Rollbacks»"), "{hit}");
    assert_eq!(locations(&search(&ws, "deploying", &[])), ["ops/rollbacks.md"]);
    // A prefix is searched by the part the stemmer keeps: "deploy*" finds "deployed", whose
    // stem ("deploy") is not a stem starting with "deploi".
    assert_eq!(locations(&search(&ws, "deploy*", &[])), ["ops/rollbacks.md"]);
    // A shortened word finds the long one when the page has room (seed 000's Jira example).
    let auth = search(&ws, "Fix auth bug", &[]);
    assert_eq!(locations(&auth), ["ops/api.md"], "{auth}");
    assert_eq!(locations(&search(&ws, "auth", &[])), ["ops/api.md"]);

    // stemming = "none": the next command rebuilds the index, and words match as written.
    std::fs::write(ws.path().join("ctx.toml"), format!("{DOCS}\n[retrieval]\nstemming = \"none\"\n")).unwrap();
    let plain = search(&ws, "rollback", &[]);
    // The word itself is in no chunk now: the page is filled with words it starts.
    assert_eq!(locations(&plain), ["ops/rollbacks.md"], "{plain}");
    assert_eq!(plain["results"][0]["explain"]["matched"], "some_terms", "{plain}");
    assert_eq!(locations(&search(&ws, "Rollbacks", &[])), ["ops/rollbacks.md"]);
    let stored: i64 =
        ws.db().query_row("SELECT value FROM store_meta WHERE key = 'stemming'", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, 0);
    // And back: the stems return without a re-sync.
    std::fs::write(ws.path().join("ctx.toml"), DOCS).unwrap();
    assert_eq!(locations(&search(&ws, "rollback", &[])), ["ops/rollbacks.md"]);
}

/// Words of forms that stem differently, with and without stemming: the exact one-term path
/// (scored in Rust from the vocabulary) gives the scores FTS5's bm25() gives.
#[test]
fn one_term_scores_equal_bm25_under_both_tokenizers() {
    for stemming in ["english", "none"] {
        let ws = Workspace::new(&format!("{DOCS}\n[retrieval]\nstemming = \"{stemming}\"\n"));
        let words = ["deploy", "deploying", "deployed", "services", "service", "rollbacks", "walrus", "the"];
        for doc in 0..60 {
            let text: Vec<&str> = (0..(8 + doc % 13)).map(|i| words[(doc * 7 + i * i) % words.len()]).collect();
            ws.write(&format!("docs/d{doc}.md"), &format!("# Doc {doc}\n\n{}\n", text.join(" ")));
        }
        ws.ctx(&["sync"]).ok();
        let config = ctx::config::Config::load(&ctx::config::locate(Some(&ws.path().join("ctx.toml")))).unwrap();
        let kb = ctx::kb::Kb::open(std::sync::Arc::new(config)).unwrap();
        for word in ["deploying", "services", "rollback", "deployed"] {
            let fts = format!("\"{word}\"");
            let ours = kb.store().keyword_candidates(&fts, &Default::default(), 5000).unwrap();
            let theirs = kb.store().keyword_candidates_by_fts5(&fts, &Default::default(), 5000).unwrap();
            assert!(!ours.is_empty() || (stemming == "none" && word == "rollback"), "{stemming}: {word}");
            let pairs =
                |list: &[ctx::kb::store::Candidate]| list.iter().map(|c| (c.chunk_id, c.score)).collect::<Vec<_>>();
            assert_eq!(pairs(&ours), pairs(&theirs), "{stemming}: {word}: the same chunks, scores and order");
        }
    }
}

const WHERE_TOOL: &str = r#"
tool = { name = "where", description = "Where the first hit is.", parameters = { { name = "query", type = "string", required = true } } }
function tool.execute(params, context)
  local hits = context.search(params.query, { limit = 1 })
  return { location = hits[1] and hits[1].location }
end
"#;

const SCRIPT_SOURCE: &str = r#"
connector = {}
function connector.scan()
  return { { source_id = "OPS-7", title = "copyright", body = "The lemur ticket.", source_url = "https://jira.example.com/browse/OPS-7" },
           { source_id = "OPS-8", title = "copyright", body = "The lemur note without a link." } }
end
"#;

#[test]
fn every_hit_says_where_it_is_on_every_surface() {
    let ws = Workspace::new(&format!(
        "{DOCS}\n[connectors.script.jira]\npath = \"jira.lua\"\n\n[tools.script.where]\npath = \"where.lua\"\n"
    ));
    ws.write("docs/guide/install/copyright", "The ocelot licence text.\n");
    ws.write("docs/guide/usage/copyright", "Another ocelot licence text.\n");
    ws.write("jira.lua", SCRIPT_SOURCE);
    ws.write("where.lua", WHERE_TOOL);
    ws.ctx(&["sync"]).ok();

    let json = search(&ws, "ocelot", &[]);
    let mut found = locations(&json);
    found.sort();
    assert_eq!(found, ["guide/install/copyright", "guide/usage/copyright"], "{json}");
    let text = ws.ctx(&["search", "ocelot"]).ok();
    assert!(text.contains("   guide/install/copyright  (chunk 0,"), "{text}");
    assert!(text.contains("   guide/usage/copyright  (chunk 0,"), "{text}");
    // A script item: its URL, else its id.
    let mut lemur = locations(&search(&ws, "lemur", &[]));
    lemur.sort();
    assert_eq!(lemur, ["OPS-8", "https://jira.example.com/browse/OPS-7"]);

    let served = serve(ws, &[]);
    let (status, rest) = served.post("/tools/search", json!({"query": "ocelot"}));
    assert_eq!(status, 200, "{rest}");
    let mut rest_found = locations(&rest);
    rest_found.sort();
    assert_eq!(rest_found, found, "{rest}");
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "search", "arguments": {"query": "ocelot", "limit": 1},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    let url = format!("http://{}/mcp", served.serve.addr);
    let mcp: Value = served.runtime.block_on(async {
        let response = served
            .client
            .post(url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "search")
            .body(call.to_string())
            .send()
            .await
            .unwrap();
        response.json().await.unwrap()
    });
    let structured = &mcp["result"]["structuredContent"];
    assert_eq!(structured["results"][0]["location"], json["results"][0]["location"], "{mcp}");
    let (status, lua) = served.post("/tools/where", json!({"query": "lemur ticket"}));
    assert_eq!(status, 200, "{lua}");
    assert_eq!(lua["result"]["location"], "https://jira.example.com/browse/OPS-7", "{lua}");
}

#[test]
fn a_query_of_symbols_says_it_has_no_words() {
    let ws = Workspace::new(DOCS);
    ws.write("docs/a.md", "# A\n\ntext\n");
    ws.ctx(&["sync"]).ok();
    let run = ws.ctx(&["search", "🙂 ++ --"]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("has no searchable words"), "{}", run.stderr());
    assert!(!run.stderr().contains("empty"), "{}", run.stderr());
    let served = serve(ws, &[]);
    let (status, body) = served.post("/tools/search", json!({"query": "🙂🙂"}));
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("has no searchable words"), "{body}");
}

#[test]
fn scores_differ_between_hits_in_a_small_collection() {
    let ws = Workspace::new(DOCS);
    // "service" is in every document: its BM25 weight is clamped near zero.
    ws.write("docs/a.md", "# A\n\nservice\n");
    ws.write("docs/b.md", "# B\n\nservice service and more words around it to make it longer\n");
    ws.write("docs/c.md", "# C\n\nthe service, with a much longer text that dilutes the one mention of it here\n");
    ws.ctx(&["sync"]).ok();
    let out = ws.ctx(&["search", "service"]).ok();
    let scores: Vec<&str> = out.lines().filter_map(|l| l.split("  score ").nth(1)).collect();
    assert_eq!(scores.len(), 3, "{out}");
    assert!(scores.iter().all(|s| *s != "0.000" && *s != "0"), "{out}");
    let mut distinct = scores.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "every hit's score is shown apart: {out}");
}
