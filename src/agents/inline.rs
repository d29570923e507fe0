//! Inline agents: `[agents.inline.<name>]`, a system prompt with `{{argument}}` placeholders.

use serde_json::{Map, Value as Json};

use super::{Agent, AgentSpec};
use crate::tools::{CallEnv, CallError};
use crate::types::{AgentSource, InlineAgentConfig, ResolvedAgent};

pub struct InlineAgent {
    spec: AgentSpec,
    system_prompt: String,
}

impl InlineAgent {
    /// The agent of `[agents.inline.<name>]`. Fails when the prompt uses a `{{placeholder}}`
    /// that is not a declared argument: it would always be empty, which is a typo far more
    /// often than an intent.
    pub fn new(name: &str, section: &InlineAgentConfig) -> Result<InlineAgent, String> {
        let declared: Vec<&str> = section.arguments.iter().map(|a| a.name.as_str()).collect();
        let unknown: Vec<String> = placeholders(&section.system_prompt)
            .into_iter()
            .filter(|p| !declared.contains(&p.as_str()))
            .map(|p| format!("{{{{{p}}}}}"))
            .collect();
        if !unknown.is_empty() {
            let declared = if declared.is_empty() { "none".to_string() } else { declared.join(", ") };
            return Err(format!(
                "agents.inline.{name}.system_prompt uses {}, which {} not a declared argument (declared: {declared}); add it to arguments or fix the name. Only {{{{name}}}} around a bare argument name is a placeholder: other text in double braces, such as {{{{user.email}}}}, stays as written",
                unknown.join(", "),
                if unknown.len() == 1 { "is" } else { "are" }
            ));
        }
        Ok(InlineAgent {
            spec: AgentSpec {
                name: name.to_string(),
                description: section.description.to_string(),
                tools: section.tools.iter().map(|t| t.to_string()).collect(),
                arguments: section.arguments.clone(),
                source: AgentSource::Toml,
                section: name.to_string(),
            },
            system_prompt: section.system_prompt.to_string(),
        })
    }
}

impl Agent for InlineAgent {
    fn spec(&self) -> &AgentSpec {
        &self.spec
    }

    fn resolve(&self, args: &Map<String, Json>, _env: &CallEnv<'_>) -> Result<ResolvedAgent, CallError> {
        Ok(ResolvedAgent {
            system: fill(&self.system_prompt, args),
            messages: Vec::new(),
            tools: self.spec.tools.clone(),
        })
    }
}

/// Replaces each `{{name}}` (spaces inside the braces allowed) with the argument's value; an
/// optional argument that was not given becomes empty. Double braces around anything that is
/// not a bare name (see [`is_name`]) are left as written.
pub fn fill(template: &str, args: &Map<String, Json>) -> String {
    let mut out = String::with_capacity(template.len());
    let rest = scan(template, |piece| match piece {
        Piece::Text(text) => out.push_str(text),
        Piece::Placeholder(key) => out.push_str(args.get(key).and_then(Json::as_str).unwrap_or_default()),
    });
    out.push_str(rest);
    out
}

/// The placeholder names of `template`, in order, each once.
pub fn placeholders(template: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    scan(template, |piece| {
        if let Piece::Placeholder(key) = piece {
            if !names.iter().any(|n| n == key) {
                names.push(key.to_string());
            }
        }
    });
    names
}

enum Piece<'a> {
    Text(&'a str),
    Placeholder(&'a str),
}

/// Walks `template`, handing each literal piece and each placeholder to `each`; returns the
/// text after the last `{{`, which is literal.
fn scan<'a>(template: &'a str, mut each: impl FnMut(Piece<'a>)) -> &'a str {
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        each(Piece::Text(&rest[..start]));
        let after = &rest[start + 2..];
        match after.find("}}") {
            Some(end) if is_name(after[..end].trim()) => {
                each(Piece::Placeholder(after[..end].trim()));
                rest = &after[end + 2..];
            }
            _ => {
                each(Piece::Text("{{"));
                rest = after;
            }
        }
    }
    rest
}

/// A bare argument name, as `agent.schema.json` defines one: a letter or `_`, then letters,
/// digits, `_` or `-`.
fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn placeholders_are_filled_and_other_braces_kept() {
        let args = json!({"service": "payments"});
        let args = args.as_object().unwrap();
        assert_eq!(fill("Own {{service}} and {{ service }}.", args), "Own payments and payments.");
        assert_eq!(fill("{{severity}}!", args), "!", "an optional argument not given is empty");
        assert_eq!(fill("json {{\"a\": 1}} and {{", args), "json {{\"a\": 1}} and {{");
        assert_eq!(fill("mail {{user.email}} {{1}} {{-x}}", args), "mail {{user.email}} {{1}} {{-x}}");
    }

    #[test]
    fn placeholders_are_the_bare_names_only() {
        assert_eq!(placeholders("{{a}} {{ b-c }} {{a}} {{user.email}} {{ }} {{x"), ["a", "b-c"]);
    }
}
