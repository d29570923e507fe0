//! The built-in tools `search`, `get` and `sources`: the knowledge base, with parameter schemas
//! taken straight from `schemas/`.

use std::sync::OnceLock;

use serde_json::{json, Value as Json};

use super::{CallEnv, CallError, Output, Params, Tool, ToolSpec};
use crate::kb::Kb;
use crate::types::{GetRequest, SearchRequest, ToolAnnotations};

/// The three built-ins, in listing order.
pub fn all() -> Vec<super::ToolRef> {
    vec![
        std::sync::Arc::new(Builtin { spec: spec(Kind::Search), kind: Kind::Search }),
        std::sync::Arc::new(Builtin { spec: spec(Kind::Get), kind: Kind::Get }),
        std::sync::Arc::new(Builtin { spec: spec(Kind::Sources), kind: Kind::Sources }),
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Search,
    Get,
    Sources,
}

struct Builtin {
    spec: ToolSpec,
    kind: Kind,
}

impl Tool for Builtin {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run(&self, params: Json, env: &CallEnv<'_>) -> Result<Output, CallError> {
        let value = match self.kind {
            Kind::Search => search(env.kb, params)?,
            Kind::Get => get(env.kb, params)?,
            Kind::Sources => sources(env.kb)?,
        };
        Ok(Output::Value(value))
    }

    /// Most knowledge-base reads take well under a millisecond: run them on the calling thread
    /// with that budget, and leave the rest (a common word over a large corpus) to the pool.
    fn run_inline(&self, params: &Json, env: &CallEnv<'_>) -> Option<Result<Output, CallError>> {
        // A vector search embeds the query and scans every vector (a millisecond at 10k
        // chunks, more beyond), may first load a model or wait on a service: none of it stops
        // at the inline budget, which only interrupts SQLite, so it never runs on a worker.
        let vectors = matches!(params.get("mode").and_then(Json::as_str), Some("semantic" | "hybrid"));
        if self.kind == Kind::Search && vectors {
            return None;
        }
        crate::kb::budget::within(super::INLINE_BUDGET, || self.run(params.clone(), env))
    }
}

fn spec(kind: Kind) -> ToolSpec {
    let (name, description, schema) = match kind {
        Kind::Search => (
            "search",
            "Search the knowledge base (docs, code, tickets) and return the best-matching chunks with snippets. Use it first when a question may be answered by team knowledge.",
            crate::schema::standalone("SearchRequest"),
        ),
        Kind::Get => (
            "get",
            "Fetch one document by the id a search returned: its full text, metadata and chunks.",
            crate::schema::standalone("GetRequest"),
        ),
        Kind::Sources => (
            "sources",
            "List the knowledge sources with their health, document counts and last sync time.",
            json!({"type": "object", "description": "No parameters.", "properties": {}, "additionalProperties": false}),
        ),
    };
    ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        version: None,
        builtin: true,
        params: Params::compile(schema).expect("built-in schemas compile"),
        annotations: Some(ToolAnnotations {
            read_only: Some(true),
            destructive: Some(false),
            idempotent: Some(true),
            open_world: Some(false),
            title: None,
        }),
        output_schema: None,
        script: None,
        section: None,
        hidden: false,
        upstream: None,
        approve: false,
        long_running: false,
    }
}

/// The schema of a built-in's result (`structuredContent`), for code mode: `describe_tool`'s
/// signature shows a script the fields it gets back (`r.results[1].title`), and so do the
/// catalog prompt and a scripted tool's description, which are written for scripts. It is not
/// listed as the tools' `outputSchema`: there it would add 1.6 to 4.3 KB to every session's
/// definitions, for plain tool calls that read the result as it comes.
pub fn result_schema(name: &str) -> Option<&'static Json> {
    // Static: immutable, derived from the schema files compiled into the binary; every application may share it.
    static SCHEMAS: OnceLock<[(&str, Json); 3]> = OnceLock::new();
    let schemas = SCHEMAS.get_or_init(|| {
        [
            ("search", crate::schema::standalone("SearchResponse")),
            ("get", crate::schema::standalone("Document")),
            ("sources", crate::schema::standalone("SourcesResponse")),
        ]
    });
    schemas.iter().find(|(n, _)| *n == name).map(|(_, schema)| schema)
}

/// The search parameter schema, compiled once: `context.search` checks its arguments with it.
pub fn search_params() -> &'static Params {
    // Static: immutable, derived from the schema files compiled into the binary; every application may share it.
    static P: OnceLock<Params> = OnceLock::new();
    P.get_or_init(|| Params::compile(crate::schema::standalone("SearchRequest")).expect("schema compiles"))
}

/// Runs a search whose parameters passed [`search_params`].
pub fn search(kb: &Kb, params: Json) -> Result<Json, CallError> {
    let request: SearchRequest =
        serde_json::from_value(params).map_err(|e| CallError::BadRequest(format!("invalid search request: {e}")))?;
    let response = kb.search(&request).map_err(CallError::from_kb)?;
    Ok(serde_json::to_value(response).unwrap_or(Json::Null))
}

pub fn get(kb: &Kb, params: Json) -> Result<Json, CallError> {
    let request: GetRequest =
        serde_json::from_value(params).map_err(|e| CallError::BadRequest(format!("invalid get request: {e}")))?;
    let document = kb.get(&request.id).map_err(CallError::from_kb)?;
    Ok(serde_json::to_value(document).unwrap_or(Json::Null))
}

pub fn sources(kb: &Kb) -> Result<Json, CallError> {
    let response = kb.sources().map_err(CallError::from_kb)?;
    Ok(serde_json::to_value(response).unwrap_or(Json::Null))
}
