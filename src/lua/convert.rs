//! Lua values to JSON and back, with predictable arrays, a `json.null` sentinel, depth and size caps.
//!
//! - An empty Lua table encodes as `{}`. `json.array()` (or a table decoded from a JSON array)
//!   carries a marker metatable and encodes as `[]`, even when empty.
//! - A table whose keys are exactly 1..n encodes as an array; any other keys make an object
//!   (integer keys become strings).
//! - JSON `null` decodes to `json.null` (a light userdata), so `null` survives a round trip.
//! - Where a schema says what a value must be (a tool table, an agent's result, a connector
//!   item), an empty table becomes `[]` wherever the schema takes a list there and not an
//!   object ([`lists_where_expected`]): `parameters = {}`, `messages = {}`.

use mlua::{Lua, Table, Value};
use serde_json::{Map, Number, Value as Json};

/// Nesting deeper than this is refused (it also stops reference cycles).
pub const MAX_DEPTH: usize = 128;

const ARRAY_MARKER: &str = "ctx.json.array";

/// The metatable that marks a table as a JSON array.
pub fn array_metatable(lua: &Lua) -> mlua::Result<Table> {
    if let Ok(mt) = lua.named_registry_value::<Table>(ARRAY_MARKER) {
        return Ok(mt);
    }
    let mt = lua.create_table()?;
    mt.set("__name", "json.array")?;
    // Shared by every run of a VM: scripts may not reach it to change it.
    mt.set("__metatable", "json.array")?;
    lua.set_named_registry_value(ARRAY_MARKER, &mt)?;
    Ok(mt)
}

/// An empty table: `[]` when marked as an array, `{}` otherwise, and an error for a code-mode
/// pending call (an empty table whose metatable is named `PENDING_CALL`), which was meant to
/// be awaited rather than sent as `{}`.
fn empty_table(lua: &Lua, table: &Table, path: &str) -> Result<Json, ConvertError> {
    let Some(mt) = table.metatable() else { return Ok(Json::Object(Map::new())) };
    if is_marked_array(lua, table) {
        return Ok(Json::Array(Vec::new()));
    }
    if matches!(mt.raw_get::<Value>("__name"), Ok(Value::String(s)) if s.as_bytes() == PENDING_CALL.as_bytes()) {
        let at = if path.is_empty() { String::new() } else { format!(" at {path}") };
        return Err(ConvertError::Invalid(format!(
            "a pending tool call{at} is not a value: add :await() to get its result, as in ctx.search({{...}}):await()"
        )));
    }
    Ok(Json::Object(Map::new()))
}

/// The `__name` of the metatable of code mode's pending calls (see `code/prelude.lua`).
pub const PENDING_CALL: &str = "pending call";

fn is_marked_array(lua: &Lua, table: &Table) -> bool {
    match (table.metatable(), lua.named_registry_value::<Table>(ARRAY_MARKER)) {
        (Some(mt), Ok(marker)) => mt == marker,
        _ => false,
    }
}

// Static: per thread, the values the conversion on this thread visited; holds nothing of a config.
thread_local! {
    /// Values visited by [`to_json`] on this thread, for its deadline checks.
    static VISITS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Values [`to_json`] visits between two looks at the run's deadline.
const VISITS_PER_CHECK: u32 = 4096;

/// Converts a Lua value to JSON. `budget` is the most bytes of JSON allowed (roughly counted as
/// the value is walked, so a huge value is refused before it is built).
pub fn to_json(lua: &Lua, value: &Value, budget: usize) -> Result<Json, ConvertError> {
    let mut used = 0usize;
    convert(lua, value, 0, &mut used, budget, &mut String::new())
}

// Serde only, so it sits in the contract; scripts' values are measured with it here.
pub use crate::contract::text::json_size;

#[derive(Debug)]
pub enum ConvertError {
    TooLarge {
        size: usize,
    },
    Invalid(String),
    /// The run converting the value was stopped (its deadline passed, say) part way.
    Stopped,
}

impl std::fmt::Display for ConvertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConvertError::TooLarge { size } => write!(f, "the value is too large ({size} bytes of JSON or more)"),
            ConvertError::Invalid(message) => f.write_str(message),
            ConvertError::Stopped => f.write_str("the script was stopped while its value was converted"),
        }
    }
}

/// Counts one value visited, and every few thousand looks at the run's deadline.
fn visit() -> Result<(), ConvertError> {
    let check = VISITS.with(|v| {
        let n = v.get().wrapping_add(1);
        v.set(n);
        n.is_multiple_of(VISITS_PER_CHECK)
    });
    if check && super::bounds::current_run_stopped() {
        return Err(ConvertError::Stopped);
    }
    Ok(())
}

/// How a table converts (see [`to_json`]): a list of `len` items (its keys are exactly
/// `1..=len`), an object, or an empty table's `[]` or `{}`.
pub enum Shape {
    List(usize),
    Object,
    Empty(Json),
}

/// The [`Shape`] of `table`; an error for a pending call. Walks the table once, holding no entry.
pub fn shape(lua: &Lua, table: &Table, path: &str) -> Result<Shape, ConvertError> {
    shape_counted(lua, table, path).map(|(shape, _)| shape)
}

/// [`shape`], with how many entries it walked to tell.
fn shape_counted(lua: &Lua, table: &Table, path: &str) -> Result<(Shape, usize), ConvertError> {
    let len = table.raw_len();
    let mut entries = 0usize;
    for pair in table.pairs::<Value, Value>() {
        pair.map_err(|e| ConvertError::Invalid(e.to_string()))?;
        entries += 1;
        visit()?;
    }
    let shape = match (len, entries) {
        (_, 0) => Shape::Empty(empty_table(lua, table, path)?),
        (len, entries) if len == entries => Shape::List(len),
        _ => Shape::Object,
    };
    Ok((shape, entries))
}

/// A table key as JSON writes it, and the key itself (held in Rust, not as a Lua reference)
/// to look its value up again.
pub struct Key {
    pub text: String,
    raw: RawKey,
}

enum RawKey {
    Bytes(Vec<u8>),
    Integer(i64),
    Number(f64),
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.text == other.text
    }
}
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Key) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

/// The first `keep` keys of a table that converts to an object, in the order [`to_json`]
/// writes them, and how many keys it has. Only those `keep` are held, whatever the table's
/// size, and none as a Lua reference (a walk down nested wide tables would otherwise hold every
/// level's keys in mlua's million-slot reference stack).
pub fn first_keys(table: &Table, keep: usize, path: &str) -> Result<(Vec<Key>, usize), ConvertError> {
    let mut first = std::collections::BinaryHeap::new();
    let mut total = 0usize;
    for key in table.pairs::<Value, Value>().map(|p| p.map(|(k, _)| k)) {
        let key = key.map_err(|e| ConvertError::Invalid(e.to_string()))?;
        total += 1;
        visit()?;
        let text = key_text(&key, path)?;
        let full = first.len() >= keep;
        if full && first.peek().is_none_or(|last: &Key| text >= last.text) {
            continue;
        }
        // Copied only for a key that is kept (key_text took only strings and numbers).
        let raw = match &key {
            Value::String(s) => RawKey::Bytes(s.as_bytes().to_vec()),
            Value::Integer(i) => RawKey::Integer(*i),
            _ => RawKey::Number(key.as_f64().unwrap_or_default()),
        };
        if full {
            first.pop();
        }
        first.push(Key { text, raw });
    }
    Ok((first.into_sorted_vec(), total))
}

impl Key {
    pub fn value_in(&self, lua: &Lua, table: &Table) -> Result<Value, ConvertError> {
        let fail = |e: mlua::Error| ConvertError::Invalid(e.to_string());
        match &self.raw {
            RawKey::Bytes(bytes) => table.raw_get(lua.create_string(bytes).map_err(fail)?),
            RawKey::Integer(i) => table.raw_get(*i),
            RawKey::Number(n) => table.raw_get(*n),
        }
        .map_err(fail)
    }
}

/// A key as JSON writes it; an error for a key JSON cannot have.
fn key_text(key: &Value, path: &str) -> Result<String, ConvertError> {
    Ok(match key {
        Value::String(s) => s.to_string_lossy().to_string(),
        Value::Integer(i) => i.to_string(),
        Value::Number(n) => n.to_string(),
        other => return Err(bad_key(other, path)),
    })
}

/// The bytes a key takes in JSON (quotes included), counted without copying it.
fn key_size(key: &Value, path: &str) -> Result<usize, ConvertError> {
    Ok(match key {
        Value::String(s) => string_size(&s.as_bytes()),
        Value::Integer(i) => json_size(&i.to_string()),
        Value::Number(n) => json_size(&n.to_string()),
        other => return Err(bad_key(other, path)),
    })
}

fn bad_key(key: &Value, path: &str) -> ConvertError {
    let at = if path.is_empty() { String::new() } else { format!(" at {path}") };
    ConvertError::Invalid(format!("a table key of type {} cannot be a JSON key{at}", key.type_name()))
}

/// The bytes a Lua string takes as a JSON string, as [`to_json`] writes it (invalid UTF-8
/// replaced).
fn string_size(bytes: &[u8]) -> usize {
    match std::str::from_utf8(bytes) {
        Ok(text) => json_size(text),
        Err(_) => json_size(&String::from_utf8_lossy(bytes)),
    }
}

/// The most of a value's place kept for messages: deep nesting under long keys would
/// otherwise make the place as large as the value.
const MAX_PATH: usize = 256;

/// Appends `part` to `path` (bounded by [`MAX_PATH`], then `…`); the length to truncate back to.
/// Writes no more than fits, however long the part.
pub fn descend(path: &mut String, part: std::fmt::Arguments<'_>) -> usize {
    struct Bounded<'a>(&'a mut String);
    impl std::fmt::Write for Bounded<'_> {
        fn write_str(&mut self, text: &str) -> std::fmt::Result {
            let room = MAX_PATH.saturating_sub(self.0.len());
            if text.len() <= room {
                self.0.push_str(text);
                return Ok(());
            }
            let mut end = room;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            self.0.push_str(&text[..end]);
            Err(std::fmt::Error)
        }
    }
    let mark = path.len();
    if std::fmt::Write::write_fmt(&mut Bounded(path), part).is_err() && !path.ends_with('…') {
        path.push('…');
    }
    mark
}

/// The exact size of `value` as compact JSON (what [`json_size`] of [`to_json`]'s answer
/// gives), counted without building it; `TooLarge` past `cap`. Costs no memory, so a result too
/// large to convert whole can be measured before it is cut.
pub fn json_size_of(lua: &Lua, value: &Value, cap: usize) -> Result<usize, ConvertError> {
    let mut unlimited = usize::MAX;
    json_size_within(lua, value, cap, &mut unlimited)
}

/// [`json_size_of`] that also spends `allowance` visits, shared by many measurements: one
/// that would visit more than is left is `TooLarge` (its size then means nothing), so a caller
/// measuring level after level of one value spends a bounded total.
pub fn json_size_within(lua: &Lua, value: &Value, cap: usize, allowance: &mut usize) -> Result<usize, ConvertError> {
    let (mut size, mut visits) = (0usize, 0usize);
    let bound = cap.min(allowance.saturating_mul(8));
    let measured = measure(lua, value, 0, (&mut size, &mut visits), bound, &mut String::new());
    *allowance = allowance.saturating_sub(visits);
    measured.map(|()| size)
}

/// One step of [`json_size_of`]. Like [`to_json`], every value visited counts 8 bytes against
/// `cap` however small its JSON, and so does every entry walked to tell a table's shape: a
/// table that holds the same table many times over (a chain of them, each level twice, is
/// 2^depth paths) is refused after `cap / 8` of them.
fn measure(
    lua: &Lua,
    value: &Value,
    depth: usize,
    (size, visits): (&mut usize, &mut usize),
    cap: usize,
    path: &mut String,
) -> Result<(), ConvertError> {
    if depth > MAX_DEPTH {
        return Err(ConvertError::Invalid(format!("nested more than {MAX_DEPTH} levels deep at {path} (a cycle?)")));
    }
    *visits += 1;
    if visits.saturating_mul(8) > cap {
        return Err(ConvertError::TooLarge { size: (*size).max(visits.saturating_mul(8)) });
    }
    visit()?;
    *size += match value {
        Value::Table(table) => {
            let (shape, entries) = shape_counted(lua, table, path)?;
            // Telling the shape walked every entry: that is work too, and a measure bounded by
            // its visits must count it (or each level of a deep value would walk every level
            // below it before a single visit is counted).
            *visits += entries;
            if visits.saturating_mul(8) > cap {
                return Err(ConvertError::TooLarge { size: (*size).max(visits.saturating_mul(8)) });
            }
            match shape {
                Shape::Empty(_) => 2,
                Shape::List(len) => {
                    *size += 1 + len;
                    for i in 1..=len {
                        let item: Value = table.raw_get(i).map_err(|e| ConvertError::Invalid(e.to_string()))?;
                        let mark = descend(path, format_args!("[{i}]"));
                        measure(lua, &item, depth + 1, (&mut *size, &mut *visits), cap, path)?;
                        path.truncate(mark);
                    }
                    0
                }
                Shape::Object => {
                    for (entry, pair) in table.pairs::<Value, Value>().enumerate() {
                        let (key, item) = pair.map_err(|e| ConvertError::Invalid(e.to_string()))?;
                        *size += key_size(&key, path)? + 1 + usize::from(entry > 0);
                        // Counted before going down: a long key at every level stops here.
                        if *size > cap {
                            return Err(ConvertError::TooLarge { size: *size });
                        }
                        let mark = match &key {
                            Value::String(s) => {
                                descend(path, format_args!(".{}", String::from_utf8_lossy(&s.as_bytes())))
                            }
                            other => descend(path, format_args!(".{}", key_text(other, "")?)),
                        };
                        measure(lua, &item, depth + 1, (&mut *size, &mut *visits), cap, path)?;
                        path.truncate(mark);
                    }
                    2
                }
            }
        }
        Value::String(s) => string_size(&s.as_bytes()),
        scalar => json_size(&convert(lua, scalar, depth, &mut 0, usize::MAX, path)?),
    };
    if *size > cap {
        return Err(ConvertError::TooLarge { size: *size });
    }
    Ok(())
}

fn convert(
    lua: &Lua,
    value: &Value,
    depth: usize,
    used: &mut usize,
    budget: usize,
    path: &mut String,
) -> Result<Json, ConvertError> {
    let at = |path: &str| if path.is_empty() { String::new() } else { format!(" at {path}") };
    if depth > MAX_DEPTH {
        return Err(ConvertError::Invalid(format!("nested more than {MAX_DEPTH} levels deep{} (a cycle?)", at(path))));
    }
    fn charge(used: &mut usize, n: usize, budget: usize) -> Result<(), ConvertError> {
        *used += n;
        if *used > budget {
            Err(ConvertError::TooLarge { size: *used })
        } else {
            Ok(())
        }
    }
    // However small its JSON, every value visited is a Rust node built and a step taken: a
    // table that holds the same table thousands of times over is millions of visits.
    charge(used, 8, budget)?;
    visit()?;
    Ok(match value {
        Value::Nil => {
            charge(used, 4, budget)?;
            Json::Null
        }
        Value::LightUserData(ud) if ud.0.is_null() => {
            charge(used, 4, budget)?;
            Json::Null
        }
        Value::Boolean(b) => {
            charge(used, 5, budget)?;
            Json::Bool(*b)
        }
        Value::Integer(i) => {
            charge(used, 20, budget)?;
            Json::Number((*i).into())
        }
        Value::Number(n) => {
            charge(used, 24, budget)?;
            Number::from_f64(*n)
                .map(Json::Number)
                .ok_or_else(|| ConvertError::Invalid(format!("{n} is not a JSON number{}", at(path))))?
        }
        Value::String(s) => {
            let bytes = s.as_bytes();
            charge(used, bytes.len() + 2, budget)?;
            Json::String(String::from_utf8_lossy(&bytes).into_owned())
        }
        Value::Table(table) => {
            // No entry is held while the table is walked: each is converted as it is reached.
            // (Holding them took two slots each of mlua's reference stack, whose million
            // slots a 500,000-row result overflowed.)
            let len = table.raw_len();
            let mut entries = 0usize;
            if len > 0 {
                for pair in table.pairs::<Value, Value>() {
                    pair.map_err(|e| ConvertError::Invalid(e.to_string()))?;
                    entries += 1;
                    charge(used, 2, budget)?;
                }
            }
            if len > 0 && entries == len {
                let mut items = Vec::with_capacity(len);
                for i in 1..=len {
                    let item: Value = table.raw_get(i).map_err(|e| ConvertError::Invalid(e.to_string()))?;
                    let mark = descend(path, format_args!("[{i}]"));
                    items.push(convert(lua, &item, depth + 1, used, budget, path)?);
                    path.truncate(mark);
                }
                return Ok(Json::Array(items));
            }
            let mut keyed = Vec::new();
            for pair in table.pairs::<Value, Value>() {
                let (key, item) = pair.map_err(|e| ConvertError::Invalid(e.to_string()))?;
                if len == 0 {
                    charge(used, 2, budget)?;
                }
                let key = match key {
                    Value::String(s) => s.to_string_lossy().to_string(),
                    Value::Integer(i) => i.to_string(),
                    Value::Number(n) => n.to_string(),
                    other => {
                        return Err(ConvertError::Invalid(format!(
                            "a table key of type {} cannot be a JSON key{}",
                            other.type_name(),
                            at(path)
                        )))
                    }
                };
                charge(used, key.len() + 3, budget)?;
                let mark = descend(path, format_args!(".{key}"));
                let converted = convert(lua, &item, depth + 1, used, budget, path)?;
                path.truncate(mark);
                keyed.push((key, converted));
            }
            if keyed.is_empty() {
                return empty_table(lua, table, path);
            }
            // Lua's table order is arbitrary; sorted keys make results reproducible.
            keyed.sort_by(|a, b| a.0.cmp(&b.0));
            Json::Object(keyed.into_iter().collect())
        }
        other => {
            return Err(ConvertError::Invalid(format!(
                "a {} cannot be converted to JSON{}",
                other.type_name(),
                at(path)
            )))
        }
    })
}

/// The most empty tables one value is checked for.
const MAX_EMPTY_TABLES: usize = 64;

/// How many times the lists are checked again after they were all put in (see below).
const SETTLING_ROUNDS: usize = 3;

/// The one rule for a Lua `{}`: Lua has a single table type, so an empty table is both an empty
/// object and an empty list, and [`to_json`] writes it as `{}`. Where the schema turns that
/// object down and accepts an empty list instead, it was meant as a list: each empty object in
/// `value` becomes `[]` when that clears every problem at or under its place. `problems` lists
/// where a value breaks the schema (paths of keys and indexes).
///
/// An empty object the schema accepts stays an object (a free-form `default = {}`, `config`), and
/// so does one that no list would fix either (`{}` where a non-empty list is due): its message
/// then says what the place expects.
///
/// This runs in Rust after the script returned, where no deadline is checked, and a validation
/// costs as much as the value is large: the empty tables are tried all at once, so the whole
/// rule costs at most `1 + SETTLING_ROUNDS` validations however many there are. Empty objects
/// are leaves, so each one's problems are its own; the extra rounds settle the rare schema (a
/// `oneOf` above two of them) where putting one back changes what another needs.
pub fn lists_where_expected(value: &mut Json, problems: &dyn Fn(&Json) -> Vec<Vec<String>>) {
    let mut spots = Vec::new();
    empty_objects(value, &mut Vec::new(), &mut spots);
    if spots.is_empty() {
        return;
    }
    let under = |found: &[Vec<String>], spot: &[String]| found.iter().any(|p| p.starts_with(spot));
    let found = problems(value);
    spots.retain(|spot| under(&found, spot));
    for spot in &spots {
        if let Some(slot) = pointer_mut(value, spot) {
            *slot = Json::Array(Vec::new());
        }
    }
    for _ in 0..SETTLING_ROUNDS {
        if spots.is_empty() {
            return;
        }
        let found = problems(value);
        let (unfixed, fixed): (Vec<_>, Vec<_>) = spots.into_iter().partition(|spot| under(&found, spot));
        if unfixed.is_empty() {
            return;
        }
        for spot in &unfixed {
            if let Some(slot) = pointer_mut(value, spot) {
                *slot = Json::Object(Map::new());
            }
        }
        spots = fixed;
    }
}

/// The paths of the empty objects in `value`, outermost first, at most [`MAX_EMPTY_TABLES`].
fn empty_objects(value: &Json, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if out.len() >= MAX_EMPTY_TABLES {
        return;
    }
    match value {
        Json::Object(map) if map.is_empty() => out.push(path.clone()),
        Json::Object(map) => {
            for (key, item) in map {
                path.push(key.clone());
                empty_objects(item, path, out);
                path.pop();
            }
        }
        Json::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(i.to_string());
                empty_objects(item, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn pointer_mut<'a>(value: &'a mut Json, path: &[String]) -> Option<&'a mut Json> {
    path.iter().try_fold(value, |node, key| match node {
        Json::Object(map) => map.get_mut(key),
        Json::Array(items) => items.get_mut(key.parse::<usize>().ok()?),
        _ => None,
    })
}

/// Converts JSON to a Lua value. Arrays get the array marker; `null` becomes `json.null`.
pub fn to_lua(lua: &Lua, value: &Json) -> mlua::Result<Value> {
    Ok(match value {
        Json::Null => Value::NULL,
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Number(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::String(lua.create_string(s)?),
        Json::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                table.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            table.set_metatable(Some(array_metatable(lua)?))?;
            Value::Table(table)
        }
        Json::Object(map) => Value::Table(object_to_lua(lua, map)?),
    })
}

/// [`to_lua`] for an object, without wrapping it in a [`Json`] first.
pub fn object_to_lua(lua: &Lua, map: &Map<String, Json>) -> mlua::Result<Table> {
    let table = lua.create_table_with_capacity(0, map.len())?;
    for (key, item) in map {
        table.raw_set(key.as_str(), to_lua(lua, item)?)?;
    }
    Ok(table)
}

/// Parses JSON text straight into Lua values, with no JSON tree in between: every table and
/// string is allocated by Lua and so counted against the run's memory cap as it is built (a
/// `serde_json::Value` of a 28 MiB array took 1.1 GiB outside the cap). `check` runs every few
/// thousand values, so the deadline holds however large the text.
pub fn parse_to_lua(lua: &Lua, text: &[u8], check: &dyn Fn() -> mlua::Result<()>) -> mlua::Result<Value> {
    use serde::de::DeserializeSeed;
    let stash = std::cell::RefCell::new(None);
    let seed = Seed { lua, check, stash: &stash, count: &std::cell::Cell::new(0) };
    let mut reader = serde_json::Deserializer::from_slice(text);
    let parsed = seed.deserialize(&mut reader).and_then(|value| reader.end().map(|_| value));
    match (parsed, stash.into_inner()) {
        (_, Some(lua_error)) => Err(lua_error),
        (Ok(value), None) => Ok(value),
        (Err(e), None) => Err(mlua::Error::RuntimeError(e.to_string())),
    }
}

/// Builds one Lua value per JSON value. A Lua error (the memory cap, the deadline) is kept in
/// `stash` and the parse is stopped with a placeholder serde error.
#[derive(Clone, Copy)]
struct Seed<'a> {
    lua: &'a Lua,
    check: &'a dyn Fn() -> mlua::Result<()>,
    stash: &'a std::cell::RefCell<Option<mlua::Error>>,
    count: &'a std::cell::Cell<u32>,
}

/// Values between two calls of the check.
const VALUES_PER_CHECK: u32 = 4096;

impl Seed<'_> {
    fn lua<T, E: serde::de::Error>(&self, result: mlua::Result<T>) -> Result<T, E> {
        result.map_err(|e| {
            *self.stash.borrow_mut() = Some(e);
            E::custom("stopped")
        })
    }

    fn tick<E: serde::de::Error>(&self) -> Result<(), E> {
        let n = self.count.get().wrapping_add(1);
        self.count.set(n);
        if n.is_multiple_of(VALUES_PER_CHECK) {
            self.lua((self.check)())?;
        }
        Ok(())
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Value, E> {
        self.tick()?;
        Ok(Value::Boolean(v))
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Value, E> {
        self.tick()?;
        Ok(Value::Integer(v))
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Value, E> {
        self.tick()?;
        Ok(i64::try_from(v).map(Value::Integer).unwrap_or(Value::Number(v as f64)))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        self.tick()?;
        Ok(Value::Number(v))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Value, E> {
        self.tick()?;
        self.lua(self.lua.create_string(v)).map(Value::String)
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Value, E> {
        self.tick()?;
        Ok(Value::NULL)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.tick()?;
        let table = self.lua(self.lua.create_table())?;
        let mut i = 0;
        while let Some(item) = seq.next_element_seed(self)? {
            i += 1;
            self.lua(table.raw_set(i, item))?;
        }
        self.lua(array_metatable(self.lua).and_then(|mt| table.set_metatable(Some(mt))))?;
        Ok(Value::Table(table))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.tick()?;
        let table = self.lua(self.lua.create_table())?;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let key = self.lua(self.lua.create_string(key.as_ref()))?;
            let item = map.next_value_seed(self)?;
            self.lua(table.raw_set(key, item))?;
        }
        Ok(Value::Table(table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Dialect, SchemaValidator};
    use serde_json::json;

    fn settle(schema: Json, mut value: Json) -> Json {
        let validator = SchemaValidator::compile(schema).unwrap();
        lists_where_expected(&mut value, &|v| {
            validator.problems(v, Dialect::Json).into_iter().map(|p| p.path).collect()
        });
        value
    }

    #[test]
    fn an_empty_table_is_a_list_only_where_the_schema_wants_one() {
        let schema = json!({
            "type": "object",
            "properties": {
                "list": {"type": "array"},
                "object": {"type": "object"},
                "anything": {},
                "either": {"oneOf": [{"type": "array"}, {"type": "object", "required": ["kind"]}]},
                "non_empty": {"type": "array", "minItems": 1},
                "items": {"type": "array", "items": {"type": "object", "properties": {"tags": {"type": "array"}}}},
            },
        });
        let value = json!({"list": {}, "object": {}, "anything": {}, "either": {}, "non_empty": {}, "items": [{"tags": {}}, {}]});
        assert_eq!(
            settle(schema, value),
            // `non_empty` stays an object: no list would do there either, and its message says so.
            json!({"list": [], "object": {}, "anything": {}, "either": [], "non_empty": {}, "items": [{"tags": []}, {}]})
        );
    }

    /// Tables of more entries than mlua's reference stack has slots for pairs (a million) are
    /// converted: no entry is held while the table is walked.
    #[test]
    fn a_table_of_600_000_rows_and_one_of_600_000_keys_convert() {
        #[allow(clippy::disallowed_methods)]
        let lua = Lua::new();
        let rows: Table = lua.load("local t = {} for i = 1, 6e5 do t[i] = {i} end return t").eval().unwrap();
        let json = to_json(&lua, &Value::Table(rows), usize::MAX).unwrap();
        assert_eq!(json.as_array().map(Vec::len), Some(600_000));
        assert_eq!(json[599_999], serde_json::json!([600_000]));
        let keys: Table = lua.load("local t = {} for i = 1, 6e5 do t['k' .. i] = i end return t").eval().unwrap();
        let json = to_json(&lua, &Value::Table(keys), usize::MAX).unwrap();
        assert_eq!(json.as_object().map(|m| m.len()), Some(600_000));
        assert_eq!(json["k7"], 7);
    }

    #[test]
    fn messages_name_the_place_only_when_there_is_one() {
        #[allow(clippy::disallowed_methods)]
        let lua = Lua::new();
        let f: Value = lua.load("return function() end").eval().unwrap();
        let top = to_json(&lua, &f, usize::MAX).unwrap_err().to_string();
        assert_eq!(top, "a function cannot be converted to JSON");
        let nested: Value = lua.load("return {a = {0/0}}").eval().unwrap();
        let inner = to_json(&lua, &nested, usize::MAX).unwrap_err().to_string();
        assert!(inner.ends_with("is not a JSON number at .a[1]"), "{inner}");
    }

    /// A long key at every level is counted before the walk goes down, and a value's place in
    /// messages stays short.
    #[test]
    fn long_keys_nested_deep_are_refused_early_and_places_stay_short() {
        #[allow(clippy::disallowed_methods)]
        let lua = Lua::new();
        let deep: Value = lua
            .load("local k = ('k'):rep(1048576) local t = 1 for i = 1, 100 do t = {[k] = t} end return t")
            .eval()
            .unwrap();
        let err = json_size_of(&lua, &deep, 8 * 1024 * 1024).unwrap_err();
        assert!(matches!(err, ConvertError::TooLarge { size } if size < 10 * 1024 * 1024), "{err}");
        let too_deep: Value = lua
            .load("local k = ('k'):rep(1000) local t = 1 for i = 1, 140 do t = {[k] = t} end return t")
            .eval()
            .unwrap();
        for err in
            [json_size_of(&lua, &too_deep, usize::MAX).unwrap_err(), to_json(&lua, &too_deep, usize::MAX).unwrap_err()]
        {
            let message = err.to_string();
            assert!(
                message.contains("levels deep") && message.len() < 400,
                "{} bytes: {}",
                message.len(),
                &message[..200]
            );
        }
    }

    /// Nested wide objects: only the keys that can be kept are held, never as Lua references
    /// (four levels of 300,000 keys held 1.2 million and overflowed mlua's reference stack).
    #[test]
    fn nested_wide_objects_are_cut_without_holding_their_keys() {
        #[allow(clippy::disallowed_methods)]
        let lua = Lua::new();
        let script = "local t = 0 for level = 1, 4 do local o = {a = t} for i = 1, 3e5 do o['k' .. i] = i end t = o end return t";
        let value: Value = lua.load(script).eval().unwrap();
        // The cut itself is code mode's (`code::outcome`'s test of the same value).
        let (first, total) = match &value {
            Value::Table(t) => first_keys(t, 3, "").unwrap(),
            _ => unreachable!(),
        };
        let texts: Vec<&str> = first.iter().map(|k| k.text.as_str()).collect();
        assert_eq!((texts, total), (vec!["a", "k1", "k10"], 300_001));
    }
}
