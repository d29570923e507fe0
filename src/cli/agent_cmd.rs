//! `ctx agent init`, `ctx agent list` and `ctx agent test`: scaffold, inspect and try agents.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Map, Value as Json};

use super::{CliError, Globals};
use crate::tools::{CallOptions, Registry};
use crate::types::AgentSource;

#[derive(Debug, clap::Subcommand)]
pub enum AgentCommand {
    /// Write agents/<name>.lua from a template and print the config section to add.
    Init {
        /// Agent name (letters, digits, '_', '.', '-').
        name: String,
        /// Folder to write into (default: agents/ next to the config).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Overwrite an existing script.
        #[arg(long)]
        force: bool,
    },
    /// List inline and Lua agents with their arguments, and scripts that failed to load.
    List {
        /// Print {"agents": [...], "problems": [...]} as JSON.
        #[arg(long)]
        json: bool,
        /// List the installed packs instead (ctx.lock), each checked against its files.
        #[arg(long)]
        installed: bool,
    },
    /// Resolve an agent's prompt (inline or Lua) through the real path and print it.
    Test {
        /// The agent's name.
        name: String,
        /// An argument: --arg service=payments.
        #[arg(long = "arg", value_name = "KEY=VALUE")]
        args: Vec<String>,
        /// Print the resolved prompt (or the error envelope) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Install a pack (agents, tools, connectors): the same as `ctx tool install`.
    Install(super::pack_cmd::InstallArgs),
    /// Update an installed pack: the same as `ctx tool update`.
    Update(super::pack_cmd::UpdateArgs),
    /// Remove an installed pack: the same as `ctx tool remove`.
    Remove(super::pack_cmd::RemoveArgs),
    /// Search the configured pack registry: the same as `ctx tool search`.
    Search(super::pack_cmd::SearchArgs),
}

const TEMPLATE: &str = include_str!("templates/agent.lua");

pub fn run(cmd: AgentCommand, globals: &Globals) -> Result<(), CliError> {
    match cmd {
        AgentCommand::Init { name, dir, force } => init(&name, dir, force, globals),
        AgentCommand::List { json, installed: true } => super::pack_cmd::list_installed(json, globals),
        AgentCommand::List { json, installed: false } => list(json, globals),
        AgentCommand::Install(args) => super::pack_cmd::install(args, crate::config::ScriptKind::Agent, globals),
        AgentCommand::Update(args) => super::pack_cmd::update(args, globals),
        AgentCommand::Remove(args) => super::pack_cmd::remove(args, globals),
        AgentCommand::Search(args) => super::pack_cmd::search(args, globals),
        AgentCommand::Test { name, args, json } => test(&name, &args, json, globals),
    }
}

fn init(name: &str, dir: Option<PathBuf>, force: bool, globals: &Globals) -> Result<(), CliError> {
    let rel = super::scaffold::write(name, TEMPLATE, "agents", dir, force, true, globals)?;
    println!();
    println!("Add this to ctx.toml, then try it with `ctx agent test {name} --arg topic=deploys`:");
    println!();
    println!("[agents.script.{name}]");
    println!("path = \"{rel}\"");
    println!("timeout = 10");
    Ok(())
}

fn registry(globals: &Globals) -> Result<Registry, CliError> {
    let config = globals.load_config()?;
    let kb = crate::app::database::open_kb(Arc::new(config), crate::app::database::Role::Command)?;
    Ok(crate::app::build(kb, None))
}

fn list(json: bool, globals: &Globals) -> Result<(), CliError> {
    let registry = registry(globals)?;
    let problems: Vec<_> =
        registry.problems().iter().filter(|p| p.kind == crate::types::LoadProblemKind::Agent).cloned().collect();
    if json {
        let listing = serde_json::to_value(registry.agent_listing(None)).unwrap_or(Json::Null);
        println!("{}", json!({"agents": listing["agents"], "problems": problems}));
        return Ok(());
    }
    let mut any = false;
    for agent in registry.agents() {
        any = true;
        let source = if agent.source == AgentSource::Lua { "lua" } else { "ctx.toml" };
        println!("{}  ({source})  {}", agent.name, agent.description);
        if !agent.tools.is_empty() {
            println!("    tools: {}", agent.tools.join(", "));
        }
        for arg in &agent.arguments {
            let required = if arg.required { "required" } else { "optional" };
            let about = arg.description.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
            println!("    --arg {}=...  ({required}){about}", arg.name.as_str());
        }
    }
    if !any {
        println!("no agents configured; add [agents.inline.<name>] to ctx.toml or run `ctx agent init <name>`");
    }
    for problem in &problems {
        println!("broken agent {}: {}", problem.name, problem.message);
    }
    Ok(())
}

fn test(name: &str, raw: &[String], json: bool, globals: &Globals) -> Result<(), CliError> {
    let mut args = Map::new();
    for item in raw {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            CliError::Usage(format!("--arg {item:?}: expected KEY=VALUE, for example --arg service=payments"))
        })?;
        args.insert(k.trim().to_string(), Json::String(v.to_string()));
    }
    let registry = Arc::new(registry(globals)?);
    for problem in registry.problems().iter().filter(|p| p.kind == crate::types::LoadProblemKind::Agent) {
        eprintln!("warning: agent {} failed to load: {}", problem.name, problem.message);
    }
    let options = CallOptions { caller: "cli", ..Default::default() };
    match registry.prompt(name, Json::Object(args), &options) {
        Ok(prompt) => {
            if json {
                println!("{}", serde_json::to_value(&prompt).unwrap_or(Json::Null));
                return Ok(());
            }
            println!("Agent: {}", prompt.agent);
            println!("Tools: {}", if prompt.tools.is_empty() { "(none)".to_string() } else { prompt.tools.join(", ") });
            println!();
            println!("System:");
            for line in prompt.system.lines() {
                println!("  {line}");
            }
            for message in &prompt.messages {
                println!();
                println!(
                    "{}:",
                    serde_json::to_value(message.role)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default()
                );
                for line in message.content.lines() {
                    println!("  {line}");
                }
            }
            Ok(())
        }
        // The caller's mistakes (unknown agent, bad arguments) exit 2; an agent that failed to
        // load or to resolve exits 1, with the envelope on stdout under --json.
        Err(err) => {
            let usage = matches!(err.code(), crate::types::ErrorCode::NotFound | crate::types::ErrorCode::BadRequest);
            if json {
                println!("{}", err.envelope());
            }
            Err(match (usage, json) {
                (true, true) => CliError::Problems(err.to_string()),
                (true, false) => CliError::Usage(err.to_string()),
                (false, true) => CliError::Reported(err.to_string()),
                (false, false) => CliError::Failed(anyhow::anyhow!(err.to_string())),
            })
        }
    }
}
