//! `sleep(seconds)`: never sleeps past the deadline, and wakes up when the caller cancels.

use std::sync::Arc;
use std::time::Duration;

use mlua::Lua;

use super::fail;
use crate::lua::RunState;

/// Longest nap between checks of the cancel flag.
const STEP: Duration = Duration::from_millis(20);

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let state = Arc::clone(state);
    let sleep = super::function(lua, "sleep", move |_, seconds: f64| {
        state.check_blocking()?;
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(fail(format!("sleep: expected a number of seconds ≥ 0, got {seconds}")));
        }
        let wanted = Duration::from_secs_f64(seconds.min(1e9));
        let until = std::time::Instant::now() + wanted;
        loop {
            state.check()?;
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            // Sleeping to the deadline and no further: check() then reports the timeout.
            let nap = left.min(STEP).min(state.remaining().max(Duration::from_millis(1)));
            std::thread::sleep(nap);
        }
    })?;
    lua.globals().set("sleep", sleep)
}
