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
    let read = tokio::task::spawn_blocking(move || -> Result<CallsResponse, String> {
        let Some(store) = Store::open_existing(&path).map_err(|e| e.to_string())? else {
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
    let errors_only = match query.get("errors").map(String::as_str) {
        None | Some("false") => false,
        Some("true") | Some("") => true,
        Some(other) => return Err(format!("errors={other:?}: give true or false")),
    };
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
    let kb = registry.kb().clone();
    let sources = tokio::task::spawn_blocking(move || kb.store().sources()).await;
    let sources = match sources {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => {
            tracing::warn!("metrics: the sources could not be read: {e}");
            Vec::new()
        }
        Err(_) => Vec::new(),
    };
    let scraped = crate::metrics::Scraped {
        upstreams: app.tools.upstreams().map(|u| u.status()).unwrap_or_default(),
        sources,
        approvals_pending: 0,
        connections: app.connections.count() as u64,
        mcp_sessions: app.sessions.count().await as u64,
    };
    let mut response = crate::metrics::render(&scraped).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}
