//! A few fresh, never-used sandboxes built ahead of time on a background thread.
//!
//! Building a sandbox is most of the cost of a script call. A pooled VM is exactly what
//! [`Vm::new`](super::Vm::new) would build, has never run script code, and is used for one run
//! only, then dropped: isolation between runs is the same as building one on the spot.

use std::sync::{Arc, Condvar, Mutex, OnceLock};

use mlua::Lua;

use super::RunState;

/// Ready VMs kept in stock.
const STOCK: usize = 4;

/// A built, unbound sandbox.
pub(super) struct Fresh {
    pub lua: Lua,
    pub state: Arc<RunState>,
}

impl Fresh {
    pub fn build() -> mlua::Result<Fresh> {
        let state = Arc::new(RunState::unbound());
        let lua = super::build(&state)?;
        Ok(Fresh { lua, state })
    }
}

struct Pool {
    ready: Mutex<Vec<Fresh>>,
    wanted: Condvar,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let started = std::thread::Builder::new().name("ctx-lua-pool".into()).spawn(refill);
        if let Err(e) = started {
            tracing::warn!("cannot start the Lua VM pool ({e}); VMs will be built on demand");
        }
        Pool { ready: Mutex::new(Vec::with_capacity(STOCK)), wanted: Condvar::new() }
    })
}

/// A ready VM if one is in stock; asks the builder for a replacement either way.
pub(super) fn take() -> Option<Fresh> {
    let pool = pool();
    let fresh = pool.ready.lock().unwrap_or_else(|p| p.into_inner()).pop();
    pool.wanted.notify_one();
    fresh
}

fn refill() {
    let pool = pool();
    loop {
        {
            let mut ready = pool.ready.lock().unwrap_or_else(|p| p.into_inner());
            while ready.len() >= STOCK {
                ready = pool.wanted.wait(ready).unwrap_or_else(|p| p.into_inner());
            }
        }
        // Built outside the lock, so callers never wait on a build in progress.
        match Fresh::build() {
            Ok(fresh) => pool.ready.lock().unwrap_or_else(|p| p.into_inner()).push(fresh),
            Err(e) => {
                tracing::warn!("cannot pre-build a Lua VM ({e}); VMs will be built on demand");
                return;
            }
        }
    }
}
