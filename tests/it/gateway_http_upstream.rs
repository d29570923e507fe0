//! ctx in front of a real third-party Streamable HTTP upstream (server-everything's
//! `streamableHttp` mode): calls, progress, cancellation, and the upstream restarted under ctx,
//! with and without its event stream.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{test_command, ServeChild, Workspace, BIN};

/// How long a server may take to start or to be reconnected.
const WAIT: Duration = Duration::from_secs(20);

/// server-everything in `streamableHttp` mode on a port of its own; killed on drop.
struct Everything {
    child: Child,
    port: u16,
}

impl Everything {
    /// Starts it on `port` (a free one when `None`) and waits until it listens. A port just
    /// freed by a killed server may need a moment before it can be bound again.
    fn start(command: &[String], port: Option<u16>) -> Everything {
        let deadline = Instant::now() + WAIT;
        loop {
            let port = port
                .unwrap_or_else(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
            let mut child = Command::new(&command[0])
                .args(&command[1..])
                .arg("streamableHttp")
                .env("PORT", port.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start server-everything");
            // It says on stderr when it listens, or why it could not.
            let stderr = child.stderr.take().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
            let listening = loop {
                match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(line) if line.contains("listening on port") => break true,
                    Ok(_) => {}
                    Err(_) => break false,
                }
            };
            if listening {
                return Everything { child, port };
            }
            let _ = child.kill();
            let _ = child.wait();
            assert!(Instant::now() < deadline, "server-everything did not listen on port {port} within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for Everything {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A recording proxy in front of the upstream: every request body ctx sends is kept, and with
/// `streams = false` it refuses the event stream (`GET`, 405) as servers without one do, so a
/// lost session shows only in the answer to the next request.
struct Proxy {
    addr: std::net::SocketAddr,
    bodies: Arc<Mutex<Vec<String>>>,
}

fn proxy(runtime: &tokio::runtime::Runtime, upstream: String, streams: bool) -> Proxy {
    use axum::body::{Body, Bytes};
    use axum::http::{HeaderMap, Method, StatusCode};
    use axum::response::Response;
    let bodies: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = Arc::clone(&bodies);
    let client = reqwest::Client::new();
    let forward = move |method: Method, headers: HeaderMap, body: Bytes| {
        let (client, upstream, kept) = (client.clone(), upstream.clone(), Arc::clone(&kept));
        async move {
            if method == Method::GET && !streams {
                return Response::builder().status(StatusCode::METHOD_NOT_ALLOWED).body(Body::empty()).unwrap();
            }
            kept.lock().unwrap().push(String::from_utf8_lossy(&body).into_owned());
            let mut request = client.request(method, &upstream).body(body);
            for (name, value) in &headers {
                if name != "host" && name != "content-length" {
                    request = request.header(name, value);
                }
            }
            match request.send().await {
                Ok(answer) => {
                    let mut response = Response::builder().status(answer.status().as_u16());
                    for (name, value) in answer.headers() {
                        if name != "content-length" && name != "transfer-encoding" {
                            response = response.header(name, value);
                        }
                    }
                    response.body(Body::from_stream(answer.bytes_stream())).unwrap()
                }
                // The upstream is down: the connection is refused, as it would be without us.
                Err(_) => Response::builder().status(StatusCode::BAD_GATEWAY).body(Body::empty()).unwrap(),
            }
        }
    };
    let app = axum::Router::new().route("/mcp", axum::routing::any(forward));
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move { axum::serve(listener, app).await });
    Proxy { addr, bodies }
}

/// A `ctx serve` with one upstream, `evhttp`, at `url`.
struct Ctx {
    _ws: Workspace,
    serve: ServeChild,
    client: reqwest::Client,
}

impl Ctx {
    fn start(url: &str) -> Ctx {
        let ws = Workspace::new(&format!("[mcp.servers.evhttp]\nurl = \"{url}\"\ntimeout = 60\n"));
        let serve = ServeChild::spawn(Command::new(BIN).current_dir(ws.path()).env_remove("CTX_CONFIG").args([
            "serve",
            "--bind",
            "127.0.0.1:0",
        ]));
        Ctx { _ws: ws, serve, client: reqwest::Client::new() }
    }

    async fn call(&self, tool: &str, arguments: Value) -> (u16, Value) {
        let url = format!("http://{}/tools/{tool}", self.serve.addr);
        let response = self.client.post(url).json(&arguments).send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
    }

    /// The upstream's entry in `/health`.
    async fn upstream(&self) -> Value {
        let url = format!("http://{}/health", self.serve.addr);
        let health: Value = self.client.get(url).send().await.unwrap().json().await.unwrap();
        health["upstreams"].as_array().and_then(|u| u.first()).cloned().unwrap_or(Value::Null)
    }

    /// Waits until `/health` shows the upstream `state`; its entry then.
    async fn until_state(&self, state: &str) -> Value {
        self.until(state, |_| true).await
    }

    /// Waits until the upstream is in `state` and `also` holds of what `/health` says.
    async fn until(&self, state: &str, also: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let upstream = self.upstream().await;
            if upstream["state"] == state && also(&upstream) {
                return upstream;
            }
            assert!(Instant::now() < deadline, "the upstream never became {state}: {upstream}\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn metric(&self, line_start: &str) -> Option<String> {
        let url = format!("http://{}/metrics", self.serve.addr);
        let text = self.client.get(url).send().await.unwrap().text().await.unwrap();
        text.lines().find(|l| l.starts_with(line_start)).map(str::to_string)
    }

    fn log(&self) -> String {
        self.serve.stderr.lock().unwrap().clone()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    // ctx's reqwest brings no TLS provider of its own (plain http here, but a client needs one).
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn sum_of(body: &Value) -> &str {
    body["result"].as_str().unwrap_or_default()
}

#[test]
fn a_restarted_http_upstream_is_marked_down_then_reconnected_and_relisted() {
    let Some(command) = test_command("CTX_TEST_EVERYTHING") else { return };
    let rt = runtime();
    let everything = Everything::start(&command, None);
    let port = everything.port;
    let ctx = Ctx::start(&everything.url());
    rt.block_on(async {
        ctx.until_state("ready").await;
        let (status, body) = ctx.call("evhttp__get-sum", json!({"a": 1, "b": 2})).await;
        assert_eq!((status, sum_of(&body)), (200, "The sum of 1 and 2 is 3."), "{body}");
        // Its tool that runs only as a task (read from the event stream's raw tool list) is
        // offered, and called as a task over the same Streamable HTTP session.
        let url = format!("http://{}/tools/list", ctx.serve.addr);
        let listed = ctx.client.get(url).send().await.unwrap().text().await.unwrap();
        assert!(listed.contains("evhttp__get-sum") && listed.contains("evhttp__simulate-research-query"), "{listed}");
        let (status, body) = ctx.call("evhttp__simulate-research-query", json!({"topic": "over http"})).await;
        assert_eq!(status, 200, "{body}");
        assert!(sum_of(&body).starts_with("# Research Report: over http"), "{body}");

        // The upstream goes away: ctx notices without a call (its event stream breaks), and
        // health and the metric say so.
        drop(everything);
        let down = ctx.until_state("restarting").await;
        assert!(down["last_error"].as_str().is_some_and(|e| !e.is_empty()), "{down}");
        let up = ctx.metric("ctx_upstream_up{server=\"evhttp\"}").await;
        assert!(up.as_deref().is_some_and(|l| l.ends_with(" 0")), "{up:?}");

        // Calls meanwhile fail at once, saying the server's state.
        let started = Instant::now();
        let (status, body) = ctx.call("evhttp__get-sum", json!({"a": 1, "b": 2})).await;
        assert!(started.elapsed() < Duration::from_secs(5), "the call waited {:?}", started.elapsed());
        assert_eq!(status, 503, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("'evhttp'") && message.contains("last error"), "{message}");

        // It comes back on the same port: reconnected, re-initialized and relisted by itself.
        let _again = Everything::start(&command, Some(port));
        let ready = ctx.until_state("ready").await;
        assert!(ready["restarts"].as_u64().is_some_and(|r| r >= 1), "{ready}");
        assert!(ready["tools"].as_u64().is_some_and(|t| t > 5), "relisted: {ready}");
        let (status, body) = ctx.call("evhttp__get-sum", json!({"a": 2, "b": 3})).await;
        assert_eq!((status, sum_of(&body)), (200, "The sum of 2 and 3 is 5."), "{body}");
        let up = ctx.metric("ctx_upstream_up{server=\"evhttp\"}").await;
        assert!(up.as_deref().is_some_and(|l| l.ends_with(" 1")), "{up:?}");
    });
}

#[test]
fn a_session_the_restarted_upstream_no_longer_knows_fails_the_call_fast_and_reconnects() {
    let Some(command) = test_command("CTX_TEST_EVERYTHING") else { return };
    let rt = runtime();
    let everything = Everything::start(&command, None);
    let port = everything.port;
    // No event stream: only the next request can show that the session is gone.
    let proxy = proxy(&rt, everything.url(), false);
    let ctx = Ctx::start(&format!("http://{}/mcp", proxy.addr));
    rt.block_on(async {
        ctx.until_state("ready").await;
        let (status, body) = ctx.call("evhttp__get-sum", json!({"a": 1, "b": 2})).await;
        assert_eq!(status, 200, "{body}");

        // Restarted between two calls, faster than anything notices: the new server answers
        // the old session's request with 400 "No valid session ID provided".
        drop(everything);
        let _again = Everything::start(&command, Some(port));
        let started = Instant::now();
        let (status, body) = ctx.call("evhttp__get-sum", json!({"a": 1, "b": 2})).await;
        assert!(started.elapsed() < Duration::from_secs(5), "the call waited {:?}: {body}", started.elapsed());
        assert_eq!(status, 503, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("session"), "the error says the session was refused: {message}");

        // The supervisor reconnects (a new session), and calls work again. (Right after the
        // refused call the state may still read the old "ready": wait for the restart itself.)
        let ready = ctx.until("ready", |u| u["restarts"].as_u64().is_some_and(|r| r >= 1)).await;
        assert!(ready["last_error"].as_str().is_some_and(|e| e.contains("session")), "{ready}");
        let (status, body) = ctx.call("evhttp__get-sum", json!({"a": 4, "b": 4})).await;
        assert_eq!((status, sum_of(&body)), (200, "The sum of 4 and 4 is 8."), "{body}");
    });
}

#[test]
fn progress_of_an_http_upstream_reaches_the_mcp_caller_and_an_abandoned_call_is_cancelled_there() {
    let Some(command) = test_command("CTX_TEST_EVERYTHING") else { return };
    let rt = runtime();
    let everything = Everything::start(&command, None);
    let proxy = proxy(&rt, everything.url(), true);
    let ctx = Ctx::start(&format!("http://{}/mcp", proxy.addr));
    rt.block_on(async {
        ctx.until_state("ready").await;

        // A stateless MCP call with a progress token: the upstream's three steps arrive as
        // progress notifications on the caller's stream, with the caller's token, then the result.
        let tool = "evhttp__trigger-long-running-operation";
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": tool, "arguments": {"duration": 0.6, "steps": 3},
            "_meta": {"progressToken": "p-7", "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}}}});
        let text = ctx
            .client
            .post(format!("http://{}/mcp", ctx.serve.addr))
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", tool)
            .json(&body)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let messages: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect();
        let progress: Vec<&Value> = messages.iter().filter(|m| m["method"] == "notifications/progress").collect();
        assert_eq!(progress.len(), 3, "{text}");
        assert_eq!(progress[2]["params"], json!({"progressToken": "p-7", "progress": 3.0, "total": 3.0}), "{text}");
        let result = messages.iter().find(|m| m["id"] == 1).unwrap_or_else(|| panic!("no result: {text}"));
        let said = result["result"]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(said.starts_with("Long running operation completed"), "{result}");

        // A caller that goes away mid-call: ctx tells the upstream, over HTTP, to stop.
        let url = format!("http://{}/tools/{tool}", ctx.serve.addr);
        let abandoned = reqwest::Client::builder().timeout(Duration::from_millis(800)).build().unwrap();
        let cut = abandoned.post(url).json(&json!({"duration": 30, "steps": 3})).send().await;
        assert!(cut.is_err_and(|e| e.is_timeout()), "the call should still run when the caller leaves");
        let deadline = Instant::now() + WAIT;
        let cancelled = loop {
            let bodies = proxy.bodies.lock().unwrap().clone();
            let started = bodies.iter().rev().find(|b| b.contains("\"tools/call\"") && b.contains("\"duration\":30"));
            let id = started.and_then(|b| serde_json::from_str::<Value>(b).ok()).map(|b| b["id"].clone());
            let cancel = bodies.iter().find(|b| {
                b.contains("notifications/cancelled")
                    && serde_json::from_str::<Value>(b).is_ok_and(|c| Some(&c["params"]["requestId"]) == id.as_ref())
            });
            if let Some(cancel) = cancel {
                break cancel.clone();
            }
            assert!(Instant::now() < deadline, "no notifications/cancelled reached the upstream: {bodies:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(cancelled.contains("abandoned by ctx's caller"), "{cancelled}");
    });
}
