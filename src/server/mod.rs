//! The HTTP server: REST over the tool registry, the OpenAPI document and Swagger UI.
//!
//! Handlers are thin: they read the body and call [`Tools::call`], the one call path, which
//! validates, runs and maps errors. Nothing here validates parameters on its own.

mod guard;
mod listen;
pub mod openapi;
mod respond;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Extension, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value as Json};

pub use guard::Security;
pub use listen::{ConnectionLimits, Connections};
use respond::{call_error, json_body, ok, ApiError};

use tokio_util::sync::CancellationToken;

use crate::mcp::sessions::{SessionLimits, Sessions, SharedSessions};
use crate::mcp::Mcp;
use crate::tools::{CallOptions, Output, Tools};
use crate::types::{ErrorCode, Health, HealthStatus, LoadProblem, LoadProblemKind, ServerLoad};

/// How long in-flight requests may take to finish after a shutdown signal.
pub const GRACE: Duration = Duration::from_secs(10);

/// The limits of a running server (`[server]` in the config).
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    pub connections: ConnectionLimits,
    pub sessions: SessionLimits,
}

impl Limits {
    pub fn from_config(server: &crate::types::ServerConfig) -> Limits {
        let secs = Duration::from_secs;
        Limits {
            connections: ConnectionLimits {
                max_connections: server.max_connections as usize,
                header_timeout: secs(server.header_timeout_secs),
                idle_timeout: secs(server.idle_timeout_secs),
            },
            sessions: SessionLimits {
                max_sessions: server.max_mcp_sessions as usize,
                idle: secs(server.mcp_session_idle_secs),
            },
        }
    }
}

/// Everything a running server shares.
pub struct App {
    pub tools: Arc<Tools>,
    pub security: Arc<Security>,
    pub max_body_bytes: usize,
    /// The MCP handler behind `/mcp` (it tells clients when the tool list changes).
    pub mcp: Mcp,
    /// Cancelled when shutdown begins, so MCP streams close and in-flight calls can finish.
    pub shutdown: CancellationToken,
    pub limits: Limits,
    /// MCP sessions of `/mcp`.
    pub sessions: SharedSessions,
    /// Open connections (filled by [`run`]).
    pub connections: Arc<Connections>,
}

impl App {
    pub fn new(tools: Arc<Tools>, security: Security, max_body_bytes: usize) -> App {
        App::with_mcp(Mcp::new(Arc::clone(&tools)), security, max_body_bytes)
    }

    pub fn with_mcp(mcp: Mcp, security: Security, max_body_bytes: usize) -> App {
        let limits = Limits::default();
        App {
            tools: Arc::clone(mcp.tools()),
            security: Arc::new(security),
            max_body_bytes,
            mcp,
            shutdown: CancellationToken::new(),
            limits,
            sessions: Arc::new(Sessions::new(limits.sessions)),
            connections: Default::default(),
        }
    }

    /// Replaces the default limits.
    pub fn with_limits(mut self, limits: Limits) -> App {
        self.limits = limits;
        self.sessions = Arc::new(Sessions::new(limits.sessions));
        self
    }
}

/// The router with every route, guard and error mapping.
pub fn router(app: Arc<App>) -> Router {
    let security = Arc::clone(&app.security);
    let cors = security.cors();
    let mcp = app.mcp.http_route(&security, app.max_body_bytes, Arc::clone(&app.sessions), app.shutdown.child_token());
    let mut router = Router::new()
        .route_service("/mcp", mcp)
        .route("/health", get(health))
        .route("/tools/list", get(list))
        .route("/tools/sources", get(sources).post(call))
        .route("/tools/{name}", post(call))
        .route("/agents/list", get(agents_list))
        .route("/agents/{name}/prompt", post(agent_prompt))
        .route("/openapi.json", get(openapi_json))
        .route("/docs", get(docs_redirect))
        .route("/docs/", get(docs_index))
        .route("/docs/{*file}", get(docs_file))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(security, guard::check));
    if let Some(cors) = cors {
        router = router.layer(cors);
    }
    router.layer(tower_http::catch_panic::CatchPanicLayer::custom(panicked))
}

/// Serves on an already-bound listener until `shutdown` resolves, then lets in-flight requests
/// finish for up to [`GRACE`].
pub async fn run(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stopping = CancellationToken::new();
    let serving = listen::serve(
        listener,
        router(Arc::clone(&app)),
        app.limits.connections,
        Arc::clone(&app.connections),
        stopping.clone(),
    );
    let mut serving = tokio::spawn(serving);
    tokio::select! {
        ended = &mut serving => return ended.map_err(std::io::Error::other),
        _ = shutdown => {}
    }
    // Open MCP streams (GET /mcp, listen) would hold graceful shutdown forever.
    app.shutdown.cancel();
    stopping.cancel();
    match tokio::time::timeout(GRACE, serving).await {
        Ok(ended) => ended.map_err(std::io::Error::other),
        Err(_) => {
            tracing::warn!("requests still running {} s after shutdown began; stopping anyway", GRACE.as_secs());
            Ok(())
        }
    }
}

/// The address a config asks for, and the security settings it implies.
pub fn settings(config: &crate::config::Config) -> Result<(SocketAddr, Security), String> {
    let server = &config.spec.server;
    let bind = server.bind.as_str();
    let addr: SocketAddr = bind
        .parse()
        .map_err(|_| format!("server.bind {bind:?} is not an address: use host:port, for example 127.0.0.1:7391"))?;
    let token = server.auth_token.as_ref().map(|t| t.to_string());
    let origins = server.allowed_origins.iter().map(|o| o.to_string()).collect();
    Ok((addr, Security::new(addr, token, origins)?))
}

/// Anyone may ask whether the server is up. With `server.auth_token` set, only a caller with
/// the token learns more than the status and how many scripts failed: load errors can quote
/// script source.
async fn health(State(app): State<Arc<App>>, authorized: Option<Extension<guard::Authorized>>) -> Response {
    let registry = app.tools.current();
    let mut problems = registry.problems().to_vec();
    // Calls abandoned past their deadline (the sandbox's last line of defence) hold a thread and
    // keep their tool quarantined until they end.
    for run in crate::tools::stuck::all() {
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
    let status = if problems.is_empty() { HealthStatus::Ok } else { HealthStatus::Degraded };
    let problem_count = problems.len() as u64;
    let full = authorized.is_some_and(|Extension(guard::Authorized(yes))| yes);
    let body = if full {
        Health {
            status,
            problem_count,
            version: Some(env!("CARGO_PKG_VERSION").to_string()),
            tools: Some(registry.specs().count() as u64),
            agents: Some(registry.agents().count() as u64),
            problems,
            config,
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
            config: None,
            load: None,
        }
    };
    ok(&serde_json::to_value(body).unwrap_or(Json::Null))
}

async fn list(State(app): State<Arc<App>>) -> Response {
    ok(&serde_json::to_value(app.tools.current().listing()).unwrap_or(Json::Null))
}

async fn sources(State(app): State<Arc<App>>) -> Response {
    respond(&app, "sources", json!({})).await
}

async fn call(
    State(app): State<Arc<App>>,
    name: Option<Path<String>>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    let name = name.map(|Path(n)| n).unwrap_or_else(|| "sources".to_string());
    let params = match json_body(&headers, request.into_body(), app.max_body_bytes).await {
        Ok(params) => params,
        Err(e) => return e.into_response(),
    };
    respond(&app, &name, params).await
}

/// Calls the tool; built-ins answer with their own body, Lua tools with `{"result": ...}`.
async fn respond(app: &App, name: &str, params: Json) -> Response {
    let builtin = crate::tools::BUILTINS.contains(&name);
    let options = CallOptions { caller: "rest", ..Default::default() };
    match app.tools.call(name.to_string(), params, options).await {
        Ok(Output::Value(value)) if builtin => ok(&value),
        Ok(output) => ok(&output.rest_body()),
        Err(e) => call_error(&e),
    }
}

async fn agents_list(State(app): State<Arc<App>>) -> Response {
    ok(&serde_json::to_value(app.tools.current().agent_listing()).unwrap_or(Json::Null))
}

/// `POST /agents/{name}/prompt` with `{"arguments": {...}}` (an empty body means none).
async fn agent_prompt(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    let body = match json_body(&headers, request.into_body(), app.max_body_bytes).await {
        Ok(body) => body,
        Err(e) => return e.into_response(),
    };
    let arguments = match body {
        Json::Object(mut fields) => {
            let arguments = fields.remove("arguments").unwrap_or(Json::Null);
            if let Some(extra) = fields.keys().next() {
                let message =
                    format!("unknown field '{extra}': the body is {{\"arguments\": {{\"name\": \"value\"}}}}");
                return ApiError::new(ErrorCode::BadRequest, message).into_response();
            }
            arguments
        }
        _ => {
            let message = "the body must be a JSON object: {\"arguments\": {\"name\": \"value\"}}";
            return ApiError::new(ErrorCode::BadRequest, message).into_response();
        }
    };
    let options = CallOptions { caller: "rest", ..Default::default() };
    match app.tools.prompt(name, arguments, options).await {
        Ok(prompt) => ok(&serde_json::to_value(prompt).unwrap_or(Json::Null)),
        Err(e) => call_error(&e),
    }
}

async fn openapi_json(State(app): State<Arc<App>>) -> Response {
    ok(&openapi::document(Some(&app.tools.current())))
}

fn swagger_config() -> Arc<utoipa_swagger_ui::Config<'static>> {
    static CONFIG: std::sync::OnceLock<Arc<utoipa_swagger_ui::Config<'static>>> = std::sync::OnceLock::new();
    Arc::clone(
        CONFIG.get_or_init(|| Arc::new(utoipa_swagger_ui::Config::from("/openapi.json").try_it_out_enabled(true))),
    )
}

/// The UI's assets are relative links, so the page must be served from `/docs/`.
async fn docs_redirect() -> Response {
    axum::response::Redirect::permanent("/docs/").into_response()
}

async fn docs_index() -> Response {
    swagger("")
}

async fn docs_file(Path(file): Path<String>) -> Response {
    swagger(&file)
}

fn swagger(file: &str) -> Response {
    match utoipa_swagger_ui::serve(file, swagger_config()) {
        Ok(Some(found)) => {
            let mut response = Response::new(Body::from(found.bytes.into_owned()));
            if let Ok(value) = HeaderValue::from_str(&found.content_type) {
                response.headers_mut().insert(header::CONTENT_TYPE, value);
            }
            if found.gzpipped {
                response.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            response
        }
        Ok(None) => {
            ApiError::new(ErrorCode::NotFound, format!("no such file in the API docs: /docs/{file}")).into_response()
        }
        Err(e) => {
            tracing::error!("swagger ui: {e}");
            ApiError::new(ErrorCode::Internal, "the API docs failed to load; the server log has the details")
                .into_response()
        }
    }
}

async fn not_found(request: Request) -> Response {
    let path = request.uri().path().to_string();
    ApiError::new(ErrorCode::NotFound, format!("no route {path}; see GET /tools/list for tools and /docs for the API"))
        .into_response()
}

async fn method_not_allowed(request: Request) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let hint =
        if path.starts_with("/tools/") && path != "/tools/list" { "use POST with a JSON body" } else { "use GET" };
    let mut response = ApiError::new(ErrorCode::MethodNotAllowed, format!("{method} is not allowed on {path}; {hint}"))
        .into_response();
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}

fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked; the server keeps serving");
    ApiError::new(
        ErrorCode::Internal,
        "ctx hit an internal error while handling this request; the server log has the details",
    )
    .into_response()
}
