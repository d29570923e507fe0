//! `[embedding] background`: sync writes documents without vectors (keyword search has them at
//! once), `ctx stats` and `--explain` say how many wait, and a running `ctx serve` fills them,
//! with its progress in `/health`.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{ServeChild, BIN};

#[test]
fn with_background_embedding_sync_is_searchable_at_once_and_serve_fills_the_vectors() {
    let Some(model) = crate::common::test_model() else { return };
    let dir = tempfile::tempdir().unwrap();
    crate::common::run_in(dir.path(), &["init", "--sample", "."]).ok();
    let ws_path = dir.path();
    let config = std::fs::read_to_string(ws_path.join("ctx.toml")).unwrap();
    let config = config.replacen(
        "provider = \"disabled\"",
        &format!("provider = \"local\"\npath = {:?}\nbackground = true", model.display().to_string()),
        1,
    );
    assert!(config.contains("background = true"), "{config}");
    std::fs::write(ws_path.join("ctx.toml"), config).unwrap();
    let ctx = |args: &[&str]| crate::common::run_in(ws_path, args);

    let synced = ctx(&["sync"]).ok();
    assert!(synced.contains("chunk(s) wait for vectors of local:"), "{synced}");
    let stats = ctx(&["stats", "--json"]).json();
    let chunks = stats["chunks"].as_u64().unwrap();
    assert!(chunks > 0);
    assert_eq!(stats["pending_vectors"], chunks, "{stats}");
    assert!(ctx(&["stats"]).ok().contains(&format!("pending:   {chunks} chunk(s) without a vector")));
    // Keyword search has the documents now; semantic search says why it finds nothing.
    let keyword = ctx(&["search", "roll back a deploy", "--json"]).json();
    assert!(!keyword["results"].as_array().unwrap().is_empty(), "{keyword}");
    let hybrid = ctx(&["search", "revert a release", "--mode", "hybrid", "--explain", "--json"]).json();
    let notes = hybrid["explain"]["notes"].to_string();
    assert!(notes.contains(&format!("{chunks} of {chunks} chunk(s) have no vector")), "{notes}");
    assert!(notes.contains("they rank by keyword only"), "{notes}");

    // The server fills them in the background; /health shows how far it is.
    let serve = ServeChild::spawn(Command::new(BIN).current_dir(ws_path).env_remove("CTX_CONFIG").args([
        "serve",
        "--bind",
        "127.0.0.1:0",
    ]));
    let deadline = Instant::now() + Duration::from_secs(60);
    let health = loop {
        let health = get_json(&format!("http://{}/health", serve.addr));
        let embedding = health["embedding"].clone();
        if embedding["pending"] == 0 && embedding["chunks"] == chunks {
            break embedding;
        }
        assert!(Instant::now() < deadline, "not filled in 60 s: {health}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(health["embedded"], chunks, "{health}");
    assert!(health["model"].as_str().unwrap().starts_with("local:"), "{health}");
    assert!(health["chunks_per_sec"].as_f64().unwrap() > 0.0, "{health}");
    assert_eq!(health["filling"], false);
    drop(serve);

    let stats = ctx(&["stats", "--json"]).json();
    assert_eq!(stats["pending_vectors"], 0, "{stats}");
    let semantic = ctx(&["search", "how do I revert a release", "--mode", "semantic", "--explain", "--json"]).json();
    assert_eq!(semantic["results"][0]["title"], "Deploy runbook", "{semantic}");
    assert!(!semantic["explain"]["notes"].to_string().contains("no vector"), "{semantic}");
}

fn get_json(url: &str) -> Value {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async { reqwest::get(url).await.unwrap().json().await.unwrap() })
}
