//! Approval over MCP: when a call needs a person's approval and the client can ask its user
//! (elicitation, in the session eras and over stdio), ctx asks right away and runs the call on
//! "approve". A client that cannot ask gets the pending approval as the result instead.

use rmcp::model::{
    ClientResult, ElicitRequest, ElicitRequestParams, ElicitationAction, ElicitationSchema, ProtocolVersion,
    ServerRequest,
};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::Value as Json;

use crate::approval::Pending;
use crate::tools::CallError;

/// How a person answered.
pub enum Answer {
    Approved,
    Declined,
    /// The client could not ask (no capability, an error, the era): the approval stays pending.
    NotAsked,
}

/// Whether this request's client can be asked: it declared form elicitation, and the request
/// is not of the stateless 2026 era (where the server cannot send requests of its own).
pub fn can_ask(cx: &RequestContext<RoleServer>) -> bool {
    let modern = cx.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
    let form =
        cx.client_capabilities().and_then(|c| c.elicitation).is_some_and(|e| e.form.is_some() || e.url.is_none());
    form && !modern
}

/// Asks the client's user to approve `pending`; waits until they answer, the request is
/// cancelled, or the approval would expire.
pub async fn ask(cx: &RequestContext<RoleServer>, pending: &Pending) -> Answer {
    let a = &pending.approval;
    let params = serde_json::to_string_pretty(&a.params).unwrap_or_default();
    let shown: String = params.chars().take(2000).collect();
    let message = format!(
        "Allow the tool '{}' to run with these parameters?\n\n{shown}\n\n(ctx approval {}; declining means it does not run)",
        a.tool, a.id
    );
    let schema = ElicitationSchema::builder()
        .required_bool_with("approve", |b| b.title("Approve").description("Run this tool call now"))
        .build();
    let Ok(schema) = schema else { return Answer::NotAsked };
    let request = ServerRequest::ElicitRequest(ElicitRequest::new(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema,
    }));
    let left = (a.expires_at - chrono::Utc::now()).to_std().unwrap_or_default();
    let sent = cx.peer.send_request(request);
    let answer = tokio::select! {
        answer = sent => answer,
        _ = cx.ct.cancelled() => return Answer::NotAsked,
        _ = tokio::time::sleep(left) => return Answer::NotAsked,
    };
    match answer {
        Ok(ClientResult::ElicitResult(result)) => match result.action {
            ElicitationAction::Accept => {
                let yes = result.content.as_ref().and_then(|c| c.get("approve")).and_then(Json::as_bool);
                if yes == Some(true) {
                    Answer::Approved
                } else {
                    Answer::Declined
                }
            }
            _ => Answer::Declined,
        },
        Ok(_) => Answer::NotAsked,
        Err(e) => {
            tracing::info!("approval {}: the client could not ask its user ({e}); it stays pending", a.id);
            Answer::NotAsked
        }
    }
}

/// The error of a call whose user declined it.
pub fn declined(pending: &Pending) -> CallError {
    CallError::ApprovalRefused(format!(
        "tool '{}' did not run: the user declined it (approval {})",
        pending.approval.tool, pending.approval.id
    ))
}
