//! Operations routes: the tool-call log (`GET /calls`) and metrics (`GET /metrics`).
//!
//! Both cover every tool, so a scoped token sees only its own calls in the log and gets no
//! metrics: what it may not call, it may not learn about either.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{Extension, Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::guard;
use super::openapi::responses::GuardErrors;
use super::openapi::schemas::CallsResponse as CallsResponseSchema;
use super::respond::{ok, ApiError};
use super::App;
use crate::calllog::{self, Filter, Settings, Store};
use crate::contract::text::kind;
use crate::types::{CallsResponse, ErrorCode};

/// Pages of the log at most.
const MAX_LIMIT: usize = 1000;

/// The tool-call log, newest first.
///
/// Query parameters (all optional): `tool`, `caller` (a scoped token's name), `since` (an age
/// such as `10m` or `2h`, a date, or an RFC 3339 time), `errors=true` (failed calls only),
/// `limit` (1 to 1000, default 100) and `before` (the `next_before` of the previous page). A
/// scoped token sees only the calls made for it.
#[utoipa::path(get, path = "/calls", operation_id = "listCalls", tag = "operations",
    params(
        ("tool" = Option<String>, Query, description = "Only calls of this tool."),
        ("caller" = Option<String>, Query, description = "Only calls made for this scoped token."),
        ("since" = Option<String>, Query, description = "Only calls since then: 30s, 10m, 2h, 7d, 2026-11-27 or an RFC 3339 time."),
        ("errors" = Option<bool>, Query, description = "Only failed calls."),
        ("limit" = Option<u32>, Query, description = "Entries per page, 1 to 1000 (default 100)."),
        ("before" = Option<i64>, Query, description = "Entries older than this seq: the previous page's next_before."),
    ),
    responses((status = 200, description = "The calls, newest first.", body = CallsResponseSchema),
        (status = 400, description = "A query parameter is not valid.", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn calls(
    State(app): State<Arc<App>>,
    caller: Option<Extension<guard::Caller>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let filter = match filter(&query) {
        Ok(mut filter) => {
            // A scoped token reads its own calls only.
            if let Some(principal) = caller.as_ref().and_then(|Extension(guard::Caller(p))| p.clone()) {
                if filter.caller.as_deref().is_some_and(|c| c != principal.name()) {
                    return ok(&serde_json::json!({"calls": []}));
                }
                filter.caller = Some(principal.name().to_string());
            }
            filter
        }
        Err(message) => return ApiError::new(ErrorCode::BadRequest, message).into_response(),
    };
    let path = Settings::path_of(app.tools.current().kb().config());
    // Every replica's calls when the log is kept in the shared database.
    let shared = app.tools.current().state().db.clone();
    let read = tokio::task::spawn_blocking(move || -> Result<CallsResponse, String> {
        let store = match shared {
            Some(shared) => Some(Store::shared(shared.pg, shared.replica)),
            None => Store::open_existing(&path).map_err(|e| e.to_string())?,
        };
        let Some(store) = store else {
            return Ok(CallsResponse { calls: Vec::new(), next_before: None });
        };
        let calls = store.query(&filter).map_err(|e| e.to_string())?;
        let next_before = (calls.len() == filter.limit).then(|| calls.last().map(|r| r.seq)).flatten();
        Ok(CallsResponse { calls, next_before })
    })
    .await;
    match read {
        Ok(Ok(body)) => ok(&serde_json::to_value(body).unwrap_or_default()),
        Ok(Err(e)) => {
            tracing::error!("reading the tool-call log failed: {e}");
            ApiError::new(ErrorCode::Internal, "the tool-call log could not be read; the server log has the details")
                .into_response()
        }
        Err(_) => ApiError::new(ErrorCode::Internal, "reading the tool-call log failed").into_response(),
    }
}

/// The filter a query asks for, or what is wrong with it.
fn filter(query: &HashMap<String, String>) -> Result<Filter, String> {
    const KNOWN: [&str; 6] = ["tool", "caller", "since", "errors", "limit", "before"];
    if let Some(unknown) = query.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("unknown query parameter {unknown:?}; GET /calls takes {}", KNOWN.join(", ")));
    }
    let since = match query.get("since") {
        Some(text) => Some(calllog::parse_since(text, SystemTime::now())?),
        None => None,
    };
    let errors_only = flag(query, "errors")?;
    let limit = match query.get("limit") {
        None => 100,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => return Err(format!("limit={text:?}: give a whole number from 1 to {MAX_LIMIT}")),
        },
    };
    let before = match query.get("before") {
        None => None,
        Some(text) => Some(
            text.parse::<i64>().map_err(|_| format!("before={text:?}: give the next_before of the previous page"))?,
        ),
    };
    Ok(Filter {
        tool: query.get("tool").cloned(),
        caller: query.get("caller").cloned(),
        since,
        errors_only,
        before,
        after: None,
        limit,
    })
}

/// A boolean query parameter: `true` or `false`, absent meaning `false`. Anything else, an
/// empty value included, is refused with the accepted values.
fn flag(query: &HashMap<String, String>, name: &str) -> Result<bool, String> {
    match query.get(name).map(String::as_str) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => {
            Err(format!("query parameter {name}={other:?} is not a boolean: give {name}=true or {name}=false"))
        }
    }
}

/// Metrics in the Prometheus text format: calls by tool and outcome, latency histograms,
/// upstream servers, syncs, approvals pending and the call log's own counters. Not for scoped
/// tokens: it covers every tool.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "operations",
    responses((status = 200, description = "The metrics (text/plain; version=0.0.4).", content_type = "text/plain", body = String),
        (status = 404, description = "Metrics are off (server.metrics = false).", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn metrics(State(app): State<Arc<App>>, caller: Option<Extension<guard::Caller>>) -> Response {
    if caller.as_ref().is_some_and(|Extension(guard::Caller(p))| p.is_some()) {
        return ApiError::new(
            ErrorCode::Forbidden,
            "metrics cover every tool, and this token is scoped to some: scrape /metrics with server.auth_token",
        )
        .into_response();
    }
    let registry = app.tools.current();
    if !registry.kb().config().spec.server.metrics {
        return ApiError::new(
            ErrorCode::NotFound,
            "metrics are off: set server.metrics = true in ctx.toml to serve /metrics",
        )
        .into_response();
    }
    let (kb, policy) = (registry.kb().clone(), Arc::clone(registry.approvals()));
    let read = tokio::task::spawn_blocking(move || (kb.store().sources(), policy.store.pending())).await;
    let (sources, pending) = read.unwrap_or_else(|_| (Ok(Vec::new()), Ok(0)));
    let sources = sources.unwrap_or_else(|e| {
        tracing::warn!("metrics: the sources could not be read: {e}");
        Vec::new()
    });
    let approvals_pending = pending.unwrap_or_else(|e| {
        tracing::warn!("metrics: the approvals could not be read: {e}");
        0
    });
    let scraped = crate::metrics::Scraped {
        upstreams: app.tools.upstreams().map(|u| u.status()).unwrap_or_default(),
        sources,
        approvals_pending,
        connections: app.connections.count() as u64,
        mcp_sessions: app.sessions.count().await as u64,
    };
    let registry = app.tools.current();
    let state = registry.state();
    let mut response = state.metrics.render(&scraped, state.log.counters()).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

/// Whether the request may decide approvals: not with a scoped token, which would let a
/// client approve its own calls.
fn admin(caller: &Option<Extension<guard::Caller>>) -> Result<(), ApiError> {
    if caller.as_ref().is_some_and(|Extension(guard::Caller(p))| p.is_some()) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "approvals are decided by people, not by the clients whose calls wait: use server.auth_token or ctx approvals",
        ));
    }
    Ok(())
}

/// Calls waiting for a person (and approved ones not yet run), newest first; `?all=true`
/// adds the decided, used and expired ones.
#[utoipa::path(get, path = "/approvals", operation_id = "listApprovals", tag = "operations",
    params(("all" = Option<bool>, Query, description = "Also decided, used and expired approvals.")),
    responses((status = 200, description = "The approvals.", body = super::openapi::schemas::ApprovalsList),
        (status = 400, description = "A query parameter is not valid.", body = super::openapi::schemas::Error),
        (status = 403, description = "A scoped token: approvals are for server.auth_token.", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn approvals(
    State(app): State<Arc<App>>,
    caller: Option<Extension<guard::Caller>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    if let Err(refused) = admin(&caller) {
        return refused.into_response();
    }
    if let Some(unknown) = query.keys().find(|k| k.as_str() != "all") {
        let message = format!("unknown query parameter {unknown:?}; GET /approvals takes all");
        return ApiError::new(ErrorCode::BadRequest, message).into_response();
    }
    let all = match flag(&query, "all") {
        Ok(all) => all,
        Err(message) => return ApiError::new(ErrorCode::BadRequest, message).into_response(),
    };
    let policy = Arc::clone(app.tools.current().approvals());
    let listed = tokio::task::spawn_blocking(move || policy.store.list(all, 1000)).await;
    match listed {
        Ok(Ok(rows)) => {
            let body = crate::types::ApprovalsList { approvals: rows.iter().map(|r| r.approval()).collect() };
            ok(&serde_json::to_value(body).unwrap_or_default())
        }
        Ok(Err(e)) => store_failed(&e),
        Err(_) => store_failed("the task failed"),
    }
}

fn store_failed(e: &str) -> Response {
    tracing::error!("approvals: {e}");
    ApiError::new(ErrorCode::Internal, "the approvals store could not be read; the server log has the details")
        .into_response()
}

/// Approve a pending call: its caller may then send it again with its token, and it runs once.
///
/// Needs `[approval] approver_token`, sent as the `Ctx-Approver` header beside the bearer token:
/// the token a client calls with is not enough to approve its own calls.
#[utoipa::path(post, path = "/approvals/{id}/approve", operation_id = "approve", tag = "operations",
    params(("id" = String, Path, description = "The approval's id (ap-...).")),
    responses((status = 200, description = "Approved.", body = super::openapi::schemas::Approval),
        (status = 403, description = "A scoped token: approvals are for server.auth_token.", body = super::openapi::schemas::Error),
        (status = 404, description = "No approval with that id.", body = super::openapi::schemas::Error),
        (status = 409, description = "It is not pending (already decided, used or expired).", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn approve(
    State(app): State<Arc<App>>,
    caller: Option<Extension<guard::Caller>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
) -> Response {
    decide(&app, &caller, &headers, id, true, None).await
}

/// Deny a pending call: it will not run. The body may give a reason: `{"reason": "..."}`.
///
/// Needs `[approval] approver_token`, sent as the `Ctx-Approver` header.
#[utoipa::path(post, path = "/approvals/{id}/deny", operation_id = "deny", tag = "operations",
    params(("id" = String, Path, description = "The approval's id (ap-...).")),
    // The body is optional: named by reference, `requestBody.required` is left out (false).
    request_body = ref("#/components/schemas/DenyRequest"),
    responses((status = 200, description = "Denied.", body = super::openapi::schemas::Approval),
        (status = 400, description = "The body is not a JSON object with at most a string reason.", body = super::openapi::schemas::Error),
        (status = 403, description = "A scoped token: approvals are for server.auth_token.", body = super::openapi::schemas::Error),
        (status = 404, description = "No approval with that id.", body = super::openapi::schemas::Error),
        (status = 409, description = "It is not pending (already decided, used or expired).", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn deny(
    State(app): State<Arc<App>>,
    caller: Option<Extension<guard::Caller>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
    request: axum::extract::Request,
) -> Response {
    let what = "the denial, {\"reason\": \"...\"}";
    let body = match super::respond::object_body(&headers, request.into_body(), app.max_body_bytes, what).await {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    if let Some(unknown) = body.keys().find(|k| k.as_str() != "reason") {
        let message = format!("unknown field {unknown:?} in the body; a denial takes only reason, a string");
        return ApiError::new(ErrorCode::BadRequest, message).into_response();
    }
    let reason = match body.get("reason") {
        None => None,
        Some(serde_json::Value::String(r)) => Some(r.chars().take(1000).collect::<String>()),
        Some(other) => {
            let message = format!("reason must be a string (why the call is denied); got {}", kind(other));
            return ApiError::new(ErrorCode::BadRequest, message).into_response();
        }
    };
    let headers = headers.clone();
    decide(&app, &caller, &headers, id, false, reason).await
}

async fn decide(
    app: &App,
    caller: &Option<Extension<guard::Caller>>,
    headers: &axum::http::HeaderMap,
    id: String,
    approve: bool,
    reason: Option<String>,
) -> Response {
    if let Err(refused) = admin(caller) {
        return refused.into_response();
    }
    let policy = Arc::clone(app.tools.current().approvals());
    // The token a client calls with must not be enough to approve its own calls.
    let Some(expected) = policy.approver_token.as_deref() else {
        return ApiError::new(
            ErrorCode::Forbidden,
            "deciding approvals over REST needs [approval] approver_token in ctx.toml (sent as the Ctx-Approver header); without it, people decide with ctx approvals approve|deny on the server's machine",
        )
        .into_response();
    };
    let given = headers.get("ctx-approver").map(|v| v.as_bytes()).unwrap_or_default();
    let same = given.len() == expected.len()
        && given.iter().zip(expected.as_bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    if !same {
        return ApiError::new(
            ErrorCode::Forbidden,
            "missing or wrong Ctx-Approver header: approving or denying over REST needs [approval] approver_token",
        )
        .into_response();
    }
    let decided =
        tokio::task::spawn_blocking(move || decide_in(&policy.store, &id, approve, "rest", reason.as_deref())).await;
    match decided {
        Ok(Ok(approval)) => ok(&serde_json::to_value(approval).unwrap_or_default()),
        Ok(Err(e)) => e.into_response(),
        Err(_) => store_failed("the task failed"),
    }
}

/// Approves or denies `id` in `store`: the decided approval, or why not (the one wording of
/// REST and the CLI).
pub fn decide_in(
    store: &crate::approval::Store,
    id: &str,
    approve: bool,
    by: &str,
    reason: Option<&str>,
) -> Result<crate::types::Approval, ApiError> {
    match store.decide(id, approve, by, reason) {
        Ok(Ok(row)) => Ok(row.approval()),
        Ok(Err(None)) => Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no approval {id:?}; ctx approvals list (or GET /approvals) shows the pending ones"),
        )),
        Ok(Err(Some(state))) => Err(ApiError::new(
            ErrorCode::Conflict,
            format!("approval {id} is {state}, not pending; only a pending call can be approved or denied"),
        )),
        Err(e) => {
            tracing::error!("approvals: {e}");
            Err(ApiError::new(
                ErrorCode::Internal,
                "the approvals store could not be written; the server log has the details",
            ))
        }
    }
}
