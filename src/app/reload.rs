//! Hot reload: watch the config file and every tool script, rebuild the registry in the
//! background and swap it in atomically. In-flight calls finish on the snapshot they started
//! with; a script that fails to load keeps its last good version (see [`super::build`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};

use crate::config::{Config, ConfigError, Located};
use crate::kb::Kb;
use crate::tools::Tools;

/// Edits come in bursts (an editor writes, renames, touches): wait this long for quiet.
const SETTLE: Duration = Duration::from_millis(150);

/// Starts the watcher thread. `changed(tools, agents)` runs after a swap that changed the tool
/// list (names, descriptions, schemas, annotations or load problems) or the agent list, so MCP
/// clients can be told.
pub fn watch(
    located: Located,
    kb: Kb,
    tools: Arc<Tools>,
    changed: impl Fn(bool, bool) + Send + 'static,
) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if let Ok(event) = event {
            if !matches!(event.kind, notify::EventKind::Access(_)) {
                let _ = tx.send(event.paths);
            }
        }
    })
    .map_err(|e| format!("cannot watch files for hot reload: {e}"))?;
    let mut watched = BTreeSet::new();
    let mut files = watch_list(kb.config());
    rewatch(&mut watcher, &mut watched, &files);
    std::thread::Builder::new()
        .name("ctx-reload".into())
        .spawn(move || {
            let mut kb = kb;
            while let Ok(paths) = rx.recv() {
                let mut relevant = touches(&paths, &files);
                // Drain the rest of the burst.
                while let Ok(more) = rx.recv_timeout(SETTLE) {
                    relevant |= touches(&more, &files);
                }
                if !relevant {
                    continue;
                }
                if let Some(next) = reload(&located, &kb, &tools, &changed) {
                    kb = next;
                    files = watch_list(kb.config());
                    rewatch(&mut watcher, &mut watched, &files);
                }
            }
        })
        .map_err(|e| format!("cannot start the reload thread: {e}"))?;
    Ok(())
}

/// Rebuilds from the config on disk and swaps the registry in. Returns the new knowledge-base
/// handle, or `None` when the config is broken (the running tools stay as they are).
fn reload(located: &Located, kb: &Kb, tools: &Tools, changed: &dyn Fn(bool, bool)) -> Option<Kb> {
    let config = match Config::load(located) {
        Ok(mut config) => {
            crate::packs::enforce(&mut config);
            Arc::new(config)
        }
        Err(e) => {
            tracing::error!("config not reloaded, the running tools stay as they are: {e}");
            tools.config_refused(refused_problems(&located.path, &e));
            return None;
        }
    };
    for section in &config.broken {
        tracing::warn!("{}", section.message());
    }
    let state = Arc::clone(tools.current().state());
    if let Err(e) = state.log.install(&config, state.db.as_ref()) {
        tracing::error!("{e}");
    }
    if let Err(e) = state.tasks.reconfigure(&config, state.db.as_ref()) {
        tracing::error!("tasks: {e}");
    }
    state.metrics.set_enabled(config.spec.server.metrics);
    let next = if config.db_path() == kb.config().db_path() {
        kb.with_config(config)
    } else {
        match Kb::open(config) {
            Ok(next) => next,
            Err(e) => {
                tracing::error!("config not reloaded: cannot open the new database: {e}");
                let file = shown(&located.path);
                tools.config_refused(vec![format!("{file}: db.path: cannot open the new database: {e}")]);
                return None;
            }
        }
    };
    // Only the upstream servers whose section changed restart; the rest keep their connection.
    if let Some(upstreams) = tools.upstreams() {
        upstreams.apply(&next.config().upstreams);
    }
    let previous = tools.current();
    let registry = super::build(next.clone(), Some(&previous));
    for problem in registry.problems() {
        tracing::error!("{} {} failed to load: {}", problem.kind, problem.name, problem.message);
    }
    // Compared as served: the swap adds the upstream tools.
    tools.replace(registry);
    let registry = tools.current();
    let before = serde_json::to_value((previous.listing(), previous.problems())).ok();
    let after = serde_json::to_value((registry.listing(), registry.problems())).ok();
    let agents_changed = serde_json::to_value(previous.agent_listing(None)).ok()
        != serde_json::to_value(registry.agent_listing(None)).ok();
    let names: Vec<String> = registry
        .specs()
        .map(|s| s.name.clone())
        .chain(registry.agents().map(|a| format!("agent {}", a.name)))
        .collect();
    tools.config_loaded(&located.path);
    tracing::info!("tools reloaded: {}", names.join(", "));
    if before != after || agents_changed {
        changed(before != after, agents_changed);
    }
    Some(next)
}

/// Why `err` refused an edit, one line per problem in the `file:line: key: message` form
/// editors and terminals link to (`/health` shows them).
fn refused_problems(path: &Path, err: &ConfigError) -> Vec<String> {
    let file = shown(path);
    let text = match err {
        ConfigError::Syntax { line, column, message, .. } => {
            vec![format!("{file}:{line}:{column}: TOML syntax error: {message}")]
        }
        ConfigError::Invalid { problems, .. } => problems
            .iter()
            .map(|p| match p.line {
                Some(line) => format!("{file}:{line}: {}: {}", p.key, p.message),
                None => format!("{file}: {}: {}", p.key, p.message),
            })
            .collect(),
        other => vec![format!("{file}: {other}")],
    };
    text.into_iter().map(crate::config::redact::string).collect()
}

/// The config file as `/health` names it: its file name, never an absolute path.
fn shown(path: &Path) -> String {
    path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The config file and every tool script.
fn watch_list(config: &Config) -> BTreeSet<PathBuf> {
    let mut files = BTreeSet::from([config.file.clone()]);
    files.extend(config.scripts.iter().map(|s| s.path.clone()));
    // The Claude Desktop / Cursor file that `mcp.import` reads.
    files.extend(config.mcp_import.clone());
    files
}

/// Watches the folders of `files` (editors replace files by renaming, which a watch on the file
/// itself would miss).
fn rewatch(watcher: &mut impl Watcher, watched: &mut BTreeSet<PathBuf>, files: &BTreeSet<PathBuf>) {
    let dirs: BTreeSet<PathBuf> = files.iter().filter_map(|f| f.parent().map(Path::to_path_buf)).collect();
    for dir in watched.difference(&dirs).cloned().collect::<Vec<_>>() {
        let _ = watcher.unwatch(&dir);
        watched.remove(&dir);
    }
    for dir in dirs {
        if !watched.contains(&dir) {
            match watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    watched.insert(dir);
                }
                Err(e) => tracing::warn!("cannot watch {} for hot reload: {e}", dir.display()),
            }
        }
    }
}

fn touches(paths: &[PathBuf], files: &BTreeSet<PathBuf>) -> bool {
    paths.iter().any(|p| files.contains(p) || p.extension().is_some_and(|e| e == "lua" || e == "toml"))
}
