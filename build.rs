//! Generates the Rust types of the wire contract from `schemas/*.schema.json` with typify.
//!
//! Output goes to `$OUT_DIR/types.rs` (the types) and `$OUT_DIR/schema_files.rs` (the schema
//! texts, embedded). `src/types.rs` and `src/schema/mod.rs` are the only places that include them.

use std::{env, fs, path::PathBuf};

#[path = "src/schema/bundle.rs"]
mod bundle;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = manifest.join("schemas");
    println!("cargo:rerun-if-changed={}", dir.display());
    println!("cargo:rerun-if-changed=src/schema/bundle.rs");
    packed_relocations();

    let mut names: Vec<String> = fs::read_dir(&dir)
        .expect("schemas/ is readable")
        .map(|entry| entry.expect("schemas/ entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".schema.json"))
        .collect();
    names.sort();

    let mut files = Vec::new();
    let mut embedded = String::from(
        "/// Every schema file, by file name, as shipped in `schemas/`.\npub const FILES: &[(&str, &str)] = &[\n",
    );
    for name in &names {
        let path = dir.join(name);
        println!("cargo:rerun-if-changed={}", path.display());
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("schemas/{name} is not valid JSON: {e}"));
        embedded.push_str(&format!("    ({name:?}, include_str!({:?})),\n", path.display().to_string()));
        files.push((name.clone(), value));
    }
    embedded.push_str("];\n");

    let defs = bundle::bundle(&files, "#/definitions/").unwrap_or_else(|e| panic!("schemas/: {e}"));
    let snapshot = defs.clone();
    let defs = defs.into_iter().map(|(name, mut value)| {
        fill_defaults(&mut value, &snapshot);
        let schema: schemars08::schema::Schema =
            serde_json::from_value(value).unwrap_or_else(|e| panic!("definition {name}: {e}"));
        (name, schema)
    });

    let mut settings = typify::TypeSpaceSettings::default();
    settings
        .with_struct_builder(false)
        .with_derive("PartialEq".to_string())
        .with_map_type("::std::collections::BTreeMap".to_string());
    let mut space = typify::TypeSpace::new(&settings);
    space.add_ref_types(defs).unwrap_or_else(|e| panic!("typify: {e}"));
    let file: syn::File = syn::parse2(space.to_stream()).expect("typify emits valid Rust");
    // typify maps `minimum: 1` to NonZero integers, which make defaults and arithmetic awkward
    // and which nothing here needs: validation already enforces the bound.
    let code =
        prettyplease::unparse(&file).replace("::std::num::NonZeroU64", "u64").replace("::std::num::NonZeroU32", "u32");
    let code = unwrap_nonzero_literals(&code, "u64");
    let code = unwrap_nonzero_literals(&code, "u32");
    fs::write(out.join("types.rs"), code).expect("write types.rs");
    fs::write(out.join("schema_files.rs"), embedded).expect("write schema_files.rs");
    console_assets(&manifest, &out);
}

/// The browser console's files (`console/`, one level deep), embedded by name: the server serves
/// exactly these paths and nothing else, so no request path ever reaches the file system.
fn console_assets(manifest: &std::path::Path, out: &std::path::Path) {
    let dir = manifest.join("console");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = fs::read_dir(&dir)
        .expect("console/ is readable")
        .map(|entry| entry.expect("console/ entry"))
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with('.'))
        .collect();
    names.sort();
    let mut code = String::from("/// Every file of `console/`, by name.\npub const FILES: &[(&str, &[u8])] = &[\n");
    for name in &names {
        let path = dir.join(name);
        println!("cargo:rerun-if-changed={}", path.display());
        code.push_str(&format!("    ({name:?}, include_bytes!({:?})),\n", path.display().to_string()));
    }
    code.push_str("];\n");
    fs::write(out.join("console_files.rs"), code).expect("write console_files.rs");
}

/// typify builds a section's `"default": {}` with `Default::default()` for every field, which
/// ignores the fields' own defaults. Derive the full default object from the schema instead, so
/// the generated literal holds the documented values.
fn fill_defaults(value: &mut serde_json::Value, defs: &std::collections::BTreeMap<String, serde_json::Value>) {
    let Some(props) = value.get_mut("properties").and_then(|p| p.as_object_mut()) else {
        return;
    };
    for prop in props.values_mut() {
        if prop.get("default") != Some(&serde_json::json!({})) {
            continue;
        }
        let target = prop
            .get("$ref")
            .and_then(|r| r.as_str())
            .and_then(|r| r.strip_prefix("#/definitions/"))
            .and_then(|name| defs.get(name));
        if let Some(target) = target {
            prop["default"] = derived_default(target, defs);
        }
    }
}

fn derived_default(
    schema: &serde_json::Value,
    defs: &std::collections::BTreeMap<String, serde_json::Value>,
) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (key, prop) in props {
            if let Some(default) = prop.get("default") {
                let nested = prop
                    .get("$ref")
                    .and_then(|r| r.as_str())
                    .and_then(|r| r.strip_prefix("#/definitions/"))
                    .and_then(|name| defs.get(name));
                let value = match nested {
                    Some(target) if default == &serde_json::json!({}) => derived_default(target, defs),
                    _ => default.clone(),
                };
                out.insert(key.clone(), value);
            }
        }
    }
    serde_json::Value::Object(out)
}

/// Rewrites the `u64::new(12).unwrap()` literals left by the NonZero replacement to `12_u64`.
fn unwrap_nonzero_literals(code: &str, ty: &str) -> String {
    let open = format!("{ty}::new(");
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(pos) = rest.find(&open) {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + open.len()..];
        match after.find(").unwrap()") {
            Some(end) if after[..end].chars().all(|c| c.is_ascii_digit() || c == '_') => {
                out.push_str(&format!("{}_{ty}", &after[..end]));
                rest = &after[end + ").unwrap()".len()..];
            }
            _ => {
                out.push_str(&open);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Links the binary with relative relocations in the packed RELR form: the classic table (1.2 MB
/// for ctx) is read in full at every start and stays resident; the packed one is a few KB.
///
/// The loader must know the form (glibc 2.36 or newer): lld marks the binary as needing the
/// symbol version `GLIBC_ABI_DT_RELR`, so on an older glibc it would not start, with a loader
/// error that says nothing useful. A build for the machine it runs on therefore uses RELR only
/// when that machine's glibc has it.
fn packed_relocations() {
    let gnu_linux = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if !gnu_linux || env::var("HOST") != env::var("TARGET") {
        return;
    }
    // "glibc 2.36"
    let version = std::process::Command::new("getconf").arg("GNU_LIBC_VERSION").output().ok();
    let version = version.map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string()).unwrap_or_default();
    let parsed = version.strip_prefix("glibc ").and_then(|v| {
        let (major, minor) = v.split_once('.')?;
        Some((major.parse::<u32>().ok()?, minor.split('.').next()?.parse::<u32>().ok()?))
    });
    if parsed.is_some_and(|v| v >= (2, 36)) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
