//! Code mode's tools: `execute` (an agent-sent script over every tool), the four discovery
//! tools, and the scripted tools an operator composes in `[tools.scripted.<name>]`. Each is one
//! more implementation of the registry's [`Tool`], so REST, MCP and the CLI serve them as they
//! serve any tool.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value as Json};

use super::catalog::Catalog;
use super::run::Runner;
use crate::config::code_mode::{CodeMode, ScriptedSection};
use crate::tools::{CallEnv, CallError, Output, Params, Principal, Registry, Tool, ToolRef, ToolSpec};
use crate::types::{LoadProblem, LoadProblemKind, ToolAnnotations};

/// The largest script `execute` accepts, in bytes.
pub const MAX_SCRIPT_BYTES: usize = 256 * 1024;

/// Code mode's tools for a registry whose other tools are `others` (built-ins, Lua tools,
/// upstream tools), in listing order: `execute` and the discovery tools (when code mode is
/// enabled), then the scripted tools. A scripted tool whose name is taken is a load problem.
pub fn tools(mode: &CodeMode, scripted: &[ScriptedSection], others: &[ToolRef]) -> (Vec<ToolRef>, Vec<LoadProblem>) {
    let policy = super::Policy::new(mode);
    // What scripts may call at all: the destructive tools the operator did not allow are not
    // offered to a script's author (a call to one is still refused with the reason).
    let callable = |s: &ToolSpec| policy.refuses(s).is_none();
    let mode = Arc::new(mode.clone());
    let taken: HashSet<&str> = others.iter().map(|t| t.spec().name.as_str()).collect();
    let mut problems = Vec::new();
    let mut composed: Vec<ToolRef> = Vec::new();
    for section in scripted {
        if taken.contains(section.name.as_str()) {
            problems.push(LoadProblem {
                kind: LoadProblemKind::Tool,
                name: section.name.clone(),
                message: format!(
                    "[tools.scripted.{0}]: the name '{0}' is already a tool's (a Lua tool or an upstream server's); rename the section",
                    section.name
                ),
            });
            continue;
        }
        let allow = section.tool_set();
        let catalog = Arc::new(Catalog::new(others.iter().map(|t| t.spec()).filter(|s| allow.is_match(&s.name))));
        let shown = Catalog::new(others.iter().map(|t| t.spec()).filter(|s| allow.is_match(&s.name) && callable(s)));
        let description = format!("{}\n\n{}", section.description.trim_end(), shown.prompt(&section.name));
        let scope = Some((allow, section.tools.clone()));
        let runner = Runner::new(section.name.clone(), catalog, scope, section.limits.clone(), Arc::clone(&mode));
        let mut spec = script_spec(&section.name, description, &runner);
        spec.builtin = false;
        let title = section.title.clone().unwrap_or_else(|| format!("{}: run a Lua script", section.name));
        if let Some(annotations) = spec.annotations.as_mut() {
            annotations.title = Some(title);
        }
        composed.push(Arc::new(ScriptTool { spec, runner }));
    }
    let mut out: Vec<ToolRef> = Vec::new();
    if mode.enabled {
        // Scripted tools are left out: a script never starts another script (see
        // `code::nested_script`), so execute's scripts call the tools themselves.
        // The runner knows every tool, so that a script calling one it may not gets the reason;
        // what a script's author is shown (the description, discovery) leaves those out.
        let catalog = Arc::new(Catalog::new(others.iter().map(|t| t.spec())));
        let shown = Arc::new(Catalog::new(others.iter().map(|t| t.spec()).filter(|s| callable(s))));
        let description = shown.execute_description();
        let runner =
            Runner::new("execute".to_string(), Arc::clone(&catalog), None, mode.limits.clone(), Arc::clone(&mode));
        out.push(Arc::new(ScriptTool { spec: script_spec("execute", description, &runner), runner }));
        for kind in [Discovery::ListServers, Discovery::ListTools, Discovery::DescribeTool, Discovery::SearchTools] {
            out.push(Arc::new(DiscoveryTool { spec: discovery_spec(kind), kind, catalog: Arc::clone(&shown) }));
        }
    }
    out.extend(composed);
    (out, problems)
}

/// Warnings for the globs of scripted tools that match none of `names` (ctx's own tools), as
/// `tools.scripted.<name>: ...` lines: a typo leaves the tool without a tool it was meant to
/// call, and nothing else would say so. A glob with `__` names upstream tools, which are known
/// only once their servers are connected: only its server (`jira` of `jira__*`) is checked,
/// against the configured `servers`.
pub fn unmatched_globs(scripted: &[ScriptedSection], names: &[&str], servers: &[&str]) -> Vec<String> {
    let mut known = names.iter().take(20).copied().collect::<Vec<_>>().join(", ");
    if names.len() > 20 {
        known.push_str(&format!(" and {} more", names.len() - 20));
    }
    let mut out = Vec::new();
    for section in scripted {
        // `jira__*`: its server must at least be configured.
        for glob in section.tools.iter().filter(|g| g.contains("__")) {
            let Some((server, _)) = glob.split_once("__") else { continue };
            let literal = !server.contains(['*', '?', '[', '{', '\\']);
            let prefix = format!("{server}__");
            if literal && !servers.iter().any(|s| crate::tools::upstream_tool::registry_name(s, "") == prefix) {
                let configured = if servers.is_empty() { "none".to_string() } else { servers.join(", ") };
                out.push(format!(
                    "tools.scripted.{}: tools glob \"{glob}\" names upstream server '{server}', which is not \
                     configured (configured: {configured}); add [mcp.servers.{server}] or fix the glob",
                    section.name
                ));
            }
        }
        for glob in section.tools.iter().filter(|g| !g.contains("__")) {
            let set = crate::config::code_mode::glob_set(std::slice::from_ref(glob));
            if !names.iter().any(|n| set.is_match(n)) {
                out.push(format!(
                    "tools.scripted.{}: tools glob \"{glob}\" matches no tool (ctx's tools are {known}; \
                     scripted tools and execute are never reachable from a script); fix the name, or \
                     scripts cannot call the tool it means",
                    section.name
                ));
            }
        }
    }
    out
}

/// `execute`, or a scripted tool: takes `{script, timeout?}` and runs it.
struct ScriptTool {
    spec: ToolSpec,
    runner: Runner,
}

impl Tool for ScriptTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run(&self, params: Json, env: &CallEnv<'_>) -> Result<Output, CallError> {
        let script = params.get("script").and_then(Json::as_str).unwrap_or_default();
        let timeout = params.get("timeout").and_then(Json::as_f64).map(Duration::from_secs_f64);
        self.runner.run(script, timeout, env)
    }

    fn deadline(&self) -> Option<Duration> {
        Some(self.runner.limits.timeout)
    }

    /// `execute`'s description lists the catalog: a scoped token gets one rendered from its
    /// own tools. A scripted tool's lists the signatures of the tools it may call: a scoped
    /// token sees only those it may call itself.
    fn description_for(&self, registry: &Registry, principal: &Principal) -> Option<String> {
        if self.spec.builtin {
            Some(super::catalog_of(registry, principal).execute_description())
        } else {
            super::scripted_description(registry, &self.spec.name, principal)
        }
    }
}

fn script_spec(name: &str, description: String, runner: &Runner) -> ToolSpec {
    let most = runner.limits.timeout.as_secs_f64();
    let schema = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["script"],
        "properties": {
            "script": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_SCRIPT_BYTES,
                "description": "Lua source."
            },
            "timeout": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": most,
                "description": "Seconds.",
            }
        }
    });
    ToolSpec {
        name: name.to_string(),
        description,
        version: None,
        builtin: true,
        params: Params::compile(schema).expect("the script schema compiles"),
        annotations: Some(ToolAnnotations {
            title: Some("Run a Lua script".to_string()),
            read_only: Some(false),
            destructive: None,
            idempotent: Some(false),
            open_world: Some(true),
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

#[derive(Clone, Copy)]
enum Discovery {
    ListServers,
    ListTools,
    DescribeTool,
    SearchTools,
}

/// A discovery tool: the same functions a script has, as tools of their own.
struct DiscoveryTool {
    spec: ToolSpec,
    kind: Discovery,
    catalog: Arc<Catalog>,
}

impl Tool for DiscoveryTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run(&self, params: Json, env: &CallEnv<'_>) -> Result<Output, CallError> {
        let text = |key: &str| params.get(key).and_then(Json::as_str).unwrap_or_default().to_string();
        // A scoped token discovers only its tools: the shared catalog would name the others.
        let scoped = env.principal.as_deref().map(|p| super::catalog_of(&env.registry, p));
        let catalog = scoped.as_ref().unwrap_or(&self.catalog);
        let found = match self.kind {
            Discovery::ListServers => Ok(catalog.list_servers()),
            Discovery::ListTools => catalog.list_tools(&text("server")),
            Discovery::DescribeTool => {
                catalog.describe_tool(&text("name"), params.get("schemas").and_then(Json::as_bool).unwrap_or(false))
            }
            Discovery::SearchTools => {
                let limit = params.get("limit").and_then(Json::as_u64).unwrap_or(10) as usize;
                catalog.search_tools(&text("query"), limit)
            }
        };
        found.map(Output::Value).map_err(CallError::NotFound)
    }

    /// Answers come from memory (the first search builds a small index): run on the caller's
    /// thread.
    fn run_inline(&self, params: &Json, env: &CallEnv<'_>) -> Option<Result<Output, CallError>> {
        Some(self.run(params.clone(), env))
    }
}

fn discovery_spec(kind: Discovery) -> ToolSpec {
    let string =
        |description: &str| json!({"type": "string", "minLength": 1, "maxLength": 1024, "description": description});
    let (name, description, properties, required) = match kind {
        Discovery::ListServers => (
            "list_servers",
            "Code mode: list the groups of tools a script can call (ctx's own tools, then each upstream MCP server) with their Lua globals and tool counts.",
            json!({}),
            vec![],
        ),
        Discovery::ListTools => (
            "list_tools",
            "Code mode: list one server's tools (\"ctx\" for ctx's own) with how a script calls each and a one-line summary.",
            json!({"server": string("The server's name, as list_servers gives it.")}),
            vec!["server"],
        ),
        Discovery::DescribeTool => (
            "describe_tool",
            "Code mode: one tool's Lua call signature (from its input and output schemas), its description, what each parameter means and an example call.",
            json!({
                "name": string("The tool's name (github__search_repos) or its call (github.search_repos)."),
                "schemas": {"type": "boolean", "default": false, "description": "Also give the raw input and output JSON Schemas."}
            }),
            vec!["name"],
        ),
        Discovery::SearchTools => (
            "search_tools",
            "Code mode: find tools by what they do. A ranked full-text search over every tool's name and description, e.g. \"create a jira ticket\".",
            json!({
                "query": string("What the tool should do, in words."),
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10, "description": "How many tools to return."}
            }),
            vec!["query"],
        ),
    };
    let schema =
        json!({"type": "object", "additionalProperties": false, "properties": properties, "required": required});
    ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        version: None,
        builtin: true,
        params: Params::compile(schema).expect("the discovery schemas compile"),
        annotations: Some(ToolAnnotations {
            title: None,
            read_only: Some(true),
            destructive: Some(false),
            idempotent: Some(true),
            open_world: Some(false),
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
