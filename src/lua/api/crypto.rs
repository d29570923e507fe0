//! `crypto.sha256(data)` and `crypto.hmac_sha256(key, data)`, both as lower-case hex.

use std::sync::Arc;

use hmac::{KeyInit, Mac};
use mlua::Lua;
use sha2::{Digest, Sha256};

use super::fail;
use crate::contract::text::hex;
use crate::lua::RunState;

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let crypto = lua.create_table()?;
    let st = Arc::clone(state);
    crypto.set(
        "sha256",
        super::function(lua, "crypto.sha256", move |_, data: mlua::LuaString| {
            st.check_data(data.as_bytes().len())?;
            Ok(hex(&Sha256::digest(data.as_bytes())))
        })?,
    )?;
    let st = Arc::clone(state);
    crypto.set(
        "hmac_sha256",
        super::function(lua, "crypto.hmac_sha256", move |_, (key, data): (mlua::LuaString, mlua::LuaString)| {
            st.check_data(key.as_bytes().len() + data.as_bytes().len())?;
            let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&key.as_bytes())
                .map_err(|e| fail(format!("crypto.hmac_sha256: {e}")))?;
            mac.update(&data.as_bytes());
            Ok(hex(&mac.finalize().into_bytes()))
        })?,
    )?;
    lua.globals().set("crypto", crypto)
}
