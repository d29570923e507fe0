//! `ctx schema check` and `ctx schema export`.

use std::path::PathBuf;

use anyhow::Context;

use super::{CliError, Globals};
use crate::config::{self, Config, ConfigError};
use crate::types::LoadProblemKind;

#[derive(Debug, clap::Subcommand)]
pub enum SchemaCommand {
    /// Validate the config file, the environment variables it needs, the files it points at, and
    /// load every script in the sandbox. Reports every problem and exits 2 if there is any.
    Check,
    /// Write the JSON Schemas, their bundle, and openapi.json to a folder.
    Export {
        /// Output folder (created if missing).
        #[arg(long, default_value = "ctx-schemas")]
        out: PathBuf,
    },
}

pub fn run(cmd: SchemaCommand, globals: &Globals) -> Result<(), CliError> {
    match cmd {
        SchemaCommand::Check => check(globals),
        SchemaCommand::Export { out } => export(&out),
    }
}

fn check(globals: &Globals) -> Result<(), CliError> {
    let located = config::locate(globals.config.as_deref());
    let (config, mut problems) = match Config::load(&located) {
        Ok(mut config) => {
            crate::packs::enforce(&mut config);
            (Some(config), Vec::new())
        }
        Err(err @ (ConfigError::Invalid { .. } | ConfigError::Syntax { .. })) => {
            (None, err.problems().iter().map(ToString::to_string).collect::<Vec<_>>())
        }
        Err(other) => return Err(other.into()),
    };
    let mut warnings = Vec::new();
    let mut database = None;
    if let Some(config) = &config {
        // Sections an unset variable disables: the rest of ctx runs without them, but the
        // config is not what its author meant, so they fail the check.
        // An imported server's problems name the imported file: their keys are not ctx.toml's.
        let shown = located.path.display().to_string();
        let file = |b: &config::BrokenSection| if b.file == shown { String::new() } else { format!("{}: ", b.file) };
        problems.extend(config.broken.iter().flat_map(|b| b.problems.iter().map(move |p| format!("{}{p}", file(b)))));
        warnings.extend(config.warnings.iter().cloned());
        problems.extend(referenced_files(config));
        let (upstream_problems, upstream_warnings) = upstream_files(config, &shown);
        problems.extend(upstream_problems);
        warnings.extend(upstream_warnings);
        let missing: Vec<&str> = config.scripts.iter().filter(|s| !s.path.is_file()).map(|s| s.name.as_str()).collect();
        let checked = crate::app::check(config);
        let section = |problem: &crate::types::LoadProblem| match problem.kind {
            LoadProblemKind::Agent if config.spec.agents.inline.keys().any(|k| k.as_str() == problem.name) => {
                "agents.inline"
            }
            LoadProblemKind::Agent => "agents.script",
            LoadProblemKind::Connector => "connectors.script",
            LoadProblemKind::Tool => "tools.script",
            LoadProblemKind::Upstream => "mcp.servers",
            LoadProblemKind::Config => "config",
        };
        for problem in &checked.problems {
            if !missing.contains(&problem.name.as_str()) {
                problems.push(format!("{}.{}: {}", section(problem), problem.name, problem.message));
            }
        }
        for warning in &checked.warnings {
            warnings.push(format!("{}.{}: {}", section(warning), warning.name, warning.message));
        }
        warnings.extend(checked.scripted.iter().cloned());
        // The shared database: reachable, new enough, and ours to migrate (nothing written).
        match crate::app::database::check(config) {
            Ok(found) => database = found,
            Err(problem) => problems.push(format!("db.url: {problem}")),
        }
    }
    for warning in &warnings {
        eprintln!("warning: {warning}");
    }
    let shown = located.path.display();
    if problems.is_empty() {
        let config = config.expect("no problems means the config loaded");
        let spec = &config.spec;
        println!(
            "ok: {shown} is valid ({} filesystem, {} git, {} script connector(s); {} tool(s); {} agent(s); {} upstream MCP server(s))",
            spec.connectors.filesystem.len(),
            spec.connectors.git.len(),
            spec.connectors.script.len(),
            spec.tools.script.len(),
            spec.agents.inline.len() + spec.agents.script.len(),
            config.upstreams.len(),
        );
        if let Some(database) = database {
            println!("{database}");
        }
        return Ok(());
    }
    eprintln!("error: {shown} has {} problem(s):", problems.len());
    for problem in &problems {
        eprintln!("  - {problem}");
    }
    Err(CliError::Problems(format!("{} problem(s)", problems.len())))
}

/// Files and folders the config points at that do not exist.
fn referenced_files(config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, fs) in &config.spec.connectors.filesystem {
        let root = config.resolve(&fs.root);
        if !root.is_dir() {
            problems.push(format!(
                "connectors.filesystem.{}.root: folder {:?} does not exist",
                name.as_str(),
                fs.root.as_str()
            ));
        }
    }
    for (name, git) in &config.spec.connectors.git {
        let url = git.url.as_str();
        if !crate::connectors::git::is_remote(url) && !config.resolve(url.trim_start_matches("file://")).exists() {
            problems.push(format!("connectors.git.{}.url: local repository {url:?} does not exist", name.as_str()));
        }
    }
    for script in &config.scripts {
        let section = script.kind.section();
        if !script.path.is_file() {
            problems.push(format!("{section}.{}.path: script {:?} does not exist", script.name, script.display_path));
        } else if script.kind == config::ScriptKind::Tool {
            // Checked below with the registry's own loader (metadata, names, parameters).
        } else if let Err(e) = {
            let owned = script.clone();
            crate::lua::watchdog::bounded(&script.path, &script.display_path, script.timeout, move || {
                load_script(&owned).map_err(|e| e.to_string())
            })
        } {
            problems.push(format!("{section}.{}: {e}", script.name));
        }
    }
    problems
}

/// The folders and programs of stdio upstream servers: a missing `cwd` is a problem; a
/// `command` not found is a warning, since the PATH `ctx serve` passes may differ from the one
/// seen here (ctx serve keeps retrying a server that cannot start).
fn upstream_files(config: &Config, shown: &str) -> (Vec<String>, Vec<String>) {
    use crate::config::upstream::UpstreamTransport;
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    for server in &config.upstreams {
        let UpstreamTransport::Stdio { command, env, cwd, .. } = &server.transport else { continue };
        let key = if server.origin == shown {
            format!("mcp.servers.{}", server.name)
        } else {
            format!("{}: mcpServers.{}", server.origin, server.name)
        };
        if let Some(cwd) = cwd.as_deref().filter(|cwd| !cwd.is_dir()) {
            problems.push(format!("{key}.cwd: folder {:?} does not exist", cwd.display().to_string()));
            continue;
        }
        let folder = cwd.clone().unwrap_or_else(|| config.base_dir.clone());
        let missing = if command.contains('/') {
            let found = folder.join(command).is_file();
            (!found).then(|| format!("{command:?} does not exist in {}", folder.display()))
        } else {
            let path = env.get("PATH").cloned().or_else(|| std::env::var("PATH").ok()).unwrap_or_default();
            let found = std::env::split_paths(&path).any(|dir| dir.join(command).is_file());
            (!found).then(|| format!("{command:?} is not on the server's PATH"))
        };
        if let Some(missing) = missing.filter(|_| server.enabled) {
            warnings.push(format!("{key}.command: {missing}; ctx serve will keep trying to start it"));
        }
    }
    (problems, warnings)
}

/// Loads a script in the sandbox, with its own limits, and checks the function its kind needs.
fn load_script(section: &config::ScriptSection) -> Result<(), crate::lua::ScriptError> {
    use crate::lua::{CancelHandle, Limits, ScriptInfo, Vm};
    let (global, function) = match section.kind {
        config::ScriptKind::Connector => ("connector", "scan"),
        config::ScriptKind::Tool => ("tool", "execute"),
        config::ScriptKind::Agent => ("agent", "resolve"),
        // Agent-sent code has no file to check.
        config::ScriptKind::Code => return Ok(()),
    };
    let vm = Vm::new(ScriptInfo::from_section(section), Limits::for_section(section), CancelHandle::new())?;
    let ext = vm.load_extension(global)?;
    vm.function(&ext, global, function).map(|_| ())
}

fn export(out: &std::path::Path) -> Result<(), CliError> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for (name, text) in crate::schema::FILES {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let openapi = crate::server::openapi::document(None);
    let path = out.join("openapi.json");
    let text = serde_json::to_string_pretty(&openapi).context("serialise openapi.json")? + "\n";
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    let bundle = crate::schema::bundle_document();
    let path = out.join("bundle.schema.json");
    let text = serde_json::to_string_pretty(&bundle).context("serialise bundle")? + "\n";
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    println!(
        "wrote {} schema file(s), bundle.schema.json and openapi.json to {}",
        crate::schema::FILES.len(),
        out.display()
    );
    Ok(())
}
