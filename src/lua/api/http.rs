//! `http.get/post/put/patch/delete/request`: pooled clients, bounded by the script's deadline
//! and by where the script may connect ([`egress`]).
//!
//! Every request gets a timeout of at most the time the script has left, and is abandoned as
//! soon as the caller cancels. If the deadline is what cut the request short, the script is
//! killed (a timeout a script could catch would let it outrun its limit). A script's own
//! `opts.timeout`, shorter than the deadline, is an ordinary catchable error. Redirects are
//! followed hop by hop ([`redirect`]), each hop checked like the first request. Messages never
//! show a secret of the config (a script may have put one in the URL).

mod egress;
mod redirect;

use std::sync::Arc;
use std::time::Duration;

use mlua::{Lua, Table, Value};

use super::fail;
use crate::config::hosts::HostRule;
use crate::config::redact;
use crate::lua::{convert, Kill, RunState};
use redirect::{Failure, Outgoing, Payload};

/// The default per-request timeout when a script gives none (still capped by the deadline).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

pub fn register(lua: &Lua, state: &Arc<RunState>) -> mlua::Result<()> {
    let http = lua.create_table()?;
    for (method, name) in [("get", "http.get"), ("delete", "http.delete")] {
        let state = Arc::clone(state);
        http.set(
            method,
            super::function(lua, name, move |lua, (url, opts): (String, Option<Table>)| {
                let spec = Spec::from_opts(method, url, None, opts.as_ref())?;
                perform(lua, &state, spec)
            })?,
        )?;
    }
    for (method, name) in [("post", "http.post"), ("put", "http.put"), ("patch", "http.patch")] {
        let state = Arc::clone(state);
        http.set(
            method,
            super::function(lua, name, move |lua, (url, body, opts): (String, Value, Option<Table>)| {
                let spec = Spec::from_opts(method, url, Some(body_of(lua, &state, method, body)?), opts.as_ref())?;
                perform(lua, &state, spec)
            })?,
        )?;
    }
    let request_state = Arc::clone(state);
    http.set(
        "request",
        super::function(lua, "http.request", move |lua, req: Table| {
            let method: String = req.get::<Option<String>>("method")?.unwrap_or_else(|| "GET".to_string());
            let url: String =
                req.get::<Option<String>>("url")?.ok_or_else(|| fail("http.request: `url` is required"))?;
            let body = match req.get::<Value>("body")? {
                Value::Nil => None,
                body => Some(body_of(lua, &request_state, "request", body)?),
            };
            let spec = Spec::from_opts(&method.to_ascii_lowercase(), url, body, Some(&req))?;
            perform(lua, &request_state, spec)
        })?,
    )?;
    lua.globals().set("http", http)
}

/// A request body: a string as is, a table as JSON.
struct Body {
    bytes: Vec<u8>,
    json: bool,
}

fn body_of(lua: &Lua, state: &RunState, method: &str, body: Value) -> mlua::Result<Body> {
    // An inline run escalates before it copies or encodes the body, not after, in `perform`.
    state.check_blocking()?;
    match body {
        Value::Nil => Ok(Body { bytes: Vec::new(), json: false }),
        Value::String(s) => Ok(Body { bytes: s.as_bytes().to_vec(), json: false }),
        Value::Table(_) => {
            let json = convert::to_json(lua, &body, state.limits.memory_bytes)
                .map_err(|e| fail(format!("http.{method}: the body table is not JSON: {e:?}")))?;
            Ok(Body { bytes: serde_json::to_vec(&json).map_err(|e| fail(e.to_string()))?, json: true })
        }
        other => Err(fail(format!("http.{method}: body must be a string or a table, not a {}", other.type_name()))),
    }
}

struct Spec {
    method: String,
    url: String,
    body: Option<Body>,
    headers: Vec<(String, String)>,
    params: Vec<(String, String)>,
    timeout: Option<Duration>,
}

impl Spec {
    fn from_opts(method: &str, url: String, body: Option<Body>, opts: Option<&Table>) -> mlua::Result<Spec> {
        let mut spec =
            Spec { method: method.to_string(), url, body, headers: Vec::new(), params: Vec::new(), timeout: None };
        let Some(opts) = opts else { return Ok(spec) };
        if let Some(headers) = opts.get::<Option<Table>>("headers")? {
            for pair in headers.pairs::<String, Value>() {
                let (k, v) = pair?;
                spec.headers.push((k, scalar(&v, "header")?));
            }
        }
        if let Some(params) = opts.get::<Option<Table>>("params")? {
            for pair in params.pairs::<String, Value>() {
                let (k, v) = pair?;
                spec.params.push((k, scalar(&v, "param")?));
            }
            spec.params.sort();
        }
        if let Some(t) = opts.get::<Option<f64>>("timeout")? {
            if !t.is_finite() || t <= 0.0 {
                return Err(fail(format!("http.{method}: opts.timeout must be a positive number of seconds")));
            }
            spec.timeout = Some(Duration::from_secs_f64(t.min(86_400.0)));
        }
        Ok(spec)
    }
}

fn scalar(v: &Value, what: &str) -> mlua::Result<String> {
    match v {
        Value::String(s) => Ok(s.to_string_lossy().to_string()),
        Value::Integer(i) => Ok(i.to_string()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Boolean(b) => Ok(b.to_string()),
        other => Err(fail(format!("http: a {what} value must be a string or number, not a {}", other.type_name()))),
    }
}

/// True when `host` is allowed by `allow` (exact names, `*.example.com`, addresses, CIDR ranges).
pub fn host_allowed(host: &str, allow: &[String]) -> bool {
    allow.iter().filter_map(|entry| HostRule::parse(entry).ok()).any(|rule| rule.matches_host(host))
}

/// A message for the script, without the config's secrets.
fn failure(message: String) -> mlua::Error {
    fail(redact::string(message))
}

fn perform(lua: &Lua, state: &Arc<RunState>, spec: Spec) -> mlua::Result<Table> {
    let name = format!("http.{}", spec.method);
    state.check_blocking()?;
    let mut url = reqwest::Url::parse(&spec.url)
        .map_err(|e| failure(format!("{name}: invalid URL {}: {e}", super::quoted(&spec.url))))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(fail(format!("{name}: only http and https URLs are allowed, not {}", url.scheme())));
    }
    let host = url.host_str().unwrap_or_default().to_string();
    let policy = egress::Policy::of(&state.info);
    policy.check_url(&url).map_err(|refusal| failure(format!("{name}: {}", refusal.explain(&state.info))))?;
    if !spec.params.is_empty() {
        url.query_pairs_mut().extend_pairs(spec.params.iter());
    }
    let method = reqwest::Method::from_bytes(spec.method.to_ascii_uppercase().as_bytes())
        .map_err(|_| fail(format!("{name}: unknown HTTP method")))?;

    let remaining = state.remaining();
    let own = spec.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let deadline_bound = remaining <= own;
    let timeout = own.min(remaining);
    let client = egress::client(&policy);
    let request = Outgoing {
        method,
        url,
        headers: spec.headers,
        body: spec.body.map(|b| Payload { bytes: b.bytes.into(), json: b.json }),
    };
    // The body becomes a Lua string (and maybe tables), so it may be no larger than what the
    // run can still allocate; reading stops as soon as it grows past that.
    let max_body = state.memory_left(lua).min(state.limits.memory_bytes);
    let cancel = state.cancel();
    // The request runs on ctx's runtime; this (blocking) thread waits for it. `None`: the caller
    // cancelled, or the runtime stopped (ctx is shutting down), which cancels the run too.
    let outcome = crate::runtime::wait(async move {
        // One timeout for the whole request, redirects included.
        let work = async {
            tokio::time::timeout(timeout, redirect::fetch(&client, &policy, request, max_body))
                .await
                .unwrap_or(Err(Failure::TimedOut))
        };
        tokio::select! {
            result = work => Some(result),
            _ = cancel.cancelled() => None,
        }
    });
    let Some(result) = outcome.flatten() else {
        state.kill(Kill::Cancelled);
        state.check()?;
        return Err(fail(format!("{name}: cancelled")));
    };
    let (status, headers, body) = match result {
        Ok(Ok(parts)) => parts,
        Ok(Err(size)) => {
            return Err(fail(format!(
                "{name}: the response body is over {size} bytes, more than the script's memory limit"
            )))
        }
        Err(Failure::TimedOut) => {
            if deadline_bound {
                state.kill(Kill::Timeout);
                state.check()?;
            }
            return Err(failure(format!("{name}: {host}: timed out after {:.1} s", timeout.as_secs_f64())));
        }
        Err(Failure::Http(e)) => return Err(failure(format!("{name}: {host}: {}", describe(&e)))),
        Err(Failure::Refused { from: None, refusal }) => {
            return Err(failure(format!("{name}: {}", refusal.explain(&state.info))))
        }
        Err(Failure::Refused { from: Some(from), refusal }) => {
            return Err(failure(format!(
                "{name}: {host}: a redirect from {from:?} was refused: {}",
                refusal.explain(&state.info)
            )))
        }
        Err(Failure::TooManyRedirects) => {
            return Err(failure(format!("{name}: {host}: more than {} redirects", redirect::MAX_REDIRECTS)))
        }
        Err(Failure::BadLocation { from, reason }) => {
            return Err(failure(format!("{name}: {host}: a redirect from {from:?} was not followed: {reason}")))
        }
    };
    let out = lua.create_table()?;
    out.set("status", status)?;
    out.set("ok", (200..300).contains(&status))?;
    let header_table = lua.create_table()?;
    let mut is_json = false;
    for (k, v) in &headers {
        if k == "content-type" && v.contains("json") {
            is_json = true;
        }
        header_table.set(k.as_str(), v.as_str())?;
    }
    out.set("headers", header_table)?;
    let looks_json = is_json || matches!(body.iter().find(|b| !b.is_ascii_whitespace()), Some(b'{') | Some(b'['));
    if looks_json {
        // Straight into Lua values, counted against the cap as they are built. Text that is not
        // JSON simply has no `.json`; the cap and the deadline still stop the script.
        match convert::parse_to_lua(lua, &body, &|| state.check()) {
            Ok(value) => out.set("json", value)?,
            Err(mlua::Error::RuntimeError(m)) if !m.starts_with("ctx: ") => {}
            Err(e) => return Err(e),
        }
    }
    out.set("body", lua.create_string(body)?)?;
    Ok(out)
}

/// A one-line reason without reqwest's nested Debug output.
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_connect() { "connection failed".to_string() } else { "request failed".to_string() };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}
