//! Lua connectors: `connector.scan(config, context)` returns items; each is checked against
//! `connector-item.schema.json` and streamed into sync like any other source.
//!
//! `context` tells an incremental script where the last sync stopped: `context.last_sync`, when
//! the last successful sync started (nil before the first), and `context.state.get/set`, a small
//! key-value state kept per source (see [`super::state`]) that sync saves with the
//! documents, and only when the sync succeeds.
//!
//! What `scan()` returns lives in Lua memory, under the memory cap, but a string that several
//! items share is written once for each: 200 items sharing one 1 MiB string are 200 MiB of
//! documents, and more in the index. So the items are first measured against the connector's
//! `max_bytes` budget, each string counted once for every item it appears in, before anything is
//! converted; then converting and indexing them check the script's deadline after every item.

use std::sync::{Arc, Mutex, OnceLock};

use mlua::{Lua, Table, Value};
use serde_json::{Map, Value as Json};

use super::state::{self as connector_state, Saved};
use super::{ConnectorError, Event, Item, ScanEnd, Sink, SkipReason};
use crate::config::{Config, ScriptSection};
use crate::contract::time::{normalize_date, unix_to_rfc3339};
use crate::lua::{api, convert, CancelHandle, Limits, RunState, ScriptError, ScriptInfo, Vm};
use crate::schema::{Dialect, SchemaValidator};

pub struct LuaConnector {
    pub info: ScriptInfo,
    pub limits: Limits,
    pub cancel: CancelHandle,
    /// The section's `max_bytes`; `None` for the default (see [`LuaConnector::budget`]).
    pub max_bytes: Option<usize>,
    /// What the last successful sync left: the script's `context`.
    pub saved: Saved,
    /// Start over (`ctx sync --full`): the state the scan ends with replaces the saved one even
    /// if the script set nothing.
    pub fresh: bool,
}

/// The default `max_bytes`, in multiples of the memory cap. Items that share nothing already fit
/// in the memory cap; twice it leaves room for the small strings items legitimately share (an
/// author, a footer) while stopping a few large shared ones from multiplying.
const BUDGET_PER_MEMORY_CAP: usize = 2;

/// The longest source id, as connector-item.schema.json allows it.
const MAX_SOURCE_ID: usize = 1024;

/// How many tables and pairs the measuring walk visits between two deadline checks.
const CHECK_EVERY: u32 = 1024;

/// What a scan produced, for `ctx connector test`.
#[derive(Debug, Default)]
pub struct ScanCounts {
    pub items: usize,
    pub invalid: usize,
}

impl LuaConnector {
    /// The connector of a `[connectors.script.<name>]` section, with its limits and budget.
    pub fn for_section(config: &Config, section: &ScriptSection) -> Self {
        LuaConnector {
            info: ScriptInfo::from_section(section),
            limits: Limits::for_section(section),
            cancel: CancelHandle::new(),
            max_bytes: configured_max_bytes(config, &section.name),
            saved: Saved::default(),
            fresh: false,
        }
    }

    /// The same connector, told what the last successful sync of its source left.
    pub fn with_saved(self, saved: Saved) -> Self {
        LuaConnector { saved, fresh: false, ..self }
    }

    /// The same connector, starting over as on its first sync: no last sync, an empty state.
    pub fn afresh(self) -> Self {
        LuaConnector { saved: Saved::default(), fresh: true, ..self }
    }

    /// The most bytes of items one scan may hand to sync: `max_bytes`, or twice the memory cap.
    pub fn budget(&self) -> usize {
        self.max_bytes.unwrap_or(self.limits.memory_bytes.saturating_mul(BUDGET_PER_MEMORY_CAP))
    }

    /// Runs `scan` and streams its items. Invalid items are skipped with a warning naming the
    /// field. Items over the budget fail the scan before any is streamed.
    pub fn scan(&self, sink: &mut Sink<'_>) -> Result<ScanCounts, ConnectorError> {
        let fail = |e: ScriptError| {
            tracing::info!(connector = %self.info.name, "script error detail: {}", e.detail());
            ConnectorError::Source(e.to_string())
        };
        let vm = Vm::new(self.info.clone(), self.limits, self.cancel.clone()).map_err(fail)?;
        let ext = vm.load_extension("connector").map_err(fail)?;
        let scan = vm.function(&ext, "connector", "scan").map_err(fail)?;
        let config = convert::to_lua(vm.lua(), &Json::Object(self.info.config.clone()))
            .map_err(|e| ConnectorError::Source(format!("cannot pass config to the script: {e}")))?;
        let state = Arc::new(Mutex::new(State { values: self.saved.values.clone(), changed: self.fresh }));
        let context = context_table(vm.lua(), &self.saved, &state)
            .map_err(|e| ConnectorError::Source(format!("cannot pass the context to the script: {e}")))?;
        let returned = vm.call(&scan, (config, context)).map_err(fail)?;
        let (items, deleted) = self.parts(returned)?;
        let len = items.raw_len();
        let deadline = |e: mlua::Error| fail(vm.classify(&e));
        let mut meter = Meter { state: vm.state().as_ref(), budget: self.budget(), total: 0, visits: 0 };
        meter.total = deleted.iter().flatten().map(|id| id.len() + 2).sum();
        if meter.total > meter.budget {
            return Err(self.over_budget(0, len));
        }
        for i in 1..=len {
            let value: Value = items.raw_get(i).map_err(|e| ConnectorError::Source(e.to_string()))?;
            meter.add(&value, 0).map_err(deadline)?;
            if meter.total > meter.budget {
                return Err(self.over_budget(i, len));
            }
        }
        let mut counts = ScanCounts::default();
        for i in 1..=len {
            // Converting, chunking and writing run outside Lua, where the deadline hook never
            // fires: check it between items.
            vm.state().check().map_err(deadline)?;
            let value: Value = items.raw_get(i).map_err(|e| ConnectorError::Source(e.to_string()))?;
            let event = match vm.result_json_for(&value, validator()) {
                Ok(json) => match item_from_json(json) {
                    Ok(item) => {
                        counts.items += 1;
                        Event::Item(item)
                    }
                    Err((id, why)) => {
                        counts.invalid += 1;
                        Event::Skipped {
                            source_id: id.unwrap_or_else(|| format!("(item {i})")),
                            reason: SkipReason::Invalid(format!("item {i}: {why}")),
                        }
                    }
                },
                Err(e) => {
                    counts.invalid += 1;
                    Event::Skipped {
                        source_id: format!("(item {i})"),
                        reason: SkipReason::Invalid(format!("item {i}: {e}")),
                    }
                }
            };
            sink(event).map_err(ConnectorError::Sink)?;
        }
        vm.state().check().map_err(deadline)?;
        let state = std::mem::take(&mut *state.lock().unwrap_or_else(|p| p.into_inner()));
        let end = ScanEnd { state: state.changed.then_some(state.values), deleted };
        if end != ScanEnd::default() {
            sink(Event::End(end)).map_err(ConnectorError::Sink)?;
        }
        Ok(counts)
    }

    /// What `scan` returned: a list of every item (a full scan), or `{items = {...}, deleted =
    /// {...}}` (an incremental one: what changed, and the source ids of what was deleted).
    fn parts(&self, returned: Value) -> Result<(Table, Option<Vec<String>>), ConnectorError> {
        let path = &self.info.display_path;
        let wrong = |what: String| {
            ConnectorError::Source(format!(
                "{path}: connector.scan must return a list of items, or {{items = {{...}}, deleted = {{...}}}} \
                 for an incremental scan; {what}"
            ))
        };
        let Value::Table(table) = returned else {
            return Err(wrong(format!("it returned a {}", returned.type_name())));
        };
        let deleted = table.raw_get::<Value>("deleted").map_err(|e| wrong(e.to_string()))?;
        let items = match table.raw_get::<Value>("items").map_err(|e| wrong(e.to_string()))? {
            // Read as a full scan with no items, it would delete every document of the source.
            Value::Nil if !deleted.is_nil() => {
                return Err(wrong(
                    "it returned `deleted` without `items` (nothing was synced or deleted); return items = {} \
                     when nothing changed"
                        .to_string(),
                ))
            }
            Value::Nil => return Ok((table, None)),
            Value::Table(items) => items,
            other => return Err(wrong(format!("`items` is a {}", other.type_name()))),
        };
        let deleted = match deleted {
            Value::Nil => Vec::new(),
            Value::Table(ids) => {
                // Each id is copied out of Lua, where a list may hold one long string millions of
                // times: the copies count against the budget as they are made.
                let budget = self.budget();
                let mut total = 0usize;
                let mut out = Vec::new();
                for i in 1..=ids.raw_len() {
                    match ids.raw_get::<Value>(i).map_err(|e| wrong(e.to_string()))? {
                        Value::String(id) if !id.as_bytes().is_empty() && id.as_bytes().len() <= MAX_SOURCE_ID => {
                            total += id.as_bytes().len() + 2;
                            if total > budget {
                                return Err(self.over_budget(0, items.raw_len()));
                            }
                            out.push(id.to_string_lossy())
                        }
                        other => {
                            return Err(wrong(format!(
                                "deleted[{i}] must be a source id (1 to {MAX_SOURCE_ID} bytes of text), not {}",
                                match other {
                                    Value::String(_) => "an empty or longer string",
                                    other => other.type_name(),
                                }
                            )))
                        }
                    }
                }
                out
            }
            other => return Err(wrong(format!("`deleted` is a {}", other.type_name()))),
        };
        Ok((items, Some(deleted)))
    }

    fn over_budget(&self, item: usize, items: usize) -> ConnectorError {
        let budget = self.budget();
        let setting = match self.max_bytes {
            Some(_) => format!("its max_bytes of {budget}"),
            None => format!("its max_bytes budget of {budget} (the default: twice memory_mb)"),
        };
        ConnectorError::Source(format!(
            "{}: scan() returned more than {budget} bytes of items (passed at item {item} of {items}; a string \
             shared by several items counts once for each), over {setting}; nothing was synced. Return fewer or \
             smaller items, or raise max_bytes in [connectors.script.{}]",
            self.info.what(),
            self.info.name
        ))
    }
}

/// The script's `context.state` during one scan.
#[derive(Debug, Default)]
struct State {
    values: Map<String, Json>,
    /// `set` was called: the state is saved even if it ends as it began.
    changed: bool,
}

/// A `context.state` key as text, its length checked before anything copies it (a script may
/// pass a string as large as its memory cap).
fn state_key(function: &str, key: &mlua::LuaString) -> mlua::Result<String> {
    let bytes = key.as_bytes();
    if bytes.is_empty() || bytes.len() > connector_state::MAX_KEY_BYTES {
        return Err(api::fail(format!(
            "{function}: a key is 1 to {} bytes, got {}",
            connector_state::MAX_KEY_BYTES,
            bytes.len()
        )));
    }
    std::str::from_utf8(&bytes)
        .map(str::to_string)
        .map_err(|_| api::fail(format!("{function}: a key must be UTF-8 text")))
}

/// The second argument of `scan`: `source`, `last_sync` and `state.get/set`.
fn context_table(lua: &Lua, saved: &Saved, state: &Arc<Mutex<State>>) -> mlua::Result<Table> {
    let context = lua.create_table()?;
    if let Some(at) = &saved.last_success {
        context.raw_set("last_sync", at.as_str())?;
    }
    let table = lua.create_table()?;
    let values = Arc::clone(state);
    table.raw_set(
        "get",
        api::function(lua, "context.state.get", move |lua, key: mlua::LuaString| {
            let key = state_key("context.state.get", &key)?;
            let values = values.lock().unwrap_or_else(|p| p.into_inner());
            match values.values.get(&key) {
                Some(value) => convert::to_lua(lua, value),
                None => Ok(Value::Nil),
            }
        })?,
    )?;
    let values = Arc::clone(state);
    table.raw_set(
        "set",
        api::function(lua, "context.state.set", move |lua, (key, value): (mlua::LuaString, Value)| {
            let key = state_key("context.state.set", &key)?;
            let too_large = |size: usize| {
                api::fail(format!(
                    "context.state.set: the state would be {size} bytes of JSON or more, over its limit of {}; \
                     keep cursors and ids there, not documents",
                    connector_state::MAX_BYTES
                ))
            };
            let json = convert::to_json(lua, &value, connector_state::MAX_BYTES).map_err(|e| match e {
                convert::ConvertError::Stopped => crate::lua::script::stopped(),
                convert::ConvertError::TooLarge { size } => too_large(size),
                other => api::fail(format!("context.state.set: the value of {key:?}: {other}")),
            })?;
            let mut state = values.lock().unwrap_or_else(|p| p.into_inner());
            let old = match json {
                Json::Null => state.values.remove(&key),
                json => state.values.insert(key.clone(), json),
            };
            let size = serde_json::to_string(&state.values).map(|text| text.len()).unwrap_or(usize::MAX);
            if size > connector_state::MAX_BYTES {
                // Refused whole: the state stays as it was before this call.
                match old {
                    Some(old) => state.values.insert(key, old),
                    None => state.values.remove(&key),
                };
                return Err(too_large(size));
            }
            state.changed = true;
            Ok(())
        })?,
    )?;
    context.raw_set("state", table)?;
    Ok(context)
}

/// The `max_bytes` of the script connector `name`, if its section sets one.
pub fn configured_max_bytes(config: &Config, name: &str) -> Option<usize> {
    let (_, section) = config.spec.connectors.script.iter().find(|(n, _)| n.as_str() == name)?;
    section.max_bytes.map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Counts what items come to as JSON, charging each value as [`convert::to_json`] does, without
/// converting anything: strings and tables count every time they are reached, so sharing
/// multiplies them exactly as writing them would. Stops counting once past the budget.
struct Meter<'a> {
    state: &'a RunState,
    budget: usize,
    total: usize,
    visits: u32,
}

impl Meter<'_> {
    fn add(&mut self, value: &Value, depth: usize) -> mlua::Result<()> {
        if self.total > self.budget {
            return Ok(());
        }
        match value {
            Value::String(s) => self.total = self.total.saturating_add(s.as_bytes().len() + 2),
            // Deeper than conversion allows: that item is refused later, not written.
            Value::Table(_) if depth > convert::MAX_DEPTH => {}
            Value::Table(table) => {
                self.total += 2;
                for pair in table.pairs::<Value, Value>() {
                    let (key, item) = pair?;
                    // A shared table reached through many paths can make this walk long, with no
                    // Lua running to fire the deadline hook.
                    self.visits = self.visits.wrapping_add(1);
                    if self.visits.is_multiple_of(CHECK_EVERY) {
                        self.state.check()?;
                    }
                    self.add(&key, depth + 1)?;
                    self.add(&item, depth + 1)?;
                    if self.total > self.budget {
                        break;
                    }
                }
            }
            Value::Integer(_) => self.total += 20,
            Value::Number(_) => self.total += 24,
            Value::Boolean(_) => self.total += 5,
            _ => self.total += 4,
        }
        Ok(())
    }
}

fn validator() -> &'static SchemaValidator {
    // Static: immutable, a validator of a schema compiled into the binary; every application may share it.
    static V: OnceLock<SchemaValidator> = OnceLock::new();
    V.get_or_init(|| SchemaValidator::for_definition("ConnectorItem"))
}

/// The most problems an invalid item's warning lists.
const SHOWN_PROBLEMS: usize = 5;

/// Checks one item against the schema and fills in defaults.
pub fn item_from_json(json: Json) -> Result<Item, (Option<String>, String)> {
    let id = json.get("source_id").and_then(Json::as_str).map(str::to_owned);
    let problems = validator().problems(&json, Dialect::Json);
    if !problems.is_empty() {
        // An item with thousands of unknown fields would make a log line of megabytes.
        let mut text = problems
            .iter()
            .take(SHOWN_PROBLEMS)
            .map(|p| format!("{}: {}", field(&p.pointer()), p.message))
            .collect::<Vec<_>>()
            .join("; ");
        if problems.len() > SHOWN_PROBLEMS {
            text.push_str(&format!("; and {} more problem(s)", problems.len() - SHOWN_PROBLEMS));
        }
        return Err((id, text));
    }
    let text = |key: &str| json.get(key).and_then(Json::as_str).map(str::to_owned);
    let date = |key: &str| -> Result<Option<String>, (Option<String>, String)> {
        match json.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::Number(n)) => Ok(n.as_i64().and_then(unix_to_rfc3339)),
            Some(Json::String(s)) => normalize_date(s)
                .map(Some)
                .ok_or_else(|| (id.clone(), format!("{key}: {s:?} is not an ISO 8601 date or timestamp"))),
            Some(_) => Err((id.clone(), format!("{key}: expected a date string or unix seconds"))),
        }
    };
    let metadata = match json.get("metadata_json") {
        None => Json::Null,
        Some(Json::String(s)) => serde_json::from_str(s)
            .map_err(|e| (id.clone(), format!("metadata_json: the string is not JSON text ({e})")))?,
        Some(other) => other.clone(),
    };
    let source_id = id.clone().unwrap_or_default();
    Ok(Item {
        title: text("title").unwrap_or_else(|| source_id.clone()),
        body: text("body").unwrap_or_default(),
        content_type: text("content_type").unwrap_or_else(|| "text/plain".to_string()),
        source_url: text("source_url"),
        author: text("author"),
        created_at: date("created_at")?,
        updated_at: date("updated_at")?.unwrap_or_else(crate::contract::time::now_rfc3339),
        metadata,
        source_id,
    })
}

fn field(pointer: &str) -> String {
    if pointer.is_empty() {
        "the item".to_string()
    } else {
        pointer.trim_start_matches('/').replace('/', ".")
    }
}
