//! Request guards: Host and Origin checks (DNS rebinding and cross-site calls), the bearer
//! token, and CORS for the configured origins only.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::respond::ApiError;
use crate::types::ErrorCode;

/// The security settings of a running server.
#[derive(Clone, Debug)]
pub struct Security {
    pub token: Option<String>,
    pub allowed_origins: Vec<String>,
    /// Bound to a loopback address: only loopback `Host` names are accepted.
    pub loopback: bool,
}

impl Security {
    /// Checks the settings against the address: a non-loopback bind needs a token.
    pub fn new(addr: SocketAddr, token: Option<String>, allowed_origins: Vec<String>) -> Result<Security, String> {
        let loopback = addr.ip().is_loopback();
        if !loopback && token.is_none() {
            return Err(format!(
                "refusing to listen on {addr} without server.auth_token: anyone who can reach this address could call every tool. \
                 Set server.auth_token (for example auth_token = \"${{CTX_TOKEN}}\"), or bind 127.0.0.1"
            ));
        }
        Ok(Security { token, allowed_origins, loopback })
    }

    /// CORS for the configured origins; `None` (no CORS headers at all) when there are none.
    pub fn cors(&self) -> Option<CorsLayer> {
        if self.allowed_origins.is_empty() {
            return None;
        }
        let origins: Vec<HeaderValue> = self.allowed_origins.iter().filter_map(|o| o.parse().ok()).collect();
        Some(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(origins))
                .allow_methods([Method::GET, Method::POST])
                .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION, header::ACCEPT]),
        )
    }
}

/// Marks a request that carried the right bearer token, or needed none (no token is set).
/// `/health`, `/openapi.json` and the Swagger UI pages are open to everyone; the first two read
/// this to decide how much they say.
#[derive(Clone, Copy, Debug)]
pub struct Authorized(pub bool);

/// Runs before every route.
pub async fn check(State(security): State<Arc<Security>>, mut request: Request, next: Next) -> Response {
    match verdict(&security, &request) {
        Ok(authorized) => {
            request.extensions_mut().insert(Authorized(authorized));
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

/// `Ok(true)` when the request may see everything, `Ok(false)` for an anonymous request to a
/// route open to anyone.
fn verdict(security: &Security, request: &Request) -> Result<bool, ApiError> {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if security.loopback && !is_loopback_host(host) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("Host {host:?} is not allowed: this server listens on loopback and only answers localhost, 127.x.x.x or [::1]"),
        ));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let same_origin = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) == Some(host);
        if !same_origin && !security.allowed_origins.iter().any(|o| o == origin) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("origin {origin:?} is not allowed; add it to server.allowed_origins to let that site call ctx"),
            ));
        }
    }
    let Some(token) = &security.token else { return Ok(true) };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.trim().as_bytes(), token.as_bytes()) {
        return Ok(true);
    }
    let path = request.uri().path();
    // Open to anyone, each saying less without the token: `/health` (its status only), the
    // Swagger UI pages (static assets) and `/openapi.json` (only what the repository publishes:
    // no Lua tool or agent of this server). A browser cannot send a bearer token to open a page,
    // and the UI shows its Authorize button only once it has loaded a document; every call it
    // makes then carries the token.
    if path == "/health" || path == "/openapi.json" || is_docs_page(path) {
        return Ok(false);
    }
    Err(ApiError::new(
        ErrorCode::Unauthorized,
        "missing or wrong bearer token: send Authorization: Bearer <server.auth_token>",
    ))
}

/// The Swagger UI page and its assets (`/docs`, `/docs/...`), not `/openapi.json`.
fn is_docs_page(path: &str) -> bool {
    path == "/docs" || path.starts_with("/docs/")
}

/// The one Host check of the server (`/mcp` included: rmcp's own check is off, see
/// `Mcp::http_service`). A loopback server answers only names that can only mean this machine:
/// `localhost`, an IPv4 address in 127.0.0.0/8 or `[::1]`, each with an optional port. The
/// address must parse as an IP, so `127.0.0.1.attacker.example` (a name an attacker's DNS can
/// point anywhere, the DNS rebinding trick) is refused.
pub fn is_loopback_host(host: &str) -> bool {
    let Some((name, port)) = split_host(host) else { return false };
    let port_ok = port.is_none_or(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
    let name_ok = if host.starts_with('[') {
        name.parse::<std::net::Ipv6Addr>().is_ok_and(|ip| ip.is_loopback())
    } else {
        name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
    };
    port_ok && name_ok
}

/// `name[:port]` or `[ipv6][:port]` into the name and the port text.
fn split_host(host: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = host.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let port = if after.is_empty() { None } else { Some(after.strip_prefix(':')?) };
        return Some((inside, port));
    }
    Some(match host.split_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    })
}

/// Compares without an early exit, so the time taken does not reveal how much of a guess matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // The length of the configured token is not a secret; its bytes are.
    let mut diff = u8::from(a.len() != b.len());
    for (i, &byte) in b.iter().enumerate() {
        diff |= a.get(i).copied().unwrap_or(!byte) ^ byte;
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for ok in [
            "localhost:7391",
            "127.0.0.1:80",
            "[::1]:7391",
            "[::1]",
            "LOCALHOST",
            "127.0.0.1",
            "127.8.9.10:1",
            "localhost",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example:7391",
            "10.0.0.1:7391",
            "",
            "localhost.evil.example",
            "127.0.0.1.attacker.example",
            "127.0.0.1.attacker.example:7391",
            "127.evil.example",
            "127.0.0.1:",
            "127.0.0.1:80x",
            "localhost:7391:1",
            "[::2]:7391",
            "[::1]x",
            "[::1",
            "user@localhost",
            "0.0.0.0:7391",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abcdefghijklmnop", b"abcdefghijklmnop"));
        assert!(!constant_time_eq(b"abcdefghijklmnoq", b"abcdefghijklmnop"));
        assert!(!constant_time_eq(b"abc", b"abcdefghijklmnop"));
        assert!(!constant_time_eq(b"", b"abcdefghijklmnop"));
    }
}
