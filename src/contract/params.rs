//! Tool parameters: the list form turned into JSON Schema, one compiled validator per tool,
//! defaults injected after validation, and `--param k=v` coerced by the schema.

use serde_json::{json, Map, Value as Json};

use super::text::kind;
use crate::schema::{Dialect, SchemaValidator};
use crate::types::ErrorDetail;

/// A tool's parameter schema, compiled once per registry snapshot.
pub struct Params {
    schema: Json,
    validator: SchemaValidator,
}

impl Params {
    /// Compiles `schema` (an object schema). Fails with the compiler's message.
    pub fn compile(schema: Json) -> Result<Params, String> {
        let mut document = schema.clone();
        if let Json::Object(map) = &mut document {
            map.entry("$schema").or_insert_with(|| Json::String(crate::schema::DIALECT.into()));
        }
        let validator = SchemaValidator::compile(document)?;
        Ok(Params { schema, validator })
    }

    /// The JSON Schema agents see (`parameters`, MCP `inputSchema`).
    pub fn schema(&self) -> &Json {
        &self.schema
    }

    /// Validates `params` and fills in defaults. Reports every problem at once.
    pub fn check(&self, params: Json) -> Result<Json, Vec<ErrorDetail>> {
        let mut params = match params {
            Json::Null => Json::Object(Map::new()),
            Json::Object(map) => Json::Object(map),
            other => {
                return Err(vec![ErrorDetail {
                    path: String::new(),
                    message: format!("expected an object of named parameters, got {}", kind(&other)),
                }])
            }
        };
        let problems = self.validator.problems(&params, Dialect::Json);
        if !problems.is_empty() {
            return Err(problems.into_iter().map(|p| ErrorDetail { path: p.pointer(), message: p.message }).collect());
        }
        inject_defaults(&self.schema, &self.schema, &mut params);
        Ok(params)
    }

    /// Problems with `params`, without defaults (for checking a script's own defaults at load).
    pub fn problems(&self, params: &Json) -> Vec<ErrorDetail> {
        self.validator
            .problems(params, Dialect::Json)
            .into_iter()
            .map(|p| ErrorDetail { path: p.pointer(), message: p.message })
            .collect()
    }

    /// Turns `key=value` pairs from the command line into parameters, typed by the schema:
    /// `limit=5` becomes an integer when `limit` is an integer parameter.
    pub fn coerce(&self, pairs: &[(String, String)]) -> Result<Json, String> {
        let mut out = Map::new();
        for (key, raw) in pairs {
            let wanted = property(&self.schema, &self.schema, key).and_then(json_type);
            let value = match wanted.as_deref() {
                Some("string") => Json::String(raw.clone()),
                Some("integer") => raw
                    .trim()
                    .parse::<i64>()
                    .map(Json::from)
                    .map_err(|_| format!("--param {key}={raw}: expected an integer"))?,
                Some("number") => raw
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .and_then(|n| serde_json::Number::from_f64(n).map(Json::Number))
                    .ok_or_else(|| format!("--param {key}={raw}: expected a number"))?,
                Some("boolean") => match raw.trim() {
                    "true" | "yes" | "1" => Json::Bool(true),
                    "false" | "no" | "0" => Json::Bool(false),
                    _ => return Err(format!("--param {key}={raw}: expected true or false")),
                },
                Some("array") | Some("object") => serde_json::from_str(raw)
                    .map_err(|e| format!("--param {key}: expected JSON ({}), {e}", wanted.unwrap_or_default()))?,
                // Untyped or undeclared: JSON if it parses, else the text.
                _ => serde_json::from_str(raw).unwrap_or_else(|_| Json::String(raw.clone())),
            };
            out.insert(key.clone(), value);
        }
        Ok(Json::Object(out))
    }
}

/// The list form (seed 000 §4.2) as a JSON Schema object (seed 000 §3.3).
pub fn from_list(specs: &[Json], additional: bool) -> Json {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for spec in specs {
        let Some(name) = spec.get("name").and_then(Json::as_str) else { continue };
        let mut prop = Map::new();
        for key in ["type", "description", "enum", "default", "items"] {
            if let Some(v) = spec.get(key) {
                prop.insert(key.to_string(), v.clone());
            }
        }
        if spec.get("required").and_then(Json::as_bool) == Some(true) {
            required.push(Json::String(name.to_string()));
        }
        properties.insert(name.to_string(), Json::Object(prop));
    }
    let mut schema = json!({ "type": "object", "properties": properties });
    if !required.is_empty() {
        schema["required"] = Json::Array(required);
    }
    if !additional {
        schema["additionalProperties"] = Json::Bool(false);
    }
    schema
}

/// Each property's `default`, set where the caller left the property out; nested objects the
/// caller did supply get their own defaults too.
fn inject_defaults(schema: &Json, root: &Json, value: &mut Json) {
    let schema = deref(schema, root);
    let (Some(props), Json::Object(map)) = (schema.get("properties").and_then(Json::as_object), value) else {
        return;
    };
    for (name, prop) in props {
        let prop = deref(prop, root);
        match map.get_mut(name) {
            Some(child) => inject_defaults(prop, root, child),
            None => {
                if let Some(default) = prop.get("default") {
                    map.insert(name.clone(), default.clone());
                }
            }
        }
    }
}

/// Follows a local `$ref` (`#/$defs/X`).
fn deref<'a>(schema: &'a Json, root: &'a Json) -> &'a Json {
    match schema.get("$ref").and_then(Json::as_str).and_then(|r| r.strip_prefix('#')) {
        Some(pointer) => root.pointer(pointer).unwrap_or(schema),
        None => schema,
    }
}

fn property<'a>(schema: &'a Json, root: &'a Json, name: &str) -> Option<&'a Json> {
    deref(schema, root).get("properties")?.get(name).map(|p| deref(p, root))
}

fn json_type(schema: &Json) -> Option<String> {
    match schema.get("type")? {
        Json::String(t) => Some(t.clone()),
        Json::Array(ts) => ts.iter().filter_map(Json::as_str).find(|t| *t != "null").map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn priority_tool() -> Params {
        let schema = from_list(
            &[
                json!({"name": "title", "type": "string", "required": true}),
                json!({"name": "priority", "type": "string", "enum": ["low", "medium", "high"], "default": "medium"}),
                json!({"name": "limit", "type": "integer", "default": 5}),
            ],
            false,
        );
        Params::compile(schema).unwrap()
    }

    #[test]
    fn list_form_becomes_the_seed_schema() {
        let schema =
            from_list(&[json!({"name": "q", "type": "string", "required": true, "description": "Query"})], false);
        assert_eq!(
            schema,
            json!({"type": "object", "properties": {"q": {"type": "string", "description": "Query"}},
                   "required": ["q"], "additionalProperties": false})
        );
    }

    #[test]
    fn every_problem_is_reported_with_its_pointer() {
        let err = priority_tool().check(json!({"priority": "urgent", "limit": "5", "extra": 1})).unwrap_err();
        let lines: Vec<String> = err.iter().map(|d| format!("{}: {}", d.path, d.message)).collect();
        assert!(
            lines.contains(&r#"/priority: expected one of ["low","medium","high"], got "urgent""#.to_string()),
            "{lines:?}"
        );
        assert!(lines.iter().any(|l| l.starts_with("/title: missing")), "{lines:?}");
        assert!(lines.iter().any(|l| l.starts_with("/limit: expected integer")), "{lines:?}");
        assert!(lines.iter().any(|l| l.starts_with("/extra: unknown field")), "{lines:?}");
    }

    #[test]
    fn defaults_fill_missing_optional_fields_only() {
        let ok = priority_tool().check(json!({"title": "t", "limit": 9})).unwrap();
        assert_eq!(ok, json!({"title": "t", "limit": 9, "priority": "medium"}));
    }

    #[test]
    fn cli_values_are_typed_by_the_schema() {
        let p = priority_tool();
        let v = p.coerce(&[("limit".into(), "5".into()), ("title".into(), "42".into())]).unwrap();
        assert_eq!(v, json!({"limit": 5, "title": "42"}));
        assert!(p.coerce(&[("limit".into(), "five".into())]).unwrap_err().contains("expected an integer"));
    }
}
