//! The most work one call into C may do, for every function a script can reach.
//!
//! The deadline hook only runs between VM instructions (every [`HOOK_EVERY`](super) of them), so
//! a single instruction or library call that loops in C is invisible to it. Each function below
//! was checked for the most work one call can do, and that work is bounded *before* the call:
//! by the run's memory cap (what the call must allocate), by an explicit check here, or by a Lua
//! reimplementation that the hook governs. Lengths below are in bytes; "cap" is the run's
//! memory cap (64 MiB by default), and "C speed" means memcpy/memcmp-like throughput (a 64 MiB
//! pass is a few ms).
//!
//! | Function | Worst case of one call | Bound |
//! |---|---|---|
//! | `string.rep(s, n, sep)` | n iterations, even when `s` and `sep` are empty (no allocation) | empty pieces answer `""` at once; the result size is checked against the memory left before the call |
//! | `string.find/match/gmatch/gsub` | backtracking: O(len^k) for k quantifiers | matched by `pattern.rs`, which checks the deadline every few thousand steps |
//! | `string.format`, `byte`, `char`, `sub`, `upper`, `lower`, `reverse`, `len`, `pack`, `unpack`, `packsize` | O(input + output) | output allocates against the cap; `byte`/`unpack` results are capped by Lua's 1M-slot stack |
//! | `<`, `<=` on strings (and `table.sort` without a comparator) | one `strcoll` per NUL-separated segment: 64 MiB of NULs is 8M calls, ~0.4 s per comparison | [`strcoll`] below, which polls the run's deadline and stops comparing once it has passed |
//! | `==` on long strings, table keys | one memcmp / hash pass, C speed | the cap, and the hook every 256 instructions (256 x 64 MiB memcmp ~ 0.5 s) |
//! | `..` (concat) | O(result) | the result allocates against the cap |
//! | `table.move(a1, f, e, t)` | e - f + 1 iterations, none of which needs to allocate | the range is checked against what the cap could hold (cap / 16 elements) |
//! | `table.insert/remove` | O(#t), and `#t` comes from a `__len` metamethod that may return `math.maxinteger` | plain tables go to C (`#t` is then the real border, bounded by the cap); tables with a metatable run a Lua version the hook governs |
//! | `table.concat(t, sep, i, j)` | j - i + 1 iterations | a missing element stops it at once; present elements and the result are bounded by the cap |
//! | `table.unpack(t, i, j)` | j - i + 1 iterations | Lua refuses more than its stack (1M slots) |
//! | `table.sort(t)` | n log n comparisons, n = `#t` < 2^31 | elements must exist (nil comparisons raise); string comparisons stop once the deadline passes ([`strcoll`]); a Lua comparator is governed by the hook |
//! | `load(chunk)` | parsing in C, O(#chunk) | chunks over [`MAX_LOAD`] are refused; reader functions are Lua and hooked |
//! | `select`, `tostring`, `tonumber`, `next`, `pairs`, `ipairs`, `rawlen`, `rawequal`, `rawget`, `rawset`, `type`, `getmetatable`, `setmetatable`, `error`, `assert` | O(1), or O(length) of one string at C speed | the cap |
//! | `collectgarbage("collect"/"step"/"count")` | one full cycle, O(heap): ~50 ms at 64 MiB | the heap is bounded by the cap; each call checks the deadline first (`count` collects too, see item 14) |
//! | `math.*`, `utf8.*`, `os.time/clock/date/difftime` | O(1), or O(length) of one string | the cap |
//! | `coroutine.*` | O(1) | resumed code is hooked (the hook is global) |
//! | `context.state.get/set` (connectors) | one key lookup; `set` converts its value and re-measures the whole state, O(64 KiB) | keys over 256 bytes are refused before they are copied; the value converts against the state's 64 KiB limit and stops there; a state over 64 KiB is refused whole |
//! | the message handler of every protected call (`guard::locate`), and `tostring`/`string.format` of a host error | one pass over the message and at most 32 stack frames | messages over 4 KiB pass unchanged; host error messages are cut to 4 KiB (`api::fail`) |
//! | `context.call(name, params)` (tools, agents) | the callee's whole run, which blocks this one | names over 256 bytes are refused before they are copied; parameters convert against 4 MiB; the callee gets this run's cancel handle ending at this run's deadline ([`super::CancelHandle::until`]), so it stops when this run's time is up; chains stop at 16 deep or a tool's third time on them |
//! | code mode: a tool function (`ctx.x(args)`, `server.x(args)`, `mcp[s][t](args)`) | converting its arguments, one admission check, starting a task | arguments convert against 4 MiB, and with every result still held against the memory cap; `max_calls` per run; at most 16 runs server-wide (`code::run::MAX_RUNS`) |
//! | code mode: reading `p.await` on a pending call | the script's line, from at most 32 stack frames (`lua::api::line_in`), and one small function that checks it was called with `:` | constant work, under the hook; the functions are Lua values, collected under the memory cap (a loop reading it stops at the deadline; 200,000 reads then `:await()`: `code_mode_upstream` tests) |
//! | code mode: `:await()`, `await_all` | waiting for the call; running a put-off call here; its result into Lua | waits end at the deadline (checked every 20 ms); a put-off call runs here only inline (1 ms budget), else on the runtime; the result converts into Lua against the cap; results held in Rust count against the cap (twice their JSON) until taken |
//! | code mode: `result(v)`, the script's return | the value to JSON, then cut to `max_output_bytes` | a small value converts whole (to twice `max_output_bytes`); a larger one is measured without being built (up to the memory cap's size, 8 bytes per value visited, each key counted before the walk goes down, 128 levels, places in messages cut to 256 bytes) and converted only as far as it is kept, so the JSON built stays near `max_output_bytes` (55 MB of JSON in about 10 MB of Lua: the server's peak +27 MB, +123 MB as a review measured it before; an 8 MiB key at each of 127 levels: refused in 0.08 s, 5.9 s and +2.1 GB before, as the review measured); an object keeps only the keys that can fit, held in Rust (six nested objects of 200,000 keys: cut in 3.5 s); all of it runs under the run's deadline (`Vm::bounded`): 2^100 paths through 100 shared tables stop at a 1 s timeout, or are refused in 2.5–2.9 s at the default 30 s; a script never starts another script, so no run multiplies this; cutting counts each part once (60 MB nested 128 deep: 91 ms, `code::outcome` tests) |
//! | code mode: `list_servers`, `list_tools`, `describe_tool`, `search_tools`, and `ctx[k]`/`mcp[k]` lookups | O(tools x key) lookups and suggestions; the first search builds an FTS5 index of every tool | keys over 1024 bytes are refused before they are copied; 3000 tools with 1024-byte worst-case keys: describe <= 0.6 ms, first search 7 ms (index included), list < 0.1 ms; `describe_tool`'s answer (parameter descriptions, and the schemas when asked or when the signature cuts them) is at most about twice its tool's entry, whose JSON is at most 256 KiB for an upstream tool: 458 KB for a 250 KB entry in 0.3-0.4 ms, converted into Lua against the memory cap; its second argument is read as Lua truthiness (`code::catalog` tests) |
//! | code mode: `tostring` of a failed call's error table | formatting its message | the message was cut to 4 KiB when the table was built |
//! | `context.search(q, {mode = "semantic" / "hybrid"})` (tools, agents) | embedding the query (O(tokens)); a scan of every vector (about 1 ms at 10k, 35 ms at 1M on 2 cores); the first search after a write reloads the in-memory copy (about 25 ms per 10k vectors; at 200k vectors and up it reloads in the background, except a process's very first search, which reads them all: 3.8 s at 1M) | the query is checked against the search schema (4,096 characters) before any work, and tokens past 8,192 are not read; the call runs where blocking is allowed ([`RunState::check_blocking`](super::RunState)) and the deadline is checked when it returns; the index size is the operator's, not the script's, so that first load is the one cost a script can start but not size |
//! | host APIs (`json`, `http`, `base64`, `crypto`, `fs`, `env`, `log`, `sleep`, `progress`, `MCP`, `require`, the knowledge base) | see each module | inline runs escalate before large data; conversions count their size against the cap before they build anything; blocking calls end at the deadline; an error message quotes at most 200 characters of an argument and is cut to 4 KiB (`api::fail`), and a path over 4096 bytes is refused before it is copied |
//!
//! Whatever this table misses is caught by the last line of defence: a call whose run overruns
//! its deadline by a margin is abandoned by its caller and its tool quarantined (see
//! `tools::stuck`), and loading runs under a watchdog ([`super::watchdog`]).

use std::cell::RefCell;
use std::os::raw::{c_char, c_int};
use std::sync::{Arc, Weak};

use mlua::{Lua, Value};

use super::RunState;

/// The largest chunk `load` compiles: parsing runs in C with no hook, at roughly 50-100 MB/s.
pub const MAX_LOAD: usize = 4 * 1024 * 1024;

/// How many elements one table-moving call may touch, per byte of memory cap: a Lua array slot
/// takes 16 bytes, so a larger range cannot be backed by real elements.
const BYTES_PER_ELEMENT: usize = 16;

/// The most elements an inline run may move in one call before it escalates.
const INLINE_ELEMENTS: i64 = 4096;

// Static: per thread, the Lua run this thread executes now; holds nothing of a config.
thread_local! {
    /// The run executing Lua on this thread, for [`strcoll`], which has no other way to find it.
    static CURRENT: RefCell<Weak<RunState>> = const { RefCell::new(Weak::new()) };
    /// Counts `strcoll` calls between deadline checks.
    static CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// The current run was found stopped: every comparison answers at once until the next run
    /// (`table.sort` goes on comparing millions of times after the deadline).
    static STOPPED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks `state` as the run executing on this thread until the guard drops (then the previous
/// one is back, so a run nested in a host call hands the thread back correctly).
pub(crate) fn enter(state: &Arc<RunState>) -> Entered {
    let previous = CURRENT.with(|c| c.replace(Arc::downgrade(state)));
    let _ = STOPPED.try_with(|s| s.set(false));
    Entered { previous }
}

pub(crate) struct Entered {
    previous: Weak<RunState>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let previous = std::mem::take(&mut self.previous);
        let _ = CURRENT.try_with(|c| c.replace(previous));
        let _ = STOPPED.try_with(|s| s.set(false));
    }
}

/// Whether the run on this thread has been stopped (deadline, cancel, memory, escalation).
pub(crate) fn current_run_stopped() -> bool {
    let stopped = CURRENT.try_with(|c| c.borrow().upgrade()).ok().flatten().is_some_and(|state| state.check().is_err());
    if stopped {
        let _ = STOPPED.try_with(|s| s.set(true));
    }
    stopped
}

/// What a comparison in a stopped run answers: "less". `table.sort` then runs its scan off the
/// end of the array within one pass and raises "invalid order function for sorting", where
/// "greater" would let it finish all n log n comparisons first.
const STOPPED_ORDER: c_int = -1;

/// How many bytes `strcoll` compares between two looks at the deadline.
const CHUNK: usize = 64 * 1024;
/// How many `strcoll` calls (one per NUL-separated segment) pass between two looks.
const CALLS_PER_CHECK: u32 = 1024;

extern "C" {
    fn strnlen(s: *const c_char, max: usize) -> usize;
    fn memcmp(a: *const std::ffi::c_void, b: *const std::ffi::c_void, n: usize) -> c_int;
}

/// Lua's string comparison (`l_strcmp` in lvm.c) calls `strcoll` once per NUL-separated segment
/// of its operands, all inside one VM instruction, so 64 MiB of NUL bytes costs 8M calls and
/// about 0.4 s with no hook in between; `table.sort` makes millions of such comparisons in one
/// call. ctx defines `strcoll` itself so that the comparison can stop: it polls the run's
/// deadline every [`CALLS_PER_CHECK`] calls and every [`CHUNK`] bytes, and once the run is stopped
/// it answers [`STOPPED_ORDER`] at once. The result of a comparison in a stopped run is meaningless,
/// and nothing sees it: the run raises at its next hook.
///
/// ctx never calls `setlocale`, so the process runs in the C locale, where `strcoll` is
/// `strcmp`: this is `strcmp` (unsigned bytes, up to the first NUL), compared a chunk at a time.
///
/// # Safety
/// `a` and `b` must be NUL-terminated strings, as for the C function.
#[no_mangle]
pub unsafe extern "C" fn strcoll(a: *const c_char, b: *const c_char) -> c_int {
    // try_with: a panic here would cross the C boundary; a thread being torn down just compares.
    if STOPPED.try_with(|s| s.get()).unwrap_or(false) {
        return STOPPED_ORDER;
    }
    let calls = CALLS
        .try_with(|c| {
            let n = c.get().wrapping_add(1);
            c.set(n);
            n
        })
        .unwrap_or(1);
    if calls.is_multiple_of(CALLS_PER_CHECK) && current_run_stopped() {
        return STOPPED_ORDER;
    }
    let (mut a, mut b) = (a, b);
    loop {
        // SAFETY: both are NUL-terminated; strnlen stops at the NUL or after CHUNK bytes, and
        // memcmp reads only bytes before either NUL.
        let (la, lb) = (strnlen(a, CHUNK), strnlen(b, CHUNK));
        let n = la.min(lb);
        let order = memcmp(a.cast(), b.cast(), n);
        if order != 0 {
            return order;
        }
        if n < CHUNK {
            // One of them ends here (maybe both): its NUL sorts first.
            return c_int::from(*a.add(n) as u8) - c_int::from(*b.add(n) as u8);
        }
        a = a.add(CHUNK);
        b = b.add(CHUNK);
        if current_run_stopped() {
            return STOPPED_ORDER;
        }
    }
}

/// Keeps the linker from dropping [`strcoll`] when nothing in Rust names it: Lua's objects
/// reference it, and an unreferenced Rust definition could lose to libc's.
pub(crate) fn keep_strcoll() -> usize {
    strcoll as *const () as usize
}

/// The length Lua gives a value that a string function coerces: strings, and numbers through
/// `tostring` (at least one byte). `None` for anything else (Lua raises its own argument error).
fn coerced_len(value: &Value) -> Option<usize> {
    match value {
        Value::String(s) => Some(s.as_bytes().len()),
        Value::Integer(i) => Some(i.to_string().len()),
        Value::Number(_) => Some(1),
        Value::Nil => Some(0),
        _ => None,
    }
}

/// An integer argument as `luaL_checkinteger` reads it (Lua's own coercion: hex strings, floats
/// with an integer value), or `None` when Lua would raise its own argument error.
fn integer(lua: &Lua, value: &Value) -> Option<i64> {
    lua.coerce_integer(value.clone()).ok().flatten()
}

/// Checks for the sandbox's `string.rep`, `table.move` and `load` wrappers (see the guard chunk).
/// Each returns `true` when the wrapper should answer at once without calling C (an empty
/// repetition), raises when the call would exceed a limit, and escalates an inline run before
/// large work.
pub(super) fn checker(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<mlua::Function> {
    let _ = keep_strcoll();
    let state = Arc::clone(state);
    lua.create_function(move |lua, (what, a, b, c): (mlua::LuaString, Value, Value, Value)| {
        match what.as_bytes().as_ref() {
            b"rep" => {
                let (Some(piece), Some(count), Some(sep)) = (coerced_len(&a), integer(lua, &b), coerced_len(&c)) else {
                    return Ok(false); // let Lua raise its own argument error
                };
                if count <= 0 {
                    return Ok(false);
                }
                if piece + sep == 0 {
                    return Ok(true);
                }
                let total = (count as u128) * (piece as u128) + (count as u128 - 1) * (sep as u128);
                // What the allocation would do anyway, without first looping over the pieces.
                if total > state.memory_left(lua) as u128 {
                    state.out_of_memory();
                    state.check()?;
                }
                state.check_data(total as usize)?;
                Ok(false)
            }
            b"move" | b"concat" => {
                let name = if what.as_bytes().as_ref() == b"move" { "table.move" } else { "table.concat" };
                let (Some(first), Some(last)) = (integer(lua, &a), integer(lua, &b)) else { return Ok(false) };
                if last < first {
                    return Ok(false);
                }
                let count = (last as i128) - (first as i128) + 1;
                let most = (state.limits.memory_bytes / BYTES_PER_ELEMENT) as i128;
                if count > most {
                    let message = format!(
                        "{name}: a range of {count} elements is more than this script's memory limit could hold (at most {most})"
                    );
                    return Err(super::api::located(lua, name, super::api::fail(message)));
                }
                if count > i128::from(INLINE_ELEMENTS) {
                    state.check_blocking()?;
                }
                Ok(false)
            }
            b"load" => {
                // A string chunk, or the running total of what a reader function returned.
                let size = match &a {
                    Value::Integer(n) => *n as usize,
                    other => coerced_len(other).unwrap_or(0),
                };
                if size > MAX_LOAD {
                    let message =
                        format!("load: the chunk is {size} bytes; the sandbox compiles at most {MAX_LOAD} bytes at a time");
                    return Err(super::api::located(lua, "load", super::api::fail(message)));
                }
                state.check_data(size)?;
                Ok(false)
            }
            // collectgarbage: each call may be a full cycle over the heap (up to the cap), so a
            // loop of them must not run 256 cycles between two looks at the deadline.
            b"gc" => state.check().map(|_| false),
            // Whether a function is a C function: C functions handed to C loops as comparators
            // or metamethods run without a Lua instruction, so the hook never sees them.
            b"native" => Ok(matches!(&a, Value::Function(f) if f.info().what == "C")),
            _ => Ok(false),
        }
    })
}

/// Inputs above this size (bytes, or elements times 16) make a wrapped function look at the
/// deadline before it runs; an inline run escalates instead.
const BIG: usize = 64 * 1024;

/// Functions whose one call does work proportional to an input (a byte loop, an element loop):
/// `(library, name, what measures the work)`. Each gets a wrapper that, for a big input, checks
/// the deadline first, so a loop of such calls stops within one call of it. The hook alone would
/// let 256 of them run (256 calls of `utf8.len` on 24 MiB is about 8 s). Not listed: functions
/// whose work is their argument count (`select`, `string.char`, `utf8.char`: the caller already
/// paid that to pass them), O(1) ones (`len`), and copies at memcpy speed (`sub`).
const SIZED: [(&str, &str, Measure); 15] = [
    ("string", "packsize", Measure::FirstString),
    ("os", "date", Measure::FirstString),
    ("string", "upper", Measure::FirstString),
    ("string", "lower", Measure::FirstString),
    ("string", "reverse", Measure::FirstString),
    ("string", "byte", Measure::FirstString),
    ("string", "unpack", Measure::Arguments),
    ("string", "format", Measure::Arguments),
    ("string", "pack", Measure::Arguments),
    ("_G", "tonumber", Measure::FirstString),
    ("table", "sort", Measure::FirstTable),
    ("table", "unpack", Measure::Range),
    ("utf8", "len", Measure::FirstString),
    ("utf8", "offset", Measure::FirstString),
    ("utf8", "codepoint", Measure::FirstString),
];

#[derive(Clone, Copy)]
enum Measure {
    /// The length of the first argument, when it is a string (checked in Lua, cheaply).
    FirstString,
    /// The raw length of the first argument, when it is a table.
    FirstTable,
    /// `t, i, j`: the range, else the table's raw length.
    Range,
    /// Every argument: string lengths and the argument count (checked in Rust).
    Arguments,
}

/// The Lua source of the wrappers for one library (`_G` means the base functions). `big(n)` and
/// `big_args(...)` are locals of the enclosing chunk; `lib` is the library table.
pub(super) fn sized_wrappers(library: &str) -> String {
    let mut out = String::new();
    let entries = SIZED.iter().filter(|(lib, _, _)| *lib == library);
    for (_, name, measure) in entries {
        // Each original keeps a local of its own name, so its argument errors still name it.
        let check = match measure {
            Measure::FirstString => format!("if type(a) == \"string\" and #a > {BIG} then big(#a) end"),
            Measure::FirstTable => {
                format!("if type(a) == \"table\" and rawlen(a) > {} then big(rawlen(a) * 16) end", BIG / 16)
            }
            Measure::Range => format!(
                "local i, j = ... local n = (type(j) == \"number\" and type(i) == \"number\") and j - i or (type(a) == \"table\" and rawlen(a) or 0) if n > {} then big(n * 16) end",
                BIG / 16
            ),
            Measure::Arguments => "big_args(a, ...)".to_string(),
        };
        out.push_str(&format!(
            "do local {name} = lib.{name} if {name} then lib.{name} = function(a, ...) {check} return select(1, {name}(a, ...)) end end end\n"
        ));
    }
    if library == "utf8" {
        // The iterator `codes` returns skips continuation bytes in C, so one call can scan a
        // whole string, and a script may call it directly on any string: hand out a Lua one.
        out.push_str(&format!(
            "do local codes = lib.codes lib.codes = function(s, ...) local step, state, control = codes(s, ...) \
             return function(a, b) if type(a) == \"string\" and #a > {BIG} then big(#a) end return step(a, b) end, state, control end end\n"
        ));
    }
    out
}

/// `big(n)` and `big_args(...)` for the wrappers: past [`BIG`], an inline run escalates and any
/// other run checks its deadline before the work.
pub(super) fn sized_checks(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<(mlua::Function, mlua::Function)> {
    let one = Arc::clone(state);
    let big = lua.create_function(move |_, n: f64| one.check_data(n.max(0.0) as usize))?;
    let all = Arc::clone(state);
    let big_args = lua.create_function(move |_, args: mlua::MultiValue| {
        let mut work = args.len() * 16;
        for value in args.iter() {
            if let Value::String(s) = value {
                work += s.as_bytes().len();
            }
        }
        if work > BIG {
            all.check_data(work)?;
        }
        Ok(())
    })?;
    Ok((big, big_args))
}
