//! The application assembled from a config: the tool registry with its Lua tools, agents and
//! code mode's tools ([`build`]), the check of a config's scripts ([`check`]), and hot reload
//! ([`reload`]). It sits above every feature, so `tools` need not know `agents` or `code`.

pub mod database;
pub mod reload;

use std::sync::Arc;

use crate::agents;
use crate::code;
use crate::config::{BrokenSection, Config, ScriptKind, ScriptSection};
use crate::contract::BUILTINS;
use crate::kb::Kb;
use crate::tools::{self, broken_problem, Registry, ToolRef};
use crate::types::{LoadProblem, LoadProblemKind};

/// Loads every `[tools.script.*]` and every agent. A script that fails to load, or a section
/// an unset `${VAR}` disables, is reported in [`Registry::problems`] and does not stop the
/// others. With `previous`, such a tool or agent keeps its last good version from that snapshot
/// (hot reload), and the new snapshot shares its calls' state (call log, metrics, rate buckets,
/// quarantine); without, it is the first snapshot of a new application, with a state of its own.
pub fn build(kb: Kb, previous: Option<&Registry>) -> Registry {
    let state = match previous {
        Some(previous) => Arc::clone(previous.state()),
        None => Arc::new(tools::CallState::on(kb.shared().cloned())),
    };
    let config = Arc::clone(kb.config());
    let sections: Vec<&ScriptSection> = config.scripts_of(ScriptKind::Tool).collect();
    let broken: Vec<&BrokenSection> = config.broken_of(ScriptKind::Tool).collect();
    let mut loaded = tools::load_lua(&sections, &broken, previous);
    let names: Vec<&str> =
        BUILTINS.iter().copied().chain(loaded.tools.iter().map(|t| t.spec().name.as_str())).collect();
    let (agents, agent_problems, unknown_tools) =
        agents::load(&config, previous.map(Registry::agent_refs).unwrap_or(&[]), &names);
    for warning in &unknown_tools {
        tracing::warn!("[agents.*.{}]: {}", warning.name, warning.message);
    }
    loaded.problems.extend(agent_problems);
    // Connectors are not served from here, but /health and `ctx tool list` report every
    // disabled section, so a broken source is not silently missing.
    let connectors = config.broken_of(ScriptKind::Connector);
    loaded.problems.extend(connectors.map(|b| broken_problem(LoadProblemKind::Connector, b)));
    loaded.problems.extend(config.broken_upstreams().map(|b| broken_problem(LoadProblemKind::Upstream, b)));
    Registry::new(kb, loaded, agents, derived, state)
}

/// A registry of the built-ins plus the one script of `section` (`ctx tool test`). Fails
/// with the load error, so the caller can show it.
pub fn with_script(kb: Kb, section: &ScriptSection) -> Result<Registry, String> {
    let mut loaded = tools::load_lua(&[section], &[], None);
    if !loaded.problems.is_empty() {
        return Err(loaded.problems.swap_remove(0).message);
    }
    Ok(Registry::new(kb, loaded, Vec::new(), derived, Arc::default()))
}

/// Code mode's tools (`execute`, discovery, scripted tools) for a registry whose other tools
/// are `base`: what every registry assembled here derives again when its upstream tools change.
fn derived(config: &Config, base: &[ToolRef]) -> (Vec<ToolRef>, Vec<LoadProblem>) {
    code::tools::tools(&config.code_mode, &config.scripted, base)
}

/// What [`check`] found: problems make `ctx schema check` fail, warnings do not.
#[derive(Debug, Default)]
pub struct Checked {
    pub problems: Vec<LoadProblem>,
    pub warnings: Vec<LoadProblem>,
    /// Scripted tools' globs that match no tool, as whole lines.
    pub scripted: Vec<String>,
}

/// Loads the tool and agent scripts of a config and reports what fails, without a knowledge
/// base (`ctx schema check`): load errors, shadowed built-ins, duplicate names and agents that
/// name unknown tools. Sections an unset variable disables are the caller's to report: they
/// are config problems, with their keys and lines.
pub fn check(config: &Config) -> Checked {
    let sections: Vec<&ScriptSection> = config.scripts_of(ScriptKind::Tool).collect();
    let mut loaded = tools::load_lua(&sections, &[], None);
    let names: Vec<&str> =
        BUILTINS.iter().copied().chain(loaded.tools.iter().map(|t| t.spec().name.as_str())).collect();
    let (_, agent_problems, unknown_tools) = agents::load(config, &[], &names);
    let disabled = |p: &LoadProblem| config.broken_of(ScriptKind::Agent).any(|b| b.name == p.name);
    loaded.problems.extend(agent_problems.into_iter().filter(|p| !disabled(p)));
    loaded.problems.extend(unknown_tools);
    let servers: Vec<&str> = config
        .upstreams
        .iter()
        .map(|u| u.name.as_str())
        .chain(config.broken_upstreams().map(|b| b.name.as_str()))
        .collect();
    let scripted = code::tools::unmatched_globs(&config.scripted, &names, &servers);
    Checked { problems: loaded.problems, warnings: loaded.warnings, scripted }
}
