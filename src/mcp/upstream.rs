//! Upstream resources and prompts on ctx's MCP server: listed under namespaced names
//! (`mcp://<server>/<uri>`, `<server>__<prompt>`) and routed back to their server.

use rmcp::model::{ErrorCode as RpcCode, GetPromptResult, Prompt, ReadResourceResult, Resource, ResourceTemplate};
use rmcp::ErrorData as McpError;
use serde_json::{json, Map, Value as Json};

use crate::tools::upstream_tool::{namespaced_uri, registry_name, split_uri};
use crate::tools::Tools;
use crate::upstream::{ServerCatalog, UpstreamError};

/// Whether ctx declares the resources capability: when an upstream offers resources, or may
/// (one still connecting, whose capabilities are not known yet). A client checks capabilities
/// once, at `initialize`, often before the upstreams are up; it then gets an empty list until
/// they are, and `list_changed` when they arrive.
pub fn has_resources(tools: &Tools) -> bool {
    use crate::upstream::State;
    let unknown = |s: &ServerCatalog| !matches!(s.state, Some(State::Ready) | Some(State::Disabled));
    tools.upstreams().is_some_and(|u| u.catalog().iter().any(|s| s.has_resources || unknown(s)))
}

fn catalog(tools: &Tools) -> Vec<ServerCatalog> {
    tools.upstreams().map(|u| u.catalog()).unwrap_or_default()
}

/// Every upstream resource, its URI namespaced.
pub fn resources(tools: &Tools) -> Vec<Resource> {
    let mut out = Vec::new();
    for server in catalog(tools) {
        for raw in &server.resources {
            let mut raw = raw.clone();
            if let Some(Json::String(uri)) = raw.get_mut("uri") {
                *uri = namespaced_uri(&server.name, uri);
            }
            match serde_json::from_value(Json::Object(raw)) {
                Ok(resource) => out.push(resource),
                Err(e) => tracing::warn!(upstream = %server.name, "a resource it listed is not valid MCP: {e}"),
            }
        }
    }
    out
}

/// Every upstream resource template, its URI template namespaced.
pub fn templates(tools: &Tools) -> Vec<ResourceTemplate> {
    let mut out = Vec::new();
    for server in catalog(tools) {
        for raw in &server.resource_templates {
            let mut raw = raw.clone();
            if let Some(Json::String(uri)) = raw.get_mut("uriTemplate") {
                *uri = namespaced_uri(&server.name, uri);
            }
            match serde_json::from_value(Json::Object(raw)) {
                Ok(template) => out.push(template),
                Err(e) => {
                    tracing::warn!(upstream = %server.name, "a resource template it listed is not valid MCP: {e}")
                }
            }
        }
    }
    out
}

/// `resources/read` of a namespaced URI: read from its server, the contents' URIs namespaced.
pub async fn read(tools: &Tools, uri: &str) -> Result<ReadResourceResult, McpError> {
    let not_found = || {
        McpError::new(
            RpcCode::RESOURCE_NOT_FOUND,
            format!(
                "no resource {uri:?}: ctx serves upstream resources as mcp://<server>/<uri>; resources/list shows them"
            ),
            Some(json!({ "uri": uri })),
        )
    };
    let (server, original) = split_uri(uri).ok_or_else(not_found)?;
    let upstreams = tools.upstreams().ok_or_else(not_found)?;
    let mut result = upstreams.read_resource(server, original).await.map_err(|e| error(e, "resources/read"))?;
    if let Some(Json::Array(contents)) = result.get_mut("contents") {
        for content in contents.iter_mut() {
            if let Some(Json::String(uri)) = content.get_mut("uri") {
                *uri = namespaced_uri(server, uri);
            }
        }
    }
    serde_json::from_value(Json::Object(result)).map_err(|e| {
        McpError::internal_error(format!("upstream server '{server}' sent an invalid resource: {e}"), None)
    })
}

/// Every upstream prompt, named `<server>__<prompt>`.
pub fn prompts(tools: &Tools) -> Vec<Prompt> {
    let mut out = Vec::new();
    for server in catalog(tools) {
        for raw in &server.prompts {
            let Some(name) = raw.get("name").and_then(Json::as_str) else { continue };
            let mut raw = raw.clone();
            raw.insert("name".into(), Json::String(registry_name(&server.name, name)));
            match serde_json::from_value(Json::Object(raw)) {
                Ok(prompt) => out.push(prompt),
                Err(e) => tracing::warn!(upstream = %server.name, "a prompt it listed is not valid MCP: {e}"),
            }
        }
    }
    out
}

/// `prompts/get` of an upstream prompt; `None` when `name` is no upstream prompt.
pub async fn get_prompt(
    tools: &Tools,
    name: &str,
    arguments: Map<String, Json>,
) -> Option<Result<GetPromptResult, McpError>> {
    let (server, original) = catalog(tools).into_iter().find_map(|server| {
        let original = server
            .prompts
            .iter()
            .filter_map(|p| p.get("name").and_then(Json::as_str))
            .find(|p| registry_name(&server.name, p) == name)?;
        Some((server.name.clone(), original.to_string()))
    })?;
    let upstreams = tools.upstreams()?;
    let result = match upstreams.get_prompt(&server, &original, arguments).await {
        Ok(result) => serde_json::from_value(Json::Object(result)).map_err(|e| {
            McpError::internal_error(format!("upstream server '{server}' sent an invalid prompt: {e}"), None)
        }),
        Err(e) => Err(error(e, "prompts/get")),
    };
    Some(result)
}

/// An upstream failure as a JSON-RPC error: the upstream's own error passes through; ctx's
/// (down, timeout, disconnected) are internal errors that say which server and why.
fn error(e: UpstreamError, method: &str) -> McpError {
    match e {
        UpstreamError::Rpc { code, message, data, .. } => McpError::new(RpcCode(code), message, data),
        UpstreamError::UnknownServer(_) => McpError::invalid_params(format!("{method}: {e}"), None),
        other => McpError::internal_error(format!("{method}: {other}"), None),
    }
}
