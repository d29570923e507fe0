//! A direct route for the most common MCP request: a stateless (2026-07-28) `tools/call`.
//!
//! rmcp builds a handler, a service and a task for every stateless request, which costs as much
//! as the tool call itself. A POST that is plainly such a call (the version, method and name
//! headers agree with the body, no session, no `Mcp-Param-*` headers, no Origin, a Host that
//! rmcp allows, JSON in, JSON and SSE accepted, `_meta` holding only the version, capabilities
//! and client info, and no progress token) is answered here through [`Tools::call`], with the body rmcp would send:
//! a test sends the same calls both ways and compares the bytes. Everything else goes to rmcp
//! unchanged, including every protocol error (unknown tool, invalid arguments): those fail
//! before the tool runs, so answering them from rmcp runs nothing twice.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Method, Request, Response, StatusCode};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::StreamableHttpService;
use serde_json::{json, Map, Value as Json};

use super::{convert, Mcp};
use crate::lua::CancelHandle;
use crate::tools::CallOptions;

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
    rmcp: StreamableHttpService<Mcp, LocalSessionManager>,
    max_body_bytes: usize,
    /// A loopback bind: rmcp then allows only these Host names.
    loopback: bool,
    answered: Arc<AtomicU64>,
}

impl DirectRoute {
    pub fn new(
        mcp: Mcp,
        rmcp: StreamableHttpService<Mcp, LocalSessionManager>,
        max_body_bytes: usize,
        loopback: bool,
    ) -> Self {
        let answered = Arc::clone(&mcp.inner.direct_calls);
        DirectRoute { mcp, rmcp, max_body_bytes, loopback, answered }
    }

    async fn handle(mut self, request: Request<Body>) -> Response<Body> {
        let host_ok = !self.loopback || loopback_host(request.headers());
        if request.method() != Method::POST || !host_ok || !plain_call_headers(request.headers(), self.max_body_bytes) {
            return self.forward(request).await;
        }
        let (parts, body) = request.into_parts();
        let bytes = match axum::body::to_bytes(body, self.max_body_bytes).await {
            Ok(bytes) => bytes,
            // The declared length was within the limit, so the body broke off on the way.
            Err(e) => return broken_body(&e.to_string()),
        };
        let Some((id, name, arguments)) = plain_call(&bytes, &parts.headers) else {
            return self.forward(Request::from_parts(parts, Body::from(bytes))).await;
        };
        let options = CallOptions { cancel: CancelHandle::new(), progress: None, caller: "mcp" };
        let outcome = self.mcp.tools().call(name, Json::Object(arguments), options).await;
        let result = match &outcome {
            Err(e) if e.is_protocol_error() => {
                return self.forward(Request::from_parts(parts, Body::from(bytes))).await;
            }
            Ok(output) => convert::result(&output.mcp()),
            Err(e) => convert::result(&e.mcp()),
        };
        // The tool has run, so a result that cannot be written is answered here, as rmcp answers
        // it: forwarding the request would run the tool a second time.
        let message = result
            .and_then(|r| serde_json::to_value(r).map_err(|e| rmcp::ErrorData::internal_error(e.to_string(), None)))
            .map_or_else(
                |e| json!({"jsonrpc": "2.0", "id": id, "error": e}),
                |r| json!({"jsonrpc": "2.0", "id": id, "result": r}),
            );
        let body = message.to_string();
        self.answered.fetch_add(1, Ordering::Relaxed);
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap_or_default()
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

/// A JSON-RPC parse error for a body that could not be read in full.
fn broken_body(why: &str) -> Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {
        "code": -32700,
        "message": format!("the request body ended before its Content-Length ({why}); send the whole body again"),
    }});
    Response::builder()
        .status(StatusCode::BAD_REQUEST)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
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

/// The Host is one rmcp allows on a loopback bind: localhost, 127.0.0.1 or ::1, any port.
fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else { return false };
    let Ok(authority) = host.parse::<axum::http::uri::Authority>() else { return false };
    matches!(authority.host().trim_start_matches('[').trim_end_matches(']'), "localhost" | "127.0.0.1" | "::1")
}

/// `(id, tool name, arguments)` of a body that is one plain `tools/call` request agreeing with
/// the `Mcp-Name` header.
fn plain_call(body: &Bytes, headers: &HeaderMap) -> Option<(Json, String, Map<String, Json>)> {
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
    (plain_meta && params.is_empty()).then_some((id, name, arguments))
}
