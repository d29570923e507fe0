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
    pub fn new(name: &str, section: &InlineAgentConfig) -> InlineAgent {
        InlineAgent {
            spec: AgentSpec {
                name: name.to_string(),
                description: section.description.to_string(),
                tools: section.tools.iter().map(|t| t.to_string()).collect(),
                arguments: section.arguments.clone(),
                source: AgentSource::Toml,
                section: name.to_string(),
            },
            system_prompt: section.system_prompt.to_string(),
        }
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
/// optional argument that was not given becomes empty. Other braces are left alone.
pub fn fill(template: &str, args: &Map<String, Json>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find("}}") {
            Some(end) if is_name(after[..end].trim()) => {
                let key = after[..end].trim();
                out.push_str(args.get(key).and_then(Json::as_str).unwrap_or_default());
                rest = &after[end + 2..];
            }
            _ => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
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
    }
}
