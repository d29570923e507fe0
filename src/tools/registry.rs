//! The tool registry: an immutable snapshot of every tool, and the one call path.
//!
//! [`Tools`] holds the current snapshot and swaps in a new one atomically (hot reload); a call
//! keeps the snapshot it started with until it finishes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use serde_json::{json, Value as Json};

use super::lua_tool::LuaTool;
use super::{builtin, stuck, CallEnv, CallError, Output, ToolRef, ToolSpec, BUILTINS};
use crate::agents::{self, AgentRef, AgentSpec};
use crate::config::{BrokenSection, Config, ScriptKind, ScriptSection};
use crate::kb::Kb;
use crate::lua::{watchdog, CancelHandle, ProgressSink};
use crate::types::{
    AgentPrompt, AgentsList, ConfigStatus, ConfigStatusRunning, LoadProblem, LoadProblemKind, RefusedEdit, ToolsList,
};

/// Who is calling, and how to reach them while the tool runs.
#[derive(Clone, Default)]
pub struct CallOptions {
    /// Set it to stop the script (the client went away or cancelled).
    pub cancel: CancelHandle,
    /// Receives `progress(...)` calls, when the caller asked for progress.
    pub progress: Option<ProgressSink>,
    /// `rest`, `mcp`, `cli` or `lua`: for log lines.
    pub caller: &'static str,
    /// The tools whose runs made this call, outermost first (`context.call`, code mode's inner
    /// calls): what bounds recursion (see [`check_chain`]).
    pub chain: Vec<String>,
    /// Whom the call is made for (a named token); `None` is unscoped. A tool outside its scope
    /// is unknown to it, exactly as if it did not exist.
    pub principal: Option<Arc<super::Principal>>,
    /// The id of the call whose run made this one (`context.call`, code mode's inner calls).
    pub parent: Option<u64>,
    /// The token of an approved call (REST's `Ctx-Approval` header; otherwise taken from
    /// `_approval` beside the arguments).
    pub approval: Option<String>,
}

/// An id for each call, so inner calls can name their parent. It starts from the process's
/// start time in microseconds, so ids stay unique in a log that several processes (a server,
/// then another, the CLI) write over time.
fn next_call_id() -> u64 {
    static NEXT: std::sync::OnceLock<std::sync::atomic::AtomicU64> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        std::sync::atomic::AtomicU64::new(now.as_micros() as u64)
    });
    next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The longest tool name a call may give.
pub const MAX_NAME_BYTES: usize = 256;

/// How deep a chain of tool calls may go (a tool calling a tool calling a tool...).
pub const MAX_CHAIN: usize = 16;

/// How many times one tool may already be on a chain when it is called again: a little
/// deliberate recursion works, a loop fails fast with the chain in the message.
pub const MAX_REENTRY: usize = 2;

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

/// Every tool of one config, in listing order: built-ins first, then Lua tools by name.
pub struct Registry {
    tools: Vec<ToolRef>,
    index: HashMap<String, usize>,
    /// Agents in listing order: inline, then Lua, each by name.
    agents: Vec<AgentRef>,
    problems: Vec<LoadProblem>,
    /// What loaded but looks wrong (a required parameter with a default).
    warnings: Vec<LoadProblem>,
    /// How many of `tools`, `problems` and `warnings` come from the config; upstream tools and
    /// their problems follow, and are replaced whenever an upstream relists.
    own: (usize, usize, usize),
    kb: Kb,
    /// The upstream servers whose tools this snapshot holds, to say why a call of a tool of a
    /// server that is down fails.
    upstreams: Option<Arc<crate::upstream::Upstreams>>,
    /// The rate limits of this config (their buckets outlive the snapshot).
    rates: Arc<super::rate::Rules>,
    /// Which calls wait for a person's approval.
    approvals: Arc<crate::approval::Policy>,
}

impl Registry {
    /// Loads every `[tools.script.*]`. A script that fails to load, or a section an unset
    /// `${VAR}` disables, is reported in [`Registry::problems`] and does not stop the others.
    /// With `previous`, such a tool keeps its last good version from that snapshot (hot reload).
    pub fn build(kb: Kb, previous: Option<&Registry>) -> Registry {
        let config = Arc::clone(kb.config());
        let sections: Vec<&ScriptSection> = config.scripts_of(ScriptKind::Tool).collect();
        let broken: Vec<&BrokenSection> = config.broken_of(ScriptKind::Tool).collect();
        let mut loaded = load_lua(&sections, &broken, previous);
        let names: Vec<&str> =
            BUILTINS.iter().copied().chain(loaded.tools.iter().map(|t| t.spec().name.as_str())).collect();
        let (agents, agent_problems, unknown_tools) =
            agents::load(&config, previous.map(|p| p.agents.as_slice()).unwrap_or(&[]), &names);
        for warning in &unknown_tools {
            tracing::warn!("[agents.*.{}]: {}", warning.name, warning.message);
        }
        loaded.problems.extend(agent_problems);
        // Connectors are not served from here, but /health and `ctx tool list` report every
        // disabled section, so a broken source is not silently missing.
        let connectors = config.broken_of(ScriptKind::Connector);
        loaded.problems.extend(connectors.map(|b| broken_problem(LoadProblemKind::Connector, b)));
        loaded.problems.extend(config.broken_upstreams().map(|b| broken_problem(LoadProblemKind::Upstream, b)));
        let mut registry = Registry::assemble(kb, loaded.tools, loaded.problems);
        registry.warnings = loaded.warnings;
        registry.agents = agents;
        registry.own.2 = registry.warnings.len();
        registry
    }

    /// This registry with the tools of `upstreams` as they are listed now, in place of the ones
    /// it had: what a relist or a reload swaps in.
    pub fn with_upstreams(&self, upstreams: &Arc<crate::upstream::Upstreams>) -> Registry {
        let (tools, problems, warnings) = self.own;
        let mut taken: HashMap<String, String> = self.tools[..tools]
            .iter()
            .map(|t| {
                let spec = t.spec();
                let holder = if spec.builtin {
                    format!("the built-in tool '{}'", spec.name)
                } else {
                    format!("the Lua tool of {}", spec.script.as_deref().unwrap_or("a script"))
                };
                (spec.name.clone(), holder)
            })
            .collect();
        let catalog = upstreams.lists(crate::upstream::client::TOOLS);
        let (extra, collisions, notes) = super::upstream_tool::build(&catalog, upstreams, &mut taken);
        let mut all: Vec<ToolRef> = self.tools[..tools].to_vec();
        all.extend(extra);
        let mut all_problems = self.problems[..problems].to_vec();
        all_problems.extend(collisions);
        let config = self.kb.config();
        let (code, code_problems) = crate::code::tools::tools(&config.code_mode, &config.scripted, &all);
        all.extend(code);
        all_problems.extend(code_problems);
        let mut all_warnings = self.warnings[..warnings].to_vec();
        all_warnings.extend(notes);
        let index = all.iter().enumerate().map(|(i, t)| (t.spec().name.clone(), i)).collect();
        Registry {
            tools: all,
            index,
            agents: self.agents.clone(),
            problems: all_problems,
            warnings: all_warnings,
            own: self.own,
            kb: self.kb.clone(),
            upstreams: Some(Arc::clone(upstreams)),
            rates: Arc::clone(&self.rates),
            approvals: Arc::clone(&self.approvals),
        }
    }

    /// A registry of the built-ins plus the one script of `section` (`ctx tool test`). Fails
    /// with the load error, so the caller can show it.
    pub fn with_script(kb: Kb, section: &ScriptSection) -> Result<Registry, String> {
        let loaded = load_lua(&[section], &[], None);
        match loaded.problems.into_iter().next() {
            Some(problem) => Err(problem.message),
            None => {
                let mut registry = Registry::assemble(kb, loaded.tools, Vec::new());
                registry.warnings = loaded.warnings;
                registry.own.2 = registry.warnings.len();
                Ok(registry)
            }
        }
    }

    fn assemble(kb: Kb, lua: Vec<ToolRef>, mut problems: Vec<LoadProblem>) -> Registry {
        let mut tools: Vec<ToolRef> = builtin::all().into_iter().chain(lua).collect();
        // Code mode's tools come last and are rebuilt with every relist: their catalogs
        // describe the tools before them.
        let own = (tools.len(), problems.len(), 0);
        let config = kb.config();
        let (code, code_problems) = crate::code::tools::tools(&config.code_mode, &config.scripted, &tools);
        tools.extend(code);
        problems.extend(code_problems);
        let index = tools.iter().enumerate().map(|(i, t)| (t.spec().name.clone(), i)).collect();
        let tool_of_section = |section: &str| {
            let tool = tools.iter().find(|t| t.spec().section.as_deref() == Some(section));
            tool.map(|t| t.spec().name.clone())
        };
        let rates = Arc::new(super::rate::Rules::from_config(config, &tool_of_section));
        let approvals = Arc::new(crate::approval::Policy::from_config(config));
        Registry {
            tools,
            index,
            agents: Vec::new(),
            problems,
            warnings: Vec::new(),
            own,
            kb,
            upstreams: None,
            rates,
            approvals,
        }
    }

    /// The error for a call of `name` that is not registered: "failed to load" with the reason
    /// when a section of that name failed, else `None` (the name is unknown).
    fn not_loaded(&self, kind: LoadProblemKind, name: &str) -> Option<CallError> {
        let problem = self.problems.iter().find(|p| p.kind == kind && p.name == name)?;
        let word = if kind == LoadProblemKind::Agent { "agent" } else { "tool" };
        Some(CallError::NotLoaded { subject: format!("{word} '{name}'"), reason: problem.message.clone() })
    }

    /// The agents, in listing order.
    pub fn agents(&self) -> impl Iterator<Item = &AgentSpec> {
        self.agents.iter().map(|a| a.spec())
    }

    /// `GET /agents/list`: the agents `principal` may use (every one without a principal).
    pub fn agent_listing(&self, principal: Option<&super::Principal>) -> AgentsList {
        AgentsList { agents: self.agents_for(principal).map(AgentSpec::info).collect() }
    }

    /// The agents `principal` may see and resolve: a scoped token's globs name agents as they
    /// name tools.
    pub fn agents_for<'a>(&'a self, principal: Option<&'a super::Principal>) -> impl Iterator<Item = &'a AgentSpec> {
        self.agents().filter(move |a| super::principal::allows(principal, &a.name))
    }

    /// Resolves an agent's prompt: the one path REST, MCP and the CLI take. Checks the
    /// arguments, runs the agent (a Lua agent under its limits) and fills in its tools.
    pub fn prompt(self: &Arc<Self>, name: &str, args: Json, options: &CallOptions) -> Result<AgentPrompt, CallError> {
        let started = Instant::now();
        let result = self.resolve_agent(name, args, options);
        let micros = started.elapsed().as_micros() as u64;
        match &result {
            Ok(_) => tracing::debug!(agent = name, caller = options.caller, micros, "agent resolved"),
            Err(e) => {
                let text = e.to_string();
                let text = crate::lua::api::log::one_line(&text);
                tracing::info!(agent = name, caller = options.caller, micros, code = %e.code(), "agent failed: {text}")
            }
        }
        result
    }

    fn resolve_agent(
        self: &Arc<Self>,
        name: &str,
        args: Json,
        options: &CallOptions,
    ) -> Result<AgentPrompt, CallError> {
        let principal = options.principal.as_deref();
        let visible = |agent: &str| super::principal::allows(principal, agent);
        let agent = self.agents.iter().find(|a| a.spec().name == name && visible(name)).ok_or_else(|| {
            if let Some(broken) = self.not_loaded(LoadProblemKind::Agent, name).filter(|_| visible(name)) {
                return broken;
            }
            let names: Vec<&str> = self.agents_for(principal).map(|s| s.name.as_str()).collect();
            let names = if names.is_empty() { "none configured".to_string() } else { names.join(", ") };
            CallError::UnknownAgent(format!("unknown agent '{name}'; available agents: {names}"))
        })?;
        let spec = agent.spec();
        let args = spec.check(&args)?;
        let env = self.env(name, options, next_call_id());
        let resolved = agent.resolve(&args, &env)?;
        Ok(AgentPrompt {
            agent: spec.name.clone(),
            description: Some(spec.description.clone()),
            system: resolved.system,
            messages: resolved.messages,
            tools: if resolved.tools.is_empty() { spec.tools.clone() } else { resolved.tools },
        })
    }

    /// The listed tools, in listing order: built-ins, Lua tools, then upstream tools (a server
    /// with `expose = "discover"` is left out, though its tools stay callable by name).
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.all_specs().filter(|s| !s.hidden)
    }

    /// Every tool, listed or not (`expose = "discover"` servers' tools included).
    /// Built-ins (code mode's among them) come first, then the rest in registry order.
    pub fn all_specs(&self) -> impl Iterator<Item = &ToolSpec> {
        let specs = || self.tools.iter().map(|t| t.spec());
        specs().filter(|s| s.builtin).chain(specs().filter(|s| !s.builtin))
    }

    pub fn spec(&self, name: &str) -> Option<&ToolSpec> {
        self.index.get(name).map(|&i| self.tools[i].spec())
    }

    /// `GET /tools/list`.
    pub fn listing(&self) -> ToolsList {
        self.listing_for(None)
    }

    /// The listing as `principal` sees it: only its tools (`None`: every tool).
    pub fn listing_for(&self, principal: Option<&super::Principal>) -> ToolsList {
        let tools = self.specs_for(principal).map(|(spec, description)| {
            let mut info = spec.info();
            if let Some(description) = description {
                info.description = description;
            }
            info
        });
        ToolsList { tools: tools.collect() }
    }

    /// The specs `principal` may see, each with the description it sees when that differs:
    /// `execute`'s lists the catalog, so a scoped token gets one rendered from its own tools.
    pub fn specs_for<'a>(
        &'a self,
        principal: Option<&'a super::Principal>,
    ) -> impl Iterator<Item = (&'a ToolSpec, Option<String>)> + 'a {
        self.specs().filter(move |s| super::principal::allows(principal, &s.name)).map(move |s| match principal {
            Some(p) if s.builtin && s.name == "execute" => {
                (s, Some(crate::code::catalog_of(self, p).execute_description()))
            }
            // A scripted tool's description lists the signatures of the tools it may call:
            // a scoped token sees only those it may call itself.
            Some(p)
                if crate::code::runs_scripts(self.kb().config(), &s.name)
                    && s.upstream.is_none()
                    && s.script.is_none() =>
            {
                (s, crate::code::scripted_description(self, &s.name, p))
            }
            _ => (s, None),
        })
    }

    /// Scripts that failed to load and sections an unset variable disables, in config order.
    pub fn problems(&self) -> &[LoadProblem] {
        &self.problems
    }

    /// Tools that loaded with something that looks like a mistake.
    pub fn warnings(&self) -> &[LoadProblem] {
        &self.warnings
    }

    pub fn kb(&self) -> &Kb {
        &self.kb
    }

    /// The upstream MCP servers whose tools this registry holds, when it has any.
    pub fn upstream_servers(&self) -> Option<&Arc<crate::upstream::Upstreams>> {
        self.upstreams.as_ref()
    }

    /// Which calls wait for approval, and the store of approvals.
    pub fn approvals(&self) -> &Arc<crate::approval::Policy> {
        &self.approvals
    }

    fn by_section(&self, section: &str) -> Option<ToolRef> {
        self.tools.iter().find(|t| t.spec().section.as_deref() == Some(section)).cloned()
    }

    /// Calls a tool: the one path every caller takes. Blocks while a script runs, so async
    /// callers use [`Tools::call`].
    pub fn call(self: &Arc<Self>, name: &str, params: Json, options: &CallOptions) -> Result<Output, CallError> {
        let started = Started::now(options, &params);
        let result = self
            .prepare(name, params, options, None)
            .and_then(|(tool, params)| tool.run(params, &self.env(name, options, started.id)));
        self.log_call(name, options, started, &result);
        result
    }

    /// Whether `name` is a tool that `options`' caller may call and whose calls wait for a
    /// person's approval (out of scope, it is unknown, at once).
    fn needs_approval(&self, name: &str, options: &CallOptions) -> bool {
        super::principal::allows(options.principal.as_deref(), name)
            && self.index.get(name).is_some_and(|&i| self.approvals.needs(self.tools[i].spec()))
    }

    /// Looks the tool up and checks the parameters (filling in defaults). When `gone` is set
    /// (the caller stopped waiting while this ran on the blocking pool), an approval is not
    /// used up: the call stops as cancelled before it.
    fn prepare(
        &self,
        name: &str,
        mut params: Json,
        options: &CallOptions,
        gone: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<(ToolRef, Json), CallError> {
        // No tool has a longer name (upstream ones are capped too): refused before anything
        // quotes it in a message, a log line or the call log.
        if name.len() > MAX_NAME_BYTES {
            let shown: String = name.chars().take(40).collect();
            return Err(CallError::UnknownTool(format!(
                "unknown tool '{shown}…': tool names are at most {MAX_NAME_BYTES} bytes; GET /tools/list has them"
            )));
        }
        // A token beside the arguments is the caller's, not the tool's.
        let beside = match &mut params {
            Json::Object(map) => map.remove(crate::approval::PARAM),
            _ => None,
        };
        let principal = options.principal.as_deref();
        let in_scope = super::principal::allows(principal, name);
        let tool = self.index.get(name).filter(|_| in_scope).map(|&i| &self.tools[i]).ok_or_else(|| {
            // Out of scope is unknown, with no hint that it exists.
            if in_scope {
                if let Some(broken) = self.not_loaded(LoadProblemKind::Tool, name) {
                    return broken;
                }
                if let Some(down) = self.down_upstream(name) {
                    return down;
                }
            }
            let names: Vec<&str> =
                self.specs().map(|s| s.name.as_str()).filter(|n| super::principal::allows(principal, n)).collect();
            CallError::UnknownTool(format!("unknown tool '{name}'; available tools: {}", names.join(", ")))
        })?;
        let params = tool
            .spec()
            .params
            .check(params)
            .map_err(|problems| CallError::InvalidParams { tool: name.to_string(), problems })?;
        check_chain(name, &options.chain)?;
        if let Some(refusal) = crate::code::nested_script(self.kb.config(), &options.chain, name) {
            return Err(CallError::BadRequest(refusal));
        }
        if options.cancel.is_cancelled() {
            return Err(CallError::cancelled(name));
        }
        let caller = principal.map(super::Principal::name).unwrap_or("");
        // Approval first: a call that only asks for approval costs no rate.
        let approved = match self.approvals.needs(tool.spec()) {
            true => {
                let token = options.approval.as_deref().or(beside.as_ref().and_then(Json::as_str));
                Some(self.approvals.check(name, &params, caller, options.caller, token)?)
            }
            false => None,
        };
        if !self.rates.is_empty() {
            self.rates.take(name, caller).map_err(|refused| CallError::RateLimited {
                tool: name.to_string(),
                rate: refused.rate,
                retry_after: refused.retry_after,
            })?;
        }
        // Used up only now that the call runs (a rate refusal keeps it for the next try).
        if let Some(approval) = approved {
            if gone.is_some_and(|g| g.load(std::sync::atomic::Ordering::Acquire)) {
                return Err(CallError::cancelled(name));
            }
            self.approvals.consume(name, &approval)?;
        }
        Ok((Arc::clone(tool), params))
    }

    /// What the run of `name` (call `id`) may use: the calls it makes carry `name` on their
    /// chain and `id` as their parent.
    fn env(self: &Arc<Self>, name: &str, options: &CallOptions, id: u64) -> CallEnv<'_> {
        let mut chain = options.chain.clone();
        chain.push(name.to_string());
        CallEnv {
            kb: &self.kb,
            cancel: options.cancel.clone(),
            progress: options.progress.clone(),
            registry: Arc::clone(self),
            caller: options.caller,
            chain,
            principal: options.principal.clone(),
            call_id: id,
        }
    }

    /// Why `name` is not registered when it names a tool of an upstream server that is not
    /// ready: its tools are gone from the listing until it reconnects, and a call says so at
    /// once instead of "unknown tool".
    fn down_upstream(&self, name: &str) -> Option<CallError> {
        let upstreams = self.upstreams.as_ref()?;
        let statuses = upstreams.status();
        // The server the name belongs to, as the registry decides it (not merely the first
        // down server whose prefix matches: `a` down says nothing about `a__b__c`).
        let server = super::upstream_tool::owner(statuses.iter().map(|s| s.name.as_str()), name)?.to_string();
        let status = statuses.into_iter().find(|s| s.name == server && s.state != crate::upstream::State::Ready)?;
        let down = crate::upstream::UpstreamError::Down {
            server: status.name.clone(),
            state: status.state,
            attempt: status.attempt,
            last_error: status.last_error,
        };
        Some(CallError::from_upstream(name, std::time::Duration::ZERO, down))
    }

    /// A call run right here if the tool can finish it without blocking ([`Tool::run_inline`]):
    /// its result, logged like any call. `Err` when it cannot: the caller makes the call with
    /// [`Registry::call_deferred`] instead (code mode's inner calls, awaited as soon as they are
    /// made, skip two thread hand-offs this way). A call that was already admitted (its rate
    /// taken, its approval used) is not admitted again there.
    pub fn try_inline(
        self: &Arc<Self>,
        name: &str,
        params: Json,
        options: &CallOptions,
    ) -> Result<Result<Output, CallError>, NotInline> {
        // A call that may wait for a person runs as a task, where waiting blocks nothing.
        if self.approvals.wait_in_scripts && self.spec(name).is_some_and(|s| self.approvals.needs(s)) {
            return Err(NotInline(Deferred::Fresh(params)));
        }
        let started = Started::now(options, &params);
        let (tool, params) = match self.prepare(name, params, options, None) {
            Ok(prepared) => prepared,
            Err(e) => {
                let result = Err(e);
                self.log_call(name, options, started, &result);
                return Ok(result);
            }
        };
        if tool.as_async().is_some() || stuck::quarantined(stuck::identity(&tool)).is_some() {
            return Err(NotInline(Deferred::Admitted { tool, params, started: Box::new(started) }));
        }
        let Some(result) = self.inline(&tool, name, &params, options, started.id) else {
            return Err(NotInline(Deferred::Admitted { tool, params, started: Box::new(started) }));
        };
        self.log_call(name, options, started, &result);
        Ok(result)
    }

    /// Makes a call [`Registry::try_inline`] could not run inline, as [`Registry::call_async`]
    /// would, without admitting it twice.
    pub async fn call_deferred(
        self: Arc<Self>,
        name: String,
        deferred: NotInline,
        options: CallOptions,
    ) -> Result<Output, CallError> {
        match deferred.0 {
            Deferred::Fresh(params) => self.call_async(name, params, options).await,
            Deferred::Admitted { tool, params, started } => {
                self.run_admitted(name, tool, params, options, *started).await
            }
        }
    }

    /// The tool's inline attempt ([`Tool::run_inline`]); a panic in it is an `internal` error.
    fn inline(
        self: &Arc<Self>,
        tool: &ToolRef,
        name: &str,
        params: &Json,
        options: &CallOptions,
        id: u64,
    ) -> Option<Result<Output, CallError>> {
        let env = self.env(name, options, id);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tool.run_inline(params, &env)))
            .unwrap_or_else(|_| Some(Err(crashed(name, "panic in an inline run"))))
    }

    /// Whether `name` is a tool whose calls are futures (an upstream server's).
    pub fn is_async(&self, name: &str) -> bool {
        self.index.get(name).is_some_and(|&i| self.tools[i].as_async().is_some())
    }

    /// [`Registry::call`] for async callers: the one call path of REST, MCP and code mode's
    /// inner calls. A tool that waits on another process runs as a future right here; any
    /// other first gets a short inline run on this thread ([`Tool::run_inline`]), and what
    /// cannot finish there without blocking runs on the blocking pool, where dropping the
    /// future (the client went away) cancels the script. A panic inside the tool becomes an
    /// `internal` error.
    pub async fn call_async(
        self: Arc<Self>,
        name: String,
        params: Json,
        options: CallOptions,
    ) -> Result<Output, CallError> {
        let started = Started::now(&options, &params);
        // A call that needs approval reads and writes the approvals' SQLite file, which a
        // person's `ctx approvals approve` may hold for a moment: not on an async worker.
        let (prepared, started) = match self.needs_approval(&name, &options) {
            true => {
                // Dropping this future (the client went away, a cancellation) marks the call
                // gone, so the approval is not used up for a call that will not run.
                struct Gone(Option<Arc<std::sync::atomic::AtomicBool>>);
                impl Drop for Gone {
                    fn drop(&mut self) {
                        if let Some(flag) = &self.0 {
                            flag.store(true, std::sync::atomic::Ordering::Release);
                        }
                    }
                }
                let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let mut gone = Gone(Some(Arc::clone(&flag)));
                // A call dropped while it waits for a person is in the log too, as cancelled.
                let awaiting = Awaiting::new(&self, &name, &options, started);
                let (registry, owned, opts) = (Arc::clone(&self), name.clone(), options.clone());
                let prepared =
                    tokio::task::spawn_blocking(move || registry.prepare(&owned, params, &opts, Some(&flag)))
                        .await
                        .unwrap_or_else(|e| match e.is_cancelled() {
                            true => Err(CallError::cancelled(&name)),
                            false => Err(crashed(&name, &e.to_string())),
                        });
                // Done waiting: the flag only covers the wait.
                gone.0 = None;
                let Some(started) = awaiting.release() else {
                    return Err(crashed(&name, "a call's start was lost"));
                };
                (prepared, started)
            }
            false => (self.prepare(&name, params, &options, None), started),
        };
        let (tool, params) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => {
                let result = Err(e);
                self.log_call(&name, &options, started, &result);
                return result;
            }
        };
        self.run_admitted(name, tool, params, options, started).await
    }

    /// Runs a call that passed [`Registry::prepare`], and logs it.
    async fn run_admitted(
        self: Arc<Self>,
        name: String,
        tool: ToolRef,
        params: Json,
        options: CallOptions,
        started: Started,
    ) -> Result<Output, CallError> {
        if let Some(run) = stuck::quarantined(stuck::identity(&tool)) {
            let result = Err(CallError::Unavailable(format!(
                "tool '{name}' is quarantined: a call {:.0} s ago overran its deadline inside a library call and is still running; ctx refuses new calls of this tool until that call ends or its script is edited (the server log has the details)",
                run.since.elapsed().as_secs_f64()
            )));
            self.log_call(&name, &options, started, &result);
            return result;
        }
        // A tool that waits on another process runs as a future right here: no thread, and
        // dropping this future (the client went away or cancelled) cancels it upstream too.
        if let Some(async_tool) = tool.as_async() {
            let mut awaiting = Awaiting::new(&self, &name, &options, started);
            let result = async_tool.call(params, options.progress.clone()).await;
            awaiting.finish(&result);
            return result;
        }
        let id = started.id;
        let result = match self.inline(&tool, &name, &params, &options, id) {
            Some(result) => result,
            None => {
                let mut awaiting = Awaiting::new(&self, &name, &options, started);
                let (identity, deadline) = (stuck::identity(&tool), tool.deadline());
                let (registry, opts, tool_name) = (Arc::clone(&self), options.clone(), name.clone());
                let run = move || tool.run(params, &registry.env(&tool_name, &opts, id));
                let subject = format!("tool '{name}'");
                let result = watched(identity, deadline, subject, &options.cancel, run).await.unwrap_or_else(|e| {
                    // A run cancelled with its runtime (shutdown) did not crash.
                    if e.is_cancelled() {
                        return Err(CallError::cancelled(&name));
                    }
                    Err(crashed(&name, &e.to_string()))
                });
                awaiting.finish(&result);
                return result;
            }
        };
        self.log_call(&name, &options, started, &result);
        result
    }

    /// The end of every call: [`log_call`], with whether the name is a registered tool (only
    /// those become metrics labels).
    fn log_call(&self, name: &str, options: &CallOptions, started: Started, result: &Result<Output, CallError>) {
        log_call(name, self.index.contains_key(name), options, started, result);
    }
}

/// A call being awaited. Its log entry is written when it finishes, or, when the future is
/// dropped first (the client went away, an MCP cancellation), as cancelled: every call that
/// started is in the call log, the ones nobody waited for included.
struct Awaiting {
    call: Option<(Arc<Registry>, String, CallOptions, Started)>,
}

impl Awaiting {
    fn new(registry: &Arc<Registry>, name: &str, options: &CallOptions, started: Started) -> Awaiting {
        Awaiting { call: Some((Arc::clone(registry), name.to_string(), options.clone(), started)) }
    }

    /// Takes the call back unlogged, for the caller to go on with (and log) itself.
    fn release(mut self) -> Option<Started> {
        self.call.take().map(|(.., started)| started)
    }

    fn finish(&mut self, result: &Result<Output, CallError>) {
        if let Some((registry, name, options, started)) = self.call.take() {
            registry.log_call(&name, &options, started, result);
        }
    }
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        if let Some((_, name, ..)) = &self.call {
            let cancelled = Err(CallError::cancelled(name));
            self.finish(&cancelled);
        }
    }
}

/// A request that is not a tool call (an MCP prompt or resource request, an agent's prompt),
/// logged and counted like one under its MCP method's name (`prompts/get`, `resources/read`):
/// names with a `/`, which no tool can have. Dropped before [`Observed::finish`] (the client went
/// away), it is logged as cancelled.
pub struct Observed {
    request: Option<(String, CallOptions, Started)>,
}

impl Observed {
    pub fn start(method: &str, params: &Json, options: &CallOptions) -> Observed {
        Observed { request: Some((method.to_string(), options.clone(), Started::now(options, params))) }
    }

    /// Lets the request go unlogged: it is handed to a path that logs it itself.
    pub fn forget(mut self) {
        self.request = None;
    }

    /// Logs the outcome: a small summary of what was served, or the error.
    pub fn finish(mut self, result: Result<Json, &CallError>) {
        if let Some((method, options, started)) = self.request.take() {
            let result = match result {
                Ok(summary) => Ok(Output::Value(summary)),
                Err(e) => Err(e.clone()),
            };
            log_call(&method, true, &options, started, &result);
        }
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        if let Some((method, options, started)) = self.request.take() {
            let cancelled = Err(CallError::cancelled(&method));
            log_call(&method, true, &options, started, &cancelled);
        }
    }
}

/// A call [`Registry::try_inline`] could not run inline; [`Registry::call_deferred`] makes it.
pub struct NotInline(Deferred);

enum Deferred {
    /// Not admitted yet (it may wait for a person: it runs the whole call path as a task).
    Fresh(Json),
    /// Admitted (looked up, checked, its rate taken and its approval used): it only runs.
    Admitted { tool: ToolRef, params: Json, started: Box<Started> },
}

/// The output's value, as the call log keeps it as the result.
fn output_value(output: &Output) -> std::borrow::Cow<'_, Json> {
    match output {
        Output::Value(v) | Output::HandledError(v) => std::borrow::Cow::Borrowed(v),
        Output::Traced { output, .. } => output_value(output),
        other => std::borrow::Cow::Owned(other.value()),
    }
}

/// A call as it starts: its id, its time, and its call-log entry (parameters rendered) when a
/// log runs.
struct Started {
    id: u64,
    at: Instant,
    wall: std::time::SystemTime,
    entry: Option<Box<crate::calllog::Entry>>,
}

impl Started {
    fn now(_options: &CallOptions, params: &Json) -> Started {
        Started {
            id: next_call_id(),
            at: Instant::now(),
            wall: std::time::SystemTime::now(),
            entry: crate::calllog::begin(params),
        }
    }
}

/// The end of every call: its log line, its metrics, and its entry in the call log.
fn log_call(name: &str, known: bool, options: &CallOptions, started: Started, result: &Result<Output, CallError>) {
    let micros = started.at.elapsed().as_micros() as u64;
    let outcome = match result {
        Ok(output) if output.is_error() => "tool_error",
        Ok(_) => "ok",
        Err(e) => super::error::code_name(e.code()),
    };
    crate::metrics::call(name, known, outcome, micros);
    match result {
        Ok(_) => tracing::debug!(tool = name, caller = options.caller, micros, "tool call ok"),
        Err(e) => {
            let text = e.log_text();
            let text = crate::lua::api::log::one_line(&text);
            tracing::info!(tool = name, caller = options.caller, micros, code = %e.code(), "tool call failed: {text}")
        }
    }
    let Some(mut entry) = started.entry else { return };
    match result {
        Ok(output) => {
            entry.set_result(&output_value(output));
            entry.message = None;
        }
        Err(e) => {
            entry.has_result = false;
            entry.message = Some(e.log_text());
        }
    }
    entry.id = started.id;
    entry.parent = options.parent;
    entry.at = started.wall;
    entry.tool.clear();
    entry.tool.push_str(name);
    entry.caller.clear();
    if let Some(principal) = &options.principal {
        entry.caller.push_str(principal.name());
    }
    entry.via = options.caller;
    entry.micros = micros;
    entry.outcome = outcome;
    crate::calllog::record(entry);
}

/// What [`check`] found: problems make `ctx schema check` fail, warnings do not.
#[derive(Debug, Default)]
pub struct Checked {
    pub problems: Vec<LoadProblem>,
    pub warnings: Vec<LoadProblem>,
    /// Scripted tools' globs that match no tool, as whole lines.
    pub scripted: Vec<String>,
}

/// Loads the tool and agent scripts of a config and reports what fails, without a knowledge
/// base (`ctx schema check`): load errors, shadowed built-ins, duplicate names and agents that
/// name unknown tools. Sections an unset variable disables are the caller's to report: they
/// are config problems, with their keys and lines.
pub fn check(config: &Config) -> Checked {
    let sections: Vec<&ScriptSection> = config.scripts_of(ScriptKind::Tool).collect();
    let mut loaded = load_lua(&sections, &[], None);
    let names: Vec<&str> =
        BUILTINS.iter().copied().chain(loaded.tools.iter().map(|t| t.spec().name.as_str())).collect();
    let (_, agent_problems, unknown_tools) = agents::load(config, &[], &names);
    let disabled = |p: &LoadProblem| config.broken_of(ScriptKind::Agent).any(|b| b.name == p.name);
    loaded.problems.extend(agent_problems.into_iter().filter(|p| !disabled(p)));
    loaded.problems.extend(unknown_tools);
    let servers: Vec<&str> = config
        .upstreams
        .iter()
        .map(|u| u.name.as_str())
        .chain(config.broken_upstreams().map(|b| b.name.as_str()))
        .collect();
    let scripted = crate::code::tools::unmatched_globs(&config.scripted, &names, &servers);
    Checked { problems: loaded.problems, warnings: loaded.warnings, scripted }
}

/// What [`load_lua`] loaded (sorted by name), what failed, and what looks wrong.
struct Loaded {
    tools: Vec<ToolRef>,
    problems: Vec<LoadProblem>,
    warnings: Vec<LoadProblem>,
}

/// The load problem of a section an unset variable disables.
fn broken_problem(kind: LoadProblemKind, section: &BrokenSection) -> LoadProblem {
    LoadProblem { kind, name: section.name.clone(), message: crate::config::redact::string(section.message()) }
}

/// Parameters declared required that also have a default: a call must give them, so the
/// default never applies, which is rarely what the author meant.
fn required_with_default(spec: &ToolSpec) -> Vec<String> {
    let schema = spec.params.schema();
    let props = schema.get("properties");
    let has_default = |name: &&str| props.and_then(|p| p.get(*name)).is_some_and(|p| p.get("default").is_some());
    let required = schema.get("required").and_then(Json::as_array).into_iter().flatten().filter_map(Json::as_str);
    required.filter(has_default).map(str::to_string).collect()
}

/// Loads Lua tools in config order; returns them sorted by name, the problems and warnings.
/// A section in `broken` (disabled by an unset variable) is a problem too. With `previous`, a
/// tool that fails this way or to load keeps its last good version from that snapshot.
fn load_lua(sections: &[&ScriptSection], broken: &[&BrokenSection], previous: Option<&Registry>) -> Loaded {
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut lua: Vec<ToolRef> = Vec::new();
    let mut taken: HashMap<String, (String, String)> = HashMap::new();
    for section in broken {
        problems.push(broken_problem(LoadProblemKind::Tool, section));
        if let Some(old) = previous.and_then(|p| p.by_section(&section.name)) {
            let path = old.spec().script.clone().unwrap_or_default();
            taken.insert(old.spec().name.clone(), (section.name.clone(), path));
            lua.push(old);
        }
    }
    for section in sections {
        // A load message can quote what the script computed from its config: no secrets in it,
        // since /health and `ctx schema check` show it.
        let problem = |message: String| LoadProblem {
            kind: LoadProblemKind::Tool,
            name: section.name.clone(),
            message: crate::config::redact::string(message),
        };
        let owned = (*section).clone();
        let loaded = watchdog::bounded(&section.display_path, section.timeout, move || LuaTool::load(&owned));
        let tool: ToolRef = match loaded {
            Ok(tool) => Arc::new(tool),
            Err(message) => {
                tracing::warn!(tool = %section.name, "{message}");
                problems.push(problem(message));
                match previous.and_then(|p| p.by_section(&section.name)) {
                    Some(old) => old,
                    None => continue,
                }
            }
        };
        let name = tool.spec().name.clone();
        let here = (section.name.clone(), section.display_path.clone());
        let clash = if crate::config::code_mode::is_builtin(&name) {
            Some(format!(
                "{} ([tools.script.{}]) declares the name '{name}', which is a built-in tool; built-ins cannot be shadowed, so rename tool.name",
                here.1, here.0
            ))
        } else {
            taken.get(&name).map(|(first_section, first_path)| {
                format!(
                    "{} ([tools.script.{}]) declares the name '{name}', already taken by {first_path} ([tools.script.{first_section}]); tool names must be unique, so rename one",
                    here.1, here.0
                )
            })
        };
        if let Some(message) = clash {
            tracing::warn!(tool = %section.name, "{message}");
            problems.push(problem(message));
            continue;
        }
        for parameter in required_with_default(tool.spec()) {
            let message = format!(
                "{}: parameter '{parameter}' is required and has a default; a call must give it, so the default is never used: drop `required = true` or the default",
                section.display_path
            );
            tracing::warn!(tool = %section.name, "{message}");
            warnings.push(problem(message));
        }
        taken.insert(name, here);
        lua.push(tool);
    }
    lua.sort_by(|a, b| a.spec().name.cmp(&b.spec().name));
    Loaded { tools: lua, problems, warnings }
}

/// The current registry snapshot, swappable while calls are running.
pub struct Tools {
    current: RwLock<Arc<Registry>>,
    /// Which config the snapshot comes from, for `/health`: set by a server that was started
    /// from a config file (see [`Tools::config_loaded`]).
    config: RwLock<Option<ConfigStatus>>,
    /// The upstream MCP servers, once the server has started them.
    upstreams: RwLock<Option<Arc<crate::upstream::Upstreams>>>,
    /// Held while a new snapshot is put together and swapped in, so a reload and a relist
    /// that happen together cannot undo each other.
    swap: std::sync::Mutex<()>,
}

impl Tools {
    pub fn new(registry: impl Into<Arc<Registry>>) -> Tools {
        Tools {
            current: RwLock::new(registry.into()),
            config: RwLock::new(None),
            upstreams: RwLock::new(None),
            swap: std::sync::Mutex::new(()),
        }
    }

    /// Serves the tools of `upstreams` from now on (and swaps them in).
    pub fn attach_upstreams(&self, upstreams: Arc<crate::upstream::Upstreams>) {
        *self.upstreams.write().unwrap_or_else(|p| p.into_inner()) = Some(upstreams);
        self.refresh_upstreams();
    }

    /// The upstream MCP servers, when the server started any.
    pub fn upstreams(&self) -> Option<Arc<crate::upstream::Upstreams>> {
        self.upstreams.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Swaps in the upstream tools as they are listed now (after a relist). Returns whether
    /// the tool listing changed.
    pub fn refresh_upstreams(&self) -> bool {
        let Some(upstreams) = self.upstreams() else { return false };
        let _swap = self.swap.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.current();
        let next = before.with_upstreams(&upstreams);
        let changed = serde_json::to_value((before.listing(), before.problems())).ok()
            != serde_json::to_value((next.listing(), next.problems())).ok();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(next);
        changed
    }

    /// Records that the config file `file` was just read and runs as saved, clearing any
    /// refused edit.
    pub fn config_loaded(&self, file: &Path) {
        let file = file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let status =
            ConfigStatus { file, loaded_at: chrono::Utc::now(), running: ConfigStatusRunning::Current, refused: None };
        *self.config.write().unwrap_or_else(|p| p.into_inner()) = Some(status);
    }

    /// Records that hot reload refused an edit of the config file for `problems` (each with
    /// its file and line): the server keeps running the last good config.
    pub fn config_refused(&self, problems: Vec<String>) {
        let mut status = self.config.write().unwrap_or_else(|p| p.into_inner());
        if let Some(status) = status.as_mut() {
            status.running = ConfigStatusRunning::LastGood;
            status.refused = Some(RefusedEdit { at: chrono::Utc::now(), problems });
        }
    }

    /// The config the server runs on, when it was started from a file.
    pub fn config_status(&self) -> Option<ConfigStatus> {
        self.config.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The snapshot new calls use. The lock is held only to clone an `Arc`.
    pub fn current(&self) -> Arc<Registry> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Makes `registry` the snapshot for new calls; running calls finish on the old one.
    pub fn replace(&self, registry: Registry) {
        let _swap = self.swap.lock().unwrap_or_else(|p| p.into_inner());
        let registry = match self.upstreams() {
            Some(upstreams) => registry.with_upstreams(&upstreams),
            None => registry,
        };
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(registry);
    }

    /// [`Registry::call_async`] on the current snapshot: the call keeps the snapshot it
    /// started with until it finishes.
    pub async fn call(&self, name: String, params: Json, options: CallOptions) -> Result<Output, CallError> {
        self.current().call_async(name, params, options).await
    }
}

impl Tools {
    /// Runs [`Registry::prompt`] on the blocking pool, like [`Tools::call`].
    pub async fn prompt(&self, name: String, args: Json, options: CallOptions) -> Result<AgentPrompt, CallError> {
        let observed = Observed::start("prompts/get", &json!({"name": name, "arguments": args}), &options);
        let result = self.resolve_prompt(name, args, options).await;
        observed.finish(result.as_ref().map(|p| json!({"agent": p.agent, "messages": p.messages.len()})));
        result
    }

    async fn resolve_prompt(&self, name: String, args: Json, options: CallOptions) -> Result<AgentPrompt, CallError> {
        let registry = self.current();
        // A Lua agent is watched like a tool call (see `stuck`): past its deadline plus grace
        // the caller gets a timeout, and the agent is quarantined while its run goes on.
        let visible = super::principal::allows(options.principal.as_deref(), &name);
        let found = registry.agents.iter().find(|a| visible && a.spec().name == name).cloned();
        let identity = found.as_ref().map(|a| Arc::as_ptr(a) as *const () as usize).unwrap_or(0);
        if let Some(run) = found.as_ref().and_then(|_| stuck::quarantined(identity)) {
            return Err(CallError::Unavailable(format!(
                "agent '{name}' is quarantined: a call {:.0} s ago overran its deadline inside a library call and is still running; ctx refuses new calls of this agent until that call ends or its script is edited",
                run.since.elapsed().as_secs_f64()
            )));
        }
        let deadline = found.as_ref().and_then(|a| a.deadline());
        let (agent, cancel) = (name.clone(), options.cancel.clone());
        let run = move || registry.prompt(&name, args, &options);
        watched(identity, deadline, format!("agent '{agent}'"), &cancel, run).await.unwrap_or_else(|e| {
            tracing::error!(agent = %agent, "agent panicked: {e}");
            Err(CallError::Internal(format!("agent '{agent}' crashed inside ctx; the server log has the details")))
        })
    }
}

/// Runs `work` on the blocking pool and awaits it, for at most `deadline` plus
/// [`stuck::GRACE`]. Past that, the run is abandoned (see [`stuck`]): the caller gets a timeout
/// for `subject`, the run's cancel flag is set (it stops at its next check, if it ever gets
/// there), and the tool or agent of `identity` is quarantined until the run ends. Dropping the
/// future (the client went away) cancels the run too. `Err` when the run panicked.
async fn watched<T: Send + 'static>(
    identity: usize,
    deadline: Option<std::time::Duration>,
    subject: String,
    cancel: &CancelHandle,
    work: impl FnOnce() -> Result<T, CallError> + Send + 'static,
) -> Result<Result<T, CallError>, tokio::task::JoinError> {
    let on_drop = CancelOnDrop(Some(cancel.clone()));
    let watch = stuck::Watch::new(identity);
    let on_thread = watch.clone();
    let mut task = tokio::task::spawn_blocking(move || {
        let _finish = stuck::Finish(on_thread);
        work()
    });
    let joined = match watch.wait(&mut task, deadline, &subject).await {
        Some(joined) => joined,
        None => {
            cancel.cancel();
            Ok(Err(CallError::Timeout { subject, limit: deadline.unwrap_or_default() }))
        }
    };
    on_drop.disarm();
    joined
}

fn crashed(tool: &str, why: &str) -> CallError {
    tracing::error!(tool = %tool, "tool call panicked: {why}");
    CallError::Internal(format!("tool '{tool}' crashed inside ctx; the server log has the details"))
}

/// Cancels the script if the calling future is dropped before it finishes.
struct CancelOnDrop(Option<CancelHandle>);

impl CancelOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            cancel.cancel();
        }
    }
}
