//! Host APIs: every capability a script has beyond pure computation. Each module exposes one
//! `register`, and [`register_all`] is the single list of what a sandbox gets.

mod base64;
mod crypto;
mod env;
mod fs;
pub mod http;
mod json;
mod log;
mod require;
mod sleep;

use std::sync::Arc;

use mlua::Lua;

use super::RunState;

/// Installs every host API into a fresh sandbox.
pub fn register_all(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    json::register(lua, state)?;
    log::register(lua, state)?;
    env::register(lua, state)?;
    fs::register(lua, state)?;
    base64::register(lua, state)?;
    crypto::register(lua, state)?;
    sleep::register(lua, state)?;
    http::register(lua, state)?;
    require::register(lua, state)?;
    Ok(())
}

/// A Lua error raised by a host function: a plain message, like `error("...")` would give.
pub(crate) fn fail(message: impl Into<String>) -> mlua::Error {
    mlua::Error::RuntimeError(message.into())
}
