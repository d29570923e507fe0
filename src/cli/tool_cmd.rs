//! `ctx tool init`, `ctx tool test` and `ctx tool list`: scaffold, try and inspect tools.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde_json::{json, Value as Json};

use super::{CliError, Globals};
use crate::config::{self, BrokenSection, Config, ConfigError, ScriptKind, ScriptSection};
use crate::tools::{CallError, CallOptions, Output, Registry, ToolSpec};
use crate::types::{ErrorCode, LoadProblem, LoadProblemKind};

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
    /// Run one call of a tool script through the real call path and print the result. The
    /// config section whose path is that script gives its limits and config keys. Exits 1 when
    /// the script fails to load or the call fails.
    Test {
        /// Path of the .lua script.
        path: PathBuf,
        /// A parameter, typed by the tool's schema: --param limit=5 passes an integer.
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
        /// Use the limits and config keys of [tools.script.<name>] from ctx.toml, whatever its
        /// path (default: the section whose path is PATH, if any).
        #[arg(long)]
        source: Option<String>,
        /// Print only the response body: {"result": ...} or the error envelope.
        #[arg(long)]
        json: bool,
    },
    /// Call a configured tool (built-in or Lua) by name, as a client would. Exits 1 when it
    /// failed to load or the call fails, 2 for an unknown tool or invalid parameters.
    Call {
        /// The tool's name, as `ctx tool list` shows it.
        name: String,
        /// A parameter, typed by the tool's schema: --param limit=5 passes an integer.
        #[arg(long = "param", value_name = "KEY=VALUE")]
        params: Vec<String>,
        /// Print only the response body (as POST /tools/<name> answers) or the error envelope.
        #[arg(long)]
        json: bool,
    },
    /// List built-in and Lua tools with their parameters, and scripts that failed to load.
    List {
        /// Print {"tools": [...], "problems": [...]} as JSON.
        #[arg(long)]
        json: bool,
        /// List the installed packs instead (ctx.lock), each checked against its files.
        #[arg(long)]
        installed: bool,
    },
    /// Install a pack of tools, connectors and agents into packs/, pin it in ctx.lock, and
    /// print (or with --write, append) the config sections it needs with the hosts and
    /// variables it asks for.
    Install(super::pack_cmd::InstallArgs),
    /// Fetch an installed pack again; show the changes of files and of requested permissions,
    /// and apply them with --yes.
    Update(super::pack_cmd::UpdateArgs),
    /// Remove an installed pack (its folder and its ctx.lock entry).
    Remove(super::pack_cmd::RemoveArgs),
    /// Search the configured pack registry ([packs] registry).
    Search(super::pack_cmd::SearchArgs),
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
        ToolCommand::Call { name, params, json } => call(&name, &params, json, globals),
        ToolCommand::List { json, installed: true } => super::pack_cmd::list_installed(json, globals),
        ToolCommand::List { json, installed: false } => list(json, globals),
        ToolCommand::Install(args) => super::pack_cmd::install(args, ScriptKind::Tool, globals),
        ToolCommand::Update(args) => super::pack_cmd::update(args, globals),
        ToolCommand::Remove(args) => super::pack_cmd::remove(args, globals),
        ToolCommand::Search(args) => super::pack_cmd::search(args, globals),
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

/// `text` safe to print on a terminal: an upstream server writes tool descriptions and names,
/// and an escape sequence in them (ESC, BEL, ...) would drive the operator's terminal (set its
/// title, write its clipboard, hide lines). Control characters other than newline and tab are
/// shown escaped.
pub(super) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return text.into();
    }
    text.chars()
        .map(|c| if c.is_control() && c != '\n' && c != '\t' { c.escape_default().to_string() } else { c.to_string() })
        .collect::<String>()
        .into()
}

/// `--param KEY=VALUE` items as pairs.
pub(super) fn param_pairs(raw: &[String]) -> Result<Vec<(String, String)>, CliError> {
    let mut pairs = Vec::new();
    for item in raw {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            CliError::Usage(format!("--param {item:?}: expected KEY=VALUE, for example --param limit=5"))
        })?;
        pairs.push((k.trim().to_string(), v.to_string()));
    }
    Ok(pairs)
}

fn test(path: &Path, raw: &[String], source: Option<&str>, json: bool, globals: &Globals) -> Result<(), CliError> {
    let pairs = param_pairs(raw)?;
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
    let say = |ok: bool, line: String| {
        if !json {
            println!("  {} {line}", if ok { "✓" } else { "✗" });
        }
    };
    let shown = path.display().to_string();
    // Which config section gives the script its limits and config keys, said once the
    // header is out.
    let mut using = None;
    let section = match source {
        Some(name) => {
            let found = config.scripts_of(ScriptKind::Tool).find(|s| s.name == name);
            let found = match found {
                Some(found) => found,
                None => return Err(unusable_source(&config, name, &shown, json)),
            };
            let mut section = found.clone();
            section.path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            section.display_path = shown.clone();
            section
        }
        None => match section_for(&config, path) {
            Some(Ok(found)) => {
                using = Some(format!("using config section tools.script.{} of {}", found.name, config_name(&config)));
                found.clone()
            }
            Some(Err(broken)) => {
                let using = format!("using config section {} of {}", broken.section(), config_name(&config));
                return Err(load_failed(&broken.name, &shown, Some(&using), broken.message(), json));
            }
            None => ScriptSection::from_path(ScriptKind::Tool, path),
        },
    };
    let kb = crate::app::database::open_kb(Arc::new(config), crate::app::database::Role::Command)?;
    let registry = match crate::app::with_script(kb, &section) {
        Ok(r) => Arc::new(r),
        Err(message) => return Err(load_failed(&section.name, &shown, using.as_deref(), message, json)),
    };
    let spec = registry.specs().find(|s| !s.builtin).expect("the script's tool is registered");
    // Named as clients will see it: tool.name, which need not be the file's name.
    if !json {
        println!("Testing tool: {} ({shown})", spec.name);
    }
    if let Some(using) = &using {
        note(json, using);
    }
    say(true, "Script loaded".into());
    say(true, "Entry point defined (tool.execute, or its alias tool.handler)".into());
    say(true, format!("{} parameter(s) declared", param_count(spec)));
    for warning in registry.warnings() {
        eprintln!("warning: {}", warning.message);
    }
    let params = spec.params.coerce(pairs).map_err(CliError::Usage)?;
    say(true, format!("Calling execute({})...", serde_json::to_string(&params).unwrap_or_default()));
    let started = Instant::now();
    let options = CallOptions { caller: "cli", ..Default::default() };
    let outcome = registry.call(&spec.name.clone(), params, &options);
    let took = started.elapsed();
    if let Err(err) = &outcome {
        say(false, format!("Failed after {}: {}", human(took), err.code()));
    } else {
        say(true, format!("Returned result in {}", human(took)));
    }
    print_outcome(outcome, false, json)
}

/// Prints a call's result (or its error envelope under `--json`). A failed call is exit 1 in
/// both modes: 2 is for usage and config errors.
pub(super) fn print_outcome(outcome: Result<Output, CallError>, builtin: bool, json: bool) -> Result<(), CliError> {
    match outcome {
        Ok(output) if json => {
            // The body POST /tools/<name> answers: built-ins their own, Lua tools {"result": ...}.
            let body = if builtin { output.value() } else { output.rest_body() };
            println!("{body}");
            Ok(())
        }
        Ok(output) => {
            println!();
            println!("Result:");
            let pretty = serde_json::to_string_pretty(&output.value()).unwrap_or_default();
            for line in pretty.lines() {
                println!("  {line}");
            }
            Ok(())
        }
        Err(err) => call_failed(err, json),
    }
}

/// The exit of a failed call: the envelope on stdout under `--json`, the message on stderr
/// otherwise. The caller's own mistakes (unknown tool, bad parameters, a code-mode script that
/// does not compile: REST's 400s) exit 2, the rest 1.
pub(super) fn call_failed(err: CallError, json: bool) -> Result<(), CliError> {
    let usage = matches!(err.code(), ErrorCode::NotFound | ErrorCode::BadRequest)
        && (matches!(err, CallError::UnknownTool(_) | CallError::InvalidParams { .. })
            || matches!(&err, CallError::ScriptFailed { reason, .. } if reason == "syntax_error"));
    if json {
        println!("{}", err.envelope());
        let why = err.to_string();
        return Err(if usage { CliError::Problems(why) } else { CliError::Reported(why) });
    }
    if usage {
        return Err(CliError::Usage(err.to_string()));
    }
    Err(CliError::Failed(anyhow::anyhow!(err.to_string())))
}

/// A script that did not load: "tool 'x' failed to load: why", as JSON under `--json`; exit 1.
fn load_failed(name: &str, shown: &str, using: Option<&str>, reason: String, json: bool) -> CliError {
    if !json {
        println!("Testing tool script: {shown}");
    }
    if let Some(using) = using {
        note(json, using);
    }
    if !json {
        println!("  ✗ Script failed to load");
    }
    let err = CallError::NotLoaded { subject: format!("tool '{name}'"), reason };
    match call_failed(err, json) {
        Err(e) => e,
        Ok(()) => CliError::Reported("the script failed to load".into()),
    }
}

/// `--source NAME` that names no usable section: disabled by an unset variable (a load
/// failure), or not there at all (a usage error).
fn unusable_source(config: &Config, name: &str, shown: &str, json: bool) -> CliError {
    if let Some(broken) = config.broken_of(ScriptKind::Tool).find(|b| b.name == name) {
        return load_failed(name, shown, None, broken.message(), json);
    }
    let known: Vec<_> = config.scripts_of(ScriptKind::Tool).map(|s| s.name.clone()).collect();
    CliError::Usage(format!(
        "no [tools.script.{name}] in {}; configured tools: {}",
        config.file.display(),
        if known.is_empty() { "none".to_string() } else { known.join(", ") }
    ))
}

/// The tool section whose `path` is the file at `path` (compared canonically, so `./x.lua`
/// and `tools/../x.lua` match), usable or disabled.
fn section_for<'a>(config: &'a Config, path: &Path) -> Option<Result<&'a ScriptSection, &'a BrokenSection>> {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| std::path::absolute(p).unwrap_or_default());
    let wanted = canonical(path);
    if let Some(found) = config.scripts_of(ScriptKind::Tool).find(|s| canonical(&s.path) == wanted) {
        return Some(Ok(found));
    }
    config.broken_of(ScriptKind::Tool).find(|b| b.path.as_deref().is_some_and(|p| canonical(p) == wanted)).map(Err)
}

fn config_name(config: &Config) -> String {
    config.file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}

/// A line about what the command does; on stderr under `--json`, which keeps stdout for the body.
fn note(json: bool, line: &str) {
    if json {
        eprintln!("note: {line}");
    } else {
        println!("  {line}");
    }
}

/// `ctx tool call NAME`: one call of a configured tool through the registry every server uses.
fn call(name: &str, raw: &[String], json: bool, globals: &Globals) -> Result<(), CliError> {
    let pairs = param_pairs(raw)?;
    let config = globals.load_config()?;
    let upstreams = upstreams_of(&config, &globals.runtime);
    let kb = crate::app::database::open_kb(Arc::new(config), crate::app::database::Role::Command)?;
    let registry = with_upstreams(crate::app::build(kb, None), upstreams.as_ref());
    if let Err(e) = registry.state().log.install(registry.kb().config(), registry.state().db.as_ref()) {
        tracing::warn!("{e}");
    }
    // Without a spec (unknown, or failed to load) the call itself says why.
    let (params, builtin) = match registry.spec(name) {
        Some(spec) => (spec.params.coerce(&pairs).map_err(CliError::Usage)?, spec.builtin),
        None => (Json::Object(Default::default()), false),
    };
    let options = CallOptions { caller: "cli", ..Default::default() };
    let outcome = registry.call(name, params, &options);
    if let Some(upstreams) = &upstreams {
        globals.runtime.block_on(upstreams.shutdown());
    }
    // The entries of this command's calls are written before it exits.
    registry.state().log.shutdown();
    print_outcome(outcome, builtin, json)
}

/// Connects the config's upstream MCP servers, when it has any, for a command that lists or
/// calls their tools.
pub(super) fn upstreams_of(
    config: &Config,
    runtime: &tokio::runtime::Handle,
) -> Option<Arc<crate::upstream::Upstreams>> {
    (!config.upstreams.is_empty()).then(|| super::mcp_cmd::connect(runtime, &config.upstreams))
}

/// The enabled upstream servers that are not ready, as load problems.
fn not_connected(upstreams: &crate::upstream::Upstreams) -> Vec<LoadProblem> {
    use crate::upstream::State;
    let down = upstreams.status().into_iter().filter(|s| !matches!(s.state, State::Ready | State::Disabled));
    down.map(|s| LoadProblem {
        kind: LoadProblemKind::Upstream,
        message: format!(
            "not connected ({}): {}; `ctx mcp test {}` shows why",
            s.state.with_attempts(s.attempt),
            s.last_error.as_deref().unwrap_or("no answer in time"),
            s.name
        ),
        name: s.name,
    })
    .collect()
}

pub(super) fn with_upstreams(registry: Registry, upstreams: Option<&Arc<crate::upstream::Upstreams>>) -> Arc<Registry> {
    Arc::new(match upstreams {
        Some(upstreams) => registry.with_upstreams(upstreams),
        None => registry,
    })
}

/// The config for `ctx tool test`: the workspace's when there is one (so context.search sees
/// its knowledge base); otherwise an empty knowledge base in a scratch folder.
fn config_for_test(globals: &Globals, required: bool) -> Result<(Config, Option<PathBuf>), CliError> {
    match Config::load_for(&config::locate(globals.config.as_deref()), config::Use::Local) {
        Ok(mut config) => {
            crate::packs::enforce(&mut config);
            Ok((config, None))
        }
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
    let upstreams = upstreams_of(&config, &globals.runtime);
    let kb = crate::app::database::open_kb(Arc::new(config), crate::app::database::Role::Command)?;
    let registry = with_upstreams(crate::app::build(kb, None), upstreams.as_ref());
    // A server that did not connect has no tools to list: say so rather than leave it out.
    let mut problems = registry.problems().to_vec();
    if let Some(upstreams) = &upstreams {
        problems.extend(not_connected(upstreams));
        globals.runtime.block_on(upstreams.shutdown());
    }
    if json {
        let body = json!({ "tools": registry.listing().tools, "problems": problems });
        println!("{}", serde_json::to_string_pretty(&body).unwrap_or_default());
        return Ok(());
    }
    for spec in registry.specs() {
        let kind = match (&spec.upstream, spec.builtin) {
            (Some(origin), _) => format!("upstream {}", origin.server),
            (None, true) => "built-in".to_string(),
            (None, false) => spec.script.clone().unwrap_or_default(),
        };
        println!("{}  ({kind})", spec.name);
        println!("    {}", printable(&spec.description));
        let params = param_summary(spec);
        if !params.is_empty() {
            println!("    parameters: {params}");
        }
    }
    for problem in &problems {
        println!("{}  (broken {})", problem.name, kind_word(problem));
        println!("    error: {}", printable(&problem.message));
    }
    for warning in registry.warnings() {
        println!("{}  (warning)", warning.name);
        println!("    {}", printable(&warning.message));
    }
    Ok(())
}

fn kind_word(problem: &LoadProblem) -> &'static str {
    match problem.kind {
        LoadProblemKind::Tool => "tool",
        LoadProblemKind::Agent => "agent",
        LoadProblemKind::Connector => "connector",
        LoadProblemKind::Upstream => "upstream",
        LoadProblemKind::Config => "config",
    }
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
                // Strings bare, any other value (1, 2.5, true, null) as JSON.
                Some(options) => options
                    .iter()
                    .map(|o| o.as_str().map(str::to_string).unwrap_or_else(|| o.to_string()))
                    .collect::<Vec<_>>()
                    .join("|"),
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
