//! `base64.encode(data)` and `base64.decode(text)`, standard alphabet with padding.

use std::sync::Arc;

use base64::Engine;
use mlua::Lua;

use super::fail;
use crate::lua::RunState;

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let b64 = lua.create_table()?;
    let (encode_state, decode_state) = (Arc::clone(state), Arc::clone(state));
    b64.set(
        "encode",
        super::function(lua, "base64.encode", move |_, data: mlua::LuaString| {
            encode_state.check_data(data.as_bytes().len())?;
            Ok(base64::engine::general_purpose::STANDARD.encode(data.as_bytes()))
        })?,
    )?;
    b64.set(
        "decode",
        super::function(lua, "base64.decode", move |lua, text: mlua::LuaString| {
            decode_state.check_data(text.as_bytes().len())?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.as_bytes().trim_ascii())
                .map_err(|e| fail(format!("base64.decode: {e}")))?;
            lua.create_string(bytes)
        })?,
    )?;
    lua.globals().set("base64", b64)
}
