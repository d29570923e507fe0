//! Responses: every failure is the error envelope, with the status `tools::http_status` gives.

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value as Json};

use crate::contract::text::kind;
use crate::tools::{http_status, CallError};
use crate::types::ErrorCode;

/// An HTTP-level failure (before or instead of a tool call).
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "error": { "code": self.code, "message": self.message } });
        let mut response = json_response(status(self.code), &body);
        if self.code == ErrorCode::Unauthorized {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// A tool call's failure as a response.
pub fn call_error(err: &CallError) -> Response {
    // Not run, waiting for a person: 202 with what would run, the id and the token.
    if let CallError::ApprovalRequired(pending) = err {
        let body = serde_json::to_value(pending.body()).unwrap_or_default();
        return json_response(StatusCode::ACCEPTED, &body);
    }
    let mut response = json_response(status(err.code()), &err.envelope());
    if let Some(wait) = err.retry_after() {
        let secs = crate::tools::retry_secs(wait).to_string();
        if let Ok(value) = HeaderValue::from_str(&secs) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
    }
    response
}

pub fn json_response(status: StatusCode, body: &Json) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub fn ok(body: &Json) -> Response {
    json_response(StatusCode::OK, body)
}

fn status(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(http_status(code)).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// Reads a request body that must be a JSON object: at most `limit` bytes, `Content-Type:
/// application/json` when there is a body, and an empty body is the empty object. Anything but
/// an object (`null` included: the document declares an object) is refused, saying what the
/// object holds (`what`, e.g. "the tool's parameters by name").
pub async fn object_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    what: &str,
) -> Result<Map<String, Json>, ApiError> {
    match json_body(headers, body, limit).await? {
        Json::Object(object) => Ok(object),
        other => Err(ApiError::new(
            ErrorCode::BadRequest,
            format!(
                "the request body must be a JSON object of {what}; got {} (send no body at all when there is nothing to give)",
                kind(&other)
            ),
        )),
    }
}

/// Reads a JSON request body (see [`object_body`]).
async fn json_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Json, ApiError> {
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("the request body is larger than {limit} bytes (server.max_body_bytes)"),
        )
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Json::Object(Default::default()));
    }
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence != "application/json" && !essence.ends_with("+json") {
        let got = if content_type.is_empty() { "no Content-Type".to_string() } else { format!("{content_type:?}") };
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            format!("the body must be JSON: send Content-Type: application/json (got {got})"),
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            ErrorCode::BadRequest,
            format!("malformed JSON at line {} column {}: {}", e.line(), e.column(), strip_position(&e.to_string())),
        )
    })
}

/// serde_json appends " at line X column Y"; the message already says where.
fn strip_position(message: &str) -> &str {
    message.split(" at line ").next().unwrap_or(message)
}
