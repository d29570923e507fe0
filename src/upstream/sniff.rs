//! What rmcp's types drop from an upstream's tool list and ctx needs: each tool's `execution`
//! (`taskSupport`, MCP 2025-11-25). rmcp 3.9's `Tool` has no such field, so a tool that runs
//! only as a task would be called plainly, and every call of it would be refused. The raw
//! answers to `tools/list` are read here as they arrive (stdio lines in [`super::frame`],
//! event-stream answers over HTTP in [`super::http`]), and the listing puts `execution` back, so
//! such a tool is called as a task ([`super::task`]).
//!
//! An HTTP server that answers `tools/list` with plain JSON instead of an event stream is not
//! seen here (rmcp parses that body itself); its task-only tools say what they are when called
//! plainly, and the call is made again as a task (`tools::upstream_tool`).

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Map, Value as Json};

/// A raw message longer than this is not read for `execution` (a tool list is far smaller).
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// Tools remembered at most (a list keeps 2,000 entries; a server that sends more answers
/// than it was asked for gets no more room).
const MAX_TOOLS: usize = 4_096;
/// The longest `taskSupport` value kept (`forbidden`, `optional`, `required`).
const MAX_VALUE: usize = 16;

/// The `taskSupport` of each tool that has one, by the server's tool name, as the answers to
/// the current listing said (cleared when a listing starts). Only that short value is kept,
/// for a bounded number of tools: what a hostile server sends cannot grow it.
#[derive(Default)]
pub struct Executions {
    by_tool: Mutex<HashMap<String, String>>,
}

impl Executions {
    /// One raw message from the server. The tools of a `tools/list` answer are remembered with
    /// their `execution`, or forgotten when they have none any more.
    pub fn see(&self, message: &[u8]) {
        if message.len() > MAX_MESSAGE || !contains(message, b"\"tools\"") {
            return;
        }
        let Ok(value) = serde_json::from_slice::<Json>(message) else { return };
        let Some(tools) = value.pointer("/result/tools").and_then(Json::as_array) else { return };
        let mut by_tool = self.by_tool.lock().unwrap_or_else(|p| p.into_inner());
        for tool in tools {
            let Some(name) = tool.get("name").and_then(Json::as_str) else { continue };
            let support =
                tool.pointer("/execution/taskSupport").and_then(Json::as_str).filter(|v| v.len() <= MAX_VALUE);
            match support {
                Some(support) if by_tool.len() < MAX_TOOLS || by_tool.contains_key(name) => {
                    by_tool.insert(name.to_string(), support.to_string());
                }
                Some(_) => {}
                None => {
                    by_tool.remove(name);
                }
            }
        }
    }

    /// Forgets what earlier listings said: a listing starts.
    pub fn clear(&self) {
        self.by_tool.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Puts `execution` back into the listed tools that lost it on the way through rmcp.
    pub fn restore(&self, tools: &mut [Map<String, Json>]) {
        let by_tool = self.by_tool.lock().unwrap_or_else(|p| p.into_inner());
        if by_tool.is_empty() {
            return;
        }
        for tool in tools {
            if tool.contains_key("execution") {
                continue;
            }
            let support = tool.get("name").and_then(Json::as_str).and_then(|name| by_tool.get(name)).cloned();
            if let Some(support) = support {
                tool.insert("execution".to_string(), serde_json::json!({ "taskSupport": support }));
            }
        }
    }
}

/// Whether the start of a line (its first bytes) may be an answer with a tool list: SDKs write
/// `"result"` and its first key `"tools"` near the start, in either order of `jsonrpc`/`id`.
pub fn may_be_tool_list(head: &[u8]) -> bool {
    contains(head, b"\"result\"") && contains(head, b"\"tools\"")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_tool_lists_execution_is_kept_and_put_back_and_forgotten_when_gone() {
        let seen = Executions::default();
        let answer = json!({"jsonrpc": "2.0", "id": 2, "result": {"tools": [
            {"name": "slow", "inputSchema": {"type": "object"}, "execution": {"taskSupport": "required"}},
            {"name": "fast", "inputSchema": {"type": "object"}}]}});
        seen.see(answer.to_string().as_bytes());
        let mut listed = vec![
            json!({"name": "slow"}).as_object().unwrap().clone(),
            json!({"name": "fast"}).as_object().unwrap().clone(),
        ];
        seen.restore(&mut listed);
        assert_eq!(listed[0]["execution"], json!({"taskSupport": "required"}));
        assert!(!listed[1].contains_key("execution"));
        // The next answer says it runs plainly now.
        seen.see(json!({"jsonrpc": "2.0", "id": 3, "result": {"tools": [{"name": "slow"}]}}).to_string().as_bytes());
        let mut listed = vec![json!({"name": "slow"}).as_object().unwrap().clone()];
        seen.restore(&mut listed);
        assert!(!listed[0].contains_key("execution"));
        assert!(may_be_tool_list(br#"{"result":{"tools":[{"name""#));
        assert!(!may_be_tool_list(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]"#));
    }
}
