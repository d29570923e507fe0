//! What a successful tool call produced, and how it reads on REST and on MCP.
//!
//! The mapping is specified in `schemas/mcp-call-result.schema.json`; snapshots pin it.

use serde_json::{json, Value as Json};

use super::CallError;
use crate::types::{ContentBlock, McpCallResult, TextContent};

#[derive(Clone, Debug, PartialEq)]
pub enum Output {
    /// A plain return value, `MCP.success(data)` or `MCP.json(data)`.
    Value(Json),
    /// `MCP.text(text)`: shown as is.
    Text(String),
    /// A plain table with an `error` key: the script caught a failure and reports it as data.
    HandledError(Json),
    /// `MCP.content(blocks)`: MCP content blocks (text, image, audio, resource), checked
    /// against the `ContentBlock` schema.
    Content(Vec<ContentBlock>),
    /// An upstream MCP server's `CallToolResult`, as it sent it (resource URIs namespaced):
    /// MCP passes it on unchanged.
    Upstream(serde_json::Map<String, Json>),
    /// A code-mode script's result with its trace (the inner calls it made, what was cut):
    /// REST adds `trace` beside `result`, MCP puts it under `_meta["ctx/trace"]`.
    Traced { output: Box<Output>, trace: Json },
}

impl Output {
    /// The REST body: `{"result": ...}` (always status 200).
    pub fn rest_body(&self) -> Json {
        match self {
            Output::Traced { output, trace } => json!({ "result": output.value(), "trace": trace }),
            _ => json!({ "result": self.value() }),
        }
    }

    /// Whether the tool reported a failure in its result (a handled error, an upstream's
    /// `isError`): the call worked, the work did not.
    pub fn is_error(&self) -> bool {
        match self {
            Output::HandledError(_) => true,
            Output::Upstream(result) => is_error(result),
            Output::Traced { output, .. } => output.is_error(),
            _ => false,
        }
    }

    /// The value under `result`.
    pub fn value(&self) -> Json {
        match self {
            Output::Value(v) | Output::HandledError(v) => v.clone(),
            Output::Text(t) => Json::String(t.clone()),
            Output::Content(blocks) => json!({ "content": blocks }),
            Output::Upstream(result) => upstream_value(result),
            Output::Traced { output, .. } => output.value(),
        }
    }

    /// The MCP `tools/call` result.
    pub fn mcp(&self) -> McpCallResult {
        match self {
            Output::Value(v) => {
                McpCallResult { content: vec![text(as_text(v))], structured_content: structured(v), is_error: false }
            }
            Output::Text(t) => McpCallResult {
                content: vec![text(t.clone())],
                structured_content: Default::default(),
                is_error: false,
            },
            Output::Content(blocks) => {
                McpCallResult { content: blocks.clone(), structured_content: Default::default(), is_error: false }
            }
            Output::Upstream(result) => McpCallResult {
                // Blocks outside ctx's own content schema (resource links, ...) are left out
                // here; the MCP adapter passes the upstream's result on whole instead.
                content: result
                    .get("content")
                    .and_then(Json::as_array)
                    .map(|blocks| blocks.iter().filter_map(|b| serde_json::from_value(b.clone()).ok()).collect())
                    .unwrap_or_default(),
                structured_content: result.get("structuredContent").map(structured).unwrap_or_default(),
                is_error: is_error(result),
            },
            Output::Traced { output, .. } => output.mcp(),
            Output::HandledError(v) => McpCallResult {
                content: vec![text(v.get("error").map(as_text).unwrap_or_else(|| as_text(v)))],
                structured_content: structured(v),
                is_error: true,
            },
        }
    }
}

impl CallError {
    /// The MCP result of a failed call that reached the tool (`isError: true`). Protocol errors
    /// ([`CallError::is_protocol_error`]) become JSON-RPC errors instead.
    pub fn mcp(&self) -> McpCallResult {
        let structured_content = match self {
            // The pending approval as data too, for clients that read it.
            CallError::ApprovalRequired(pending) => {
                let mut m = serde_json::Map::new();
                m.insert("approval".into(), serde_json::to_value(pending.body()).unwrap_or_default());
                m
            }
            _ => Default::default(),
        };
        // The caller's own answer carries the token it runs the approved call with.
        let message = match self {
            CallError::ApprovalRequired(pending) => pending.message(),
            other => other.to_string(),
        };
        McpCallResult { content: vec![text(message)], structured_content, is_error: true }
    }
}

fn text(t: String) -> ContentBlock {
    ContentBlock::TextContent(TextContent { text: t, type_: Json::String("text".into()) })
}

fn as_text(v: &Json) -> String {
    match v {
        Json::String(s) => s.clone(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

fn structured(v: &Json) -> serde_json::Map<String, Json> {
    match v {
        Json::Object(map) => map.clone(),
        _ => Default::default(),
    }
}

fn is_error(result: &serde_json::Map<String, Json>) -> bool {
    result.get("isError").and_then(Json::as_bool).unwrap_or(false)
}

/// An upstream result under REST's `result`: its `structuredContent` when it has one, else its
/// text when it is all text, else its content blocks. A result the upstream marked `isError`
/// reads `{"error": text, ...}`, like a script's handled error.
fn upstream_value(result: &serde_json::Map<String, Json>) -> Json {
    let blocks = result.get("content").and_then(Json::as_array).map(Vec::as_slice).unwrap_or_default();
    let texts: Option<Vec<&str>> =
        blocks.iter().map(|b| (b.get("type")? == "text").then(|| b.get("text")?.as_str()).flatten()).collect();
    let text = texts.as_ref().map(|t| t.join("\n"));
    if is_error(result) {
        let mut error = serde_json::Map::new();
        error.insert("error".into(), Json::String(text.clone().unwrap_or_else(|| "the upstream tool failed".into())));
        if text.is_none() {
            error.insert("content".into(), Json::Array(blocks.to_vec()));
        }
        if let Some(structured) = result.get("structuredContent") {
            error.insert("structuredContent".into(), structured.clone());
        }
        return Json::Object(error);
    }
    if let Some(structured) = result.get("structuredContent").filter(|s| !s.is_null()) {
        return structured.clone();
    }
    match text {
        Some(text) if !blocks.is_empty() => Json::String(text),
        _ => json!({ "content": blocks }),
    }
}

/// An inner call's result as a Lua value sees it (seed 001): the structured content when
/// there is one, else the text parsed as JSON, else the text. `Err` with the message when the
/// tool reported a failure (`isError`, or a Lua tool's handled `{error = ...}`). Takes the
/// output: a result of many MiB is moved, not copied.
pub fn inner_value(output: Output) -> Result<Json, String> {
    match output {
        Output::Value(v) => Ok(v),
        Output::Text(t) => Ok(parsed(t)),
        Output::HandledError(v) => Err(match v.get("error") {
            Some(Json::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => v.to_string(),
        }),
        Output::Upstream(raw) => from_mcp_result(raw),
        Output::Content(_) => match serde_json::to_value(output.mcp()) {
            Ok(Json::Object(raw)) => from_mcp_result(raw),
            _ => Ok(Json::Null),
        },
        Output::Traced { output, .. } => inner_value(*output),
    }
}

/// A full MCP `CallToolResult` as the script sees it.
fn from_mcp_result(mut raw: serde_json::Map<String, Json>) -> Result<Json, String> {
    let blocks = match raw.remove("content") {
        Some(Json::Array(blocks)) => blocks,
        _ => Vec::new(),
    };
    let texts: Option<Vec<&str>> =
        blocks.iter().map(|b| if b.get("type")? == "text" { b.get("text")?.as_str() } else { None }).collect();
    let text = texts.map(|t| t.join("\n"));
    if raw.get("isError").and_then(Json::as_bool).unwrap_or(false) {
        return Err(text.unwrap_or_else(|| "the tool reported an error without a text message".to_string()));
    }
    if let Some(structured @ Json::Object(_)) = raw.remove("structuredContent") {
        return Ok(structured);
    }
    match text {
        Some(text) if !blocks.is_empty() => Ok(parsed(text)),
        _ => Ok(serde_json::json!({ "content": blocks })),
    }
}

/// `text` as JSON when it is an object or an array, else the text itself.
fn parsed(text: String) -> Json {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        if let Ok(value) = serde_json::from_str::<Json>(&text) {
            return value;
        }
    }
    Json::String(text)
}
