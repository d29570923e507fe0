//! The call pipeline: the one door every call enters, from REST, MCP (both eras and stdio), the
//! CLI, code mode's inner calls, `context.call` and agent prompts alike. One guard of
//! observation ([`super::observe`]) wraps the whole call: it logs and counts the call exactly
//! once, also when it is refused, fails, or is dropped by its client. Inside it, in order:
//! 1. admission ([`super::admit`]): scope, name, parameters and defaults, call-chain rules,
//!    quarantine;
//! 2. the call's turn, when it shares a [`Gate`] (code mode's `max_concurrent`);
//! 3. for a call that may change something, its place in the audit log, or a refusal when the
//!    log cannot take it (see [`super::observe`]);
//! 4. policy ([`super::policy`]): approval, then rate limits, each a [`Policy`] of its own
//!    feature; a call that needs a person's approval may ask them through the caller's own
//!    channel ([`Ask`]) and goes on with their answer;
//! 5. execution ([`super::execute`]): the tool's own strategy.
//!
//! [`Policy`]: super::policy::Policy

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::admit::{self, Admitted, Target};
use super::execute::{self, Answer, Placement};
use super::observe::Observed;
use super::{policy, CallError, CallOptions, Registry};
use crate::approval::Pending;

/// A future an [`Ask`] returns.
pub type AskFuture<'a> = Pin<Box<dyn Future<Output = Result<String, CallError>> + Send + 'a>>;

/// A caller that can put a pending approval to a person while the call waits (an MCP client
/// that declared form elicitation; a code-mode script configured to wait). It returns the token
/// to check the call again with, or the error that ends the call (declined, not asked).
pub trait Ask: Send + Sync {
    fn ask<'a>(&'a self, pending: &'a Pending) -> AskFuture<'a>;
}

/// A call entering the pipeline.
pub struct Call {
    pub target: Target,
    pub name: String,
    pub args: Json,
    pub options: CallOptions,
    pub placement: Placement,
    /// Calls that share this gate run a few at a time (code mode's `max_concurrent`).
    pub gate: Option<Arc<Gate>>,
}

/// A call's share of a few permits: the call waits for a permit once it is admitted, before its
/// policies are asked (an approval or a rate is not spent on a call that then waits its turn
/// and may never run), and holds it until it has run. Its own timeout starts after the wait.
pub struct Gate {
    pub permits: Arc<tokio::sync::Semaphore>,
    /// When the call got its permit: its own time starts there, the wait for a turn left out.
    running: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Gate {
    pub fn new(permits: Arc<tokio::sync::Semaphore>) -> Arc<Gate> {
        Arc::new(Gate { permits, running: std::sync::Mutex::new(None) })
    }

    /// When the call got its turn, if it did.
    pub fn running_since(&self) -> Option<std::time::Instant> {
        *self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a permit (a closed gate never happens: nothing closes it, and it would let the
    /// call run).
    async fn turn(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let permit = Arc::clone(&self.permits).acquire_owned().await.ok();
        *self.running.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
        permit
    }
}

impl Call {
    /// A tool call from an async caller.
    pub fn tool(name: String, args: Json, options: CallOptions) -> Call {
        Call { target: Target::Tool, name, args, options, placement: Placement::Async, gate: None }
    }

    /// An agent's prompt, from an async caller.
    pub fn prompt(name: String, args: Json, options: CallOptions) -> Call {
        Call { target: Target::Prompt, name, args, options, placement: Placement::Async, gate: None }
    }

    /// The same call, run on the caller's own thread, which may block.
    pub fn here(mut self) -> Call {
        self.placement = Placement::Here;
        self
    }
}

/// The future of a call that entered the pipeline.
pub type Entered = Pin<Box<dyn Future<Output = Result<Answer, CallError>> + Send>>;

impl Registry {
    /// The one door: runs `call` through admission, policy, observation and execution.
    pub async fn enter(self: Arc<Self>, call: Call) -> Result<Answer, CallError> {
        let Call { target, name, args, options, placement, gate } = call;
        let mut observed = match target {
            Target::Tool => Observed::call(&self.state, &name, &args, &options),
            // Agents' prompts are logged under MCP's method, beside the upstream prompts.
            Target::Prompt => {
                let params = json!({ "name": name, "arguments": args.clone() });
                Observed::start(&self.state, "prompts/get", &params, &options)
            }
        };
        let result = self.stages(target, &name, args, &options, (placement, gate), &mut observed).await;
        match target {
            Target::Tool => {
                observed.known(self.is_registered(&name));
                let result = result.and_then(Answer::output);
                // No answer of a call that may change something leaves before its entry is in
                // the call log.
                if let Some(commit) = observed.end(&result) {
                    if !matches!(commit.await, Ok(true)) {
                        tracing::error!(
                            tool = %name,
                            "a call ran but its tool-call log entry could not be written; calls that change something are refused until the log writes again"
                        );
                    }
                }
                result.map(Answer::Output)
            }
            Target::Prompt => {
                let summary = match &result {
                    Ok(Answer::Prompt(p)) => Ok(json!({ "agent": p.agent, "messages": p.messages.len() })),
                    Ok(Answer::Output(_)) => Ok(Json::Null),
                    Err(e) => Err(e),
                };
                observed.finish(summary);
                result
            }
        }
    }

    /// [`Registry::enter`] as a boxed future, for a caller that polls it once before it decides
    /// where to await it (code mode runs what finishes at once on the script's own thread).
    pub fn entered(self: &Arc<Self>, call: Call) -> Entered {
        Box::pin(Arc::clone(self).enter(call))
    }

    async fn stages(
        self: &Arc<Self>,
        target: Target,
        name: &str,
        args: Json,
        options: &CallOptions,
        (placement, gate): (Placement, Option<Arc<Gate>>),
        observed: &mut Observed<'_>,
    ) -> Result<Answer, CallError> {
        let call = admit::admit(self, target, name, args, options)?;
        let _permit = match &gate {
            Some(gate) => gate.turn().await,
            None => None,
        };
        // Before the policies: a call the log cannot take spends no approval and no rate.
        if self.must_be_logged(&call) {
            observed.must_be_logged()?;
        }
        let call = self.police(call, options, placement, observed).await?;
        execute::run(self, call, options, observed.id(), placement).await
    }

    /// Whether a call must be in the call log before it answers: any tool call that may change
    /// something (a tool not annotated read-only: every Lua tool without `read_only`, every
    /// upstream tool without `readOnlyHint`, code mode's `execute` and scripted tools) and every
    /// call that needs approval. An agent's prompt changes nothing.
    fn must_be_logged(&self, call: &Admitted) -> bool {
        let admit::Resolved::Tool(tool) = &call.what else { return false };
        let spec = tool.spec();
        let read_only = spec.annotations.as_ref().and_then(|a| a.read_only).unwrap_or(false);
        !read_only || self.approvals().needs(spec)
    }

    /// The policy stage: every policy in order, off the async workers when one of them reads a
    /// file; a pending approval is put to the caller's [`Ask`] once, then checked again.
    async fn police(
        self: &Arc<Self>,
        mut call: Admitted,
        options: &CallOptions,
        placement: Placement,
        observed: &mut Observed<'_>,
    ) -> Result<Admitted, CallError> {
        let mut asked = false;
        loop {
            let passed;
            (call, passed) = match placement == Placement::Async && policy::blocks(&self.policies, &call) {
                true => self.police_off_thread(call, options).await?,
                false => {
                    let passed = policy::pass(&self.policies, &call, options, None);
                    (call, passed)
                }
            };
            match (passed, &options.ask) {
                (Ok(()), _) => return Ok(call),
                (Err(CallError::ApprovalRequired(pending)), Some(ask)) if !asked && placement == Placement::Async => {
                    asked = true;
                    call.token = Some(ask.ask(&pending).await?);
                    // A person's time to decide is not the call's: its duration starts again.
                    observed.restart();
                }
                (Err(e), _) => return Err(e),
            }
        }
    }

    /// The policies on the blocking pool. Dropping this future (the client went away, a
    /// cancellation) marks the call gone, so an approval is not used up for a call that will not
    /// run.
    async fn police_off_thread(
        self: &Arc<Self>,
        call: Admitted,
        options: &CallOptions,
    ) -> Result<(Admitted, Result<(), CallError>), CallError> {
        struct Gone(Option<Arc<AtomicBool>>);
        impl Drop for Gone {
            fn drop(&mut self) {
                if let Some(flag) = &self.0 {
                    flag.store(true, Ordering::Release);
                }
            }
        }
        let flag = Arc::new(AtomicBool::new(false));
        let mut gone = Gone(Some(Arc::clone(&flag)));
        let (registry, opts, name) = (Arc::clone(self), options.clone(), call.name.clone());
        let joined = tokio::task::spawn_blocking(move || {
            let passed = policy::pass(&registry.policies, &call, &opts, Some(&flag));
            (call, passed)
        })
        .await;
        // Done waiting: the flag only covers the wait.
        gone.0 = None;
        joined.map_err(|e| match e.is_cancelled() {
            true => CallError::cancelled(&name),
            false => execute::crashed(&name, &e.to_string()),
        })
    }
}

/// Waits for `future` on this thread, which may block: how the CLI and a Lua tool's
/// `context.call` wait for a call placed [`Placement::Here`]. Such a call runs on this thread
/// and is ready at its first poll (an upstream tool blocks in its own `run`); the park loop
/// only keeps this correct for any future.
pub fn wait<T>(future: impl Future<Output = T>) -> T {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
        std::thread::park();
    }
}
