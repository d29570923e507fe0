//! Lua tools: `[tools.script.<name>]` scripts that define a `tool` table with `execute`.
//!
//! Loading runs the script once in the sandbox to read its metadata, checks it against
//! `schemas/tool.schema.json`, and compiles its parameter schema. Each call then runs with new
//! globals, in a VM kept idle on the calling thread from an earlier call of the same script or
//! built for it: the script is loaded again (from its bytecode) and `tool.execute(params,
//! context)` runs.
//!
//! A call from an async worker first runs inline ([`Tool::run_inline`]) with a short budget. A
//! script that needs the network, files, sleep, logs or the knowledge base is stopped at that
//! host call, before it has any effect, and the call runs again on the blocking pool.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use mlua::Value;
use serde_json::{json, Map, Value as Json};

use super::{bridge, params, CallEnv, CallError, Output, Params, Tool, ToolSpec, INLINE_BUDGET};
use crate::config::ScriptSection;
use crate::lua::api::mcp;
use crate::lua::reuse::{self, ScriptKey};
use crate::lua::script::Script;
use crate::lua::{convert, CancelHandle, Kill, Limits, ScriptError, ScriptInfo, Vm};
use crate::schema::{Dialect, SchemaValidator};
use crate::types;

/// The most JSON a tool table's metadata may hold.
const METADATA_BUDGET: usize = 1024 * 1024;

/// After a call had to leave the async worker, this many calls of the tool go straight to the
/// blocking pool.
const SKIP_INLINE_AFTER_ESCALATION: u32 = 32;

pub struct LuaTool {
    spec: ToolSpec,
    info: ScriptInfo,
    limits: Limits,
    /// The script as loaded into this snapshot; every call runs exactly this code.
    script: Script,
    /// Which idle VMs may run this version of the script.
    key: ScriptKey,
    /// Calls left to send straight to the blocking pool.
    skip_inline: AtomicU32,
}

/// The keys a `tool` table may hold besides functions (`schemas/tool.schema.json`).
const TOOL_KEYS: [&str; 9] = [
    "name",
    "description",
    "version",
    "parameters",
    "additional_parameters",
    "annotations",
    "output_schema",
    "approve",
    "long_running",
];

/// Keys of a `[tools.script.<name>]` section that authors put in the `tool` table by mistake.
const SECTION_KEYS: [&str; 9] =
    ["path", "timeout", "memory_mb", "max_result_bytes", "allow_hosts", "allow_private", "allow_env", "rate", "burst"];

/// A key of the `tool` table that ctx does not know is a load problem, not silently dropped: it is
/// usually a setting meant for ctx (`approve`, `timeout`) in the wrong place, which would
/// otherwise do nothing.
fn unknown_keys(meta: &Map<String, Json>, section: &str) -> Result<(), String> {
    let Some(key) = meta.keys().find(|k| !TOOL_KEYS.contains(&k.as_str())) else { return Ok(()) };
    if SECTION_KEYS.contains(&key.as_str()) {
        return Err(format!(
            "tool.{key} is not a key of the tool table: it is a setting of the tool's section; move it to [tools.script.{section}] in ctx.toml"
        ));
    }
    Err(format!(
        "tool.{key} is not a key of the tool table (it takes {}, and functions); keep the script's own data in a local variable, or set it in [tools.script.{section}] in ctx.toml and read it as context.config.{key}",
        TOOL_KEYS.join(", ")
    ))
}

impl LuaTool {
    /// Loads the script of `section` and reads its metadata. The error names the script, the
    /// field and what was expected.
    pub fn load(section: &ScriptSection) -> Result<LuaTool, String> {
        let info = ScriptInfo::from_section(section);
        let limits = Limits::for_section(section);
        let path = &info.display_path;
        let vm = Vm::new(info.clone(), limits, CancelHandle::new()).map_err(|e| e.to_string())?;
        let script = vm.read_script().map_err(|e| e.to_string())?;
        let ext = vm.load_script(&script, "tool").map_err(|e| e.to_string())?;
        entry_point(&vm, &ext).map_err(|e| e.to_string())?;
        // Its metadata is read as the table holds it: keys a metatable would answer (`approve`
        // through `__index`) would be read by some and not by others.
        if ext.metatable().is_some() {
            return Err(format!("{path}: the tool table has a metatable; declare its keys in the table itself"));
        }

        // The config key names the tool when the script does not.
        let name = Map::from_iter([("name".to_string(), Json::String(section.name.clone()))]);
        let mut meta = vm.metadata(&ext, "tool", METADATA_BUDGET, metadata_validator(), name)?;
        unknown_keys(&meta, &section.name).map_err(|e| format!("{path}: {e}"))?;
        // The JSON Schema form is itself checked against JSON Schema's own schema, which says
        // where it expects lists (`required = {}`, `enum = {}`).
        if let Some(schema @ Json::Object(_)) = meta.get_mut("parameters") {
            convert::lists_where_expected(schema, &meta_schema_problems);
        }
        let meta = Json::Object(meta);
        let problems = metadata_validator().problems(&meta, Dialect::Json);
        if !problems.is_empty() {
            let words: Vec<String> = problems.iter().map(|p| format!("tool{}: {}", p.pointer(), p.message)).collect();
            return Err(format!("{path}: {}", words.join("; ")));
        }
        let tool: types::Tool =
            serde_json::from_value(meta.clone()).map_err(|e| format!("{path}: invalid tool table: {e}"))?;
        let schema = match meta.get("parameters") {
            None => params::from_list(&[], tool.additional_parameters),
            Some(Json::Array(specs)) => {
                let mut seen = std::collections::HashSet::new();
                for spec in specs {
                    let name = spec.get("name").and_then(Json::as_str).unwrap_or_default();
                    if !seen.insert(name) {
                        return Err(format!("{path}: tool.parameters declares {name:?} twice; remove one"));
                    }
                }
                params::from_list(specs, tool.additional_parameters)
            }
            Some(schema) => schema.clone(),
        };
        let compile = |schema| {
            Params::compile(schema).map_err(|e| format!("{path}: tool.parameters is not a valid JSON Schema: {e}"))
        };
        let mut params = compile(schema)?;
        // `default = {}` for a list parameter is an empty list, by the parameter's own schema.
        if let Some(schema) = defaults_as_lists(&params) {
            params = compile(schema)?;
        }
        check_defaults(&params).map_err(|e| format!("{path}: {e}"))?;
        let output_schema = (!tool.output_schema.is_empty()).then(|| tool.output_schema.clone());
        Ok(LuaTool {
            spec: ToolSpec {
                name: tool.name.to_string(),
                description: tool.description.to_string(),
                version: tool.version.clone(),
                builtin: false,
                params,
                annotations: tool.annotations.clone(),
                output_schema,
                script: Some(info.display_path.clone()),
                section: Some(section.name.clone()),
                hidden: false,
                upstream: None,
                approve: tool.approve,
                long_running: tool.long_running || section.long_running,
            },
            info,
            limits,
            script,
            key: ScriptKey::new(),
            skip_inline: AtomicU32::new(0),
        })
    }

    /// A VM for one call: an idle one of this script restarted, or a new one.
    fn vm(&self, cancel: CancelHandle) -> Result<Vm, CallError> {
        reuse::take(self.key, cancel, |cancel| Vm::new(self.info.clone(), self.limits, cancel))
            .map_err(|e| CallError::from_script(&self.spec.name, e))
    }

    /// Runs `tool.execute(params, context)` in `vm`.
    fn execute(&self, vm: &Vm, params: Json, env: &CallEnv<'_>) -> Result<Output, CallError> {
        let name = &self.spec.name;
        let fail = |e| CallError::from_script(name, e);
        if let Some(sink) = &env.progress {
            vm.set_progress(sink.clone());
        }
        let ext = vm.load_script(&self.script, "tool").map_err(fail)?;
        let execute = entry_point(vm, &ext).map_err(fail)?;
        let lua = vm.lua();
        let prepare = |e: mlua::Error| match vm.state().killed() {
            // A limit hit while preparing the call (the inline budget or allowance, the memory
            // cap) is that limit: an inline run escalates, any other reports it.
            Kill::None if !crate::lua::is_memory_error(&e) => {
                tracing::error!(tool = %name, "cannot prepare the call: {e}");
                CallError::Internal(format!("tool '{name}': cannot pass the parameters to the script"))
            }
            _ => fail(vm.classify(&e)),
        };
        let params = convert::to_lua(lua, &params).map_err(prepare)?;
        let (context, _scope) = bridge::context_table(vm, env, &self.info.config).map_err(prepare)?;
        let returned = vm.call(&execute, (params, context)).map_err(fail)?;
        output(vm, name, returned)
    }
}

impl Tool for LuaTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run(&self, params: Json, env: &CallEnv<'_>) -> Result<Output, CallError> {
        let vm = self.vm(env.cancel.clone())?;
        let result = self.execute(&vm, params, env);
        reuse::put(self.key, vm);
        result
    }

    fn deadline(&self) -> Option<std::time::Duration> {
        Some(self.limits.timeout)
    }

    fn run_inline(&self, params: &Json, env: &CallEnv<'_>) -> Option<Result<Output, CallError>> {
        if env.progress.is_some() {
            return None;
        }
        if self.skip_inline.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok() {
            return None;
        }
        let mut vm = self.vm(env.cancel.clone()).ok()?;
        vm.make_inline(INLINE_BUDGET);
        let result = self.execute(&vm, params.clone(), env);
        let escalated = vm.state().killed() == Kill::Escalate;
        reuse::put(self.key, vm);
        if escalated {
            self.skip_inline.store(SKIP_INLINE_AFTER_ESCALATION, Ordering::Relaxed);
            return None;
        }
        Some(result)
    }
}

/// The function a call runs: `tool.execute`, or `tool.handler`, the name seed 003's tools use for
/// it. A script that defines both is refused rather than one of them being silently ignored.
fn entry_point(vm: &Vm, ext: &mlua::Table) -> Result<mlua::Function, ScriptError> {
    let defined = |name: &str| !matches!(ext.get::<Value>(name), Ok(Value::Nil) | Err(_));
    match (defined("execute"), defined("handler")) {
        (true, true) => Err(ScriptError::Contract {
            path: vm.state().info.display_path.clone(),
            message: "`tool.execute` and `tool.handler` are both defined; `handler` is another name for `execute`, \
                      so keep one of them"
                .to_string(),
        }),
        (false, true) => vm.function(ext, "tool", "handler"),
        _ => vm.function(ext, "tool", "execute"),
    }
}

/// Reads what `execute` returned: an `MCP.*` helper result, a handled `{error=...}` table, or a
/// plain value. Every text in it counts against `max_result_bytes`, like any returned value.
fn output(vm: &Vm, tool: &str, returned: Value) -> Result<Output, CallError> {
    let fail = |e| CallError::from_script(tool, e);
    let Some(helper) = mcp::helper_result(vm.lua(), &returned) else {
        let value = vm.result_json(&returned).map_err(fail)?;
        let handled = value.as_object().is_some_and(|m| m.get("error").is_some_and(|e| !e.is_null()));
        return Ok(if handled { Output::HandledError(value) } else { Output::Value(value) });
    };
    let field = |key: &str| helper.raw_get::<Value>(key).unwrap_or(Value::Nil);
    let kind = match field("kind") {
        Value::String(s) => s.to_string_lossy(),
        _ => String::new(),
    };
    match kind.as_str() {
        "text" => match vm.result_json(&field("text")).map_err(fail)? {
            Json::String(text) => Ok(Output::Text(text)),
            other => Ok(Output::Text(other.to_string())),
        },
        "content" => {
            content_blocks(vm.result_json_for(&field("data"), content_list()).map_err(fail)?).map_err(|problem| {
                CallError::ToolFailed { message: format!("MCP.content: {problem}"), tool_code: None, data: None }
            })
        }
        "error" => Err(helper_error(vm, tool, &field("code"), &field("message"), &field("data"))),
        _ => Ok(Output::Value(vm.result_json(&field("data")).map_err(fail)?)),
    }
}

/// `MCP.error(code, message, data)`: the code and message are cut to a bounded size (saying how
/// long they were), and what is left of `max_result_bytes` bounds the data.
fn helper_error(vm: &Vm, tool: &str, code: &Value, message: &Value, data: &Value) -> CallError {
    let limit = vm.state().limits.max_result_bytes;
    let text = |value: &Value, cap: usize| match value {
        Value::String(s) => ScriptError::bounded_bytes(&s.as_bytes(), cap.min(limit)),
        _ => String::new(),
    };
    let code = text(code, ScriptError::CODE_CAP);
    let message = text(message, ScriptError::MESSAGE_CAP);
    let data = match data {
        Value::Nil => None,
        value => {
            let budget = limit.saturating_sub(code.len() + message.len());
            let too_large = |size: usize| {
                let what = format!("tool '{tool}'");
                let size = size + code.len() + message.len();
                CallError::from_script(tool, ScriptError::ResultTooLarge { what, size, limit })
            };
            match convert::to_json(vm.lua(), value, budget) {
                Ok(json) => match convert::json_size(&json) {
                    size if size > budget => return too_large(size),
                    _ => Some(json),
                },
                Err(convert::ConvertError::TooLarge { size }) => return too_large(size),
                Err(convert::ConvertError::Invalid(message)) => {
                    let what = format!("tool '{tool}'");
                    return CallError::from_script(tool, ScriptError::BadResult { what, message });
                }
                Err(convert::ConvertError::Stopped) => {
                    return CallError::from_script(tool, vm.classify(&crate::lua::script::stopped()))
                }
            }
        }
    };
    CallError::ToolFailed { message, tool_code: Some(code), data }
}

/// The schema of `MCP.content`'s argument, for reading `MCP.content({})` as no blocks.
fn content_list() -> &'static SchemaValidator {
    // Static: immutable, a validator of a schema compiled into the binary; every application may share it.
    static SCHEMA: OnceLock<SchemaValidator> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let defs = crate::schema::definitions("#/$defs/");
        let list = json!({"$schema": crate::schema::DIALECT, "type": "array", "items": {"$ref": "#/$defs/ContentBlock"}, "$defs": defs});
        // The bundled schemas are checked by build.rs and by the schema tests.
        SchemaValidator::compile(list).expect("the ContentBlock schema compiles")
    })
}

/// `MCP.content(blocks)`: an array of content blocks, each valid against `ContentBlock`.
fn content_blocks(value: Json) -> Result<Output, String> {
    // Static: immutable, a validator of a schema compiled into the binary; every application may share it.
    static SCHEMA: OnceLock<SchemaValidator> = OnceLock::new();
    let Json::Array(items) = value else {
        return Err("expected an array of content blocks, like { {type = \"text\", text = \"hi\"} }".to_string());
    };
    let schema = SCHEMA.get_or_init(|| SchemaValidator::for_definition("ContentBlock"));
    let mut blocks = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        if let Some(problem) = schema.problems(&item, Dialect::Json).into_iter().next() {
            let kind = item.get("type").and_then(Json::as_str).unwrap_or("?");
            return Err(format!(
                "block {} (type {kind:?}) is not a text, image, audio or resource block: {}",
                i + 1,
                problem.message
            ));
        }
        blocks.push(serde_json::from_value(item).map_err(|e| format!("block {}: {e}", i + 1))?);
    }
    Ok(Output::Content(blocks))
}

/// The parameter schema again, when an empty-table default of some parameter reads as a list by
/// that parameter's schema (see [`convert::lists_where_expected`]); `None` when nothing changed.
fn defaults_as_lists(params: &Params) -> Option<Json> {
    let props = params.schema().get("properties").and_then(Json::as_object)?;
    let empty = |d: &Json| d.as_object().is_some_and(Map::is_empty);
    let mut defaults: Map<String, Json> = props
        .iter()
        .filter(|(_, p)| p.get("default").is_some_and(empty))
        .map(|(k, _)| (k.clone(), json!({})))
        .collect();
    if defaults.is_empty() {
        return None;
    }
    let mut value = Json::Object(defaults.clone());
    convert::lists_where_expected(&mut value, &|v| {
        params.problems(v).into_iter().map(|p| p.path.split('/').skip(1).map(str::to_string).collect()).collect()
    });
    let Json::Object(settled) = value else { return None };
    defaults.retain(|k, _| settled.get(k).is_some_and(Json::is_array));
    if defaults.is_empty() {
        return None;
    }
    let mut schema = params.schema().clone();
    for key in defaults.keys() {
        schema["properties"][key]["default"] = json!([]);
    }
    Some(schema)
}

/// Each parameter's declared default must pass its own schema.
fn check_defaults(params: &Params) -> Result<(), String> {
    let Some(props) = params.schema().get("properties").and_then(Json::as_object) else { return Ok(()) };
    let defaults: Map<String, Json> =
        props.iter().filter_map(|(k, p)| p.get("default").map(|d| (k.clone(), d.clone()))).collect();
    if defaults.is_empty() {
        return Ok(());
    }
    let bad: Vec<String> = params
        .problems(&Json::Object(defaults.clone()))
        .into_iter()
        .filter(|p| defaults.keys().any(|k| p.path == format!("/{k}") || p.path.starts_with(&format!("/{k}/"))))
        .filter(|p| !p.message.starts_with("missing"))
        .map(|p| format!("the default of {}: {}", &p.path[1..], p.message))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

/// Where a JSON Schema document breaks the rules of JSON Schema (draft 2020-12) itself.
fn meta_schema_problems(schema: &Json) -> Vec<Vec<String>> {
    let mut document = schema.clone();
    if let Json::Object(map) = &mut document {
        map.insert("$schema".into(), Json::String(crate::schema::DIALECT.into()));
    }
    let Ok(validator) = jsonschema::meta::validator_for(&document) else { return Vec::new() };
    validator
        .iter_errors(&document)
        .map(|e| {
            e.instance_path()
                .iter()
                .map(|segment| match segment {
                    jsonschema::paths::LocationSegment::Property(p) => p.to_string(),
                    jsonschema::paths::LocationSegment::Index(i) => i.to_string(),
                })
                .collect()
        })
        .collect()
}

fn metadata_validator() -> &'static SchemaValidator {
    // Static: immutable, a validator of a schema compiled into the binary; every application may share it.
    static V: OnceLock<SchemaValidator> = OnceLock::new();
    V.get_or_init(|| SchemaValidator::for_definition("Tool"))
}
