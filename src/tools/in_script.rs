//! Code mode's rules for every call a script causes (its own calls, and `context.call` in a Lua
//! tool it called): a script never starts another script, and destructive tools are refused.
//! The call path applies them, so they sit here; `code` runs the scripts.

use super::{Registry, ToolSpec};
use crate::config::code_mode::CodeMode;
use crate::config::Config;

/// Whether `name` runs a script: `execute`, or a scripted tool.
pub fn runs_scripts(config: &Config, name: &str) -> bool {
    name == "execute" || config.scripted.iter().any(|s| s.name == name)
}

/// Why `name` may not run on `chain`: a script never starts another script, however the call
/// gets there (a script's own call, or `context.call` in a Lua tool a script called). A nested
/// run would get budgets of its own (`max_calls`, memory, a running-scripts slot), so one
/// request could multiply them; the outer script can call the same tools itself.
pub fn nested_script(config: &Config, chain: &[String], name: &str) -> Option<String> {
    if !runs_scripts(config, name) {
        return None;
    }
    let outer = chain.iter().find(|t| runs_scripts(config, t))?;
    let path: Vec<&str> = chain.iter().map(String::as_str).chain([name]).collect();
    Some(format!(
        "tool '{name}' runs a script, and this call comes from the script of '{outer}' ({}); scripts do not start other \
         scripts: call the tools it would call from this script instead",
        path.join(" → ")
    ))
}

/// Code mode's destructive policy: a tool annotated `destructiveHint: true`, or matched by
/// `[code_mode] destructive`, may not be called on a script's behalf unless `allow_destructive`
/// matches it. One rule for a script's own calls and for what a Lua tool it called calls in turn.
#[derive(Clone)]
pub struct Policy {
    destructive: globset::GlobSet,
    allowed: globset::GlobSet,
}

impl Policy {
    pub fn new(mode: &CodeMode) -> Policy {
        Policy { destructive: mode.destructive_set(), allowed: mode.allow_destructive_set() }
    }

    /// Why `spec` may not be called from a script, when it may not.
    pub fn refuses(&self, spec: &ToolSpec) -> Option<String> {
        let name = &spec.name;
        let annotated = spec.annotations.as_ref().and_then(|a| a.destructive).unwrap_or(false);
        if !(annotated || self.destructive.is_match(name)) || self.allowed.is_match(name) {
            return None;
        }
        Some(format!(
            "tool '{name}' is destructive (annotated destructiveHint, or listed in [code_mode] destructive), so scripts may not call it; \
             call it directly, or let scripts call it with allow_destructive = [\"{name}\"] in [code_mode] of ctx.toml"
        ))
    }
}

/// Why `name` may not be called on behalf of a code-mode script, when `chain` (the tools on the
/// way to the call) passes through one (`execute`, or a scripted tool): the [`Policy`] holds
/// for every call a script causes, `context.call` in a Lua tool it called included.
pub fn refused_in_script(registry: &Registry, chain: &[String], name: &str) -> Option<String> {
    let config = registry.kb().config();
    let in_script = chain.iter().any(|t| t == "execute" || config.scripted.iter().any(|s| &s.name == t));
    if !in_script {
        return None;
    }
    let refusal = Policy::new(&config.code_mode).refuses(registry.spec(name)?)?;
    Some(format!("{refusal} (this call comes from a script: {})", chain.join(" → ")))
}
