//! `sleep(seconds)`: never sleeps past the deadline, and wakes up when the caller cancels.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlua::Lua;

use super::fail;
use crate::lua::{Kill, RunState};

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let state = Arc::clone(state);
    let sleep = super::function(lua, "sleep", move |_, seconds: f64| {
        state.check_blocking()?;
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(fail(format!("sleep: expected a number of seconds ≥ 0, got {seconds}")));
        }
        let wanted = Duration::from_secs_f64(seconds.min(1e9));
        let until = Instant::now() + wanted;
        loop {
            state.check()?;
            if Instant::now() >= until {
                return Ok(());
            }
            // Sleeping to the deadline and no further: check() then reports the timeout, or the
            // cancellation that woke it.
            let wake = until.min(state.deadline());
            let cancel = state.cancel();
            let woke = crate::runtime::wait(async move {
                tokio::select! {
                    _ = tokio::time::sleep_until(wake.into()) => {}
                    _ = cancel.cancelled() => {}
                }
            });
            if woke.is_none() {
                // The runtime stopped: ctx is shutting down, and so is this run.
                state.kill(Kill::Cancelled);
            }
        }
    })?;
    lua.globals().set("sleep", sleep)
}
