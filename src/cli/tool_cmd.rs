//! `ctx tool init`, `ctx tool test` and `ctx tool list`: scaffold, try and inspect tools.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde_json::{json, Value as Json};

use super::{CliError, Globals};
use crate::config::{self, Config, ConfigError, ScriptKind, ScriptSection};
use crate::kb::Kb;
use crate::tools::{CallOptions, Registry, ToolSpec};

#[derive(Debug, clap::Subcommand)]
pub enum ToolCommand {
    /// Write tools/<name>.lua from a template, plus LuaLS definitions for editor completion,
    /// and print the config section to add.
    Init {
        /// Tool name (letters, digits, '_', '.', '-').
        name: String,
        /// Folder to write into (default: tools/ next to the config).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Overwrite an existing script.
        #[arg(long)]
        force: bool,
    },
    /// Run one call of a tool script through the real call path and print the result.
    Test {
        /// Path of the .lua script.
        path: PathBuf,
        /// A parameter, typed by the tool's schema: --param limit=5 passes an integer.
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
        /// Use the limits and config keys of [tools.script.<name>] from ctx.toml.
        #[arg(long)]
        source: Option<String>,
        /// Print only the response body: {"result": ...} or the error envelope.
        #[arg(long)]
        json: bool,
    },
    /// List built-in and Lua tools with their parameters, and scripts that failed to load.
    List {
        /// Print {"tools": [...], "problems": [...]} as JSON.
        #[arg(long)]
        json: bool,
    },
}

const TEMPLATE: &str = include_str!("templates/tool.lua");
/// LuaLS (`---@meta`) definitions of everything a script can call.
pub const DEFINITIONS: &str = include_str!("templates/ctx.meta.lua");
/// Where `ctx tool init` writes the definitions, inside the tools folder.
pub const DEFINITIONS_FILE: &str = "ctx.meta.lua";

pub fn run(cmd: ToolCommand, globals: &Globals) -> Result<(), CliError> {
    match cmd {
        ToolCommand::Init { name, dir, force } => init(&name, dir, force, globals),
        ToolCommand::Test { path, params, source, json } => test(&path, &params, source.as_deref(), json, globals),
        ToolCommand::List { json } => list(json, globals),
    }
}

fn init(name: &str, dir: Option<PathBuf>, force: bool, globals: &Globals) -> Result<(), CliError> {
    super::scaffold::check_name(name)?;
    if crate::tools::BUILTINS.contains(&name) {
        return Err(CliError::Usage(format!("'{name}' is a built-in tool and cannot be shadowed; pick another name")));
    }
    let rel = super::scaffold::write(name, TEMPLATE, "tools", dir, force, true, globals)?;
    println!();
    println!("Add this to ctx.toml, then try it with `ctx tool test {rel} --param query=deploy --source {name}`:");
    println!();
    println!("[tools.script.{name}]");
    println!("path = \"{rel}\"");
    println!("timeout = 30");
    println!("# any other key becomes context.config, e.g.:");
    println!("# api_token = \"${{EXAMPLE_TOKEN}}\"");
    Ok(())
}

fn test(path: &Path, raw: &[String], source: Option<&str>, json: bool, globals: &Globals) -> Result<(), CliError> {
    let mut pairs = Vec::new();
    for item in raw {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            CliError::Usage(format!("--param {item:?}: expected KEY=VALUE, for example --param limit=5"))
        })?;
        pairs.push((k.trim().to_string(), v.to_string()));
    }
    let (config, scratch) = config_for_test(globals, source.is_some())?;
    let result = run_test(path, &pairs, source, json, config);
    if let Some(dir) = scratch {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

fn run_test(
    path: &Path,
    pairs: &[(String, String)],
    source: Option<&str>,
    json: bool,
    config: Config,
) -> Result<(), CliError> {
    let section = match source {
        Some(name) => {
            let found = config.scripts_of(ScriptKind::Tool).find(|s| s.name == name).ok_or_else(|| {
                let known: Vec<_> = config.scripts_of(ScriptKind::Tool).map(|s| s.name.clone()).collect();
                CliError::Usage(format!(
                    "no [tools.script.{name}] in {}; configured tools: {}",
                    config.file.display(),
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ))
            })?;
            let mut section = found.clone();
            section.path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            section.display_path = path.display().to_string();
            section
        }
        None => ScriptSection::from_path(ScriptKind::Tool, path),
    };
    let say = |ok: bool, line: String| {
        if !json {
            println!("  {} {line}", if ok { "✓" } else { "✗" });
        }
    };
    if !json {
        println!("Testing tool: {} ({})", section.name, section.display_path);
    }
    let kb = Kb::open(Arc::new(config)).context("cannot open the knowledge base")?;
    let registry = match Registry::with_script(kb, &section) {
        Ok(r) => r,
        Err(message) => {
            say(false, "Script failed to load".into());
            return Err(CliError::Failed(anyhow::anyhow!(message)));
        }
    };
    let spec = registry.specs().find(|s| !s.builtin).expect("the script's tool is registered");
    say(true, "Script loaded".into());
    say(true, "tool.execute defined".into());
    say(true, format!("{} parameter(s) declared", param_count(spec)));
    let params = spec.params.coerce(pairs).map_err(CliError::Usage)?;
    say(true, format!("Calling execute({})...", serde_json::to_string(&params).unwrap_or_default()));
    let started = Instant::now();
    let options = CallOptions { caller: "cli", ..Default::default() };
    let outcome = registry.call(&spec.name.clone(), params, &options);
    let took = started.elapsed();
    match outcome {
        Ok(output) => {
            say(true, format!("Returned result in {}", human(took)));
            if json {
                println!("{}", output.rest_body());
            } else {
                println!();
                println!("Result:");
                let pretty = serde_json::to_string_pretty(&output.value()).unwrap_or_default();
                for line in pretty.lines() {
                    println!("  {line}");
                }
            }
            Ok(())
        }
        Err(err) => {
            say(false, format!("Failed after {}: {}", human(took), err.code()));
            if json {
                println!("{}", err.envelope());
                Err(CliError::Problems("the tool call failed".into()))
            } else {
                Err(CliError::Failed(anyhow::anyhow!(err.to_string())))
            }
        }
    }
}

/// The config for `ctx tool test`: the workspace's when there is one (so context.search sees
/// its knowledge base); otherwise an empty knowledge base in a scratch folder.
fn config_for_test(globals: &Globals, required: bool) -> Result<(Config, Option<PathBuf>), CliError> {
    match Config::load(&config::locate(globals.config.as_deref())) {
        Ok(config) => Ok((config, None)),
        Err(ConfigError::NotFound { .. }) if !required => {
            let dir = std::env::temp_dir().join(format!("ctx-tool-test-{}", std::process::id()));
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            let file = dir.join("ctx.toml");
            let config = Config::from_text("", &file, &file, &|name| std::env::var(name).ok())?;
            eprintln!("note: no ctx.toml found; context.search sees an empty knowledge base");
            Ok((config, Some(dir)))
        }
        Err(e) => Err(e.into()),
    }
}

fn list(json: bool, globals: &Globals) -> Result<(), CliError> {
    let config = globals.load_config()?;
    let kb = Kb::open(Arc::new(config)).context("cannot open the knowledge base")?;
    let registry = Registry::build(kb, None);
    if json {
        let body = json!({ "tools": registry.listing().tools, "problems": registry.problems() });
        println!("{}", serde_json::to_string_pretty(&body).unwrap_or_default());
        return Ok(());
    }
    for spec in registry.specs() {
        let kind = if spec.builtin { "built-in".to_string() } else { spec.script.clone().unwrap_or_default() };
        println!("{}  ({kind})", spec.name);
        println!("    {}", spec.description);
        let params = param_summary(spec);
        if !params.is_empty() {
            println!("    parameters: {params}");
        }
    }
    for problem in registry.problems() {
        println!("{}  (broken: [tools.script.{}])", problem.name, problem.name);
        println!("    error: {}", problem.message);
    }
    Ok(())
}

fn param_count(spec: &ToolSpec) -> usize {
    spec.params.schema().get("properties").and_then(Json::as_object).map(|p| p.len()).unwrap_or(0)
}

/// `query: string*, limit: integer = 12`: required marked with *, defaults shown.
fn param_summary(spec: &ToolSpec) -> String {
    let schema = spec.params.schema();
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let Some(props) = schema.get("properties").and_then(Json::as_object) else { return String::new() };
    props
        .iter()
        .map(|(name, p)| {
            let target = p
                .get("$ref")
                .and_then(Json::as_str)
                .and_then(|r| r.strip_prefix('#'))
                .and_then(|ptr| schema.pointer(ptr))
                .unwrap_or(p);
            let ty = match target.get("enum").and_then(Json::as_array) {
                Some(options) => options.iter().filter_map(Json::as_str).collect::<Vec<_>>().join("|"),
                None => target.get("type").and_then(Json::as_str).unwrap_or("any").to_string(),
            };
            let default = p.get("default").or_else(|| target.get("default"));
            let star = if required.contains(&name.as_str()) { "*" } else { "" };
            match default {
                Some(d) => format!("{name}: {ty}{star} = {d}"),
                None => format!("{name}: {ty}{star}"),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn human(d: std::time::Duration) -> String {
    if d.as_secs_f64() >= 1.0 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    }
}
