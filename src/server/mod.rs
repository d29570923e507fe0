//! The HTTP server: REST over the tool registry (`rest`), MCP at `/mcp`, the OpenAPI document
//! and Swagger UI (`docs`), behind one guard (`guard`) and one accept loop (`listen`).

mod chat;
mod console;
mod docs;
mod guard;
mod listen;
pub mod openapi;
mod ops;
mod respond;
mod rest;
mod syncs;
pub mod tasks;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use guard::{Caller, NamedToken, Security};
pub use listen::{ConnectionLimits, Connections};
pub use ops::decide_in as decide_approval;
use respond::ApiError;

use tokio_util::sync::CancellationToken;

use crate::mcp::sessions::{SessionLimits, Sessions, SharedSessions};
use crate::mcp::Mcp;
use crate::tools::Tools;
use crate::types::ErrorCode;

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
                body_timeout: secs(server.body_timeout_secs),
                body_min_rate: u64::try_from(server.body_min_bytes_per_sec).unwrap_or(0),
                per_token: server.max_connections_per_token.map(|n| n as usize),
                per_address: server.max_connections_per_address.map(|n| n as usize),
            },
            sessions: SessionLimits {
                max_sessions: server.max_mcp_sessions as usize,
                per_token: server.max_mcp_sessions_per_token.map(|n| n as usize),
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
    /// Syncs started through the server, with their progress.
    pub syncs: Arc<syncs::Syncs>,
    /// The background filler of missing vectors, when the server runs one.
    pub filler: Option<Arc<crate::kb::filler::Filler>>,
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
            syncs: Default::default(),
            filler: None,
        }
    }

    /// Shows `filler`'s progress in `/health`, and wakes it after a sync started here.
    pub fn with_filler(mut self, filler: Arc<crate::kb::filler::Filler>) -> App {
        self.filler = Some(filler);
        self
    }

    /// Replaces the default limits.
    pub fn with_limits(mut self, limits: Limits) -> App {
        self.limits = limits;
        self.sessions = Arc::new(Sessions::new(limits.sessions));
        self
    }
}

/// Every REST route with its OpenAPI operation. `routes!` takes only handlers that carry
/// `#[utoipa::path]`, so a REST route cannot be added here without its documentation.
pub(crate) fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(rest::health))
        .routes(routes!(rest::list_tools))
        .routes(routes!(rest::search))
        .routes(routes!(rest::get_document))
        .routes(routes!(rest::sources, rest::sources_post))
        .routes(routes!(rest::call_tool))
        .routes(routes!(rest::list_agents))
        .routes(routes!(rest::agent_prompt))
        .routes(routes!(ops::calls))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::approvals))
        .routes(routes!(ops::approve))
        .routes(routes!(ops::deny))
        .routes(routes!(syncs::list))
        .routes(routes!(syncs::start))
        .routes(routes!(tasks::list))
        .routes(routes!(tasks::get, tasks::cancel))
        .routes(routes!(tasks::result))
        .routes(routes!(chat::info, chat::turn))
        .routes(routes!(docs::openapi_json))
}

/// The router with every route, guard and error mapping.
pub fn router(app: Arc<App>) -> Router {
    let security = Arc::clone(&app.security);
    let cors = security.cors();
    let mcp = app.mcp.http_route(
        &security.allowed_origins,
        app.max_body_bytes,
        Arc::clone(&app.sessions),
        app.shutdown.child_token(),
    );
    let (api, _) = routes().split_for_parts();
    // Outside the REST document: the MCP endpoint (its contract is the MCP specification) and
    // the pages of Swagger UI.
    let mut router = api
        .route_service("/mcp", mcp)
        .route("/docs", get(docs::bare_index))
        .route("/docs/", get(docs::index))
        .route("/docs/{*file}", get(docs::file))
        .route("/console", get(console::bare))
        .route("/console/", get(console::index))
        .route("/console/login", get(console::login_page).post(console::login))
        .route("/console/logout", axum::routing::post(console::logout))
        .route("/console/{file}", get(console::file))
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
    let mut tokens = Vec::with_capacity(server.tokens.len());
    for entry in &server.tokens {
        let patterns: Vec<String> = entry.tools.iter().map(|t| t.to_string()).collect();
        let principal = crate::tools::Principal::new(entry.name.as_str(), &patterns)
            .map_err(|e| format!("[[server.tokens]] {:?}: {e}", entry.name.as_str()))?;
        let principal = principal.approving_own_calls(entry.approve_own_calls);
        tokens.push(guard::NamedToken { principal: Arc::new(principal), token: entry.token.to_string() });
    }
    Ok((addr, Security::with_tokens(addr, token, tokens, origins)?))
}

async fn not_found(request: Request) -> Response {
    let path = request.uri().path().to_string();
    ApiError::new(ErrorCode::NotFound, format!("no route {path}; see GET /tools/list for tools and /docs for the API"))
        .into_response()
}

/// 405 with the methods the path takes, in the message and in `Allow`.
async fn method_not_allowed(request: Request) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    // The Swagger UI pages and the console are the only routes outside the document.
    let allowed = match path.as_str() {
        "/console/logout" => vec!["POST"],
        "/console/login" => vec!["GET", "HEAD", "POST"],
        _ => openapi::methods_for(&path).unwrap_or_else(|| vec!["GET", "HEAD"]),
    };
    let usable: Vec<&str> = allowed.iter().copied().filter(|m| *m != "HEAD").collect();
    let hint = match usable.as_slice() {
        ["POST"] => "use POST with a JSON body".to_string(),
        [one] => format!("use {one}"),
        many => format!("use {}", many.join(" or ")),
    };
    let mut response = ApiError::new(ErrorCode::MethodNotAllowed, format!("{method} is not allowed on {path}; {hint}"))
        .into_response();
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    if let Ok(value) = HeaderValue::from_str(&allowed.join(", ")) {
        response.headers_mut().insert(header::ALLOW, value);
    }
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
