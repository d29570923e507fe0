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

#[test]
fn example_configs_validate() {
    let mut configs = vec![repo().join("examples/ctx.toml"), repo().join("src/cli/templates/ctx.toml")];
    for dir in ["tests/fixtures", "examples"] {
        if let Ok(entries) = std::fs::read_dir(repo().join(dir)) {
            configs.extend(
                entries
                    .map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|e| e == "toml") && !p.ends_with("ctx.toml")),
            );
        }
    }
    for config in configs {
        let text = std::fs::read_to_string(&config).unwrap();
        ctx::config::Config::from_text(&text, &config, &config, &|_| Some("x".repeat(32)))
            .unwrap_or_else(|e| panic!("{}: {e}", config.display()));
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
