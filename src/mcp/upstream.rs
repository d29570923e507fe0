//! Upstream resources and prompts on ctx's MCP server: listed under namespaced names
//! (`mcp://<server>/<uri>`, `<server>__<prompt>`) and routed back to their server.
//!
//! Each function takes the caller's [`Reach`]: a scoped token reaches a server's resources and
//! templates when its globs allow the whole server (`<server>__*`, or `*`), and a prompt when they
//! allow the prompt's name; nobody reaches the resources or prompts of a server whose every tool
//! needs approval (reading them would skip it).

use rmcp::model::{ErrorCode as RpcCode, GetPromptResult, Prompt, ReadResourceResult, Resource, ResourceTemplate};
use rmcp::ErrorData as McpError;
use serde_json::{json, Map, Value as Json};

use crate::tools::principal::allows;
use crate::tools::upstream_tool::{namespaced_uri, owner, registry_name, split_uri};
use crate::tools::{Principal, Tools};
use crate::upstream::client::{PROMPTS, RESOURCES};
use crate::upstream::{ServerCatalog, UpstreamError};

/// Whether ctx declares the resources capability: when an upstream offers resources, or may
/// (one still connecting, whose capabilities are not known yet). A client checks capabilities
/// once, at `initialize`, often before the upstreams are up; it then gets an empty list until
/// they are, and `list_changed` when they arrive. Asked at every `initialize`: it copies no list.
pub fn has_resources(tools: &Tools) -> bool {
    tools.upstreams().is_some_and(|u| u.has_resources())
}

/// The servers with only the lists in `which`: a client's `prompts/list` must not copy every
/// upstream tool.
fn catalog(tools: &Tools, which: u8) -> Vec<ServerCatalog> {
    tools.upstreams().map(|u| u.lists(which)).unwrap_or_default()
}

/// What one caller may reach of the upstream servers' resources and prompts.
pub struct Reach<'a> {
    principal: Option<&'a Principal>,
    approvals: &'a crate::approval::Policy,
    /// Servers every listed tool of which needs approval, whatever rules say so.
    covered: std::collections::HashSet<&'a str>,
}

impl<'a> Reach<'a> {
    pub fn new(registry: &'a crate::tools::Registry, principal: Option<&'a Principal>) -> Reach<'a> {
        let approvals = registry.approvals();
        let mut all_need: std::collections::HashMap<&str, bool> = Default::default();
        for spec in registry.all_specs() {
            if let Some(origin) = &spec.upstream {
                *all_need.entry(origin.server.as_str()).or_insert(true) &= approvals.needs(spec);
            }
        }
        let covered = all_need.into_iter().filter(|(_, all)| *all).map(|(server, _)| server).collect();
        Reach { principal, approvals, covered }
    }

    /// Whether the caller's globs cover every tool of `server`: `server__*` or `*` does,
    /// `server__?` or `server__get_*` does not (hence the second, long name).
    fn whole_server(&self, server: &str) -> bool {
        allows(self.principal, &format!("{server}__*"))
            && allows(self.principal, &format!("{server}__any_tool_name_the_server_may_list_later"))
    }

    fn under_approval(&self, server: &str) -> bool {
        self.covered.contains(server) || self.approvals.covers_server(server)
    }

    /// Why `server`'s resources and prompts are not served to this caller, if they are not:
    /// an empty reason for a server out of the caller's scope (it is told nothing).
    pub fn refusal(&self, server: &str) -> Option<String> {
        if !self.whole_server(server) {
            return Some(String::new());
        }
        self.approval_refusal(server)
    }

    /// Why nobody is served `server`'s resources and prompts, if its tools all need approval.
    fn approval_refusal(&self, server: &str) -> Option<String> {
        self.under_approval(server).then(|| {
            format!(
                "every tool of upstream server '{server}' needs approval ([approval] or [mcp.servers.{server}] approve), so ctx does not serve its resources and prompts: reading them would skip the approval; call its tools instead"
            )
        })
    }

    fn server(&self, server: &str) -> bool {
        self.refusal(server).is_none()
    }

    fn prompt(&self, server: &str, name: &str) -> bool {
        allows(self.principal, name) && !self.under_approval(server)
    }
}

/// Every upstream resource the caller may reach, its URI namespaced.
pub fn resources(tools: &Tools, reach: &Reach<'_>) -> Vec<Resource> {
    namespaced(tools, reach, |s| &s.resources, "uri", "resource")
}

/// Every upstream resource template the caller may reach, its URI template namespaced.
pub fn templates(tools: &Tools, reach: &Reach<'_>) -> Vec<ResourceTemplate> {
    namespaced(tools, reach, |s| &s.resource_templates, "uriTemplate", "resource template")
}

/// The entries `list` picks from each server, with the URI under `key` namespaced; an entry
/// that is not valid MCP is left out and logged.
fn namespaced<T: serde::de::DeserializeOwned>(
    tools: &Tools,
    reach: &Reach<'_>,
    list: fn(&ServerCatalog) -> &Vec<Map<String, Json>>,
    key: &str,
    what: &str,
) -> Vec<T> {
    let mut out = Vec::new();
    for server in catalog(tools, RESOURCES).into_iter().filter(|s| reach.server(&s.name)) {
        for raw in list(&server) {
            let mut raw = raw.clone();
            if let Some(Json::String(uri)) = raw.get_mut(key) {
                *uri = namespaced_uri(&server.name, uri);
            }
            match serde_json::from_value(Json::Object(raw)) {
                Ok(entry) => out.push(entry),
                Err(e) => tracing::warn!(upstream = %server.name, "a {what} it listed is not valid MCP: {e}"),
            }
        }
    }
    out
}

/// `resources/read` of a namespaced URI: read from its server, the contents' URIs namespaced.
pub async fn read(tools: &Tools, reach: &Reach<'_>, uri: &str) -> Result<ReadResourceResult, McpError> {
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
    match reach.refusal(server) {
        None => {}
        // Out of a scoped token's reach: as if it did not exist.
        Some(why) if why.is_empty() => return Err(not_found()),
        Some(why) => return Err(McpError::invalid_request(why, Some(json!({ "uri": uri })))),
    }
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

/// Every upstream prompt ctx serves: its name as ctx lists it, its server, and its entry.
/// Agents keep their names, and a name is served once: a prompt whose name an agent, another
/// server (see [`owner`]) or an earlier prompt holds is left out, so `prompts/list` never shows
/// two prompts of one name and `prompts/get` reaches the one listed.
fn served_prompts(tools: &Tools) -> Vec<(String, String, Map<String, Json>)> {
    let servers = catalog(tools, PROMPTS);
    let mut taken: std::collections::HashSet<String> = tools.current().agents().map(|a| a.name.clone()).collect();
    let mut out = Vec::new();
    for server in &servers {
        for raw in &server.prompts {
            let Some(original) = raw.get("name").and_then(Json::as_str) else { continue };
            let name = registry_name(&server.name, original);
            let belongs = owner(servers.iter().map(|s| s.name.as_str()), &name) == Some(server.name.as_str());
            if !belongs || !taken.insert(name.clone()) {
                tracing::debug!(upstream = %server.name, "prompt '{original}' is left out: its name '{name}' is taken");
                continue;
            }
            out.push((name, server.name.clone(), raw.clone()));
        }
    }
    out
}

/// Every upstream prompt the caller may reach, named `<server>__<prompt>`.
pub fn prompts(tools: &Tools, reach: &Reach<'_>) -> Vec<Prompt> {
    let mut out = Vec::new();
    for (name, server, mut raw) in served_prompts(tools).into_iter().filter(|(n, s, _)| reach.prompt(s, n)) {
        raw.insert("name".into(), Json::String(name));
        match serde_json::from_value(Json::Object(raw)) {
            Ok(prompt) => out.push(prompt),
            Err(e) => tracing::warn!(upstream = %server, "a prompt it listed is not valid MCP: {e}"),
        }
    }
    out
}

/// `prompts/get` of an upstream prompt; `None` when `name` is no upstream prompt.
pub async fn get_prompt(
    tools: &Tools,
    reach: &Reach<'_>,
    name: &str,
    arguments: Map<String, Json>,
) -> Option<Result<GetPromptResult, McpError>> {
    let (server, original) =
        served_prompts(tools).into_iter().find(|(n, _, _)| n == name).and_then(|(_, server, raw)| {
            let original = raw.get("name").and_then(Json::as_str)?.to_string();
            Some((server, original))
        })?;
    if !allows(reach.principal, name) {
        return None;
    }
    if let Some(why) = reach.approval_refusal(&server) {
        return Some(Err(McpError::invalid_request(why, Some(json!({ "name": name })))));
    }
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
