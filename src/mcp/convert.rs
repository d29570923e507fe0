//! Registry values to rmcp values: listing entries, call results and protocol errors.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations};
use rmcp::ErrorData as McpError;
use serde_json::Value as Json;

use crate::tools::{CallError, ToolSpec};
use crate::types::McpCallResult;

/// The `tools/list` entry: `inputSchema` is exactly the REST parameter schema, and the
/// annotations are what the tool declares (nothing declared, nothing claimed).
pub fn tool(spec: &ToolSpec) -> Tool {
    let schema: JsonObject = match spec.params.schema() {
        Json::Object(map) => map.clone(),
        _ => JsonObject::new(),
    };
    let mut tool = Tool::new(spec.name.clone(), spec.description.clone(), Arc::new(schema));
    if let Some(output) = &spec.output_schema {
        tool = tool.with_raw_output_schema(Arc::new(output.clone()));
    }
    if let Some(a) = &spec.annotations {
        if let Some(title) = &a.title {
            tool = tool.with_title(title.clone());
        }
        tool = tool.with_annotations(ToolAnnotations::from_raw(
            a.title.clone(),
            a.read_only,
            a.destructive,
            a.idempotent,
            a.open_world,
        ));
    }
    tool
}

/// The `tools/call` result. The shapes are the same JSON, pinned by
/// `schemas/mcp-call-result.schema.json` on our side.
pub fn result(result: &McpCallResult) -> Result<CallToolResult, McpError> {
    let internal = |e: serde_json::Error| McpError::internal_error(format!("tool result: {e}"), None);
    let content: Vec<ContentBlock> =
        serde_json::to_value(&result.content).and_then(serde_json::from_value).map_err(internal)?;
    // The constructors set `resultType: complete`, which 2026-era clients require (rmcp drops it
    // for older ones).
    let mut out = if result.is_error { CallToolResult::error(content) } else { CallToolResult::success(content) };
    if !result.structured_content.is_empty() {
        out.structured_content = Some(Json::Object(result.structured_content.clone()));
    }
    Ok(out)
}

/// Unknown tool and invalid parameters: JSON-RPC -32602, with the REST error body (code,
/// message, details with each field's JSON pointer) as `data`.
pub fn protocol_error(error: &CallError) -> McpError {
    let data = serde_json::to_value(error.body()).ok();
    McpError::invalid_params(error.to_string(), data)
}
