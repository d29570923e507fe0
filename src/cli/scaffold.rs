//! Writes a new Lua script from its template: `ctx connector init`, `ctx tool init` and
//! `ctx agent init` share this, and differ only in the folder, the template and what they print.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{CliError, Globals};
use crate::config;

/// Writes `<dir or folder next to the config>/<name>.lua` from `template` (`{{name}}` filled in)
/// and, with `definitions`, the LuaLS definitions beside it. Refuses to overwrite without
/// `force`. Returns the script's path relative to the config's folder, as ctx.toml would name it.
pub fn write(
    name: &str,
    template: &str,
    folder: &str,
    dir: Option<PathBuf>,
    force: bool,
    definitions: bool,
    globals: &Globals,
) -> Result<String, CliError> {
    check_name(name)?;
    let base = config::locate(globals.config.as_deref()).path.parent().map(Path::to_path_buf).unwrap_or_default();
    let dir = dir.unwrap_or_else(|| base.join(folder));
    let path = dir.join(format!("{name}.lua"));
    if path.exists() && !force {
        return Err(CliError::Usage(format!("{} already exists; pass --force to replace it", path.display())));
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(&path, template.replace("{{name}}", name))
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("created {}", path.display());
    if definitions {
        // Always refreshed: it describes this build's host APIs.
        let defs = dir.join(super::tool_cmd::DEFINITIONS_FILE);
        std::fs::write(&defs, super::tool_cmd::DEFINITIONS)
            .with_context(|| format!("cannot write {}", defs.display()))?;
        println!("created {} (LuaLS definitions: editors complete context, MCP, http, json, ...)", defs.display());
    }
    Ok(path.strip_prefix(&base).unwrap_or(&path).display().to_string())
}

/// Extension names: 1 to 128 letters, digits, '_', '.' or '-' (the config schema's rule).
pub fn check_name(name: &str) -> Result<(), CliError> {
    let ok =
        !name.is_empty() && name.len() <= 128 && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(CliError::Usage(format!("invalid name {name:?}: use 1 to 128 letters, digits, '_', '.' or '-'")))
    }
}
