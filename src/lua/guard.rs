//! Curates the standard library and makes the kill switch uncatchable.
//!
//! Removed: `dofile`, `loadfile`, `string.dump`, `os` except `time`/`clock`/`date`, and there is
//! no `io`, `debug`, `package` or native `require`. `load` accepts text chunks only.
//! `collectgarbage` keeps only its harmless options. The string metatable is locked.
//! `pcall`, `xpcall`, `coroutine.resume`, `coroutine.wrap` and `coroutine.close` are wrapped: after
//! the inner call returns, a killed VM (deadline, cancel, memory cap) raises again, so no handler
//! can swallow it, and a coroutine the stop ended is never closed (its `__close` handlers would
//! run with hooks off).
//! `__gc` finalizers are refused, since they would run at close time, outside the deadline.
//! `string.find`, `match`, `gmatch` and `gsub` are ctx's own matcher (`pattern.rs`), which checks
//! the deadline as it goes; other C loops are bounded before they start (`bounds.rs`).
//!
//! Scripts never touch the state's own globals. Each run gets new ones from `new_env`: the
//! sandbox's functions, plus a copy of each library table made the first time the run reads it.
//! `load` without an explicit env, and `require`, bind chunks to the run's globals.

use std::sync::Arc;

use mlua::{Function, Lua, MultiValue, Table, Value};

use super::RunState;

const WRAPPERS: &str = r##"
local guard, raw_xpcall, raw_load, raw_collect, raw_setmetatable, pack, unpack, base, libraries, seed, bound, run_count, big, big_args, locate = ...
local next, type, rawset, select, error, tostring, tonumber, getmetatable = next, type, rawset, select, error, tostring, tonumber, getmetatable
local format = string.format
-- An error raised in Rust (a host function, a limit check) is mlua's error value, a userdata
-- whose `tostring` is a Rust error chain with a traceback through the sandbox. pcall turns it
-- into its plain message (see `guard`), but Lua 5.4 hands it to the `__close` handler of a
-- to-be-closed variable as it is, while it unwinds: the two ways to read its text, `tostring` and
-- `string.format("%s")`, give that plain message too.
do
  local tostring = tostring
  local function plain(...)
    local n = select("#", ...)
    if n <= 2 then -- `tostring(v)`, `format(f, v)`: no table to build
      local a, b = ...
      if type(a) ~= "userdata" and type(b) ~= "userdata" then return ... end
    end
    local values = pack(...)
    for k = 1, n do
      if type(values[k]) == "userdata" then values[k] = (select(2, guard(false, values[k]))) end
    end
    return unpack(values, 1, n)
  end
  _ENV.tostring = function(...)
    return (tostring(plain(...)))
  end
  local format = string.format
  string.format = function(...)
    return (format(plain(...)))
  end
end
-- `getmetatable("")` would hand out the shared string metatable; lock it.
local string_mt = getmetatable("")
string_mt.__metatable = false
local pristine_string = string
-- C loops the hook cannot interrupt are bounded before they start (see bounds.rs for the audit).
local rep = string.rep
string.rep = function(s, n, sep)
  if bound("rep", s, n, sep) then return "" end
  return (rep(s, n, sep))
end
local function position(value, arg, name)
  local n = tonumber(value)
  if n == nil then
    error(format("bad argument #%d to '%s' (number expected, got %s)", arg, name, type(value)), 3)
  elseif n % 1 ~= 0 then
    error(format("bad argument #%d to '%s' (number has no integer representation)", arg, name), 3)
  end
  return n // 1
end
local move, insert, remove, concat, sort, tunpack = table.move, table.insert, table.remove, table.concat, table.sort, table.unpack
-- A table with a metatable may answer every index, and its metamethods may be C functions
-- (`__index = next`), which C loops call without a Lua instruction between them: for such
-- tables the table functions below do their loops in Lua, where the hook sees every step.
local function plain(t) return type(t) ~= "table" or getmetatable(t) == nil end
table.move = function(a1, f, e, t, a2)
  bound("move", f, e)
  if plain(a1) and (a2 == nil or plain(a2)) then return (move(a1, f, e, t, a2)) end
  a2 = a2 == nil and a1 or a2
  f, e, t = position(f, 2, "move"), position(e, 3, "move"), position(t, 4, "move")
  if e >= f then
    if t > e or t <= f or a2 ~= a1 then
      for i = 0, e - f do a2[t + i] = a1[f + i] end
    else
      for i = e - f, 0, -1 do a2[t + i] = a1[f + i] end
    end
  end
  return a2
end
table.concat = function(t, sep, i, j)
  if plain(t) then return (concat(t, sep, i, j)) end
  i = i == nil and 1 or position(i, 3, "concat")
  j = j == nil and #t or position(j, 4, "concat")
  bound("concat", i, j)
  local parts = {}
  for k = i, j do
    local v = t[k]
    local kind = type(v)
    if kind ~= "string" and kind ~= "number" then
      error(format("invalid value (at index %d) in table for 'concat'", k), 2)
    end
    parts[k - i + 1] = v
  end
  return (concat(parts, sep))
end
table.unpack = function(t, i, j)
  if plain(t) then return tunpack(t, i, j) end
  i = i == nil and 1 or position(i, 2, "unpack")
  j = j == nil and #t or position(j, 3, "unpack")
  if i > j then return end
  if j - i >= 1000000 then error("too many results to unpack", 2) end
  local values = {}
  for k = i, j do values[k - i + 1] = t[k] end
  return tunpack(values, 1, j - i + 1)
end
-- Each comparison runs as Lua (a C comparator, or C `__lt` metamethods of the elements, would
-- let one sort run n log n steps unseen), and a table with a metatable is sorted as a plain copy.
local function less(a, b) return a < b end
table.sort = function(t, comp)
  if comp == nil then
    comp = less
  elseif bound("native", comp) then
    local c = comp
    comp = function(a, b) return c(a, b) end
  end
  if plain(t) then return select(1, sort(t, comp)) end
  local n = #t
  bound("move", 1, n)
  local copy = {}
  for k = 1, n do copy[k] = t[k] end
  sort(copy, comp)
  for k = 1, n do t[k] = copy[k] end
end
-- With a metatable, `#t` comes from __len (math.maxinteger, say) and every step may call
-- metamethods: the same work in Lua, where the hook governs each step. Plain tables stay in C.
table.insert = function(t, ...)
  if type(t) ~= "table" or getmetatable(t) == nil then return select(1, insert(t, ...)) end
  local n = select("#", ...)
  local e = #t + 1
  if n == 1 then
    t[e] = ...
    return
  elseif n ~= 2 then
    error("wrong number of arguments to 'insert'", 2)
  end
  local pos, value = ...
  pos = position(pos, 2, "insert")
  if pos < 1 or pos > e then error("bad argument #2 to 'insert' (position out of bounds)", 2) end
  for i = e, pos + 1, -1 do t[i] = t[i - 1] end
  t[pos] = value
end
table.remove = function(t, ...)
  if type(t) ~= "table" or getmetatable(t) == nil then return (remove(t, ...)) end
  local size = #t
  local pos = size
  if select("#", ...) > 0 and (...) ~= nil then pos = position((...), 2, "remove") end
  if pos ~= size and (pos < 1 or pos > size + 1) then
    error("bad argument #2 to 'remove' (position out of bounds)", 2)
  end
  local result = t[pos]
  while pos < size do
    t[pos] = t[pos + 1]
    pos = pos + 1
  end
  t[pos] = nil
  return result
end
-- The globals of the current run: what `load` gives a chunk when the caller names no env.
local run_env = base
-- Lua's xpcall with `locate` as the message handler: it runs before the stack unwinds, so an
-- error a library function raised inside one of these wrappers is placed at the script's line.
pcall = function(f, ...) return guard(raw_xpcall(f, locate, ...)) end
-- The handler runs after the protected call unwinds, as ordinary code, so the deadline hook
-- governs it and nothing it does can be mistaken for error handling. (There is no `debug`
-- library, so a handler could not have inspected the failing frames anyway.)
xpcall = function(f, handler, ...)
  local results = pack(guard(raw_xpcall(f, locate, ...)))
  if results[1] then return unpack(results, 1, results.n) end
  return false, handler(results[2])
end
-- Finalizers would run when the state is closed, outside any deadline; refuse them.
setmetatable = function(t, mt)
  if type(mt) == "table" and rawget(mt, "__gc") ~= nil then
    error("setmetatable: __gc finalizers are not allowed in the sandbox", 2)
  end
  return raw_setmetatable(t, mt)
end
load = function(...)
  local chunk, name, mode, env = ...
  if mode ~= nil and mode ~= "t" then
    error("load: only text chunks are allowed (mode \"t\")", 2)
  end
  if type(chunk) == "string" then
    bound("load", chunk)
  elseif type(chunk) == "function" then
    -- A reader's pieces are parsed in C between its calls: count them against the same limit.
    local reader, total = chunk, 0
    chunk = function()
      local piece = reader()
      if type(piece) == "string" then
        total = total + #piece
        bound("load", total)
      end
      return piece
    end
  end
  -- A reader function runs inside load, which catches its errors: re-raise a kill.
  if select("#", ...) >= 4 then return guard(raw_load(chunk, name, "t", env)) end
  return guard(raw_load(chunk, name, "t", run_env))
end
local allowed_gc = { collect = true, count = true, step = true, isrunning = true }
collectgarbage = function(opt, ...)
  opt = opt or "collect"
  if not allowed_gc[opt] then
    error("collectgarbage: option '" .. tostring(opt) .. "' is not allowed in the sandbox", 2)
  end
  -- A full cycle is O(heap) in C: a loop of them looks at the deadline every time.
  bound("gc")
  -- Counted after a full collection, so a run cannot measure what an earlier run of a reused VM
  -- left for the collector.
  if opt == "count" then return run_count() end
  return raw_collect(opt, ...)
end
-- Applied to the coroutine library when a script first touches it.
-- A coroutine the stop ended is dead with hooks off (Lua does not turn them back on for a thread
-- whose error nobody caught inside it), so closing it would run its `__close` handlers with no
-- deadline: the kill is raised before any close. That is why `wrap` is written here on top of
-- `create` and `resume`: Lua's own closes the dead coroutine before anyone can look.
local function wrap_coroutine(co)
  local create, resume, close, status = co.create, co.resume, co.close, co.status
  co.resume = function(thread, ...) return guard(resume(thread, ...)) end
  co.close = function(thread)
    guard()
    return guard(close(thread))
  end
  co.wrap = function(f)
    local thread = create(f)
    return function(...)
      local results = pack(guard(resume(thread, ...)))
      if results[1] then return unpack(results, 2, results.n) end
      local err = results[2]
      if status(thread) == "dead" then
        local closed, after = guard(close(thread))
        if not closed then err = after end
      end
      -- As Lua's own: a message gets the caller's position.
      if type(err) == "string" then error(err, 2) end
      error(err, 0)
    end
  end
end
-- A run's globals. The base functions of the sandbox are copied in; each library table
-- (`string`, `json`, ...) and host function (`print`, `sleep`, ...) arrives the first time the run
-- reads it, library tables as copies, so whatever a run changes dies with its table, and a run
-- cannot tell which libraries an earlier run used. The sandbox's own tables are never handed out.
-- What is copied in is listed once, on the first run (the base's other values never change
-- after the sandbox is built: libraries arrive as tables, host functions are libraries), and
-- every run shares one locked metatable, whose index function keeps nothing of any run.
local env_meta = {
  __metatable = false,
  __index = function(t, k)
    if not libraries[k] then return nil end
    local lib = base[k] -- installs the library on its first use in this VM
    if type(lib) == "table" then
      local copy = {}
      for name, value in next, lib do copy[name] = value end
      if k == "string" then
        string_mt.__index = copy -- so `function string.x` works as a method, as in plain Lua
      elseif k == "math" then
        lib.randomseed(seed()) -- a run must not inherit, or repeat, the sequence of the last one
      end
      lib = copy
    end
    if lib ~= nil then rawset(t, k, lib) end
    return lib
  end,
}
local copied_keys, copied_values, copied
-- `env` is an empty table sized for the globals (see `begin_run`); returns it and how many
-- slots the next one needs.
local function new_env(env)
  if copied == nil then
    -- Built in locals and kept only once whole: a first run stopped half-way leaves no part list.
    local keys, values, n = {}, {}, 0
    for k, v in next, base do
      if type(v) ~= "table" and not libraries[k] then
        n = n + 1
        keys[n], values[n] = k, v
      end
    end
    copied_keys, copied_values, copied = keys, values, n
  end
  for i = 1, copied do env[copied_keys[i]] = copied_values[i] end
  env._G = env
  string_mt.__index = pristine_string
  raw_setmetatable(env, env_meta)
  run_env = env
  return env, copied + 1
end
-- Functions whose one call can do a lot of work look at the deadline first when given a lot.
local rawlen = rawlen
-- `chunk` is one library's wrappers (bounds.rs), compiled once per process.
local function wrap_sized(lib, chunk)
  chunk(lib, big, big_args, type, rawlen, select)
end
-- Drops the sandbox's own references to the last run's tables (the string metatable's index,
-- `load`'s default env), so an idle VM does not keep them alive.
local function end_run()
  string_mt.__index = pristine_string
  run_env = base
end
return wrap_coroutine, new_env, wrap_sized, end_run
"##;

const WRAP_COROUTINE: &str = "ctx.guard.wrap_coroutine";
const WRAP_SIZED: &str = "ctx.guard.wrap_sized";
/// Registry key of Lua's own `pcall`, before the sandbox wraps it.
pub(super) const RAW_XPCALL: &str = "ctx.guard.raw_xpcall";
/// Registry key of the message handler that places errors at the script's line (see [`locate`]).
pub(super) const LOCATE: &str = "ctx.guard.locate";
/// Registry key of the chunk's `end_run` (see [`end_run`]).
const END_RUN: &str = "ctx.guard.end_run";

/// Lets go of the sandbox's references to the finished run's tables, before it is collected.
pub(super) fn end_run(lua: &Lua) {
    if let Ok(end) = lua.named_registry_value::<Function>(END_RUN) {
        let _ = end.call::<()>(());
    }
}

/// Curates the state's globals (the sandbox base, never seen by scripts) and returns the function
/// that makes a run's globals.
pub(super) fn install(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<Function> {
    let globals = lua.globals();
    // `print` and `require` come back as host APIs (the log, and a folder-confined loader).
    for name in ["dofile", "loadfile", "require", "module", "print"] {
        globals.raw_set(name, Value::Nil)?;
    }
    let string: Table = globals.get("string")?;
    string.raw_set("dump", Value::Nil)?;
    // Lua's matcher runs in C, where the deadline hook never fires, and a pattern like
    // ".-.-.-b" can take minutes: the port checks the deadline as it goes (an inline run thus
    // escalates once its budget is spent).
    let check_state = Arc::clone(state);
    super::pattern::install(lua, &string, Arc::new(move || check_state.check()))?;

    let guard_state = Arc::clone(state);
    let guard = lua.create_function(move |lua, mut results: MultiValue| {
        guard_state.check()?;
        // A memory error caught by pcall must stop the script too, or a loop could keep
        // hitting the cap. Lua reports its own with this exact message; one raised in a host
        // function arrives as mlua's error value.
        let mut iter = results.iter();
        let out_of_memory = match (iter.next(), iter.next()) {
            (Some(Value::Boolean(false) | Value::Nil), Some(Value::String(msg))) => {
                msg.as_bytes().as_ref() == b"not enough memory"
            }
            (Some(Value::Boolean(false) | Value::Nil), Some(Value::Error(e))) => super::is_memory_error(e),
            _ => false,
        };
        if out_of_memory {
            guard_state.out_of_memory();
            guard_state.check()?;
        }
        // A host function's error arrives as mlua's error value, a userdata whose `tostring` is a
        // Rust error chain with a traceback through the sandbox. The script gets its message: a
        // plain string, already placed at the script's line (see `api::function`), sanitised like
        // any message that leaves a script.
        if let (Some(Value::Boolean(false) | Value::Nil), Some(Value::Error(e))) = (results.front(), results.get(1)) {
            let message = super::sanitize(e, &guard_state.info);
            results[1] = Value::String(lua.create_string(message)?);
        }
        Ok(results)
    })?;
    let libraries = lua.create_table()?;
    for name in ["string", "table"].iter().chain(LAZY_STD.iter()).chain(super::api::NAMES.iter()) {
        libraries.raw_set(*name, true)?;
    }
    let (big, big_args) = super::bounds::sized_checks(lua, state)?;
    lua.set_named_registry_value(RAW_XPCALL, globals.get::<Value>("xpcall")?)?;
    let locate = lua.create_function(locate)?;
    lua.set_named_registry_value(LOCATE, &locate)?;
    let (wrap_coroutine, new_env, wrap_sized, end_run): (Function, Function, Function, Function) =
        super::precompiled::function(lua, "sandbox", "=sandbox", || WRAPPERS.to_string(), None)?.call((
            guard,
            globals.get::<Value>("xpcall")?,
            globals.get::<Value>("load")?,
            globals.get::<Value>("collectgarbage")?,
            globals.get::<Value>("setmetatable")?,
            table_fn(&globals, "pack")?,
            table_fn(&globals, "unpack")?,
            globals.clone(),
            libraries,
            lua.create_function(|_, ()| Ok(seed()))?,
            super::bounds::checker(lua, state)?,
            {
                let state = Arc::clone(state);
                lua.create_function(move |lua, ()| Ok(state.run_memory(lua) as f64 / 1024.0))?
            },
            big,
            big_args,
            locate,
        ))?;
    lua.set_named_registry_value(WRAP_COROUTINE, wrap_coroutine)?;
    for library in ["string", "table", "_G"] {
        let table: Table = if library == "_G" { globals.clone() } else { globals.get(library)? };
        wrap_sized.call::<()>((table, sized_wrappers(lua, library)?))?;
    }
    lua.set_named_registry_value(WRAP_SIZED, wrap_sized)?;
    lua.set_named_registry_value(END_RUN, end_run)?;
    Ok(new_env)
}

/// The message handler of every protected call (the sandbox's `pcall`/`xpcall` and a call into a
/// script): a library function called from one of the sandbox's wrappers places its error at the
/// wrapper (`sandbox:40: bad argument #2 to 'rep'`), a place that means nothing to the script's
/// author. While the stack is still whole, that prefix becomes the script's own file and line.
/// Anything else (mlua's error values, tables, a script's own messages) passes unchanged.
fn locate(lua: &Lua, err: Value) -> mlua::Result<Value> {
    // Long messages keep their prefix rather than be copied: they are the script's own.
    const LONGEST: usize = 4096;
    let Value::String(message) = &err else { return Ok(err) };
    let bytes = message.as_bytes();
    if bytes.len() > LONGEST {
        return Ok(err);
    }
    for prefix in [&b"sandbox:"[..], b"[string patterns]:"] {
        let Some(rest) = bytes.strip_prefix(prefix) else { continue };
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || !rest[digits..].starts_with(b": ") {
            continue;
        }
        let mut placed = super::api::script_location(lua).into_bytes();
        placed.extend_from_slice(&rest[digits + 2..]);
        return Ok(Value::String(lua.create_string(placed)?));
    }
    Ok(err)
}

/// Standard libraries loaded on first use.
const LAZY_STD: [&str; 4] = ["math", "utf8", "coroutine", "os"];

/// Loads a standard library the first time a script touches its global, curated like the rest.
/// Returns false for names that are not lazily loaded libraries. Loading only `table` and
/// `string` up front halves the cost of a fresh VM.
pub(super) fn load_std(lua: &Lua, name: &[u8]) -> mlua::Result<bool> {
    let globals = lua.globals();
    match name {
        b"math" => lua.load_std_libs(mlua::StdLib::MATH)?,
        b"utf8" => {
            lua.load_std_libs(mlua::StdLib::UTF8)?;
            let utf8: Table = globals.raw_get("utf8")?;
            globals.raw_set("utf8", Value::Nil)?;
            let wrap: Function = lua.named_registry_value(WRAP_SIZED)?;
            wrap.call::<()>((&utf8, sized_wrappers(lua, "utf8")?))?;
            globals.raw_set("utf8", utf8)?;
        }
        // Both are taken out of the globals before they are curated, and put back only once
        // curated: a failure half-way (the memory cap, the deadline) leaves no raw library behind.
        b"coroutine" => {
            lua.load_std_libs(mlua::StdLib::COROUTINE)?;
            let co: Table = globals.raw_get("coroutine")?;
            globals.raw_set("coroutine", Value::Nil)?;
            let wrap: mlua::Function = lua.named_registry_value(WRAP_COROUTINE)?;
            wrap.call::<()>(&co)?;
            globals.raw_set("coroutine", co)?;
        }
        b"os" => {
            lua.load_std_libs(mlua::StdLib::OS)?;
            // Keep the clock functions only.
            let os: Table = globals.raw_get("os")?;
            globals.raw_set("os", Value::Nil)?;
            let safe_os = lua.create_table_with_capacity(0, 4)?;
            for name in ["time", "clock", "date", "difftime"] {
                safe_os.raw_set(name, os.raw_get::<Value>(name)?)?;
            }
            let wrap: Function = lua.named_registry_value(WRAP_SIZED)?;
            wrap.call::<()>((&safe_os, sized_wrappers(lua, "os")?))?;
            globals.raw_set("os", safe_os)?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Two seeds for `math.randomseed`, different for every run: Lua's own seed (the time and an
/// address) repeats for runs of a reused VM within one second.
fn seed() -> (i64, i64) {
    use std::hash::{BuildHasher, Hasher};
    // Static: a seed counter: no two runs in the process, of any application, may get the same seeds.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    hasher.write_u128(nanos);
    let a = hasher.finish();
    hasher.write_u64(a);
    (a as i64, hasher.finish() as i64)
}

fn table_fn(globals: &Table, name: &str) -> mlua::Result<Value> {
    globals.get::<Table>("table")?.get(name)
}

/// One library's sized wrappers (see `bounds::sized_wrappers`) as a function of the library and
/// the checks, with no globals to reach.
fn sized_wrappers(lua: &Lua, library: &'static str) -> mlua::Result<Function> {
    let source =
        || format!("local lib, big, big_args, type, rawlen, select = ...\n{}", super::bounds::sized_wrappers(library));
    super::precompiled::function(lua, library, "=sandbox", source, Some(lua.create_table()?))
}
