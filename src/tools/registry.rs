//! The tool registry: an immutable snapshot of every tool and agent, the catalog that calls are
//! made against (the call itself is the pipeline's, see [`super::pipeline`]).
//!
//! [`Tools`] holds the current snapshot and swaps in a new one atomically (hot reload); a call
//! keeps the snapshot it started with until it finishes.

use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use super::agent::{AgentRef, AgentSpec};
use super::execute::Answer;
use super::lua_tool::LuaTool;
use super::pipeline::{self, Call};
use super::{builtin, CallEnv, CallError, Output, ToolRef, ToolSpec};
use crate::config::{BrokenSection, Config, ScriptSection};
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
    /// How to put a pending approval to a person while the call waits, when the caller can.
    pub ask: Option<Arc<dyn pipeline::Ask>>,
    /// The call runs as a task (see `task_run`): an upstream tool that may run as a task on its
    /// server (`taskSupport: optional`) runs as one there too.
    pub in_task: bool,
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
    /// Which calls wait for a person's approval.
    approvals: Arc<crate::approval::Policy>,
    /// What every call must pass before it runs, in order: approval, then the rate limits of
    /// this config (their buckets outlive the snapshot). A call that only asks for approval
    /// costs no rate.
    pub(super) policies: Vec<Arc<dyn super::policy::Policy>>,
    /// What makes the derived tools again when the others change (a relist).
    derive: Derive,
    /// What calls of this application share across snapshots (the call log, metrics, rate
    /// buckets, quarantine...).
    pub(super) state: Arc<super::CallState>,
}

/// Tools made from the others of a registry (code mode's `execute`, discovery and scripted
/// tools, whose catalogs describe them), with their load problems: rebuilt whenever the
/// others change. Given by whoever assembles the registry (`app`): those tools are built on a
/// floor above this one.
pub type Derive = fn(&Config, &[ToolRef]) -> (Vec<ToolRef>, Vec<LoadProblem>);

impl Registry {
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
        let (derived, derived_problems) = (self.derive)(self.kb.config(), &all);
        all.extend(derived);
        all_problems.extend(derived_problems);
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
            approvals: Arc::clone(&self.approvals),
            policies: self.policies.clone(),
            derive: self.derive,
            state: Arc::clone(&self.state),
        }
    }

    /// The registry of the built-ins, the Lua tools `loaded` ([`load_lua`]) and `agents`, with
    /// the tools `derive` makes from them, for the application whose calls share `state`. What
    /// `app` assembles from a config.
    pub fn new(
        kb: Kb,
        loaded: Loaded,
        agents: Vec<AgentRef>,
        derive: Derive,
        state: Arc<super::CallState>,
    ) -> Registry {
        let Loaded { tools: lua, mut problems, warnings } = loaded;
        let mut tools: Vec<ToolRef> = builtin::all().into_iter().chain(lua).collect();
        // Derived tools come last and are rebuilt with every relist: their catalogs describe
        // the tools before them.
        let own = (tools.len(), problems.len(), warnings.len());
        let config = kb.config();
        let (derived, derived_problems) = derive(config, &tools);
        tools.extend(derived);
        problems.extend(derived_problems);
        let index = tools.iter().enumerate().map(|(i, t)| (t.spec().name.clone(), i)).collect();
        let tool_of_section = |section: &str| {
            let tool = tools.iter().find(|t| t.spec().section.as_deref() == Some(section));
            tool.map(|t| t.spec().name.clone())
        };
        let rates = Arc::new(super::rate::Rules::from_config(config, &tool_of_section, &state.rates));
        let approvals =
            Arc::new(crate::approval::Policy::from_config(config, Arc::clone(&state.question_key), state.db.as_ref()));
        let policies: Vec<Arc<dyn super::policy::Policy>> = vec![approvals.clone(), rates];
        Registry {
            tools,
            index,
            agents,
            problems,
            warnings,
            own,
            kb,
            upstreams: None,
            approvals,
            policies,
            derive,
            state,
        }
    }

    /// The error for a call of `name` that is not registered: "failed to load" with the reason
    /// when a section of that name failed, else `None` (the name is unknown).
    pub(super) fn not_loaded(&self, kind: LoadProblemKind, name: &str) -> Option<CallError> {
        let problem = self.problems.iter().find(|p| p.kind == kind && p.name == name)?;
        let word = if kind == LoadProblemKind::Agent { "agent" } else { "tool" };
        Some(CallError::NotLoaded { subject: format!("{word} '{name}'"), reason: problem.message.clone() })
    }

    /// The agents, in listing order.
    pub fn agents(&self) -> impl Iterator<Item = &AgentSpec> {
        self.agents.iter().map(|a| a.spec())
    }

    /// The agents themselves: what a reload keeps of an agent whose script now fails.
    pub fn agent_refs(&self) -> &[AgentRef] {
        &self.agents
    }

    /// The tool of the `[tools.script.<section>]` section: what a reload keeps of a tool whose
    /// script now fails.
    pub fn by_section(&self, section: &str) -> Option<ToolRef> {
        self.tools.iter().find(|t| t.spec().section.as_deref() == Some(section)).cloned()
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

    /// The listed tools, in listing order: built-ins, Lua tools, then upstream tools (a server
    /// with `expose = "discover"` is left out, though its tools stay callable by name).
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.all_specs().filter(|s| !s.hidden)
    }

    /// Every tool, listed or not (`expose = "discover"` servers' tools included).
    /// Built-ins (code mode's among them) come first, then the rest in registry order.
    pub fn all_specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.all_tools().map(|t| t.spec())
    }

    /// Every tool in the order of [`Registry::all_specs`].
    fn all_tools(&self) -> impl Iterator<Item = &ToolRef> {
        let tools = || self.tools.iter();
        tools().filter(|t| t.spec().builtin).chain(tools().filter(|t| !t.spec().builtin))
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

    /// The specs `principal` may see, each with the description it sees when that differs
    /// (see [`Tool::description_for`](super::Tool::description_for)).
    pub fn specs_for<'a>(
        &'a self,
        principal: Option<&'a super::Principal>,
    ) -> impl Iterator<Item = (&'a ToolSpec, Option<String>)> + 'a {
        let listed = self.all_tools().filter(|t| !t.spec().hidden);
        listed.filter(move |t| super::principal::allows(principal, &t.spec().name)).map(move |t| {
            let description = principal.and_then(|p| t.description_for(self, p));
            (t.spec(), description)
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

    /// What calls of this application share across snapshots: its call log, metrics, rate
    /// buckets and quarantine.
    pub fn state(&self) -> &Arc<super::CallState> {
        &self.state
    }

    /// Which calls wait for approval, and the store of approvals.
    pub fn approvals(&self) -> &Arc<crate::approval::Policy> {
        &self.approvals
    }

    /// Calls a tool from a thread that may block (the CLI, a Lua tool's `context.call`): the
    /// pipeline's one door ([`Registry::enter`]), with the tool run on this thread.
    pub fn call(self: &Arc<Self>, name: &str, params: Json, options: &CallOptions) -> Result<Output, CallError> {
        let call = Call::tool(name.to_string(), params, options.clone()).here();
        pipeline::wait(Arc::clone(self).enter(call)).and_then(Answer::output)
    }

    /// Resolves an agent's prompt from a thread that may block (`ctx agent test`), through the
    /// same door.
    pub fn prompt(self: &Arc<Self>, name: &str, args: Json, options: &CallOptions) -> Result<AgentPrompt, CallError> {
        let call = Call::prompt(name.to_string(), args, options.clone()).here();
        pipeline::wait(Arc::clone(self).enter(call)).and_then(Answer::prompt)
    }

    /// The registered tool of `name`, whoever asks.
    pub(super) fn tool(&self, name: &str) -> Option<ToolRef> {
        self.index.get(name).map(|&i| Arc::clone(&self.tools[i]))
    }

    /// Whether `name` is a registered tool, whoever asks (only those become metrics labels).
    pub(super) fn is_registered(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The agent of `name`, whoever asks.
    pub(super) fn agent(&self, name: &str) -> Option<AgentRef> {
        self.agents.iter().find(|a| a.spec().name == name).cloned()
    }

    /// What the run of `name` (call `id`) may use: the calls it makes carry `name` on their
    /// chain and `id` as their parent.
    pub(super) fn env(self: &Arc<Self>, name: &str, options: &CallOptions, id: u64) -> CallEnv<'_> {
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
    pub(super) fn down_upstream(&self, name: &str) -> Option<CallError> {
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

    /// Whether `name` is a tool whose calls are futures (an upstream server's).
    pub fn is_async(&self, name: &str) -> bool {
        self.index.get(name).is_some_and(|&i| self.tools[i].as_async().is_some())
    }
}

/// What [`load_lua`] loaded (sorted by name), what failed, and what looks wrong.
pub struct Loaded {
    pub tools: Vec<ToolRef>,
    pub problems: Vec<LoadProblem>,
    pub warnings: Vec<LoadProblem>,
}

/// The load problem of a section an unset variable disables.
pub fn broken_problem(kind: LoadProblemKind, section: &BrokenSection) -> LoadProblem {
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
pub fn load_lua(sections: &[&ScriptSection], broken: &[&BrokenSection], previous: Option<&Registry>) -> Loaded {
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut lua: Vec<ToolRef> = Vec::new();
    let mut taken: HashMap<String, (String, String)> = HashMap::new();
    for section in broken {
        problems.push(broken_problem(LoadProblemKind::Tool, section));
        if let Some(old) = previous.filter(|_| !section.refused).and_then(|p| p.by_section(&section.name)) {
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
        let loaded =
            watchdog::bounded(&section.path, &section.display_path, section.timeout, move || LuaTool::load(&owned));
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

    /// A tool call through the pipeline's one door ([`Registry::enter`]) on the current
    /// snapshot: the call keeps the snapshot it started with until it finishes.
    pub async fn call(&self, name: String, params: Json, options: CallOptions) -> Result<Output, CallError> {
        self.current().enter(Call::tool(name, params, options)).await.and_then(Answer::output)
    }

    /// An agent's prompt through the same door: logged, counted and rate limited like a tool.
    pub async fn prompt(&self, name: String, args: Json, options: CallOptions) -> Result<AgentPrompt, CallError> {
        self.current().enter(Call::prompt(name, args, options)).await.and_then(Answer::prompt)
    }
}
