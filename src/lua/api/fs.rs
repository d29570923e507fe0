//! `fs.read(path)` and `fs.list(dir?, glob?)`, confined to the script's own folder.
//!
//! Paths are resolved (`..` and symlinks included) before the check, so neither a `../` nor a
//! symlink pointing outside can escape.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use mlua::Lua;

use super::{fail, quoted};
use crate::lua::convert::array_metatable;
use crate::lua::RunState;

/// The longest path `confine` looks at, in bytes (Linux's `PATH_MAX`).
pub(crate) const MAX_PATH: usize = 4096;

/// Resolves `rel` inside the script's folder, or explains why it may not be used.
pub(crate) fn confine(state: &RunState, function: &str, rel: &str) -> mlua::Result<PathBuf> {
    state.check_blocking()?;
    // Refused before it is joined, canonicalised and quoted: each would copy it again, in Rust,
    // outside the script's memory cap.
    if rel.len() > MAX_PATH {
        return Err(fail(format!("{function}: the path is {} bytes long; a path has at most {MAX_PATH}", rel.len())));
    }
    if Path::new(rel).is_absolute() {
        return Err(fail(format!(
            "{function}: absolute paths are not allowed; use a path relative to the script's folder"
        )));
    }
    let root = state
        .info
        .dir()
        .canonicalize()
        .map_err(|e| fail(format!("{function}: the script's folder is not readable: {e}")))?;
    let real = root.join(rel).canonicalize().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => fail(format!("{function}: {} does not exist", quoted(rel))),
        _ => fail(format!("{function}: {}: {e}", quoted(rel))),
    })?;
    if !real.starts_with(&root) {
        return Err(fail(format!("{function}: {} is outside the script's folder", quoted(rel))));
    }
    Ok(real)
}

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let fs = lua.create_table()?;
    let read_state = Arc::clone(state);
    fs.set(
        "read",
        super::function(lua, "fs.read", move |lua, rel: String| {
            let path = confine(&read_state, "fs.read", &rel)?;
            let meta = std::fs::metadata(&path).map_err(|e| fail(format!("fs.read: {}: {e}", quoted(&rel))))?;
            if !meta.is_file() {
                return Err(fail(format!("fs.read: {} is not a file", quoted(&rel))));
            }
            if meta.len() as usize > read_state.limits.memory_bytes {
                return Err(fail(format!("fs.read: {} is larger than the script's memory limit", quoted(&rel))));
            }
            let bytes = std::fs::read(&path).map_err(|e| fail(format!("fs.read: {}: {e}", quoted(&rel))))?;
            lua.create_string(bytes)
        })?,
    )?;
    let list_state = Arc::clone(state);
    fs.set(
        "list",
        super::function(lua, "fs.list", move |lua, (rel, pattern): (Option<String>, Option<String>)| {
            let rel = rel.unwrap_or_else(|| ".".to_string());
            let dir = confine(&list_state, "fs.list", &rel)?;
            let matcher = match &pattern {
                Some(p) => Some(
                    globset::Glob::new(p)
                        .map_err(|e| fail(format!("fs.list: bad glob {}: {e}", quoted(p))))?
                        .compile_matcher(),
                ),
                None => None,
            };
            let mut names: Vec<String> = std::fs::read_dir(&dir)
                .map_err(|e| fail(format!("fs.list: {}: {e}", quoted(&rel))))?
                .filter_map(|entry| entry.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .filter(|name| matcher.as_ref().is_none_or(|m| m.is_match(name)))
                .collect();
            names.sort();
            let table = lua.create_sequence_from(names)?;
            table.set_metatable(Some(array_metatable(lua)?))?;
            Ok(table)
        })?,
    )?;
    lua.globals().set("fs", fs)
}
