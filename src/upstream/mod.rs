//! The gateway: one shared, supervised MCP client connection per upstream server.
//!
//! The public API below is the contract between the upstream runtime and the registry, MCP,
//! REST, `/health` and the CLI.
//!
//! Nothing here knows the registry: it keeps each server's current lists (JSON as the
//! upstream sent them, through rmcp's types) and reports changes through [`Event`]s; the
//! registry builds its tools from [`Upstreams::catalog`].
//!
//! - [`supervisor`]: one task per server: connect, list, serve, restart with backoff.
//! - [`client`]: the MCP client side of a connection, and one request with deadline,
//!   progress and cancellation.
//! - [`catalog`]: paginated listing and tool filtering.
//! - [`http`]: the HTTP client, and the watch that notices a lost session or server.
//! - [`process`]: a stdio child in its own process group; stop = close, TERM, KILL, reap.
//! - [`guard`]: the re-executed ctx that keeps a child's whole group from outliving ctx.
//! - [`sniff`]: what rmcp's types drop from a tool list (`execution`), read from the raw answers.
//! - [`stderr`]: a child's stderr into ctx's log, bounded.
//! - [`frame`]: a child's stdout, bounded per message.
//! - [`flood`]: rates of what a server sends unasked; a server that floods is cut off.
//! - [`task`]: a tool called as an MCP task on its server, polled to its end, cancelled when
//!   abandoned; its id shown namespaced (`<server>:<task id>`).

pub mod catalog;
pub mod client;
pub mod flood;
pub mod frame;
pub mod guard;
pub mod http;
pub mod process;
pub mod sniff;
pub mod stderr;
pub mod supervisor;
pub mod task;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, ClientRequest, GetPromptRequestParams, ReadResourceRequestParams, Request};
use rmcp::service::{Peer, RoleClient};
use serde_json::{Map, Value as Json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use client::Failure;
use supervisor::Shared;

use crate::config::upstream::{Expose, UpstreamSection, UpstreamTransport};
use crate::contract::ProgressSink;

/// A server's lifecycle state, as `/health` and `ctx mcp list` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Connecting,
    Ready,
    Restarting,
    CrashLooping,
    Disabled,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Connecting => "connecting",
            State::Ready => "ready",
            State::Restarting => "restarting",
            State::CrashLooping => "crash-looping",
            State::Disabled => "disabled",
        }
    }

    /// The state with its `attempt` count (connection attempts since the server was last
    /// ready), as a message says it: `connecting, attempt 2`, `restarting after 1 failed
    /// attempt`, or `restarting after a lost connection` when it had been ready (a count of 0).
    pub fn with_attempts(self, attempt: u32) -> String {
        let failed = |n: u32| format!("{n} failed attempt{}", if n == 1 { "" } else { "s" });
        match (self, attempt) {
            (State::Connecting, 0) | (State::Ready | State::Disabled, _) => self.as_str().to_string(),
            (State::Connecting, n) => format!("connecting, attempt {n}"),
            (State::Restarting, 0) => "restarting after a lost connection".to_string(),
            (State::Restarting, n) => format!("restarting after {}", failed(n)),
            (State::CrashLooping, 0) => "crash-looping: it keeps losing its connection".to_string(),
            (State::CrashLooping, n) => format!("crash-looping after {}", failed(n)),
        }
    }
}

/// What changed on one server after a (re)connect or a `list_changed`: its lists were relisted
/// and [`Upstreams::catalog`] already returns the new ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub server: String,
    pub tools: bool,
    pub resources: bool,
    pub prompts: bool,
}

/// Receives [`Event`]s (the registry swap and ctx's own `list_changed` hang off it).
pub type EventSink = Arc<dyn Fn(Event) + Send + Sync>;

/// One server's current lists, raw as the upstream sent them (tools filtered by the
/// section's `tools`/`exclude`). Empty lists while the server is not ready.
#[derive(Clone, Debug, Default)]
pub struct ServerCatalog {
    pub name: String,
    pub expose: Expose,
    pub timeout: Duration,
    /// `tools/list` entries: `name`, `title`, `description`, `inputSchema`, `outputSchema`,
    /// `annotations`, ... unchanged.
    pub tools: Vec<Map<String, Json>>,
    pub resources: Vec<Map<String, Json>>,
    pub resource_templates: Vec<Map<String, Json>>,
    pub prompts: Vec<Map<String, Json>>,
    /// The upstream declared the resources capability.
    pub has_resources: bool,
}

/// One server's health, for `/health` and `ctx mcp list`.
#[derive(Clone, Debug)]
pub struct Status {
    pub name: String,
    pub transport: &'static str,
    pub state: State,
    pub tools: usize,
    pub restarts: u64,
    /// Connection attempts since the last time it was ready.
    pub attempt: u32,
    pub last_error: Option<String>,
    /// Median latency of recent calls, in milliseconds.
    pub latency_p50_ms: Option<f64>,
    pub calls: u64,
    /// The child's process id, for stdio servers that are running.
    pub pid: Option<u32>,
}

/// Why an upstream request failed. A tool call maps it to `CallError` (`tools::error`); a
/// resource read or a prompt, which have no tool result, to a JSON-RPC error (`mcp::upstream`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// No server by that name is configured.
    #[error("no upstream MCP server named '{0}' is configured")]
    UnknownServer(String),
    /// The server is not ready: fails at once, never waits for the timeout.
    #[error("upstream MCP server '{server}' is {}{}", state.with_attempts(*attempt), last_error.as_deref().map(|e| format!("; last error: {e}")).unwrap_or_default())]
    Down { server: String, state: State, attempt: u32, last_error: Option<String> },
    #[error("upstream MCP server '{server}' did not answer within {} s (raise `timeout` in [mcp.servers.{server}]; an imported server can be defined in ctx.toml to set one)", limit.as_secs_f64())]
    Timeout { server: String, limit: Duration },
    /// The upstream answered with a JSON-RPC error.
    #[error("upstream MCP server '{server}' refused the request ({code}): {message}")]
    Rpc { server: String, code: i32, message: String, data: Option<Json> },
    /// The connection broke during the request.
    #[error("upstream MCP server '{server}' disconnected during the request: {message}")]
    Disconnected { server: String, message: String },
    /// The upstream's task for a call ended without a result, or waits for what ctx cannot
    /// give (see [`task`]). `task` is namespaced: `<server>:<upstream task id>`.
    #[error("upstream MCP server '{server}': its task {task} {message}")]
    Task { server: String, task: String, message: String },
    /// The answer was over what ctx reads from an upstream ([`frame::MAX_MESSAGE`]); dropped.
    #[error("upstream MCP server '{server}' answered with more than {} MiB, the most ctx reads from an upstream; the answer was dropped. Ask for less (a narrower query, a page)", limit >> 20)]
    TooLarge { server: String, limit: usize },
}

/// Timings of supervision; the defaults are for production, tests shorten them.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// Deadline of the initialize handshake (and of each listing page): a server that hangs
    /// there is a failed attempt.
    pub connect_timeout: Duration,
    /// First restart delay; it doubles per recent failure up to `backoff_max` (±20 % jitter).
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// This many failures within `crash_loop_window` mark the server crash-looping; it is then
    /// retried every `crash_loop_retry`.
    pub crash_loop_failures: u32,
    pub crash_loop_window: Duration,
    pub crash_loop_retry: Duration,
    /// Each step of a stop: after closing stdin, then after SIGTERM.
    pub stop_grace: Duration,
    /// Quiet time after a `list_changed` before relisting (a burst becomes one relist).
    pub list_debounce: Duration,
    /// How often a ready Streamable HTTP server is pinged, to notice one that went away while
    /// nobody called (its deadline is `connect_timeout`).
    pub ping_interval: Duration,
    /// The ctx binary that guards stdio children (see [`guard`]); `None` starts them
    /// directly, in their own group with a parent-death signal (grandchildren are then not
    /// covered when ctx is SIGKILLed).
    pub guard: Option<PathBuf>,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            connect_timeout: Duration::from_secs(30),
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            crash_loop_failures: 5,
            crash_loop_window: Duration::from_secs(60),
            crash_loop_retry: Duration::from_secs(60),
            stop_grace: Duration::from_secs(2),
            list_debounce: Duration::from_millis(150),
            ping_interval: Duration::from_secs(15),
            guard: process::default_guard(),
        }
    }
}

/// Every configured upstream, each with its supervisor task.
pub struct Upstreams {
    servers: Mutex<BTreeMap<String, Server>>,
    /// Supervisors of removed or replaced servers that are still stopping theirs.
    retiring: Mutex<Vec<JoinHandle<()>>>,
    events: EventSink,
    tuning: Arc<Tuning>,
    runtime: tokio::runtime::Handle,
}

struct Server {
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Upstreams {
    /// Starts a supervisor for every enabled section and returns at once (call inside a tokio
    /// runtime). Connections happen in the background.
    pub fn start(sections: &[UpstreamSection], events: EventSink) -> Arc<Upstreams> {
        Upstreams::start_with(sections, events, Tuning::default())
    }

    /// [`Upstreams::start`] with explicit timings.
    pub fn start_with(sections: &[UpstreamSection], events: EventSink, tuning: Tuning) -> Arc<Upstreams> {
        let upstreams = Upstreams {
            servers: Mutex::new(BTreeMap::new()),
            retiring: Mutex::new(Vec::new()),
            events,
            tuning: Arc::new(tuning),
            runtime: tokio::runtime::Handle::current(),
        };
        {
            let mut servers = lock(&upstreams.servers);
            for section in sections {
                servers.insert(section.name.clone(), upstreams.launch(section.clone()));
            }
        }
        Arc::new(upstreams)
    }

    fn launch(&self, section: UpstreamSection) -> Server {
        let shared = Shared::new(section);
        let stop = CancellationToken::new();
        let task = shared.section.enabled.then(|| {
            self.runtime.spawn(supervisor::run(shared.clone(), self.events.clone(), self.tuning.clone(), stop.clone()))
        });
        Server { shared, stop, task }
    }

    /// Waits until every enabled server is ready or has failed once, up to `within`; the names
    /// of those that were neither by then.
    pub async fn settled(&self, within: Duration) -> Vec<String> {
        let servers: Vec<Arc<Shared>> =
            lock(&self.servers).values().filter(|s| s.shared.section.enabled).map(|s| s.shared.clone()).collect();
        let deadline = tokio::time::Instant::now() + within;
        let mut late = Vec::new();
        for shared in servers {
            if !settle(&shared, deadline).await {
                late.push(shared.section.name.clone());
            }
        }
        late
    }

    /// Waits until every `required` server is ready. `Err` names each one that failed its first
    /// attempt (or did not get ready within `within`) with its last error.
    pub async fn required_ready(&self, within: Duration) -> Result<(), String> {
        let required: Vec<Arc<Shared>> = lock(&self.servers)
            .values()
            .filter(|s| s.shared.section.required && s.shared.section.enabled)
            .map(|s| s.shared.clone())
            .collect();
        let deadline = tokio::time::Instant::now() + within;
        let mut problems = Vec::new();
        for shared in required {
            settle(&shared, deadline).await;
            let (state, last_error) = {
                let s = shared.lock();
                (s.state, s.last_error.clone())
            };
            if state != State::Ready {
                let why = last_error.unwrap_or_else(|| format!("not ready within {} s", within.as_secs_f64()));
                problems.push(format!(
                    "required upstream MCP server '{}' ({}) could not start: {why}",
                    shared.section.name, shared.section.origin
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }

    /// Hot reload: starts, stops or restarts only the servers whose section changed.
    pub fn apply(&self, sections: &[UpstreamSection]) {
        // Events go out once the lock is released: whoever receives one reads the catalog.
        let retired = self.apply_locked(sections);
        for name in retired {
            (self.events)(Event { server: name, tools: true, resources: true, prompts: true });
        }
    }

    /// [`Upstreams::apply`] under the lock; returns the servers it stopped.
    fn apply_locked(&self, sections: &[UpstreamSection]) -> Vec<String> {
        let mut retired = Vec::new();
        let mut servers = lock(&self.servers);
        let wanted: BTreeMap<&str, &UpstreamSection> = sections.iter().map(|s| (s.name.as_str(), s)).collect();
        let gone: Vec<String> = servers
            .iter()
            .filter(|(name, server)| wanted.get(name.as_str()).is_none_or(|s| **s != server.shared.section))
            .map(|(name, _)| name.clone())
            .collect();
        for name in gone {
            if let Some(server) = servers.remove(&name) {
                tracing::info!(server = %name, "upstream MCP server section removed or changed: stopping it");
                self.retire(server);
                retired.push(name);
            }
        }
        for (name, section) in wanted {
            if !servers.contains_key(name) {
                tracing::info!(server = %name, "starting upstream MCP server");
                servers.insert(name.to_string(), self.launch(section.clone()));
            }
        }
        retired
    }

    fn retire(&self, server: Server) {
        server.stop.cancel();
        let mut retiring = lock(&self.retiring);
        retiring.retain(|t| !t.is_finished());
        retiring.extend(server.task);
    }

    /// Every configured server's current lists, by name.
    pub fn catalog(&self) -> Vec<ServerCatalog> {
        self.lists(client::TOOLS | client::RESOURCES | client::PROMPTS)
    }

    /// [`Upstreams::catalog`] with only the lists in `which` (bits of [`client::TOOLS`],
    /// [`client::RESOURCES`], [`client::PROMPTS`]); the others are empty. `prompts/list` and
    /// `resources/list` need not copy every server's tools.
    pub fn lists(&self, which: u8) -> Vec<ServerCatalog> {
        let copy = |bit: u8, list: &Vec<Map<String, Json>>| if which & bit != 0 { list.clone() } else { Vec::new() };
        lock(&self.servers)
            .values()
            .map(|server| {
                let s = server.shared.lock();
                let section = &server.shared.section;
                ServerCatalog {
                    name: section.name.clone(),
                    expose: section.expose,
                    timeout: section.timeout,
                    tools: copy(client::TOOLS, &s.lists.tools),
                    resources: copy(client::RESOURCES, &s.lists.resources),
                    resource_templates: copy(client::RESOURCES, &s.lists.resource_templates),
                    prompts: copy(client::PROMPTS, &s.lists.prompts),
                    has_resources: s.lists.has_resources,
                }
            })
            .collect()
    }

    /// Whether any server offers resources, or may (enabled and not ready yet: its capabilities
    /// are unknown), so ctx declares the capability; copies nothing.
    pub fn has_resources(&self) -> bool {
        lock(&self.servers).values().any(|server| {
            let s = server.shared.lock();
            let unknown = server.shared.section.enabled && s.state != State::Ready;
            s.lists.has_resources || unknown
        })
    }

    /// Every configured server's health, by name.
    pub fn status(&self) -> Vec<Status> {
        self.status_where(|_| true)
    }

    /// The health of the servers that are neither ready nor disabled (starting, restarting,
    /// crash-looping). Cheap when all are ready: a script run asks at its start.
    pub fn not_ready(&self) -> Vec<Status> {
        self.status_where(|state| !matches!(state, State::Ready | State::Disabled))
    }

    fn status_where(&self, keep: impl Fn(State) -> bool) -> Vec<Status> {
        lock(&self.servers)
            .values()
            .filter_map(|server| {
                let s = server.shared.lock();
                if !keep(s.state) {
                    return None;
                }
                let section = &server.shared.section;
                Some(Status {
                    name: section.name.clone(),
                    transport: match section.transport {
                        UpstreamTransport::Stdio { .. } => "stdio",
                        UpstreamTransport::Http { .. } => "http",
                    },
                    state: s.state,
                    tools: s.lists.tools.len(),
                    restarts: s.restarts,
                    attempt: s.attempt,
                    last_error: s.last_error.clone(),
                    latency_p50_ms: s.latency_p50_ms(),
                    calls: s.calls,
                    pid: s.pid,
                })
            })
            .collect()
    }

    /// The server's shared state and its peer when ready; `Down` at once otherwise.
    fn ready_peer(&self, server: &str) -> Result<Ready, UpstreamError> {
        let shared = lock(&self.servers)
            .get(server)
            .map(|s| s.shared.clone())
            .ok_or_else(|| UpstreamError::UnknownServer(server.to_string()))?;
        let (peer, cut) = {
            let s = shared.lock();
            match (&s.peer, s.state) {
                (Some(peer), State::Ready) => (peer.clone(), s.cut.clone()),
                _ => {
                    return Err(UpstreamError::Down {
                        server: server.to_string(),
                        state: s.state,
                        attempt: s.attempt,
                        last_error: s.last_error.clone(),
                    })
                }
            }
        };
        Ok((shared, peer, cut))
    }

    /// One request over the shared connection, timed for `/health`.
    async fn send(
        &self,
        server: &str,
        request: ClientRequest,
        progress: Option<ProgressSink>,
    ) -> Result<Map<String, Json>, UpstreamError> {
        let (shared, peer, cut) = self.ready_peer(server)?;
        let limit = shared.section.timeout;
        let started = Instant::now();
        let result = client::request(&peer, request, limit, progress.map(|sink| (&shared.progress, sink))).await;
        shared.record_call(started.elapsed());
        result.map_err(|failure| upstream_error(server, limit, &shared, cut.as_ref(), failure))
    }

    /// `tools/call` on `server`'s tool `tool` (its upstream name) over the shared connection.
    /// Progress notifications from the upstream go to `progress`; dropping the future sends
    /// `notifications/cancelled`. The result is the upstream's `CallToolResult` JSON, unchanged.
    pub async fn call_tool(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Json>,
        progress: Option<ProgressSink>,
    ) -> Result<Map<String, Json>, UpstreamError> {
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        self.send(server, ClientRequest::CallToolRequest(Request::new(params)), progress).await
    }

    /// `tools/call` of `server`'s tool `tool` as an MCP task on the server (for tools whose
    /// listing says `execution.taskSupport = "required"`): created, polled and its result
    /// fetched over the shared connection, all within the section's timeout (see [`task`]). The
    /// task's status changes reach `progress` as `upstream task <server>:<id> <status>: ...`;
    /// dropping the future sends `tasks/cancel`.
    pub async fn call_tool_as_task(
        &self,
        server: &str,
        tool: &str,
        arguments: Map<String, Json>,
        progress: Option<ProgressSink>,
    ) -> Result<Map<String, Json>, UpstreamError> {
        let (shared, peer, cut) = self.ready_peer(server)?;
        let conn = task::Conn { server: server.to_string(), shared, peer, cut };
        task::call(conn, tool, arguments, progress).await
    }

    /// `resources/read` of `uri` (the upstream's own URI) on `server`: the `ReadResourceResult` JSON.
    pub async fn read_resource(&self, server: &str, uri: &str) -> Result<Map<String, Json>, UpstreamError> {
        let params = ReadResourceRequestParams::new(uri);
        self.send(server, ClientRequest::ReadResourceRequest(Request::new(params)), None).await
    }

    /// `prompts/get` of `name` (the upstream's own name) on `server`: the `GetPromptResult` JSON.
    pub async fn get_prompt(
        &self,
        server: &str,
        name: &str,
        arguments: Map<String, Json>,
    ) -> Result<Map<String, Json>, UpstreamError> {
        let params = GetPromptRequestParams::new(name).with_arguments(arguments);
        self.send(server, ClientRequest::GetPromptRequest(Request::new(params)), None).await
    }

    /// Stops every server: close, then SIGTERM to its process group, then SIGKILL, and reaps it.
    /// Concurrently, and bounded: it returns within about three grace periods.
    pub async fn shutdown(&self) {
        let mut tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.retiring));
        for server in lock(&self.servers).values_mut() {
            server.stop.cancel();
            tasks.extend(server.task.take());
        }
        let bound = self.tuning.stop_grace * 3 + Duration::from_secs(2);
        let all = async {
            for task in tasks {
                let _ = task.await;
            }
        };
        if tokio::time::timeout(bound, all).await.is_err() {
            tracing::warn!("upstream MCP servers did not all stop within {} s", bound.as_secs());
        }
    }
}

impl Drop for Upstreams {
    fn drop(&mut self) {
        // Without `shutdown`, the supervisors still stop their servers (while the runtime runs).
        for server in lock(&self.servers).values() {
            server.stop.cancel();
        }
    }
}

/// What a failed request to `server` means, said without any secret of its section; `limit`
/// is the deadline it had.
fn upstream_error(
    server: &str,
    limit: Duration,
    shared: &Shared,
    cut: Option<&client::Cut>,
    failure: Failure,
) -> UpstreamError {
    match failure {
        Failure::Timeout => UpstreamError::Timeout { server: server.to_string(), limit },
        Failure::Rpc { data: Some(data), .. } if data["reason"] == frame::TOO_LARGE_MARK => {
            UpstreamError::TooLarge { server: server.to_string(), limit: frame::MAX_MESSAGE }
        }
        // Messages reach every caller: no value of the section's env, headers or URL in them.
        Failure::Rpc { code, message, data } => {
            UpstreamError::Rpc { server: server.to_string(), code, message: shared.sanitise(&message), data }
        }
        Failure::Disconnected(message) => {
            // When ctx ended the connection under the call, its reason says more.
            let message = cut.and_then(|c| c.reason()).unwrap_or(message);
            UpstreamError::Disconnected { server: server.to_string(), message: shared.sanitise(&message) }
        }
    }
}

/// Waits until the server is ready or has failed an attempt, or `deadline`; whether it did.
async fn settle(shared: &Shared, deadline: tokio::time::Instant) -> bool {
    let mut changed = shared.changed.subscribe();
    loop {
        {
            let s = shared.lock();
            if s.state == State::Ready || s.failed_attempts > 0 {
                return true;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        let _ = tokio::time::timeout_at(deadline, changed.changed()).await;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A ready server's state, its connection's peer, and the connection's [`client::Cut`].
type Ready = (Arc<Shared>, Peer<RoleClient>, Option<client::Cut>);

/// What a failed upstream request means for a call: said here, since the contract's
/// [`CallError`](crate::contract::CallError) knows nothing of upstream servers.
impl crate::contract::CallError {
    /// What a failed upstream request means for the caller of the tool `tool`.
    pub fn from_upstream(tool: &str, limit: Duration, error: UpstreamError) -> Self {
        use UpstreamError as U;
        match error {
            U::Timeout { .. } => Self::Timeout { subject: format!("tool '{tool}'"), limit },
            // Invalid params from the upstream's own checks: the caller's mistake, as here.
            U::Rpc { code: -32602, message, .. } => {
                Self::BadRequest(format!("tool '{tool}': the upstream server refused the arguments: {message}"))
            }
            e @ U::TooLarge { .. } => Self::ResultTooLarge(format!("tool '{tool}': {e}")),
            e @ (U::UnknownServer(_) | U::Down { .. } | U::Disconnected { .. }) => {
                Self::Unavailable(format!("tool '{tool}': {e}"))
            }
            e @ (U::Rpc { .. } | U::Task { .. }) => {
                Self::ToolFailed { message: format!("tool '{tool}': {e}"), tool_code: None, data: None }
            }
        }
    }
}
