//! The schema files: valid 2020-12, examples validate, the exported form is pinned.

use crate::common::{repo, run_in};

#[test]
fn every_schema_file_is_valid_2020_12_with_descriptions() {
    let mut count = 0;
    for entry in std::fs::read_dir(repo().join("schemas")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.ends_with(".schema.json"), "{name}: schema files end in .schema.json");
        let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema", "{name}");
        assert!(schema["$id"].as_str().is_some_and(|id| id.ends_with(&name)), "{name}: $id ends with the file name");
        assert!(schema["title"].is_string() && schema["description"].is_string(), "{name}: title and description");
        jsonschema::draft202012::meta::validate(&schema).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_descriptions(&name, "", &schema);
        count += 1;
    }
    assert!(count >= 10, "found {count} schema files");
}

/// Every property of every object schema has a description.
fn assert_descriptions(file: &str, at: &str, schema: &serde_json::Value) {
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (key, prop) in props {
            assert!(prop.get("description").is_some(), "{file}: {at}/properties/{key} has no description");
            assert_descriptions(file, &format!("{at}/properties/{key}"), prop);
        }
    }
    if let Some(defs) = schema.get("$defs").and_then(|d| d.as_object()) {
        for (key, def) in defs {
            assert_descriptions(file, &format!("{at}/$defs/{key}"), def);
        }
    }
}

/// Every `.toml` config the repository ships or tests with (outside `target/` and the Cargo and
/// lint settings) loads and validates. The walk must find the four known ones, so a move that
/// leaves it finding nothing fails instead of passing quietly.
#[test]
fn every_checked_in_config_validates() {
    fn walk(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | "node_modules" | ".git" | ".cargo") {
                    walk(&path, found);
                }
            } else if name.ends_with(".toml")
                && !matches!(name.as_str(), "Cargo.toml" | "clippy.toml" | "rustfmt.toml" | "pack.toml")
            {
                found.push(path);
            }
        }
    }
    let mut configs = Vec::new();
    walk(&repo(), &mut configs);
    configs.sort();
    let relative: Vec<String> =
        configs.iter().map(|c| c.strip_prefix(repo()).unwrap().to_string_lossy().into_owned()).collect();
    for known in [
        "examples/ctx.toml",
        "src/cli/templates/ctx.toml",
        "tests/clients/mcp_workspace/ctx.toml",
        "tests/conformance/ctx.toml",
    ] {
        assert!(relative.iter().any(|r| r == known), "{known} not found by the walk: {relative:?}");
    }
    for config in &configs {
        let text = std::fs::read_to_string(config).unwrap();
        // Every `${VAR}` set; not CTX_DATABASE_URL, which would replace `[db] url` with the filler.
        let env = |var: &str| (var != ctx::db::URL_ENV).then(|| "x".repeat(32));
        let parsed = ctx::config::Config::from_text(&text, config, config, &env)
            .unwrap_or_else(|e| panic!("{}: {e}", config.display()));
        // Validated, not just parsed: the scripts it names are there (the template's are written
        // next to it by `ctx init`, which tests/it/cli.rs covers).
        if config.ends_with("src/cli/templates/ctx.toml") {
            continue;
        }
        for script in &parsed.scripts {
            // The client workspace gets the shipped tools/echo.lua copied in by its test.
            let shipped = repo().join("tools").join(script.path.file_name().unwrap());
            assert!(
                script.path.is_file() || shipped.is_file(),
                "{}: {} does not exist",
                config.display(),
                script.path.display()
            );
        }
    }
}

#[test]
fn shipped_example_config_checks_clean() {
    let run = run_in(&repo(), &["--config", "examples/ctx.toml", "schema", "check"]);
    assert!(run.ok().starts_with("ok: examples/ctx.toml is valid"), "{}", run.stdout());
}

#[test]
fn exported_schemas_are_pinned() {
    let dir = tempfile::tempdir().unwrap();
    run_in(dir.path(), &["schema", "export", "--out", "out"]).ok();
    let bundle: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/bundle.schema.json")).unwrap()).unwrap();
    jsonschema::draft202012::meta::validate(&bundle).unwrap();
    insta::assert_json_snapshot!("schema_bundle", bundle);
    let openapi: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/openapi.json")).unwrap()).unwrap();
    assert_eq!(openapi["openapi"], "3.1.0");
    assert_eq!(
        openapi["components"]["schemas"],
        bundle["$defs"].to_string().replace("#/$defs/", "#/components/schemas/").parse::<serde_json::Value>().unwrap()
    );
    for (name, text) in ctx::schema::FILES {
        assert_eq!(&std::fs::read_to_string(dir.path().join("out").join(name)).unwrap(), text, "{name} exported as is");
    }
}
