//! Host APIs: every capability a script has beyond pure computation. Each module exposes one
//! `register`, and [`register_all`] is the single list of what a sandbox gets.

mod base64;
mod crypto;
mod env;
mod fs;
pub mod http;
mod json;
pub(crate) mod log;
pub mod mcp;
mod progress;
mod require;
mod sleep;

use std::sync::Arc;

use mlua::Lua;

use super::RunState;

/// The globals the host APIs define, installed on first use.
pub(crate) const NAMES: [&str; 12] =
    ["json", "log", "print", "env", "fs", "base64", "crypto", "sleep", "http", "MCP", "progress", "require"];

/// Makes every host API available in a fresh sandbox.
///
/// A module is installed the first time a script touches its global (through a metatable on
/// the globals table), so a VM for a script that needs none of them costs almost nothing to
/// build. Once installed, a module is an ordinary global.
pub fn register_all(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let state = Arc::clone(state);
    let install = lua.create_function(move |lua, (globals, key): (mlua::Table, mlua::Value)| {
        let mlua::Value::String(name) = &key else { return Ok(mlua::Value::Nil) };
        if super::guard::load_std(lua, name.as_bytes().as_ref())? {
            return globals.raw_get(key);
        }
        match name.as_bytes().as_ref() {
            b"json" => json::register(lua, &state)?,
            b"log" | b"print" => log::register(lua, &state)?,
            b"env" => env::register(lua, &state)?,
            b"fs" => fs::register(lua, &state)?,
            b"base64" => base64::register(lua, &state)?,
            b"crypto" => crypto::register(lua, &state)?,
            b"sleep" => sleep::register(lua, &state)?,
            b"http" => http::register(lua, &state)?,
            b"MCP" => mcp::register(lua, &state)?,
            b"progress" => progress::register(lua, &state)?,
            b"require" => require::register(lua, &state)?,
            _ => return Ok(mlua::Value::Nil),
        }
        globals.raw_get(key)
    })?;
    let meta = lua.create_table()?;
    meta.raw_set("__index", install)?;
    // Scripts can neither reach the installer nor remove it.
    meta.raw_set("__metatable", false)?;
    lua.globals().set_metatable(Some(meta))?;
    Ok(())
}

/// A Lua error raised by a host function: a plain message, like `error("...")` would give.
pub(crate) fn fail(message: impl Into<String>) -> mlua::Error {
    mlua::Error::RuntimeError(message.into())
}
