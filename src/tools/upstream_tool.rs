//! Upstream MCP tools: each tool of a connected upstream server is a registry tool named
//! `<server>__<tool>`, whose calls go over that server's one shared connection.
//!
//! The entry's `inputSchema`, `outputSchema`, title, description and annotations pass through
//! unchanged; the parameters are checked against the upstream's own schema on the one call
//! path, like any tool's. A tool whose listing says `execution.taskSupport = "required"` is
//! called as an MCP task on its server (`upstream::task`), and is `long_running` here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value as Json};
use sha2::Digest;

use super::{AsyncTool, CallEnv, CallError, CallFuture, Output, Params, Tool, ToolRef, ToolSpec, UpstreamOrigin};
use crate::config::upstream::Expose;
use crate::lua::ProgressSink;
use crate::types::{LoadProblem, LoadProblemKind, ToolAnnotations};
use crate::upstream::{ServerCatalog, Upstreams};

/// The longest tool name the major LLM APIs accept (`^[A-Za-z0-9_-]{1,64}$`).
pub const MAX_NAME: usize = 64;

/// Separates the server from the tool in a registry name.
pub const SEPARATOR: &str = "__";

pub struct UpstreamTool {
    spec: ToolSpec,
    upstreams: Arc<Upstreams>,
    timeout: Duration,
}

impl Tool for UpstreamTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// The blocking form (a caller on a blocking thread of the runtime, or a thread that has
    /// entered it): waits for the future on the runtime the thread belongs to, where the
    /// upstream connections live.
    fn run(&self, params: Json, env: &CallEnv<'_>) -> Result<Output, CallError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            CallError::Internal(format!(
                "tool '{}' needs ctx's async runtime, which this caller has not",
                self.spec.name
            ))
        })?;
        // The caller's cancel flag stops the call too (a script that calls this tool through
        // `context.call` and is stopped): dropping the future cancels it upstream.
        let cancel = env.cancel.clone();
        let name = self.spec.name.clone();
        // A blocking caller (the CLI, `context.call`) is never a task.
        let call = self.call(params, env.progress.clone(), false);
        handle.block_on(async move {
            tokio::select! {
                result = call => result,
                _ = cancel.cancelled() => Err(CallError::cancelled(&name)),
            }
        })
    }

    fn deadline(&self) -> Option<Duration> {
        Some(self.timeout)
    }

    fn as_async(&self) -> Option<&dyn AsyncTool> {
        Some(self)
    }
}

impl AsyncTool for UpstreamTool {
    fn call(&self, params: Json, progress: Option<ProgressSink>, in_task: bool) -> CallFuture {
        let upstreams = Arc::clone(&self.upstreams);
        let origin = self.spec.upstream.as_ref().expect("an upstream tool has its origin");
        let (server, tool, name) = (origin.server.clone(), origin.tool.clone(), self.spec.name.clone());
        // A tool that runs only as a task always does; one that may, when ctx's call is a task
        // itself (its caller is not held up, and the upstream's own status shows in ctx's).
        let as_task = match task_support(&origin.raw) {
            Some("required") => true,
            Some("optional") => in_task,
            _ => false,
        };
        // Only a listing that said nothing about tasks leaves the refusal to tell.
        let may_retry = task_support(&origin.raw).is_none();
        let timeout = self.timeout;
        Box::pin(async move {
            let arguments = match params {
                Json::Object(map) => map,
                _ => Map::new(),
            };
            let result = if as_task {
                upstreams.call_tool_as_task(&server, &tool, arguments, progress).await
            } else {
                match upstreams.call_tool(&server, &tool, arguments.clone(), progress.clone()).await {
                    // Its listing did not say (rmcp drops `execution`, and a plain-JSON listing
                    // over HTTP is not sniffed): the refusal does, so the call is made again as
                    // a task, which is what the server asks for.
                    Ok(result) if may_retry && task_only(&result, &tool) => {
                        upstreams.call_tool_as_task(&server, &tool, arguments, progress).await
                    }
                    other => other,
                }
            };
            match result {
                Ok(result) => Ok(Output::Upstream(rewrite_uris(&server, result))),
                Err(e) => Err(CallError::from_upstream(&name, timeout, e)),
            }
        })
    }
}

/// The `execution.taskSupport` of an upstream tool's listing entry (`forbidden`, `optional`,
/// `required`), when it has one.
fn task_support(raw: &Map<String, Json>) -> Option<&str> {
    raw.get("execution").and_then(|e| e.get("taskSupport")).and_then(Json::as_str)
}

/// Whether an upstream's answer is its refusal of a plain call to a tool that runs only as a
/// task. When ctx did not see the listing's `execution` (see `upstream::sniff`), such a tool is
/// listed like any other; its answer is what tells: an error result whose one text block is
/// `MCP error -32601: …` naming the tool and task augmentation. Anything looser would let a
/// tool that ran and echoed such words run a second time.
fn task_only(result: &Map<String, Json>, tool: &str) -> bool {
    let blocks = result.get("content").and_then(Json::as_array).map(Vec::as_slice).unwrap_or_default();
    let [block] = blocks else { return false };
    let text = block.get("text").and_then(Json::as_str).unwrap_or_default();
    result.get("isError") == Some(&Json::Bool(true))
        && text.starts_with("MCP error -32601")
        && text.contains(tool)
        && text.contains("task augmentation")
}

/// `<server>__<tool>`, made valid for the LLM APIs: every other character becomes `_`, and a
/// name over [`MAX_NAME`] keeps its start and gets a hash of the whole, so two long names that
/// share a start still differ.
pub fn registry_name(server: &str, tool: &str) -> String {
    let joined = format!("{server}{SEPARATOR}{tool}");
    let clean: String =
        joined.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    if clean.len() <= MAX_NAME {
        return clean;
    }
    let digest = sha2::Sha256::digest(joined.as_bytes());
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}_{hash}", &clean[..MAX_NAME - hash.len() - 1])
}

/// The configured server a registry name (`<server>__<tool>`) belongs to: the one whose
/// sanitised prefix is the longest that starts `name`, the first by name on a tie.
///
/// Sanitising and `__` inside names make prefixes overlap (`a.b` and `a_b` are both `a_b__`;
/// server `a`'s tool `b__c` and server `a__b`'s tool `c` are both `a__b__c`). Deciding by the
/// configured servers, not by which of them is connected, keeps a name on one server whatever
/// the order of (re)connects: the other side is left out for good, with a load problem,
/// instead of taking the name over while the owner is down.
pub fn owner<'a>(servers: impl IntoIterator<Item = &'a str>, name: &str) -> Option<&'a str> {
    let mut best: Option<(usize, &'a str)> = None;
    for server in servers {
        let prefix = registry_name(server, "");
        if name.starts_with(&prefix) && best.is_none_or(|(len, _)| prefix.len() > len) {
            best = Some((prefix.len(), server));
        }
    }
    best.map(|(_, server)| server)
}

/// The registry tools of every ready server, sorted by name, and the collisions: a name already
/// taken (a built-in, a Lua tool, or an earlier server's tool) or that belongs to another
/// server (see [`owner`]) is not registered, and the problem names both sides. `taken` maps
/// each name to who holds it.
pub fn build(
    catalog: &[ServerCatalog],
    upstreams: &Arc<Upstreams>,
    taken: &mut HashMap<String, String>,
) -> (Vec<ToolRef>, Vec<LoadProblem>, Vec<LoadProblem>) {
    let (mut tools, mut problems, mut warnings) = (Vec::new(), Vec::new(), Vec::new());
    for server in catalog {
        for raw in &server.tools {
            let Some(original) = raw.get("name").and_then(Json::as_str) else { continue };
            let name = registry_name(&server.name, original);
            let here = format!("tool '{original}' of upstream server '{}'", server.name);
            let belongs = owner(catalog.iter().map(|s| s.name.as_str()), &name).unwrap_or(&server.name);
            if belongs != server.name {
                problems.push(LoadProblem {
                    kind: LoadProblemKind::Upstream,
                    name: server.name.clone(),
                    message: format!(
                        "{here} would be registered as '{name}', a name of upstream server '{belongs}' (its prefix matches longer, or first); it is left out whether or not '{belongs}' is connected. Rename one of the servers in [mcp.servers] or exclude the tool"
                    ),
                });
                continue;
            }
            if let Some(holder) = taken.get(&name) {
                problems.push(LoadProblem {
                    kind: LoadProblemKind::Upstream,
                    name: server.name.clone(),
                    message: format!(
                        "{here} would be registered as '{name}', which is already {holder}; it is left out. Rename the server in [mcp.servers] or exclude one of the tools"
                    ),
                });
                continue;
            }
            let (params, warning) = parameters(raw);
            if let Some(message) = warning {
                warnings.push(LoadProblem {
                    kind: LoadProblemKind::Upstream,
                    name: server.name.clone(),
                    message: format!("{here}: {message}"),
                });
            }
            taken.insert(name.clone(), here);
            let spec = ToolSpec {
                name,
                description: raw.get("description").and_then(Json::as_str).unwrap_or_default().to_string(),
                version: None,
                builtin: false,
                params,
                annotations: annotations(raw),
                output_schema: raw.get("outputSchema").and_then(Json::as_object).cloned(),
                script: None,
                section: None,
                hidden: server.expose == Expose::Discover,
                upstream: Some(UpstreamOrigin {
                    server: server.name.clone(),
                    tool: original.to_string(),
                    raw: raw.clone(),
                }),
                approve: false,
                // Calls may run long: an MCP client that supports tasks gets a ctx task handle
                // (see `tools::task_run`). A `required` tool runs as a task upstream too.
                long_running: matches!(task_support(raw), Some("optional" | "required")),
            };
            tools
                .push(Arc::new(UpstreamTool { spec, upstreams: Arc::clone(upstreams), timeout: server.timeout })
                    as ToolRef);
        }
    }
    tools.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
    (tools, problems, warnings)
}

/// The upstream's `inputSchema`, compiled. One ctx cannot compile is passed on unchecked (the
/// upstream still checks it), with a warning.
fn parameters(raw: &Map<String, Json>) -> (Params, Option<String>) {
    let schema = raw.get("inputSchema").cloned().unwrap_or_else(|| json!({"type": "object"}));
    match Params::compile(schema.clone()) {
        Ok(params) => (params, None),
        Err(e) => {
            let open = Params::compile(json!({"type": "object"})).expect("the open schema compiles");
            (open, Some(format!("its inputSchema does not compile ({e}); calls are passed on unchecked")))
        }
    }
}

/// The annotations ctx's own listing understands, read from MCP's hints (`destructiveHint`,
/// ...): code mode's destructive policy depends on them. The MCP listing passes the raw ones on.
fn annotations(raw: &Map<String, Json>) -> Option<ToolAnnotations> {
    let hints = raw.get("annotations")?.as_object()?;
    let hint = |key: &str| hints.get(key).and_then(Json::as_bool);
    let title = hints.get("title").or_else(|| raw.get("title")).and_then(Json::as_str).map(str::to_string);
    Some(ToolAnnotations {
        title,
        read_only: hint("readOnlyHint"),
        destructive: hint("destructiveHint"),
        idempotent: hint("idempotentHint"),
        open_world: hint("openWorldHint"),
    })
}

/// `mcp://<server>/<uri>`: how an upstream resource's URI reads through ctx.
pub fn namespaced_uri(server: &str, uri: &str) -> String {
    format!("mcp://{server}/{uri}")
}

/// The server and original URI of a namespaced one.
pub fn split_uri(uri: &str) -> Option<(&str, &str)> {
    let rest = uri.strip_prefix("mcp://")?;
    let (server, original) = rest.split_once('/')?;
    (!server.is_empty() && !original.is_empty()).then_some((server, original))
}

/// Rewrites the resource URIs inside a tool result (resource links and embedded resources) to
/// their namespaced form, so a client can read them back through ctx.
pub fn rewrite_uris(server: &str, mut result: Map<String, Json>) -> Map<String, Json> {
    if let Some(Json::Array(blocks)) = result.get_mut("content") {
        for block in blocks.iter_mut() {
            let target = match block.get("type").and_then(Json::as_str) {
                Some("resource_link") => block.get_mut("uri"),
                Some("resource") => block.get_mut("resource").and_then(|r| r.get_mut("uri")),
                _ => None,
            };
            if let Some(Json::String(uri)) = target {
                *uri = namespaced_uri(server, uri);
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_refusal_of_a_plain_call_to_a_task_only_tool_is_recognised() {
        let refusal = serde_json::json!({"isError": true, "content": [{"type": "text",
            "text": "MCP error -32601: Tool simulate-research-query requires task augmentation (taskSupport: 'required')"}]});
        let tool = "simulate-research-query";
        assert!(super::task_only(refusal.as_object().unwrap(), tool));
        assert!(!super::task_only(refusal.as_object().unwrap(), "another-tool"), "it names the tool called");
        let other = serde_json::json!({"isError": true, "content": [{"type": "text", "text": "MCP error -32601: no such method"}]});
        assert!(!super::task_only(other.as_object().unwrap(), tool));
        let fine = serde_json::json!({"content": [{"type": "text", "text": "requires task augmentation -32601"}]});
        assert!(!super::task_only(fine.as_object().unwrap(), tool));
        // A tool that ran and echoed such words is not a refusal: it must not run again.
        let echoed = serde_json::json!({"isError": true, "content": [{"type": "text",
            "text": "command failed: output was 'MCP error -32601: simulate-research-query requires task augmentation'"}]});
        assert!(!super::task_only(echoed.as_object().unwrap(), tool));
    }

    use super::*;

    #[test]
    fn names_are_valid_for_llm_apis_and_long_ones_stay_distinct() {
        assert_eq!(registry_name("time", "get_current_time"), "time__get_current_time");
        assert_eq!(registry_name("my.api", "list items"), "my_api__list_items");
        let long_a = registry_name("server", &format!("{}a", "x".repeat(80)));
        let long_b = registry_name("server", &format!("{}b", "x".repeat(80)));
        assert_eq!(long_a.len(), MAX_NAME);
        assert_ne!(long_a, long_b);
        let valid = |n: &str| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        assert!(valid(&long_a) && valid(&registry_name("ü.ö", "a/b")));
    }

    #[test]
    fn a_name_belongs_to_the_longest_then_first_matching_server() {
        let servers = ["a", "a.b", "a__b", "a_", "a_b", "zz"];
        let of = |name: &str| owner(servers, name);
        assert_eq!(of("a__echo"), Some("a"));
        assert_eq!(of("a_b__echo"), Some("a.b"), "a.b and a_b share a prefix: the first by name holds it");
        assert_eq!(of("a__b__c"), Some("a__b"), "server a's tool b__c is server a__b's name");
        assert_eq!(of("a___x"), Some("a_"), "server a's tool _x is server a_'s name");
        assert_eq!(of("zz__t"), Some("zz"));
        assert_eq!(of("nobody__t"), None);
        assert_eq!(of(&registry_name("a", &"x".repeat(100))), Some("a"), "a hashed long name keeps its prefix");
    }

    #[test]
    fn namespaced_uris_route_back() {
        let uri = namespaced_uri("everything", "demo://resource/static/document/1");
        assert_eq!(split_uri(&uri), Some(("everything", "demo://resource/static/document/1")));
        assert_eq!(split_uri("mcp://nothing"), None);
        assert_eq!(split_uri("file:///etc/passwd"), None);
    }

    #[test]
    fn result_uris_are_rewritten() {
        let result = json!({"content": [
            {"type": "text", "text": "fault://doc/9"},
            {"type": "resource_link", "uri": "fault://doc/1", "name": "one"},
            {"type": "resource", "resource": {"uri": "fault://doc/2", "text": "two"}},
        ]});
        let Json::Object(map) = result else { unreachable!() };
        let out = Json::Object(rewrite_uris("f", map));
        assert_eq!(out["content"][0]["text"], "fault://doc/9");
        assert_eq!(out["content"][1]["uri"], "mcp://f/fault://doc/1");
        assert_eq!(out["content"][2]["resource"]["uri"], "mcp://f/fault://doc/2");
    }
}
