//! Registry values to rmcp values: listing entries, call results and protocol errors.

use std::sync::Arc;

use rmcp::model::{
    CallToolResult, ContentBlock, GetPromptResult, JsonObject, Prompt, PromptArgument, PromptMessage, Role, Tool,
    ToolAnnotations,
};
use rmcp::ErrorData as McpError;
use serde_json::Value as Json;

use crate::agents::AgentSpec;
use crate::tools::{CallError, Output, ToolSpec};
use crate::types::{AgentPrompt, McpCallResult, PromptMessageRole};

/// The `tools/list` entry: `inputSchema` is exactly the REST parameter schema, and the
/// annotations are what the tool declares (nothing declared, nothing claimed).
pub fn tool(spec: &ToolSpec) -> Tool {
    // An upstream's entry passes through as it sent it, under ctx's name for it.
    if let Some(origin) = &spec.upstream {
        let mut raw = origin.raw.clone();
        raw.insert("name".into(), Json::String(spec.name.clone()));
        if let Ok(tool) = serde_json::from_value::<Tool>(Json::Object(raw)) {
            return tool;
        }
    }
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

/// The `tools/call` result of a call that succeeded: an upstream's result passes through
/// whole (every content block kind, `structuredContent`, `isError`, `_meta`).
pub fn output(output: &Output) -> Result<CallToolResult, McpError> {
    if let Output::Traced { output, trace } = output {
        let mut out = self::output(output)?;
        let mut meta = out.meta.take().unwrap_or_default();
        meta.0.insert("ctx/trace".to_string(), trace.clone());
        out.meta = Some(meta);
        return Ok(out);
    }
    let Output::Upstream(raw) = output else { return result(&output.mcp()) };
    let internal = |e: serde_json::Error| McpError::internal_error(format!("upstream tool result: {e}"), None);
    let mut content = raw.get("content").cloned().unwrap_or(Json::Array(Vec::new()));
    // A block's `_meta` may not pass off `ctx/...` keys as ctx's either.
    for block in content.as_array_mut().into_iter().flatten() {
        if let Some(Json::Object(meta)) = block.get_mut("_meta") {
            meta.retain(|k, _| !k.starts_with("ctx/"));
        }
    }
    let content: Vec<ContentBlock> = serde_json::from_value(content).map_err(internal)?;
    let is_error = raw.get("isError").and_then(Json::as_bool).unwrap_or(false);
    let mut out = if is_error { CallToolResult::error(content) } else { CallToolResult::success(content) };
    // MCP allows only an object here: anything else would break the client's schema check.
    out.structured_content = raw.get("structuredContent").filter(|s| s.is_object()).cloned();
    if let Some(Json::Object(meta)) = raw.get("_meta") {
        // `ctx/...` keys are ctx's to write (the trace, a script's error): an upstream's or a
        // script's own are dropped, so none can pass for ctx's.
        let theirs = meta.iter().filter(|(k, _)| !k.starts_with("ctx/"));
        let meta: serde_json::Map<String, Json> = theirs.map(|(k, v)| (k.clone(), v.clone())).collect();
        if !meta.is_empty() {
            out.meta = serde_json::from_value(Json::Object(meta)).ok();
        }
    }
    Ok(out)
}

/// The `tools/call` result of a call that failed as a tool error. A failed script (only
/// `execute` and scripted tools fail with [`CallError::ScriptFailed`]) carries what REST puts in
/// the error body: the trace of its inner calls as `_meta["ctx/trace"]` (as on success), and its
/// code with the limit or line as `_meta["ctx/error"]`. Any other tool's error data stays where
/// it is: a Lua tool could otherwise pass off a trace of its own.
pub fn error_result(error: &CallError) -> Result<CallToolResult, McpError> {
    let mut out = result(&error.mcp())?;
    if let CallError::ScriptFailed { reason, data, .. } = error {
        let Json::Object(data) = data.as_ref() else { return Ok(out) };
        let mut data = data.clone();
        if let Some(trace) = data.remove("trace") {
            let mut meta = out.meta.take().unwrap_or_default();
            meta.0.insert("ctx/trace".to_string(), trace);
            data.insert("code".to_string(), Json::String(reason.clone()));
            meta.0.insert("ctx/error".to_string(), Json::Object(data));
            out.meta = Some(meta);
        }
    }
    Ok(out)
}

/// Unknown tool and invalid parameters: JSON-RPC -32602, with the REST error body (code,
/// message, details with each field's JSON pointer) as `data`.
pub fn protocol_error(error: &CallError) -> McpError {
    let data = serde_json::to_value(error.body()).ok();
    McpError::invalid_params(error.to_string(), data)
}

/// The `prompts/list` entry of an agent.
pub fn prompt(spec: &AgentSpec) -> Prompt {
    let arguments = spec
        .arguments
        .iter()
        .map(|a| {
            let mut arg = PromptArgument::new(a.name.to_string()).with_required(a.required);
            if let Some(d) = &a.description {
                arg = arg.with_description(d.clone());
            }
            arg
        })
        .collect();
    Prompt::new(spec.name.clone(), Some(spec.description.clone()), Some(arguments))
}

/// The code-mode catalog prompt's `prompts/list` entry, when code mode is on and no agent has
/// taken its name.
pub fn catalog_prompt(registry: &crate::tools::Registry) -> Option<Prompt> {
    let name = crate::code::PROMPT;
    if !registry.kb().config().code_mode.enabled || registry.agents().any(|a| a.name == name) {
        return None;
    }
    let argument = PromptArgument::new("tool")
        .with_description("A scripted tool's name, for its catalog; `execute` (the default) for every tool.")
        .with_required(false);
    Some(Prompt::new(
        name,
        Some("Code mode: every tool a script can call, as Lua signatures with how to call, await and return, for writing scripts for the execute tool."),
        Some(vec![argument]),
    ))
}

/// `prompts/get` of the catalog prompt: one user message with the catalog.
pub fn catalog_result(text: String) -> GetPromptResult {
    GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
        .with_description("The tools a code-mode script can call".to_string())
}

/// `prompts/get`: the system prompt opens the conversation as the first user message (MCP prompt
/// messages have no system role), ending with the tools to use; then the agent's messages. The
/// tools line is part of the system text, not a message of its own after the agent's, so an
/// agent whose messages end with an assistant turn (a primed answer) keeps it last.
pub fn prompt_result(prompt: AgentPrompt) -> GetPromptResult {
    let mut system = prompt.system;
    if !prompt.tools.is_empty() {
        system = format!("{}\n\nTools to use: {}.", system.trim_end(), prompt.tools.join(", "));
    }
    let mut messages = vec![PromptMessage::new_text(Role::User, system)];
    for m in prompt.messages {
        let role = match m.role {
            PromptMessageRole::User => Role::User,
            PromptMessageRole::Assistant => Role::Assistant,
        };
        messages.push(PromptMessage::new_text(role, m.content));
    }
    let mut result = GetPromptResult::new(messages);
    if let Some(description) = prompt.description {
        result = result.with_description(description);
    }
    result
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Only a script run's failure gets its error data as `_meta`: a Lua tool's `MCP.error`
    /// data holding a `trace` is not passed off as code mode's.
    #[test]
    fn only_a_script_runs_error_carries_the_trace() {
        let trace = json!({"calls": [{"tool": "delete_everything", "status": "ok"}]});
        let forged = CallError::ToolFailed {
            message: "nope".to_string(),
            tool_code: Some("not_found".to_string()),
            data: Some(json!({"trace": trace, "limit": 7})),
        };
        assert!(error_result(&forged).unwrap().meta.is_none());
        let failed = CallError::ScriptFailed {
            code: crate::types::ErrorCode::Timeout,
            message: "stopped".to_string(),
            reason: "timeout".to_string(),
            data: Box::new(json!({"trace": trace, "limit": "timeout"})),
        };
        let meta = error_result(&failed).unwrap().meta.unwrap();
        assert_eq!(meta.0["ctx/trace"]["calls"][0]["tool"], "delete_everything");
        assert_eq!(meta.0["ctx/error"], json!({"code": "timeout", "limit": "timeout"}));
    }
}
