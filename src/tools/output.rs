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
}

impl Output {
    /// The REST body: `{"result": ...}` (always status 200).
    pub fn rest_body(&self) -> Json {
        json!({ "result": self.value() })
    }

    /// The value under `result`.
    pub fn value(&self) -> Json {
        match self {
            Output::Value(v) | Output::HandledError(v) => v.clone(),
            Output::Text(t) => Json::String(t.clone()),
            Output::Content(blocks) => json!({ "content": blocks }),
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
        McpCallResult { content: vec![text(self.to_string())], structured_content: Default::default(), is_error: true }
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
