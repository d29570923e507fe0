//! `progress(done, total?, message?)`: tells the caller how far a long tool has got. A no-op
//! unless the caller asked for progress (an MCP `progressToken`).

use std::sync::Arc;

use mlua::Lua;

use super::fail;
use crate::lua::{Progress, RunState};

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let state = Arc::clone(state);
    let progress =
        super::function(lua, "progress", move |_, (done, total, message): (f64, Option<f64>, Option<String>)| {
            // Never blocks: a call that asked for progress does not run inline (lua_tool::run_inline),
            // and without a sink this is a no-op.
            state.check()?;
            if !done.is_finite() || total.is_some_and(|t| !t.is_finite()) {
                return Err(fail("progress: expected finite numbers (done, total?, message?)"));
            }
            state.report(Progress { done, total, message });
            Ok(())
        })?;
    lua.globals().set("progress", progress)
}
