//! `json.parse`, `json.encode`, `json.null` and `json.array`.

use std::sync::Arc;

use mlua::{Lua, Table, Value};

use super::fail;
use crate::lua::convert::{self, array_metatable, ConvertError};
use crate::lua::RunState;

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let json = lua.create_table()?;
    let (parse_state, encode_state) = (Arc::clone(state), Arc::clone(state));
    json.set(
        "parse",
        super::function(lua, "json.parse", move |lua, text: mlua::LuaString| {
            parse_state.check_data(text.as_bytes().len())?;
            convert::parse_to_lua(lua, &text.as_bytes(), &|| parse_state.check()).map_err(|e| match e {
                mlua::Error::RuntimeError(m) if !m.starts_with("ctx: ") => fail(format!("json.parse: {m}")),
                other => other,
            })
        })?,
    )?;
    let budget = state.limits.memory_bytes;
    json.set(
        "encode",
        super::function(lua, "json.encode", move |lua, value: Value| {
            let wording = |e| match e {
                ConvertError::TooLarge { size } => fail(format!("json.encode: the value is over {size} bytes")),
                ConvertError::Invalid(m) => fail(format!("json.encode: {m}")),
                // The run's own stop (its kill flag is set) is what the caller reports.
                ConvertError::Stopped => mlua::Error::RuntimeError("ctx: script stopped".into()),
            };
            // An inline run stops at its smaller limit, before the work, and escalates.
            let limit = encode_state.data_limit(budget);
            let json = match convert::to_json(lua, &value, limit) {
                Err(ConvertError::TooLarge { .. }) if limit < budget => {
                    encode_state.check_blocking()?;
                    convert::to_json(lua, &value, budget).map_err(wording)?
                }
                converted => converted.map_err(wording)?,
            };
            let text = serde_json::to_string(&json).map_err(|e| fail(format!("json.encode: {e}")))?;
            encode_state.check_data(text.len())?;
            Ok(text)
        })?,
    )?;
    json.set("null", Value::NULL)?;
    json.set(
        "array",
        super::function(lua, "json.array", |lua, table: Option<Table>| {
            let table = match table {
                Some(t) => t,
                None => lua.create_table()?,
            };
            table.set_metatable(Some(array_metatable(lua)?))?;
            Ok(table)
        })?,
    )?;
    lua.globals().set("json", json)
}
