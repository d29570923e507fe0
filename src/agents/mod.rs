//! Agents: named personas (a system prompt, the tools to use, arguments) that resolve into a
//! prompt. Inline agents come from `[agents.inline.*]`; Lua agents from `[agents.script.*]`, whose
//! `agent.resolve(args, config, context)` can search the knowledge base first. Every caller (REST,
//! MCP prompts, `ctx agent test`) resolves an agent through the call pipeline's one door
//! ([`Registry::enter`](crate::tools::Registry::enter)), like a tool call.

mod inline;
mod lua_agent;

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{Config, ScriptKind};
use crate::types::{AgentSource, LoadProblem, LoadProblemKind};

pub use inline::InlineAgent;
pub use lua_agent::LuaAgent;
// What an agent is, to the call path that resolves it: there, below the two kinds of agent.
pub use crate::tools::agent::{Agent, AgentRef, AgentSpec};

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
        match crate::lua::watchdog::bounded(&section.path, &section.display_path, section.timeout, move || {
            LuaAgent::load(&owned)
        }) {
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
