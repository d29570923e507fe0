//! Tools: what agents call. One [`Registry`] is the catalog of the built-ins, every Lua tool,
//! upstream tool and agent; [`Registry::enter`] is the one door every call goes through (see
//! [`pipeline`]): admission, policy, observation and execution, for REST, MCP, the CLI, code
//! mode's inner calls, `context.call` and agent prompts alike.

mod admit;
pub mod agent;
pub mod bridge;
mod builtin;
mod execute;
pub mod in_script;
mod lua_tool;
mod observe;
pub mod pipeline;
pub mod policy;
pub mod rate;
mod registry;
pub mod state;
pub mod stuck;
mod task_run;
pub mod upstream_tool;

use std::sync::Arc;

use serde_json::Value as Json;

pub use admit::{Admitted, Resolved, Target, MAX_CHAIN, MAX_REENTRY};
pub use builtin::result_schema;
pub use execute::{Answer, Placement};
pub use observe::Observed;
pub use pipeline::{Ask, Call};
// The call's types live in the contract, the floor below every feature; re-exported here,
// where the call path that uses them is.
use crate::contract::error;
pub use crate::contract::error::{http_status, retry_secs, CallError};
pub use crate::contract::{params, principal};
pub use crate::contract::{Output, Params, Principal, ToolSpec, UpstreamOrigin, BUILTINS, MAX_NAME_BYTES};
pub use registry::{broken_problem, load_lua, CallOptions, Derive, Loaded, Registry, Tools};
pub use state::CallState;

use crate::kb::Kb;
use crate::lua::{CancelHandle, ProgressSink};

/// How long a call may run inline on an async worker ([`Tool::run_inline`]) before it moves to
/// the blocking pool: far below what would hold up the worker's other requests.
pub const INLINE_BUDGET: std::time::Duration = std::time::Duration::from_millis(1);

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
            in_task: false,
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
    /// The description `principal` (a scoped token) sees, when it differs from the spec's:
    /// code mode's `execute` and scripted tools list the tools a script may call, so a scoped
    /// token gets one rendered from its own tools.
    fn description_for(&self, _registry: &Registry, _principal: &Principal) -> Option<String> {
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
    /// `in_task`: the call runs as a ctx task, so the tool may run it as a task of its own.
    fn call(&self, params: Json, progress: Option<ProgressSink>, in_task: bool) -> CallFuture;
}

pub type ToolRef = Arc<dyn Tool>;
