//! `env.get(name)`: read-only environment access, limited by the script's `allow_env`.

use std::sync::Arc;

use mlua::Lua;

use super::fail;
use crate::lua::RunState;

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let env = lua.create_table()?;
    let state = Arc::clone(state);
    env.set(
        "get",
        lua.create_function(move |_, name: String| {
            if let Some(allowed) = &state.info.allow_env {
                if !allowed.contains(&name) {
                    return Err(fail(format!(
                        "env.get: {name:?} is not in this script's allow_env list ({})",
                        allowed.join(", ")
                    )));
                }
            }
            Ok(std::env::var(&name).ok())
        })?,
    )?;
    lua.globals().set("env", env)
}
