//! `ctx connector init` and `ctx connector test`: scaffold and try Lua connectors.

use std::path::PathBuf;
use std::time::Instant;

use super::{CliError, Globals};
use crate::config::{self, Config, ScriptKind};
use crate::connectors::lua::LuaConnector;
use crate::connectors::Event;
use crate::lua::{CancelHandle, Limits, ScriptInfo};

#[derive(Debug, clap::Subcommand)]
pub enum ConnectorCommand {
    /// Write connectors/<name>.lua from a template and print the config section to add.
    Init {
        /// Connector name (letters, digits, '_', '.', '-').
        name: String,
        /// Folder to write into (default: connectors/ next to the config, or ./connectors).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Overwrite an existing script.
        #[arg(long)]
        force: bool,
    },
    /// Run a connector's scan without writing anything; print a summary and the first items.
    Test {
        /// Path of the .lua script.
        path: PathBuf,
        /// Use the settings and config keys of [connectors.script.<name>] from ctx.toml.
        #[arg(long)]
        source: Option<String>,
        /// How many items to print.
        #[arg(long, default_value_t = 3)]
        show: usize,
        /// Print the items as JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// List the installed packs (ctx.lock), each checked against its files; `ctx sources`
    /// lists the configured sources.
    List {
        /// Required: what this lists.
        #[arg(long)]
        installed: bool,
        /// Print {"packs": [...]} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Install a pack (connectors, tools, agents): the same as `ctx tool install`.
    Install(super::pack_cmd::InstallArgs),
    /// Update an installed pack: the same as `ctx tool update`.
    Update(super::pack_cmd::UpdateArgs),
    /// Remove an installed pack: the same as `ctx tool remove`.
    Remove(super::pack_cmd::RemoveArgs),
    /// Search the configured pack registry: the same as `ctx tool search`.
    Search(super::pack_cmd::SearchArgs),
}

const TEMPLATE: &str = include_str!("templates/connector.lua");

pub fn run(cmd: ConnectorCommand, globals: &Globals) -> Result<(), CliError> {
    match cmd {
        ConnectorCommand::Init { name, dir, force } => init(&name, dir, force, globals),
        ConnectorCommand::Test { path, source, show, json } => test(&path, source.as_deref(), show, json, globals),
        ConnectorCommand::List { installed: true, json } => super::pack_cmd::list_installed(json, globals),
        ConnectorCommand::List { installed: false, .. } => Err(CliError::Usage(
            "`ctx connector list` lists installed packs: pass --installed (`ctx sources` lists the configured sources)"
                .into(),
        )),
        ConnectorCommand::Install(args) => super::pack_cmd::install(args, ScriptKind::Connector, globals),
        ConnectorCommand::Update(args) => super::pack_cmd::update(args, globals),
        ConnectorCommand::Remove(args) => super::pack_cmd::remove(args, globals),
        ConnectorCommand::Search(args) => super::pack_cmd::search(args, globals),
    }
}

fn init(name: &str, dir: Option<PathBuf>, force: bool, globals: &Globals) -> Result<(), CliError> {
    let rel = super::scaffold::write(name, TEMPLATE, "connectors", dir, force, false, globals)?;
    println!();
    println!("Add this to ctx.toml, then try it with `ctx connector test {rel} --source {name}`:");
    println!();
    println!("[connectors.script.{name}]");
    println!("path = \"{rel}\"");
    println!("timeout = 300");
    println!("# any other key becomes the script's config table, e.g.:");
    println!("# url = \"https://api.example.com\"");
    println!("# token = \"${{EXAMPLE_TOKEN}}\"");
    Ok(())
}

fn test(
    path: &std::path::Path,
    source: Option<&str>,
    show: usize,
    json: bool,
    globals: &Globals,
) -> Result<(), CliError> {
    let (info, limits, max_bytes) = match source {
        Some(name) => {
            let mut config = Config::load_for(&config::locate(globals.config.as_deref()), config::Use::Local)?;
            crate::packs::enforce(&mut config);
            let section = config.scripts_of(ScriptKind::Connector).find(|s| s.name == name).ok_or_else(|| {
                if let Some(broken) = config.broken_of(ScriptKind::Connector).find(|b| b.name == name) {
                    return CliError::Failed(anyhow::anyhow!(
                        "connector '{name}' failed to load: {}",
                        broken.message()
                    ));
                }
                let known: Vec<_> = config.scripts_of(ScriptKind::Connector).map(|s| s.name.clone()).collect();
                CliError::Usage(format!(
                    "no [connectors.script.{name}] in {}; configured script connectors: {}",
                    config.file.display(),
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ))
            })?;
            let mut info = ScriptInfo::from_section(section);
            info.path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            info.display_path = path.display().to_string();
            (info, Limits::for_section(section), crate::connectors::lua::configured_max_bytes(&config, name))
        }
        None => (ScriptInfo::from_path(ScriptKind::Connector, path), Limits::default_for(ScriptKind::Connector), None),
    };
    let started = Instant::now();
    // A test starts as a first sync does: no last sync, an empty state.
    let connector =
        LuaConnector { info, limits, cancel: CancelHandle::new(), max_bytes, saved: Default::default(), fresh: true };
    let mut end = None;
    let mut shown = 0;
    let mut invalid = Vec::new();
    let mut sink = |event: Event| -> Result<(), String> {
        match event {
            Event::Item(item) if shown < show => {
                shown += 1;
                if json {
                    let value = serde_json::json!({
                        "source_id": item.source_id, "title": item.title, "content_type": item.content_type,
                        "source_url": item.source_url, "author": item.author, "created_at": item.created_at,
                        "updated_at": item.updated_at, "metadata": item.metadata, "body": item.body,
                    });
                    println!("{value}");
                } else {
                    let preview: String = item.body.chars().take(200).collect();
                    println!("- {} ({})", item.source_id, item.title);
                    println!("    {} · updated {}", item.content_type, item.updated_at);
                    println!("    {}", preview.replace('\n', " "));
                }
            }
            Event::Item(_) => {}
            Event::Skipped { source_id, reason } => invalid.push(format!("{source_id}: {reason}")),
            Event::End(said) => end = Some(said),
        }
        Ok(())
    };
    let counts = connector.scan(&mut sink).map_err(|e| CliError::Failed(anyhow::anyhow!("{e}")))?;
    for problem in &invalid {
        eprintln!("warning: skipped {problem}");
    }
    if !json {
        println!();
        println!(
            "scan returned {} valid item(s) and {} invalid in {:.2}s; nothing was written",
            counts.items,
            counts.invalid,
            started.elapsed().as_secs_f64()
        );
        if let Some(deleted) = end.as_ref().and_then(|e| e.deleted.as_ref()) {
            println!(
                "incremental scan: a sync would keep the documents it did not return and delete {} named one(s)",
                deleted.len()
            );
        }
        if let Some(values) = end.and_then(|e| e.state) {
            println!("a sync would save this state for the next one: {}", serde_json::Value::Object(values));
        }
    }
    Ok(())
}
