//! Tools: what agents call. One [`Registry`] is the catalog of the built-ins, every Lua tool,
//! upstream tool and agent; [`Registry::enter`] is the one door every call goes through (see
//! [`pipeline`]): admission, policy, observation and execution, for REST, MCP, the CLI, code
//! mode's inner calls, `context.call` and agent prompts alike.

mod admit;
pub mod bridge;
mod builtin;
mod error;
mod execute;
mod lua_tool;
mod observe;
mod output;
pub mod params;
pub mod pipeline;
pub mod policy;
pub mod principal;
pub mod rate;
mod registry;
pub mod reload;
pub mod state;
pub mod stuck;
pub mod upstream_tool;

use std::sync::Arc;

use serde_json::{Map, Value as Json};

pub use admit::{Admitted, Resolved, Target, MAX_CHAIN, MAX_NAME_BYTES, MAX_REENTRY};
pub use builtin::result_schema;
pub use error::{http_status, retry_secs, CallError};
pub use execute::{Answer, Placement};
pub use observe::Observed;
pub use output::Output;
pub use params::Params;
pub use pipeline::{Ask, Call};
pub use principal::Principal;
pub use registry::{check, CallOptions, Checked, Registry, Tools};
pub use state::CallState;

use crate::kb::Kb;
use crate::lua::{CancelHandle, ProgressSink};
use crate::types::{ToolAnnotations, ToolInfo};

/// How long a call may run inline on an async worker ([`Tool::run_inline`]) before it moves to
/// the blocking pool: far below what would hold up the worker's other requests.
pub const INLINE_BUDGET: std::time::Duration = std::time::Duration::from_millis(1);

/// Built-in tool names, in listing order. Lua tools may not take them.
pub const BUILTINS: [&str; 3] = ["search", "get", "sources"];

/// A tool as agents see it, with its compiled parameter validator.
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub version: Option<String>,
    pub builtin: bool,
    pub params: Params,
    pub annotations: Option<ToolAnnotations>,
    pub output_schema: Option<Map<String, Json>>,
    /// The script file as written in ctx.toml, for Lua tools.
    pub script: Option<String>,
    /// The `[tools.script.<section>]` key, for Lua tools.
    pub section: Option<String>,
    /// Left out of the flat listings (an upstream server with `expose = "discover"`): still
    /// callable by name.
    pub hidden: bool,
    /// Where an upstream tool comes from, with its `tools/list` entry as the server sent it.
    pub upstream: Option<UpstreamOrigin>,
    /// The tool's own script asks that every call wait for approval (`approve = true` in its
    /// `tool` table); its config section can ask too, and either is enough.
    pub approve: bool,
}

/// The server and original name of an upstream tool, and its listing entry unchanged.
pub struct UpstreamOrigin {
    pub server: String,
    pub tool: String,
    pub raw: Map<String, Json>,
}

impl ToolSpec {
    /// The listing entry (`GET /tools/list`). Config values are not part of a spec, so they can
    /// never appear here.
    pub fn info(&self) -> ToolInfo {
        ToolInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            builtin: self.builtin,
            version: self.version.clone(),
            parameters: self.params.schema().as_object().cloned().unwrap_or_default(),
            annotations: self.annotations.clone(),
            output_schema: self.output_schema.clone().unwrap_or_default(),
        }
    }
}

/// What one call may use besides its parameters.
pub struct CallEnv<'a> {
    pub kb: &'a Kb,
    pub cancel: CancelHandle,
    pub progress: Option<ProgressSink>,
    /// The snapshot the call runs on: the calls a tool makes (`context.call`, code mode) go
    /// through it.
    pub registry: Arc<Registry>,
    /// Who called, for the log lines of the calls this one makes.
    pub caller: &'static str,
    /// The tools on the way to this call, this one last: the chain of the calls it makes.
    pub chain: Vec<String>,
    /// Whom the call is made for; the calls it makes are made for them too.
    pub principal: Option<std::sync::Arc<Principal>>,
    /// This call's id (unique in the process): the parent of the calls it makes.
    pub call_id: u64,
}

impl CallEnv<'_> {
    /// The options of a call this run makes (`via` is `lua` for `context.call`, `code` for a
    /// script's inner call): its cancel handle, chain and principal, with this call as its
    /// parent.
    pub fn inner_options(&self, via: &'static str) -> CallOptions {
        CallOptions {
            cancel: self.cancel.clone(),
            progress: None,
            caller: via,
            chain: self.chain.clone(),
            principal: self.principal.clone(),
            parent: Some(self.call_id),
            approval: None,
            ask: None,
        }
    }
}

/// A callable tool. Implementations get parameters that already passed their schema, with
/// defaults filled in.
pub trait Tool: Send + Sync {
    fn spec(&self) -> &ToolSpec;
    fn run(&self, params: Json, env: &CallEnv<'_>) -> Result<Output, CallError>;
    /// Tries the call on the calling (async) thread, where nothing may block. `None` means it
    /// could not finish there without blocking and nothing visible happened: use [`Tool::run`].
    fn run_inline(&self, _params: &Json, _env: &CallEnv<'_>) -> Option<Result<Output, CallError>> {
        None
    }
    /// How long a call may run, when the tool enforces a limit: a call still running this long
    /// plus [`stuck::GRACE`] after it started is abandoned (see [`stuck`]).
    fn deadline(&self) -> Option<std::time::Duration> {
        None
    }
    /// Tools that wait on another process rather than compute (upstream MCP servers) run as a
    /// future on the caller's runtime instead of a blocking thread: `Some` for those.
    fn as_async(&self) -> Option<&dyn AsyncTool> {
        None
    }
}

/// A future a tool call returns.
pub type CallFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Output, CallError>> + Send>>;

/// A tool whose calls are futures (see [`Tool::as_async`]). Dropping the future cancels the
/// call. [`Tool::run`] of such a tool blocks on it.
pub trait AsyncTool: Send + Sync {
    fn call(&self, params: Json, progress: Option<ProgressSink>) -> CallFuture;
}

pub type ToolRef = Arc<dyn Tool>;
