//! One code-mode script run: a sandbox with the code-mode limits, the tool globals of its scope
//! (`ctx`, a table per upstream server, `mcp[...]` by exact name), the discovery functions,
//! `result`, and the script's outcome as a tool result with its trace.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use globset::GlobSet;
use mlua::{Lua, LuaString, MultiValue, Table, Value};
use serde_json::{json, Value as Json};

use super::calls::{Calls, Refusal};
use super::catalog::Catalog;
use super::names::OWN;
use super::outcome;
use crate::config::code_mode::{CodeLimits, CodeMode};
use crate::config::ScriptKind;
use crate::lua::reuse::{self, ScriptKey};
use crate::lua::{convert, CancelHandle, Limits, ScriptError, ScriptInfo, Vm};
use crate::tools::state::ScriptRuns;
use crate::tools::{CallEnv, CallError, Output};
use crate::types::ErrorCode;

/// The most bytes of arguments one inner call may pass, as JSON.
const ARGS_BUDGET: usize = 4 * 1024 * 1024;

/// The most code-mode scripts that run at once, server-wide. Each holds a blocking thread and
/// its inner calls of Lua tools hold more (up to `max_concurrent` each): unbounded, scripts
/// could take the whole blocking pool from every other caller. Past it, a script is refused at
/// once rather than queued (a scripted tool called from a script must not wait on its caller).
pub const MAX_RUNS: usize = 16;

/// The most of those one scoped token's callers run at once: a token that sends scripts that
/// only a deadline stops cannot take every place from the other tokens. Unscoped callers (the
/// server's own token, or none on loopback) are trusted with them all.
pub const MAX_RUNS_PER_TOKEN: usize = MAX_RUNS / 2;

/// One of the [`MAX_RUNS`] places of an application's scripts (and of its token's share),
/// given back when dropped.
struct RunSlot<'a> {
    runs: &'a ScriptRuns,
    token: Option<String>,
    /// Whether it holds a place in all (a refused one holds at most its token's).
    counted: bool,
}

impl RunSlot<'_> {
    /// A place, or why there is none.
    fn take<'a>(runs: &'a ScriptRuns, token: Option<&str>) -> Result<RunSlot<'a>, String> {
        use std::sync::atomic::Ordering;
        if let Some(token) = token {
            let mut by_token = runs.by_token.lock().unwrap_or_else(|p| p.into_inner());
            let running = by_token.entry(token.to_string()).or_default();
            if *running >= MAX_RUNS_PER_TOKEN {
                return Err(format!(
                    "token '{token}' already runs {MAX_RUNS_PER_TOKEN} code-mode scripts at once, the most one token \
                     may; retry when one ends"
                ));
            }
            *running += 1;
        }
        // From here, dropping `slot` gives back what it took.
        let mut slot = RunSlot { runs, token: token.map(str::to_string), counted: false };
        runs.running.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < MAX_RUNS).then_some(n + 1)).map_err(
            |_| format!("{MAX_RUNS} code-mode scripts are running at once, the most ctx runs together; retry shortly"),
        )?;
        slot.counted = true;
        Ok(slot)
    }
}

impl Drop for RunSlot<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.runs.running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
        if let Some(token) = &self.token {
            let mut by_token = self.runs.by_token.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(running) = by_token.get_mut(token) {
                *running -= 1;
                if *running == 0 {
                    by_token.remove(token);
                }
            }
        }
    }
}

/// The longest name or query a script may hand the lookups and discovery functions, like the
/// discovery tools' own `maxLength`: past it the work (and the message quoting it) would grow
/// with the input, outside the script's limits.
const MAX_NAME: usize = 1024;

/// A discovery function of one name (or query) and one optional argument, answering JSON; the
/// name is bounded by [`short`] before any work is done.
fn keyed<A: mlua::FromLua + 'static>(
    lua: &Lua,
    shared: &Arc<Catalog>,
    what: &'static str,
    answer: fn(&Catalog, &str, A) -> Result<Json, String>,
) -> mlua::Result<mlua::Function> {
    let catalog = Arc::clone(shared);
    lua.create_function(move |lua, (text, extra): (LuaString, A)| {
        answer(&catalog, &short(what, &text)?, extra)
            .map_err(mlua::Error::RuntimeError)
            .and_then(|j| convert::to_lua(lua, &j))
    })
}

/// `text` if it is short enough for a lookup, else the error that says so.
fn short(what: &str, text: &mlua::LuaString) -> mlua::Result<String> {
    let bytes = text.as_bytes();
    if bytes.len() > MAX_NAME {
        return Err(mlua::Error::RuntimeError(format!(
            "{what}: the name is {} bytes long; names and queries have at most {MAX_NAME}",
            bytes.len()
        )));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// How a script reaches tools: who runs it, what it may call, and its limits.
pub struct Runner {
    /// `execute`, or the scripted tool's name: for messages.
    pub name: String,
    pub catalog: Arc<Catalog>,
    /// A scripted tool's globs: the only tools that exist in its scripts.
    pub allow: Option<GlobSet>,
    /// Those globs as written, for messages.
    pub globs: Vec<String>,
    pub limits: CodeLimits,
    pub mode: Arc<CodeMode>,
    policy: super::Policy,
    key: ScriptKey,
}

impl Runner {
    pub fn new(
        name: String,
        catalog: Arc<Catalog>,
        scope: Option<(GlobSet, Vec<String>)>,
        limits: CodeLimits,
        mode: Arc<CodeMode>,
    ) -> Runner {
        let policy = super::Policy::new(&mode);
        let (allow, globs) = match scope {
            Some((set, globs)) => (Some(set), globs),
            None => (None, Vec::new()),
        };
        Runner { name, catalog, allow, globs, limits, mode, policy, key: ScriptKey::new() }
    }

    fn info(&self) -> ScriptInfo {
        let mode = &self.mode;
        ScriptInfo {
            kind: ScriptKind::Code,
            name: self.name.clone(),
            // The script's folder is `fs_root` when the operator gave one; otherwise it has no
            // folder, and `fs`/`require` say so.
            path: mode.fs_root.as_ref().map(|root| root.join("script.lua")).unwrap_or_default(),
            display_path: "script".to_string(),
            allow_hosts: mode.allow_hosts.clone(),
            allow_env: mode.allow_env.clone(),
            allow_private: mode.allow_private,
            reserved_env: mode.reserved_env.clone(),
            config: Default::default(),
        }
    }

    /// Runs `script` (Lua source text) with at most `timeout` of wall time (never more than the
    /// configured limit).
    pub fn run(&self, script: &str, timeout: Option<Duration>, env: &CallEnv<'_>) -> Result<Output, CallError> {
        let token = env.principal.as_deref().map(|p| p.name());
        let _slot = RunSlot::take(&env.registry.state().scripts, token)
            .map_err(|why| CallError::Unavailable(format!("tool '{}': {why}", self.name)))?;
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            CallError::Internal(format!("tool '{}' needs ctx's async runtime, which this caller has not", self.name))
        })?;
        let limits = Limits {
            timeout: self.limits.timeout,
            memory_bytes: self.limits.memory_bytes,
            max_result_bytes: self.limits.max_output_bytes,
        };
        let info = self.info();
        let vm = reuse::take(self.key, env.cancel.clone(), |cancel: CancelHandle| Vm::new(info, limits, cancel))
            .map_err(|e| CallError::from_script(&self.name, e))?;
        if let Some(timeout) = timeout {
            vm.shorten_deadline(timeout);
        }
        vm.set_instruction_limit(self.limits.max_instructions);
        vm.set_log_limit(self.limits.max_log_lines);
        if let Some(sink) = &env.progress {
            vm.set_progress(sink.clone());
        }
        let calls = Arc::new(Calls::new(
            Arc::clone(&env.registry),
            handle,
            self.limits.clone(),
            env.inner_options("code"),
            env.progress.clone(),
            Arc::clone(vm.state()),
        ));
        // The call a script put off starts when the run goes on without awaiting it (see
        // `Calls::start`). A weak reference: the run state must not keep the calls alive.
        let weak = Arc::downgrade(&calls);
        vm.state().set_deferred_work(Some(Arc::new(move || {
            if let Some(calls) = weak.upgrade() {
                calls.flush();
            }
        })));
        // A scoped token's script sees only its tools, in its globals and in discovery.
        let catalog = match env.principal.as_deref() {
            Some(principal) => Arc::new(Catalog::new(
                env.registry.all_specs().filter(|s| self.catalog.contains(&s.name) && principal.allows(&s.name)),
            )),
            None => Arc::clone(&self.catalog),
        };
        let starting = Arc::new(match (&self.allow, &env.principal) {
            (None, None) => starting_servers(&env.registry, &catalog),
            // A scripted tool's scope is its globs; a scoped token sees only its own tools.
            _ => HashMap::new(),
        });
        let scoped = env.principal.is_some();
        let result = self.run_in(&vm, &calls, (&catalog, &starting, scoped), script);
        vm.state().set_deferred_work(None);
        if result.is_err() {
            calls.cancel_all();
        }
        let dropped_lines = vm.state().log_lines_dropped();
        reuse::put(self.key, vm);
        match result {
            Ok(value) => self.output(value, &calls, dropped_lines),
            Err(e) => {
                let servers: Vec<String> = server_globals(&catalog, &starting).into_iter().map(|(g, _)| g).collect();
                Err(self.failure(e, &calls, timeout, &servers))
            }
        }
    }

    fn run_in(
        &self,
        vm: &Vm,
        calls: &Arc<Calls>,
        (catalog, starting, scoped): (&Arc<Catalog>, &Arc<Starting>, bool),
        script: &str,
    ) -> Result<(Json, Option<outcome::Cut>), ScriptError> {
        let outcome = self.install(vm, calls, catalog, (starting, scoped)).map_err(|e| vm.classify(&e))?;
        let returned = vm.run_source("script", script.as_bytes())?;
        let (has, captured): (bool, Value) = outcome.call(()).map_err(|e| vm.classify(&e))?;
        // Two answers would leave one silently lost: say so instead of picking one.
        if has && !returned.is_nil() && returned != captured {
            let message = "the script called result() and also returned a value; keep one of them \
                           (result(value) or return value)"
                .to_string();
            return Err(ScriptError::Runtime { detail: message.clone(), message });
        }
        let value = if has { captured } else { returned };
        // The calls it started and never awaited are part of the run: wait for them.
        calls.settle().map_err(|e| vm.classify(&e))?;
        // Measured up to what a run may hold; converted only as far as it is kept.
        let cap = self.limits.memory_bytes.max(self.limits.max_output_bytes);
        match vm.bounded(|| outcome::truncate_lua(vm.lua(), &value, self.limits.max_output_bytes, cap)) {
            Ok(converted) => Ok(converted),
            Err(convert::ConvertError::TooLarge { size }) => {
                Err(ScriptError::ResultTooLarge { what: format!("tool '{}'", self.name), size, limit: cap })
            }
            Err(convert::ConvertError::Invalid(message)) => {
                Err(ScriptError::BadResult { what: format!("the script of tool '{}'", self.name), message })
            }
            Err(convert::ConvertError::Stopped) => Err(vm.classify(&crate::lua::script::stopped())),
        }
    }

    /// Installs the run's globals and returns the function that reads what `result()` got.
    fn install(
        &self,
        vm: &Vm,
        calls: &Arc<Calls>,
        shared: &Arc<Catalog>,
        (starting, scoped): (&Arc<Starting>, bool),
    ) -> mlua::Result<mlua::Function> {
        let lua = vm.lua();
        let env = vm.env();
        let start = self.start_fn(lua, calls)?;
        let wait = wait_fn(lua, calls)?;
        let catalog = Arc::clone(shared);
        // In a scripted tool, a tool outside its globs is missing for a reason worth saying.
        // A scoped caller is not told the globs: they may name tools outside its scope.
        let scope = self.allow.as_ref().filter(|_| !scoped).map(|_| {
            format!(
                "; scripted tool '{}' may call only the tools its `tools` globs select ({})",
                self.name,
                self.globs.join(", ")
            )
        });
        let waiting = Arc::clone(starting);
        let resolve = lua.create_function(move |_, (group, key): (String, Value)| {
            if let Some(message) = waiting.get(&group) {
                return Ok((None, Some(message.clone())));
            }
            let Value::String(key) = key else {
                return Ok((None, Some(format!("{group}: tool names are strings, got a {}", key.type_name()))));
            };
            let key = short(&group, &key)?;
            let (name, path) = resolve(&catalog, &group, &key);
            Ok(match (name, &scope) {
                (None, Some(scope)) => (None, path.map(|message| format!("{message}{scope}"))),
                (name, _) => (name, path),
            })
        })?;
        let catalog = Arc::clone(shared);
        let waiting = Arc::clone(starting);
        let groups = lua.create_function(move |_, key: Value| {
            let Value::String(key) = key else {
                return Ok((None, Some(format!("mcp: server names are strings, got a {}", key.type_name()))));
            };
            let key = short("mcp", &key)?;
            Ok(match (catalog.layout().group(&key), waiting.get(&key)) {
                (Some(group), _) => (Some(group.name.clone()), None),
                // Its table, whose every tool says why it is not there yet.
                (None, Some(_)) => (Some(key), None),
                (None, None) => (None, Some(no_group(&catalog, &key))),
            })
        })?;
        // The script's line, for an error the prelude raises later than the mistake (see Pending).
        let here = lua.create_function(|lua, ()| Ok(crate::lua::api::line_in(lua, "=script")))?;
        let prelude = crate::lua::precompiled::function(
            lua,
            "code-mode-prelude",
            "=code",
            || include_str!("prelude.lua").to_string(),
            None,
        )?;
        let (group_table, mcp, await_all, result, outcome): (
            mlua::Function,
            Table,
            mlua::Function,
            mlua::Function,
            mlua::Function,
        ) = prelude.call((start, wait, resolve, groups, here))?;
        for (global, group) in server_globals(shared, starting) {
            env.raw_set(global, group_table.call::<Table>(group)?)?;
        }
        env.raw_set("mcp", mcp)?;
        env.raw_set("await_all", await_all)?;
        env.raw_set("result", result)?;
        self.install_discovery(lua, env, shared)?;
        Ok(outcome)
    }

    /// `list_servers()`, `list_tools(server)`, `describe_tool(name, schemas?)`,
    /// `search_tools(query, limit?)`: the discovery tools, inside the script.
    fn install_discovery(&self, lua: &Lua, env: &Table, shared: &Arc<Catalog>) -> mlua::Result<()> {
        let catalog = Arc::clone(shared);
        env.raw_set(
            "list_servers",
            lua.create_function(move |lua, ()| convert::to_lua(lua, &catalog.list_servers()))?,
        )?;
        env.raw_set("list_tools", keyed(lua, shared, "list_tools", |c, server, _: Value| c.list_tools(server))?)?;
        env.raw_set(
            "describe_tool",
            keyed(lua, shared, "describe_tool", |c, name, schemas: Option<bool>| {
                c.describe_tool(name, schemas.unwrap_or(false))
            })?,
        )?;
        env.raw_set(
            "search_tools",
            keyed(lua, shared, "search_tools", |c, query, limit: Option<usize>| {
                c.search_tools(query, limit.unwrap_or(10))
            })?,
        )?;
        Ok(())
    }

    /// The Rust half of a tool function: checks the call may be made, converts the arguments,
    /// and starts it. `(true, id)`, or `(false, error table)` for a refusal the script may
    /// catch; a tripped limit stops the run.
    fn start_fn(&self, lua: &Lua, calls: &Arc<Calls>) -> mlua::Result<mlua::Function> {
        let calls = Arc::clone(calls);
        let state = calls.state();
        let admit = self.admission();
        lua.create_function(move |lua, (group, name, path, args): (LuaString, LuaString, LuaString, Value)| {
            state.check()?;
            // Borrowed, not copied: the prelude passes the same three strings for every call.
            let (group, name, path) = (group.to_str()?, name.to_str()?, path.to_str()?);
            let (group, name, path) = (&*group, &*name, &*path);
            if let Err(message) = admit(&calls, name) {
                return Ok((false, error_table(lua, name, path, &message, "refused", None)?));
            }
            let params = match &args {
                Value::Nil => json!({}),
                Value::Table(_) => match convert::to_json(lua, &args, ARGS_BUDGET) {
                    Ok(json) => json,
                    Err(convert::ConvertError::Stopped) => return Err(crate::lua::script::stopped()),
                    Err(e) => {
                        let message = format!("{path}: the arguments cannot be sent as JSON: {e}");
                        return Ok((false, error_table(lua, name, path, &message, "bad_request", None)?));
                    }
                },
                other => {
                    let message = format!(
                        "{path}: pass the arguments as a table, as in {path}({{key = value}}), not a {}",
                        other.type_name()
                    );
                    return Ok((false, error_table(lua, name, path, &message, "bad_request", None)?));
                }
            };
            let line = crate::lua::api::line_in(lua, "=script");
            match calls.start(name, path, line, group, params) {
                Ok(id) => Ok((true, Value::Integer(id as i64))),
                Err(Refusal::Refuse(message)) => Ok((false, error_table(lua, name, path, &message, "refused", None)?)),
                Err(Refusal::Stop(_)) => Err(crate::lua::script::stopped()),
            }
        })
    }

    /// Whether a tool may be called from this runner's scripts: in its scope, and not
    /// destructive unless the operator allows it.
    fn admission(&self) -> impl Fn(&Calls, &str) -> Result<(), String> + Send + 'static {
        let allow = self.allow.clone();
        let policy = self.policy.clone();
        let runner = self.name.clone();
        move |calls, name| {
            if allow.as_ref().is_some_and(|set| !set.is_match(name)) {
                return Err(format!(
                    "tool '{name}' is not available in scripted tool '{runner}': only the tools its `tools` globs name exist here"
                ));
            }
            let Some(spec) = calls.registry().spec(name) else {
                return Err(format!("tool '{name}' is not registered (it may have gone away with a reload)"));
            };
            policy.refuses(spec).map_or(Ok(()), Err)
        }
    }

    /// The successful outcome: the result, cut to `max_output_bytes`, with the trace; a script_error
    /// when the result looks like a full MCP result but is not a valid one.
    fn output(
        &self,
        (value, cut): (Json, Option<outcome::Cut>),
        calls: &Calls,
        dropped_lines: u32,
    ) -> Result<Output, CallError> {
        let mut trace = calls.trace();
        if let Some(cut) = &cut {
            trace["truncated"] = json!({
                "limit_bytes": cut.limit_bytes,
                "original_bytes": cut.original_bytes,
                "note": format!(
                    "the result was {} bytes of JSON, over max_output_bytes ({}); long lists, texts and objects were cut where they say so",
                    cut.original_bytes, cut.limit_bytes
                ),
            });
        }
        if dropped_lines > 0 {
            trace["log_lines_dropped"] = json!(dropped_lines);
        }
        // A result the run cannot send fails as the script's own, with the trace.
        let refused = |reason: &str, message: String, trace: Json| CallError::ScriptFailed {
            code: envelope_code(reason),
            message: format!("{message} ({})", calls.summary()),
            reason: reason.to_string(),
            data: Box::new(json!({"line": null, "trace": trace})),
        };
        if let Some(cut) = cut.as_ref().filter(|_| outcome::was_mcp_result(&value)) {
            let message = format!(
                "the script's result is a full MCP result of {} bytes of JSON, over max_output_bytes ({}); an MCP \
                 result is not cut (its blocks would break): return less, or return plain data, which is cut \
                 keeping its shape",
                cut.original_bytes, cut.limit_bytes
            );
            return Err(refused("result_too_large", message, trace));
        }
        match outcome::script_output(value) {
            Ok(output) => Ok(Output::Traced { output: Box::new(output), trace }),
            Err(message) => Err(refused("script_error", message, trace)),
        }
    }

    /// A failed run as a tool error: what stopped it, where, and the calls made so far.
    fn failure(&self, err: ScriptError, calls: &Calls, timeout: Option<Duration>, servers: &[String]) -> CallError {
        let summary = calls.summary();
        let (code, message, mut data) = match (calls.tripped(), err) {
            (_, ScriptError::Cancelled { .. }) if calls.tripped().is_none() => {
                return CallError::Cancelled { subject: format!("tool '{}'", self.name) }
            }
            (Some(tripped), _) => {
                (tripped.limit, format!("the script was stopped: {}", tripped.message), json!({"limit": tripped.limit}))
            }
            (None, ScriptError::Timeout { .. }) => {
                let limit = timeout.map_or(self.limits.timeout, |t| t.min(self.limits.timeout));
                let message = format!(
                    "the script was stopped: it ran past its time limit of {} (the call's timeout, at most [code_mode] timeout); calls in flight were cancelled",
                    crate::lua::seconds(&limit)
                );
                ("timeout", message, json!({"limit": "timeout"}))
            }
            (None, ScriptError::Memory { limit_bytes, .. }) => {
                let message = format!(
                    "the script was stopped: it used more than its memory limit of {} MiB ([code_mode] memory_mb), the results of \
                     its calls included; keep less data in Lua tables, and ask tools for less (a limit or a filter)",
                    limit_bytes / (1024 * 1024)
                );
                ("memory", message, json!({"limit": "memory"}))
            }
            (None, ScriptError::Instructions { limit, .. }) => {
                let message = format!(
                    "the script was stopped: it executed its limit of {limit} Lua instructions ([code_mode] max_instructions); is there a loop that never ends?"
                );
                ("max_instructions", message, json!({"limit": "max_instructions"}))
            }
            (None, ScriptError::Raised { message, data, .. }) => {
                let line = data.get("line").and_then(Json::as_i64);
                let at = line.map(|l| format!("script:{l}: ")).unwrap_or_default();
                let message = format!("{at}{message}");
                ("script_error", message, json!({"error": data, "line": line}))
            }
            (None, ScriptError::ResultTooLarge { size, limit, .. }) => {
                let message = format!(
                    "the script's result is over {size} bytes of JSON, more than a run may hold ([code_mode] memory_mb, \
                     {limit} bytes); return less: results are cut to max_output_bytes ({}) anyway",
                    self.limits.max_output_bytes
                );
                ("result_too_large", message, json!({"line": null}))
            }
            (None, e @ ScriptError::BadResult { .. }) => {
                let message =
                    format!("{e}; return a table of strings, numbers, booleans and tables (no functions, no cycles)");
                ("script_error", message, json!({"line": null}))
            }
            (None, e @ (ScriptError::Runtime { .. } | ScriptError::Load { .. })) => {
                let text = e.to_string();
                let message = shadowing_hint(&text).or_else(|| unknown_global_hint(&text, servers)).unwrap_or(text);
                let line = line_of(&message);
                let code = if matches!(e, ScriptError::Load { .. }) { "syntax_error" } else { "script_error" };
                (code, message, json!({"line": line}))
            }
            (None, other) => return CallError::from_script(&self.name, other),
        };
        data["trace"] = calls.trace();
        CallError::ScriptFailed {
            code: envelope_code(code),
            message: format!("{message} ({summary})"),
            reason: code.to_string(),
            data: Box::new(data),
        }
    }
}

/// The envelope code (and so the REST status) of a run's own failure code: the same as any
/// tool's for a deadline, a memory cap and a result over its cap; a script that does not
/// compile is the caller's bad input; anything else the script did is a tool error.
fn envelope_code(reason: &str) -> ErrorCode {
    match reason {
        "timeout" => ErrorCode::Timeout,
        "memory" => ErrorCode::MemoryLimit,
        "syntax_error" => ErrorCode::BadRequest,
        "result_too_large" => ErrorCode::ResultTooLarge,
        _ => ErrorCode::ToolError,
    }
}

/// Seed 001's common mistake: `local result = ...` hides the global `result()`.
fn shadowing_hint(message: &str) -> Option<String> {
    if !message.contains("attempt to call") || !message.contains("(local 'result')") {
        return None;
    }
    let at = line_of(message).map(|l| format!("script:{l}: ")).unwrap_or_default();
    Some(format!(
        "{at}`result` is a local variable here, so it hides the global result() function; \
         give the local another name (local sum = ...) and call result(sum)"
    ))
}

/// The line of a `script:12: ...` message.
fn line_of(message: &str) -> Option<i64> {
    let rest = &message[message.find("script:")? + 7..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The group and registry name of `key` in `group`: `(name, path)`, or `(nil, message)`.
fn resolve(catalog: &Catalog, group: &str, key: &str) -> (Option<String>, Option<String>) {
    let layout = catalog.layout();
    if let Some(found) = layout.group(group) {
        if let Some(member) = layout.member(found, key) {
            return (Some(member.registry.clone()), Some(super::names::path(found, member)));
        }
    }
    // `ctx["github__search"]`: any tool in scope by its registry name.
    if group == OWN {
        if let Some((found, member)) = layout.locate(key) {
            return (Some(member.registry.clone()), Some(super::names::path(found, member)));
        }
    }
    if group == OWN && key == "execute" {
        return (
            None,
            Some(
                "ctx.execute: a script does not start another script; call the tools it would call \
                            from this one"
                    .to_string(),
            ),
        );
    }
    if group == OWN && matches!(key, "list_servers" | "list_tools" | "describe_tool" | "search_tools") {
        return (None, Some(format!("ctx.{key}: discovery is a global function in scripts; call {key}(...)")));
    }
    let shown = if group == OWN { OWN.to_string() } else { format!("mcp[{}]", super::names::lua_string(group)) };
    (
        None,
        Some(format!(
            "{shown} has no tool {}; list_tools({}) lists them, search_tools(\"...\") finds one",
            super::names::lua_string(key),
            super::names::lua_string(group)
        )),
    )
}

/// Configured upstream servers a script cannot call yet, by name: why, and what to do.
type Starting = HashMap<String, String>;

/// The server globals of a run, `(global, group)`: each group installed as a global, then each
/// configured server that is not connected yet (its global says so instead of being nil: an
/// agent's first script often runs while it starts), and `ctx` even in a scripted tool that
/// may call none of ctx's own tools.
fn server_globals<'a>(catalog: &'a Catalog, starting: &'a Starting) -> Vec<(String, &'a str)> {
    let layout = catalog.layout();
    let mut globals: Vec<(String, &str)> =
        layout.groups.iter().filter_map(|g| Some((g.global.clone()?, g.name.as_str()))).collect();
    let mut waiting: Vec<&String> = starting.keys().collect();
    waiting.sort();
    for server in waiting {
        let global = super::names::lua_identifier(server);
        if !super::names::shadows_global(&global) && !globals.iter().any(|(g, _)| *g == global) {
            globals.push((global, server.as_str()));
        }
    }
    if layout.group(OWN).is_none() {
        globals.push((OWN.to_string(), OWN));
    }
    globals
}

/// A misspelt server global: Lua says only "attempt to index a nil value (global 'tme')", so
/// name the servers there are and the nearest one. A misspelt function gets the nearest
/// function of code mode or of Lua, when there is one. The line stays first.
fn unknown_global_hint(message: &str, servers: &[String]) -> Option<String> {
    let name_after = |marker: &str| {
        let rest = &message[message.find(marker)? + marker.len()..];
        Some(rest[..rest.find('\'')?].to_string())
    };
    let at = line_of(message).map(|l| format!("script:{l}: ")).unwrap_or_default();
    if let Some(name) = name_after("attempt to index a nil value (global '") {
        let mut names: Vec<&str> = servers.iter().map(String::as_str).collect();
        names.sort_unstable();
        let libraries = ["string", "table", "math", "utf8", "coroutine", "os"];
        let guess = super::names::nearest(&name, names.iter().copied().chain(libraries).chain(crate::lua::api::NAMES))
            .map(|n| format!("did you mean '{n}'? "))
            .unwrap_or_default();
        return Some(format!(
            "{at}global '{name}' is nil: no server '{name}' in this script's scope; {guess}servers: {} \
             (list_servers() lists them with their tools)",
            names.join(", ")
        ));
    }
    let name = name_after("attempt to call a nil value (global '")?;
    let functions = ["result", "await_all", "list_servers", "list_tools", "describe_tool", "search_tools"];
    let lua = ["print", "pairs", "ipairs", "tostring", "tonumber", "type", "pcall", "error", "assert", "select"];
    let guess = super::names::nearest(&name, functions.into_iter().chain(lua))?;
    Some(format!("{at}global '{name}' is nil: there is no function '{name}'; did you mean '{guess}'?"))
}

/// The upstream servers that are configured but have no tools in `catalog` because they are
/// not ready (connecting, restarting, crash-looping), each with the message a script that
/// reaches for it gets.
fn starting_servers(registry: &crate::tools::Registry, catalog: &Catalog) -> Starting {
    let Some(upstreams) = registry.upstream_servers() else { return Starting::new() };
    upstreams
        .not_ready()
        .into_iter()
        .filter(|s| catalog.layout().group(&s.name).is_none())
        .map(|s| {
            let last = s.last_error.as_deref().map(|e| format!("; last error: {e}")).unwrap_or_default();
            let message = format!(
                "upstream MCP server '{}' is configured but not ready ({}{last}): its tools appear once it connects; \
                 retry in a moment (/health shows its state)",
                s.name,
                s.state.with_attempts(s.attempt),
            );
            (s.name, crate::lua::api::log::one_line(&message).into_owned())
        })
        .collect()
}

fn no_group(catalog: &Catalog, key: &str) -> String {
    let names: Vec<&str> = catalog.layout().groups.iter().map(|g| g.name.as_str()).collect();
    format!("mcp: no server {}; the servers are: {}", super::names::lua_string(key), names.join(", "))
}

/// The Rust half of `:await()`: `(true, value)` or `(false, error table)`.
fn wait_fn(lua: &Lua, calls: &Arc<Calls>) -> mlua::Result<mlua::Function> {
    let calls = Arc::clone(calls);
    lua.create_function(move |lua, id: i64| {
        let Some(slot) = usize::try_from(id).ok().and_then(|i| calls.slot(i)) else {
            return Err(mlua::Error::RuntimeError("await: not a pending call of this script".to_string()));
        };
        let result = calls.wait(&slot)?;
        let (path, tool) = (slot.path.as_str(), slot.tool.as_str());
        let value = match result {
            Ok(output) => match outcome::inner_value(output) {
                Ok(json) => return Ok(MultiValue::from_vec(vec![Value::Boolean(true), convert::to_lua(lua, &json)?])),
                Err(message) => error_table(lua, tool, path, &message, "tool_error", slot.line)?,
            },
            Err(e) => {
                let code = serde_json::to_value(e.code()).ok().and_then(|c| c.as_str().map(str::to_string));
                error_table(lua, tool, path, &e.to_string(), code.as_deref().unwrap_or("tool_error"), slot.line)?
            }
        };
        Ok(MultiValue::from_vec(vec![Value::Boolean(false), value]))
    })
}

/// The error a failed call raises: `{tool, call, message, code, line}`, whose `tostring` reads
/// `github.search_repos failed: message`.
fn error_table(lua: &Lua, tool: &str, path: &str, message: &str, code: &str, line: Option<i64>) -> mlua::Result<Value> {
    let table = lua.create_table()?;
    table.raw_set("tool", tool)?;
    table.raw_set("call", path)?;
    table.raw_set("message", crate::lua::ScriptError::bounded_text(message, crate::lua::ScriptError::MESSAGE_CAP))?;
    table.raw_set("code", code)?;
    if let Some(line) = line.or_else(|| crate::lua::api::line_in(lua, "=script")) {
        table.raw_set("line", line)?;
    }
    let meta = lua.create_table()?;
    meta.raw_set(
        "__tostring",
        lua.create_function(|_, e: Table| {
            let call: String = e.raw_get("call").unwrap_or_default();
            let message: String = e.raw_get("message").unwrap_or_default();
            Ok(format!("{call} failed: {message}"))
        })?,
    )?;
    table.set_metatable(Some(meta))?;
    Ok(Value::Table(table))
}
