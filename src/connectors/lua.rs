//! Lua connectors: `connector.scan(config)` returns items; each is checked against
//! `connector-item.schema.json` and streamed into sync like any other source.

use std::sync::OnceLock;

use mlua::Value;
use serde_json::Value as Json;

use super::{ConnectorError, Event, Item, Sink, SkipReason};
use crate::kb::{normalize_date, unix_to_rfc3339};
use crate::lua::{convert, CancelHandle, Limits, ScriptError, ScriptInfo, Vm};
use crate::schema::{Dialect, SchemaValidator};

pub struct LuaConnector {
    pub info: ScriptInfo,
    pub limits: Limits,
    pub cancel: CancelHandle,
}

/// What a scan produced, for `ctx connector test`.
#[derive(Debug, Default)]
pub struct ScanCounts {
    pub items: usize,
    pub invalid: usize,
}

impl LuaConnector {
    /// Runs `scan` and streams its items. Invalid items are skipped with a warning naming the field.
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
        let returned = vm.call(&scan, config).map_err(fail)?;
        let Value::Table(items) = returned else {
            return Err(ConnectorError::Source(format!(
                "{}: connector.scan must return an array of items, got a {}",
                self.info.display_path,
                returned.type_name()
            )));
        };
        let mut counts = ScanCounts::default();
        let len = items.raw_len();
        for i in 1..=len {
            let value: Value = items.raw_get(i).map_err(|e| ConnectorError::Source(e.to_string()))?;
            let event = match vm.result_json(&value) {
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
        Ok(counts)
    }
}

fn validator() -> &'static SchemaValidator {
    static V: OnceLock<SchemaValidator> = OnceLock::new();
    V.get_or_init(|| SchemaValidator::for_definition("ConnectorItem"))
}

/// Checks one item against the schema and fills in defaults.
pub fn item_from_json(json: Json) -> Result<Item, (Option<String>, String)> {
    let id = json.get("source_id").and_then(Json::as_str).map(str::to_owned);
    let problems = validator().problems(&json, Dialect::Json);
    if !problems.is_empty() {
        let text =
            problems.iter().map(|p| format!("{}: {}", field(&p.pointer()), p.message)).collect::<Vec<_>>().join("; ");
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
        updated_at: date("updated_at")?.unwrap_or_else(crate::kb::now_rfc3339),
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
