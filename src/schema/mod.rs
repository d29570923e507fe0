//! The JSON Schemas in `schemas/`: embedded, bundled, compiled, and turned into precise messages.
//!
//! Config loading, tool parameter validation and the OpenAPI document all come through here, so
//! one set of files is the contract and one formatter words every validation problem.

pub mod bundle;
mod describe;

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::{json, Value};

pub use describe::{Dialect, Problem};

include!(concat!(env!("OUT_DIR"), "/schema_files.rs"));

/// The JSON Schema dialect every file in `schemas/` declares.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// The schema files parsed, by file name.
pub fn files() -> &'static [(String, Value)] {
    // Static: immutable, derived from the schema files compiled into the binary; every application may share it.
    static PARSED: OnceLock<Vec<(String, Value)>> = OnceLock::new();
    PARSED.get_or_init(|| {
        FILES
            .iter()
            .map(|(name, text)| {
                // build.rs already parsed every file, so this cannot fail at runtime.
                let value = serde_json::from_str(text).expect("schema files are checked by build.rs");
                (name.to_string(), value)
            })
            .collect()
    })
}

/// All definitions, with references rewritten to `prefix` (for example `#/components/schemas/`).
pub fn definitions(prefix: &str) -> BTreeMap<String, Value> {
    bundle::bundle(files(), prefix).expect("schema files are checked by build.rs")
}

/// One definition as a self-contained schema: the definitions it references (transitively) are
/// copied under its own `$defs`. Used where a schema must stand alone, such as a built-in
/// tool's `parameters`.
pub fn standalone(name: &str) -> Value {
    let defs = definitions("#/$defs/");
    let mut root = defs.get(name).cloned().unwrap_or_else(|| panic!("no schema definition named {name}"));
    let mut needed = std::collections::BTreeSet::new();
    let mut queue = vec![root.clone()];
    while let Some(node) = queue.pop() {
        for target in refs(&node) {
            if needed.insert(target.clone()) {
                if let Some(def) = defs.get(&target) {
                    queue.push(def.clone());
                }
            }
        }
    }
    if !needed.is_empty() {
        let local: serde_json::Map<String, Value> =
            needed.into_iter().filter_map(|n| defs.get(&n).map(|d| (n, d.clone()))).collect();
        root["$defs"] = Value::Object(local);
    }
    root
}

fn refs(node: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match node {
        Value::Object(map) => {
            if let Some(target) = map.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
                out.push(target.to_string());
            }
            map.values().for_each(|v| out.extend(refs(v)));
        }
        Value::Array(items) => items.iter().for_each(|v| out.extend(refs(v))),
        _ => {}
    }
    out
}

/// A compiled validator for one named definition (a file's type name, such as `Config`, or a
/// hoisted `$defs` entry such as `ConnectorItem`).
pub struct SchemaValidator {
    validator: jsonschema::Validator,
    document: Value,
}

impl SchemaValidator {
    /// Compiles the validator for `name`. Panics only if `name` is not a definition, which is a
    /// programming error caught by the tests.
    pub fn for_definition(name: &str) -> Self {
        let defs = definitions("#/$defs/");
        assert!(defs.contains_key(name), "no schema definition named {name}");
        let document = json!({
            "$schema": DIALECT,
            "$ref": format!("#/$defs/{name}"),
            "$defs": defs,
        });
        Self::compile(document).expect("bundled schemas compile")
    }

    /// Compiles an arbitrary schema document (used for tool parameter schemas).
    pub fn compile(document: Value) -> Result<Self, String> {
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&document)
            .map_err(|e| e.to_string())?;
        Ok(Self { validator, document })
    }

    /// The schema document this validator was built from.
    pub fn document(&self) -> &Value {
        &self.document
    }

    /// Every problem with `instance`, in document order, worded for `dialect`.
    pub fn problems(&self, instance: &Value, dialect: Dialect) -> Vec<Problem> {
        // The common case, valid input, takes the fast path that builds no error values.
        if self.validator.is_valid(instance) {
            return Vec::new();
        }
        let mut out: Vec<Problem> = self
            .validator
            .iter_errors(instance)
            .flat_map(|error| describe::problems(&error, &self.document, dialect))
            .collect();
        out.dedup();
        out
    }
}

/// Every definition in one 2020-12 document (`$defs`), as `ctx schema export` writes it.
pub fn bundle_document() -> Value {
    json!({
        "$schema": DIALECT,
        "$id": "https://ctx.dev/schemas/bundle.schema.json",
        "title": "ctx schemas",
        "description": "Every ctx schema definition in one document, references resolved to $defs.",
        "$defs": definitions("#/$defs/"),
    })
}

/// The OpenAPI 3.1 document: `components.schemas` are the schema files themselves (not schemas
/// derived from Rust types, which lose constraints such as `pattern`). The HTTP server adds its
/// paths to this document; without it, `paths` is empty.
pub fn openapi_document() -> Value {
    json!({
        "openapi": "3.1.0",
        "jsonSchemaDialect": DIALECT,
        "info": {
            "title": "ctx",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Context and actions for AI agents. Every schema below comes from schemas/ in the ctx repository.",
        },
        "paths": {},
        "components": { "schemas": definitions("#/components/schemas/") },
    })
}
