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
// Code mode's rules for the calls a script causes are applied by the call path itself (a Lua
// tool's `context.call` too), so they live there.
pub use crate::tools::in_script::{nested_script, refused_in_script, runs_scripts, Policy};

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
    let policy = Policy::new(&config.code_mode);
    // A tool scripts may not call (destructive) is not offered to them.
    let allowed = |s: &ToolSpec| crate::tools::principal::allows(principal, &s.name) && policy.refuses(s).is_none();
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
    let policy = Policy::new(&config.code_mode);
    catalog::Catalog::new(
        registry
            .all_specs()
            .filter(|s| !code_tool(s) && !is_scripted(s) && principal.allows(&s.name) && policy.refuses(s).is_none()),
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

/// The catalog prompt (seed 002's `system_prompt()`) of `execute` or of a scripted tool.
pub fn catalog_prompt(
    registry: &Registry,
    scripted: Option<&str>,
    principal: Option<&crate::tools::Principal>,
) -> Result<String, String> {
    let catalog = catalog_for(registry, scripted, principal)?;
    Ok(catalog.prompt(scripted.unwrap_or("execute")))
}
