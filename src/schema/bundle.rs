//! Turns the per-concept schema files into one flat map of named definitions.
//!
//! Shared, through `#[path]`, by `build.rs` (typify input), runtime validation and the OpenAPI
//! `components`, so that all three see the same names and the same references. It depends on
//! `serde_json` only, because the build script compiles it too.

use std::collections::BTreeMap;

use serde_json::Value;

/// The type name of a schema file: `search-request.schema.json` becomes `SearchRequest`.
pub fn type_name(file: &str) -> String {
    let stem = file.strip_suffix(".schema.json").unwrap_or(file);
    stem.split(['-', '_', '.'])
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// Flattens `files` (file name, parsed schema) into definitions keyed by type name.
///
/// Each file's root becomes `type_name(file)`; its `$defs` are hoisted next to it and must be
/// unique across files. Every `$ref` is rewritten to `ref_prefix` + name, for example
/// `#/$defs/`, `#/definitions/` or `#/components/schemas/`.
pub fn bundle(files: &[(String, Value)], ref_prefix: &str) -> Result<BTreeMap<String, Value>, String> {
    let mut defs = BTreeMap::new();
    let mut origin: BTreeMap<String, String> = BTreeMap::new();
    for (file, schema) in files {
        let mut root = schema.clone();
        let Some(obj) = root.as_object_mut() else {
            return Err(format!("{file}: the schema must be a JSON object"));
        };
        obj.remove("$schema");
        obj.remove("$id");
        let hoisted = match obj.remove("$defs") {
            Some(Value::Object(map)) => map,
            Some(_) => return Err(format!("{file}: $defs must be an object")),
            None => Default::default(),
        };
        let root_name = type_name(file);
        let mut entries = vec![(root_name.clone(), root)];
        entries.extend(hoisted);
        for (name, mut def) in entries {
            rewrite_refs(&mut def, file, ref_prefix).map_err(|e| format!("{file}: {e}"))?;
            if let Some(previous) = origin.insert(name.clone(), file.clone()) {
                return Err(format!("definition {name} appears in both {previous} and {file}; rename one"));
            }
            defs.insert(name, def);
        }
    }
    for (name, def) in &defs {
        check_targets(def, ref_prefix, &defs).map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(defs)
}

fn rewrite_refs(value: &mut Value, file: &str, prefix: &str) -> Result<(), String> {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get_mut("$ref") {
                *reference = format!("{prefix}{}", target_name(reference, file)?);
            }
            for (key, child) in map.iter_mut() {
                // `default`, `enum`, `const` and `examples` hold data, not schemas.
                if !matches!(key.as_str(), "default" | "enum" | "const" | "examples") {
                    rewrite_refs(child, file, prefix)?;
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                rewrite_refs(item, file, prefix)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn target_name(reference: &str, file: &str) -> Result<String, String> {
    let (target_file, fragment) = match reference.split_once('#') {
        Some((f, frag)) => (f, frag),
        None => (reference, ""),
    };
    let target_file = if target_file.is_empty() { file } else { target_file };
    match fragment {
        "" | "/" => Ok(type_name(target_file)),
        frag => frag.strip_prefix("/$defs/").filter(|name| !name.contains('/')).map(str::to_owned).ok_or_else(|| {
            format!("unsupported $ref {reference:?}: use \"file.schema.json\" or \"file.schema.json#/$defs/Name\"")
        }),
    }
}

fn check_targets(value: &Value, prefix: &str, defs: &BTreeMap<String, Value>) -> Result<(), String> {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get("$ref") {
                let name = reference.strip_prefix(prefix).unwrap_or(reference);
                if !defs.contains_key(name) {
                    return Err(format!("$ref to unknown definition {name}"));
                }
            }
            map.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "default" | "enum" | "const" | "examples"))
                .try_for_each(|(_, child)| check_targets(child, prefix, defs))
        }
        Value::Array(items) => items.iter().try_for_each(|item| check_targets(item, prefix, defs)),
        _ => Ok(()),
    }
}
