//! The HTTP server on 127.0.0.1:0 with a real client: every endpoint, every error status, auth,
//! Origin and Host checks, the OpenAPI document and Swagger UI.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ctx::server::{self, App, Security};
use ctx::tools::Tools;
use serde_json::{json, Value};

use crate::common::repo;
use crate::tools::{fixture, shipped};

const TOML: &str = r#"
[tools.script.echo]
path = "tools/echo.lua"
greeting = "hello"
api_token = "very-secret-value-123"

[tools.script.nap]
path = "tools/nap.lua"

[tools.script.slow]
path = "tools/slow.lua"
timeout = 1
"#;

const NAP: &str = r#"
tool = { name = "nap", description = "Sleeps a little, then answers." }
function tool.execute() sleep(0.8) return "rested" end
"#;

const SLOW: &str = r#"
tool = { name = "slow", description = "Loops until its deadline." }
function tool.execute() while true do end end
"#;

/// A running server and a client for it.
pub struct Running {
    pub base: String,
    pub(crate) client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _fixture_dir: tempfile::TempDir,
}

pub fn start(token: Option<&str>, origins: &[&str]) -> Running {
    let f = fixture(TOML, &[("echo.lua", &shipped("echo.lua")), ("slow.lua", SLOW), ("nap.lua", NAP)]);
    let (dir, registry) = f.into_parts();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let security =
        Security::new(addr, token.map(str::to_string), origins.iter().map(|o| o.to_string()).collect()).unwrap();
    let app = Arc::new(App::new(Arc::new(Tools::new(registry)), security, 4096));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(server::run(listener, app, async move {
        let _ = rx.await;
    }));
    // reqwest is built without a default TLS provider (ctx picks ring); plain HTTP needs none,
    // but the client builder still asks for one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    Running {
        base: format!("http://{addr}"),
        client: reqwest::Client::new(),
        runtime,
        stop: Some(tx),
        server: Some(server),
        _fixture_dir: dir,
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl Running {
    pub(crate) fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value, reqwest::header::HeaderMap) {
        self.runtime.block_on(async {
            let response = request.send().await.expect("request");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let text = response.text().await.unwrap();
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            (status, body, headers)
        })
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        let (s, b, _) = self.send(self.client.get(format!("{}{path}", self.base)));
        (s, b)
    }

    pub(crate) fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let (s, b, _) = self.send(self.client.post(format!("{}{path}", self.base)).json(&body));
        (s, b)
    }
}

/// The error body must match the error schema and carry the code that goes with the status.
pub(crate) fn assert_envelope(status: u16, body: &Value, want_status: u16, want_code: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"]["code"], want_code, "{body}");
    let problems = ctx::schema::SchemaValidator::for_definition("Error").problems(body, ctx::schema::Dialect::Json);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn every_endpoint_answers_as_documented() {
    let s = start(None, &[]);
    let (status, health) = s.get("/health");
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    assert_eq!(health["tools"], 11);

    let (status, list) = s.get("/tools/list");
    assert_eq!(status, 200);
    let names: Vec<&str> = list["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, crate::tools::listed(&["echo", "nap", "slow"]));
    assert!(!list.to_string().contains("very-secret-value-123"));

    let (status, found) = s.post("/tools/search", json!({"query": "roll back a deploy", "limit": 3}));
    assert_eq!(status, 200);
    let top = &found["results"][0];
    assert_eq!(top["title"], "Deploy runbook");
    let (status, doc) = s.post("/tools/get", json!({"id": top["id"]}));
    assert_eq!((status, doc["title"].as_str()), (200, Some("Deploy runbook")));

    let (status, get_sources) = s.get("/tools/sources");
    let (status2, post_sources) = s.post("/tools/sources", json!({}));
    assert_eq!((status, status2), (200, 200));
    assert_eq!(get_sources, post_sources);
    assert_eq!(get_sources["sources"][0]["name"], "filesystem:docs");

    let (status, echoed) = s.post("/tools/echo", json!({"message": "hi", "repeat": 2}));
    assert_eq!(status, 200);
    assert_eq!(echoed, json!({"result": {"greeting": "hello", "message": "hi hi"}}));
    insta::assert_json_snapshot!("http_echo", echoed);
    insta::assert_json_snapshot!("http_sources", redact_times(get_sources));
    // What the server holds varies from run to run; its shape does not.
    let mut health = health;
    for volatile in ["connections", "tasks"] {
        assert!(health["load"][volatile].is_u64(), "{health}");
        health["load"][volatile] = json!(format!("[{volatile}]"));
    }
    insta::assert_json_snapshot!("http_health", health);
    insta::assert_json_snapshot!("http_tools_list", list);
    insta::assert_json_snapshot!("http_search", redact_times(found));
    insta::assert_json_snapshot!("http_get", redact_times(doc));
}

/// Replaces timestamps (which depend on when the fixture was written) with a marker.
fn redact_times(mut value: Value) -> Value {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if (key.ends_with("_at") || key == "last_sync") && v.is_string() {
                        *v = json!("[time]");
                    } else if key == "last_sync_seconds" && v.is_number() {
                        *v = json!("[seconds]");
                    } else {
                        walk(v);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut value);
    value
}

#[test]
fn every_error_is_the_envelope_with_its_status() {
    let s = start(None, &[]);
    let mut bodies = serde_json::Map::new();
    let mut check = |label: &str, (status, body): (u16, Value), want: u16, code: &str| {
        assert_envelope(status, &body, want, code);
        bodies.insert(label.to_string(), json!({"status": status, "body": body}));
    };
    check("unknown_tool", s.post("/tools/nope", json!({})), 404, "not_found");
    check("invalid_params", s.post("/tools/echo", json!({"repeat": "x", "extra": 1})), 400, "bad_request");
    check("unknown_document", s.post("/tools/get", json!({"id": "nope"})), 404, "not_found");
    check(
        "semantic_unavailable",
        s.post("/tools/search", json!({"query": "x", "mode": "semantic"})),
        400,
        "bad_request",
    );
    check("unknown_route", s.get("/nope"), 404, "not_found");
    check("wrong_method_list", s.post("/tools/list", json!({})), 405, "method_not_allowed");
    check("wrong_method_tool", s.get("/tools/echo"), 405, "method_not_allowed");
    let raw = |body: &'static str, content_type: Option<&str>| {
        let mut request = s.client.post(format!("{}/tools/echo", s.base)).body(body);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let (status, body, _) = s.send(request);
        (status, body)
    };
    check("malformed_json", raw("{\"message\": ", Some("application/json")), 400, "bad_request");
    check(
        "wrong_content_type",
        raw("message=hi", Some("application/x-www-form-urlencoded")),
        415,
        "unsupported_media_type",
    );
    check("no_content_type", raw("{\"message\":\"hi\"}", None), 415, "unsupported_media_type");
    let big = format!("{{\"message\": \"{}\"}}", "x".repeat(10_000));
    let (status, body, _) =
        s.send(s.client.post(format!("{}/tools/echo", s.base)).header("content-type", "application/json").body(big));
    check("too_large", (status, body), 413, "payload_too_large");

    // A tool that loops times out with 408 while other calls keep being served.
    let slow = {
        let (client, base) = (s.client.clone(), s.base.clone());
        s.runtime.spawn(async move {
            let started = Instant::now();
            let response = client.post(format!("{base}/tools/slow")).json(&json!({})).send().await.unwrap();
            (response.status().as_u16(), response.json::<Value>().await.unwrap(), started.elapsed())
        })
    };
    // Echo calls one after another until the loop has ended: the slow call runs for its whole
    // second, so most of them are answered while it loops, each promptly.
    let mut answered = 0;
    while !slow.is_finished() {
        let started = Instant::now();
        assert_eq!(s.post("/tools/echo", json!({"message": "still here"})).0, 200);
        assert!(started.elapsed() < Duration::from_millis(500), "other calls are not blocked by the loop");
        answered += 1;
    }
    assert!(answered >= 5, "only {answered} echo calls while the loop ran");
    let (status, body, took) = s.runtime.block_on(slow).unwrap();
    assert!(took < Duration::from_secs(3));
    check("timeout", (status, body), 408, "timeout");
    assert_eq!(bodies["timeout"]["body"]["error"]["message"], "tool 'slow' timed out after 1 second");
    assert_eq!(s.get("/health").0, 200);
    insta::assert_json_snapshot!("http_error_bodies", bodies);
}

#[test]
fn shutdown_lets_in_flight_calls_finish_then_stops_listening() {
    let mut s = start(None, &[]);
    let nap = {
        let (client, base) = (s.client.clone(), s.base.clone());
        s.runtime.spawn(async move {
            let response = client.post(format!("{base}/tools/nap")).json(&json!({})).send().await.unwrap();
            (response.status().as_u16(), response.json::<Value>().await.unwrap())
        })
    };
    std::thread::sleep(Duration::from_millis(250));
    let stopped_at = Instant::now();
    s.stop.take().unwrap().send(()).unwrap();
    let (status, body) = s.runtime.block_on(nap).unwrap();
    assert_eq!((status, body), (200, json!({"result": "rested"})), "the in-flight call finished");
    let server = s.server.take().unwrap();
    s.runtime.block_on(async { tokio::time::timeout(Duration::from_secs(5), server).await }).unwrap().unwrap().unwrap();
    assert!(stopped_at.elapsed() < server::GRACE, "stopped once the call finished, not at the grace limit");
    let refused = s.runtime.block_on(s.client.get(format!("{}/health", s.base)).send());
    assert!(refused.is_err(), "no longer listening: {refused:?}");
}

/// Every route but `/health`, `/openapi.json` and the Swagger UI pages refuses a request without
/// the token, and lets the same request through with it: each operation of the OpenAPI document,
/// `/mcp` (both eras) and an unknown path. "Through" means the guard did not answer: the route's
/// own status comes back.
#[test]
fn the_bearer_token_guards_every_route_but_health_and_the_documentation() {
    let token = "0123456789abcdef-token";
    let s = start(Some(token), &[]);
    assert_eq!(s.get("/health").0, 200);
    let (status, body, headers) = s.send(s.client.get(format!("{}/tools/list", s.base)));
    assert_envelope(status, &body, 401, "unauthorized");
    assert_eq!(headers["www-authenticate"], "Bearer");
    let (status, body, _) =
        s.send(s.client.get(format!("{}/tools/list", s.base)).bearer_auth("wrong-token-wrong-token"));
    assert_envelope(status, &body, 401, "unauthorized");
    let (status, body, _) =
        s.send(s.client.post(format!("{}/tools/echo", s.base)).bearer_auth(token).json(&json!({"message": "m"})));
    assert_eq!((status, &body["result"]["message"]), (200, &json!("m")));

    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "it", "version": "0"}}});
    let stateless = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "echo", "arguments": {"message": "m"},
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}}});
    type Build<'a> = Box<dyn Fn() -> reqwest::RequestBuilder + 'a>;
    let url = |path: &str| format!("{}{path}", s.base);
    let mcp = |body: &Value, era: &str| {
        let mut request = s
            .client
            .post(url("/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        if era == "2026-07-28" {
            request = request
                .header("mcp-protocol-version", era)
                .header("mcp-method", "tools/call")
                .header("mcp-name", "echo");
        }
        request
    };
    // (what, request, the status the route itself gives once the guard lets it through)
    let routes: Vec<(&str, Build, u16)> = vec![
        ("GET /tools/list", Box::new(|| s.client.get(url("/tools/list"))), 200),
        ("POST /tools/search", Box::new(|| s.client.post(url("/tools/search")).json(&json!({"query": "deploy"}))), 200),
        ("GET /tools/sources", Box::new(|| s.client.get(url("/tools/sources"))), 200),
        ("POST /mcp initialize (2025-11-25)", Box::new(|| mcp(&initialize, "2025-11-25")), 200),
        ("POST /mcp tools/call (2026-07-28)", Box::new(|| mcp(&stateless, "2026-07-28")), 200),
        (
            "GET /mcp without a session",
            Box::new(|| s.client.get(url("/mcp")).header("accept", "text/event-stream")),
            400,
        ),
        ("GET /agents/list", Box::new(|| s.client.get(url("/agents/list"))), 200),
        ("POST /agents/nobody/prompt", Box::new(|| s.client.post(url("/agents/nobody/prompt")).json(&json!({}))), 404),
        ("GET /no/such/route", Box::new(|| s.client.get(url("/no/such/route"))), 404),
    ];
    for (what, request, through) in &routes {
        let (status, body, _) = s.send(request());
        assert_envelope(status, &body, 401, "unauthorized");
        let (status, body, _) = s.send(request().bearer_auth(token));
        assert_eq!(status, *through, "{what} with the token: {body}");
    }
    // Every operation of the document, whatever the list above names: each path parameter
    // filled in, each POST with an empty object.
    let document = server::openapi::document(None);
    let mut open = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        let concrete = path.replace("{name}", "echo").replace("{id}", "ap-nope");
        for method in item.as_object().unwrap().keys() {
            let what = format!("{} {path}", method.to_uppercase());
            let request = || match method.as_str() {
                "get" => s.client.get(url(&concrete)),
                "post" => s.client.post(url(&concrete)).json(&json!({})),
                "delete" => s.client.delete(url(&concrete)),
                other => panic!("{what}: a method this test does not send ({other})"),
            };
            let (status, body, _) = s.send(request());
            if status != 401 {
                open.push(what);
                continue;
            }
            assert_envelope(status, &body, 401, "unauthorized");
            let (status, body, _) = s.send(request().bearer_auth(token));
            assert_ne!(status, 401, "{what} with the token: {body}");
        }
    }
    assert_eq!(open, ["GET /health", "GET /openapi.json"], "the operations open without the token");
    // The Swagger UI page and the published document are open (issue 16 item 13; see wire.rs):
    // without the token, /openapi.json is the checked-in document, nothing of this server's
    // own tools or agents.
    let (status, _, _) = s.send(s.client.get(url("/docs/")));
    assert_eq!(status, 200);
    let (status, open, _) = s.send(s.client.get(url("/openapi.json")));
    let published: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("openapi/openapi.json")).unwrap()).unwrap();
    assert_eq!((status, &open), (200, &published));
}

#[test]
fn origins_and_hosts_are_checked() {
    let s = start(None, &["https://app.example.com"]);
    let with_origin = |origin: &str| {
        s.send(s.client.post(format!("{}/tools/echo", s.base)).header("origin", origin).json(&json!({"message": "o"})))
    };
    let (status, _, headers) = with_origin("https://app.example.com");
    assert_eq!(status, 200);
    assert_eq!(headers["access-control-allow-origin"], "https://app.example.com");
    let (status, body, headers) = with_origin("https://evil.example");
    assert_envelope(status, &body, 403, "forbidden");
    assert!(headers.get("access-control-allow-origin").is_none());
    // Same-origin (Swagger UI served by ctx itself) is allowed.
    let own = s.base.clone();
    assert_eq!(with_origin(&own).0, 200);
    // DNS rebinding: a foreign Host name on a loopback server is refused.
    let (status, body, _) =
        s.send(s.client.get(format!("{}/tools/list", s.base)).header("host", "attacker.example:7391"));
    assert_envelope(status, &body, 403, "forbidden");
    // No origins configured: no CORS headers at all, and cross-site requests are refused.
    let closed = start(None, &[]);
    let (status, body, headers) = closed.send(
        closed
            .client
            .post(format!("{}/tools/echo", closed.base))
            .header("origin", "https://app.example.com")
            .json(&json!({"message": "o"})),
    );
    assert_envelope(status, &body, 403, "forbidden");
    assert!(headers.get("access-control-allow-origin").is_none());
}

#[test]
fn a_public_bind_without_a_token_is_refused() {
    let err = Security::new("0.0.0.0:7391".parse().unwrap(), None, vec![]).unwrap_err();
    assert!(err.contains("without server.auth_token"), "{err}");
    assert!(Security::new("0.0.0.0:7391".parse().unwrap(), Some("a-long-enough-token".into()), vec![]).is_ok());
    let ws = crate::common::Workspace::new("[server]\nbind = \"0.0.0.0:0\"\n");
    let run = ws.ctx(&["serve"]);
    assert_eq!(run.code(), 2);
    assert!(run.stderr().contains("refusing to listen on 0.0.0.0:0 without server.auth_token"), "{}", run.stderr());
}

#[test]
fn openapi_is_served_with_each_lua_tool_and_swagger_ui_points_at_it() {
    let s = start(None, &[]);
    let (status, doc) = s.get("/openapi.json");
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let echo = &doc["paths"]["/tools/echo"]["post"];
    assert_eq!(echo["requestBody"]["content"]["application/json"]["schema"]["properties"]["message"]["type"], "string");
    assert!(doc["paths"]["/tools/slow"]["post"].is_object());
    assert_eq!(
        doc["paths"]["/tools/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/SearchRequest"
    );

    // /docs serves the page itself (its relative links resolve under /docs/, see wire.rs).
    let (status, html, headers) = s.send(s.client.get(format!("{}/docs", s.base)));
    assert_eq!(status, 200);
    assert!(headers["content-type"].to_str().unwrap().starts_with("text/html"));
    assert!(html.as_str().unwrap().contains("swagger"), "the UI page");
    let (status, init, _) = s.send(s.client.get(format!("{}/docs/swagger-initializer.js", s.base)));
    assert_eq!(status, 200);
    assert!(init.as_str().unwrap().contains("/openapi.json"), "the UI loads /openapi.json");
}

#[test]
fn the_checked_in_openapi_document_is_current() {
    let path = crate::common::repo().join("openapi/openapi.json");
    let checked_in: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let generated = server::openapi::document(None);
    assert!(
        checked_in == generated,
        "openapi/openapi.json is out of date; regenerate it with: cargo run -q -- schema export --out target/schemas && cp target/schemas/openapi.json openapi/"
    );
}
