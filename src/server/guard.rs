//! Request guards: Host and Origin checks (DNS rebinding and cross-site calls), the bearer
//! token, and CORS for the configured origins only.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::listen::{closing, ConnectionHandle};
use super::respond::ApiError;
use crate::tools::Principal;
use crate::types::ErrorCode;

/// The security settings of a running server.
#[derive(Clone, Debug)]
pub struct Security {
    /// `server.auth_token`: sees and calls everything.
    pub token: Option<String>,
    /// `[[server.tokens]]`: each sees and calls only its tools.
    pub tokens: Vec<NamedToken>,
    pub allowed_origins: Vec<String>,
    /// Bound to a loopback address: only loopback `Host` names are accepted.
    pub loopback: bool,
    /// The key of the console cookie's MAC, new in every process: the cookie names a token
    /// without holding it, and a restart voids every cookie.
    cookie_key: [u8; 32],
}

/// One scoped token: who holds it, the tools it may use, and its secret.
#[derive(Clone, Debug)]
pub struct NamedToken {
    pub principal: Arc<Principal>,
    pub token: String,
}

impl Security {
    /// Checks the settings against the address: a non-loopback bind needs a token.
    pub fn new(addr: SocketAddr, token: Option<String>, allowed_origins: Vec<String>) -> Result<Security, String> {
        Security::with_tokens(addr, token, Vec::new(), allowed_origins)
    }

    /// [`Security::new`] with scoped tokens too. Two entries may not share a name or a token.
    pub fn with_tokens(
        addr: SocketAddr,
        token: Option<String>,
        tokens: Vec<NamedToken>,
        allowed_origins: Vec<String>,
    ) -> Result<Security, String> {
        let loopback = addr.ip().is_loopback();
        if !loopback && token.is_none() && tokens.is_empty() {
            return Err(format!(
                "refusing to listen on {addr} without server.auth_token: anyone who can reach this address could call every tool. \
                 Set server.auth_token (for example auth_token = \"${{CTX_TOKEN}}\") or [[server.tokens]], or bind 127.0.0.1"
            ));
        }
        for (i, a) in tokens.iter().enumerate() {
            for b in &tokens[i + 1..] {
                if a.principal.name() == b.principal.name() {
                    return Err(format!(
                        "[[server.tokens]]: two entries are named {:?}; names must differ",
                        b.principal.name()
                    ));
                }
                if a.token == b.token {
                    return Err(format!(
                        "[[server.tokens]]: {:?} and {:?} have the same token; each client needs its own",
                        a.principal.name(),
                        b.principal.name()
                    ));
                }
            }
            if token.as_deref() == Some(a.token.as_str()) {
                return Err(format!(
                    "[[server.tokens]]: {:?} has the same token as server.auth_token, which sees every tool; give it its own",
                    a.principal.name()
                ));
            }
        }
        let mut cookie_key = [0u8; 32];
        cookie_key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        cookie_key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Ok(Security { token, tokens, allowed_origins, loopback, cookie_key })
    }

    /// The console cookie's value for `token`: its HMAC-SHA256 under this process's key, hex.
    /// Not a credential: it opens the console's own files (which the repository publishes) and
    /// nothing else, so a cookie sent to another server on the same host gives nothing away.
    pub fn console_cookie(&self, token: &[u8]) -> String {
        self.cookie_mac(token).iter().map(|b| format!("{b:02x}")).collect()
    }

    fn cookie_mac(&self, token: &[u8]) -> Vec<u8> {
        use hmac::{KeyInit, Mac};
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.cookie_key).expect("HMAC takes any key length");
        mac.update(token);
        mac.finalize().into_bytes().to_vec()
    }

    /// Whether any token is configured: then every route but the open ones needs one.
    fn needs_token(&self) -> bool {
        self.token.is_some() || !self.tokens.is_empty()
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
                .allow_headers([
                    header::CONTENT_TYPE,
                    header::AUTHORIZATION,
                    header::ACCEPT,
                    header::HeaderName::from_static("ctx-approval"),
                    header::HeaderName::from_static("ctx-approver"),
                ]),
        )
    }
}

/// Marks a request that carried a valid bearer token (scoped or not), or needed none (no token
/// is set). `/health`, `/openapi.json` and the Swagger UI pages are open to everyone; the first
/// two read this to decide how much they say.
#[derive(Clone, Copy, Debug)]
pub struct Authorized(pub bool);

/// Whom an authorized request's calls are made for (set here, read by the MCP adapter too).
pub use crate::contract::Caller;

/// Runs before every route.
pub async fn check(State(security): State<Arc<Security>>, mut request: Request, next: Next) -> Response {
    let access = verdict(&security, &request);
    // Whom the request counts against on its connection (see `listen`): over a share, it is
    // refused here, before its body is read.
    let refusal = match (&access, request.extensions().get::<ConnectionHandle>()) {
        (Ok(Access::Anonymous), Some(connection)) => connection.anonymous().err(),
        (Ok(Access::Granted(principal)), Some(connection)) => connection.claim(principal.as_ref()).err(),
        _ => None,
    };
    if let Some(refusal) = refusal {
        tracing::debug!("refused a request: {refusal}");
        let response = ApiError::new(ErrorCode::RateLimited, refusal.to_string()).into_response();
        return closing(response, Some(1));
    }
    match access {
        Ok(Access::Anonymous) => {
            request.extensions_mut().insert(Authorized(false));
            next.run(request).await
        }
        Ok(Access::Granted(principal)) => {
            request.extensions_mut().insert(Authorized(true));
            request.extensions_mut().insert(Caller(principal));
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

/// What a request may do.
enum Access {
    /// A route open to anyone, without a valid token.
    Anonymous,
    /// A valid token (or none needed), for this principal (`None`: everything).
    Granted(Option<Arc<Principal>>),
}

/// The principal of the token `given`, checking every configured token without stopping at
/// the first match, so the time taken says nothing about which one (or how much of it) matched.
fn match_token(security: &Security, given: &[u8]) -> Option<Option<Arc<Principal>>> {
    let mut found: Option<Option<Arc<Principal>>> = None;
    if let Some(token) = &security.token {
        if constant_time_eq(given, token.as_bytes()) {
            found = Some(None);
        }
    }
    for named in &security.tokens {
        if constant_time_eq(given, named.token.as_bytes()) && found.is_none() {
            found = Some(Some(Arc::clone(&named.principal)));
        }
    }
    found
}

/// The principal whose token the console cookie `mac` was made from, checking every token
/// without stopping at the first match (as [`match_token`]).
fn match_cookie(security: &Security, mac: &[u8]) -> Option<Option<Arc<Principal>>> {
    let mut found: Option<Option<Arc<Principal>>> = None;
    if let Some(token) = &security.token {
        if constant_time_eq(mac, &security.cookie_mac(token.as_bytes())) {
            found = Some(None);
        }
    }
    for named in &security.tokens {
        if constant_time_eq(mac, &security.cookie_mac(named.token.as_bytes())) && found.is_none() {
            found = Some(Some(Arc::clone(&named.principal)));
        }
    }
    found
}

fn verdict(security: &Security, request: &Request) -> Result<Access, ApiError> {
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
    if !security.needs_token() {
        return Ok(Access::Granted(None));
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if let Some(principal) = match_token(security, given.trim().as_bytes()) {
        return Ok(Access::Granted(principal));
    }
    let path = request.uri().path();
    // Open to anyone, each saying less without the token: `/health` (its status only), the
    // Swagger UI pages (static assets) and `/openapi.json` (only what the repository publishes:
    // no Lua tool or agent of this server). A browser cannot send a bearer token to open a page,
    // and the UI shows its Authorize button only once it has loaded a document; every call it
    // makes then carries the token.
    if path == "/health" || path == "/openapi.json" || is_docs_page(path) {
        return Ok(Access::Anonymous);
    }
    // The console: its login page (and logout) are open; its files open with the cookie the
    // login set, and only they (an API route never reads it, so a cross-site request that
    // carries the cookie calls nothing). Without it, the page itself redirects to the login.
    let reading = request.method() == Method::GET || request.method() == Method::HEAD;
    if path == "/console/login" && reading || path == "/console/logout" {
        return Ok(Access::Anonymous);
    }
    if super::console::is_console_file(path) {
        if reading {
            if let Some(principal) = super::console::cookie_token(headers).and_then(|mac| match_cookie(security, &mac))
            {
                return Ok(Access::Granted(principal));
            }
        }
        return Ok(Access::Anonymous);
    }
    Err(ApiError::new(
        ErrorCode::Unauthorized,
        "missing or wrong bearer token: send Authorization: Bearer <token> (server.auth_token, or a token of [[server.tokens]])",
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
