//! Reading `ctx.toml`: TOML text to JSON (for schema validation) and key paths to line numbers.

use serde_json::{Map, Number, Value};
use toml::de::{DeTable, DeValue};

/// A TOML syntax error, with its 1-based position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Parses TOML text into a JSON value (datetimes become RFC 3339 strings).
pub fn to_json(text: &str) -> Result<Value, SyntaxError> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map(|s| position(text, s.start)).unwrap_or((1, 1));
        SyntaxError { line, column, message: e.message().trim().to_string() }
    })?;
    Ok(convert(toml::Value::Table(table)))
}

fn convert(value: toml::Value) -> Value {
    match value {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::Number(i.into()),
        toml::Value::Float(f) => Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null),
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(items) => Value::Array(items.into_iter().map(convert).collect()),
        toml::Value::Table(table) => {
            Value::Object(table.into_iter().map(|(k, v)| (k, convert(v))).collect::<Map<_, _>>())
        }
    }
}

/// The 1-based line of the deepest existing key along `path`, if the text parses.
pub fn line_of(text: &str, path: &[String]) -> Option<usize> {
    let root = DeTable::parse(text).ok()?;
    let mut best: Option<usize> = None;
    let mut table: Option<&DeTable<'_>> = Some(root.get_ref());
    let mut array: Option<&[toml::Spanned<DeValue<'_>>]> = None;
    for segment in path {
        let node = if let Some(t) = table {
            let Some((key, value)) = t.iter().find(|(k, _)| k.get_ref().as_ref() == segment.as_str()) else {
                break;
            };
            let span = key.span();
            if span.start < span.end {
                best = Some(position(text, span.start).0);
            }
            value
        } else if let Some(items) = array {
            let Some(item) = segment.parse::<usize>().ok().and_then(|i| items.get(i)) else {
                break;
            };
            let span = item.span();
            if span.start < span.end {
                best = Some(position(text, span.start).0);
            }
            item
        } else {
            break;
        };
        table = node.get_ref().as_table();
        array = node.get_ref().as_array().map(|a| &a[..]);
        if table.is_none() && array.is_none() {
            break;
        }
    }
    best
}

fn position(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_lines_of_nested_keys() {
        let text = "[db]\npath = \"x\"\n\n[tools.script.jira]\npath = \"j.lua\"\ntimeout = \"30s\"\n";
        let path = |p: &str| p.split('.').map(String::from).collect::<Vec<_>>();
        assert_eq!(line_of(text, &path("db.path")), Some(2));
        assert_eq!(line_of(text, &path("tools.script.jira.timeout")), Some(6));
        // A missing key points at its parent.
        assert_eq!(line_of(text, &path("tools.script.jira.nope")), Some(4));
    }

    #[test]
    fn syntax_errors_have_positions() {
        let err = to_json("[db]\npath = \n").unwrap_err();
        assert_eq!(err.line, 2);
    }
}
