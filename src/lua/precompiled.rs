//! ctx's own Lua (the sandbox's wrappers), compiled once per process and loaded as bytecode.
//!
//! Every new VM needs these chunks, and parsing them was most of what a fresh sandbox cost;
//! loading bytecode is several times cheaper. The bytecode is always ours: scripts can only load
//! text (see the `load` wrapper in `guard.rs`).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use mlua::{Function, Lua};

/// The chunk `key` as a function of `lua`, compiled from `source()` on first use. `name` is the
/// chunk name its errors and frames carry (`=sandbox`). `env`, when given, is the chunk's
/// `_ENV`; otherwise it sees the globals of `lua`.
pub(crate) fn function(
    lua: &Lua,
    key: &'static str,
    name: &'static str,
    source: impl FnOnce() -> String,
    env: Option<mlua::Table>,
) -> mlua::Result<Function> {
    // Static: a cache keyed by chunk name, whose source is compiled into the binary: the same in any application.
    static COMPILED: OnceLock<Mutex<HashMap<&'static str, &'static [u8]>>> = OnceLock::new();
    let compiled = COMPILED.get_or_init(Default::default);
    let found = compiled.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied();
    let bytecode = match found {
        Some(bytecode) => bytecode,
        None => {
            #[allow(clippy::disallowed_methods)] // a bare compiler state that never runs any code
            let compiler = Lua::new_with(mlua::StdLib::NONE, mlua::LuaOptions::default())?;
            let function = compiler.load(source()).set_name(name).into_function()?;
            // Not stripped: the wrappers keep each original in a local of its own name, so an
            // argument error names `find` rather than `?`. Leaked on purpose: a handful of chunks,
            // each compiled once for the life of the process.
            let bytecode: &'static [u8] = Vec::leak(function.dump(false));
            *compiled.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_insert(bytecode)
        }
    };
    let chunk = lua.load(bytecode).set_name(name).set_mode(mlua::chunk::ChunkMode::Binary);
    match env {
        Some(env) => chunk.set_environment(env).into_function(),
        None => chunk.into_function(),
    }
}
