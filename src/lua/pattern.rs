//! Lua 5.4's pattern matching (`string.find`, `match`, `gmatch`, `gsub`), ported from lstrlib.c
//! so that a deadline can stop a match.
//!
//! In C these functions are one long loop that the instruction hook never interrupts: a
//! backtracking pattern such as `".-.-.-.-b"` over a long subject runs for minutes. This port
//! gives Lua 5.4.9's answers and error messages (C locale, bytes not characters), and adds a step
//! budget: every [`CHECK_EVERY`] steps it calls a check callback, and an error from the callback
//! stops the match at once and becomes the Lua error. A step is a small piece of work whose cost
//! does not grow with the input: one call of the matcher, one repetition of a quantifier, or a
//! scan of at most [`SCAN_CHUNK`] bytes (a plain search, a `%b` balance, a set, a back-reference,
//! a piece of a replacement).
//!
//! Each function is a Rust function behind a two-line Lua wrapper. The wrapper exists for the
//! errors: a Rust function can only raise mlua's error userdata, while C Lua raises a string
//! with the caller's position (`input:3: malformed pattern ...`), and scripts match on it.
//! So the Rust side answers `true, results...` or `false, error, level`, and the wrapper calls
//! `error(error, level)`.
//!
//! Known differences from C Lua, all in error texts: when the call is a tail call
//! (`return s:find(p)`), an error names the function where `package.loaded` holds it
//! (`string.find`, else `?`) and carries the position of the caller's caller, because Lua drops
//! the caller's frame for a tail call to a Lua function (not to a C one). A replacement buffer
//! that would pass the memory cap raises the string `"not enough memory"` as a runtime error
//! rather than with Lua's memory-error status.
//!
//! Not chunked: copying a result into a Lua string (a capture, the output of `gsub`), one copy
//! as large as the result, which the memory cap bounds.

use std::borrow::Cow;
use std::sync::Arc;

use mlua::{Function, Lua, LuaString, MultiValue, Table, Value};

/// At most this many captures in a pattern (`LUA_MAXCAPTURES`).
const MAX_CAPTURES: usize = 32;
/// How deep the matcher may recurse before "pattern too complex" (`MAXCCALLS`).
const MAX_CALLS: usize = 200;
/// The escape character of patterns and replacement strings (`L_ESC`).
const ESC: u8 = b'%';
/// How many steps pass between two calls of the check callback.
const CHECK_EVERY: u32 = 4096;
/// The most bytes one step may scan or copy.
const SCAN_CHUNK: usize = 256;

/// The check the matcher calls every [`CHECK_EVERY`] steps; an error stops the match.
pub(crate) type Check = Arc<dyn Fn() -> mlua::Result<()> + Send + Sync>;

/// The Lua side: error values become Lua errors at the right level, with the position of the
/// caller as C Lua gives it. `finish` is always reached by a tail call, so for `error` level 1 is
/// `finish` (in the frame of the wrapper) and level 2 is whoever called the wrapper.
const WRAPPERS: &str = r#"
local raw_find, raw_match, raw_gmatch, raw_gsub = ...
local error = error
local function finish(ok, ...)
  if ok then return ... end
  local value, level = ...
  error(value, level)
end
local function find(...) return finish(raw_find(...)) end
local function match(...) return finish(raw_match(...)) end
local function gsub(...) return finish(raw_gsub(...)) end
local function gmatch(...)
  local ok, next_match, level = raw_gmatch(...)
  if not ok then error(next_match, level) end
  return function() return finish(next_match()) end
end
return find, match, gmatch, gsub
"#;

/// Sets `find`, `match`, `gmatch` and `gsub` on `string` (a `string` library table) to this
/// port. `check` is called every few thousand steps of a match; its error stops the match.
///
/// A function replacement of `gsub` is called through the `pcall` of the globals at install
/// time, so its error reaches the script unchanged (the sandbox's `pcall`, which re-raises a
/// killed run, serves as well as Lua's).
pub(crate) fn install(lua: &Lua, string: &Table, check: Check) -> mlua::Result<()> {
    let pcall: Function = lua.globals().raw_get("pcall")?;
    // Indexing a table with a metatable may run `__index`; through `pcall`, its error stays the
    // value it was.
    let index = super::precompiled::function(
        lua,
        "patterns.index",
        "=[string patterns]",
        || "local t, k = ... return t[k]".to_string(),
        None,
    )?;
    let replace = Arc::new(Callers { pcall, index });

    let find_check = Arc::clone(&check);
    let raw_find =
        lua.create_function(move |lua, args: MultiValue| answer(lua, find_aux(lua, &args, true, &find_check)))?;
    let match_check = Arc::clone(&check);
    let raw_match =
        lua.create_function(move |lua, args: MultiValue| answer(lua, find_aux(lua, &args, false, &match_check)))?;
    let gmatch_check = Arc::clone(&check);
    let raw_gmatch =
        lua.create_function(move |lua, args: MultiValue| answer(lua, gmatch(lua, &args, &gmatch_check)))?;
    let raw_gsub = lua.create_function(move |lua, args: MultiValue| answer(lua, gsub(lua, &args, &check, &replace)))?;

    let (find, match_, gmatch_, gsub_): (Function, Function, Function, Function) =
        super::precompiled::function(lua, "patterns", "=[string patterns]", || WRAPPERS.to_string(), None)?
            .call((raw_find, raw_match, raw_gmatch, raw_gsub))?;
    string.raw_set("find", find)?;
    string.raw_set("match", match_)?;
    string.raw_set("gmatch", gmatch_)?;
    string.raw_set("gsub", gsub_)?;
    Ok(())
}

/// Why a pattern function did not return results.
enum Failure {
    /// An error C Lua raises with `luaL_error`: a string with the caller's position.
    Lua(String),
    /// An error value raised by Lua code the match called (a replacement function, an
    /// `__index`): raised again unchanged.
    Raised(Value),
    /// A replacement would pass the memory cap, as Lua's buffer would have.
    OutOfMemory,
    /// The check callback stopped the match, or mlua failed: passed on as mlua's error.
    Host(mlua::Error),
}

impl From<mlua::Error> for Failure {
    fn from(err: mlua::Error) -> Self {
        Failure::Host(err)
    }
}

/// Turns a result into what the Lua wrapper expects: `true, results...` or
/// `false, error, level`.
fn answer(lua: &Lua, result: Result<MultiValue, Failure>) -> mlua::Result<MultiValue> {
    let (value, level) = match result {
        Ok(mut values) => {
            values.push_front(Value::Boolean(true));
            return Ok(values);
        }
        Err(Failure::Lua(msg)) => (Value::String(lua.create_string(msg)?), 2),
        Err(Failure::Raised(value)) => (value, 0),
        Err(Failure::OutOfMemory) => (Value::String(lua.create_string("not enough memory")?), 0),
        Err(Failure::Host(err)) => return Err(err),
    };
    Ok(MultiValue::from_iter([Value::Boolean(false), value, Value::Integer(level)]))
}

/// Counts steps and calls the check every [`CHECK_EVERY`] of them.
struct Budget<'c> {
    left: u32,
    check: &'c (dyn Fn() -> mlua::Result<()> + Send + Sync),
}

impl<'c> Budget<'c> {
    fn new(check: &'c Check) -> Self {
        Budget { left: CHECK_EVERY, check: check.as_ref() }
    }

    #[inline(always)]
    fn step(&mut self) -> Result<(), Failure> {
        if self.left == 0 {
            return self.refill();
        }
        self.left -= 1;
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn refill(&mut self) -> Result<(), Failure> {
        self.left = CHECK_EVERY - 1;
        (self.check)().map_err(Failure::Host)
    }
}

// ---------------------------------------------------------------------------------------------
// Arguments, checked and named as lauxlib does.

/// The arguments of one call, read as `luaL_check*` reads them.
struct Args<'l> {
    lua: &'l Lua,
    values: &'l MultiValue,
}

impl<'l> Args<'l> {
    fn get(&self, n: usize) -> Option<&'l Value> {
        self.values.get(n - 1)
    }

    /// `luaL_checklstring`: a string, or a number converted as Lua converts it.
    fn string(&self, n: usize) -> Result<Cow<'l, LuaString>, Failure> {
        match self.get(n) {
            Some(Value::String(s)) => Ok(Cow::Borrowed(s)),
            Some(v @ (Value::Integer(_) | Value::Number(_))) => match self.lua.coerce_string(v.clone())? {
                Some(s) => Ok(Cow::Owned(s)),
                None => Err(self.type_error(n, "string")),
            },
            _ => Err(self.type_error(n, "string")),
        }
    }

    /// `luaL_optinteger`: `default` when absent or nil.
    fn opt_integer(&self, n: usize, default: i64) -> Result<i64, Failure> {
        let value = match self.get(n) {
            None | Some(Value::Nil) => return Ok(default),
            Some(Value::Integer(i)) => return Ok(*i),
            Some(v) => v.clone(),
        };
        if let Some(i) = self.lua.coerce_integer(value.clone())? {
            return Ok(i);
        }
        if self.lua.coerce_number(value)?.is_some() {
            Err(self.arg_error(n, "number has no integer representation"))
        } else {
            Err(self.type_error(n, "number"))
        }
    }

    /// `lua_toboolean`.
    fn truthy(&self, n: usize) -> bool {
        !matches!(self.get(n), None | Some(Value::Nil) | Some(Value::Boolean(false)))
    }

    /// `luaL_typeerror`.
    fn type_error(&self, n: usize, expected: &str) -> Failure {
        let got = match self.get(n) {
            None => "no value".to_string(),
            Some(value) => type_name_for_message(value),
        };
        self.arg_error(n, &format!("{expected} expected, got {got}"))
    }

    /// `luaL_argerror`. The function C Lua names is the one running; here that is the Lua
    /// wrapper around this Rust function, one level up.
    fn arg_error(&self, n: usize, extra: &str) -> Failure {
        let msg = self.lua.inspect_stack(1, |frame| {
            let names = frame.names();
            let mut n = n;
            let name = names.name.map(|name| name.into_owned());
            if names.name_what == Some("method") {
                n -= 1; // `self` does not count
                if n == 0 {
                    return format!("calling '{}' on bad self ({extra})", name.as_deref().unwrap_or("?"));
                }
            }
            let name = name.or_else(|| global_name(self.lua, &frame.function())).unwrap_or_else(|| "?".into());
            format!("bad argument #{n} to '{name}' ({extra})")
        });
        Failure::Lua(msg.unwrap_or_else(|| format!("bad argument #{n} ({extra})")))
    }
}

/// `pushglobalfuncname`: where `package.loaded` holds the function (`string.find`), so that a
/// function called with no name of its own (from `pcall`, or as a tail call) is still named.
fn global_name(lua: &Lua, func: &Function) -> Option<String> {
    let loaded: Table = lua.named_registry_value("_LOADED").ok()?;
    let target = func.to_pointer();
    let mut found = None;
    for pair in loaded.pairs::<Value, Value>() {
        let Ok((Value::String(module), value)) = pair else { continue };
        if value.to_pointer() == target {
            found = Some(module.to_string_lossy());
            break;
        }
        let Value::Table(table) = value else { continue };
        let field = table.pairs::<Value, Value>().find_map(|pair| match pair {
            Ok((Value::String(field), value)) if value.to_pointer() == target => Some(field.to_string_lossy()),
            _ => None,
        });
        if let Some(field) = field {
            found = Some(format!("{}.{field}", module.to_string_lossy()));
            break;
        }
    }
    found.map(|name| name.strip_prefix("_G.").map(str::to_string).unwrap_or(name))
}

/// The type in an argument error: the metatable's `__name` if it is a string, as
/// `luaL_typeerror` says.
fn type_name_for_message(value: &Value) -> String {
    let name = match value {
        Value::Table(t) => t.metatable().and_then(|mt| mt.raw_get::<Value>("__name").ok()),
        Value::UserData(ud) => ud.metatable().ok().and_then(|mt| mt.get::<Value>("__name").ok()),
        _ => None,
    };
    match (name, value) {
        (Some(Value::String(name)), _) => name.to_string_lossy(),
        (_, Value::LightUserData(_)) => "light userdata".to_string(),
        _ => type_name(value).to_string(),
    }
}

/// `luaL_typename`.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil",
        Value::Boolean(_) => "boolean",
        Value::Integer(_) | Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Table(_) => "table",
        Value::Function(_) => "function",
        Value::Thread(_) => "thread",
        _ => "userdata",
    }
}

/// `posrelatI`: a 1-based start position from an argument that may count from the end, clipped
/// to 1 below (and unbounded above).
fn start_position(pos: i64, len: usize) -> u64 {
    let len = len as i64;
    if pos > 0 {
        pos as u64
    } else if pos == 0 || pos < -len {
        1
    } else {
        (len + pos + 1) as u64
    }
}

/// The 0-based offset to start at, or `None` when it lies past the end of the subject.
fn start_offset(pos: i64, len: usize) -> Option<usize> {
    let offset = start_position(pos, len) - 1;
    usize::try_from(offset).ok().filter(|&offset| offset <= len)
}

// ---------------------------------------------------------------------------------------------
// The matcher: lstrlib.c's `match` and its helpers, over bytes.

#[derive(Clone, Copy, PartialEq, Eq)]
enum CaptureLen {
    /// Opened by `(` and not yet closed (`CAP_UNFINISHED`).
    Unfinished,
    /// A position capture `()` (`CAP_POSITION`).
    Position,
    Closed(usize),
}

#[derive(Clone, Copy)]
struct Capture {
    start: usize,
    len: CaptureLen,
}

/// A capture as a result: text of the subject, or a position.
enum CaptureValue {
    Text(usize, usize),
    Position(usize),
}

/// `MatchState`. Offsets index `src` and `pat`; the byte at an offset equal to the length reads
/// as `\0`, as it does in C where strings end with one.
struct Matcher<'a> {
    src: &'a [u8],
    /// The pattern after a leading `^` anchor.
    pat: &'a [u8],
    /// Calls of `do_match` left before "pattern too complex" (`matchdepth`).
    depth: usize,
    level: usize,
    captures: [Capture; MAX_CAPTURES],
    budget: Budget<'a>,
}

impl<'a> Matcher<'a> {
    fn new(src: &'a [u8], pat: &'a [u8], budget: Budget<'a>) -> Self {
        Matcher {
            src,
            pat,
            depth: MAX_CALLS,
            level: 0,
            captures: [Capture { start: 0, len: CaptureLen::Unfinished }; MAX_CAPTURES],
            budget,
        }
    }

    /// `reprepstate`: ready for a match at a new position.
    fn reset(&mut self) {
        self.depth = MAX_CALLS;
        self.level = 0;
    }

    #[inline(always)]
    fn p(&self, i: usize) -> u8 {
        self.pat.get(i).copied().unwrap_or(0)
    }

    #[inline(always)]
    fn s(&self, i: usize) -> u8 {
        self.src.get(i).copied().unwrap_or(0)
    }

    /// `classend`: the end of the single-character class at `p`.
    fn class_end(&mut self, p: usize) -> Result<usize, Failure> {
        let end = self.pat.len();
        let c = self.p(p);
        let mut p = p + 1;
        if c == ESC {
            if p >= end {
                return Err(Failure::Lua("malformed pattern (ends with '%')".into()));
            }
            return Ok(p + 1);
        }
        if c != b'[' {
            return Ok(p);
        }
        if self.p(p) == b'^' {
            p += 1;
        }
        let mut scanned = 0;
        loop {
            // Like C, the first character after `[` or `[^` is part of the set even if it is `]`.
            if p >= end {
                return Err(Failure::Lua("malformed pattern (missing ']')".into()));
            }
            let c = self.p(p);
            p += 1;
            if c == ESC && p < end {
                p += 1; // skip escapes (e.g. '%]')
            }
            scanned += 1;
            if scanned == SCAN_CHUNK {
                scanned = 0;
                self.budget.step()?;
            }
            if self.p(p) == b']' {
                return Ok(p + 1);
            }
        }
    }

    /// `matchbracketclass`: whether `c` is in the set from `[` at `p` to `]` at `ec`.
    fn bracket_class(&mut self, c: u8, p: usize, ec: usize) -> Result<bool, Failure> {
        let mut p = p;
        let mut found = true;
        if self.p(p + 1) == b'^' {
            found = false;
            p += 1;
        }
        let mut scanned = 0;
        loop {
            p += 1;
            if p >= ec {
                return Ok(!found);
            }
            scanned += 1;
            if scanned == SCAN_CHUNK {
                scanned = 0;
                self.budget.step()?;
            }
            let item = self.p(p);
            if item == ESC {
                p += 1;
                if class_matches(c, self.p(p)) {
                    return Ok(found);
                }
            } else if self.p(p + 1) == b'-' && p + 2 < ec {
                p += 2;
                if item <= c && c <= self.p(p) {
                    return Ok(found);
                }
            } else if item == c {
                return Ok(found);
            }
        }
    }

    /// `singlematch`: whether the class at `p` (ending at `ep`) matches the byte at `s`.
    #[inline]
    fn single_match(&mut self, s: usize, p: usize, ep: usize) -> Result<bool, Failure> {
        let Some(&c) = self.src.get(s) else { return Ok(false) };
        Ok(match self.p(p) {
            b'.' => true,
            ESC => class_matches(c, self.p(p + 1)),
            b'[' => self.bracket_class(c, p, ep - 1)?,
            other => other == c,
        })
    }

    /// `matchbalance`: the end of a `%bxy` match starting at `s`, `p` pointing at `x`.
    fn balance(&mut self, s: usize, p: usize) -> Result<Option<usize>, Failure> {
        if p + 1 >= self.pat.len() {
            return Err(Failure::Lua("malformed pattern (missing arguments to '%b')".into()));
        }
        let (open, close) = (self.p(p), self.p(p + 1));
        if self.s(s) != open {
            return Ok(None);
        }
        let mut depth = 1usize;
        let mut at = s + 1;
        while at < self.src.len() {
            let end = self.src.len().min(at + SCAN_CHUNK);
            for (i, &c) in self.src[at..end].iter().enumerate() {
                if c == close {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(Some(at + i + 1));
                    }
                } else if c == open {
                    depth += 1;
                }
            }
            at = end;
            self.budget.step()?;
        }
        Ok(None) // the subject ends out of balance
    }

    /// `max_expand`: as many repetitions as possible, then fewer until the rest matches.
    fn max_expand(&mut self, s: usize, p: usize, ep: usize) -> Result<Option<usize>, Failure> {
        let mut i = 0;
        while self.single_match(s + i, p, ep)? {
            i += 1;
            self.budget.step()?;
        }
        loop {
            if let Some(end) = self.do_match(s + i, ep + 1)? {
                return Ok(Some(end));
            }
            if i == 0 {
                return Ok(None);
            }
            i -= 1;
        }
    }

    /// `min_expand`: as few repetitions as possible, one more each time the rest fails.
    fn min_expand(&mut self, s: usize, p: usize, ep: usize) -> Result<Option<usize>, Failure> {
        let mut s = s;
        loop {
            if let Some(end) = self.do_match(s, ep + 1)? {
                return Ok(Some(end));
            }
            if !self.single_match(s, p, ep)? {
                return Ok(None);
            }
            s += 1;
        }
    }

    fn start_capture(&mut self, s: usize, p: usize, len: CaptureLen) -> Result<Option<usize>, Failure> {
        let level = self.level;
        if level >= MAX_CAPTURES {
            return Err(Failure::Lua("too many captures".into()));
        }
        self.captures[level] = Capture { start: s, len };
        self.level = level + 1;
        let result = self.do_match(s, p)?;
        if result.is_none() {
            self.level -= 1; // undo the capture
        }
        Ok(result)
    }

    fn end_capture(&mut self, s: usize, p: usize) -> Result<Option<usize>, Failure> {
        let Some(l) = (0..self.level).rev().find(|&l| self.captures[l].len == CaptureLen::Unfinished) else {
            return Err(Failure::Lua("invalid pattern capture".into()));
        };
        self.captures[l].len = CaptureLen::Closed(s - self.captures[l].start);
        let result = self.do_match(s, p)?;
        if result.is_none() {
            self.captures[l].len = CaptureLen::Unfinished; // undo the close
        }
        Ok(result)
    }

    /// `match_capture`: a back-reference `%1`-`%9` (`digit` is the character after `%`).
    fn back_reference(&mut self, s: usize, digit: u8) -> Result<Option<usize>, Failure> {
        let l = i32::from(digit) - i32::from(b'1');
        let capture = usize::try_from(l).ok().filter(|&l| l < self.level).map(|l| self.captures[l]);
        let Some(capture) = capture.filter(|c| c.len != CaptureLen::Unfinished) else {
            return Err(Failure::Lua(format!("invalid capture index %{}", l + 1)));
        };
        // A position capture has no text: in C its length reads as a huge size that never fits.
        let CaptureLen::Closed(len) = capture.len else { return Ok(None) };
        if self.src.len() - s < len {
            return Ok(None);
        }
        let (src, start) = (self.src, capture.start);
        let same = equal_chunked(&src[start..start + len], &src[s..s + len], &mut self.budget)?;
        Ok(same.then_some(s + len))
    }

    /// `match`: the end of the match of the pattern from `p` against the subject from `s`.
    fn do_match(&mut self, s: usize, p: usize) -> Result<Option<usize>, Failure> {
        if self.depth == 0 {
            return Err(Failure::Lua("pattern too complex".into()));
        }
        self.depth -= 1;
        let result = self.match_loop(s, p)?;
        self.depth += 1;
        Ok(result)
    }

    /// The body of `match`; its `goto init` tail calls are the iterations of this loop.
    fn match_loop(&mut self, s: usize, p: usize) -> Result<Option<usize>, Failure> {
        let (mut s, mut p) = (s, p);
        loop {
            self.budget.step()?;
            if p == self.pat.len() {
                return Ok(Some(s));
            }
            match self.p(p) {
                b'(' => {
                    return if self.p(p + 1) == b')' {
                        self.start_capture(s, p + 2, CaptureLen::Position)
                    } else {
                        self.start_capture(s, p + 1, CaptureLen::Unfinished)
                    };
                }
                b')' => return self.end_capture(s, p + 1),
                b'$' if p + 1 == self.pat.len() => {
                    return Ok((s == self.src.len()).then_some(s));
                }
                ESC if self.p(p + 1) == b'b' => match self.balance(s, p + 2)? {
                    Some(end) => {
                        s = end;
                        p += 4;
                        continue;
                    }
                    None => return Ok(None),
                },
                ESC if self.p(p + 1) == b'f' => {
                    p += 2;
                    if self.p(p) != b'[' {
                        return Err(Failure::Lua("missing '[' after '%f' in pattern".into()));
                    }
                    let ep = self.class_end(p)?;
                    let previous = if s == 0 { 0 } else { self.s(s - 1) };
                    let current = self.s(s);
                    if !self.bracket_class(previous, p, ep - 1)? && self.bracket_class(current, p, ep - 1)? {
                        p = ep;
                        continue;
                    }
                    return Ok(None);
                }
                ESC if self.p(p + 1).is_ascii_digit() => match self.back_reference(s, self.p(p + 1))? {
                    Some(end) => {
                        s = end;
                        p += 2;
                        continue;
                    }
                    None => return Ok(None),
                },
                _ => {}
            }
            // A single-character class with an optional suffix.
            let ep = self.class_end(p)?;
            let suffix = self.p(ep);
            if !self.single_match(s, p, ep)? {
                if matches!(suffix, b'*' | b'?' | b'-') {
                    p = ep + 1; // accept empty
                    continue;
                }
                return Ok(None); // '+' or no suffix
            }
            match suffix {
                b'?' => {
                    if let Some(end) = self.do_match(s + 1, ep + 1)? {
                        return Ok(Some(end));
                    }
                    p = ep + 1;
                }
                b'+' => return self.max_expand(s + 1, p, ep),
                b'*' => return self.max_expand(s, p, ep),
                b'-' => return self.min_expand(s, p, ep),
                _ => {
                    s += 1;
                    p = ep;
                }
            }
        }
    }

    /// `get_onecapture`: capture `i`, or the whole match `whole` when there are no captures.
    fn capture(&self, i: usize, whole: (usize, usize)) -> Result<CaptureValue, Failure> {
        if i >= self.level {
            if i != 0 {
                return Err(Failure::Lua(format!("invalid capture index %{}", i + 1)));
            }
            return Ok(CaptureValue::Text(whole.0, whole.1));
        }
        let capture = self.captures[i];
        match capture.len {
            CaptureLen::Unfinished => Err(Failure::Lua("unfinished capture".into())),
            CaptureLen::Position => Ok(CaptureValue::Position(capture.start + 1)),
            CaptureLen::Closed(len) => Ok(CaptureValue::Text(capture.start, capture.start + len)),
        }
    }

    fn capture_value(&self, lua: &Lua, i: usize, whole: (usize, usize)) -> Result<Value, Failure> {
        Ok(match self.capture(i, whole)? {
            CaptureValue::Text(start, end) => Value::String(lua.create_string(&self.src[start..end])?),
            CaptureValue::Position(at) => Value::Integer(at as i64),
        })
    }

    /// `push_captures`: all captures, or the whole match when there are none and `whole` is
    /// given (`find` gives none: its positions already say where the match is).
    fn push_captures(&self, lua: &Lua, whole: Option<(usize, usize)>, out: &mut MultiValue) -> Result<(), Failure> {
        let count = if self.level == 0 && whole.is_some() { 1 } else { self.level };
        let whole = whole.unwrap_or_default();
        for i in 0..count {
            out.push_back(self.capture_value(lua, i, whole)?);
        }
        Ok(())
    }
}

/// `match_class`: whether `c` is in the class `%cl`, in the C locale.
fn class_matches(c: u8, cl: u8) -> bool {
    let found = match cl.to_ascii_lowercase() {
        b'a' => c.is_ascii_alphabetic(),
        b'c' => c.is_ascii_control(),
        b'd' => c.is_ascii_digit(),
        b'g' => c.is_ascii_graphic(),
        b'l' => c.is_ascii_lowercase(),
        b'p' => c.is_ascii_punctuation(),
        // C's isspace counts \v, which Rust's is_ascii_whitespace does not.
        b's' => matches!(c, b' ' | b'\t'..=b'\r'),
        b'u' => c.is_ascii_uppercase(),
        b'w' => c.is_ascii_alphanumeric(),
        b'x' => c.is_ascii_hexdigit(),
        b'z' => c == 0, // deprecated, still in 5.4
        _ => return cl == c,
    };
    if cl.is_ascii_lowercase() {
        found
    } else {
        !found
    }
}

// ---------------------------------------------------------------------------------------------
// find, match, gmatch, gsub.

/// `str_find_aux`: `string.find` (`find`) or `string.match`.
fn find_aux(lua: &Lua, values: &MultiValue, find: bool, check: &Check) -> Result<MultiValue, Failure> {
    let args = Args { lua, values };
    let subject = args.string(1)?;
    let pattern = args.string(2)?;
    let init = args.opt_integer(3, 1)?;
    let (src, pat) = (subject.as_bytes(), pattern.as_bytes());
    let mut out = MultiValue::new();
    let Some(init) = start_offset(init, src.len()) else {
        out.push_back(Value::Nil); // starts after the end: cannot find anything
        return Ok(out);
    };
    let mut budget = Budget::new(check);
    if find && (args.truthy(4) || !has_specials(&pat, &mut budget)?) {
        if let Some(at) = plain_find(&src[init..], &pat, &mut budget)? {
            out.push_back(Value::Integer((init + at + 1) as i64));
            out.push_back(Value::Integer((init + at + pat.len()) as i64));
            return Ok(out);
        }
    } else {
        let (anchor, pat) = match pat.split_first() {
            Some((b'^', rest)) => (true, rest),
            _ => (false, &pat[..]),
        };
        let mut m = Matcher::new(&src, pat, budget);
        let mut start = init;
        loop {
            m.reset();
            if let Some(end) = m.do_match(start, 0)? {
                if find {
                    out.push_back(Value::Integer((start + 1) as i64));
                    out.push_back(Value::Integer(end as i64));
                    m.push_captures(lua, None, &mut out)?;
                } else {
                    m.push_captures(lua, Some((start, end)), &mut out)?;
                }
                return Ok(out);
            }
            if anchor || start >= src.len() {
                break;
            }
            start += 1;
        }
    }
    out.push_back(Value::Nil);
    Ok(out)
}

/// `gmatch`: an iterator over the matches, from `init` (5.4).
fn gmatch(lua: &Lua, values: &MultiValue, check: &Check) -> Result<MultiValue, Failure> {
    let args = Args { lua, values };
    let subject = args.string(1)?;
    let pattern = args.string(2)?;
    let init = args.opt_integer(3, 1)?;
    let len = subject.as_bytes().len();
    // Past the end: one past it, so the iterator finds nothing.
    let next = start_offset(init, len).unwrap_or(len + 1);
    let (subject, pattern) = (subject.into_owned(), pattern.into_owned());
    let mut state = GmatchState { subject, pattern, next, last_match: None, check: Arc::clone(check) };
    let iterator = lua.create_function_mut(move |lua, ()| answer(lua, state.advance(lua)))?;
    Ok(MultiValue::from_iter([Value::Function(iterator)]))
}

/// `GMatchState`: where the iterator of `gmatch` goes on from.
struct GmatchState {
    subject: LuaString,
    pattern: LuaString,
    next: usize,
    /// The end of the last match: an empty match right there does not count (5.4).
    last_match: Option<usize>,
    check: Check,
}

impl GmatchState {
    /// `gmatch_aux`: the captures of the next match, or nothing at the end.
    fn advance(&mut self, lua: &Lua) -> Result<MultiValue, Failure> {
        let (src, pat) = (self.subject.as_bytes(), self.pattern.as_bytes());
        let mut m = Matcher::new(&src, &pat, Budget::new(&self.check));
        let mut out = MultiValue::new();
        for start in self.next..=src.len() {
            m.reset();
            match m.do_match(start, 0)? {
                Some(end) if Some(end) != self.last_match => {
                    self.next = end;
                    self.last_match = Some(end);
                    m.push_captures(lua, Some((start, end)), &mut out)?;
                    return Ok(out);
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

/// The Lua functions `gsub` calls a replacement through.
struct Callers {
    pcall: Function,
    /// `function(t, k) return t[k] end`, for tables with a metatable.
    index: Function,
}

/// The third argument of `gsub`, as given.
enum Replacement {
    Text(LuaString),
    Table(Table),
    Function(Function),
}

/// The third argument of `gsub`, ready for use: a text replacement as bytes.
enum Repl<'r> {
    Text(&'r [u8]),
    Table(&'r Table),
    Function(&'r Function),
}

/// `str_gsub`.
fn gsub(lua: &Lua, values: &MultiValue, check: &Check, callers: &Callers) -> Result<MultiValue, Failure> {
    let args = Args { lua, values };
    let subject = args.string(1)?;
    let pattern = args.string(2)?;
    let src_len = subject.as_bytes().len();
    let max_n = args.opt_integer(4, src_len as i64 + 1)?;
    let replacement = match args.get(3) {
        Some(Value::String(s)) => Replacement::Text(s.clone()),
        Some(v @ (Value::Integer(_) | Value::Number(_))) => match lua.coerce_string(v.clone())? {
            Some(s) => Replacement::Text(s),
            None => return Err(args.type_error(3, "string/function/table")),
        },
        Some(Value::Table(t)) => Replacement::Table(t.clone()),
        Some(Value::Function(f)) => Replacement::Function(f.clone()),
        _ => return Err(args.type_error(3, "string/function/table")),
    };
    let text;
    let repl = match &replacement {
        Replacement::Text(s) => {
            text = s.as_bytes();
            Repl::Text(&text)
        }
        Replacement::Table(t) => Repl::Table(t),
        Replacement::Function(f) => Repl::Function(f),
    };
    let (src, pat) = (subject.as_bytes(), pattern.as_bytes());
    let (anchor, pat) = match pat.split_first() {
        Some((b'^', rest)) => (true, rest),
        _ => (false, &pat[..]),
    };
    let mut m = Matcher::new(&src, pat, Budget::new(check));
    let mut out = Output::new(lua);
    let mut at = 0;
    let mut last_match: Option<usize> = None;
    let mut n: i64 = 0;
    let mut changed = false;
    while n < max_n {
        m.reset();
        match m.do_match(at, 0)? {
            Some(end) if Some(end) != last_match => {
                n += 1;
                changed |= match repl {
                    Repl::Text(text) => {
                        m.expand(text, at, end, &mut out)?;
                        true
                    }
                    Repl::Table(table) => {
                        let key = m.capture_value(lua, 0, (at, end))?;
                        let value = if table.metatable().is_none() {
                            table.raw_get(key)?
                        } else {
                            protected(&callers.pcall, (callers.index.clone(), table.clone(), key))?
                        };
                        m.add_value(lua, value, at, end, &mut out)?
                    }
                    Repl::Function(f) => {
                        let mut call = MultiValue::new();
                        call.push_back(Value::Function(f.clone()));
                        m.push_captures(lua, Some((at, end)), &mut call)?;
                        let value = protected(&callers.pcall, call)?;
                        m.add_value(lua, value, at, end, &mut out)?
                    }
                };
                at = end;
                last_match = Some(end);
            }
            _ if at < src.len() => {
                out.push(src[at])?;
                at += 1;
            }
            _ => break, // end of the subject
        }
        if anchor {
            break;
        }
    }
    let result = if changed {
        out.append(&src[at..], &mut m.budget)?;
        Value::String(lua.create_string(&out.bytes)?)
    } else {
        Value::String(subject.into_owned())
    };
    Ok(MultiValue::from_iter([result, Value::Integer(n)]))
}

/// Calls `pcall` with `args` (the function first) and returns the first result, or the error
/// value as a [`Failure::Raised`].
fn protected(pcall: &Function, args: impl mlua::IntoLuaMulti) -> Result<Value, Failure> {
    let mut results: MultiValue = pcall.call(args)?;
    let ok = matches!(results.pop_front(), Some(Value::Boolean(true)));
    let value = results.pop_front().unwrap_or(Value::Nil);
    if ok {
        Ok(value)
    } else {
        Err(Failure::Raised(value))
    }
}

impl Matcher<'_> {
    /// `add_s`: the replacement text with `%0`-`%9` and `%%` expanded.
    fn expand(&mut self, repl: &[u8], s: usize, e: usize, out: &mut Output) -> Result<(), Failure> {
        let mut rest = repl;
        while let Some(at) = find_byte(ESC, rest, &mut self.budget)? {
            out.append(&rest[..at], &mut self.budget)?;
            self.budget.step()?;
            let code = rest.get(at + 1).copied().unwrap_or(0);
            match code {
                ESC => out.push(ESC)?,
                b'0' => out.append(&self.src[s..e], &mut self.budget)?,
                b'1'..=b'9' => match self.capture(usize::from(code - b'1'), (s, e))? {
                    CaptureValue::Text(start, end) => out.append(&self.src[start..end], &mut self.budget)?,
                    CaptureValue::Position(p) => out.append(p.to_string().as_bytes(), &mut self.budget)?,
                },
                _ => return Err(Failure::Lua("invalid use of '%' in replacement string".into())),
            }
            rest = rest.get(at + 2..).unwrap_or_default();
        }
        out.append(rest, &mut self.budget)
    }

    /// The end of `add_value` for a table or function replacement: false or nil keeps the
    /// match; a string or number replaces it. Returns whether the subject changed.
    fn add_value(&mut self, lua: &Lua, value: Value, s: usize, e: usize, out: &mut Output) -> Result<bool, Failure> {
        match value {
            Value::Nil | Value::Boolean(false) => {
                out.append(&self.src[s..e], &mut self.budget)?;
                Ok(false)
            }
            Value::String(text) => {
                out.append(&text.as_bytes(), &mut self.budget)?;
                Ok(true)
            }
            v @ (Value::Integer(_) | Value::Number(_)) => {
                if let Some(text) = lua.coerce_string(v)? {
                    out.append(&text.as_bytes(), &mut self.budget)?;
                }
                Ok(true)
            }
            other => Err(Failure::Lua(format!("invalid replacement value (a {})", type_name(&other)))),
        }
    }
}

/// The result of `gsub` while it is built. It lives outside Lua's allocator, so it checks the
/// Lua state's memory cap itself before it grows, as Lua's own buffer would.
struct Output<'l> {
    bytes: Vec<u8>,
    lua: &'l Lua,
    /// The state's memory cap (0: none).
    limit: usize,
}

impl<'l> Output<'l> {
    fn new(lua: &'l Lua) -> Self {
        Output { bytes: Vec::new(), lua, limit: memory_limit(lua) }
    }

    fn push(&mut self, byte: u8) -> Result<(), Failure> {
        self.reserve(1)?;
        self.bytes.push(byte);
        Ok(())
    }

    fn append(&mut self, bytes: &[u8], budget: &mut Budget) -> Result<(), Failure> {
        for chunk in bytes.chunks(SCAN_CHUNK * 16) {
            self.reserve(chunk.len())?;
            self.bytes.extend_from_slice(chunk);
            budget.step()?;
        }
        Ok(())
    }

    fn reserve(&mut self, extra: usize) -> Result<(), Failure> {
        let needed = self.bytes.len().saturating_add(extra);
        if needed <= self.bytes.capacity() {
            return Ok(());
        }
        let wanted = needed.max(self.bytes.capacity().saturating_mul(2)).max(64);
        // Buffers of gsubs still running further up this thread's stack (a replacement function
        // that calls gsub) live outside Lua's allocator too: count them with this one.
        let held = LIVE_OUTPUT.with(|live| live.get()).saturating_sub(self.bytes.capacity());
        if self.limit != 0 && self.lua.used_memory().saturating_add(held).saturating_add(wanted) > self.limit {
            return Err(Failure::OutOfMemory);
        }
        let before = self.bytes.capacity();
        self.bytes.reserve_exact(wanted - self.bytes.len());
        LIVE_OUTPUT.with(|live| live.set(live.get() + self.bytes.capacity() - before));
        Ok(())
    }
}

impl Drop for Output<'_> {
    fn drop(&mut self) {
        let _ = LIVE_OUTPUT.try_with(|live| live.set(live.get().saturating_sub(self.bytes.capacity())));
    }
}

// Static: per thread, the gsub buffers alive for the run this thread executes; holds nothing of a config.
thread_local! {
    /// Bytes held by the gsub output buffers alive on this thread.
    static LIVE_OUTPUT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The memory cap of the state, 0 for none. mlua has no getter; setting a cap returns the one
/// it replaces, so this sets it back at once (nothing runs in between).
fn memory_limit(lua: &Lua) -> usize {
    match lua.set_memory_limit(0) {
        Ok(limit) => {
            // Cannot fail: the first call succeeded on the same state.
            let _ = lua.set_memory_limit(limit);
            limit
        }
        Err(_) => 0,
    }
}

// ---------------------------------------------------------------------------------------------
// Byte searches that step the budget as they go.

/// `lmemfind`: the first occurrence of `needle` in `hay`, found as C finds it (the first byte,
/// then the rest), scanning at most [`SCAN_CHUNK`] bytes per step.
fn plain_find(hay: &[u8], needle: &[u8], budget: &mut Budget) -> Result<Option<usize>, Failure> {
    let Some((&first, rest)) = needle.split_first() else { return Ok(Some(0)) }; // empty: everywhere
    if needle.len() > hay.len() {
        return Ok(None);
    }
    // `needle` cannot start after this.
    let candidates = &hay[..hay.len() - rest.len()];
    let mut from = 0;
    while let Some(at) = find_byte(first, &candidates[from..], budget)? {
        let start = from + at;
        budget.step()?;
        if equal_chunked(&hay[start + 1..start + needle.len()], rest, budget)? {
            return Ok(Some(start));
        }
        from = start + 1;
    }
    Ok(None)
}

/// Whether a pattern has a character that makes `find` match rather than search for it as plain
/// text (`nospecials`, whose `SPECIALS` are `^$*+?.([%-`).
fn has_specials(pat: &[u8], budget: &mut Budget) -> Result<bool, Failure> {
    for chunk in pat.chunks(SCAN_CHUNK) {
        if chunk.iter().any(|c| matches!(c, b'^' | b'$' | b'*' | b'+' | b'?' | b'.' | b'(' | b'[' | b'%' | b'-')) {
            return Ok(true);
        }
        budget.step()?;
    }
    Ok(false)
}

/// `memchr`, a chunk per step.
fn find_byte(byte: u8, hay: &[u8], budget: &mut Budget) -> Result<Option<usize>, Failure> {
    let mut from = 0;
    for chunk in hay.chunks(SCAN_CHUNK) {
        if let Some(at) = memchr(byte, chunk) {
            return Ok(Some(from + at));
        }
        from += chunk.len();
        budget.step()?;
    }
    Ok(None)
}

/// Whether two slices of the same length are equal, a chunk per step.
fn equal_chunked(a: &[u8], b: &[u8], budget: &mut Budget) -> Result<bool, Failure> {
    if a.len() != b.len() {
        return Ok(false);
    }
    for (x, y) in a.chunks(SCAN_CHUNK).zip(b.chunks(SCAN_CHUNK)) {
        if x != y {
            return Ok(false);
        }
        budget.step()?;
    }
    Ok(true)
}

/// The first `byte` in `hay`, eight bytes at a time (std has no public memchr for slices).
fn memchr(byte: u8, hay: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let pattern = ONES * u64::from(byte);
    let mut words = hay.chunks_exact(8);
    let mut offset = 0;
    for word in &mut words {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_le_bytes(bytes) ^ pattern;
        // Nonzero exactly when some byte of `x` is zero, that is, some byte equals `byte`.
        if x.wrapping_sub(ONES) & !x & HIGHS != 0 {
            return word.iter().position(|&b| b == byte).map(|i| offset + i);
        }
        offset += 8;
    }
    words.remainder().iter().position(|&b| b == byte).map(|i| offset + i)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use mlua::{LuaOptions, StdLib};

    use super::*;

    /// Runs each case with C Lua's functions and with this port, and lists the cases whose
    /// results (values, types, error messages) differ. A case is a Lua expression list; it is
    /// compiled once and run twice, so error positions agree.
    const HARNESS: &str = r##"
local C, R, cases = ...
local function ser1(v)
  local t = type(v)
  if t == "string" or t == "number" then return string.format("%q", v) end
  if t == "boolean" or t == "nil" then return tostring(v) end
  return t
end
local function ser(...)
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = ser1((select(i, ...))) end
  return select("#", ...) .. ":" .. table.concat(parts, ",")
end
-- All the matches of string.gmatch(...), as one string.
function each(...)
  local it = string.gmatch(...)
  local out = {}
  for _ = 1, 1000 do
    local r = table.pack(it())
    if r.n == 0 then out[#out + 1] = "end" break end
    out[#out + 1] = ser(table.unpack(r, 1, r.n))
  end
  return table.concat(out, ";")
end
local bytes = {}
for i = 0, 255 do bytes[#bytes + 1] = string.char(i) end
ALL = table.concat(bytes)
REPT = { a = "A", b = false, x = 1.5, ["1"] = "one", [2] = "two", ["("] = true }
REPF = function(...)
  local n = select("#", ...)
  if ... == "a" then return nil end
  if ... == "b" then return false end
  if ... == "x" then return 7 end
  return n .. ":" .. tostring((...))
end
local function use(impl)
  string.find, string.match, string.gmatch, string.gsub = impl.find, impl.match, impl.gmatch, impl.gsub
end
local bad = {}
for i, code in ipairs(cases) do
  local f, err = load("local r = table.pack(" .. code .. ") return table.unpack(r, 1, r.n)", "=case", "t")
  if not f then error("case " .. i .. " does not compile: " .. err .. "\n" .. code) end
  use(C)
  local a = ser(pcall(f))
  use(R)
  local b = ser(pcall(f))
  if a ~= b then bad[#bad + 1] = code .. "\n    C: " .. a .. "\n    R: " .. b end
end
use(C)
return bad
"##;

    #[allow(clippy::disallowed_methods)] // a bare state to compare against C Lua, not a sandbox
    fn bare_lua() -> Lua {
        Lua::new_with(StdLib::STRING | StdLib::TABLE, LuaOptions::default()).unwrap()
    }

    fn always_ok() -> Check {
        Arc::new(|| Ok(()))
    }

    /// A state whose `string` table has C Lua's functions, plus the tables `C` (those) and `R`
    /// (this port).
    fn state_with(check: Check) -> (Lua, Table, Table) {
        let lua = bare_lua();
        let string: Table = lua.globals().get("string").unwrap();
        let c = lua.create_table().unwrap();
        for name in ["find", "match", "gmatch", "gsub"] {
            c.set(name, string.get::<Function>(name).unwrap()).unwrap();
        }
        let r = lua.create_table().unwrap();
        install(&lua, &r, check).unwrap();
        (lua, c, r)
    }

    /// The cases whose results differ between C Lua and this port.
    fn differences(cases: &[String]) -> Vec<String> {
        let (lua, c, r) = state_with(always_ok());
        let cases = lua.create_sequence_from(cases.iter().map(String::as_str)).unwrap();
        lua.load(HARNESS).set_name("=harness").call((c, r, cases)).unwrap()
    }

    fn assert_same(cases: &[String]) {
        let bad = differences(cases);
        assert!(bad.is_empty(), "{} of {} cases differ from C Lua:\n{}", bad.len(), cases.len(), bad.join("\n"));
    }

    /// Hand-picked cases: every feature and every error of lstrlib.c's pattern functions.
    const CASES: &[&str] = &[
        // find: plain text, init, plain flag
        r##"string.find("hello world", "o")"##,
        r##"string.find("hello world", "o w")"##,
        r##"string.find("hello world", "xyz")"##,
        r##"string.find("hello world", "o", 5)"##,
        r##"string.find("hello world", "o", 6)"##,
        r##"string.find("hello world", "o", -3)"##,
        r##"string.find("hello world", "o", -4)"##,
        r##"string.find("hello world", "o", -100)"##,
        r##"string.find("hello world", "o", 0)"##,
        r##"string.find("hello world", "o", 100)"##,
        r##"string.find("hello world", "d", 11)"##,
        r##"string.find("hello world", "d", 12)"##,
        r##"string.find("hello world", "", 12)"##,
        r##"string.find("hello world", "", 13)"##,
        r##"string.find("hello", "", 10)"##,
        r##"string.find("hello", "", 6)"##,
        r##"string.find("hello", "", 5)"##,
        r##"string.find("hello", "", -1)"##,
        r##"string.find("hello", "", math and 0 or -9223372036854775807 - 1)"##,
        r##"string.find("hello", "l", 9223372036854775807)"##,
        r##"string.find("hello", "l", -9223372036854775807)"##,
        r##"string.find("hello", "l.", 9223372036854775807)"##,
        r##"string.find("", "")"##,
        r##"string.find("", "", 1)"##,
        r##"string.find("", "", 2)"##,
        r##"string.find("", "a")"##,
        r##"string.find("", ".")"##,
        r##"string.find("", ".*")"##,
        r##"string.find("hello", "l", 1, true)"##,
        r##"string.find("a.b", ".", 1, true)"##,
        r##"string.find("a.b", ".")"##,
        r##"string.find("a+b", "+", 1, true)"##,
        r##"string.find("a+b", "a+b", 1, true)"##,
        r##"string.find("a+b", "a+b")"##,
        r##"string.find("a(b", "(", 1, 1)"##,
        r##"string.find("a(b", "(", 1, "yes")"##,
        r##"string.find("a(b", "(", 1, false)"##,
        r##"string.find("a(b", "(", 1, nil)"##,
        r##"string.find("a(b", "(")"##,
        r##"string.find("a)b", ")")"##,
        r##"string.find("a]b", "]")"##,
        r##"string.find("a]b", "a]")"##,
        r##"string.find("abc", "b", "2")"##,
        r##"string.find("abc", "b", " 2 ")"##,
        r##"string.find("abc", "b", "0x2")"##,
        r##"string.find("abc", "b", 2.0)"##,
        r##"string.find("abc", "b", "2.0")"##,
        r##"string.find("abc", "b", 2.5)"##,
        r##"string.find("abc", "b", "2.5")"##,
        r##"string.find("abc", "b", "x")"##,
        r##"string.find("abc", "b", {})"##,
        r##"string.find("abc", "b", true)"##,
        r##"string.find("abc", "b", 1e100)"##,
        r##"string.find("abc", "b", 0/0)"##,
        r##"string.find(123, 2)"##,
        r##"string.find(12.5, ".")"##,
        r##"string.find(1e100, "e")"##,
        r##"string.find(-0.0, "0")"##,
        r##"string.find(2^63, "%.")"##,
        r##"string.find("x", 1)"##,
        r##"string.find()"##,
        r##"string.find(nil, "a")"##,
        r##"string.find("a")"##,
        r##"string.find("a", nil)"##,
        r##"string.find("a", {})"##,
        r##"string.find({}, "a")"##,
        r##"string.find(true, "a")"##,
        r##"string.find(print or pcall, "a")"##,
        r##"string.find(setmetatable({}, {__name = "MyType"}), "a")"##,
        r##"string.find(setmetatable({}, {__name = 42}), "a")"##,
        r##"string.find("a", setmetatable({}, {__tostring = function() return "a" end}))"##,
        r##"("abc"):find("b")"##,
        r##"("abc"):find(nil)"##,
        r##"("abc"):find()"##,
        r##"("abc"):find("b", "x")"##,
        r##"("abc"):find("[")"##,
        r##"pcall(string.find)"##,
        r##"pcall(string.find, "a", {})"##,
        r##"pcall(string.find, "a", "[")"##,
        r##"pcall(string.match, "a")"##,
        r##"pcall(string.gsub, "a", "a")"##,
        r##"pcall(string.gmatch)"##,
        r##"(function() local f = string.find local r = f(nil) return r end)()"##,
        r##"(function() local t = {f = string.find} local r = t.f(nil) return r end)()"##,
        r##"(function() local t = {f = string.find} local r = t:f() return r end)()"##,
        r##"(function() local t = {f = string.find} local r = t:f(nil, 1) return r end)()"##,
        r##"string.find(string.rep("a", 10), string.rep("a", 11))"##,
        r##"string.find(string.rep("a", 10), string.rep("a", 10))"##,
        r##"string.find(string.rep("ab", 1000) .. "abc", "abc", 1, true)"##,
        r##"string.find(string.rep("ab", 1000) .. "abc", "abc", -3, true)"##,
        r##"string.find(string.rep("ab", 1000) .. "abc", "abc", -2, true)"##,
        r##"string.find(string.rep("a", 2000) .. "b", string.rep("a", 700) .. "b", 1, true)"##,
        r##"string.find(string.rep("a", 3000), "b", 1, true)"##,
        // match: captures, anchors
        r##"string.match("hello 123 world", "%d+")"##,
        r##"string.match("key=val", "(%w+)=(%w+)")"##,
        r##"string.match("  trim me  ", "^%s*(.-)%s*$")"##,
        r##"string.match("abc", "()b()")"##,
        r##"string.match("abc", "()")"##,
        r##"string.match("abc", "()", 4)"##,
        r##"string.match("abc", "()", 5)"##,
        r##"string.match("abc", "^b")"##,
        r##"string.match("abc", "^a")"##,
        r##"string.match("abc", "^abc$")"##,
        r##"string.match("abc", "c$")"##,
        r##"string.match("abc", "b$")"##,
        r##"string.match("a$c", "$c")"##,
        r##"string.match("a$", "a$$")"##,
        r##"string.match("a$b", "a$b")"##,
        r##"string.match("^a", "^^a")"##,
        r##"string.match("b^a", "^a")"##,
        r##"string.match("b^a", "b^a")"##,
        r##"string.match("abc", "")"##,
        r##"string.match("abc", "", 2)"##,
        r##"string.match("abc", "b", -1)"##,
        r##"string.match("abc", "b", -2)"##,
        r##"string.match("hello", "(h)(e)(l)(l)(o)")"##,
        r##"string.match("hello", "((h)(e))")"##,
        r##"string.match("hello", "(h(e(l)))")"##,
        r##"string.match("hello", "(h)()(e)")"##,
        r##"string.match("date: 2024-01-15", "(%d+)-(%d+)-(%d+)")"##,
        r##"string.match(" x", "^(%s*)$")"##,
        r##"string.match("", "^(%s*)$")"##,
        // every class, and its complement, over all 256 bytes
        r##"string.gsub(ALL, "%a", "")"##,
        r##"string.gsub(ALL, "%A", "")"##,
        r##"string.gsub(ALL, "%c", "")"##,
        r##"string.gsub(ALL, "%C", "")"##,
        r##"string.gsub(ALL, "%d", "")"##,
        r##"string.gsub(ALL, "%D", "")"##,
        r##"string.gsub(ALL, "%g", "")"##,
        r##"string.gsub(ALL, "%G", "")"##,
        r##"string.gsub(ALL, "%l", "")"##,
        r##"string.gsub(ALL, "%L", "")"##,
        r##"string.gsub(ALL, "%p", "")"##,
        r##"string.gsub(ALL, "%P", "")"##,
        r##"string.gsub(ALL, "%s", "")"##,
        r##"string.gsub(ALL, "%S", "")"##,
        r##"string.gsub(ALL, "%u", "")"##,
        r##"string.gsub(ALL, "%U", "")"##,
        r##"string.gsub(ALL, "%w", "")"##,
        r##"string.gsub(ALL, "%W", "")"##,
        r##"string.gsub(ALL, "%x", "")"##,
        r##"string.gsub(ALL, "%X", "")"##,
        r##"string.gsub(ALL, "%z", "")"##,
        r##"string.gsub(ALL, "%Z", "")"##,
        r##"string.gsub(ALL, "[%a%d]", "")"##,
        r##"string.gsub(ALL, "[^%a%d]", "")"##,
        r##"string.gsub(ALL, "[%S]", "")"##,
        r##"string.gsub(ALL, "%.", "")"##,
        r##"string.gsub(ALL, "%%", "")"##,
        r##"string.gsub(ALL, "%]", "")"##,
        r##"string.gsub(ALL, "%q", "")"##,
        r##"string.gsub(ALL, "%Q", "")"##,
        r##"string.gsub(ALL, "%\0", "")"##,
        r##"string.gsub(ALL, "%\200", "")"##,
        r##"string.gsub(ALL, ".", "")"##,
        r##"string.gsub(ALL, "[\128-\255]", "")"##,
        r##"string.gsub(ALL, "[\0-\31]", "")"##,
        // sets
        r##"string.match("xabcx", "[abc]+")"##,
        r##"string.match("xabcx", "[^abc]+")"##,
        r##"string.match("xabcx", "[a-c]+")"##,
        r##"string.match("a_b9!", "[%a_]+")"##,
        r##"string.match("a]b", "[%]]")"##,
        r##"string.match("a]b", "[]]")"##,
        r##"string.match("a]b", "[^]]+")"##,
        r##"string.match("a-b", "[a-]+")"##,
        r##"string.match("a-b", "[-a]+")"##,
        r##"string.match("%bd", "[a-%d]+")"##,
        r##"string.match("a%d", "[a-%d]+")"##,
        r##"string.match("xyz", "[%a-z]+")"##,
        r##"string.match("x-z", "[%a-z]+")"##,
        r##"string.match("abc", "[z-a]")"##,
        r##"string.match("a b", "[^%s]+")"##,
        r##"string.match("^^a", "[%^]+")"##,
        r##"string.match("a^b", "[b^]+")"##,
        r##"string.match("ab", "[^]")"##,
        r##"string.match("a[b", "[[]")"##,
        r##"string.match("a\0b", "[\0]")"##,
        r##"string.match("a\0b", "[^\0]+", 2)"##,
        r##"string.match("abc", "[a")"##,
        r##"string.match("abc", "[^")"##,
        r##"string.match("abc", "[")"##,
        r##"string.match("abc", "[]")"##,
        r##"string.match("abc", "[^]")"##,
        r##"string.match("abc", "[%")"##,
        r##"string.match("abc", "[a%]")"##,
        r##"string.match("abc", "[a%")"##,
        // malformed patterns and bad captures
        r##"string.match("abc", "%")"##,
        r##"string.match("abc", "a%")"##,
        r##"string.find("abc", "%")"##,
        r##"string.find("abc", "a%", 1, true)"##,
        r##"string.match("abc", "(()")"##,
        r##"string.match("abc", "(")"##,
        r##"string.find("abc", "(")"##,
        r##"string.find("abc", "(a")"##,
        r##"string.find("abc", "(x")"##,
        r##"string.match("abc", ")")"##,
        r##"string.match("abc", "a)")"##,
        r##"string.match("abc", "x)")"##,
        r##"string.match("abc", "(a))")"##,
        r##"string.match("abc", "%1")"##,
        r##"string.match("abc", "%0")"##,
        r##"string.match("abc", "(a)%2")"##,
        r##"string.match("abc", "(a%1)")"##,
        r##"string.match("abc", "(x)%2")"##,
        r##"string.match("abc", "%9")"##,
        r##"string.match("abc", "%b")"##,
        r##"string.match("abc", "%ba")"##,
        r##"string.match("abc", "%bab")"##,
        r##"string.match("abc", "%f")"##,
        r##"string.match("abc", "%fa")"##,
        r##"string.match("abc", "%f[a")"##,
        r##"string.match("abc", "%f[")"##,
        r##"string.match("abc", "x%f")"##,
        r##"string.match("abc", "x%b")"##,
        r##"string.gsub("abc", "x%f", "")"##,
        r##"string.gsub("abc", "%f", "")"##,
        r##"string.match(string.rep("a", 40), string.rep("(a)", 33))"##,
        r##"string.match(string.rep("a", 40), string.rep("(a)", 32))"##,
        r##"string.match(string.rep("a", 40), string.rep("()", 32))"##,
        r##"string.match(string.rep("a", 40), string.rep("()", 33))"##,
        r##"string.find(string.rep("a", 40), string.rep("(a)", 32))"##,
        r##"string.match(string.rep("a", 300), string.rep("a?", 300))"##,
        r##"string.match(string.rep("a", 300), string.rep("a?", 199))"##,
        r##"string.match(string.rep("a", 300), string.rep("a?", 200))"##,
        r##"string.match(string.rep("a", 300), string.rep("a?", 201))"##,
        r##"string.match(string.rep("a", 300), string.rep("a*", 300))"##,
        r##"string.match(string.rep("a", 300), string.rep("a-", 300) .. "b")"##,
        r##"string.match(string.rep("(", 300), string.rep("%(", 300))"##,
        r##"string.match(string.rep("ab", 300), string.rep("(a)", 20) .. string.rep("(", 20))"##,
        r##"string.find(string.rep("a", 50), string.rep(".-", 4) .. "b")"##,
        r##"string.find(string.rep("a", 50), string.rep(".-", 4) .. "a$")"##,
        // back-references
        r##"string.match("abcabc", "(abc)%1")"##,
        r##"string.find("xyyx", "(.)(.)%2%1")"##,
        r##"string.match("aa", "()%1")"##,
        r##"string.match("aa", "()a%1")"##,
        r##"string.match("abab", "(ab)%1$")"##,
        r##"string.match("abba", "(a)(b)%2%1")"##,
        r##"string.match("'quoted' x", "(['\"])(.-)%1")"##,
        r##"string.match("aXa", "(a)%u%1")"##,
        r##"string.match("aXaaXa", "((a)%u%2)%1")"##,
        r##"string.match(string.rep("ab", 100), "(.*)%1")"##,
        r##"string.match(string.rep("ab", 100) .. "x", "^(.*)%1x")"##,
        // %b
        r##"string.match("f(a(b)c)d", "%b()")"##,
        r##"string.match("[[x]] y", "%b[]")"##,
        r##"string.match("aaa", "%baa")"##,
        r##"string.match("((", "%b()")"##,
        r##"string.match("x", "%bxx")"##,
        r##"string.match("xyx", "%bxx")"##,
        r##"string.match("(a)(b)", "%b()%b()")"##,
        r##"string.match("(a)(b", "%b()%b()")"##,
        r##"string.match("a(b", "%b()", 2)"##,
        r##"string.find("abc", "%b\0\0")"##,
        r##"string.find("", "%b\0\0")"##,
        r##"string.gsub("f(x) + g(y, (z))", "%b()", "[]")"##,
        // %f
        r##"string.match("THE (quick) fox", "%f[%a]%a+")"##,
        r##"string.find("hello", "%f[%l]")"##,
        r##"string.find("hello", "%f[^%l]")"##,
        r##"string.find("hello", "%f[%z]")"##,
        r##"string.find("hello", "%f[\0]")"##,
        r##"string.find("", "%f[%z]")"##,
        r##"string.find("", "%f[^%z]")"##,
        r##"string.find("hello", "%f[%a]", 2)"##,
        r##"string.gsub("THE (quick) brown fox", "%f[%a]%a+%f[%A]", "W")"##,
        r##"string.gsub("hello world", "%f[%w]%w+", string.upper)"##,
        r##"string.find("a\0b", "%f[%z]")"##,
        r##"string.find("a\0b", "%f[%Z]", 2)"##,
        r##"string.find("abc", "%f[]")"##,
        r##"string.find("abc", "%f[^]")"##,
        // quantifiers
        r##"string.match("aaab", "a*")"##,
        r##"string.match("aaab", "a+")"##,
        r##"string.match("aaab", "a-")"##,
        r##"string.match("aaab", "a-b")"##,
        r##"string.match("aaab", "a?")"##,
        r##"string.match("aaab", "a?a?a?a?b")"##,
        r##"string.match("b", "a+")"##,
        r##"string.match("b", "a*b")"##,
        r##"string.match("xaabx", ".-b")"##,
        r##"string.match("abcabc", "(.*)c")"##,
        r##"string.match("abcabc", "(.-)c")"##,
        r##"string.match("aXbXc", "[ab]*X")"##,
        r##"string.match("yy", "x?y")"##,
        r##"string.match("  a  b ", "(a*(.)%w(%s*))")"##,
        r##"string.match("**", "%**")"##,
        r##"string.match("+-?", "[+%-?]+")"##,
        r##"string.match("a*", "a**")"##,
        r##"string.match("a+", "a+-")"##,
        r##"string.match("ab", "a-?")"##,
        r##"string.match("-a", "-a")"##,
        r##"string.match("*a", "*a")"##,
        r##"string.match("?a", "?a")"##,
        r##"string.match("a", "(*)")"##,
        // embedded zeros and high bytes
        r##"string.find("a\0b", "\0")"##,
        r##"string.find("a\0b", "%z")"##,
        r##"string.find("a\0b", "[%z]")"##,
        r##"string.find("a\0b", "b", 1, true)"##,
        r##"string.find("a\0b\0c", "\0c", 1, true)"##,
        r##"string.find("a\0b\0c", "\0c")"##,
        r##"string.match("a\0b\0", "(.-)%z")"##,
        r##"string.match("aa\0a", "[a\0]+")"##,
        r##"string.find("\200\255", "[\128-\255]+")"##,
        r##"string.find("\255", "%A")"##,
        r##"string.find("x\255", "\255")"##,
        r##"string.match("\0", "^\0$")"##,
        r##"string.match("abc", "b\0")"##,
        // gmatch
        r##"each("hello world from Lua", "%a+")"##,
        r##"each("k=v, k2=v2", "(%w+)=(%w+)")"##,
        r##"each("abc", "")"##,
        r##"each("", "")"##,
        r##"each("abc", ".-")"##,
        r##"each("abc", "()")"##,
        r##"each("abc", "a*")"##,
        r##"each("aaa", "a*")"##,
        r##"each("baaac", "a*")"##,
        r##"each("hello", "l", 4)"##,
        r##"each("hello", "l", -2)"##,
        r##"each("hello", "l", 0)"##,
        r##"each("hello", "l", -100)"##,
        r##"each("hello", "x", 100)"##,
        r##"each("hello", "", 5)"##,
        r##"each("hello", "", 6)"##,
        r##"each("hello", "", 7)"##,
        r##"each("hello", "", 9223372036854775807)"##,
        r##"each("abc", "^a")"##,
        r##"each("a^b^", "^")"##,
        r##"each("ab$", "b$")"##,
        r##"each("a,b,,c", "[^,]*")"##,
        r##"each("a,b,,c", "([^,]*),?")"##,
        r##"each("one two  three", "%S+")"##,
        r##"each("(a)(b(c))", "%b()")"##,
        r##"each("abc", "(.)()")"##,
        r##"each("abc", "[")"##,
        r##"each("abc", "(")"##,
        r##"each("abc", "%1")"##,
        r##"each("abc", "%f")"##,
        r##"each(123, 2)"##,
        r##"each("abc", "b", "2")"##,
        r##"each("abc", "b", 2.5)"##,
        r##"each("abc", "b", "x")"##,
        r##"string.gmatch()"##,
        r##"string.gmatch("a")"##,
        r##"string.gmatch(nil, "a")"##,
        r##"string.gmatch("a", "a", {})"##,
        r##"type(string.gmatch("a", "a"))"##,
        r##"(function() local it = string.gmatch("aXbX", "(%a)X") local a = it() local b = it() local c = it() local d = it() return a, b, c, d end)()"##,
        r##"(function() local t = {} for k, v in string.gmatch("a=1, b=2", "(%w+)=(%w+)") do t[#t + 1] = k .. v end return table.concat(t, ";") end)()"##,
        r##"(function() for w in string.gmatch("abc", "[") do end end)()"##,
        r##"(function() for w in ("abc"):gmatch("(") do end end)()"##,
        // gsub: string replacements
        r##"string.gsub("hello world", "o", "0")"##,
        r##"string.gsub("hello world", "(o)", "[%1]")"##,
        r##"string.gsub("hello world", "o", "%0%0")"##,
        r##"string.gsub("hello world", "%w+", "<%0>")"##,
        r##"string.gsub("hello world", "(%w+) (%w+)", "%2 %1")"##,
        r##"string.gsub("hello", "", "-")"##,
        r##"string.gsub("", "", "-")"##,
        r##"string.gsub("hello", ".-", "-")"##,
        r##"string.gsub("hello", "l*", "-")"##,
        r##"string.gsub("hello", "x*", "-")"##,
        r##"string.gsub("hello", "^h", "H")"##,
        r##"string.gsub("hello", "^", ">")"##,
        r##"string.gsub("hello", "^l", "L")"##,
        r##"string.gsub("hello", "$", "!")"##,
        r##"string.gsub("hello", "o$", "!")"##,
        r##"string.gsub("hello", "^.", "%0%0")"##,
        r##"string.gsub("hello", "^.*", "x")"##,
        r##"string.gsub("hello", "^x*", "x")"##,
        r##"string.gsub("abc", "%w", "%%")"##,
        r##"string.gsub("abc", "%w", "%%%0%%")"##,
        r##"string.gsub("abc", "%w", "%1")"##,
        r##"string.gsub("abc", "(%w)", "%1%1")"##,
        r##"string.gsub("abc", "%w", "%2")"##,
        r##"string.gsub("abc", "(%w)", "%2")"##,
        r##"string.gsub("abc", "(%w)()", "%2")"##,
        r##"string.gsub("abc", "()", "%1")"##,
        r##"string.gsub("abc", "%w", "%")"##,
        r##"string.gsub("abc", "%w", "x%")"##,
        r##"string.gsub("abc", "%w", "%x")"##,
        r##"string.gsub("abc", "%w", "%\0")"##,
        r##"string.gsub("abc", "x", "%x")"##,
        r##"string.gsub("abc", "(%w", "%1")"##,
        r##"string.gsub("abc", "(b)(", "%1")"##,
        r##"string.gsub("abc", "(b)(", "%2")"##,
        r##"string.gsub("abc", "b", "\0")"##,
        r##"string.gsub("abc", "b", 5)"##,
        r##"string.gsub("abc", "b", 1.5)"##,
        r##"string.gsub("abc", "b", -0.0)"##,
        r##"string.gsub("abc", "b", 2^63)"##,
        r##"string.gsub("abc", "", "")"##,
        r##"string.gsub(12345, 3, 9)"##,
        r##"string.gsub(1.25, "%.", ",")"##,
        r##"string.gsub("abc", "b", "x", 0)"##,
        // gsub: the limit
        r##"string.gsub("aaa", "a", "b", 2)"##,
        r##"string.gsub("aaa", "a", "b", 0)"##,
        r##"string.gsub("aaa", "a", "b", -1)"##,
        r##"string.gsub("aaa", "a", "b", 2.0)"##,
        r##"string.gsub("aaa", "a", "b", "2")"##,
        r##"string.gsub("aaa", "a", "b", 2.5)"##,
        r##"string.gsub("aaa", "a", "b", "x")"##,
        r##"string.gsub("aaa", "a", "b", 9223372036854775807)"##,
        r##"string.gsub("aaa", "a", "b", -9223372036854775807 - 1)"##,
        r##"string.gsub("aaa", "", "-", 2)"##,
        r##"string.gsub("aaa", "a", "b", nil)"##,
        // gsub: argument errors, in C's order
        r##"string.gsub("a", "a")"##,
        r##"string.gsub("a", "a", nil)"##,
        r##"string.gsub("a", "a", true)"##,
        r##"string.gsub("a", "a", true, "x")"##,
        r##"string.gsub("a", "[", true)"##,
        r##"string.gsub("a", "[", "x")"##,
        r##"string.gsub("a", "a", setmetatable({}, {__name = "Thing"}), "x")"##,
        r##"string.gsub(nil, "a", "b")"##,
        r##"string.gsub("a", nil, "b")"##,
        r##"string.gsub()"##,
        r##"("abc"):gsub("b")"##,
        r##"("abc"):gsub(nil, "b")"##,
        // gsub: table replacements
        r##"string.gsub("abc", "%w", {a = "1", b = "2"})"##,
        r##"string.gsub("abc", "%w", {a = 1, b = 2.5})"##,
        r##"string.gsub("abc", "%w", {b = true})"##,
        r##"string.gsub("abc", "%w", {b = {}})"##,
        r##"string.gsub("abc", "%w", {b = false})"##,
        r##"string.gsub("abc", "%w", {})"##,
        r##"string.gsub("abc", "(%w)(%w)", {a = "X"})"##,
        r##"string.gsub("abc", "()%w", {"one", "two"})"##,
        r##"string.gsub("abc", "(", {})"##,
        r##"string.gsub("abc", "%w", setmetatable({}, {__index = function(t, k) return k:upper() end}))"##,
        r##"string.gsub("abc", "%w", setmetatable({}, {__index = function(t, k) error("no " .. k) end}))"##,
        r##"string.gsub("abc", "%w", setmetatable({}, {__index = function(t, k) error({k}) end}))"##,
        r##"string.gsub("abc", "%w", setmetatable({}, {__index = {b = "B"}}))"##,
        r##"string.gsub("abc", "%w", setmetatable({}, {__index = function() return nil end}))"##,
        r##"select(2, pcall(string.gsub, "abc", "%w", setmetatable({}, {__index = function(t, k) error({code = k}) end}))).code"##,
        // gsub: function replacements
        r##"string.gsub("hello world", "%w+", string.upper)"##,
        r##"string.gsub("hello world", "%w+", function(w) return #w end)"##,
        r##"string.gsub("hello world", "%w+", function(w) return #w + 0.5 end)"##,
        r##"string.gsub("hello world", "%w+", function(w) end)"##,
        r##"string.gsub("hello world", "%w+", function(w) return false end)"##,
        r##"string.gsub("hello world", "%w+", function(w) return w == "world" and "W" end)"##,
        r##"string.gsub("hello world", "%w+", function(w) return {} end)"##,
        r##"string.gsub("hello world", "%w+", function(w) return true end)"##,
        r##"string.gsub("hello world", "%w+", function(w) return print or pcall end)"##,
        r##"string.gsub("hello world", "%w+", function(w) return "x", "y" end)"##,
        r##"string.gsub("hello world", "(%w)(%w*)", function(a, b) return b .. a end)"##,
        r##"string.gsub("hello world", "()(%w+)()", function(a, w, b) return a .. w .. b end)"##,
        r##"string.gsub("hello world", "%w+", function(...) return select("#", ...) end)"##,
        r##"string.gsub("hello world", "()", function(...) return select("#", ...) .. tostring(...) end)"##,
        r##"string.gsub("hello world", "%w+", function(w) error("boom " .. w) end)"##,
        r##"string.gsub("hello world", "%w+", function(w) error("boom " .. w, 0) end)"##,
        r##"string.gsub("hello world", "%w+", function(w) error() end)"##,
        r##"string.gsub("hello world", "%w+", function(w) error(setmetatable({}, {__tostring = function() return "E" end})) end)"##,
        r##"select(2, pcall(string.gsub, "ab", "%w", function(c) error({code = c}) end)).code"##,
        r##"string.gsub("hello world", "%w+", function(w) return string.gsub(w, "l", "L") end)"##,
        r##"string.gsub("hello world", "%w+", function(w) local r = string.find(w, "[") return r end)"##,
        r##"string.gsub("a.b.c", "%.", function() return "%" end)"##,
        r##"string.gsub("abc", "", function() return "-" end)"##,
        r##"string.gsub("abc", "(", function() return "-" end)"##,
        r##"string.gsub("abc", "a", REPF)"##,
        r##"string.gsub("abcx", "%w", REPF)"##,
        r##"string.gsub("abcx", "%w", REPT)"##,
        r##"(function() local n = 0 local s = string.gsub("aaa", "a", function() n = n + 1 return n end) return s, n end)()"##,
        r##"string.gsub(string.rep("a", 3000), "a", "bb")"##,
        r##"string.gsub(string.rep("ab", 3000), "(a)(b)", "%2%1")"##,
        r##"string.gsub(string.rep("word ", 1000), "%w+", "%0%0")"##,
    ];

    #[test]
    fn hardening_01_patterns_match_c_lua_on_hand_picked_cases() {
        let cases: Vec<String> = CASES.iter().map(|c| c.to_string()).collect();
        assert!(cases.len() > 400, "{} cases", cases.len());
        assert_same(&cases);
    }

    /// xorshift64*: a deterministic stream, so a failing generated case can be found again.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[self.below(items.len())]
        }
    }

    /// A Lua string literal for any bytes.
    fn quote(bytes: &[u8]) -> String {
        let mut out = String::from("\"");
        for &b in bytes {
            if b.is_ascii_graphic() && b != b'"' && b != b'\\' || b == b' ' {
                out.push(b as char);
            } else {
                out.push_str(&format!("\\{b:03}"));
            }
        }
        out.push('"');
        out
    }

    fn random_pattern(rng: &mut Rng) -> String {
        const ATOMS: &[&str] = &[
            "a", "b", "a", "b", "x", " ", "1", ".", ".", "%a", "%d", "%s", "%w", "%W", "%p", "[ab]", "[^a]", "[a-c]",
            "[%s%d]", "[]]", "%b()", "%bab", "%f[%w]", "%f[%s]", "%f[^a]", "(", ")", "()", "(", ")", "%1", "%2", "%.",
            "%(", "%%",
        ];
        // Rarer: what makes a pattern malformed.
        const BROKEN: &[&str] = &["%", "[", "[^", "%f", "%b", "%ba", "%f[", "%0", "%9", "[%"];
        const SUFFIXES: &[&str] = &["", "", "", "*", "+", "-", "?"];
        let mut p = String::new();
        if rng.below(8) == 0 {
            p.push('^');
        }
        for _ in 0..1 + rng.below(5) {
            if rng.below(25) == 0 {
                p.push_str(rng.pick(BROKEN));
                continue;
            }
            let atom = rng.pick(ATOMS);
            p.push_str(atom);
            if !matches!(atom, "(" | ")" | "()") && !atom.starts_with("%b") && !atom.starts_with("%f") {
                p.push_str(rng.pick(SUFFIXES));
            }
        }
        if rng.below(8) == 0 {
            p.push('$');
        }
        p
    }

    fn random_subject(rng: &mut Rng) -> Vec<u8> {
        const ALPHABET: &[u8] = b"aabb()  1x.%-\0";
        (0..rng.below(16)).map(|_| ALPHABET[rng.below(ALPHABET.len())]).collect()
    }

    fn random_init(rng: &mut Rng) -> String {
        match rng.below(6) {
            0 => format!(", {}", rng.below(20) as i64 - 10),
            1 => format!(", {}", rng.below(20)),
            _ => String::new(),
        }
    }

    fn generated_cases(count: usize) -> Vec<String> {
        const REPLACEMENTS: &[&str] =
            &[r#""""#, r#""%0""#, r#""<%1>""#, r#""%%""#, r#""x%2""#, r#""%""#, r#""%1%0""#, "REPT", "REPF", "7"];
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        (0..count)
            .map(|_| {
                let s = quote(&random_subject(&mut rng));
                let p = quote(random_pattern(&mut rng).as_bytes());
                match rng.below(5) {
                    0 => {
                        let init = match rng.below(3) {
                            0 => String::new(),
                            _ => format!(", {}", rng.below(20) as i64 - 8),
                        };
                        let plain = if rng.below(4) == 0 && !init.is_empty() { ", true" } else { "" };
                        format!("string.find({s}, {p}{init}{plain})")
                    }
                    1 => format!("string.match({s}, {p}{})", random_init(&mut rng)),
                    2 => format!("each({s}, {p}{})", random_init(&mut rng)),
                    _ => {
                        let repl = rng.pick(REPLACEMENTS);
                        let limit = match rng.below(5) {
                            0 => format!(", {}", rng.below(5) as i64 - 1),
                            _ => String::new(),
                        };
                        format!("string.gsub({s}, {p}, {repl}{limit})")
                    }
                }
            })
            .collect()
    }

    #[test]
    fn hardening_01_patterns_match_c_lua_on_generated_cases() {
        let cases = generated_cases(5000);
        assert_same(&cases);
    }

    /// A check that fails on its `fail_at`-th call, and counts its calls.
    fn failing_check(fail_at: usize) -> (Check, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        let check: Check = Arc::new(move || {
            if counter.fetch_add(1, Ordering::SeqCst) + 1 >= fail_at {
                Err(mlua::Error::RuntimeError("deadline passed".into()))
            } else {
                Ok(())
            }
        });
        (check, calls)
    }

    /// Runs `code` with this port installed as `string.*` and the given check.
    fn run_with(check: Check, code: &str) -> mlua::Result<String> {
        let lua = bare_lua();
        let string: Table = lua.globals().get("string").unwrap();
        install(&lua, &string, check).unwrap();
        let values: MultiValue = lua.load(code).eval()?;
        Ok(values.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(","))
    }

    #[test]
    fn hardening_01_catastrophic_pattern_stops_when_the_check_fails() {
        let (check, calls) = failing_check(5);
        let err = run_with(check, r##"return string.find(string.rep("a", 100000), ".-.-.-.-b")"##).unwrap_err();
        assert!(err.to_string().contains("deadline passed"), "{err}");
        // It stopped at the failing call: no match work went on after the check said no.
        assert_eq!(calls.load(Ordering::SeqCst), 5);

        // From a match inside a replacement function, through the outer gsub, the same way.
        let (check, calls) = failing_check(3);
        let err = run_with(
            check,
            r#"return string.gsub("xy", "%w", function() return string.find(string.rep("a", 100000), ".-.-.-b") end)"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("deadline passed"), "{err}");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn hardening_01_catastrophic_pattern_gives_lua_answer_when_the_check_passes() {
        let (lua, c, r) = state_with(always_ok());
        let code = r##"
            local C, R = ...
            local s = string.rep("a", 30)
            local results = {}
            for _, impl in ipairs({C, R}) do
              local a, b = impl.find(s, ".-.-.-.-b")
              local x, y = impl.find(s .. "b", ".-.-.-.-b")
              local m = impl.match(s .. "b", "(.-)(.-)b")
              results[#results + 1] = tostring(a) .. tostring(b) .. x .. y .. m
            end
            return results[1], results[2]
        "##;
        let (expected, got): (String, String) = lua.load(code).call((c, r)).unwrap();
        assert_eq!(expected, "nilnil131");
        assert_eq!(expected[..6], got[..6]);
        assert_eq!(expected, got);
    }

    #[test]
    fn hardening_01_every_long_loop_reaches_the_check() {
        // Each of these does work that grows with its input inside one step of the matcher, were
        // that step not chunked: the check must be reached before it ends.
        let heavy = [
            (
                "plain search, long needle",
                r##"string.find(string.rep("a", 100000), string.rep("a", 1000) .. "b", 1, true)"##,
            ),
            ("plain search, long subject", r##"string.find(string.rep("a", 4000000), "b", 1, true)"##),
            ("looking for specials", r#"string.find("a", string.rep("a", 4000000))"#),
            ("no specials", r##"string.find(string.rep("a", 100000), string.rep("a", 1000) .. "b")"##),
            ("balance", r##"string.find(string.rep("(", 100000), "%b()")"##),
            ("long set", r##"string.find(string.rep("b", 2000), "[" .. string.rep("a", 100000) .. "]")"##),
            ("long set, frontier", r##"string.find(string.rep("b", 2000), "%f[" .. string.rep("a", 100000) .. "]")"##),
            ("back-reference", r##"string.match(string.rep("a", 20000), "(.*)%1x")"##),
            ("long literal", r##"string.find(string.rep("a", 100000), "." .. string.rep("a", 50000) .. "b")"##),
            ("max expand", r##"string.match(string.rep("a", 4000000), ".*")"##),
            ("replacement", r##"string.gsub(string.rep("a", 2000), "(x*)", string.rep("%1", 100000))"##),
            ("gmatch", r##"string.gmatch(string.rep("a", 100000), ".-.-.-b")()"##),
            ("gsub", r##"string.gsub(string.rep("a", 100000), ".-.-.-b", "")"##),
        ];
        for (what, code) in heavy {
            let (check, calls) = failing_check(1);
            let result = run_with(check, &format!("return {code}"));
            let err = result.expect_err(what);
            assert!(err.to_string().contains("deadline passed"), "{what}: {err}");
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{what}");
        }
    }

    #[test]
    fn hardening_01_pattern_errors_are_strings_with_the_callers_position() {
        let lua = bare_lua();
        let string: Table = lua.globals().get("string").unwrap();
        install(&lua, &string, always_ok()).unwrap();
        let code = r##"
            local ok, err = pcall(function()
              local x = string.find("a", "[")
              return x
            end)
            return type(err), err
        "##;
        let (kind, msg): (String, String) = lua.load(code).set_name("=script").eval().unwrap();
        assert_eq!(kind, "string");
        assert_eq!(msg, "script:3: malformed pattern (missing ']')");
    }

    /// The one known difference: a tail call to a Lua function drops the caller's frame, so
    /// the error of a tail-called pattern function can name neither the caller's line nor the
    /// name the caller used. C Lua keeps the frame for a tail call to a C function.
    #[test]
    fn hardening_01_tail_call_errors_lose_the_callers_position() {
        let (lua, c, r) = state_with(always_ok());
        let code = r#"
            local impl = ...
            local function f() return impl.find(nil) end
            local function g() return impl.find("a", "[") end
            local _, e1 = pcall(f)
            local _, e2 = pcall(g)
            return e1, e2
        "#;
        let run = |imp: &Table| -> (String, String) { lua.load(code).set_name("=script").call(imp.clone()).unwrap() };
        assert_eq!(
            run(&c),
            (
                "script:3: bad argument #1 to 'find' (string expected, got nil)".to_string(),
                "script:4: malformed pattern (missing ']')".to_string()
            )
        );
        assert_eq!(
            run(&r),
            (
                "bad argument #1 to '?' (string expected, got nil)".to_string(),
                "malformed pattern (missing ']')".to_string()
            )
        );
    }

    #[test]
    fn hardening_01_gsub_output_respects_the_memory_cap() {
        let lua = bare_lua();
        let string: Table = lua.globals().get("string").unwrap();
        install(&lua, &string, always_ok()).unwrap();
        lua.set_memory_limit(lua.used_memory() + 8 * 1024 * 1024).unwrap();
        // 64 MiB of output from a 64 KiB subject: C Lua's buffer would hit the cap, so must ours.
        let code = r##"
            local ok, err = pcall(string.gsub, string.rep("a", 65536), "a", string.rep("b", 1024))
            return ok, err
        "##;
        let (ok, err): (bool, String) = lua.load(code).eval().unwrap();
        assert!(!ok);
        assert_eq!(err, "not enough memory");
    }

    #[test]
    fn memchr_and_plain_find_agree_with_a_naive_search() {
        let check = always_ok();
        let mut rng = Rng(42);
        for _ in 0..2000 {
            let hay: Vec<u8> = (0..rng.below(70)).map(|_| b"abc"[rng.below(3)]).collect();
            let needle: Vec<u8> = (0..rng.below(4)).map(|_| b"abc"[rng.below(3)]).collect();
            let byte = b"abcd"[rng.below(4)];
            assert_eq!(memchr(byte, &hay), hay.iter().position(|&b| b == byte));
            let naive =
                if needle.is_empty() { Some(0) } else { hay.windows(needle.len()).position(|w| w == &needle[..]) };
            let mut budget = Budget::new(&check);
            assert!(matches!(plain_find(&hay, &needle, &mut budget), Ok(found) if found == naive));
        }
    }

    /// Not a test of speed (nothing is asserted about time): prints how this port compares with
    /// C Lua on everyday patterns. Run with `cargo test --lib pattern_speed -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints a speed comparison with C Lua and asserts nothing; run it by hand"]
    fn pattern_speed() {
        let (lua, c, r) = state_with(always_ok());
        let line = (0..200).map(|i| format!("field{i}")).collect::<Vec<_>>().join(",");
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
        lua.globals().set("LINE", line).unwrap();
        lua.globals().set("TEXT", text).unwrap();
        let benches = [
            (
                "trim",
                200_000,
                r##"local s = "   hello world   " for i = 1, N do local r = f.match(s, "^%s*(.-)%s*$") end"##,
            ),
            (
                "find plain",
                200_000,
                r##"local s = "key=value; other=thing" for i = 1, N do local r = f.find(s, ";", 1, true) end"##,
            ),
            (
                "match number",
                200_000,
                r##"local s = "Content-Length: 12345" for i = 1, N do local r = f.match(s, "(%d+)") end"##,
            ),
            (
                "split on comma (200 fields)",
                2_000,
                r##"for i = 1, N do local n = 0 for w in f.gmatch(LINE, "[^,]+") do n = n + 1 end end"##,
            ),
            ("gsub words -> %0 (900 chars)", 2_000, r##"for i = 1, N do local r = f.gsub(TEXT, "%w+", "<%0>") end"##),
            ("gsub words -> function", 2_000, r##"for i = 1, N do local r = f.gsub(TEXT, "%w+", string.upper) end"##),
            (
                "backtracking .-.-b (300 a)",
                20,
                r##"local s = string.rep("a", 300) for i = 1, N do local r = f.find(s, ".-.-b") end"##,
            ),
        ];
        for (name, n, body) in benches {
            let mut times = Vec::new();
            for imp in [&c, &r] {
                let f: Function = lua.load(format!("local f, N = ... {body}")).into_function().unwrap();
                let start = Instant::now();
                f.call::<()>((imp.clone(), n)).unwrap();
                times.push(start.elapsed().as_secs_f64() * 1e6 / n as f64);
            }
            println!("{name:32} C {:9.2} us   Rust {:9.2} us   x{:.2}", times[0], times[1], times[1] / times[0]);
        }
    }
}
