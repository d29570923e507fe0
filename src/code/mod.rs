//! Code mode: one agent-sent Lua script that calls many tools in one round trip (seeds 001 and
//! 002). The `execute` built-in, the discovery tools, and scripted tools all run scripts here,
//! and every inner call goes through the registry's one call path.

pub mod calls;
pub mod catalog;
pub mod names;
pub mod outcome;
pub mod run;
pub mod tools;

use crate::config::code_mode::CODE_MODE_TOOLS;

/// The MCP prompt that renders the catalog (seed 002's `system_prompt()`).
pub const PROMPT: &str = "code_mode";
use crate::tools::{Registry, ToolSpec};

/// The catalog a script of `execute` (or of the scripted tool `scripted`) sees in `registry`:
/// what the catalog prompt and `ctx catalog` render.
pub fn catalog_for(
    registry: &Registry,
    scripted: Option<&str>,
    principal: Option<&crate::tools::Principal>,
) -> Result<catalog::Catalog, String> {
    let config = registry.kb().config();
    let is_scripted = |s: &ToolSpec| config.scripted.iter().any(|section| section.name == s.name);
    let code_tool = |s: &ToolSpec| s.builtin && CODE_MODE_TOOLS.contains(&s.name.as_str());
    let allowed = |s: &ToolSpec| crate::tools::principal::allows(principal, &s.name);
    match scripted {
        None if !config.code_mode.enabled => {
            Err("code mode is disabled ([code_mode] enabled = false in ctx.toml)".to_string())
        }
        None => {
            Ok(catalog::Catalog::new(registry.all_specs().filter(|s| !code_tool(s) && !is_scripted(s) && allowed(s))))
        }
        Some(name) => {
            // A scoped caller learns nothing of a scripted tool it may not call, not even its name.
            let section =
                config.scripted.iter().find(|s| s.name == name && crate::tools::principal::allows(principal, &s.name));
            let Some(section) = section else {
                let names: Vec<&str> = config
                    .scripted
                    .iter()
                    .filter(|s| crate::tools::principal::allows(principal, &s.name))
                    .map(|s| s.name.as_str())
                    .collect();
                let names = if names.is_empty() { "none configured".to_string() } else { names.join(", ") };
                return Err(format!("no scripted tool '{name}' ([tools.scripted.{name}]); scripted tools: {names}"));
            };
            let allow = section.tool_set();
            Ok(catalog::Catalog::new(
                registry
                    .all_specs()
                    .filter(|s| !code_tool(s) && !is_scripted(s) && allow.is_match(&s.name) && allowed(s)),
            ))
        }
    }
}

/// The catalog of `execute` as `principal` (a scoped token) sees it: only its tools.
pub fn catalog_of(registry: &Registry, principal: &crate::tools::Principal) -> catalog::Catalog {
    let config = registry.kb().config();
    let code_tool = |s: &ToolSpec| s.builtin && CODE_MODE_TOOLS.contains(&s.name.as_str());
    let is_scripted = |s: &ToolSpec| config.scripted.iter().any(|section| section.name == s.name);
    catalog::Catalog::new(
        registry.all_specs().filter(|s| !code_tool(s) && !is_scripted(s) && principal.allows(&s.name)),
    )
}

/// A scripted tool's description as `principal` sees it: the signatures of only the tools both
/// its globs and the token allow.
pub fn scripted_description(registry: &Registry, name: &str, principal: &crate::tools::Principal) -> Option<String> {
    let config = registry.kb().config();
    let section = config.scripted.iter().find(|s| s.name == name)?;
    let catalog = catalog_for(registry, Some(name), Some(principal)).ok()?;
    Some(format!("{}\n\n{}", section.description.trim_end(), catalog.prompt(name)))
}

/// Whether `name` runs a script: `execute`, or a scripted tool.
pub fn runs_scripts(config: &crate::config::Config, name: &str) -> bool {
    name == "execute" || config.scripted.iter().any(|s| s.name == name)
}

/// Why `name` may not run on `chain`: a script never starts another script, however the call
/// gets there (a script's own call, or `context.call` in a Lua tool a script called). A nested
/// run would get budgets of its own (`max_calls`, memory, a running-scripts slot), so one
/// request could multiply them; the outer script can call the same tools itself.
pub fn nested_script(config: &crate::config::Config, chain: &[String], name: &str) -> Option<String> {
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

/// The catalog prompt (seed 002's `system_prompt()`) of `execute` or of a scripted tool.
pub fn catalog_prompt(
    registry: &Registry,
    scripted: Option<&str>,
    principal: Option<&crate::tools::Principal>,
) -> Result<String, String> {
    let catalog = catalog_for(registry, scripted, principal)?;
    Ok(catalog.prompt(scripted.unwrap_or("execute")))
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
    pub fn new(mode: &crate::config::code_mode::CodeMode) -> Policy {
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
