//! The OpenAPI document: `components` are the schema files (see `schema::openapi_document`),
//! and the paths below reference them. The served document adds one `POST /tools/<name>`
//! operation per loaded Lua tool, with the tool's parameter schema as its request body.

use serde_json::{json, Map, Value as Json};

use crate::tools::Registry;

fn schema_ref(name: &str) -> Json {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn json_content(schema: Json) -> Json {
    json!({ "application/json": { "schema": schema } })
}

fn error(description: &str) -> Json {
    json!({ "description": description, "content": json_content(schema_ref("Error")) })
}

/// The error responses every tool call can produce.
fn call_errors() -> Map<String, Json> {
    let mut m = Map::new();
    m.insert("400".into(), error("Invalid parameters (every problem in details) or malformed JSON."));
    m.insert("401".into(), error("Missing or wrong bearer token."));
    m.insert("403".into(), error("Origin or Host not allowed."));
    m.insert("404".into(), error("Unknown tool, or what it looked up does not exist."));
    m.insert("408".into(), error("The tool passed its deadline."));
    m.insert("413".into(), error("Body larger than server.max_body_bytes."));
    m.insert("415".into(), error("Body is not application/json."));
    m.insert(
        "500".into(),
        error("The tool failed (tool_error, memory_limit, result_too_large) or ctx did (internal)."),
    );
    m.insert("503".into(), error("A capability is not configured (semantic search without embeddings), or the tool failed to load (code load_failed, with the reason)."));
    m
}

fn operation(id: &str, summary: &str, body: Option<Json>, ok: Json) -> Json {
    let mut responses = call_errors();
    responses.insert("200".into(), json!({ "description": "Success.", "content": json_content(ok) }));
    let mut op = json!({ "operationId": id, "summary": summary, "tags": ["tools"], "responses": responses });
    if let Some(schema) = body {
        op["requestBody"] = json!({ "required": true, "content": json_content(schema) });
    }
    op
}

/// The fixed paths: health, listing, the built-ins, the generic tool call, and these documents.
fn paths() -> Map<String, Json> {
    let mut paths = Map::new();
    paths.insert(
        "/health".into(),
        json!({ "get": { "operationId": "health", "summary": "Liveness and load problems. Needs no token.", "tags": ["server"],
            "security": [],
            "responses": { "200": { "description": "Up.", "content": json_content(schema_ref("Health")) } } } }),
    );
    paths.insert(
        "/tools/list".into(),
        json!({ "get": { "operationId": "listTools", "summary": "Every tool with its parameter schema: built-ins first, then by name.", "tags": ["tools"],
            "responses": { "200": { "description": "The tools.", "content": json_content(schema_ref("ToolsList")) }, "401": error("Missing or wrong bearer token.") } } }),
    );
    paths.insert(
        "/tools/search".into(),
        json!({ "post": operation("search", "Search the knowledge base.", Some(schema_ref("SearchRequest")), schema_ref("SearchResponse")) }),
    );
    paths.insert(
        "/tools/get".into(),
        json!({ "post": operation("getDocument", "Fetch one document with its chunks.", Some(schema_ref("GetRequest")), schema_ref("Document")) }),
    );
    let sources =
        operation("listSources", "Sources with health, counts and last sync.", None, schema_ref("SourcesResponse"));
    let mut sources_post = sources.clone();
    sources_post["operationId"] = json!("listSourcesPost");
    paths.insert("/tools/sources".into(), json!({ "get": sources, "post": sources_post }));
    let mut call = operation(
        "callTool",
        "Call any tool by name with its parameters; the result is under `result`.",
        Some(json!({ "type": "object" })),
        schema_ref("ToolResult"),
    );
    call["parameters"] = json!([{ "name": "name", "in": "path", "required": true, "description": "Tool name, as listed by /tools/list.", "schema": { "type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$" } }]);
    paths.insert("/tools/{name}".into(), json!({ "post": call }));
    paths.insert(
        "/agents/list".into(),
        json!({ "get": { "operationId": "listAgents", "summary": "Every agent: inline ones first, then Lua ones, each by name.", "tags": ["agents"],
            "responses": { "200": { "description": "The agents.", "content": json_content(schema_ref("AgentsList")) }, "401": error("Missing or wrong bearer token.") } } }),
    );
    let mut prompt = operation(
        "agentPrompt",
        "Resolve an agent's prompt with its arguments: system prompt, opening messages and tools.",
        Some(schema_ref("AgentPromptRequest")),
        schema_ref("AgentPrompt"),
    );
    prompt["tags"] = json!(["agents"]);
    prompt["parameters"] = json!([{ "name": "name", "in": "path", "required": true, "description": "Agent name, as listed by /agents/list.", "schema": { "type": "string", "pattern": "^[A-Za-z0-9_.-]{1,128}$" } }]);
    paths.insert("/agents/{name}/prompt".into(), json!({ "post": prompt }));
    paths.insert(
        "/openapi.json".into(),
        json!({ "get": { "operationId": "openapi", "summary": "This document.", "tags": ["server"],
            "responses": { "200": { "description": "OpenAPI 3.1.", "content": { "application/json": { "schema": { "type": "object" } } } } } } }),
    );
    paths
}

/// The document: checked in at `openapi/openapi.json` without a registry, served with one.
pub fn document(registry: Option<&Registry>) -> Json {
    let mut doc = crate::schema::openapi_document();
    let mut paths = paths();
    if let Some(registry) = registry {
        for spec in registry.specs().filter(|s| !s.builtin) {
            let mut op = operation(
                &format!("tool_{}", spec.name.replace(['-', '.'], "_")),
                &spec.description,
                Some(spec.params.schema().clone()),
                schema_ref("ToolResult"),
            );
            op["tags"] = json!(["lua tools"]);
            paths.insert(format!("/tools/{}", spec.name), json!({ "post": op }));
        }
    }
    doc["paths"] = Json::Object(paths);
    doc["components"]["securitySchemes"] =
        json!({ "bearer": { "type": "http", "scheme": "bearer", "description": "server.auth_token, when set." } });
    doc["security"] = json!([{ "bearer": [] }, {}]);
    doc
}
