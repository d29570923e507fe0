//! The error responses operations share, each with the error envelope as its body.

use std::collections::BTreeMap;

use utoipa::openapi::{Content, Ref, RefOr, Response, ResponseBuilder};
use utoipa::IntoResponses;

fn error(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content("application/json", Content::new(Some(Ref::from_schema_name("Error"))))
        .build()
        .into()
}

/// What the guard answers before any route runs: a missing token, a foreign Origin or Host.
pub struct GuardErrors;

impl IntoResponses for GuardErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        BTreeMap::from([
            ("401".to_string(), error("Missing or wrong bearer token.")),
            ("403".to_string(), error("Origin or Host not allowed.")),
        ])
    }
}

/// Every error a tool call or an agent prompt can produce.
pub struct CallErrors;

impl IntoResponses for CallErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut all = GuardErrors::responses();
        all.extend([
            ("400".to_string(), error("Invalid parameters (every problem in details) or malformed JSON.")),
            (
                "403".to_string(),
                error("Origin or Host not allowed, or the call needed approval and its token does not allow it (approval_refused: denied, used, expired, or issued for another call or caller)."),
            ),
            ("404".to_string(), error("Unknown tool or agent, or what it looked up does not exist.")),
            ("408".to_string(), error("The tool or agent passed its deadline.")),
            ("413".to_string(), error("Body larger than server.max_body_bytes.")),
            ("415".to_string(), error("Body is not application/json.")),
            (
                "202".to_string(),
                ResponseBuilder::new()
                    .description("Not run: the tool needs a person's approval. The body has the approval's id (what a person approves with ctx approvals approve or POST /approvals/{id}/approve) and the token to send the same call again with (header Ctx-Approval) once approved.")
                    .content("application/json", Content::new(Some(Ref::from_schema_name("Approval"))))
                    .build()
                    .into(),
            ),
            (
                "429".to_string(),
                error("Over the tool's rate limit for this caller: Retry-After and error.data.retry_after_secs say when to call again."),
            ),
            (
                "500".to_string(),
                error("The tool failed (tool_error, memory_limit, result_too_large) or ctx did (internal)."),
            ),
            (
                "503".to_string(),
                error(
                    "A capability is not configured (semantic search without embeddings), the tool failed to load (code load_failed, with the reason), or it is quarantined.",
                ),
            ),
        ]);
        all
    }
}

/// `errors` with `ok` as the 200 response.
pub fn with_ok(ok: Response, errors: BTreeMap<String, RefOr<Response>>) -> utoipa::openapi::Responses {
    let mut responses = utoipa::openapi::Responses::new();
    responses.responses.insert("200".to_string(), ok.into());
    responses.responses.extend(errors);
    responses
}
