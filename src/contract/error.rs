//! The one error enum of a tool call, and the one place its codes map to HTTP statuses and MCP.
//! What a feature's own errors mean for a call is said beside them (`CallError::from_script` in
//! `lua`, `from_kb` in `kb`, `from_upstream` in `upstream`): the contract knows none of them.

use std::time::Duration;

use serde_json::{json, Map, Value as Json};

use super::redact;
use super::text::seconds;
use crate::types::{ErrorBody, ErrorCode, ErrorDetail};

#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// No tool by that name.
    #[error("{0}")]
    UnknownTool(String),
    /// What the tool looked up does not exist (a document, for `get`).
    #[error("{}", redact::text(.0))]
    NotFound(String),
    /// The parameters failed the tool's schema: every problem, with its JSON pointer.
    #[error("invalid parameters for tool '{tool}': {}", summary(problems))]
    InvalidParams { tool: String, problems: Vec<ErrorDetail> },
    /// The request made sense structurally but not otherwise (an unknown source, a bad date).
    #[error("{}", redact::text(.0))]
    BadRequest(String),
    /// `subject` reads "tool 'x'" or "agent 'x'".
    #[error("{subject} timed out after {}", seconds(limit))]
    Timeout { subject: String, limit: Duration },
    #[error("{subject} exceeded its memory limit of {} MiB; raise memory_mb in its script section of ctx.toml or return less data", limit_bytes / (1024 * 1024))]
    MemoryLimit { subject: String, limit_bytes: usize },
    #[error("{}", redact::text(.0))]
    ResultTooLarge(String),
    /// The script raised an error or called `MCP.error`. `message` is sanitised; secrets are
    /// redacted wherever it is shown (REST, MCP, logs), since a script builds it freely.
    #[error("{}", redact::text(.message))]
    ToolFailed { message: String, tool_code: Option<String>, data: Option<Json> },
    /// A script sent to `execute` or a scripted tool stopped. `code` is the envelope's code
    /// (`timeout` past its deadline, `bad_request` for a script that does not compile, ...),
    /// `reason` the run's own finer code (`timeout`, `syntax_error`, `script_error`, or the limit
    /// that tripped), and `data` its line or limit with the trace of the calls it made.
    #[error("{}", redact::text(.message))]
    ScriptFailed { code: ErrorCode, message: String, reason: String, data: Box<Json> },
    #[error("{subject} was cancelled: its caller cancelled it or went away")]
    Cancelled { subject: String },
    /// No agent by that name.
    #[error("{0}")]
    UnknownAgent(String),
    /// The arguments of an agent's prompt are missing, unknown or not strings.
    #[error("invalid arguments for agent '{agent}': {}", summary(problems))]
    InvalidArguments { agent: String, problems: Vec<ErrorDetail> },
    /// A capability is not configured (semantic search without an embedding provider).
    #[error("{}", redact::text(.0))]
    Unavailable(String),
    /// The tool or agent is configured but failed to load: not "unknown", since the user can
    /// fix it. `subject` reads "tool 'x'" or "agent 'x'"; `reason` is the load problem.
    #[error("{subject} failed to load: {}", redact::text(.reason))]
    NotLoaded { subject: String, reason: String },
    /// The caller made more calls of the tool than a rate limit allows.
    #[error("tool '{tool}' is over its rate limit of {rate} per caller; retry in {}", retry_in(retry_after))]
    RateLimited { tool: String, rate: String, retry_after: Duration },
    /// The caller already has as many tasks running or waiting as `[tasks]` allows.
    #[error("you have {limit} tasks running or waiting for approval, the most [tasks] max_running_per_caller allows; wait for one to end (GET /tasks, MCP tasks/list) or cancel one, then call again")]
    TooManyTasks { limit: usize, retry_after: Duration },
    /// The call needs a person's approval: nothing ran, and a pending approval records it.
    #[error("{}", .0.summary())]
    ApprovalRequired(Box<super::approval::Pending>),
    /// The call needed approval and its token does not allow it (denied, used, expired, or
    /// bound to another call or caller): nothing ran.
    #[error("{}", redact::text(.0))]
    ApprovalRefused(String),
    /// The call must be in the tool-call log before it answers, and the log cannot take it
    /// now: nothing ran.
    #[error("{}", redact::text(.0))]
    AuditUnavailable(String),
    /// A bug in ctx. The message never holds internals; the log has them.
    #[error("{}", redact::text(.0))]
    Internal(String),
}

impl CallError {
    pub fn code(&self) -> ErrorCode {
        match self {
            CallError::UnknownTool(_) | CallError::UnknownAgent(_) | CallError::NotFound(_) => ErrorCode::NotFound,
            CallError::InvalidParams { .. } | CallError::InvalidArguments { .. } | CallError::BadRequest(_) => {
                ErrorCode::BadRequest
            }
            CallError::Timeout { .. } => ErrorCode::Timeout,
            CallError::MemoryLimit { .. } => ErrorCode::MemoryLimit,
            CallError::ResultTooLarge(_) => ErrorCode::ResultTooLarge,
            CallError::ToolFailed { .. } => ErrorCode::ToolError,
            CallError::ScriptFailed { code, .. } => *code,
            CallError::Cancelled { .. } => ErrorCode::Cancelled,
            CallError::Unavailable(_) => ErrorCode::Unavailable,
            CallError::NotLoaded { .. } => ErrorCode::LoadFailed,
            CallError::RateLimited { .. } | CallError::TooManyTasks { .. } => ErrorCode::RateLimited,
            CallError::ApprovalRequired(_) => ErrorCode::ApprovalRequired,
            CallError::ApprovalRefused(_) => ErrorCode::ApprovalRefused,
            CallError::AuditUnavailable(_) => ErrorCode::AuditUnavailable,
            CallError::Internal(_) => ErrorCode::Internal,
        }
    }

    /// How long the caller should wait before calling again, when the error says so: REST
    /// sends it as `Retry-After`, both REST and MCP as `data.retry_after_secs`.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CallError::RateLimited { retry_after, .. } | CallError::TooManyTasks { retry_after, .. } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }

    /// The error envelope's body.
    pub fn body(&self) -> ErrorBody {
        let details = match self {
            CallError::InvalidParams { problems, .. } | CallError::InvalidArguments { problems, .. } => {
                problems.clone()
            }
            _ => Vec::new(),
        };
        let data = match self {
            // `MCP.error(code, ...)` always has a code; a raised table may have only its data.
            CallError::ToolFailed { tool_code, data, .. } if tool_code.is_some() || data.is_some() => {
                code_and_data(tool_code.as_deref(), data.as_ref())
            }
            CallError::ScriptFailed { reason, data, .. } => code_and_data(Some(reason), Some(data)),
            CallError::ApprovalRequired(pending) => {
                let mut m = Map::new();
                m.insert("approval".into(), serde_json::to_value(pending.body()).unwrap_or_default());
                m
            }
            CallError::RateLimited { retry_after, .. } | CallError::TooManyTasks { retry_after, .. } => {
                let mut m = Map::new();
                m.insert("retry_after_secs".into(), json!(retry_secs(*retry_after)));
                m
            }
            _ => Map::new(),
        };
        ErrorBody { code: self.code(), message: self.to_string(), details, data }
    }

    /// `{"error": {...}}`, the body every failed REST request returns.
    pub fn envelope(&self) -> Json {
        // Built by hand for a readable key order: code, message, details, data.
        let body = self.body();
        let mut error = Map::new();
        error.insert("code".into(), json!(body.code));
        error.insert("message".into(), Json::String(body.message));
        if !body.details.is_empty() {
            error.insert(
                "details".into(),
                json!(body.details.iter().map(|d| json!({"path": d.path, "message": d.message})).collect::<Vec<_>>()),
            );
        }
        if !body.data.is_empty() {
            error.insert("data".into(), Json::Object(body.data));
        }
        json!({ "error": error })
    }

    /// True when MCP reports this as a JSON-RPC error (-32602) instead of a result with
    /// `isError`: the call never reached the tool.
    pub fn is_protocol_error(&self) -> bool {
        matches!(
            self,
            CallError::UnknownTool(_)
                | CallError::InvalidParams { .. }
                | CallError::UnknownAgent(_)
                | CallError::InvalidArguments { .. }
        )
    }

    /// The message as logs keep it: an approval's token, which lets its caller run the call,
    /// is left out (the caller got it in the answer).
    pub fn log_text(&self) -> String {
        match self {
            CallError::ApprovalRequired(pending) => pending.summary(),
            other => other.to_string(),
        }
    }

    /// The call of `tool` was cancelled before it finished.
    pub fn cancelled(tool: &str) -> CallError {
        CallError::Cancelled { subject: format!("tool '{tool}'") }
    }
}

/// `{code, data}` of a failure a tool or script described itself, redacted: a script builds
/// both freely.
fn code_and_data(code: Option<&str>, data: Option<&Json>) -> Map<String, Json> {
    let mut m = Map::new();
    if let Some(code) = code {
        m.insert("code".into(), Json::String(redact::string(code.to_string())));
    }
    let mut data = data.cloned().unwrap_or(Json::Null);
    redact::current().apply_json(&mut data);
    m.insert("data".into(), data);
    m
}

/// The HTTP status of an error code. The only place the two meet.
pub fn http_status(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::BadRequest => 400,
        ErrorCode::Unauthorized => 401,
        ErrorCode::Forbidden => 403,
        ErrorCode::NotFound => 404,
        ErrorCode::MethodNotAllowed => 405,
        ErrorCode::Conflict => 409,
        ErrorCode::Timeout => 408,
        ErrorCode::PayloadTooLarge => 413,
        ErrorCode::UnsupportedMediaType => 415,
        ErrorCode::Cancelled => 499,
        ErrorCode::RateLimited => 429,
        // Accepted, not run: the body says who approves it and how to run it then.
        ErrorCode::ApprovalRequired => 202,
        ErrorCode::ApprovalRefused => 403,
        // Configured but broken: the server cannot serve it until its file is fixed, and hot
        // reload then brings it back, so "unavailable", not "not found".
        ErrorCode::Unavailable | ErrorCode::LoadFailed | ErrorCode::AuditUnavailable => 503,
        ErrorCode::BadGateway => 502,
        ErrorCode::MemoryLimit | ErrorCode::ResultTooLarge | ErrorCode::ToolError | ErrorCode::Internal => 500,
    }
}

/// An error code as the wire spells it, for logs and metrics labels.
pub fn code_name(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::BadRequest => "bad_request",
        ErrorCode::Unauthorized => "unauthorized",
        ErrorCode::Forbidden => "forbidden",
        ErrorCode::NotFound => "not_found",
        ErrorCode::MethodNotAllowed => "method_not_allowed",
        ErrorCode::Conflict => "conflict",
        ErrorCode::Timeout => "timeout",
        ErrorCode::PayloadTooLarge => "payload_too_large",
        ErrorCode::UnsupportedMediaType => "unsupported_media_type",
        ErrorCode::MemoryLimit => "memory_limit",
        ErrorCode::ResultTooLarge => "result_too_large",
        ErrorCode::ToolError => "tool_error",
        ErrorCode::Cancelled => "cancelled",
        ErrorCode::RateLimited => "rate_limited",
        ErrorCode::ApprovalRequired => "approval_required",
        ErrorCode::ApprovalRefused => "approval_refused",
        ErrorCode::Unavailable => "unavailable",
        ErrorCode::LoadFailed => "load_failed",
        ErrorCode::AuditUnavailable => "audit_unavailable",
        ErrorCode::BadGateway => "bad_gateway",
        ErrorCode::Internal => "internal",
    }
}

/// Whole seconds to wait, rounded up (a `Retry-After` of 0 would invite an instant retry).
pub fn retry_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

fn retry_in(wait: &Duration) -> String {
    match retry_secs(*wait) {
        1 => "1 second".to_string(),
        n => format!("{n} seconds"),
    }
}

/// Every problem on one line: `/a: ...; /b: ...`.
pub(crate) fn summary(problems: &[ErrorDetail]) -> String {
    problems
        .iter()
        .map(|p| if p.path.is_empty() { p.message.clone() } else { format!("{}: {}", p.path, p.message) })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_are_the_wire_names() {
        for code in [ErrorCode::BadRequest, ErrorCode::RateLimited, ErrorCode::LoadFailed, ErrorCode::Internal] {
            assert_eq!(serde_json::to_value(code).unwrap(), code_name(code));
        }
    }

    #[test]
    fn a_rate_limited_call_says_when_to_retry() {
        let e = CallError::RateLimited {
            tool: "deploy".into(),
            rate: "2/min".into(),
            retry_after: Duration::from_millis(2500),
        };
        assert_eq!(http_status(e.code()), 429);
        assert_eq!(e.to_string(), "tool 'deploy' is over its rate limit of 2/min per caller; retry in 3 seconds");
        assert_eq!(e.envelope()["error"]["data"]["retry_after_secs"], 3);
    }
}
