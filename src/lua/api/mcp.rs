//! `MCP.success/error/text/json/content`: explicit results, so a tool says exactly what the client sees.
//!
//! Each helper returns a table tagged with a metatable that only the host holds (its
//! `__metatable` field hides it from `getmetatable`), so a plain table can never be mistaken for
//! a helper result, and a script cannot forge the tag. How each kind maps to REST and MCP is
//! written down in `schemas/mcp-call-result.schema.json`.

use std::sync::Arc;

use mlua::{Lua, Table, Value};

use super::fail;
use crate::lua::RunState;

/// Registry key of the tag metatable.
const TAG: &str = "ctx.mcp_result";

pub fn register(lua: &Lua, _state: &Arc<RunState>) -> mlua::Result<()> {
    let tag = lua.create_table()?;
    tag.raw_set("__metatable", "MCP result")?;
    lua.set_named_registry_value(TAG, &tag)?;
    let mcp = lua.create_table()?;
    let make = |kind: &'static str| {
        let tag = tag.clone();
        move |lua: &Lua, fields: Vec<(&'static str, Value)>| -> mlua::Result<Table> {
            let t = lua.create_table()?;
            t.raw_set("kind", kind)?;
            for (k, v) in fields {
                t.raw_set(k, v)?;
            }
            t.set_metatable(Some(tag.clone()))?;
            Ok(t)
        }
    };
    let success = make("success");
    mcp.raw_set(
        "success",
        super::function(lua, "MCP.success", move |lua, data: Value| success(lua, vec![("data", data)]))?,
    )?;
    let json = make("json");
    mcp.raw_set("json", super::function(lua, "MCP.json", move |lua, data: Value| json(lua, vec![("data", data)]))?)?;
    let content = make("content");
    mcp.raw_set(
        "content",
        super::function(lua, "MCP.content", move |lua, blocks: Value| match blocks {
            Value::Table(_) => content(lua, vec![("data", blocks)]),
            other => Err(fail(format!("MCP.content: expected an array of content blocks, got {}", other.type_name()))),
        })?,
    )?;
    let text = make("text");
    mcp.raw_set(
        "text",
        super::function(lua, "MCP.text", move |lua, value: Value| {
            let s = match value {
                Value::Nil => return Err(fail("MCP.text: expected the text to show, got nil")),
                other => scalar_text(lua, other, "MCP.text: the text")?,
            };
            text(lua, vec![("text", s)])
        })?,
    )?;
    let error = make("error");
    mcp.raw_set(
        "error",
        super::function(lua, "MCP.error", move |lua, (code, message, data): (Value, Value, Value)| {
            let code = match code {
                Value::Nil => return Err(fail("MCP.error: expected (code, message, data?), got no code")),
                other => scalar_text(lua, other, "MCP.error: the code")?,
            };
            let message = match message {
                Value::Nil => code.clone(),
                other => scalar_text(lua, other, "MCP.error: the message")?,
            };
            error(lua, vec![("code", code), ("message", message), ("data", data)])
        })?,
    )?;
    lua.globals().set("MCP", mcp)
}

/// A string, number or boolean as text. Anything else is refused: its `tostring` would show the
/// client a heap address ("table: 0x5557...").
fn scalar_text(lua: &Lua, value: Value, what: &str) -> mlua::Result<Value> {
    match value {
        Value::String(s) => Ok(Value::String(s)),
        Value::Integer(_) | Value::Number(_) | Value::Boolean(_) => {
            Ok(Value::String(lua.create_string(value.to_string()?)?))
        }
        other => Err(fail(format!(
            "{what} must be a string, got a {}; pass tables as data (MCP.json, or MCP.error's third argument)",
            other.type_name()
        ))),
    }
}

/// The helper result `value` is, if an `MCP.*` helper built it.
pub fn helper_result(lua: &Lua, value: &Value) -> Option<Table> {
    let Value::Table(t) = value else { return None };
    let meta = t.metatable()?;
    let tag: Table = lua.named_registry_value(TAG).ok()?;
    (meta.to_pointer() == tag.to_pointer()).then(|| t.clone())
}
