//! Approval over MCP: when a call needs a person's approval and the client can ask its user
//! (form elicitation), ctx asks right away and runs the call on "approve": with a request of
//! its own in the session eras and over stdio (the call waits in the pipeline's policy stage,
//! see [`Elicit`]), with an input-required result in the stateless 2026-07-28 era (the client
//! calls again with the answer). A client that cannot ask gets the pending approval as the result instead.

use std::sync::Arc;

use rmcp::model::{
    ClientResult, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationCapability,
    ElicitationSchema, InputRequest, InputRequests, InputRequiredResult, ProtocolVersion, ServerRequest,
};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::Value as Json;

use crate::approval::Pending;
use crate::lua::api::log::one_line;
use crate::tools::CallError;

/// How a person answered.
pub enum Answer {
    Approved,
    Declined,
    /// The client could not ask (an error, a cancelled request): the approval stays pending.
    NotAsked,
}

/// The key of ctx's question among an input-required result's requests (2026 era).
pub const INPUT_KEY: &str = "ctx_approval";

/// How this request's client can be asked, if at all.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Asking {
    /// It cannot: it declared no form elicitation.
    No,
    /// A request of ctx's own on the session (2025 era, stdio).
    Request,
    /// An input-required result that the client answers by calling again (2026-07-28).
    InputRequired,
}

/// Whether and how this request's client can be asked: it declared form elicitation.
pub fn asking(cx: &RequestContext<RoleServer>) -> Asking {
    let modern = cx.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
    let form = cx.client_capabilities().and_then(|c| c.elicitation).is_some_and(|e| by_form(&e));
    match (form, modern) {
        (false, _) => Asking::No,
        (true, false) => Asking::Request,
        (true, true) => Asking::InputRequired,
    }
}

/// Whether a client's elicitation capability covers a form (it names `form`, or names neither
/// mode, which means form): the one reading of it for rmcp's requests and the direct route's.
pub fn by_form(elicitation: &ElicitationCapability) -> bool {
    elicitation.form.is_some() || elicitation.url.is_none()
}

/// The question for `pending`: one `approve` checkbox.
pub(super) fn question(pending: &Pending) -> Option<ElicitRequest> {
    let a = &pending.approval;
    // Whole: parameters that need approval are capped (approval::MAX_PARAMS_BYTES), and a
    // person must see everything that would run, as it is: JSON leaves U+202E and the like raw,
    // and they would reorder what the person reads, so they are escaped line by line.
    let pretty = serde_json::to_string_pretty(&a.params).unwrap_or_default();
    let shown: Vec<_> = pretty.lines().map(one_line).collect();
    let message = format!(
        "Allow the tool '{}' to run with these parameters?\n\n{}\n\n(ctx approval {}; declining means it does not run)",
        one_line(&a.tool),
        shown.join("\n"),
        a.id
    );
    let schema = ElicitationSchema::builder()
        .required_bool_with("approve", |b| b.title("Approve").description("Run this tool call now"))
        .build()
        .ok()?;
    Some(ElicitRequest::new(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    }))
}

/// The 2026-era question: an input-required result whose `state` (the call's token with this
/// server's MAC, see `Policy::question_state`) the client sends back with its answer.
pub fn input_required(pending: &Pending, state: String) -> Option<InputRequiredResult> {
    let mut requests = InputRequests::new();
    requests.insert(INPUT_KEY.to_string(), InputRequest::Elicitation(question(pending)?));
    Some(InputRequiredResult::new(Some(requests), Some(state)))
}

/// What a 2026-era client answered (the value under [`INPUT_KEY`]); anything unreadable is a
/// "no".
pub fn answered(value: &Json) -> Answer {
    match serde_json::from_value::<ElicitResult>(value.clone()) {
        Ok(result) => decision(&result),
        Err(_) => Answer::Declined,
    }
}

/// Approved only on "accept" with the box ticked.
fn decision(result: &ElicitResult) -> Answer {
    let yes = result.content.as_ref().and_then(|c| c.get("approve")).and_then(Json::as_bool);
    match result.action {
        ElicitationAction::Accept if yes == Some(true) => Answer::Approved,
        _ => Answer::Declined,
    }
}

/// Asks the client's user to approve `pending`; waits until they answer, the request is
/// cancelled, or the approval would expire.
pub async fn ask(cx: &RequestContext<RoleServer>, pending: &Pending) -> Answer {
    let a = &pending.approval;
    let Some(question) = question(pending) else { return Answer::NotAsked };
    let request = ServerRequest::ElicitRequest(question);
    let left = (a.expires_at - chrono::Utc::now()).to_std().unwrap_or_default();
    let sent = cx.peer.send_request(request);
    let answer = tokio::select! {
        answer = sent => answer,
        _ = cx.ct.cancelled() => return Answer::NotAsked,
        _ = tokio::time::sleep(left) => return Answer::NotAsked,
    };
    match answer {
        Ok(ClientResult::ElicitResult(result)) => decision(&result),
        Ok(_) => Answer::NotAsked,
        Err(e) => {
            tracing::info!("approval {}: the client could not ask its user ({e}); it stays pending", a.id);
            Answer::NotAsked
        }
    }
}

/// Records a person's answer for the approval of `token`, like a decision made with `ctx
/// approvals` (so the log and `/approvals` show who decided): `Ok` with the token to check the
/// call again with when they approved, else why it does not run.
pub async fn record(
    policy: Arc<crate::approval::Policy>,
    token: &str,
    caller: &str,
    answer: Answer,
) -> Result<String, CallError> {
    let approved = matches!(answer, Answer::Approved);
    let (owned, caller) = (token.to_string(), caller.to_string());
    let decided =
        tokio::task::spawn_blocking(move || policy.decide_for(&owned, &caller, approved, "mcp elicitation")).await;
    let pending = match decided {
        Ok(Ok(pending)) => pending,
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(CallError::Internal("recording the approval failed".into())),
    };
    match approved {
        true => Ok(token.to_string()),
        false => Err(declined(&pending)),
    }
}

/// A session-era (or stdio) client that declared form elicitation: the pipeline puts a call's
/// pending approval to its user while the call waits, and the call goes on with their answer.
pub struct Elicit {
    pub cx: RequestContext<RoleServer>,
    pub policy: Arc<crate::approval::Policy>,
    /// Whom the call is made for: only that caller may answer for its approval.
    pub caller: String,
}

impl crate::tools::Ask for Elicit {
    fn ask<'a>(&'a self, pending: &'a Pending) -> crate::tools::pipeline::AskFuture<'a> {
        Box::pin(async move {
            match ask(&self.cx, pending).await {
                Answer::NotAsked => Err(CallError::ApprovalRequired(Box::new(pending.clone()))),
                answer => record(Arc::clone(&self.policy), &pending.token, &self.caller, answer).await,
            }
        })
    }
}

/// The error of a call whose user declined it.
pub fn declined(pending: &Pending) -> CallError {
    CallError::ApprovalRefused(format!(
        "tool '{}' did not run: the user declined it (approval {})",
        pending.approval.tool, pending.approval.id
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_question_shows_bidi_controls_in_parameters_escaped() {
        let approval = serde_json::from_value(serde_json::json!({
            "id": "ap-1", "tool": "pay", "via": "mcp", "state": "pending",
            "params": {"to": "alice\u{202e}txt.exe\u{202c}", "memo": "line\u{2028}two"},
            "created_at": "2026-01-01T00:00:00Z", "expires_at": "2026-01-01T01:00:00Z",
        }))
        .expect("an approval");
        let pending = Pending { approval, token: "t".into() };
        let Some(ElicitRequest { params: ElicitRequestParams::FormElicitationParams { message, .. }, .. }) =
            question(&pending)
        else {
            panic!("a form question")
        };
        assert!(message.contains(r#""to": "alice\u{202e}txt.exe\u{202c}""#), "{message}");
        assert!(message.contains(r#""memo": "line\u{2028}two""#), "{message}");
        assert!(!message.contains(['\u{202e}', '\u{202c}', '\u{2028}']), "{message}");
        assert!(message.contains("{\n  "), "the JSON stays on its lines: {message}");
    }
}
