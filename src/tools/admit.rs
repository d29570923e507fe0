//! Admission: the first stage of every call. Whether the caller may see the name at all, which
//! tool or agent it is, its parameters checked with defaults filled in, the rules of call chains
//! (depth, loops, scripts inside scripts), and whether the tool is quarantined. Nothing here
//! waits or writes.

use std::sync::Arc;

use serde_json::Value as Json;

use super::agent::AgentRef;
use super::{principal, stuck, CallError, CallOptions, Registry, ToolRef, ToolSpec, MAX_NAME_BYTES};
use crate::types::LoadProblemKind;

/// How deep a chain of tool calls may go (a tool calling a tool calling a tool...).
pub const MAX_CHAIN: usize = 16;

/// How many times one tool may already be on a chain when it is called again: a little
/// deliberate recursion works, a loop fails fast with the chain in the message.
pub const MAX_REENTRY: usize = 2;

/// What a call asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Target {
    /// Run a tool.
    Tool,
    /// Resolve an agent's prompt.
    Prompt,
}

/// A call that passed admission: what runs, with its checked parameters.
pub struct Admitted {
    pub name: String,
    pub what: Resolved,
    /// The parameters after the schema check, defaults filled in (an agent's: its arguments).
    pub params: Json,
    /// The approval token the caller sent (a header, or `_approval` beside the arguments).
    pub token: Option<String>,
}

/// The tool or agent a call runs.
pub enum Resolved {
    Tool(ToolRef),
    Agent(AgentRef),
}

impl Resolved {
    /// What the quarantine of stuck runs knows this tool or agent by (see [`stuck`]).
    pub fn identity(&self) -> usize {
        match self {
            Resolved::Tool(tool) => stuck::identity(tool),
            Resolved::Agent(agent) => Arc::as_ptr(agent) as *const () as usize,
        }
    }
}

impl Admitted {
    /// The tool's spec, for a tool call.
    pub fn tool(&self) -> Option<&ToolSpec> {
        match &self.what {
            Resolved::Tool(tool) => Some(tool.spec()),
            Resolved::Agent(_) => None,
        }
    }
}

/// Admits a call of `name` with `params` for `options`' caller, or says why not.
pub(super) fn admit(
    registry: &Registry,
    target: Target,
    name: &str,
    mut params: Json,
    options: &CallOptions,
) -> Result<Admitted, CallError> {
    // No tool has a longer name (upstream ones are capped too): refused before anything quotes
    // it in a message, a log line or the call log.
    if target == Target::Tool && name.len() > MAX_NAME_BYTES {
        let shown: String = name.chars().take(40).collect();
        return Err(CallError::UnknownTool(format!(
            "unknown tool '{shown}…': tool names are at most {MAX_NAME_BYTES} bytes; GET /tools/list has them"
        )));
    }
    let principal = options.principal.as_deref();
    // Out of scope is unknown, with no hint that it exists.
    let in_scope = principal::allows(principal, name);
    let (what, params) = match target {
        Target::Tool => {
            // A token beside the arguments is the caller's, not the tool's.
            let beside = match &mut params {
                Json::Object(map) => map.remove(crate::contract::approval::PARAM),
                _ => None,
            };
            let tool = registry.tool(name).filter(|_| in_scope).ok_or_else(|| unknown_tool(registry, name, options))?;
            let params = tool
                .spec()
                .params
                .check(params)
                .map_err(|problems| CallError::InvalidParams { tool: name.to_string(), problems })?;
            let token = options.approval.clone().or_else(|| beside.as_ref().and_then(Json::as_str).map(String::from));
            check_chain(name, &options.chain)?;
            if let Some(refusal) = super::in_script::nested_script(registry.kb().config(), &options.chain, name) {
                return Err(CallError::BadRequest(refusal));
            }
            (Resolved::Tool(tool), (params, token))
        }
        Target::Prompt => {
            let agent = registry.agent(name).filter(|_| in_scope).ok_or_else(|| {
                if in_scope {
                    if let Some(broken) = registry.not_loaded(LoadProblemKind::Agent, name) {
                        return broken;
                    }
                }
                let names: Vec<&str> = registry.agents_for(principal).map(|s| s.name.as_str()).collect();
                let names = if names.is_empty() { "none configured".to_string() } else { names.join(", ") };
                CallError::UnknownAgent(format!("unknown agent '{name}'; available agents: {names}"))
            })?;
            let args = agent.spec().check(&params)?;
            (Resolved::Agent(agent), (Json::Object(args), None))
        }
    };
    if let Some(refused) = quarantined(&registry.state().quarantine, &what, name) {
        return Err(refused);
    }
    if options.cancel.is_cancelled() {
        return Err(CallError::cancelled(name));
    }
    let (params, token) = params;
    Ok(Admitted { name: name.to_string(), what, params, token })
}

/// The refusal of a call of a tool or agent whose earlier call overran its deadline inside a
/// library call and is still running (see [`stuck`]): refused before any policy, so it uses up
/// no approval and no rate.
fn quarantined(quarantine: &stuck::Quarantine, what: &Resolved, name: &str) -> Option<CallError> {
    let run = quarantine.quarantined(what.identity())?;
    let (kind, tail) = match what {
        Resolved::Tool(_) => ("tool", " (the server log has the details)"),
        Resolved::Agent(_) => ("agent", ""),
    };
    Some(CallError::Unavailable(format!(
        "{kind} '{name}' is quarantined: a call {:.0} s ago overran its deadline inside a library call and is still running; ctx refuses new calls of this {kind} until that call ends or its script is edited{tail}",
        run.since.elapsed().as_secs_f64()
    )))
}

/// Why `name` is not a tool `options`' caller can call: it failed to load, its upstream server
/// is down, or it is unknown (with the names the caller may call).
fn unknown_tool(registry: &Registry, name: &str, options: &CallOptions) -> CallError {
    let principal = options.principal.as_deref();
    if principal::allows(principal, name) {
        if let Some(broken) = registry.not_loaded(LoadProblemKind::Tool, name) {
            return broken;
        }
        if let Some(down) = registry.down_upstream(name) {
            return down;
        }
    }
    let names: Vec<&str> =
        registry.specs().map(|s| s.name.as_str()).filter(|n| principal::allows(principal, n)).collect();
    CallError::UnknownTool(format!("unknown tool '{name}'; available tools: {}", names.join(", ")))
}

/// Refuses a call of `name` that would make `chain` too deep or come back to a tool too often.
fn check_chain(name: &str, chain: &[String]) -> Result<(), CallError> {
    let again = chain.iter().filter(|t| *t == name).count();
    if again < MAX_REENTRY && chain.len() < MAX_CHAIN {
        return Ok(());
    }
    let path: Vec<&str> = chain.iter().map(String::as_str).chain([name]).collect();
    let why = if again >= MAX_REENTRY {
        format!("it would be running {} times at once", again + 1)
    } else {
        format!("the chain would be {} calls deep, over the limit of {MAX_CHAIN}", chain.len() + 1)
    };
    Err(CallError::BadRequest(format!(
        "tool '{name}' refused: {why} (chain: {}); a tool that calls tools (context.call, code mode) must not loop back to itself",
        path.join(" → ")
    )))
}
