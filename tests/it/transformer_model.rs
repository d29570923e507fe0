//! The `local` provider's transformer runtime (candle) with all-MiniLM-L6-v2 as
//! `scripts/get-model minilm` installs it: its vectors are the model's own (the similarities the
//! sentence-transformers documentation publishes for it), and a workspace that names its folder
//! syncs and searches by meaning.

/// The folder `scripts/test-env` installs it in (`CTX_TEST_MINILM`); missing: skipped, or a
/// failure in CI.
fn minilm() -> Option<std::path::PathBuf> {
    match std::env::var_os("CTX_TEST_MINILM") {
        Some(dir) => Some(dir.into()),
        None if std::env::var_os("CI").is_some() => {
            panic!("CTX_TEST_MINILM is not set; run the suite through scripts/test")
        }
        None => {
            eprintln!("skipping a run of all-MiniLM-L6-v2: eval \"$(scripts/test-env)\" enables it");
            None
        }
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn minilm_gives_the_similarities_sentence_transformers_publishes() {
    let Some(dir) = minilm() else { return };
    let model = ctx::embed::load_local(&dir, "all-minilm-l6-v2").unwrap();
    assert_eq!((model.name(), model.dims()), ("local:all-minilm-l6-v2", 384));
    let texts = ["A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse.", ""];
    let vectors = model.embed(&texts).unwrap();
    // The sentence-transformers docs list 0.7553 for the first pair.
    let pair = cosine(&vectors[0], &vectors[1]);
    assert!((pair - 0.7553).abs() < 0.001, "{pair}");
    let other = cosine(&vectors[0], &vectors[2]);
    assert!((other - 0.2474).abs() < 0.001, "{other}");
    for v in &vectors {
        let norm = cosine(v, v).sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "unit length: {norm}");
    }
    // Order does not change a text's vector (texts are batched by length).
    let again = model.embed(&[texts[2], texts[0]]).unwrap();
    assert!(cosine(&again[1], &vectors[0]) > 0.9999);
    // A text past the model's 256 tokens is cut, not refused.
    let long = "deploy the service and roll back on errors ".repeat(200);
    assert_eq!(model.embed(&[long.as_str()]).unwrap()[0].len(), 384);
}

#[test]
fn a_workspace_naming_the_minilm_folder_syncs_and_finds_by_meaning() {
    let Some(dir) = minilm() else { return };
    let ws = crate::common::Workspace::sample();
    let config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    let config = config.replacen(
        "provider = \"disabled\"",
        &format!("provider = \"local\"\npath = {:?}", dir.display().to_string()),
        1,
    );
    ws.write("ctx.toml", &config);
    // A transformer's vectors are left to the background by default: sync does not wait for them.
    ws.write("docs/release-notes.md", "# Release notes\n\nWhat changed in each version we shipped.\n");
    let synced = ws.ctx(&["sync"]).ok();
    assert!(synced.contains("wait for vectors of local:all-minilm-l6-v2"), "{synced}");
    let embedded = ws.ctx(&["embed", "--json"]).json();
    assert_eq!(embedded["model"], "local:all-minilm-l6-v2", "{embedded}");
    assert_eq!(embedded["dims"], 384);
    let found = ws.ctx(&["search", "steps to ship a new version of a service", "--mode", "semantic", "--json"]).json();
    assert_eq!(found["results"][0]["title"], "Deploy runbook", "{found}");
}
