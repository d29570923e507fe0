//! A direct route for the most common MCP request: a stateless (2026-07-28) `tools/call`.
//!
//! rmcp builds a handler, a service and a task for every stateless request, which costs as much
//! as the tool call itself. A POST that is plainly such a call (the version, method and name
//! headers agree with the body, no session, no `Mcp-Param-*` headers, no Origin, JSON in, JSON
//! and SSE accepted, `_meta` holding only the version, capabilities and client info, and no
//! progress token) is answered here through [`Tools::call`], whatever its outcome (a protocol
//! error, an approval question, a result), with the body rmcp would send: a test sends the same
//! calls both ways and compares the bytes. The call enters the pipeline once, here; it is never
//! handed on to rmcp after that. Every other request goes to rmcp unchanged.
//!
//! The route also answers the refusals rmcp cannot word well: a JSON-RPC batch (see `batch.rs`)
//! and an `initialize` over the session cap or over a scoped token's share of it (see
//! `sessions.rs`), and it records which token opened each session.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Method, Request, Response, StatusCode};
use rmcp::transport::streamable_http_server::StreamableHttpService;
use serde_json::{json, Map, Value as Json};

use super::sessions::{Sessions, SessionsError, SharedSessions};
use super::{batch, Mcp};

const VERSION: &str = "2026-07-28";
/// The `_meta` keys a plain call carries; any other key sends the request to rmcp.
const META_KEYS: [&str; 3] = [
    "io.modelcontextprotocol/protocolVersion",
    "io.modelcontextprotocol/clientCapabilities",
    "io.modelcontextprotocol/clientInfo",
];

/// `/mcp`: plain stateless tool calls answered directly, the rest by rmcp.
#[derive(Clone)]
pub struct DirectRoute {
    mcp: Mcp,
    rmcp: StreamableHttpService<Mcp, Sessions>,
    max_body_bytes: usize,
    sessions: SharedSessions,
    answered: Arc<AtomicU64>,
}

impl DirectRoute {
    pub fn new(
        mcp: Mcp,
        rmcp: StreamableHttpService<Mcp, Sessions>,
        max_body_bytes: usize,
        sessions: SharedSessions,
    ) -> Self {
        let answered = Arc::clone(&mcp.inner.direct_calls);
        DirectRoute { mcp, rmcp, max_body_bytes, sessions, answered }
    }

    async fn handle(mut self, request: Request<Body>) -> Response<Body> {
        if let Some(refused) = self.foreign_session(&request) {
            return refused;
        }
        match *request.method() {
            Method::POST => {}
            Method::GET => return self.forward(request).await,
            Method::DELETE => return session_closed(self.forward(request).await),
            ref other => return method_not_allowed(other),
        }
        // rmcp reads the whole body too: reading it here first costs no more memory.
        let (mut parts, body) = request.into_parts();
        let bytes = match read_body(body, self.max_body_bytes).await {
            Ok(bytes) => bytes,
            Err(BodyError::TooLarge) => return too_large(self.max_body_bytes),
            Err(BodyError::Broken(why)) => return broken_body(&why),
        };
        if batch::is_batch(&bytes) {
            return json_response(StatusCode::BAD_REQUEST, &batch::refusal());
        }
        // Only a request without a session can open one, and whether it does is rmcp's reading
        // of the body, never a header the client chooses: an `Mcp-Method: x` on an initialize
        // body opened sessions outside the token's share. The byte search keeps the parse off
        // the path of plain calls.
        let may_open_session = !parts.headers.contains_key("mcp-session-id") && mentions_initialize(&bytes);
        let principal = parts.extensions.get::<crate::contract::Caller>().and_then(|c| c.0.clone());
        if may_open_session {
            let full = self.sessions.full().await;
            // Only a refusal, or a scoped token's session to record, needs the body parsed.
            if full || principal.is_some() {
                if let Some(id) = initialize_id(&bytes) {
                    if full {
                        return sessions_full(id, self.sessions.max_sessions());
                    }
                    if let Some(principal) = &principal {
                        let request = Request::from_parts(parts, Body::from(bytes));
                        let opened = self.open_scoped_session(principal.name(), id, request).await;
                        return super::tasks::declare_legacy_tasks(opened).await;
                    }
                }
            }
        }
        // The tasks a 2026-era listen asks about: rmcp's filter has no `taskIds`.
        if let Some(ids) = super::tasks::listened_tasks(&bytes) {
            parts.extensions.insert(ids);
        }
        // A session's task requests (2025-11-25), which rmcp does not know: answered here.
        if parts.headers.contains_key("mcp-session-id") {
            if let Some(request) = super::tasks::legacy(&bytes) {
                return self.legacy_task(&parts, principal, request).await;
            }
        }
        if !plain_call_headers(&parts.headers, self.max_body_bytes) {
            let response = self.forward(Request::from_parts(parts, Body::from(bytes))).await;
            return match may_open_session {
                true => super::tasks::declare_legacy_tasks(response).await,
                false => response,
            };
        }
        let Some(PlainCall { id, name, arguments, by_form, tasks }) = plain_call(&bytes, &parts.headers) else {
            return self.forward(Request::from_parts(parts, Body::from(bytes))).await;
        };
        let may_ask = super::may_ask(self.mcp.tools().current().approvals(), principal.as_deref());
        // A client that may be asked gets the approval question as an input-required result and
        // calls again with the answer.
        let asking = match may_ask && by_form {
            true => super::approve::Asking::InputRequired,
            false => super::approve::Asking::No,
        };
        let call = super::CallRequest { name, arguments, principal, asking, answered: None, tasks, cx: None };
        // The one implementation of `tools/call` answers, as it does for rmcp's handler: the call
        // went through the pipeline once, and handing the request to rmcp would make it again.
        let result =
            self.mcp.tools_call(call).await.and_then(|response| to_json(rmcp::model::ServerResult::from(response)));
        // The tool has run, so a result that cannot be written is answered here, as rmcp answers
        // it: forwarding the request would run the tool a second time.
        let message = result.map_or_else(
            |e| json!({"jsonrpc": "2.0", "id": id, "error": e}),
            |r| json!({"jsonrpc": "2.0", "id": id, "result": r}),
        );
        self.answered.fetch_add(1, Ordering::Relaxed);
        json_response(StatusCode::OK, &message)
    }

    /// A 2025 session's task request, on a session that exists (rmcp answers an unknown one:
    /// it is forwarded).
    async fn legacy_task(
        &mut self,
        parts: &axum::http::request::Parts,
        principal: Option<Arc<crate::contract::Principal>>,
        request: super::tasks::Legacy,
    ) -> Response<Body> {
        use rmcp::transport::streamable_http_server::SessionManager;
        let id = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
        if !self.sessions.has_session(&id.into()).await.unwrap_or(false) {
            let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32001, "message": "Session not found"}});
            return json_response(StatusCode::NOT_FOUND, &body);
        }
        let answer = super::tasks::answer(&self.mcp, id, principal, request).await;
        json_response(StatusCode::OK, &answer)
    }

    /// A scoped token's request on a session it did not open: answered as rmcp answers an
    /// unknown session (404), for every method (GET would read the session's stream, DELETE
    /// would close it).
    fn foreign_session(&self, request: &Request<Body>) -> Option<Response<Body>> {
        let id = request.headers().get("mcp-session-id")?.to_str().ok()?;
        let caller = request.extensions().get::<crate::contract::Caller>().and_then(|c| c.0.clone());
        if self.sessions.may_use(id, caller.as_deref().map(|p| p.name())) {
            return None;
        }
        let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32001, "message": "Session not found: it was not opened with this token"}});
        Some(json_response(StatusCode::NOT_FOUND, &body))
    }

    /// An `initialize` from a scoped token: within the token's share of the sessions, or refused.
    async fn open_scoped_session(&mut self, token: &str, id: Json, request: Request<Body>) -> Response<Body> {
        let reservation = match self.sessions.reserve(token).await {
            Ok(reservation) => reservation,
            Err(e) => return share_full(id, &e),
        };
        let response = self.forward(request).await;
        if let Some(session) = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
            reservation.commit(session);
        }
        response
    }

    async fn forward(&mut self, request: Request<Body>) -> Response<Body> {
        use tower_service::Service;
        match self.rmcp.call(request).await {
            Ok(response) => response.map(Body::new),
            Err(never) => match never {},
        }
    }
}

impl tower_service::Service<Request<Body>> for DirectRoute {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.handle(request).await) })
    }
}

enum BodyError {
    TooLarge,
    Broken(String),
}

/// The whole body, refused past `limit` bytes (declared or sent).
async fn read_body(body: Body, limit: usize) -> Result<Bytes, BodyError> {
    use http_body::Body as _;
    if body.size_hint().lower() > limit as u64 {
        return Err(BodyError::TooLarge);
    }
    let mut body = std::pin::pin!(body);
    let mut collected = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|e| BodyError::Broken(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if data.len() > limit.saturating_sub(collected.len()) {
                return Err(BodyError::TooLarge);
            }
            if collected.is_empty() && body.is_end_stream() {
                // One frame is the whole body: keep it without a copy.
                return Ok(data);
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(collected))
}

fn json_response(status: StatusCode, body: &Json) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

/// rmcp answers a session's DELETE with 202 Accepted, which the official SDKs log as a failed
/// termination (the Python SDK: "Session termination failed: 202"); they expect 200 or 204, and
/// the session is closed by then, so say so with 204 No Content.
fn session_closed(mut response: Response<Body>) -> Response<Body> {
    if response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
        *response.body_mut() = Body::empty();
        response.headers_mut().remove(header::CONTENT_TYPE);
        response.headers_mut().remove(header::CONTENT_LENGTH);
    }
    response
}

/// A method `/mcp` does not take, answered like every other 405 of the server (rmcp's own
/// answer is a bare "Method Not Allowed").
fn method_not_allowed(method: &Method) -> Response<Body> {
    let message = format!(
        "{method} is not allowed on /mcp; use POST for MCP messages, GET to open a session's stream, DELETE to end a session"
    );
    let body = json!({ "error": { "code": "method_not_allowed", "message": message } });
    let mut response = json_response(StatusCode::METHOD_NOT_ALLOWED, &body);
    response.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("GET, POST, DELETE"));
    response
}

/// rmcp's answer to a body over the limit, word for word.
fn too_large(limit: usize) -> Response<Body> {
    Response::builder()
        .status(StatusCode::PAYLOAD_TOO_LARGE)
        .body(Body::from(format!("Payload Too Large: request body exceeds {limit} bytes")))
        .unwrap_or_default()
}

/// The id of an `initialize` request (which opens a session), if the body is one.
/// Whether the body may be an `initialize`: the method's name is in it as written, or the body
/// has escapes (`"\u0069nitialize"` reads as the same name).
fn mentions_initialize(body: &[u8]) -> bool {
    body.contains(&b'\\') || body.windows(12).any(|w| w == b"\"initialize\"")
}

fn initialize_id(body: &[u8]) -> Option<Json> {
    #[derive(serde::Deserialize)]
    struct Probe {
        method: String,
        id: Option<Json>,
    }
    let probe: Probe = serde_json::from_slice(body).ok()?;
    (probe.method == "initialize").then(|| probe.id.unwrap_or(Json::Null))
}

/// 503 with a JSON-RPC error: rmcp would turn the refusal into a bare 500.
fn sessions_full(id: Json, max: usize) -> Response<Body> {
    let message = SessionsError::Full(max).to_string();
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": message}});
    let mut response = json_response(StatusCode::SERVICE_UNAVAILABLE, &body);
    response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("5"));
    response
}

/// 429 with a JSON-RPC error: the caller's own share is full, not the server.
fn share_full(id: Json, error: &SessionsError) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": error.to_string()}});
    json_response(StatusCode::TOO_MANY_REQUESTS, &body)
}

/// A JSON-RPC parse error for a body that could not be read in full.
fn broken_body(why: &str) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {
        "code": -32700,
        "message": format!("the request body ended before its Content-Length ({why}); send the whole body again"),
    }});
    json_response(StatusCode::BAD_REQUEST, &body)
}

/// The headers of a plain stateless tool call with a body of known, allowed size.
fn plain_call_headers(headers: &HeaderMap, max_body_bytes: usize) -> bool {
    let one = |name: &str| {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (Some(v), None) => v.to_str().ok(),
            _ => None,
        }
    };
    let length_ok = one("content-length").and_then(|l| l.parse::<usize>().ok()).is_some_and(|l| l <= max_body_bytes);
    // Media types compare exactly, parameters (`; charset=utf-8`, `; q=0.9`) aside.
    let media = |value: &str| value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    let accepted: Vec<String> = one("accept").unwrap_or_default().split(',').map(media).collect();
    length_ok
        && one("mcp-protocol-version") == Some(VERSION)
        && one("mcp-method") == Some("tools/call")
        && one("mcp-name").is_some()
        && one("content-type").is_some_and(|t| media(t) == "application/json")
        && accepted.iter().any(|m| m == "application/json")
        && accepted.iter().any(|m| m == "text/event-stream")
        && !headers.contains_key("mcp-session-id")
        && !headers.contains_key("origin")
        && !headers.keys().any(|k| k.as_str().starts_with("mcp-param-"))
}

/// A plain `tools/call`, read from its body in one parse.
struct PlainCall {
    id: Json,
    name: String,
    arguments: Map<String, Json>,
    /// Whether its client can be asked in a form ([`asks_by_form`]).
    by_form: bool,
    /// Whether its client declared the tasks extension.
    tasks: bool,
}

/// The call of a body that is one plain `tools/call` request agreeing with the `Mcp-Name`
/// header.
fn plain_call(body: &Bytes, headers: &HeaderMap) -> Option<PlainCall> {
    let Json::Object(mut message) = serde_json::from_slice::<Json>(body).ok()? else { return None };
    let id = message.remove("id")?;
    let Json::Object(mut params) = message.remove("params")? else { return None };
    if message.remove("jsonrpc")? != "2.0" || message.remove("method")? != "tools/call" || !message.is_empty() {
        return None;
    }
    // rmcp's ids are strings or i64: a larger number is its to refuse.
    if !(id.is_string() || id.is_i64()) {
        return None;
    }
    let Json::String(name) = params.remove("name")? else { return None };
    if headers.get("mcp-name").and_then(|v| v.to_str().ok()) != Some(name.as_str()) {
        return None;
    }
    let arguments = match params.remove("arguments") {
        None => Map::new(),
        Some(Json::Object(arguments)) => arguments,
        Some(_) => return None,
    };
    let Json::Object(meta) = params.remove("_meta")? else { return None };
    let plain_meta = meta.keys().all(|k| META_KEYS.contains(&k.as_str()))
        && meta.get(META_KEYS[0]).and_then(Json::as_str) == Some(VERSION)
        && meta.get(META_KEYS[1]).is_some_and(Json::is_object)
        && meta.get(META_KEYS[2]).is_none_or(Json::is_object);
    if !(plain_meta && params.is_empty()) {
        return None;
    }
    let by_form = asks_by_form(&meta);
    let tasks = meta
        .get(META_KEYS[1])
        .and_then(|c| c.get("extensions"))
        .is_some_and(|e| e.get(rmcp::model::TASKS_EXTENSION_ID).is_some_and(Json::is_object));
    Some(PlainCall { id, name, arguments, by_form, tasks })
}

/// Whether a 2026-era request's client can be asked in a form, read from `_meta`'s client
/// capabilities exactly as rmcp reads them ([`super::approve::by_form`]).
fn asks_by_form(meta: &Map<String, Json>) -> bool {
    let caps = meta.get(META_KEYS[1]).and_then(|c| c.get("elicitation"));
    let elicitation = caps.cloned().and_then(|c| serde_json::from_value::<rmcp::model::ElicitationCapability>(c).ok());
    elicitation.is_some_and(|e| super::approve::by_form(&e))
}

/// A result as the JSON-RPC response carries it.
fn to_json(result: impl serde::Serialize) -> Result<Json, rmcp::ErrorData> {
    serde_json::to_value(result).map_err(|e| rmcp::ErrorData::internal_error(e.to_string(), None))
}
