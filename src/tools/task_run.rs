//! A call run as a task: it enters the one door ([`Tools::call`]) on a task of its own, so
//! admission, approval, rates and the call log apply as to any call, while the caller already
//! holds the task's handle. Its progress reports and a wait for a person's approval show in
//! the task's status; a cancel stops the run (a Lua script at its next instruction, an upstream
//! call by dropping it); its end is rendered for every door and kept (see [`crate::tasks`]).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value as Json;

use super::pipeline::{Ask, AskFuture};
use super::{CallError, CallOptions, CallState, Tools};
use crate::approval::Pending;
use crate::contract::Progress;
use crate::tasks::Live;

/// How often a task waiting for approval looks at the approvals store.
const APPROVAL_POLL: Duration = Duration::from_millis(250);

impl Tools {
    /// Starts `name` with `args` as a task of `options.principal` and returns it at once. The
    /// caller's own progress sink, if any, still gets every report. A tool the caller may not
    /// call (unknown, or outside its scope) makes no task: that call is made as usual, so the
    /// pipeline refuses and logs it, and its error is the answer.
    pub async fn start_task(
        self: &Arc<Self>,
        name: String,
        args: Json,
        mut options: CallOptions,
    ) -> Result<Arc<Live>, CallError> {
        let registry = self.current();
        let callable = registry.spec(&name).is_some() && super::principal::allows(options.principal.as_deref(), &name);
        if !callable {
            return match self.call(name.clone(), args, options).await {
                Err(e) => Err(e),
                // Registered between the look and the call: it ran, and a task is no longer needed.
                Ok(_) => Err(CallError::Unavailable(format!(
                    "tool '{name}' was loaded while this task was being created; call it again"
                ))),
            };
        }
        let state = Arc::clone(registry.state());
        let owner = options.principal.as_ref().map(|p| p.name().to_string()).unwrap_or_default();
        // The store is one SQLite connection: off the async workers.
        let (creating, tool, via, cancel) = (Arc::clone(&state), name.clone(), options.caller, options.cancel.clone());
        let task = tokio::task::spawn_blocking(move || creating.tasks.create(&owner, &tool, via, cancel))
            .await
            .map_err(|e| CallError::Internal(format!("creating a task: {e}")))??;
        options.in_task = true;
        let outer = options.progress.take();
        let reporting = (Arc::clone(&state), Arc::clone(&task));
        options.progress = Some(Arc::new(move |p: Progress| {
            reporting.0.tasks.progress(&reporting.1, &p);
            if let Some(outer) = &outer {
                outer(p);
            }
        }));
        // A task waits for a person like a script configured to wait: the caller is not there
        // to be asked, and polling the task shows the approval it waits on.
        options.ask = Some(Arc::new(WaitForApproval {
            state: Arc::clone(&state),
            task: Arc::clone(&task),
            policy: Arc::clone(registry.approvals()),
        }));
        let tools = Arc::clone(self);
        let running = Arc::clone(&task);
        tokio::spawn(async move {
            let call = tools.call(name.clone(), args, options);
            // Dropping the call stops it (an upstream call, a wait for approval); a Lua run
            // also stops on the cancel handle itself.
            let result = tokio::select! {
                result = call => result,
                _ = running.cancel.cancelled() => Err(CallError::cancelled(&name)),
            };
            // Rendering and writing a result of up to [tasks] max_result_bytes: off the workers.
            let _ = tokio::task::spawn_blocking(move || state.tasks.finish(&running, result)).await;
        });
        Ok(task)
    }
}

/// A task's call that needs approval waits for a person's decision, with the task in
/// `input_required` meanwhile, until the approval's expiry or a cancel.
struct WaitForApproval {
    state: Arc<CallState>,
    task: Arc<Live>,
    /// The approvals of the snapshot the call started on.
    policy: Arc<crate::approval::Policy>,
}

impl Ask for WaitForApproval {
    fn ask<'a>(&'a self, pending: &'a Pending) -> AskFuture<'a> {
        Box::pin(async move {
            let id = pending.approval.id.clone();
            let message = format!(
                "waiting for a person to approve this call: ctx approvals approve {id} (or POST /approvals/{id}/approve); it runs once approved"
            );
            self.state.tasks.waiting(&self.task, Some(pending), message);
            let decided = loop {
                tokio::select! {
                    _ = tokio::time::sleep(APPROVAL_POLL) => {}
                    _ = self.task.cancel.cancelled() => break Err(CallError::cancelled(&pending.approval.tool)),
                }
                let (policy, look) = (Arc::clone(&self.policy), id.clone());
                let row = tokio::task::spawn_blocking(move || policy.store.by_id(&look)).await;
                match row {
                    Ok(Ok(Some(row)))
                        if row.state == "pending" && row.expires_ms > crate::approval::store::now_ms() => {}
                    // Decided, or expired: the token check in the pipeline says which.
                    Ok(Ok(Some(_))) => break Ok(pending.token.clone()),
                    _ => break Err(CallError::ApprovalRequired(Box::new(pending.clone()))),
                }
            };
            if decided.is_ok() {
                self.state.tasks.waiting(&self.task, None, String::new());
            }
            decided
        })
    }
}
