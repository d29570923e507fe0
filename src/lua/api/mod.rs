//! Host APIs: every capability a script has beyond pure computation. Each module exposes one
//! `register`, and [`register_all`] is the single list of what a sandbox gets.

mod base64;
mod crypto;
mod env;
mod fs;
pub mod http;
mod json;
pub(crate) mod log;
pub mod mcp;
mod progress;
mod require;
mod sleep;

use std::sync::Arc;

use mlua::Lua;

use super::{RunState, ScriptError};

/// The globals the host APIs define, installed on first use.
pub(crate) const NAMES: [&str; 12] =
    ["json", "log", "print", "env", "fs", "base64", "crypto", "sleep", "http", "MCP", "progress", "require"];

/// Makes every host API available in a fresh sandbox.
///
/// A module is installed the first time a script touches its global (through a metatable on
/// the globals table), so a VM for a script that needs none of them costs almost nothing to
/// build. Once installed, a module is an ordinary global.
pub fn register_all(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let state = Arc::clone(state);
    let install = lua.create_function(move |lua, (globals, key): (mlua::Table, mlua::Value)| {
        let mlua::Value::String(name) = &key else { return Ok(mlua::Value::Nil) };
        if super::guard::load_std(lua, name.as_bytes().as_ref())? {
            return globals.raw_get(key);
        }
        if let Some(refusal) = refused_to_code(&state.info, name.as_bytes().as_ref()) {
            return Err(fail(refusal));
        }
        match name.as_bytes().as_ref() {
            b"json" => json::register(lua, &state)?,
            b"log" | b"print" => log::register(lua, &state)?,
            b"env" => env::register(lua, &state)?,
            b"fs" => fs::register(lua, &state)?,
            b"base64" => base64::register(lua, &state)?,
            b"crypto" => crypto::register(lua, &state)?,
            b"sleep" => sleep::register(lua, &state)?,
            b"http" => http::register(lua, &state)?,
            b"MCP" => mcp::register(lua, &state)?,
            b"progress" => progress::register(lua, &state)?,
            b"require" => require::register(lua, &state)?,
            _ => return Ok(mlua::Value::Nil),
        }
        globals.raw_get(key)
    })?;
    let meta = lua.create_table()?;
    meta.raw_set("__index", install)?;
    // Scripts can neither reach the installer nor remove it.
    meta.raw_set("__metatable", false)?;
    lua.globals().set_metatable(Some(meta))?;
    Ok(())
}

/// Why agent-sent code (kind `Code`) may not use the host API `name`, when it may not: it
/// reaches the world only through tools, unless `[code_mode]` allows an API. `http` needs
/// `allow_hosts`, `env` needs `allow_env`, and `fs`/`require` need `fs_root` (which becomes the
/// script's folder: without it the script has no folder at all).
fn refused_to_code(info: &super::ScriptInfo, name: &[u8]) -> Option<String> {
    if info.kind != crate::config::ScriptKind::Code {
        return None;
    }
    let (api, key, example) = match name {
        b"http" if info.allow_hosts.is_none() => ("http", "allow_hosts", "allow_hosts = [\"api.example.com\"]"),
        b"env" if info.allow_env.is_none() => ("env", "allow_env", "allow_env = [\"MY_VAR\"]"),
        b"fs" | b"require" if info.path.as_os_str().is_empty() => {
            (if name == b"fs" { "fs" } else { "require" }, "fs_root", "fs_root = \"docs\"")
        }
        _ => return None,
    };
    Some(format!(
        "{api} is not available to agent-sent scripts: they reach the world only through tools (ctx.*, and the \
         upstream servers' tables). An operator can allow it with {key} in [code_mode] of ctx.toml, for example {example}"
    ))
}

/// A Lua error raised by a host function: a plain message, like `error("...")` would give.
/// Cut to [`ScriptError::MESSAGE_CAP`]: the message is
/// copied several times in Rust on its way back to the script (placed at its line, sanitised,
/// redacted), outside the script's memory cap.
pub(crate) fn fail(message: impl Into<String>) -> mlua::Error {
    mlua::Error::RuntimeError(capped(message.into()))
}

/// `text` quoted for an error message (`"lib/util.lua"`), at most [`QUOTED_CHARS`] characters of
/// it: a message names what it was given, it does not carry it back whole.
pub(crate) fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED_CHARS) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &text[..end], text.len()),
    }
}

/// How many characters of an argument a host error quotes.
const QUOTED_CHARS: usize = 200;

fn capped(message: String) -> String {
    if message.len() <= ScriptError::MESSAGE_CAP {
        message
    } else {
        ScriptError::bounded_text(&message, ScriptError::MESSAGE_CAP)
    }
}

/// Makes the host function `name` (`http.get`, `context.search`): `f` with its arguments
/// converted, and its errors made into what a script expects of a library function. Every host
/// function a script can reach is made here.
///
/// An error reads `jira.lua:12: http.get: <what went wrong>`: the script's own file and line (the
/// innermost frame of the script's code, not the sandbox's or a C function's), then the function.
/// Caught with `pcall`, it arrives as that plain string (the sandbox's `pcall` turns mlua's error
/// value into its message, see `guard.rs`), and `tostring` of it is that string wherever a script
/// holds it (a `__close` handler); uncaught, it is the message the caller gets.
pub(crate) fn function<A, R, F>(lua: &Lua, name: &'static str, f: F) -> mlua::Result<mlua::Function>
where
    A: mlua::FromLuaMulti,
    R: mlua::IntoLuaMulti,
    F: Fn(&Lua, A) -> mlua::Result<R> + mlua::MaybeSend + 'static,
{
    lua.create_function(move |lua, args: mlua::MultiValue| {
        let args = A::from_lua_args(args, 1, Some(name), lua).map_err(|e| located(lua, name, e))?;
        f(lua, args).map_err(|e| located(lua, name, e))
    })
}

/// `err`, raised by the host function `name`, as a message with the script's file and line.
/// The sandbox's own stops (a deadline, the memory cap, a cancel) pass unchanged: they are not
/// the script's errors, and the kill flag says what they were.
pub(crate) fn located(lua: &Lua, name: &str, err: mlua::Error) -> mlua::Error {
    let message = match &err {
        mlua::Error::MemoryError(_) => return err,
        mlua::Error::RuntimeError(m) if m.starts_with("ctx: script stopped") => return err,
        mlua::Error::BadArgument { pos, cause, .. } => format!("bad argument #{pos} ({})", conversion(cause)),
        mlua::Error::CallbackError { cause, .. } | mlua::Error::WithContext { cause, .. } => {
            return located(lua, name, (**cause).clone())
        }
        // Cut before anything else copies it (a conversion error may quote its input).
        mlua::Error::RuntimeError(m) => ScriptError::bounded_text(m, ScriptError::MESSAGE_CAP),
        other => capped(other.to_string()),
    };
    // Most messages already name their function, or a sibling (`http.request` reports the
    // method it sent, `http.post: ...`).
    let module = name.split('.').next().unwrap_or(name);
    let named = message.strip_prefix(module).is_some_and(|rest| rest.starts_with(['.', ':']));
    let message = if named { message } else { format!("{name}: {message}") };
    fail(format!("{}{message}", script_location(lua)))
}

/// "string expected, got nil", for an argument mlua could not convert.
fn conversion(cause: &mlua::Error) -> String {
    match cause {
        mlua::Error::FromLuaConversionError { from, to, .. } => {
            let wanted = match to.as_ref() {
                "String" | "LuaString" | "string" | "str" => "string",
                "f64" | "f32" | "number" => "number",
                "i64" | "i32" | "u64" | "u32" | "usize" | "isize" | "integer" => "integer",
                "Table" | "table" => "table",
                "Function" | "function" => "function",
                "bool" | "boolean" => "boolean",
                other => other,
            };
            format!("{wanted} expected, got {from}")
        }
        other => other.to_string(),
    }
}

/// `file:line: ` of the innermost frame that runs the script's code (a `require`d module and a
/// chunk the script `load`ed count as its code), or nothing when there is none.
pub(crate) fn script_location(lua: &Lua) -> String {
    script_frame(lua, |debug, chunk, line| {
        let file = match chunk.strip_prefix('@') {
            Some(path) => path.to_string(),
            None => debug.source().short_src.as_deref().unwrap_or("?").to_string(),
        };
        format!("{file}:{line}: ")
    })
    .unwrap_or_default()
}

/// The line running in `chunk` (`=script`), when the script's innermost frame is that chunk
/// (where [`script_location`] points), without building the text: code mode notes it for every
/// call a script starts.
pub(crate) fn line_in(lua: &Lua, chunk: &str) -> Option<i64> {
    script_frame(lua, |_, name, line| (name == chunk).then_some(line as i64)).flatten()
}

/// `place(debug, chunk name, line)` of the innermost frame of the script's own code: not C,
/// not one of ctx's own chunks.
fn script_frame<T>(lua: &Lua, place: impl Fn(&mlua::debug::Debug<'_>, &str, usize) -> T) -> Option<T> {
    // Deep enough for any sandbox wrapper between a host function and the script.
    for level in 0..32 {
        let found = lua.inspect_stack(level, |debug| {
            let source = debug.source();
            if source.what == "C" {
                return None;
            }
            let chunk = source.source.as_deref().unwrap_or_default();
            if INTERNAL_CHUNKS.contains(&chunk) {
                return None;
            }
            let line = debug.current_line()?;
            Some(place(debug, chunk, line))
        });
        match found {
            None => break,
            Some(Some(found)) => return Some(found),
            Some(None) => continue,
        }
    }
    None
}

/// Chunks of ctx's own Lua (the sandbox's wrappers): never the place an error is reported at.
const INTERNAL_CHUNKS: [&str; 3] = ["=sandbox", "=[string patterns]", "=code"];
