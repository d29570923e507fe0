//! Lua agents: `[agents.script.<name>]` scripts that define an `agent` table (global or
//! returned) with `resolve(args, config, context)`, run in the same sandbox and limits as tools.

use std::sync::OnceLock;

use serde_json::{Map, Value as Json};

use super::{Agent, AgentSpec};
use crate::config::ScriptSection;
use crate::lua::script::Script;
use crate::lua::{convert, CancelHandle, Limits, ScriptInfo, Vm};
use crate::schema::{Dialect, SchemaValidator};
use crate::tools::{bridge, CallEnv, CallError};
use crate::types::{AgentMetadata, AgentSource, ResolvedAgent};

/// The most JSON an agent table's metadata may hold.
const METADATA_BUDGET: usize = 256 * 1024;

pub struct LuaAgent {
    spec: AgentSpec,
    info: ScriptInfo,
    limits: Limits,
    script: Script,
}

impl LuaAgent {
    /// Loads the script of `section` and reads its metadata; the error names the script, the
    /// field and what was expected.
    pub fn load(section: &ScriptSection) -> Result<LuaAgent, String> {
        let info = ScriptInfo::from_section(section);
        let limits = Limits::for_section(section);
        let path = info.display_path.clone();
        let vm = Vm::new(info.clone(), limits, CancelHandle::new()).map_err(|e| e.to_string())?;
        let script = vm.read_script().map_err(|e| e.to_string())?;
        let ext = vm.load_script(&script, "agent").map_err(|e| e.to_string())?;
        vm.function(&ext, "agent", "resolve").map_err(|e| e.to_string())?;
        let name = Map::from_iter([("name".to_string(), Json::String(section.name.clone()))]);
        let meta = Json::Object(vm.metadata(&ext, "agent", METADATA_BUDGET, validator("AgentMetadata"), name)?);
        let problems = validator("AgentMetadata").problems(&meta, Dialect::Json);
        if !problems.is_empty() {
            let words: Vec<String> = problems.iter().map(|p| format!("agent{}: {}", p.pointer(), p.message)).collect();
            return Err(format!("{path}: {}", words.join("; ")));
        }
        let agent: AgentMetadata =
            serde_json::from_value(meta).map_err(|e| format!("{path}: invalid agent table: {e}"))?;
        let mut seen = std::collections::HashSet::new();
        if let Some(dup) = agent.arguments.iter().find(|a| !seen.insert(a.name.as_str())) {
            return Err(format!("{path}: agent.arguments declares {:?} twice; remove one", dup.name.as_str()));
        }
        Ok(LuaAgent {
            spec: AgentSpec {
                name: agent.name.to_string(),
                description: agent.description.to_string(),
                tools: agent.tools.clone(),
                arguments: agent.arguments.clone(),
                source: AgentSource::Lua,
                section: section.name.clone(),
            },
            info,
            limits,
            script,
        })
    }
}

fn validator(definition: &'static str) -> &'static SchemaValidator {
    // Static: immutable, a validator of a schema compiled into the binary; every application may share it.
    static METADATA: OnceLock<SchemaValidator> = OnceLock::new();
    // Static: immutable, a validator of a schema compiled into the binary; every application may share it.
    static RESOLVED: OnceLock<SchemaValidator> = OnceLock::new();
    let cell = if definition == "AgentMetadata" { &METADATA } else { &RESOLVED };
    cell.get_or_init(|| SchemaValidator::for_definition(definition))
}

impl Agent for LuaAgent {
    fn spec(&self) -> &AgentSpec {
        &self.spec
    }

    fn deadline(&self) -> Option<std::time::Duration> {
        Some(self.limits.timeout)
    }

    fn resolve(&self, args: &Map<String, Json>, env: &CallEnv<'_>) -> Result<ResolvedAgent, CallError> {
        let name = &self.spec.name;
        let fail = |e| CallError::from_script_of(format!("agent '{name}'"), e);
        let vm = Vm::new(self.info.clone(), self.limits, env.cancel.clone()).map_err(fail)?;
        let ext = vm.load_script(&self.script, "agent").map_err(fail)?;
        let resolve = vm.function(&ext, "agent", "resolve").map_err(fail)?;
        let lua = vm.lua();
        let internal = |e: mlua::Error| {
            tracing::error!(agent = %name, "cannot prepare the call: {e}");
            CallError::Internal(format!("agent '{name}': cannot pass the arguments to the script"))
        };
        let args = convert::to_lua(lua, &Json::Object(args.clone())).map_err(internal)?;
        let config = convert::to_lua(lua, &Json::Object(self.info.config.clone())).map_err(internal)?;
        let (context, _scope) = bridge::context_table(&vm, env, &self.info.config).map_err(internal)?;
        let returned = vm.call(&resolve, (args, config, context)).map_err(fail)?;
        let value = vm.result_json_for(&returned, validator("ResolvedAgent")).map_err(fail)?;
        let problems = validator("ResolvedAgent").problems(&value, Dialect::Json);
        if let Some(problem) = problems.first() {
            return Err(CallError::ToolFailed {
                message: format!(
                    "{}: agent.resolve must return {{system = \"...\", messages = {{{{role = \"user\", content = \"...\"}}}}, tools = {{...}}?}}; result{}: {}",
                    self.info.display_path,
                    problem.pointer(),
                    problem.message
                ),
                tool_code: None,
                data: None,
            });
        }
        serde_json::from_value(value).map_err(|e| CallError::Internal(format!("agent '{name}': {e}")))
    }
}
