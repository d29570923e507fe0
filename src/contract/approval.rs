//! What the contract says of approval: the parameter that carries a token, and a call that
//! waits for a person (what [`CallError::ApprovalRequired`](super::CallError::ApprovalRequired)
//! holds). Which calls wait, and the store, are the `approval` feature's.

use crate::types::Approval;

/// The parameter name a caller may put beside the arguments to present a token (REST also
/// takes the `Ctx-Approval` header).
pub const PARAM: &str = "_approval";

/// A call that waits for approval: the record and the token its caller presents later.
#[derive(Clone, Debug)]
pub struct Pending {
    pub approval: Approval,
    pub token: String,
}

impl Pending {
    /// What the call's log line and a script's error say: which call waits, and who decides.
    /// Not the token, which runs the call once approved: only its caller's answer holds it.
    pub fn summary(&self) -> String {
        let a = &self.approval;
        format!(
            "tool '{}' needs approval before it runs; nothing ran. Approval {} is pending until {}: a person approves it with `ctx approvals approve {}`",
            a.tool,
            a.id,
            a.expires_at.format("%Y-%m-%d %H:%M:%S UTC"),
            a.id
        )
    }

    /// What to do next, in words, for the caller (and the person it shows this to).
    pub fn message(&self) -> String {
        let id = &self.approval.id;
        format!(
            "{} (or POST /approvals/{id}/approve, or denies it), then the same call runs once when sent again with the token {} (REST: header Ctx-Approval; MCP and scripts: \"{PARAM}\" beside the arguments)",
            self.summary(),
            self.token
        )
    }

    /// The wire form with the token and the message.
    pub fn body(&self) -> Approval {
        Approval { token: Some(self.token.clone()), message: Some(self.message()), ..self.approval.clone() }
    }
}
