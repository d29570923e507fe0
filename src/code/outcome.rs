//! What crosses the script boundary: an inner call's result as the script sees it, and the
//! script's own result as a tool result, cut to its size limit without losing its shape.

use base64::Engine;
use mlua::{Lua, Value};
use serde::Deserialize;
use serde_json::{Map, Value as Json};

use crate::lua::convert::{self, ConvertError, Shape};

use crate::contract::text::json_size;
// What a script sees of an inner call's result is the contract's: a Lua tool's
// `context.call` sees the same.
pub use crate::contract::output::inner_value;
use crate::tools::Output;

/// Whether an output reports a failure (`isError`), without converting it.
pub fn failed(output: &Output) -> bool {
    match output {
        Output::HandledError(_) => true,
        Output::Upstream(raw) => raw.get("isError").and_then(Json::as_bool).unwrap_or(false),
        Output::Traced { output, .. } => failed(output),
        _ => false,
    }
}

/// The size of an output as JSON (an upstream's whole result), counted without building it.
pub fn size_of(output: &Output) -> usize {
    match output {
        Output::Value(v) | Output::HandledError(v) => json_size(v),
        Output::Text(t) => json_size(t),
        Output::Upstream(raw) => json_size(raw),
        Output::Content(blocks) => json_size(blocks),
        Output::Traced { output, .. } => size_of(output),
    }
}

/// The script's result as a tool result (seed 001): a table with keys is structured content
/// plus its JSON as text, an array or a primitive is text, and a full MCP result (a table with
/// a `content` list of typed blocks, and nothing but `structuredContent`, `isError` and `_meta`
/// besides) passes through as it is.
/// `Err` says what is wrong with a result that looks like a full MCP result but is not one.
pub fn script_output(value: Json) -> Result<Output, String> {
    match value {
        Json::String(text) => Ok(Output::Text(text)),
        Json::Object(map) if is_mcp_result(&map) => checked_mcp_result(&map).map(|()| Output::Upstream(map)),
        other => Ok(Output::Value(other)),
    }
}

/// Whether a result that was cut (see [`truncate_lua`]) had been a full MCP result: its keys are
/// an MCP result's (and the cut's `…`), and its first block still has a `type` or a `text`.
/// A cut would break its blocks, so such a result is refused instead.
pub fn was_mcp_result(value: &Json) -> bool {
    let Json::Object(map) = value else { return false };
    let Some(Json::Array(blocks)) = map.get("content") else { return false };
    let first_is_block =
        blocks.first().and_then(Json::as_object).is_some_and(|b| b.contains_key("type") || b.contains_key("text"));
    first_is_block
        && map.keys().all(|k| matches!(k.as_str(), "content" | "structuredContent" | "isError" | "_meta" | "…"))
}

/// Checks a full MCP result a script built as MCP clients will read it: every content block
/// valid, `structuredContent` and `_meta` objects, `isError` a boolean.
fn checked_mcp_result(map: &Map<String, Json>) -> Result<(), String> {
    let problem = |what: &str| {
        format!(
            "the script's result looks like a full MCP result (a `content` list of typed blocks) but {what}; \
             fix it, or return a plain table"
        )
    };
    if map.get("structuredContent").is_some_and(|v| !v.is_object()) {
        return Err(problem("its structuredContent is not a table with keys"));
    }
    if map.get("isError").is_some_and(|v| !v.is_boolean()) {
        return Err(problem("its isError is not a boolean"));
    }
    if map.get("_meta").is_some_and(|v| !v.is_object()) {
        return Err(problem("its _meta is not a table with keys"));
    }
    let blocks = map.get("content").and_then(Json::as_array).map_or(&[][..], Vec::as_slice);
    for (i, block) in blocks.iter().enumerate() {
        let at = |why: String| problem(&format!("content[{}] {why}", i + 1));
        if let Err(e) = rmcp::model::ContentBlock::deserialize(block) {
            return Err(at(format!(
                "is not a content block ({e}); a text block is {{type = \"text\", text = \"...\"}}"
            )));
        }
        // What the SDKs check and serde's types do not.
        let priority = block.pointer("/annotations/priority").and_then(Json::as_f64);
        if priority.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
            return Err(at("has an annotations.priority outside 0 to 1".to_string()));
        }
        for key in ["data", "blob"] {
            let encoded = block.get(key).or_else(|| block.pointer(&format!("/resource/{key}")));
            if let Some(text) = encoded.and_then(Json::as_str) {
                if base64::engine::general_purpose::STANDARD.decode(text).is_err() {
                    return Err(at(format!("has a {key} that is not base64 (base64.encode makes it)")));
                }
            }
        }
    }
    Ok(())
}

fn is_mcp_result(map: &Map<String, Json>) -> bool {
    let Some(Json::Array(blocks)) = map.get("content") else { return false };
    let typed = blocks.iter().all(|b| b.get("type").is_some_and(Json::is_string));
    typed && map.keys().all(|k| matches!(k.as_str(), "content" | "structuredContent" | "isError" | "_meta"))
}

/// What [`truncate`] cut.
#[derive(Clone, Debug, PartialEq)]
pub struct Cut {
    pub limit_bytes: usize,
    pub original_bytes: usize,
}

/// Strings, lists and objects below this many bytes are never cut further: a marker costs
/// about as much.
const SMALLEST: usize = 48;

/// How many whole measurements of its budget one cut may spend, over all its levels.
const MEASURES: usize = 4;

/// `value` cut to about `limit` bytes of JSON, keeping its shape: a long string keeps its
/// start and says how much was cut, a long list keeps its first items and ends with a string
/// saying how many more there were, an object keeps its first keys and says how many it lost.
pub fn truncate(value: Json, limit: usize) -> (Json, Option<Cut>) {
    let original = json_size(&value);
    if original <= limit {
        return (value, None);
    }
    let (cut, _) = shrink(value, limit.max(SMALLEST));
    (cut, Some(Cut { limit_bytes: limit, original_bytes: original }))
}

/// [`truncate`] for a script's result as Lua holds it, converting little more of it than is
/// kept. The JSON a run builds is not Lua memory, so it is bounded here instead: a result of
/// many MiB (often the same strings and tables referenced many times over, small in Lua) is
/// measured without being built, then cut while it is converted. `cap` bounds what is measured.
pub fn truncate_lua(lua: &Lua, value: &Value, limit: usize, cap: usize) -> Result<(Json, Option<Cut>), ConvertError> {
    // Most results are small: converted whole, in one walk.
    match convert::to_json(lua, value, limit.saturating_mul(2)) {
        Ok(json) => return Ok(truncate(json, limit)),
        Err(ConvertError::TooLarge { .. }) => {}
        Err(e) => return Err(e),
    }
    let original = convert::json_size_of(lua, value, cap)?;
    if original <= limit {
        // The walk's rough count was over; the exact size bounds the conversion.
        return Ok((convert::to_json(lua, value, usize::MAX)?, None));
    }
    let budget = limit.max(SMALLEST);
    // Each level measures what it holds before it is cut, so a deep value would be measured
    // once per level: all of the levels share a few budgets' worth of visits, and a level
    // that finds none left is cut entry by entry (the same cut, built only as far as kept).
    let mut allowance = MEASURES * (budget / 8 + 1);
    let (cut, _) = shrink_lua(lua, value, budget, &mut allowance, &mut String::new())?;
    Ok((cut, Some(Cut { limit_bytes: limit, original_bytes: original })))
}

/// [`shrink`] of a Lua value: what fits in `budget` is converted whole (measured first, so
/// nothing larger is built); a table that does not fit keeps what fits of it, read entry by
/// entry.
fn shrink_lua(
    lua: &Lua,
    value: &Value,
    budget: usize,
    allowance: &mut usize,
    path: &mut String,
) -> Result<(Json, usize), ConvertError> {
    let Value::Table(table) = value else {
        // A string is no larger here than the Lua memory that holds it.
        return Ok(shrink(convert::to_json(lua, value, usize::MAX)?, budget));
    };
    match convert::json_size_within(lua, value, budget, allowance) {
        Ok(size) => return Ok((convert::to_json(lua, value, usize::MAX)?, size)),
        Err(ConvertError::TooLarge { .. }) => {}
        Err(e) => return Err(e),
    }
    match convert::shape(lua, table, path)? {
        Shape::Empty(json) => Ok((json, 2)),
        Shape::List(len) => {
            let mut kept = Vec::new();
            let mut used = 2;
            for i in 1..=len {
                let left = budget.saturating_sub(used + SMALLEST);
                if left < SMALLEST {
                    break;
                }
                let item: Value = table.raw_get(i).map_err(|e| ConvertError::Invalid(e.to_string()))?;
                let mark = convert::descend(path, format_args!("[{i}]"));
                let (item, item_size) = shrink_lua(lua, &item, left, allowance, path)?;
                path.truncate(mark);
                used += item_size + usize::from(!kept.is_empty());
                kept.push(item);
            }
            used += items_cut(&mut kept, len);
            Ok((Json::Array(kept), used))
        }
        Shape::Object => {
            // Each kept key takes at least its quotes, colon, comma and SMALLEST bytes of value.
            let (keys, total) = convert::first_keys(table, budget / (4 + SMALLEST) + 1, path)?;
            let mut kept = Map::new();
            let mut used = 2;
            for key in keys {
                // Keys that read the same in JSON (1 and "1", invalid UTF-8) are one key there.
                if kept.contains_key(&key.text) {
                    continue;
                }
                let key_size = 2 + escaped_len(&key.text) + 1;
                let left = budget.saturating_sub(used + key_size + 1 + SMALLEST);
                if left < SMALLEST {
                    break;
                }
                let item = key.value_in(lua, table)?;
                let mark = convert::descend(path, format_args!(".{}", key.text));
                let (item, item_size) = shrink_lua(lua, &item, left, allowance, path)?;
                path.truncate(mark);
                used += key_size + item_size + usize::from(!kept.is_empty());
                kept.insert(key.text, item);
            }
            used += keys_cut(&mut kept, total);
            Ok((Json::Object(kept), used))
        }
    }
}

/// Ends a list cut from `total` items with a string saying how many were cut; its bytes.
fn items_cut(kept: &mut Vec<Json>, total: usize) -> usize {
    let more = total - kept.len();
    if more == 0 {
        return 0;
    }
    let marker = Json::String(format!("… {more} more item(s) cut"));
    let size = json_size(&marker) + usize::from(!kept.is_empty());
    kept.push(marker);
    size
}

/// Ends an object cut from `total` keys with a `…` key saying how many were cut; its bytes.
fn keys_cut(kept: &mut Map<String, Json>, total: usize) -> usize {
    let more = total - kept.len();
    if more == 0 {
        return 0;
    }
    let marker = Json::String(format!("{more} more key(s) cut"));
    let size = 2 + escaped_len("…") + 1 + json_size(&marker) + usize::from(!kept.is_empty());
    kept.insert("…".to_string(), marker);
    size
}

/// `value` cut to about `budget` bytes, and its exact size as JSON. Each part's size is
/// counted once, as it is built, so cutting costs O(what is kept), however deep the value.
fn shrink(value: Json, budget: usize) -> (Json, usize) {
    match value {
        Json::String(s) => {
            let whole = 2 + escaped_len(&s);
            if whole <= budget {
                return (Json::String(s), whole);
            }
            let keep = budget.saturating_sub(SMALLEST);
            // JSON escaping can make the kept text longer than its bytes; cut on the escaped
            // size so the budget holds for text full of quotes or control characters.
            let mut end = 0;
            let mut escaped = 0;
            for (i, c) in s.char_indices() {
                let width = char_width(c);
                if escaped + width > keep {
                    break;
                }
                escaped += width;
                end = i + c.len_utf8();
            }
            let cut = Json::String(format!("{}… [{} more bytes cut]", &s[..end], s.len() - end));
            let cut_size = json_size(&cut);
            (cut, cut_size)
        }
        Json::Array(items) => {
            let total = items.len();
            let mut kept = Vec::new();
            let mut used = 2;
            for item in items {
                let left = budget.saturating_sub(used + SMALLEST);
                if left < SMALLEST {
                    break;
                }
                let (item, item_size) = shrink(item, left);
                used += item_size + usize::from(!kept.is_empty());
                kept.push(item);
            }
            used += items_cut(&mut kept, total);
            (Json::Array(kept), used)
        }
        Json::Object(map) => {
            let total = map.len();
            let mut kept = Map::new();
            let mut used = 2;
            for (key, item) in map {
                let key_size = 2 + escaped_len(&key) + 1;
                let left = budget.saturating_sub(used + key_size + 1 + SMALLEST);
                if left < SMALLEST {
                    break;
                }
                let (item, item_size) = shrink(item, left);
                used += key_size + item_size + usize::from(!kept.is_empty());
                kept.insert(key, item);
            }
            used += keys_cut(&mut kept, total);
            (Json::Object(kept), used)
        }
        other => {
            let other_size = json_size(&other);
            (other, other_size)
        }
    }
}

/// The bytes `text` takes inside a JSON string, quotes left out.
fn escaped_len(text: &str) -> usize {
    text.chars().map(char_width).sum()
}

/// The bytes one character takes inside a JSON string (as serde_json writes it).
fn char_width(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn code_18_truncation_keeps_the_shape_and_says_what_was_cut() {
        let rows: Vec<Json> = (0..1000).map(|i| json!({"id": i, "title": "x".repeat(100)})).collect();
        let value = json!({"count": 1000, "rows": rows, "note": "y".repeat(5000)});
        let (cut, what) = truncate(value, 4096);
        let what = what.expect("it was cut");
        assert_eq!(what.limit_bytes, 4096);
        assert!(what.original_bytes > 100_000);
        assert!(json_size(&cut) <= 4096 + 256, "{} bytes", json_size(&cut));
        assert_eq!(cut["count"], 1000);
        let rows = cut["rows"].as_array().unwrap();
        assert!(rows[0]["id"] == 0 && rows.len() > 2);
        assert!(rows.last().unwrap().as_str().unwrap().contains("more item(s) cut"));
    }

    /// The Lua side measures exactly what the JSON side would, and cuts the same way.
    #[test]
    fn code_18_truncate_lua_matches_truncate() {
        #[allow(clippy::disallowed_methods)]
        let lua = Lua::new();
        let script = r#"
            local rows = {}
            for i = 1, 300 do rows[i] = {id = i, title = ('t\n"' .. i):rep(20), score = i / 7, tags = {}} end
            return {count = 300, rows = rows, note = ('é'):rep(3000), [5] = true, nested = {{{'deep'}}}, bytes = '\255\254ok'}
        "#;
        let value: Value = lua.load(script).eval().unwrap();
        let whole = convert::to_json(&lua, &value, usize::MAX).unwrap();
        assert_eq!(convert::json_size_of(&lua, &value, usize::MAX).unwrap(), json_size(&whole));
        for limit in [100, 1000, 4096, 20_000, 10_000_000] {
            let (cut, what) = truncate_lua(&lua, &value, limit, usize::MAX).unwrap();
            assert_eq!((cut, what), truncate(whole.clone(), limit), "limit {limit}");
        }
        let err = truncate_lua(&lua, &value, 100, 50_000).unwrap_err();
        assert!(matches!(err, ConvertError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn code_18_shrink_counts_the_size_it_builds() {
        let value = json!({"a\"b": ["x\n\u{1}y".repeat(300), 1, null, {"k": "é".repeat(400)}], "z": [1, 2, 3]});
        for budget in [64, 200, 500, 1000, 5000] {
            let (cut, counted) = shrink(value.clone(), budget);
            assert_eq!(counted, serde_json::to_vec(&cut).unwrap().len(), "budget {budget}: {cut}");
        }
    }

    /// The worst a result can be for cutting: nested as deep as conversion allows (128), with
    /// a long text at every level, 60 MB in all. Each level is counted once.
    #[test]
    fn code_18_cutting_a_deep_result_counts_each_level_once() {
        let mut value = json!("end");
        for _ in 0..127 {
            value = json!([value, "x".repeat(480_000)]);
        }
        let started = std::time::Instant::now();
        let (cut, what) = truncate(value, 1024 * 1024);
        println!("cut 60 MB nested 128 deep to 1 MiB in {:?}", started.elapsed());
        assert!(what.is_some());
        assert!(json_size(&cut) <= 1024 * 1024, "{}", json_size(&cut));
    }

    #[test]
    fn code_18_small_results_are_untouched() {
        let value = json!({"a": [1, 2, 3], "b": "text"});
        assert_eq!(truncate(value.clone(), 1024), (value, None));
    }

    #[test]
    fn code_18_a_cut_string_stays_within_budget_when_escaped() {
        let (cut, _) = truncate(Json::String("\"".repeat(10_000)), 1000);
        assert!(json_size(&cut) <= 1000, "{}", json_size(&cut));
    }

    #[test]
    fn code_18_inner_results_reach_lua_as_tables() {
        assert_eq!(inner_value(Output::Text("{\"a\":1}".into())), Ok(json!({"a": 1})));
        assert_eq!(inner_value(Output::Text("plain".into())), Ok(json!("plain")));
        let raw = json!({"content": [{"type": "text", "text": "t"}], "structuredContent": {"s": 2}});
        assert_eq!(inner_value(Output::Upstream(raw.as_object().unwrap().clone())), Ok(json!({"s": 2})));
        let failed = json!({"content": [{"type": "text", "text": "boom"}], "isError": true});
        let failed = Output::Upstream(failed.as_object().unwrap().clone());
        assert!(super::failed(&failed));
        assert_eq!(inner_value(failed), Err("boom".to_string()));
        assert_eq!(inner_value(Output::HandledError(json!({"error": "no"}))), Err("no".to_string()));
        let value = Output::Value(json!({"k": [1, 2]}));
        assert_eq!(size_of(&value), serde_json::to_vec(&value.value()).unwrap().len());
    }

    #[test]
    fn code_18_script_results_map_like_seed_001() {
        assert!(matches!(script_output(json!({"sum": 8})), Ok(Output::Value(_))));
        assert!(matches!(script_output(json!("hi")), Ok(Output::Text(_))));
        let full = json!({"content": [{"type": "text", "text": "t"}], "isError": false});
        assert!(matches!(script_output(full), Ok(Output::Upstream(_))));
        // A table that merely has a content key is data.
        assert!(matches!(script_output(json!({"content": "x", "other": 1})), Ok(Output::Value(_))));
        // One that looks like an MCP result but is not a valid one says what is wrong.
        for (bad, says) in [
            (json!({"content": [{"type": "bogus"}]}), "content[1] is not a content block"),
            (json!({"content": [{"type": "text", "text": "a"}, {"type": "text"}]}), "content[2]"),
            (json!({"content": [{"type": "text", "text": 5}]}), "content[1]"),
            (json!({"content": [{"type": "text", "text": "a"}], "structuredContent": "s"}), "structuredContent"),
            (json!({"content": [], "isError": "yes"}), "isError is not a boolean"),
            (json!({"content": [], "_meta": [1]}), "_meta"),
            (json!({"content": [{"type": "text", "text": "a", "annotations": {"priority": 7}}]}), "priority"),
            (json!({"content": [{"type": "image", "data": "not base64!", "mimeType": "image/png"}]}), "not base64"),
        ] {
            let err = script_output(bad.clone()).err().unwrap_or_else(|| panic!("{bad} passed"));
            assert!(err.contains(says) && err.contains("looks like a full MCP result"), "{bad}: {err}");
        }
    }

    /// Nested wide objects (four levels of 300,000 keys) are cut to the limit with their shape
    /// (`lua::convert` checks that only the keys kept are held).
    #[test]
    fn nested_wide_objects_are_cut_without_holding_their_keys() {
        #[allow(clippy::disallowed_methods)]
        let lua = mlua::Lua::new();
        let script = "local t = 0 for level = 1, 4 do local o = {a = t} for i = 1, 3e5 do o['k' .. i] = i end t = o end return t";
        let value: mlua::Value = lua.load(script).eval().unwrap();
        let (cut, what) = truncate_lua(&lua, &value, 4096, usize::MAX).unwrap();
        assert!(what.is_some() && json_size(&cut) <= 4096 + 256, "{}", json_size(&cut));
        assert!(cut["a"]["a"].is_object(), "{cut}");
    }
}
