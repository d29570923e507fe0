//! Policy: what a call must pass after admission and before it runs. Each policy's rules live
//! in its feature's own module (approval in `approval`, rate limits in [`super::rate`]) and plug
//! in through [`Policy`]; the registry holds them in the order they are asked.

use std::sync::atomic::{AtomicBool, Ordering};

use super::admit::Admitted;
use super::{CallError, CallOptions};

/// One policy. A call runs only when every policy let it through: each is asked in turn
/// ([`Policy::check`]), and only then are their holds made final ([`Policy::commit`]), so a
/// later refusal (a rate limit) does not use up what an earlier one granted (an approval). A
/// policy with nothing to hold spends what it grants in `check` (a rate limit's token).
pub trait Policy: Send + Sync {
    /// Whether checking `call` may block the thread (it reads a file another process writes):
    /// such checks run on the blocking pool, never on an async worker.
    fn blocks(&self, _call: &Admitted) -> bool {
        false
    }

    /// Lets the call through, with what to make final once every policy agreed, or refuses it.
    fn check(&self, call: &Admitted, options: &CallOptions) -> Result<Option<Hold>, CallError>;

    /// Makes a hold of [`Policy::check`] final, as the call starts to run.
    fn commit(&self, _call: &Admitted, _hold: Hold) -> Result<(), CallError> {
        Ok(())
    }
}

/// What a policy granted and keeps until the call runs (an approval's id).
pub struct Hold(pub String);

/// Approval is a policy of the call pipeline, asked first (said here: `approval` sits below
/// the call path and knows only the contract): a call that needs a person's approval
/// runs only with the token of an approved, unused approval bound to exactly this call, and
/// that approval is used up only once every other policy let the call through. Checking reads
/// the approvals' SQLite file, which a person's `ctx approvals approve` may hold for a moment.
impl Policy for crate::approval::Policy {
    fn blocks(&self, call: &Admitted) -> bool {
        call.tool().is_some_and(|spec| self.needs(spec))
    }

    fn check(&self, call: &Admitted, options: &CallOptions) -> Result<Option<Hold>, CallError> {
        if !call.tool().is_some_and(|spec| self.needs(spec)) {
            return Ok(None);
        }
        let caller = options.principal.as_deref().map(super::Principal::name).unwrap_or("");
        let id = self.check(&call.name, &call.params, caller, options.caller, call.token.as_deref())?;
        Ok(Some(Hold(id)))
    }

    fn commit(&self, call: &Admitted, hold: Hold) -> Result<(), CallError> {
        self.consume(&call.name, &hold.0)
    }
}

/// Asks every policy about `call`, in order, then commits their holds. When `gone` is set (the
/// caller stopped waiting while this ran on the blocking pool), nothing is committed: the call
/// stops as cancelled before any hold is used up.
pub(super) fn pass(
    policies: &[std::sync::Arc<dyn Policy>],
    call: &Admitted,
    options: &CallOptions,
    gone: Option<&AtomicBool>,
) -> Result<(), CallError> {
    let mut holds: Vec<(usize, Hold)> = Vec::new();
    for (i, policy) in policies.iter().enumerate() {
        if let Some(hold) = policy.check(call, options)? {
            holds.push((i, hold));
        }
    }
    for (i, hold) in holds {
        if gone.is_some_and(|g| g.load(Ordering::Acquire)) {
            return Err(CallError::cancelled(&call.name));
        }
        policies[i].commit(call, hold)?;
    }
    Ok(())
}

/// Whether any policy must check `call` off the async workers.
pub(super) fn blocks(policies: &[std::sync::Arc<dyn Policy>], call: &Admitted) -> bool {
    policies.iter().any(|p| p.blocks(call))
}
