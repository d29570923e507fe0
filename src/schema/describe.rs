//! Words a jsonschema error as "<path>: expected <what the schema wants>, got <value>".
//!
//! The expectation is read from the schema itself (type, bounds, enum, pattern), so a message
//! such as `tools.script.jira.timeout: expected integer ≥ 1, got "30s"` stays true when the
//! schema changes.

use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use jsonschema::ValidationError;
use serde_json::Value;

/// How paths and types are spelled for the reader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// Config files: dotted key paths (`server.bind`), TOML type names (`table`).
    Toml,
    /// Request bodies: JSON pointers (`/priority`), JSON type names (`object`).
    Json,
}

/// One validation problem: where, and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Path segments of the offending value inside the instance.
    pub path: Vec<String>,
    /// What was wrong, and what was expected.
    pub message: String,
}

impl Problem {
    /// The path as a dotted key (`tools.script.jira.timeout`, `a."odd key"`), or `(top level)`.
    pub fn dotted(&self) -> String {
        if self.path.is_empty() {
            return "(top level)".to_string();
        }
        let bare = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        self.path.iter().map(|s| if bare(s) { s.clone() } else { format!("{s:?}") }).collect::<Vec<_>>().join(".")
    }

    /// The path as a JSON pointer (`/priority`), or `""` for the whole instance.
    pub fn pointer(&self) -> String {
        self.path.iter().map(|s| format!("/{}", s.replace('~', "~0").replace('/', "~1"))).collect()
    }
}

pub(super) fn problems(error: &ValidationError<'_>, document: &Value, dialect: Dialect) -> Vec<Problem> {
    let path: Vec<String> = error
        .instance_path()
        .iter()
        .map(|segment| match segment {
            LocationSegment::Property(p) => p.to_string(),
            LocationSegment::Index(i) => i.to_string(),
        })
        .collect();
    let keyword_path: Vec<String> = error
        .schema_path()
        .iter()
        .map(|segment| match segment {
            LocationSegment::Property(p) => p.to_string(),
            LocationSegment::Index(i) => i.to_string(),
        })
        .collect();
    // The schema that holds the failing keyword: drop the keyword itself.
    let parent = keyword_path.split_last().map(|(_, rest)| rest).unwrap_or(&[]);
    let schema = walk(document, parent).unwrap_or(&Value::Null);
    let instance = error.instance();
    let at = |extra: &str| {
        let mut p = path.clone();
        p.push(extra.to_string());
        p
    };
    let got = render(instance);
    match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let known = schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|props| props.keys().cloned().collect::<Vec<_>>().join(", "))
                .unwrap_or_default();
            let noun = match dialect {
                Dialect::Toml => "key",
                Dialect::Json => "field",
            };
            unexpected
                .iter()
                .map(|key| Problem {
                    path: at(key),
                    message: if known.is_empty() {
                        format!("unknown {noun}; this {} takes none", type_word("object", dialect))
                    } else {
                        format!("unknown {noun}; expected one of: {known}")
                    },
                })
                .collect()
        }
        ValidationErrorKind::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            let wanted = schema
                .get("properties")
                .and_then(|p| p.get(name))
                .map(|s| describe(s, document, dialect))
                .unwrap_or_else(|| "a value".to_string());
            vec![Problem { path: at(name), message: format!("missing; expected {wanted}") }]
        }
        ValidationErrorKind::Enum { options } => {
            vec![Problem { path, message: format!("expected one of {}, got {got}", compact(options)) }]
        }
        ValidationErrorKind::OneOfNotValid { context } | ValidationErrorKind::AnyOf { context } => {
            // "expected A or B" says little when the value plainly meant one of them (an array
            // of parameter specs with one bad entry): the branch that fits is asked instead.
            let keyword = keyword_path.last().map(String::as_str).unwrap_or("oneOf");
            match branch_problems(context, schema.get(keyword), instance, document, dialect) {
                Some(inner) => inner,
                None => {
                    vec![Problem {
                        path,
                        message: format!("expected {}, got {got}", describe(schema, document, dialect)),
                    }]
                }
            }
        }
        ValidationErrorKind::MaxItems { limit } => {
            vec![Problem {
                path,
                message: format!("expected at most {limit} {}, got {}", plural(*limit, "item"), size(instance)),
            }]
        }
        ValidationErrorKind::MinItems { limit } => {
            vec![Problem {
                path,
                message: format!("expected at least {limit} {}, got {}", plural(*limit, "item"), size(instance)),
            }]
        }
        ValidationErrorKind::MaxProperties { limit } => {
            let noun = plural(*limit, if dialect == Dialect::Toml { "key" } else { "field" });
            vec![Problem { path, message: format!("expected at most {limit} {noun}, got {}", size(instance)) }]
        }
        ValidationErrorKind::MinProperties { limit } => {
            let noun = plural(*limit, if dialect == Dialect::Toml { "key" } else { "field" });
            vec![Problem { path, message: format!("expected at least {limit} {noun}, got {}", size(instance)) }]
        }
        ValidationErrorKind::UniqueItems => {
            vec![Problem { path, message: "expected every item to be different, got a repeated item".to_string() }]
        }
        ValidationErrorKind::PropertyNames { error: inner } => {
            let name = inner.instance().as_str().unwrap_or_default().to_string();
            // The keyword path may stop at the object or run into the name schema itself.
            let names = describe(schema.get("propertyNames").unwrap_or(schema), document, dialect);
            vec![Problem { path: at(&name), message: format!("invalid name; expected {names}") }]
        }
        ValidationErrorKind::FalseSchema => vec![Problem { path, message: "not allowed here".to_string() }],
        ValidationErrorKind::Type { .. }
        | ValidationErrorKind::Minimum { .. }
        | ValidationErrorKind::Maximum { .. }
        | ValidationErrorKind::ExclusiveMinimum { .. }
        | ValidationErrorKind::ExclusiveMaximum { .. }
        | ValidationErrorKind::MinLength { .. }
        | ValidationErrorKind::MaxLength { .. }
        | ValidationErrorKind::Pattern { .. }
        | ValidationErrorKind::Constant { .. }
        | ValidationErrorKind::Format { .. } => {
            vec![Problem { path, message: format!("expected {}, got {got}", describe(schema, document, dialect)) }]
        }
        _ => vec![Problem { path, message: error.to_string() }],
    }
}

/// The problems of the `oneOf`/`anyOf` branch the value was evidently meant for: among the
/// branches whose type fits the value, the one whose problems reach deepest into it. `None` when
/// no branch's type fits (the value is of a type none of them takes).
fn branch_problems(
    context: &[Vec<ValidationError<'static>>],
    branches: Option<&Value>,
    instance: &Value,
    document: &Value,
    dialect: Dialect,
) -> Option<Vec<Problem>> {
    let branches = branches?.as_array()?;
    let mut best: Option<(usize, Vec<Problem>)> = None;
    for (branch, errors) in branches.iter().zip(context) {
        if errors.is_empty() || !fits_type(branch, instance, document, 0) {
            continue;
        }
        let found: Vec<Problem> = errors.iter().flat_map(|e| problems(e, document, dialect)).collect();
        let depth = found.iter().map(|p| p.path.len()).max().unwrap_or(0);
        if best.as_ref().is_none_or(|(deepest, _)| depth > *deepest) {
            best = Some((depth, found));
        }
    }
    best.map(|(_, found)| found).filter(|found| !found.is_empty())
}

/// Whether `schema` takes values of the instance's JSON type at all (its other constraints
/// aside): its `type`, or the types of its `const`/`enum` values, or any branch of its own
/// `oneOf`/`anyOf`. A schema that names no type takes every type.
fn fits_type(schema: &Value, instance: &Value, document: &Value, depth: usize) -> bool {
    if depth > 16 {
        return true;
    }
    if let Some(target) = schema.get("$ref").and_then(|r| resolve(r, document)) {
        return fits_type(target, instance, document, depth + 1);
    }
    let kind = json_type(instance);
    let same = |t: &str| t == kind || (t == "number" && kind == "integer");
    match schema.get("type") {
        Some(Value::String(t)) => return same(t),
        Some(Value::Array(ts)) => return ts.iter().filter_map(Value::as_str).any(same),
        _ => {}
    }
    if let Some(value) = schema.get("const") {
        return same(json_type(value));
    }
    if let Some(Value::Array(options)) = schema.get("enum") {
        return options.iter().any(|o| same(json_type(o)));
    }
    if let Some(Value::Array(alternatives)) = schema.get("oneOf").or_else(|| schema.get("anyOf")) {
        return alternatives.iter().any(|a| fits_type(a, instance, document, depth + 1));
    }
    true
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// "4", the size an items or fields constraint counts.
fn size(value: &Value) -> usize {
    match value {
        Value::Array(items) => items.len(),
        Value::Object(map) => map.len(),
        _ => 0,
    }
}

fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        noun.to_string()
    } else {
        format!("{noun}s")
    }
}

/// Follows a keyword path through the document, resolving each `$ref` on the way.
fn walk<'a>(document: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut node = document;
    for segment in path {
        node = if segment == "$ref" {
            resolve(node.get("$ref")?, document)?
        } else {
            match node {
                Value::Object(map) => map.get(segment)?,
                Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
                _ => return None,
            }
        };
    }
    Some(node)
}

fn resolve<'a>(reference: &Value, document: &'a Value) -> Option<&'a Value> {
    let pointer = reference.as_str()?.strip_prefix('#')?;
    document.pointer(pointer)
}

/// What a schema accepts, in a few words: `integer ≥ 1`, `one of ["a","b"]`, `array of string`.
pub fn describe(schema: &Value, document: &Value, dialect: Dialect) -> String {
    if let Some(target) = schema.get("$ref").and_then(|r| resolve(r, document)) {
        return describe(target, document, dialect);
    }
    if let Some(options) = schema.get("enum") {
        return format!("one of {}", compact(options));
    }
    if let Some(value) = schema.get("const") {
        return compact(value);
    }
    if let Some(alternatives) = schema.get("oneOf").or_else(|| schema.get("anyOf")).and_then(Value::as_array) {
        let words: Vec<String> = alternatives.iter().map(|s| describe(s, document, dialect)).collect();
        return words.join(" or ");
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect(),
        _ => vec![],
    };
    let mut words = match types.as_slice() {
        [] => "a value".to_string(),
        [one] => type_word(one, dialect).to_string(),
        many => many.iter().map(|t| type_word(t, dialect)).collect::<Vec<_>>().join(" or "),
    };
    let num = |key: &str| schema.get(key).and_then(Value::as_f64);
    let show = |n: f64| {
        if n.fract() == 0.0 && n.abs() < 1e15 {
            format!("{}", n as i64)
        } else {
            n.to_string()
        }
    };
    // Bounds in words, one phrase: "between 1 and 30", "over 0 and at most 30", "under 5".
    // Each bound is its value and whether it is inclusive.
    let bound = |exclusive: &str, inclusive: &str| match (num(exclusive), num(inclusive)) {
        (Some(n), _) => Some((n, false)),
        (None, Some(n)) => Some((n, true)),
        (None, None) => None,
    };
    let low = bound("exclusiveMinimum", "minimum");
    let high = bound("exclusiveMaximum", "maximum");
    let phrase = |(n, inclusive): (f64, bool), within: &str, beyond: &str| {
        format!("{} {}", if inclusive { within } else { beyond }, show(n))
    };
    match (low, high) {
        (Some((lo, true)), Some((hi, true))) => words += &format!(" between {} and {}", show(lo), show(hi)),
        (Some(lo), Some(hi)) => {
            words += &format!(" {} and {}", phrase(lo, "at least", "over"), phrase(hi, "at most", "under"))
        }
        (Some(lo), None) => words += &format!(" {}", phrase(lo, "at least", "over")),
        (None, Some(hi)) => words += &format!(" {}", phrase(hi, "at most", "under")),
        (None, None) => {}
    }
    match (num("minLength"), num("maxLength")) {
        (Some(lo), Some(hi)) => words += &format!(" of {} to {} characters", show(lo), show(hi)),
        (Some(1.0), None) => words = format!("non-empty {words}"),
        (Some(lo), None) => words += &format!(" of at least {} characters", show(lo)),
        (None, Some(hi)) => words += &format!(" of at most {} characters", show(hi)),
        _ => {}
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        words += &format!(" matching {pattern}");
    }
    if types == ["array"] {
        if let Some(items) = schema.get("items") {
            words += &format!(" of {}", describe(items, document, dialect));
        }
        match (num("minItems"), num("maxItems")) {
            (Some(lo), Some(hi)) => words += &format!(" ({} to {} items)", show(lo), show(hi)),
            (Some(lo), None) => words += &format!(" (at least {})", show(lo)),
            (None, Some(hi)) => words += &format!(" (at most {} items)", show(hi)),
            _ => {}
        }
    }
    words
}

fn type_word(json_type: &str, dialect: Dialect) -> &str {
    match (json_type, dialect) {
        ("object", Dialect::Toml) => "table",
        ("number", Dialect::Toml) => "number (integer or float)",
        (other, _) => other,
    }
}

fn compact(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// The offending value, short enough for one line.
fn render(value: &Value) -> String {
    let text = match value {
        Value::Object(_) => "a table/object".to_string(),
        Value::Array(items) => format!("an array of {} item(s)", items.len()),
        other => compact(other),
    };
    if text.chars().count() > 60 {
        let cut: String = text.chars().take(57).collect();
        format!("{cut}...")
    } else {
        text
    }
}
