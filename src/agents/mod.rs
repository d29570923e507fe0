//! Agents: named personas (a system prompt, the tools to use, arguments) that resolve into a
//! prompt. Inline agents come from `[agents.inline.*]`; Lua agents from `[agents.script.*]`, whose
//! `agent.resolve(args, config, context)` can search the knowledge base first. Every caller (REST,
//! MCP prompts, `ctx agent test`) resolves an agent through the call pipeline's one door
//! ([`Registry::enter`](crate::tools::Registry::enter)), like a tool call.

mod inline;
mod lua_agent;

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use crate::config::{Config, ScriptKind};
use crate::tools::{CallEnv, CallError};
use crate::types::{self, AgentArgument, AgentSource, ErrorDetail, LoadProblem, LoadProblemKind, ResolvedAgent};

pub use inline::InlineAgent;
pub use lua_agent::LuaAgent;

/// What every agent declares.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    pub name: String,
    pub description: String,
    pub tools: Vec<String>,
    pub arguments: Vec<AgentArgument>,
    pub source: AgentSource,
    /// The `[agents.inline|script.<section>]` key.
    pub section: String,
}

impl AgentSpec {
    /// The listing entry (`GET /agents/list`).
    pub fn info(&self) -> types::Agent {
        types::Agent {
            name: self.name.clone(),
            description: self.description.clone(),
            tools: self.tools.clone(),
            source: self.source,
            arguments: self.arguments.clone(),
        }
    }

    /// Checks `args` (a JSON object of strings) against the declared arguments: every required
    /// one present, none unknown. Every problem is reported, each with its JSON pointer.
    pub fn check(&self, args: &Json) -> Result<Map<String, Json>, CallError> {
        let invalid = |problems| CallError::InvalidArguments { agent: self.name.clone(), problems };
        let detail = |path: String, message: String| ErrorDetail { path, message };
        let args = match args {
            Json::Null => Map::new(),
            Json::Object(map) => map.clone(),
            other => {
                return Err(invalid(vec![detail(
                    "/arguments".into(),
                    format!("expected an object of strings, got {}", kind(other)),
                )]))
            }
        };
        let mut problems = Vec::new();
        for (key, value) in &args {
            if !self.arguments.iter().any(|a| a.name.as_str() == key) {
                let known: Vec<&str> = self.arguments.iter().map(|a| a.name.as_str()).collect();
                let takes = if known.is_empty() { "none".to_string() } else { known.join(", ") };
                problems
                    .push(detail(format!("/arguments/{key}"), format!("unknown argument; this agent takes: {takes}")));
            } else if !value.is_string() {
                problems.push(detail(format!("/arguments/{key}"), format!("expected string, got {}", kind(value))));
            }
        }
        for arg in self.arguments.iter().filter(|a| a.required) {
            if !args.contains_key(arg.name.as_str()) {
                let what = arg.description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
                problems.push(detail(
                    format!("/arguments/{}", arg.name.as_str()),
                    format!("missing; required argument{what}"),
                ));
            }
        }
        if problems.is_empty() {
            Ok(args)
        } else {
            Err(invalid(problems))
        }
    }
}

fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

/// An agent of either kind.
pub trait Agent: Send + Sync {
    fn spec(&self) -> &AgentSpec;
    /// Resolves the prompt for checked `args`. May block while a script runs.
    fn resolve(&self, args: &Map<String, Json>, env: &CallEnv<'_>) -> Result<ResolvedAgent, CallError>;
    /// How long resolving may run, when the agent enforces a limit (see `tools::stuck`).
    fn deadline(&self) -> Option<std::time::Duration> {
        None
    }
}

pub type AgentRef = Arc<dyn Agent>;

/// Loads every agent of a config: inline agents, then Lua agents, each sorted by name. A script
/// that fails keeps its last good version from `previous` (hot reload) and is reported. An agent
/// naming a tool that `tool_names` lacks is reported with `unknown_tools` (a warning at start,
/// an error in `ctx schema check`).
pub fn load(
    config: &Config,
    previous: &[AgentRef],
    tool_names: &[&str],
) -> (Vec<AgentRef>, Vec<LoadProblem>, Vec<LoadProblem>) {
    let mut problems = Vec::new();
    let mut agents: Vec<AgentRef> = Vec::new();
    let mut scripted: Vec<AgentRef> = Vec::new();
    // An agent that fails is reported and keeps its last good version from `previous`.
    let mut failed = |source: AgentSource, name: &str, message: String| {
        let message = crate::config::redact::string(message);
        problems.push(LoadProblem { kind: LoadProblemKind::Agent, name: name.to_string(), message });
        previous.iter().find(|a| a.spec().source == source && a.spec().section == name).map(Arc::clone)
    };
    for (name, section) in &config.spec.agents.inline {
        match InlineAgent::new(name.as_str(), section) {
            Ok(agent) => agents.push(Arc::new(agent)),
            Err(message) => {
                tracing::warn!(agent = %name.as_str(), "{message}");
                agents.extend(failed(AgentSource::Toml, name.as_str(), message))
            }
        }
    }
    for section in config.scripts_of(ScriptKind::Agent) {
        let owned = (*section).clone();
        match crate::lua::watchdog::bounded(&section.display_path, section.timeout, move || LuaAgent::load(&owned)) {
            Ok(agent) => scripted.push(Arc::new(agent)),
            Err(message) => {
                tracing::warn!(agent = %section.name, "{message}");
                scripted.extend(failed(AgentSource::Lua, &section.name, message))
            }
        }
    }
    // Sections an unset variable disables (the config layer set them aside and logged them).
    for section in config.broken_of(ScriptKind::Agent) {
        let (source, into) = if section.table == "agents.inline" {
            (AgentSource::Toml, &mut agents)
        } else {
            (AgentSource::Lua, &mut scripted)
        };
        into.extend(failed(source, &section.name, section.message()));
    }
    agents.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
    scripted.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
    let mut seen: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for agent in agents.into_iter().chain(scripted) {
        let spec = agent.spec();
        let here = format!("[agents.{}.{}]", source_word(spec.source), spec.section);
        if let Some(first) = seen.get(&spec.name) {
            problems.push(LoadProblem {
                kind: LoadProblemKind::Agent,
                name: spec.section.clone(),
                message: format!(
                    "{here} declares the agent name '{}', already taken by {first}; rename one",
                    spec.name
                ),
            });
            continue;
        }
        seen.insert(spec.name.clone(), here);
        out.push(agent);
    }
    let mut unknown = Vec::new();
    for agent in &out {
        let spec = agent.spec();
        let missing: Vec<&str> = spec.tools.iter().map(String::as_str).filter(|t| !tool_names.contains(t)).collect();
        if !missing.is_empty() {
            unknown.push(LoadProblem {
                kind: LoadProblemKind::Agent,
                name: spec.section.clone(),
                message: format!(
                    "agent '{}' names tools that are not registered: {}; registered tools: {}",
                    spec.name,
                    missing.join(", "),
                    tool_names.join(", ")
                ),
            });
        }
    }
    (out, problems, unknown)
}

fn source_word(source: AgentSource) -> &'static str {
    match source {
        AgentSource::Toml => "inline",
        AgentSource::Lua => "script",
    }
}
