//! The `context` table a tool or agent script receives: `search`, `get`, `sources`, `call` and
//! `config`.
//!
//! Scripts run on a blocking worker thread, so the bridge calls the store directly: no async
//! runtime is blocked, and each call takes its own pooled connection (no shared lock). The
//! run's deadline is checked before and after each call.
//!
//! The functions are made once per VM and kept for its later runs (a reused VM runs the same
//! script again): making them cost a tool call about a seventh of its time. What they work on
//! (the knowledge base, the registry, the caller's options) is the current call's, set when its
//! `context` table is made and taken away when the call ends ([`CallScope`]). Each run still
//! gets a table of its own, so what a script does to it dies with the run.

use std::sync::Arc;

use mlua::{Function, Lua, MultiValue, Table, Value};
use serde_json::{Map, Value as Json};

use super::{builtin, CallOptions, Registry};
use crate::kb::Kb;
use crate::lua::{api, convert, Vm};

/// Largest argument table a script may pass to the bridge, as JSON.
const ARG_BUDGET: usize = 64 * 1024;

/// What the context functions of a VM work on during one call.
struct Current {
    kb: Kb,
    registry: Arc<Registry>,
    /// The options of the calls `context.call` makes.
    options: CallOptions,
}

/// The context functions of one VM, made on its first call.
struct Functions([(&'static str, Function); 4]);

/// The current call of a VM: while it lives, the context functions work on that call's knowledge
/// base and registry; once it is dropped they refuse to run.
pub struct CallScope<'a>(&'a Lua);

impl Drop for CallScope<'_> {
    fn drop(&mut self) {
        // An idle VM must not keep the call's registry snapshot (and its tools) alive.
        self.0.remove_app_data::<Current>();
    }
}

/// The current call's knowledge base, registry and options, as one function needs them.
fn current<T>(lua: &Lua, what: &str, pick: impl FnOnce(&Current) -> T) -> mlua::Result<T> {
    match lua.app_data_ref::<Current>() {
        Some(current) => Ok(pick(&current)),
        None => Err(fail(format!("{what}: the context is only usable during the call it was given to"))),
    }
}

/// Builds the `context` table for one run, and the scope its functions work in.
pub fn context_table<'a>(
    vm: &'a Vm,
    env: &super::CallEnv<'_>,
    config: &Map<String, Json>,
) -> mlua::Result<(Table, CallScope<'a>)> {
    let lua = vm.lua();
    lua.set_app_data(Current {
        kb: env.kb.clone(),
        registry: Arc::clone(&env.registry),
        options: env.inner_options("lua"),
    });
    let scope = CallScope(lua);
    // Cloned out: no app data stays borrowed while Lua runs (a borrow held then would make
    // `set_app_data` or `remove_app_data` panic).
    let cached = lua.app_data_ref::<Functions>().map(|f| f.0.clone());
    let functions = match cached {
        Some(functions) => functions,
        None => {
            let made = make_functions(vm)?;
            lua.set_app_data(Functions(made.clone()));
            made
        }
    };
    let context = lua.create_table_with_capacity(0, 5)?;
    for (name, function) in &functions {
        context.raw_set(*name, function)?;
    }
    context.raw_set("config", convert::object_to_lua(lua, config)?)?;
    Ok((context, scope))
}

/// The context functions of `vm`: they read what they work on from the current call.
fn make_functions(vm: &Vm) -> mlua::Result<[(&'static str, Function); 4]> {
    let lua = vm.lua();
    let state = vm.state();

    let st = Arc::clone(state);
    let search = api::function(lua, "context.search", move |lua, args: MultiValue| {
        st.check_blocking()?;
        let kb_s = current(lua, "context.search", |c| c.kb.clone())?;
        let request = search_request(lua, args)?;
        let params = builtin::search_params()
            .check(request)
            .map_err(|problems| fail(format!("context.search: {}", super::error::summary(&problems))))?;
        let response = builtin::search(&kb_s, params).map_err(|e| fail(format!("context.search: {e}")))?;
        st.check()?;
        let results = response.get("results").cloned().unwrap_or(Json::Array(Vec::new()));
        convert::to_lua(lua, &results)
    })?;

    let st = Arc::clone(state);
    let get = api::function(lua, "context.get", move |lua, id: Value| {
        st.check_blocking()?;
        let kb_g = current(lua, "context.get", |c| c.kb.clone())?;
        let Value::String(id) = id else {
            return Err(fail(format!("context.get: expected a document id (string), got {}", id.type_name())));
        };
        let id = id.to_str()?.to_string();
        match kb_g.get(&id) {
            Ok(doc) => {
                let json = serde_json::to_value(doc).unwrap_or(Json::Null);
                Ok((convert::to_lua(lua, &json)?, Value::Nil))
            }
            Err(crate::kb::KbError::NotFound(_)) => {
                Ok((Value::Nil, Value::String(lua.create_string(format!("no document with id {id:?}"))?)))
            }
            Err(e) => Err(fail(format!("context.get: {}", super::CallError::from_kb(e)))),
        }
    })?;

    let st = Arc::clone(state);
    let sources = api::function(lua, "context.sources", move |lua, ()| {
        st.check_blocking()?;
        let kb_l = current(lua, "context.sources", |c| c.kb.clone())?;
        let json = builtin::sources(&kb_l).map_err(|e| fail(format!("context.sources: {e}")))?;
        convert::to_lua(lua, json.get("sources").unwrap_or(&Json::Array(Vec::new())))
    })?;

    // `context.call(name, params)`: tool chaining through the registry's one call path
    // (validation, limits, logging), with this run's tool on the chain so that a loop back to it
    // is refused (see `registry::check_chain`).
    let st = Arc::clone(state);
    let call = api::function(lua, "context.call", move |lua, (name, params): (mlua::LuaString, Value)| {
        st.check_blocking()?;
        // Refused before it is copied: a tool name is at most 64 bytes.
        if name.as_bytes().len() > MAX_TOOL_NAME {
            return Err(fail(format!(
                "context.call: the tool name is {} bytes long; tool names have at most {MAX_TOOL_NAME}",
                name.as_bytes().len()
            )));
        }
        let (registry, options) = current(lua, "context.call", |c| (Arc::clone(&c.registry), c.options.clone()))?;
        let name = name.to_string_lossy();
        let params = match &params {
                Value::Nil => Json::Object(Map::new()),
                Value::Table(_) => {
                    convert::to_json(lua, &params, CALL_ARG_BUDGET).map_err(|e| fail(format!("context.call: {e}")))?
                }
                other => {
                    return Err(fail(format!(
                        "context.call: the parameters must be a table, as in context.call(\"{name}\", {{key = value}}), not a {}",
                        other.type_name()
                    )))
                }
            };
        // A Lua tool that a script called is still working for that script: code mode's
        // destructive policy holds for the tools it calls in turn.
        if let Some(refusal) = super::in_script::refused_in_script(&registry, &options.chain, &name) {
            return Err(fail(format!("context.call: {refusal}")));
        }
        // The callee blocks this script: it stops when this script's own deadline passes.
        let mut options = options;
        options.cancel = options.cancel.until(st.deadline());
        let outcome = registry.call(&name, params, &options);
        st.check()?;
        match outcome.map_err(|e| e.to_string()).and_then(crate::contract::output::inner_value) {
            Ok(value) => convert::to_lua(lua, &value),
            Err(message) => Err(fail(format!("context.call: tool '{name}' failed: {message}"))),
        }
    })?;

    Ok([("search", search), ("get", get), ("sources", sources), ("call", call)])
}

/// The longest tool name `context.call` looks up (registry names are at most 64 bytes).
const MAX_TOOL_NAME: usize = 256;

/// Largest parameter table `context.call` passes on, as JSON.
const CALL_ARG_BUDGET: usize = 4 * 1024 * 1024;

/// `context.search("query", {mode=, limit=, source=, since=})` or
/// `context.search{query=, mode=, limit=, filters={source=}}`, as a search request.
fn search_request(lua: &Lua, args: MultiValue) -> mlua::Result<Json> {
    let mut args = args.into_iter();
    let first = args.next().unwrap_or(Value::Nil);
    let second = args.next().unwrap_or(Value::Nil);
    let (mut request, opts) = match first {
        Value::String(q) => {
            let mut m = Map::new();
            m.insert("query".into(), Json::String(q.to_str()?.to_string()));
            (m, second)
        }
        Value::Table(_) => (Map::new(), first),
        other => {
            return Err(fail(format!(
                "context.search: expected (query, opts?) or a table {{query=..., limit=...}}, got {}",
                other.type_name()
            )))
        }
    };
    match opts {
        Value::Nil => {}
        Value::Table(_) => {
            let json = convert::to_json(lua, &opts, ARG_BUDGET).map_err(|e| fail(format!("context.search: {e}")))?;
            if let Json::Object(map) = json {
                for (key, value) in map {
                    if key == "filters" {
                        // The agent-script form nests the source filter.
                        if let Json::Object(filters) = value {
                            request.extend(filters);
                        }
                    } else {
                        request.insert(key, value);
                    }
                }
            }
        }
        other => return Err(fail(format!("context.search: options must be a table, got {}", other.type_name()))),
    }
    Ok(Json::Object(request))
}

fn fail(message: String) -> mlua::Error {
    mlua::Error::RuntimeError(message)
}
