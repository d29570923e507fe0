//! Execution: the last stage of a call, where an admitted call runs by its tool's own strategy.
//! A tool that waits on another process runs as a future; any other first gets a short inline
//! run on the calling thread ([`Tool::run_inline`]), and what cannot finish there without
//! blocking runs on the blocking pool, watched against its deadline (see [`stuck`]). A caller
//! that is itself a blocking thread (the CLI, `context.call`) runs the tool right where it is.

use std::sync::Arc;

use serde_json::Value as Json;

use super::admit::{Admitted, Resolved};
use super::{stuck, CallEnv, CallError, CallOptions, Output, Registry, Tool};
use crate::lua::CancelHandle;
use crate::types::AgentPrompt;

/// Where a call may run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Placement {
    /// The caller is an async task: nothing may block it, so a tool that cannot finish at once
    /// runs on the blocking pool or as a future.
    Async,
    /// The caller is a thread that may block (the CLI, a Lua tool's `context.call`): the tool
    /// runs on it.
    Here,
}

/// What a call returns: a tool's output or an agent's prompt.
pub enum Answer {
    Output(Output),
    Prompt(AgentPrompt),
}

impl Answer {
    /// A tool call's output.
    pub fn output(self) -> Result<Output, CallError> {
        match self {
            Answer::Output(output) => Ok(output),
            Answer::Prompt(p) => Err(CallError::Internal(format!("agent '{}' answered a tool call", p.agent))),
        }
    }

    /// An agent's prompt.
    pub fn prompt(self) -> Result<AgentPrompt, CallError> {
        match self {
            Answer::Prompt(prompt) => Ok(prompt),
            Answer::Output(_) => Err(CallError::Internal("a tool answered an agent's prompt".into())),
        }
    }
}

/// Runs `call` (call `id`), placed by `placement`.
pub(super) async fn run(
    registry: &Arc<Registry>,
    call: Admitted,
    options: &CallOptions,
    id: u64,
    placement: Placement,
) -> Result<Answer, CallError> {
    let Admitted { name, what, params, .. } = call;
    let identity = what.identity();
    match what {
        Resolved::Tool(tool) => {
            run_tool(registry, tool, name, params, options, id, placement).await.map(Answer::Output)
        }
        Resolved::Agent(agent) => {
            let args = match params {
                Json::Object(args) => args,
                _ => serde_json::Map::new(),
            };
            let deadline = agent.deadline();
            let resolve = {
                let (registry, options, name) = (Arc::clone(registry), options.clone(), name.clone());
                move || {
                    let env = registry.env(&name, &options, id);
                    let spec = agent.spec();
                    let resolved = agent.resolve(&args, &env)?;
                    Ok(AgentPrompt {
                        agent: spec.name.clone(),
                        description: Some(spec.description.clone()),
                        system: resolved.system,
                        messages: resolved.messages,
                        tools: if resolved.tools.is_empty() { spec.tools.clone() } else { resolved.tools },
                    })
                }
            };
            let prompt = match placement {
                Placement::Here => resolve(),
                // A Lua agent is watched like a tool call: past its deadline plus grace the
                // caller gets a timeout, and the agent is quarantined while its run goes on.
                Placement::Async => {
                    let subject = format!("agent '{name}'");
                    watched((&registry.state.quarantine, identity), deadline, subject, &options.cancel, resolve)
                        .await
                        .unwrap_or_else(|e| {
                            tracing::error!(agent = %name, "agent panicked: {e}");
                            Err(CallError::Internal(format!(
                                "agent '{name}' crashed inside ctx; the server log has the details"
                            )))
                        })
                }
            };
            prompt.map(Answer::Prompt)
        }
    }
}

async fn run_tool(
    registry: &Arc<Registry>,
    tool: super::ToolRef,
    name: String,
    params: Json,
    options: &CallOptions,
    id: u64,
    placement: Placement,
) -> Result<Output, CallError> {
    if placement == Placement::Here {
        return tool.run(params, &registry.env(&name, options, id));
    }
    // A tool that waits on another process runs as a future right here: no thread, and
    // dropping this future (the client went away or cancelled) cancels it upstream too.
    if let Some(async_tool) = tool.as_async() {
        return async_tool.call(params, options.progress.clone(), options.in_task).await;
    }
    if let Some(result) = inline(registry, &*tool, &name, &params, options, id) {
        return result;
    }
    let (identity, deadline) = (stuck::identity(&tool), tool.deadline());
    let (on_pool, opts, tool_name) = (Arc::clone(registry), options.clone(), name.clone());
    let run = move || tool.run(params, &on_pool.env(&tool_name, &opts, id));
    let subject = format!("tool '{name}'");
    watched((&registry.state.quarantine, identity), deadline, subject, &options.cancel, run).await.unwrap_or_else(|e| {
        // A run cancelled with its runtime (shutdown) did not crash.
        if e.is_cancelled() {
            return Err(CallError::cancelled(&name));
        }
        Err(crashed(&name, &e.to_string()))
    })
}

/// The tool's inline attempt ([`Tool::run_inline`]); a panic in it is an `internal` error.
fn inline(
    registry: &Arc<Registry>,
    tool: &dyn Tool,
    name: &str,
    params: &Json,
    options: &CallOptions,
    id: u64,
) -> Option<Result<Output, CallError>> {
    let env: CallEnv<'_> = registry.env(name, options, id);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tool.run_inline(params, &env)))
        .unwrap_or_else(|_| Some(Err(crashed(name, "panic in an inline run"))))
}

/// Runs `work` on the blocking pool and awaits it, for at most `deadline` plus
/// [`stuck::GRACE`]. Past that, the run is abandoned (see [`stuck`]): the caller gets a timeout
/// for `subject`, the run's cancel flag is set (it stops at its next check, if it ever gets
/// there), and the tool or agent of `identity` is quarantined until the run ends. Dropping the
/// future (the client went away) cancels the run too. `Err` when the run panicked.
async fn watched<T: Send + 'static>(
    (quarantine, identity): (&Arc<stuck::Quarantine>, usize),
    deadline: Option<std::time::Duration>,
    subject: String,
    cancel: &CancelHandle,
    work: impl FnOnce() -> Result<T, CallError> + Send + 'static,
) -> Result<Result<T, CallError>, tokio::task::JoinError> {
    let on_drop = CancelOnDrop(Some(cancel.clone()));
    let watch = stuck::Watch::new(quarantine, identity);
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

pub(super) fn crashed(tool: &str, why: &str) -> CallError {
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
