//! `log.debug/info/warn/error` and `print`, to tracing on stderr, tagged with the script.
//!
//! `print` goes to the log too: stdout belongs to the CLI's output and the MCP stdio transport.

use std::sync::Arc;

use mlua::{Lua, MultiValue};

use crate::lua::RunState;

/// The arguments as one line. `__tostring` runs script code: its errors (a kill among them)
/// propagate rather than being written around.
fn join(args: &MultiValue) -> mlua::Result<String> {
    let parts = args
        .iter()
        .map(|v| match v {
            mlua::Value::String(s) => Ok(s.to_string_lossy().to_string()),
            other => other.to_string(),
        })
        .collect::<mlua::Result<Vec<_>>>()?;
    Ok(parts.join(" "))
}

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let log = lua.create_table()?;
    for level in ["debug", "info", "warn", "error"] {
        let state = Arc::clone(state);
        let f = lua.create_function(move |_, args: MultiValue| {
            state.check_blocking()?;
            let kind = state.info.kind.as_str();
            let name = state.info.name.as_str();
            let text = join(&args)?;
            state.check()?;
            match level {
                "debug" => tracing::debug!(target: "ctx::script", kind, name, "{text}"),
                "info" => tracing::info!(target: "ctx::script", kind, name, "{text}"),
                "warn" => tracing::warn!(target: "ctx::script", kind, name, "{text}"),
                _ => tracing::error!(target: "ctx::script", kind, name, "{text}"),
            }
            Ok(())
        })?;
        log.set(level, f)?;
    }
    lua.globals().set("print", log.get::<mlua::Function>("info")?)?;
    lua.globals().set("log", log)
}
