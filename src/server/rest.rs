//! The REST routes over the tool registry, each declared with its OpenAPI operation.
//!
//! Handlers are thin: they read the body and call [`Tools::call`] or [`Tools::prompt`], the one
//! call path, which validates, runs and maps errors. Nothing here validates parameters on its
//! own. Every handler carries `#[utoipa::path]`, and [`super::routes`] mounts handlers only
//! through `utoipa_axum::routes!`, so a REST route without its documentation cannot exist.

use std::sync::Arc;

use axum::extract::{Extension, Path, Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value as Json};

use super::guard;
use super::openapi::responses::{CallErrors, GuardErrors};
use super::openapi::schemas::{
    AgentName, AgentPrompt, AgentsList, Document, GetRequest, Health as HealthSchema, SearchRequest, SearchResponse,
    SourcesResponse, ToolAnswer, ToolName, ToolsList,
};
use super::respond::{call_error, object_body, ok, ApiError};
use super::App;
use crate::tools::{CallError, CallOptions, Output};
use crate::types::{
    ErrorCode, ErrorDetail, Health, HealthStatus, LoadProblem, LoadProblemKind, ServerLoad, UpstreamHealth,
};

/// Liveness and load problems. Needs no token.
///
/// With `server.auth_token` set, a caller without the token learns only the status and how
/// many scripts failed: load errors can quote script source.
#[utoipa::path(get, path = "/health", operation_id = "health", tag = "server", security(()),
    responses((status = 200, description = "Up.", body = HealthSchema)))]
pub async fn health(
    State(app): State<Arc<App>>,
    authorized: Option<Extension<guard::Authorized>>,
    caller: Option<Extension<guard::Caller>>,
) -> Response {
    let registry = app.tools.current();
    let mut problems = registry.problems().to_vec();
    // Calls abandoned past their deadline (the sandbox's last line of defence) hold a thread and
    // keep their tool quarantined until they end.
    for run in registry.state().quarantine.all() {
        problems.push(LoadProblem {
            kind: LoadProblemKind::Tool,
            name: run.tool.clone(),
            message: format!(
                "a call of {} overran its deadline inside a library call {:.0} s ago and is still running; it is quarantined until that call ends or its script is edited",
                run.tool,
                run.since.elapsed().as_secs_f64()
            ),
        });
    }
    // A refused edit of the config file is a problem too: the server runs an older config
    // than the one on disk.
    let config = app.tools.config_status();
    if let Some(refused) = config.as_ref().and_then(|c| c.refused.as_ref()) {
        let file = config.as_ref().map(|c| c.file.clone()).unwrap_or_default();
        let message = format!("edit refused, still running the last good config: {}", refused.problems.join("; "));
        problems.push(LoadProblem { kind: LoadProblemKind::Config, name: file, message });
    }
    let database = database_health(registry.state().db.as_ref()).await;
    let database_down = database.status == crate::types::DatabaseHealthStatus::Unavailable;
    let status = if problems.is_empty() && !database_down { HealthStatus::Ok } else { HealthStatus::Degraded };
    let problem_count = problems.len() as u64;
    let full = authorized.is_some_and(|Extension(guard::Authorized(yes))| yes);
    let scoped = principal(&caller);
    let body = if let (true, Some(principal)) = (full, scoped.as_deref()) {
        // A scoped token sees only what it may use: its tools and agents, and the problems of
        // those; not the upstream servers (processes, calls, latency), the config or the load.
        let mine = |name: &str| principal.allows(name);
        let problems: Vec<LoadProblem> = problems.into_iter().filter(|p| mine(&p.name)).collect();
        Health {
            status,
            problem_count,
            version: Some(env!("CARGO_PKG_VERSION").to_string()),
            tools: Some(registry.specs_for(Some(principal)).count() as u64),
            agents: Some(registry.agents_for(Some(principal)).count() as u64),
            problems,
            upstreams: Vec::new(),
            embedding: None,
            config: None,
            database: None,
            load: None,
        }
    } else if full {
        Health {
            status,
            problem_count,
            version: Some(env!("CARGO_PKG_VERSION").to_string()),
            tools: Some(registry.specs().count() as u64),
            agents: Some(registry.agents().count() as u64),
            problems,
            upstreams: upstream_health(&app.tools),
            embedding: app.filler.as_ref().and_then(|f| embedding_health(&f.progress())),
            config,
            database: Some(database),
            load: Some(ServerLoad {
                connections: app.connections.count() as u64,
                mcp_sessions: app.sessions.count().await as u64,
                tasks: tokio::runtime::Handle::current().metrics().num_alive_tasks() as u64,
            }),
        }
    } else {
        Health {
            status,
            problem_count,
            version: None,
            tools: None,
            agents: None,
            problems: Vec::new(),
            upstreams: Vec::new(),
            embedding: None,
            config: None,
            database: None,
            load: None,
        }
    };
    ok(&serde_json::to_value(body).unwrap_or(Json::Null))
}

/// How long `/health` waits for the shared database: a load balancer's probe must not hang on
/// a database that went silent.
const DATABASE_PROBE: std::time::Duration = std::time::Duration::from_secs(1);

/// The backend of the server's state and, for PostgreSQL, whether it answers now.
async fn database_health(shared: Option<&crate::db::Shared>) -> crate::types::DatabaseHealth {
    use crate::types::{DatabaseHealth, DatabaseHealthBackend as B, DatabaseHealthStatus as S};
    let Some(shared) = shared else {
        return DatabaseHealth { backend: B::Sqlite, status: S::Ok, replica: None, database: None, error: None };
    };
    let probed = shared.pg.probe(DATABASE_PROBE).await;
    DatabaseHealth {
        backend: B::Postgres,
        status: if probed.is_ok() { S::Ok } else { S::Unavailable },
        replica: Some(shared.replica.to_string()),
        database: Some(shared.pg.url().to_string()),
        error: probed.err(),
    }
}

/// The configured model's vectors and their background filling, for `/health`.
fn embedding_health(progress: &crate::kb::filler::Progress) -> Option<crate::types::EmbeddingHealth> {
    Some(crate::types::EmbeddingHealth {
        model: progress.model.clone()?,
        chunks: progress.chunks,
        embedded: progress.embedded,
        pending: progress.chunks.saturating_sub(progress.embedded),
        filling: progress.filling,
        chunks_per_sec: progress.rate,
        last_error: progress.last_error.clone(),
    })
}

/// Each upstream MCP server's state, for `/health`.
fn upstream_health(tools: &crate::tools::Tools) -> Vec<UpstreamHealth> {
    let Some(upstreams) = tools.upstreams() else { return Vec::new() };
    use crate::types::{UpstreamHealthState as S, UpstreamHealthTransport as T};
    use crate::upstream::State;
    let health = |status: crate::upstream::Status| UpstreamHealth {
        transport: if status.transport == "http" { T::Http } else { T::Stdio },
        state: match status.state {
            State::Connecting => S::Connecting,
            State::Ready => S::Ready,
            State::Restarting => S::Restarting,
            State::CrashLooping => S::CrashLooping,
            State::Disabled => S::Disabled,
        },
        tools: status.tools as u64,
        restarts: status.restarts,
        attempt: status.attempt as u64,
        last_error: status.last_error,
        latency_p50_ms: status.latency_p50_ms,
        calls: status.calls,
        pid: status.pid.map(u64::from),
        name: status.name,
    };
    upstreams.status().into_iter().map(health).collect()
}

/// Every tool with its parameter schema: built-ins first, then by name.
#[utoipa::path(get, path = "/tools/list", operation_id = "listTools", tag = "tools",
    responses((status = 200, description = "The tools.", body = ToolsList), GuardErrors))]
pub async fn list_tools(State(app): State<Arc<App>>, caller: Option<Extension<guard::Caller>>) -> Response {
    let listing = app.tools.current().listing_for(principal(&caller).as_deref());
    ok(&serde_json::to_value(listing).unwrap_or(Json::Null))
}

/// Whom the request's calls are made for (see [`guard::Caller`]).
fn principal(caller: &Option<Extension<guard::Caller>>) -> Option<Arc<crate::tools::Principal>> {
    caller.as_ref().and_then(|Extension(guard::Caller(p))| p.clone())
}

/// Search the knowledge base.
#[utoipa::path(post, path = "/tools/search", operation_id = "search", tag = "tools",
    request_body = SearchRequest,
    responses((status = 200, description = "The hits, best first.", body = SearchResponse), CallErrors))]
pub async fn search(
    State(app): State<Arc<App>>,
    caller: Option<Extension<guard::Caller>>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    call_with_body(&app, principal(&caller), "search", &headers, request).await
}

/// Fetch one document with its chunks.
#[utoipa::path(post, path = "/tools/get", operation_id = "getDocument", tag = "tools",
    request_body = GetRequest,
    responses((status = 200, description = "The document.", body = Document), CallErrors))]
pub async fn get_document(
    State(app): State<Arc<App>>,
    caller: Option<Extension<guard::Caller>>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    call_with_body(&app, principal(&caller), "get", &headers, request).await
}

/// Sources with health, counts and last sync.
#[utoipa::path(get, path = "/tools/sources", operation_id = "listSources", tag = "tools",
    responses((status = 200, description = "The sources.", body = SourcesResponse), CallErrors))]
pub async fn sources(State(app): State<Arc<App>>, caller: Option<Extension<guard::Caller>>) -> Response {
    respond(&app, principal(&caller), "sources", json!({}), None).await
}

/// Sources with health, counts and last sync (the tool-call form; it takes no parameters).
#[utoipa::path(post, path = "/tools/sources", operation_id = "listSourcesPost", tag = "tools",
    responses((status = 200, description = "The sources.", body = SourcesResponse), CallErrors))]
pub async fn sources_post(
    State(app): State<Arc<App>>,
    caller: Option<Extension<guard::Caller>>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    call_with_body(&app, principal(&caller), "sources", &headers, request).await
}

/// Call a tool by name with its parameters.
///
/// A Lua tool, an upstream server's tool or a code-mode tool answers `{"result": ...}`. The
/// built-in tools (search, get, sources) answer the bodies of their own operations, which are
/// the same routes. Each loaded Lua tool also has an operation of its own, `POST /tools/<its
/// name>`, with its parameter schema. The body may be left out when the tool has no required
/// parameter; when sent, it is a JSON object (`null` is refused).
///
/// With `Prefer: respond-async` the call runs as a task: 202 with the task (`Location:
/// /tasks/{id}`), whose result `GET /tasks/{id}/result` answers once it ended. With `Accept:
/// text/event-stream` it also runs as a task, and the answer streams its events: `task` (the
/// handle), `progress`, `status` (waiting for approval, or going on), then `result` (the body
/// this route answers with 200) or `error` (the error envelope).
// The body is optional. A typed `request_body = T` would mark it required and `Option<T>`
// would offer `null` as a body, so the component is named by reference, which leaves
// `requestBody.required` out (false). A test checks that every reference resolves.
#[utoipa::path(post, path = "/tools/{name}", operation_id = "callTool", tag = "tools",
    params(("name" = inline(ToolName), Path, description = "The tool's name, as listed by GET /tools/list."),
        ("Prefer" = Option<String>, Header, description = "respond-async: run the call as a task and answer 202 with it (Location: /tasks/{id}) at once."),
        ("Accept" = Option<String>, Header, description = "text/event-stream: run the call as a task and stream its events (task, progress, status, then result or error) as server-sent events.")),
    request_body = ref("#/components/schemas/ToolCallRequest"),
    responses((status = 200, description = "What the tool returned: {result} for a Lua, upstream or code-mode tool, a built-in's own body for search, get and sources.", body = inline(ToolAnswer)), CallErrors))]
pub async fn call_tool(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    caller: Option<Extension<guard::Caller>>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    call_with_body(&app, principal(&caller), &name, &headers, request).await
}

async fn call_with_body(
    app: &App,
    principal: Option<Arc<crate::tools::Principal>>,
    name: &str,
    headers: &HeaderMap,
    request: Request,
) -> Response {
    let approval = headers.get(APPROVAL_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
    match object_body(headers, request.into_body(), app.max_body_bytes, "the tool's parameters by name").await {
        Ok(params) => {
            let (events, deferred) = (super::tasks::wants_events(headers), super::tasks::wants_async(headers));
            if events || deferred {
                let options = CallOptions { caller: "rest", principal, approval, ..Default::default() };
                return super::tasks::start(app, name, Json::Object(params), options, events).await;
            }
            respond(app, principal, name, Json::Object(params), approval).await
        }
        Err(e) => e.into_response(),
    }
}

/// The header that carries an approved call's token.
const APPROVAL_HEADER: &str = "ctx-approval";

/// Calls the tool; built-ins answer with their own body, Lua tools with `{"result": ...}`.
async fn respond(
    app: &App,
    principal: Option<Arc<crate::tools::Principal>>,
    name: &str,
    params: Json,
    approval: Option<String>,
) -> Response {
    let builtin = crate::tools::BUILTINS.contains(&name);
    let options = CallOptions { caller: "rest", principal, approval, ..Default::default() };
    match app.tools.call(name.to_string(), params, options).await {
        Ok(Output::Value(value)) if builtin => ok(&value),
        Ok(output) => ok(&output.rest_body()),
        Err(e) => call_error(&e),
    }
}

/// Every agent: inline ones first, then Lua ones, each by name.
#[utoipa::path(get, path = "/agents/list", operation_id = "listAgents", tag = "agents",
    responses((status = 200, description = "The agents.", body = AgentsList), GuardErrors))]
pub async fn list_agents(State(app): State<Arc<App>>, caller: Option<Extension<guard::Caller>>) -> Response {
    let principal = principal(&caller);
    ok(&serde_json::to_value(app.tools.current().agent_listing(principal.as_deref())).unwrap_or(Json::Null))
}

/// Resolve an agent's prompt: system prompt, opening messages and tools.
///
/// The body is the arguments object itself, `{"service": "payments"}`, the same shape as
/// `POST /tools/{name}`. It may be left out when the agent has no required argument. Each agent
/// also has an operation of its own, `POST /agents/<its name>/prompt`, with its arguments.
// The body is optional. A typed `request_body = T` would mark it required and `Option<T>`
// would offer `null` as a body, so the component is named by reference, which leaves
// `requestBody.required` out (false). A test checks that every reference resolves.
#[utoipa::path(post, path = "/agents/{name}/prompt", operation_id = "agentPrompt", tag = "agents",
    params(("name" = inline(AgentName), Path, description = "The agent's name, as listed by GET /agents/list.")),
    request_body = ref("#/components/schemas/AgentPromptRequest"),
    responses((status = 200, description = "The resolved prompt.", body = AgentPrompt), CallErrors))]
pub async fn agent_prompt(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    caller: Option<Extension<guard::Caller>>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    let what = "the agent's arguments by name, for example {\"service\": \"payments\"}";
    let arguments = match object_body(&headers, request.into_body(), app.max_body_bytes, what).await {
        Ok(arguments) => arguments,
        Err(e) => return e.into_response(),
    };
    let principal = principal(&caller);
    if let Some(refusal) = wrapped_arguments(&app, &name, &arguments, principal.as_deref()) {
        return refusal.into_response();
    }
    let options = CallOptions { caller: "rest", principal, ..Default::default() };
    match app.tools.prompt(name, Json::Object(arguments), options).await {
        Ok(prompt) => ok(&serde_json::to_value(prompt).unwrap_or(Json::Null)),
        // The checker names fields as MCP's `prompts/get` holds them (`/arguments/service`); here
        // the body is the arguments object, so each path points into the body as sent.
        Err(CallError::InvalidArguments { agent, problems }) => {
            let problems = problems.into_iter().map(in_body).collect();
            call_error(&CallError::InvalidArguments { agent, problems })
        }
        Err(e) => call_error(&e),
    }
}

/// The form that ctx took before the body became the arguments object: `{"arguments": {...}}`.
/// Refused with what to send instead, unless the agent declares an argument named `arguments`
/// (then the body means just that).
fn wrapped_arguments(
    app: &App,
    agent: &str,
    body: &Map<String, Json>,
    principal: Option<&crate::tools::Principal>,
) -> Option<ApiError> {
    let Some(Json::Object(inner)) = body.get("arguments") else { return None };
    if body.len() != 1 {
        return None;
    }
    let registry = app.tools.current();
    // An agent out of the caller's scope is left to the one path, which answers "unknown".
    let spec = registry.agents_for(principal).find(|a| a.name == agent)?;
    if spec.arguments.iter().any(|a| a.name.as_str() == "arguments") {
        return None;
    }
    let example = serde_json::to_string(inner).unwrap_or_else(|_| "{}".into());
    Some(ApiError::new(
        ErrorCode::BadRequest,
        format!(
            "the body is the arguments object itself, as for POST /tools/{{name}}: send {example}, not {{\"arguments\": {example}}}"
        ),
    ))
}

fn in_body(detail: ErrorDetail) -> ErrorDetail {
    match detail.path.strip_prefix("/arguments") {
        Some(rest) if rest.starts_with('/') => ErrorDetail { path: rest.to_string(), ..detail },
        _ => detail,
    }
}
