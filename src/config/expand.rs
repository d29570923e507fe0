//! `${VAR}` expansion of string values, reporting every missing variable with its key.

use serde_json::Value;

/// A `${VAR}` that the environment does not define.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingVar {
    /// Dotted key of the value that references it.
    pub key: String,
    /// The same key as segments (a section name may itself hold a dot).
    pub path: Vec<String>,
    /// The variable name.
    pub var: String,
}

/// One `${VAR}` that was expanded: where, which variable, and its value.
#[derive(Clone, PartialEq, Eq)]
pub struct VarRef {
    /// Dotted key of the value that references it.
    pub key: String,
    pub var: String,
    /// The variable's value: a secret, see [`super::redact`].
    pub value: String,
}

impl std::fmt::Debug for VarRef {
    // The value is a secret: a Debug dump must not show it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VarRef({} = ${{{}}})", self.key, self.var)
    }
}

/// What [`expand_all`] did.
#[derive(Debug, Default)]
pub struct Expansion {
    /// Every variable that was expanded, with the key that uses it.
    pub refs: Vec<VarRef>,
    /// Every variable that the environment does not define.
    pub missing: Vec<MissingVar>,
    /// The expanded string values by dotted key, so messages about them can hide them whole.
    pub values: Vec<(String, String)>,
}

/// Which `${...}` forms a text may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// `${VAR}`, as in `ctx.toml`.
    Ctx,
    /// `${VAR}` and Cursor's `${env:VAR}`, as in an imported `mcpServers` file.
    Imported,
}

/// Expands `${VAR}` in every string under `value`, in place. `$${` stays a literal `${`.
pub fn expand_all(value: &mut Value, lookup: &dyn Fn(&str) -> Option<String>) -> Expansion {
    expand_all_as(value, lookup, Syntax::Ctx)
}

/// [`expand_all`] for the forms of `syntax`.
pub fn expand_all_as(value: &mut Value, lookup: &dyn Fn(&str) -> Option<String>, syntax: Syntax) -> Expansion {
    let mut expansion = Expansion::default();
    walk(value, &mut Vec::new(), lookup, syntax, &mut expansion);
    expansion
}

fn walk(
    value: &mut Value,
    path: &mut Vec<String>,
    lookup: &dyn Fn(&str) -> Option<String>,
    syntax: Syntax,
    out: &mut Expansion,
) {
    match value {
        Value::String(text) if text.contains('$') => {
            let key = path.join(".");
            let mut unresolved = Vec::new();
            let mut found = Vec::new();
            let expanded = expand_with(text, lookup, syntax, &mut unresolved, &mut found);
            out.refs.extend(found.into_iter().map(|(var, value)| VarRef { key: key.clone(), var, value }));
            if expanded != *text {
                out.values.push((key.clone(), expanded.clone()));
                *text = expanded;
            }
            out.missing.extend(unresolved.into_iter().map(|var| MissingVar {
                key: key.clone(),
                path: path.clone(),
                var,
            }));
        }
        Value::Object(map) => {
            for (k, child) in map.iter_mut() {
                path.push(k.clone());
                walk(child, path, lookup, syntax, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter_mut().enumerate() {
                path.push(i.to_string());
                walk(child, path, lookup, syntax, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// Expands one string. Unknown variables are left as written and reported in `missing`.
pub fn expand(text: &str, lookup: &dyn Fn(&str) -> Option<String>, missing: &mut Vec<String>) -> String {
    expand_with(text, lookup, Syntax::Ctx, missing, &mut Vec::new())
}

/// [`expand`], also reporting each variable it expanded with its value.
fn expand_with(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    syntax: Syntax,
    missing: &mut Vec<String>,
    found: &mut Vec<(String, String)>,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        if let Some(after) = tail.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = tail.strip_prefix("${") {
            // Cursor writes `${env:NAME}`; an imported file may use either form.
            let name = after.find('}').map(|end| {
                let body = &after[..end];
                let name = match syntax {
                    Syntax::Imported => body.strip_prefix("env:").unwrap_or(body),
                    Syntax::Ctx => body,
                };
                (end, name)
            });
            match name {
                Some((end, name)) if is_var_name(name) => {
                    match lookup(name) {
                        Some(v) => {
                            out.push_str(&v);
                            found.push((name.to_string(), v));
                        }
                        None => {
                            missing.push(name.to_string());
                            out.push_str(&tail[..end + 3]);
                        }
                    }
                    rest = &after[end + 1..];
                }
                _ => {
                    out.push('$');
                    rest = &tail[1..];
                }
            }
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_string())
    }

    #[test]
    fn expands_known_keeps_escapes_and_reports_missing() {
        let mut missing = Vec::new();
        assert_eq!(expand("Bearer ${TOKEN}", &env, &mut missing), "Bearer s3cret");
        assert_eq!(expand("cost $5 and $${TOKEN}", &env, &mut missing), "cost $5 and ${TOKEN}");
        assert_eq!(expand("${NOPE}/x", &env, &mut missing), "${NOPE}/x");
        assert_eq!(missing, vec!["NOPE".to_string()]);
    }

    #[test]
    fn walks_nested_values_with_keys() {
        let mut value = serde_json::json!({"tools": {"script": {"jira": {"token": "${TOKEN}", "url": "${JIRA_URL}"}}}});
        let expansion = expand_all(&mut value, &env);
        assert_eq!(value["tools"]["script"]["jira"]["token"], "s3cret");
        assert_eq!(
            expansion.refs,
            vec![VarRef { key: "tools.script.jira.token".into(), var: "TOKEN".into(), value: "s3cret".into() }]
        );
        assert_eq!(expansion.values, vec![("tools.script.jira.token".to_string(), "s3cret".to_string())]);
        let path = ["tools", "script", "jira", "url"].map(String::from).to_vec();
        assert_eq!(
            expansion.missing,
            vec![MissingVar { key: "tools.script.jira.url".into(), path, var: "JIRA_URL".into() }]
        );
        assert_eq!(format!("{:?}", expansion.refs[0]), "VarRef(tools.script.jira.token = ${TOKEN})");
    }

    #[test]
    fn imported_files_may_write_env_colon_var() {
        let mut value = serde_json::json!({"a": "${env:TOKEN}/${TOKEN}", "b": "${env:NOPE}", "c": "$${env:TOKEN}"});
        let expansion = expand_all_as(&mut value, &env, Syntax::Imported);
        assert_eq!(value["a"], "s3cret/s3cret");
        assert_eq!(value["b"], "${env:NOPE}");
        assert_eq!(value["c"], "${env:TOKEN}");
        assert_eq!(expansion.missing.iter().map(|m| m.var.as_str()).collect::<Vec<_>>(), ["NOPE"]);
        // ctx.toml keeps its one form: `${env:X}` there is text.
        let mut missing = Vec::new();
        assert_eq!(expand("${env:TOKEN}", &env, &mut missing), "${env:TOKEN}");
        assert!(missing.is_empty());
    }
}
