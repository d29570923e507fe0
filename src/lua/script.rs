//! Loading a script file into a [`Vm`] and finding its extension table.
//!
//! Two forms work everywhere: a global table (`tool = {...}`) or a chunk that returns the table
//! (`local ext = {} ... return ext`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use mlua::{Function, IntoLuaMulti, Lua, MultiValue, Table, Value};
use serde_json::Value as Json;

use super::{ScriptError, Vm};

/// A script file read and compiled once, kept by whoever runs it many times (a tool in a
/// registry snapshot): each run then loads bytecode, with no file read and no shared cache.
#[derive(Clone, Debug)]
pub struct Script {
    source: Arc<Vec<u8>>,
    code: Option<Arc<Vec<u8>>>,
}

impl Vm {
    /// Reads and compiles this VM's script file. A syntax error is not reported here: loading
    /// the script reports it, with its line.
    pub fn read_script(&self) -> Result<Script, ScriptError> {
        let info = &self.state().info;
        let source = runnable(&read_source(info)?).into_owned();
        let code = compile(self.lua(), &format!("@{}", info.display_path), &source).map(Arc::new);
        Ok(Script { source: Arc::new(source), code })
    }

    /// Runs a script read by [`Vm::read_script`] and returns its extension table, like
    /// [`Vm::load_extension`].
    pub fn load_script(&self, script: &Script, global: &str) -> Result<Table, ScriptError> {
        let name = format!("@{}", self.state().info.display_path);
        let returned = self.run_chunk(name, script.code.as_deref().map(|c| &c[..]), &script.source)?;
        self.extension(returned, global)
    }

    /// Reads and runs the script file, then returns its extension table: the value the chunk
    /// returned if it is a table, else the global named `global` (`tool`, `connector`, `agent`).
    pub fn load_extension(&self, global: &str) -> Result<Table, ScriptError> {
        let info = &self.state().info;
        let source = read_source(info)?;
        self.load_extension_from(&source, global)
    }

    /// Like [`Vm::load_extension`], from source text already in memory.
    pub fn load_extension_from(&self, source: &[u8], global: &str) -> Result<Table, ScriptError> {
        let source = &runnable(source)[..];
        let name = format!("@{}", self.state().info.display_path);
        let code = compiled(self.lua(), &name, source);
        let returned = self.run_chunk(name, code.as_deref().map(|c| &c[..]), source)?;
        self.extension(returned, global)
    }

    /// Runs source text sent by a client (code mode) in the run's globals, under the run's
    /// limits, and returns what the chunk returned. Only text is accepted, never bytecode:
    /// Lua's loader is not safe against hand-made bytecode. Messages place errors at
    /// `name:line`.
    pub fn run_source(&self, name: &str, source: &[u8]) -> Result<Value, ScriptError> {
        let source = runnable(source).into_owned();
        let name = format!("={name}");
        // Agents send the same small scripts again and again: those are compiled once, by ctx,
        // from their text (the cache bounds its memory by what it keeps of each).
        let code = (source.len() <= CACHED_SOURCE).then(|| compiled(self.lua(), &name, &source)).flatten();
        self.run_chunk(name, code.as_deref().map(|c| &c[..]), &source)
    }

    /// Runs a script's main chunk in the run's globals: its bytecode when it compiled, else its
    /// text (which then reports the syntax error with its line).
    fn run_chunk(&self, name: String, code: Option<&[u8]>, source: &[u8]) -> Result<Value, ScriptError> {
        let _running = super::bounds::enter(self.state());
        let (chunk, mode) = match code {
            Some(code) => (code, mlua::chunk::ChunkMode::Binary),
            None => (source, mlua::chunk::ChunkMode::Text),
        };
        let main = self
            .lua()
            .load(chunk)
            .set_name(name)
            .set_environment(self.env().clone())
            .set_mode(mode)
            .into_function()
            .map_err(|e| self.classify(&e))?;
        self.call(&main, ())
    }

    /// The extension table: what the chunk returned if it is a table, else the global.
    fn extension(&self, returned: Value, global: &str) -> Result<Table, ScriptError> {
        let info = &self.state().info;
        match returned {
            Value::Table(table) => Ok(table),
            Value::Nil => match self.env().get::<Value>(global) {
                Ok(Value::Table(table)) => Ok(table),
                _ => Err(ScriptError::Contract {
                    path: info.display_path.clone(),
                    message: format!("the script must define a global `{global}` table or `return` one"),
                }),
            },
            other => Err(ScriptError::Contract {
                path: info.display_path.clone(),
                message: format!("the script returned a {} where a `{global}` table was expected", other.type_name()),
            }),
        }
    }

    /// The function `ext.<name>`, or a contract error naming it.
    pub fn function(&self, ext: &Table, global: &str, name: &str) -> Result<Function, ScriptError> {
        match ext.get::<Value>(name) {
            Ok(Value::Function(f)) => Ok(f),
            Ok(Value::Nil) | Err(_) => Err(ScriptError::Contract {
                path: self.state().info.display_path.clone(),
                message: format!("`{global}.{name}` is not defined; write `function {global}.{name}(...) ... end`"),
            }),
            Ok(other) => Err(ScriptError::Contract {
                path: self.state().info.display_path.clone(),
                message: format!("`{global}.{name}` must be a function, not a {}", other.type_name()),
            }),
        }
    }

    /// The data fields of an extension table (`tool`, `agent`) as JSON, functions left out: the
    /// metadata that `schema` validates next, its empty tables read as lists where the schema
    /// expects lists (see [`convert::lists_where_expected`](super::convert::lists_where_expected)).
    /// `defaults` fills fields the table leaves out. Errors name the script and the field.
    pub fn metadata(
        &self,
        ext: &Table,
        global: &str,
        budget: usize,
        schema: &crate::schema::SchemaValidator,
        defaults: serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Map<String, serde_json::Value>, String> {
        let path = &self.state().info.display_path;
        let mut meta = serde_json::Map::new();
        for pair in ext.pairs::<Value, Value>() {
            let (key, value) = pair.map_err(|e| format!("{path}: cannot read the {global} table: {e}"))?;
            let Value::String(key) = key else { continue };
            let key = key.to_str().map_err(|e| format!("{path}: {e}"))?.to_string();
            // Functions (execute, resolve, helpers) are code, not metadata.
            if matches!(value, Value::Function(_)) {
                continue;
            }
            let json = super::convert::to_json(self.lua(), &value, budget)
                .map_err(|e| format!("{path}: {global}.{key}: {e}"))?;
            meta.insert(key, json);
        }
        for (key, value) in defaults {
            meta.entry(key).or_insert(value);
        }
        let mut meta = Json::Object(meta);
        super::convert::lists_where_expected(&mut meta, &|v| {
            schema.problems(v, crate::schema::Dialect::Json).into_iter().map(|p| p.path).collect()
        });
        match meta {
            Json::Object(map) => Ok(map),
            _ => Err(format!("{path}: the {global} table is empty")),
        }
    }

    /// [`Vm::result_json`] for a value that `schema` validates next: its empty tables read as
    /// lists where the schema expects lists.
    pub fn result_json_for(&self, value: &Value, schema: &crate::schema::SchemaValidator) -> Result<Json, ScriptError> {
        let mut json = self.result_json(value)?;
        super::convert::lists_where_expected(&mut json, &|v| {
            schema.problems(v, crate::schema::Dialect::Json).into_iter().map(|p| p.path).collect()
        });
        Ok(json)
    }

    /// Calls a script function under the VM's limits.
    ///
    /// The call goes through the sandbox's `pcall`, so whatever the script raised arrives here as
    /// the value it was: mlua would hand over an error table as its `tostring`, a heap address.
    /// Every message is cut to [`ScriptError::MESSAGE_CAP`] (or `max_result_bytes`, if smaller).
    pub fn call(&self, function: &Function, args: impl IntoLuaMulti) -> Result<Value, ScriptError> {
        let _running = super::bounds::enter(self.state());
        let lua = self.lua();
        let cap = ScriptError::MESSAGE_CAP.min(self.state().limits.max_result_bytes);
        // Lua's own pcall, so that what the script raised (a table, say) arrives as it is.
        let protected = || -> mlua::Result<MultiValue> {
            let mut call = args.into_lua_multi(lua)?;
            let (xpcall, locate) = self.protected();
            call.push_front(Value::Function(locate.clone()));
            call.push_front(Value::Function(function.clone()));
            xpcall.call::<MultiValue>(call)
        };
        let mut results = protected().map_err(|e| self.classify(&e).bounded(cap))?.into_iter();
        // A run stopped by a limit is that limit, even if it got to return (a comparison that
        // answered early after its deadline, say) or its error was something else.
        if self.state().killed() != super::Kill::None {
            return Err(self.classify(&stopped()));
        }
        match (results.next(), results.next()) {
            (Some(Value::Boolean(true)), first) => Ok(first.unwrap_or(Value::Nil)),
            (_, raised) => Err(self.raised(raised.unwrap_or(Value::Nil), cap).bounded(cap)),
        }
    }

    /// What `error(value)` raised, as a [`ScriptError`].
    fn raised(&self, value: Value, cap: usize) -> ScriptError {
        let text = match value {
            // A host function's error, or the sandbox's own.
            Value::Error(e) => return self.classify(&e),
            Value::Table(table) => return self.raised_table(&table, cap),
            // Cut before it is copied out of Lua: a script may raise a string of many MiB.
            Value::String(s) => ScriptError::bounded_bytes(&s.as_bytes(), cap),
            Value::Nil => String::new(),
            Value::Boolean(b) => b.to_string(),
            Value::Integer(i) => i.to_string(),
            Value::Number(n) => n.to_string(),
            other => format!("the script raised a {} as its error", other.type_name()),
        };
        self.classify(&mlua::Error::RuntimeError(text))
    }

    /// `error({code = "...", message = "..."})`: the message and code the table names, and the
    /// table itself as JSON, never its address.
    fn raised_table(&self, table: &Table, cap: usize) -> ScriptError {
        let state = self.state();
        let text = |key: &str| match table.raw_get::<Value>(key) {
            Ok(Value::String(s)) => Some(s),
            _ => None,
        };
        let message = match text("message") {
            Some(s) => {
                super::sanitize(&mlua::Error::RuntimeError(ScriptError::bounded_bytes(&s.as_bytes(), cap)), &state.info)
            }
            None => match table.raw_get::<Value>("message") {
                Ok(Value::Nil) | Err(_) => {
                    format!("{}: the script raised a table without a 'message' field", state.info.display_path)
                }
                Ok(other) => format!(
                    "{}: the script raised a table whose 'message' is a {}, not a string",
                    state.info.display_path,
                    other.type_name()
                ),
            },
        };
        let code = text("code").map(|s| ScriptError::bounded_bytes(&s.as_bytes(), ScriptError::CODE_CAP));
        // The message and code count against the result limit too.
        let used = message.len() + code.as_ref().map_or(0, String::len);
        let budget = ScriptError::RAISED_DATA_CAP.min(state.limits.max_result_bytes.saturating_sub(used));
        let data = match super::convert::to_json(self.lua(), &Value::Table(table.clone()), budget) {
            Ok(json) => json,
            Err(super::convert::ConvertError::TooLarge { .. }) => Json::String(format!(
                "(the raised table is over the {budget} bytes of JSON that a raised table may keep; left out)"
            )),
            Err(super::convert::ConvertError::Invalid(why)) => {
                Json::String(format!("(the raised table cannot be shown as JSON: {why})"))
            }
            Err(super::convert::ConvertError::Stopped) => return self.classify(&stopped()),
        };
        ScriptError::Raised { message, code, data }
    }
}

/// Scripts compiled to bytecode, by chunk name and source text. Each run still gets a fresh VM;
/// only the parse is shared. The bytecode is produced here from the script's own text (Lua's
/// loader is not safe against hand-made bytecode, and scripts can never supply any).
type Cache = Mutex<HashMap<(String, Vec<u8>), Arc<Vec<u8>>>>;

/// The most scripts kept compiled; the cache is simply cleared when full.
const CACHE_ENTRIES: usize = 256;

/// The longest client-sent script whose bytecode is kept (see [`Vm::run_source`]): the cache
/// holds at most [`CACHE_ENTRIES`] of them.
const CACHED_SOURCE: usize = 16 * 1024;

/// The bytecode of `source`, compiled on first use; `None` if it does not compile (the text path
/// then reports the syntax error with its line).
fn compiled(lua: &Lua, name: &str, source: &[u8]) -> Option<Arc<Vec<u8>>> {
    // Static: a cache keyed by its whole input (name, source): the same input compiles the same in any application.
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (name.to_string(), source.to_vec());
    if let Some(hit) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Some(Arc::clone(hit));
    }
    let code = Arc::new(compile(lua, name, source)?);
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= CACHE_ENTRIES {
        map.clear();
    }
    map.insert(key, Arc::clone(&code));
    Some(code)
}

/// Bytecode of `source`, or `None` if it does not compile. Compiling runs no script code, so the
/// VM at hand can do it without side effects.
fn compile(lua: &Lua, name: &str, source: &[u8]) -> Option<Vec<u8>> {
    let function = lua.load(source).set_name(name).set_mode(mlua::chunk::ChunkMode::Text).into_function().ok()?;
    Some(function.dump(false))
}

fn read_source(info: &super::ScriptInfo) -> Result<Vec<u8>, ScriptError> {
    std::fs::read(&info.path).map_err(|e| ScriptError::Unreadable {
        path: info.display_path.clone(),
        message: match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_string(),
            _ => e.to_string(),
        },
    })
}

/// A script file's text as Lua's own `lua` command reads it: without a UTF-8 byte order mark
/// (Windows editors write one) and with a first line starting with `#` (a `#!` line) left empty.
/// Lua's loader for text in memory accepts neither. The line stays, empty, so every line keeps
/// its number in messages.
pub(crate) fn runnable(source: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let text = source.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(source);
    if !text.starts_with(b"#") {
        return if text.len() == source.len() { source.into() } else { text.into() };
    }
    let end = text.iter().position(|&b| b == b'\n').unwrap_or(text.len());
    text[end..].to_vec().into()
}

/// The error of a conversion that stopped because its run was stopped: [`Vm::classify`] turns it
/// into the limit that stopped the run.
pub fn stopped() -> mlua::Error {
    mlua::Error::RuntimeError("ctx: script stopped".into())
}
