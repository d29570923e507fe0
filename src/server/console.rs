//! The browser console at `/console`: the files of `console/`, embedded in the binary, and the
//! login page that turns a token into the cookie those files are served with.
//!
//! The cookie opens the console's own files only (its path is `/console`, and the guard reads it
//! nowhere else): every API call the console makes carries the bearer token like any other
//! client's, so a cookie can never make a cross-site request call a tool. The login page is the
//! one console page served without a token; it is one self-contained file.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::guard::Authorized;
use super::respond::ApiError;
use super::App;
use crate::types::ErrorCode;

include!(concat!(env!("OUT_DIR"), "/console_files.rs"));

/// The cookie that opens the console's files: a MAC of the token (see `Security::console_cookie`).
pub const COOKIE: &str = "ctx_console";

/// The login page: a form for the token, kept in this tab's session storage for API calls and
/// sent once to `POST /console/login` for the cookie.
const LOGIN: &str = include_str!("console_login.html");

/// `/console` → `/console/`, where the page's relative links resolve.
pub async fn bare() -> Response {
    redirect("/console/")
}

/// The console's page.
pub async fn index(authorized: Option<Extension<Authorized>>) -> Response {
    file_response(authorized, "index.html")
}

/// One of the console's files, by name.
pub async fn file(authorized: Option<Extension<Authorized>>, Path(name): Path<String>) -> Response {
    file_response(authorized, &name)
}

fn file_response(authorized: Option<Extension<Authorized>>, name: &str) -> Response {
    if !authorized.is_some_and(|Extension(Authorized(yes))| yes) {
        // The guard let the request through without a token: only the page itself says where
        // to log in; a file answers 401 like any route.
        if name == "index.html" {
            return redirect("/console/login");
        }
        return ApiError::new(
            ErrorCode::Unauthorized,
            "the console's files need the token: log in at /console/login (or send Authorization: Bearer <token>)",
        )
        .into_response();
    }
    let Some(bytes) = find(name) else {
        return ApiError::new(ErrorCode::NotFound, format!("the console has no file {name:?}")).into_response();
    };
    let mut response = Response::new(Body::from(bytes));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type(name)));
    // Each page load sees the binary's own files; a newer ctx must not run an older script.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    secure(headers, "script-src 'self'");
    response
}

/// The file `name` of the console: from the binary, or in a debug build from `CTX_CONSOLE_DIR`
/// when that is set (a developer edits the files without rebuilding). Only names the binary
/// holds are served either way, so a request path never reaches the file system.
fn find(name: &str) -> Option<Vec<u8>> {
    let embedded = FILES.iter().find(|(n, _)| *n == name).map(|(_, bytes)| *bytes)?;
    #[cfg(debug_assertions)]
    if let Some(dir) = std::env::var_os("CTX_CONSOLE_DIR") {
        if let Ok(bytes) = std::fs::read(std::path::Path::new(&dir).join(name)) {
            return Some(bytes);
        }
    }
    Some(embedded.to_vec())
}

/// The login page (open to everyone).
pub async fn login_page() -> Response {
    let mut response = Response::new(Body::from(LOGIN));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    secure(headers, &format!("script-src '{}'", inline_script_hash()));
    response
}

/// `POST /console/login` with the bearer token: the guard checked it; the answer sets the cookie
/// that serves the console's files to this browser. Says which tools the token may use.
pub async fn login(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    authorized: Option<Extension<Authorized>>,
) -> Response {
    if !authorized.is_some_and(|Extension(Authorized(yes))| yes) {
        return ApiError::new(ErrorCode::Unauthorized, "wrong token").into_response();
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    let mut response = StatusCode::NO_CONTENT.into_response();
    if !token.is_empty() {
        // Behind a proxy that ends TLS, the cookie travels only over HTTPS.
        let https = headers.get("x-forwarded-proto").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
        let secure = if https { "; Secure" } else { "" };
        let value = app.security.console_cookie(token.as_bytes());
        let cookie = format!("{COOKIE}={value}; Path=/console; HttpOnly; SameSite=Strict{secure}");
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, value);
        }
    }
    response
}

/// `POST /console/logout`: forgets the cookie (the page forgets its copy of the token).
pub async fn logout() -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let cookie = format!("{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0");
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// The MAC in the console cookie of a request, if it has one.
pub fn cookie_token(headers: &HeaderMap) -> Option<Vec<u8>> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .and_then(|(_, value)| unhex(value))
}

/// Whether `path` is one of the console's files (the login routes are not).
pub fn is_console_file(path: &str) -> bool {
    path == "/console" || (path.starts_with("/console/") && path != "/console/login" && path != "/console/logout")
}

/// Headers that keep the console's pages to themselves: no framing, no other origin's scripts,
/// no content sniffing, no referrer.
fn secure(headers: &mut HeaderMap, scripts: &str) {
    let policy = format!(
        "default-src 'self'; {scripts}; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; \
         connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
    );
    if let Ok(value) = HeaderValue::from_str(&policy) {
        headers.insert(header::CONTENT_SECURITY_POLICY, value);
    }
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}

/// The CSP source for the login page's one inline script: its SHA-256, so no other inline
/// script (an injected one) runs there.
fn inline_script_hash() -> String {
    let start = LOGIN.find("<script>").map(|i| i + "<script>".len()).unwrap_or(0);
    let end = LOGIN[start..].find("</script>").map(|i| start + i).unwrap_or(start);
    let digest = Sha256::digest(&LOGIN.as_bytes()[start..end]);
    use base64::Engine;
    format!("sha256-{}", base64::engine::general_purpose::STANDARD.encode(digest))
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") | Some("mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("json") => "application/json",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}

fn redirect(to: &'static str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    response.headers_mut().insert(header::LOCATION, HeaderValue::from_static(to));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > 1024 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cookie_is_read_among_others() {
        let mut headers = HeaderMap::new();
        let cookie = format!("other=1; {COOKIE}=00ff10; last=2");
        headers.insert(header::COOKIE, HeaderValue::from_str(&cookie).unwrap());
        assert_eq!(cookie_token(&headers).as_deref(), Some(&[0x00, 0xff, 0x10][..]));
        headers.insert(header::COOKIE, HeaderValue::from_static("ctx_console=zz"));
        assert_eq!(cookie_token(&headers), None);
    }

    #[test]
    fn only_the_console_files_take_the_cookie() {
        assert!(is_console_file("/console"));
        assert!(is_console_file("/console/app.js"));
        assert!(!is_console_file("/console/login"));
        assert!(!is_console_file("/console/logout"));
        assert!(!is_console_file("/consoles"));
        assert!(is_console_file("/console/logs.js"));
        assert!(!is_console_file("/tools/list"));
    }
}
