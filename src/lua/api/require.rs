//! `require(name)`: loads `name.lua` (dots become folders) from the script's own folder, through
//! the same sandbox, once per run.

use std::sync::Arc;

use mlua::{Lua, Table, Value};

use super::fs::confine;
use super::{fail, quoted};
use crate::lua::{RunState, RUN_ENV};

/// Modules loaded by the current run, keyed by the run's globals (a weak-keyed table), so a
/// restarted VM loads them again for the next run.
const LOADED: &str = "ctx.require.loaded";

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let by_run = lua.create_table()?;
    let weak = lua.create_table()?;
    weak.raw_set("__mode", "k")?;
    by_run.set_metatable(Some(weak))?;
    lua.set_named_registry_value(LOADED, by_run)?;
    let state = Arc::clone(state);
    // Not made by `api::function`: an error the module itself raises is the module's, already
    // placed at its own line, and passes unchanged. Only require's own errors are placed at the
    // line of the `require` call.
    let require = lua.create_function(move |lua, args: mlua::MultiValue| {
        let own = |e| super::located(lua, "require", e);
        let name = <String as mlua::FromLuaMulti>::from_lua_args(args, 1, Some("require"), lua).map_err(own)?;
        let (chunk, loaded) = match find(lua, &state, &name).map_err(own)? {
            Found::Loaded(value) => return Ok(value),
            Found::Chunk(chunk, loaded) => (chunk, loaded),
        };
        let value: Value = chunk.call(name.as_str())?;
        let value = if value.is_nil() { Value::Boolean(true) } else { value };
        loaded.raw_set(name.as_str(), value.clone())?;
        Ok(value)
    })?;
    lua.globals().set("require", require)
}

/// A module already loaded by this run, or its compiled chunk and the run's table of loaded
/// modules.
enum Found {
    Loaded(Value),
    Chunk(mlua::Function, Table),
}

fn find(lua: &Lua, state: &Arc<RunState>, name: &str) -> mlua::Result<Found> {
    state.check_blocking()?;
    let valid = !name.is_empty()
        && name.len() <= super::fs::MAX_PATH
        && name
            .split('.')
            .all(|part| !part.is_empty() && part.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-'));
    if !valid {
        return Err(fail(format!(
            "require: {} is not a module name; use dotted names like \"lib.util\" for lib/util.lua next to the script",
            quoted(name)
        )));
    }
    let env: Table = lua.named_registry_value(RUN_ENV)?;
    let by_run: Table = lua.named_registry_value(LOADED)?;
    let loaded: Table = match by_run.raw_get::<Value>(&env)? {
        Value::Table(t) => t,
        _ => {
            let t = lua.create_table()?;
            by_run.raw_set(&env, &t)?;
            t
        }
    };
    if let Ok(value) = loaded.raw_get::<Value>(name) {
        if !value.is_nil() {
            return Ok(Found::Loaded(value));
        }
    }
    let rel = format!("{}.lua", name.replace('.', "/"));
    let path = confine(state, "require", &rel).map_err(|_| {
        fail(format!("require: module {} not found: expected {} in the script's folder", quoted(name), quoted(&rel)))
    })?;
    let source = std::fs::read(&path).map_err(|e| fail(format!("require: {}: {e}", quoted(&rel))))?;
    let shown = match state.info.display_path.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/{rel}"),
        None => rel.clone(),
    };
    let chunk = lua
        .load(crate::lua::script::runnable(&source).into_owned())
        .set_name(format!("@{shown}"))
        .set_environment(env)
        .set_mode(mlua::chunk::ChunkMode::Text)
        .into_function()?;
    Ok(Found::Chunk(chunk, loaded))
}
