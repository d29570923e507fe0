//! Syncs started through the server (`POST /sources/{name}/sync`, the console's Sources page),
//! each on a blocking thread, with progress anyone with the operator token can watch
//! (`GET /sources/sync`).
//!
//! Each start is in the call log (as `sources/sync`, committed before the sync begins). One
//! sync per source at a time here; a `ctx sync` run at the same moment from a shell is
//! serialized by SQLite's write lock like any two writers. Starting a sync is an operator's act,
//! like deciding an approval: scoped tokens cannot, since a sync re-reads every source (its cost
//! is the server's, not one tool's).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::guard;
use super::openapi::responses::GuardErrors;
use super::respond::{call_error, ok, ApiError};
use super::App;
use crate::kb::sync::{Progress, SourceSummary, SyncOptions};
use crate::tools::{CallError, CallOptions, Observed};
use crate::types::{ErrorCode, SyncJob, SyncJobState, SyncJobs, SyncSummary};

/// The latest sync of each source since the server started.
#[derive(Default)]
pub struct Syncs {
    jobs: Mutex<BTreeMap<String, SyncJob>>,
}

impl Syncs {
    fn snapshot(&self) -> Vec<SyncJob> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<SyncJob> = jobs.values().cloned().collect();
        list.sort_by(|a, b| {
            let running = |j: &SyncJob| j.state != SyncJobState::Running;
            running(a).cmp(&running(b)).then_with(|| b.started_at.cmp(&a.started_at))
        });
        list
    }

    /// Records a new running job for `source`, unless one runs.
    fn begin(&self, source: &str) -> Result<SyncJob, ApiError> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.get(source).is_some_and(|j| j.state == SyncJobState::Running) {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("{source} is already syncing; watch it with GET /sources/sync"),
            ));
        }
        let job = SyncJob {
            source: source.to_string(),
            state: SyncJobState::Running,
            started_at: chrono::Utc::now(),
            finished_at: None,
            seen: 0,
            estimate: None,
            summary: None,
        };
        jobs.insert(source.to_string(), job.clone());
        Ok(job)
    }

    fn update(&self, source: &str, change: impl FnOnce(&mut SyncJob)) {
        if let Some(job) = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).get_mut(source) {
            change(job);
        }
    }
}

/// Syncs started through the server, with their progress.
#[utoipa::path(get, path = "/sources/sync", operation_id = "listSyncs", tag = "operations",
    responses((status = 200, description = "The latest sync of each source since the server started.", body = super::openapi::schemas::SyncJobs),
        (status = 403, description = "A scoped token: syncs are for server.auth_token.", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn list(State(app): State<Arc<App>>, caller: Option<Extension<guard::Caller>>) -> Response {
    if let Err(refused) = operator(&caller) {
        return refused.into_response();
    }
    ok(&serde_json::to_value(SyncJobs { jobs: app.syncs.snapshot() }).unwrap_or_default())
}

/// Starts a sync of one configured source and answers at once (202); watch it with
/// `GET /sources/sync`. The body may be left out, or be `{"full": true}`.
#[utoipa::path(post, path = "/sources/{name}/sync", operation_id = "startSync", tag = "operations",
    params(("name" = String, Path, description = "The source, as type:name (filesystem:docs), as GET /tools/sources lists it.")),
    request_body = ref("#/components/schemas/SyncRequest"),
    responses((status = 202, description = "Started.", body = super::openapi::schemas::SyncJob),
        (status = 400, description = "The body is not a JSON object with at most a boolean full.", body = super::openapi::schemas::Error),
        (status = 403, description = "A scoped token: syncs are for server.auth_token.", body = super::openapi::schemas::Error),
        (status = 404, description = "No configured source of that name.", body = super::openapi::schemas::Error),
        (status = 409, description = "That source is syncing now.", body = super::openapi::schemas::Error),
        GuardErrors))]
pub async fn start(
    State(app): State<Arc<App>>,
    caller: Option<Extension<guard::Caller>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    request: axum::extract::Request,
) -> Response {
    if let Err(refused) = operator(&caller) {
        return refused.into_response();
    }
    let what = "the sync options, {\"full\": true}";
    let body = match super::respond::object_body(&headers, request.into_body(), app.max_body_bytes, what).await {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    if let Some(unknown) = body.keys().find(|k| k.as_str() != "full") {
        let message = format!("unknown field {unknown:?} in the body; a sync takes only full, a boolean");
        return ApiError::new(ErrorCode::BadRequest, message).into_response();
    }
    let full = match body.get("full") {
        None => false,
        Some(serde_json::Value::Bool(full)) => *full,
        Some(_) => return ApiError::new(ErrorCode::BadRequest, "full must be true or false").into_response(),
    };
    let kb = app.tools.current().kb().clone();
    let configured: Vec<String> = kb.configured_sources().into_iter().map(|(n, _)| n).collect();
    if !configured.contains(&name) {
        let known = if configured.is_empty() { "none is configured".to_string() } else { configured.join(", ") };
        let message = format!("no configured source {name:?}; name one as type:name ({known})");
        return ApiError::new(ErrorCode::NotFound, message).into_response();
    }
    // A sync changes the index: like a tool call that may change something, it is in the call
    // log (as `sources/sync`), committed, before it starts, and does not start when the log
    // cannot take it.
    let registry = app.tools.current();
    let params = serde_json::json!({ "source": name, "full": full });
    let options = CallOptions { caller: "rest", ..Default::default() };
    let mut observed = Observed::start(registry.state(), "sources/sync", &params, &options);
    if let Err(e) = observed.must_be_logged() {
        let e = CallError::AuditUnavailable(e.to_string().replace("tool 'sources/sync'", "the sync"));
        let response = call_error(&e);
        observed.finish(Err(&e));
        return response;
    }
    let job = match app.syncs.begin(&name) {
        Ok(job) => job,
        // Nothing started: nothing to log.
        Err(refused) => {
            observed.forget();
            return refused.into_response();
        }
    };
    if let Some(commit) = observed.finish_logged(Ok(serde_json::json!({ "started": true }))) {
        if !matches!(commit.await, Ok(true)) {
            app.syncs.update(&name, |job| {
                job.state = SyncJobState::Failed;
                job.finished_at = Some(chrono::Utc::now());
            });
            let e = CallError::AuditUnavailable(
                "the sync did not start: its entry could not be written to the tool-call log".to_string(),
            );
            return call_error(&e);
        }
    }
    tracing::info!(source = %name, full, "sync started through the server");
    let syncs = Arc::clone(&app.syncs);
    let source = name.clone();
    tokio::task::spawn_blocking(move || {
        let options = SyncOptions { full, ..SyncOptions::default() };
        let mut progress = |event: Progress<'_>| match event {
            Progress::Start { estimate, .. } => syncs.update(&source, |j| j.estimate = estimate.map(|e| e as u64)),
            Progress::Item { seen, .. } => syncs.update(&source, |j| j.seen = seen as u64),
            _ => {}
        };
        // A panic in a connector must not leave the job running forever (every later start
        // would be refused as already syncing).
        let ended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::kb::sync::sync_target(&kb, &source, options, &mut progress)
        }));
        let summary = match ended {
            Ok(Ok(mut summaries)) if !summaries.is_empty() => summaries.remove(0),
            Ok(Ok(_)) => SourceSummary { error: Some("the source was not synced".to_string()), ..Default::default() },
            Ok(Err(e)) => SourceSummary { error: Some(e.to_string()), ..Default::default() },
            Err(_) => SourceSummary {
                error: Some("the sync stopped on an internal error; the server log has the details".to_string()),
                ..Default::default()
            },
        };
        if let Some(error) = &summary.error {
            tracing::warn!(source = %source, "sync through the server failed: {error}");
        }
        syncs.update(&source, |job| {
            job.state = if summary.error.is_some() { SyncJobState::Failed } else { SyncJobState::Done };
            job.finished_at = Some(chrono::Utc::now());
            job.summary = Some(summary_of(&summary));
        });
    });
    let mut response = ok(&serde_json::to_value(job).unwrap_or_default());
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

fn summary_of(s: &SourceSummary) -> SyncSummary {
    SyncSummary {
        added: s.added as u64,
        updated: s.updated as u64,
        deleted: s.deleted as u64,
        unchanged: s.unchanged as u64,
        skipped: s.skipped as u64,
        errors: s.errors as u64,
        error: s.error.clone(),
        embedded: Some(s.embedded as u64),
        embed_error: s.embed_error.clone(),
        seconds: s.seconds,
    }
}

/// Syncs are the operator's: not for a scoped token.
fn operator(caller: &Option<Extension<guard::Caller>>) -> Result<(), ApiError> {
    if caller.as_ref().is_some_and(|Extension(guard::Caller(p))| p.is_some()) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "syncs are started by the operator: use server.auth_token (or ctx sync on the server's machine)",
        ));
    }
    Ok(())
}
