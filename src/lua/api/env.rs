//! `env.get(name)`: read-only environment access, only to the variables the script's
//! `allow_env` lists, and never to one ctx uses for a secret elsewhere in its config.
//!
//! Deny by default: the server's environment holds its own token and whatever else the operator
//! exported, and a script (perhaps written by a language model) should see none of it unless
//! the operator names it.

use std::sync::Arc;

use mlua::Lua;

use super::{fail, quoted};
use crate::lua::RunState;

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let env = lua.create_table()?;
    let state = Arc::clone(state);
    env.set(
        "get",
        super::function(lua, "env.get", move |_, name: String| {
            let info = &state.info;
            let section = match info.kind {
                crate::config::ScriptKind::Code => "[code_mode]".to_string(),
                kind => format!("[{}.{}]", kind.section(), info.name),
            };
            if let Some(reserved) = info.reserved_env.iter().find(|r| r.var == name) {
                return Err(fail(format!(
                    "env.get: {name} holds a secret ctx itself uses ({} in ctx.toml), so no script may read it, whatever allow_env says; \
                     give {} a key of its own in {section} instead",
                    reserved.key,
                    info.what()
                )));
            }
            match &info.allow_env {
                Some(allowed) if allowed.contains(&name) => Ok(std::env::var(&name).ok()),
                Some(allowed) => Err(fail(format!(
                    "env.get: {} is not in this script's allow_env list ({}); add it to allow_env in {section} of ctx.toml",
                    quoted(&name),
                    allowed.join(", ")
                ))),
                None => Err(fail(format!(
                    "env.get: {} may not read environment variables; list the ones it needs in {section} of ctx.toml, \
                     for example allow_env = [{}]",
                    info.what(),
                    quoted(&name)
                ))),
            }
        })?,
    )?;
    lua.globals().set("env", env)
}
