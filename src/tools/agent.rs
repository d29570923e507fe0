//! What an agent is to the call path: its spec (the listing entry and the check of its
//! arguments) and the trait both kinds implement (inline and Lua agents, in `agents`).

use std::sync::Arc;

use serde_json::{Map, Value as Json};

use super::{CallEnv, CallError};
use crate::types::{self, AgentArgument, AgentSource, ErrorDetail, ResolvedAgent};

/// What every agent declares.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    pub name: String,
    pub description: String,
    pub tools: Vec<String>,
    pub arguments: Vec<AgentArgument>,
    pub source: AgentSource,
    /// The `[agents.inline|script.<section>]` key.
    pub section: String,
}

impl AgentSpec {
    /// The listing entry (`GET /agents/list`).
    pub fn info(&self) -> types::Agent {
        types::Agent {
            name: self.name.clone(),
            description: self.description.clone(),
            tools: self.tools.clone(),
            source: self.source,
            arguments: self.arguments.clone(),
        }
    }

    /// Checks `args` (a JSON object of strings) against the declared arguments: every required
    /// one present, none unknown. Every problem is reported, each with its JSON pointer.
    pub fn check(&self, args: &Json) -> Result<Map<String, Json>, CallError> {
        let invalid = |problems| CallError::InvalidArguments { agent: self.name.clone(), problems };
        let detail = |path: String, message: String| ErrorDetail { path, message };
        let args = match args {
            Json::Null => Map::new(),
            Json::Object(map) => map.clone(),
            other => {
                return Err(invalid(vec![detail(
                    "/arguments".into(),
                    format!("expected an object of strings, got {}", kind(other)),
                )]))
            }
        };
        let mut problems = Vec::new();
        for (key, value) in &args {
            if !self.arguments.iter().any(|a| a.name.as_str() == key) {
                let known: Vec<&str> = self.arguments.iter().map(|a| a.name.as_str()).collect();
                let takes = if known.is_empty() { "none".to_string() } else { known.join(", ") };
                problems
                    .push(detail(format!("/arguments/{key}"), format!("unknown argument; this agent takes: {takes}")));
            } else if !value.is_string() {
                problems.push(detail(format!("/arguments/{key}"), format!("expected string, got {}", kind(value))));
            }
        }
        for arg in self.arguments.iter().filter(|a| a.required) {
            if !args.contains_key(arg.name.as_str()) {
                let what = arg.description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
                problems.push(detail(
                    format!("/arguments/{}", arg.name.as_str()),
                    format!("missing; required argument{what}"),
                ));
            }
        }
        if problems.is_empty() {
            Ok(args)
        } else {
            Err(invalid(problems))
        }
    }
}

fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    }
}

/// An agent of either kind.
pub trait Agent: Send + Sync {
    fn spec(&self) -> &AgentSpec;
    /// Resolves the prompt for checked `args`. May block while a script runs.
    fn resolve(&self, args: &Map<String, Json>, env: &CallEnv<'_>) -> Result<ResolvedAgent, CallError>;
    /// How long resolving may run, when the agent enforces a limit (see `tools::stuck`).
    fn deadline(&self) -> Option<std::time::Duration> {
        None
    }
}

pub type AgentRef = Arc<dyn Agent>;
