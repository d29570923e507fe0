//! The gateway: one shared, supervised MCP client connection per upstream server.
//!
//! INTERFACE STUB (issue 17): the public API below is the contract between the upstream
//! runtime and the registry, MCP, REST, `/health` and the CLI. Bodies are placeholders.
//!
//! Nothing here knows the registry: it keeps each server's current lists (raw JSON as the
//! upstream sent them) and reports changes through [`Event`]s; the registry builds its tools
//! from [`Upstreams::catalog`].

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value as Json};

use crate::config::upstream::{Expose, UpstreamSection};
use crate::lua::ProgressSink;

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
    pub state: Option<State>,
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

/// Why an upstream request failed. Mapped to `CallError` in `tools::error`, the one place.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    /// No server by that name is configured.
    #[error("no upstream MCP server named '{0}' is configured")]
    UnknownServer(String),
    /// The server is not ready: fails at once, never waits for the timeout.
    #[error("upstream MCP server '{server}' is {} (attempt {attempt}){}", state.as_str(), last_error.as_deref().map(|e| format!("; last error: {e}")).unwrap_or_default())]
    Down { server: String, state: State, attempt: u32, last_error: Option<String> },
    #[error("upstream MCP server '{server}' did not answer within {} s", limit.as_secs_f64())]
    Timeout { server: String, limit: Duration },
    /// The upstream answered with a JSON-RPC error.
    #[error("upstream MCP server '{server}' refused the request ({code}): {message}")]
    Rpc { server: String, code: i32, message: String, data: Option<Json> },
    /// The connection broke during the request.
    #[error("upstream MCP server '{server}' disconnected during the request: {message}")]
    Disconnected { server: String, message: String },
}

/// Every configured upstream, each with its supervisor task.
pub struct Upstreams {}

impl Upstreams {
    /// Starts a supervisor for every enabled section and returns at once (call inside a tokio
    /// runtime). Connections happen in the background.
    pub fn start(_sections: &[UpstreamSection], _events: EventSink) -> Arc<Upstreams> {
        Arc::new(Upstreams {})
    }

    /// Waits until every `required` server is ready. `Err` names each one that failed its first
    /// attempt (or did not get ready within `within`) with its last error.
    pub async fn required_ready(&self, _within: Duration) -> Result<(), String> {
        Ok(())
    }

    /// Hot reload: starts, stops or restarts only the servers whose section changed.
    pub fn apply(&self, _sections: &[UpstreamSection]) {}

    /// Every configured server's current lists, by name.
    pub fn catalog(&self) -> Vec<ServerCatalog> {
        Vec::new()
    }

    /// Every configured server's health, by name.
    pub fn status(&self) -> Vec<Status> {
        Vec::new()
    }

    /// `tools/call` on `server`'s tool `tool` (its upstream name) over the shared connection.
    /// Progress notifications from the upstream go to `progress`; dropping the future sends
    /// `notifications/cancelled`. The result is the upstream's `CallToolResult` JSON, unchanged.
    pub async fn call_tool(
        &self,
        server: &str,
        _tool: &str,
        _arguments: Map<String, Json>,
        _progress: Option<ProgressSink>,
    ) -> Result<Map<String, Json>, UpstreamError> {
        Err(UpstreamError::UnknownServer(server.to_string()))
    }

    /// `resources/read` of `uri` (the upstream's own URI) on `server`: the `ReadResourceResult` JSON.
    pub async fn read_resource(&self, server: &str, _uri: &str) -> Result<Map<String, Json>, UpstreamError> {
        Err(UpstreamError::UnknownServer(server.to_string()))
    }

    /// `prompts/get` of `name` (the upstream's own name) on `server`: the `GetPromptResult` JSON.
    pub async fn get_prompt(
        &self,
        server: &str,
        _name: &str,
        _arguments: Map<String, Json>,
    ) -> Result<Map<String, Json>, UpstreamError> {
        Err(UpstreamError::UnknownServer(server.to_string()))
    }

    /// Stops every server: close, then SIGTERM to its process group, then SIGKILL, and reaps it.
    pub async fn shutdown(&self) {}
}
