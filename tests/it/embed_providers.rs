//! Network embedding providers: `ollama` and `openai` against a local HTTP stub that
//! stands in for the services (batching, order, retries, Retry-After, timeouts, refused
//! connections, wrong answers, error messages, and the key kept out of them).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctx::config::Config;
use ctx::embed::{EmbedError, Embedder};
use serde_json::{json, Value};

use crate::common::Workspace;

/// The key the openai tests use; no error message may ever contain it.
const KEY: &str = "sk-test-embed19-VERYSECRET-0123456789";

/// One request the stub received.
struct Seen {
    path: String,
    /// Lower-case header names.
    headers: BTreeMap<String, String>,
    body: Value,
    at: Instant,
}

/// What the stub answers to one request.
struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Value,
    delay: Duration,
}

fn ok(body: Value) -> Answer {
    Answer { status: 200, headers: Vec::new(), body, delay: Duration::ZERO }
}

fn status(status: u16, body: Value) -> Answer {
    Answer { status, headers: Vec::new(), body, delay: Duration::ZERO }
}

/// A service stand-in on 127.0.0.1:0: `reply(n, request)` answers the n-th request (0-based).
struct Stub {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Stub {
    fn start(reply: impl Fn(usize, &Seen) -> Answer + Send + Sync + 'static) -> Stub {
        use axum::http::{HeaderMap, Uri};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind stub");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        let reply = Arc::new(reply);
        let handler = move |uri: Uri, headers: HeaderMap, body: axum::body::Bytes| {
            let (log, reply) = (log.clone(), reply.clone());
            async move {
                let request = Seen {
                    path: uri.path().to_string(),
                    headers: headers
                        .iter()
                        .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or_default().to_string()))
                        .collect(),
                    body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                    at: Instant::now(),
                };
                let answer = {
                    let mut log = log.lock().unwrap();
                    let answer = reply(log.len(), &request);
                    log.push(request);
                    answer
                };
                tokio::time::sleep(answer.delay).await;
                let mut response =
                    axum::http::Response::builder().status(answer.status).header("content-type", "application/json");
                for (name, value) in answer.headers {
                    response = response.header(name, value);
                }
                response.body(axum::body::Body::from(answer.body.to_string())).unwrap()
            }
        };
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, axum::Router::new().fallback(handler)).await.unwrap();
            });
        });
        Stub { url, seen }
    }

    fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

/// The vector the stubs give text `tK`: `[K + 1, 1, 0, 0]`, not unit length on purpose.
fn vector_of(text: &Value) -> Value {
    let k: f32 = text.as_str().and_then(|t| t.strip_prefix('t')).and_then(|k| k.parse().ok()).unwrap_or(0.0);
    json!([k + 1.0, 1.0, 0.0, 0.0])
}

fn inputs(seen: &Seen) -> Vec<Value> {
    seen.body["input"].as_array().cloned().unwrap_or_default()
}

/// Ollama's happy answer.
fn ollama_answer(seen: &Seen) -> Answer {
    ok(json!({ "model": "nomic-embed-text", "embeddings": inputs(seen).iter().map(vector_of).collect::<Vec<_>>() }))
}

/// OpenAI's happy answer, listed in reverse so only `index` gives the order.
fn openai_answer(seen: &Seen) -> Answer {
    let mut data: Vec<Value> = inputs(seen)
        .iter()
        .enumerate()
        .map(|(i, t)| json!({ "object": "embedding", "index": i, "embedding": vector_of(t) }))
        .collect();
    data.reverse();
    ok(json!({ "object": "list", "data": data, "model": "text-embedding-3-small" }))
}

/// The embedder a real `ctx.toml` with this `[embedding]` section builds, `EMBED19_KEY` set.
fn embedder(section: &str) -> Result<Arc<dyn Embedder>, EmbedError> {
    let ws = Workspace::new(&format!("[embedding]\n{section}"));
    let file = ws.path().join("ctx.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let env = |name: &str| (name == "EMBED19_KEY").then(|| KEY.to_string());
    let config = Config::from_text(&text, Path::new("ctx.toml"), &file, &env).expect("config loads");
    Ok(ctx::embed::from_config(&config)?.expect("a provider is configured"))
}

fn ollama(url: &str, extra: &str) -> Arc<dyn Embedder> {
    embedder(&format!("provider = \"ollama\"\nmodel = \"nomic-embed-text\"\ndims = 4\nurl = \"{url}\"\n{extra}"))
        .expect("ollama embedder")
}

fn openai(url: &str, extra: &str) -> Arc<dyn Embedder> {
    embedder(&format!(
        "provider = \"openai\"\nmodel = \"text-embedding-3-small\"\ndims = 4\nurl = \"{url}/v1\"\n\
         api_key = \"${{EMBED19_KEY}}\"\n{extra}"
    ))
    .expect("openai embedder")
}

/// The error of a call that must fail, as the user reads it; never with the key in it.
fn failure(embedder: &dyn Embedder, texts: &[&str]) -> String {
    let message = embedder.embed(texts).expect_err("the call must fail").to_string();
    eprintln!("{message}");
    assert!(!message.contains(KEY), "the key leaked: {message}");
    assert!(!message.contains("VERYSECRET"), "part of the key leaked: {message}");
    message
}

fn assert_unit(vector: &[f32]) {
    let norm: f32 = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "not unit length: {vector:?}");
}

#[test]
fn ollama_batches_in_order_and_normalizes() {
    let stub = Stub::start(|_, seen| ollama_answer(seen));
    let embedder = ollama(&stub.url, "batch_size = 2\n");
    assert_eq!(embedder.name(), "ollama:nomic-embed-text");
    assert_eq!(embedder.dims(), 4);
    assert!(embedder.remote());
    let texts = ["t0", "t1", "  ", "t2", "t3", "t4"];
    let vectors = embedder.embed(&texts).unwrap();
    assert_eq!(vectors.len(), 6);
    // Five non-blank texts in batches of 2: three requests, in order.
    let seen = stub.seen.lock().unwrap();
    assert_eq!(seen.len(), 3);
    let sent: Vec<Vec<Value>> = seen.iter().map(inputs).collect();
    assert_eq!(sent, vec![vec![json!("t0"), json!("t1")], vec![json!("t2"), json!("t3")], vec![json!("t4")]]);
    for s in seen.iter() {
        assert_eq!(s.path, "/api/embed");
        assert_eq!(s.body["model"], "nomic-embed-text");
        assert!(!s.headers.contains_key("authorization"), "no key configured, none sent");
    }
    // The blank text is the zero vector and was not sent.
    assert_eq!(vectors[2], vec![0.0; 4]);
    for (vector, k) in [(&vectors[0], 0.0f32), (&vectors[1], 1.0), (&vectors[3], 2.0), (&vectors[5], 4.0)] {
        assert_unit(vector);
        let norm = ((k + 1.0) * (k + 1.0) + 1.0).sqrt();
        assert!((vector[0] - (k + 1.0) / norm).abs() < 1e-6 && (vector[1] - 1.0 / norm).abs() < 1e-6, "{vector:?}");
    }
    drop(seen);
    assert!(embedder.embed(&[]).unwrap().is_empty());
    assert_eq!(stub.count(), 3, "no texts, no request");
}

#[test]
fn openai_orders_by_index_and_sends_the_key() {
    let stub = Stub::start(|_, seen| openai_answer(seen));
    let embedder = openai(&stub.url, "batch_size = 3\n");
    assert_eq!(embedder.name(), "openai:text-embedding-3-small");
    let vectors = embedder.embed(&["t0", "t1", "t2"]).unwrap();
    for (k, vector) in vectors.iter().enumerate() {
        assert_unit(vector);
        // Text k has the largest first component of all: order by index, not by position.
        let norm = (((k + 1) * (k + 1) + 1) as f32).sqrt();
        assert!((vector[0] - (k as f32 + 1.0) / norm).abs() < 1e-6, "vector {k} is {vector:?}");
    }
    let seen = stub.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/embeddings");
    assert_eq!(seen[0].headers.get("authorization").map(String::as_str), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(seen[0].body["model"], "text-embedding-3-small");
    // text-embedding-3 models can shorten their vectors: ctx asks for dims.
    assert_eq!(seen[0].body["dimensions"], 4);
}

#[test]
fn openai_other_models_get_no_dimensions_field() {
    let stub = Stub::start(|_, seen| openai_answer(seen));
    let embedder = embedder(&format!(
        "provider = \"openai\"\nmodel = \"bge-small\"\ndims = 4\nurl = \"{}/v1/embeddings\"\n",
        stub.url
    ))
    .unwrap();
    embedder.embed(&["t0"]).unwrap();
    let seen = stub.seen.lock().unwrap();
    assert_eq!(seen[0].path, "/v1/embeddings", "a full endpoint URL is used as is");
    assert!(seen[0].body.get("dimensions").is_none(), "{}", seen[0].body);
    assert!(!seen[0].headers.contains_key("authorization"), "no api_key, no header");
}

#[test]
fn retry_after_is_honoured_on_429() {
    let stub = Stub::start(|n, seen| match n {
        0 => Answer {
            headers: vec![("retry-after", "1".to_string())],
            ..status(429, json!({"error": {"message": "Rate limit reached", "type": "requests"}}))
        },
        _ => openai_answer(seen),
    });
    let embedder = openai(&stub.url, "max_retries = 2\n");
    let vectors = embedder.embed(&["t0", "t1"]).unwrap();
    assert_eq!(vectors.len(), 2);
    let seen = stub.seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "one 429, one success");
    let waited = seen[1].at - seen[0].at;
    assert!(waited >= Duration::from_millis(950), "retried after {waited:?}, Retry-After said 1 s");
}

#[test]
fn huge_retry_after_fails_fast() {
    let stub = Stub::start(|_, _| Answer {
        headers: vec![("retry-after", "3600".to_string())],
        ..status(429, json!({"error": {"message": "You exceeded your current quota"}}))
    });
    let embedder = openai(&stub.url, "max_retries = 4\n");
    let started = Instant::now();
    let message = failure(&*embedder, &["t0"]);
    assert!(started.elapsed() < Duration::from_secs(30), "it waited: {:?}", started.elapsed());
    assert_eq!(stub.count(), 1, "no retry when the wait is beyond the cap");
    for part in ["openai:text-embedding-3-small", "/v1/embeddings", "HTTP 429", "3600 s (Retry-After)", "60 s", "quota"]
    {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}

#[test]
fn server_error_is_retried() {
    let stub = Stub::start(|n, seen| match n {
        0 => status(500, json!({"error": "llama runner process has terminated"})),
        _ => ollama_answer(seen),
    });
    let embedder = ollama(&stub.url, "max_retries = 1\n");
    assert_eq!(embedder.embed(&["t0"]).unwrap().len(), 1);
    assert_eq!(stub.count(), 2);

    // With no retries left, the service's own words and what to do.
    let stub = Stub::start(|_, _| status(503, json!({"error": "server busy"})));
    let message = failure(&*ollama(&stub.url, "max_retries = 0\n"), &["t0"]);
    assert!(message.contains("HTTP 503: server busy") && message.contains("max_retries = 0"), "{message}");
    assert_eq!(stub.count(), 1);
}

#[test]
fn timeout_names_the_provider() {
    let stub = Stub::start(|_, seen| Answer { delay: Duration::from_secs(3), ..ollama_answer(seen) });
    let embedder = ollama(&stub.url, "timeout_secs = 1\nmax_retries = 1\n");
    let started = Instant::now();
    let message = failure(&*embedder, &["t0"]);
    assert!(started.elapsed() < Duration::from_secs(6), "took {:?}", started.elapsed());
    assert_eq!(stub.count(), 2, "a timeout is retried");
    for part in ["ollama:nomic-embed-text", &stub.url, "timed out", "timeout_secs = 1", "gave up after 1 retry"] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}

#[test]
fn connection_refused_says_start_ollama() {
    // A port that was free a moment ago and has nothing listening now.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let message = failure(&*ollama(&format!("http://127.0.0.1:{port}"), "max_retries = 1\n"), &["t0"]);
    for part in
        ["ollama:nomic-embed-text", "connection refused", "ollama serve", &format!("127.0.0.1:{port}/api/embed")]
    {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
    let message = failure(&*openai(&format!("http://127.0.0.1:{port}"), "max_retries = 0\n"), &["t0"]);
    assert!(message.contains("connection refused") && message.contains("[embedding] url"), "{message}");
}

#[test]
fn wrong_answers_are_rejected() {
    let stub = Stub::start(|n, seen| match n {
        0 => ok(json!({"embeddings": [[1.0, 0.0, 0.0, 0.0]]})),
        1 => ok(json!({"embeddings": [[1.0, 0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]]})),
        2 => ok(json!({"embeddings": [[1e39, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]})),
        3 => ok(json!({"embeddings": [[1.0, 0.0, 0.0, 0.0], [1.0, 0.0]]})),
        4 => ok(json!({"data": "not here"})),
        _ => ollama_answer(seen),
    });
    let embedder = ollama(&stub.url, "max_retries = 3\n");
    let texts = ["t0", "t1"];
    let message = failure(&*embedder, &texts);
    assert!(message.contains("asked for 2 vectors and got 1"), "{message}");
    let message = failure(&*embedder, &texts);
    assert!(message.contains("has 5 dimensions but [embedding] dims = 4"), "{message}");
    // JSON has no NaN or infinity; a number beyond f32 is the way an answer gets there.
    let message = failure(&*embedder, &texts);
    assert!(message.contains("number out of range"), "{message}");
    let message = failure(&*embedder, &texts);
    assert!(message.contains("vector 1 has 2 dimensions"), "{message}");
    let message = failure(&*embedder, &texts);
    assert!(message.contains("is url an Ollama server"), "{message}");
    assert_eq!(stub.count(), 5, "a wrong answer is not retried");
    assert_eq!(embedder.embed(&texts).unwrap().len(), 2, "the next call works");

    // OpenAI: indices must be each of 0..n once.
    let stub = Stub::start(|n, _| match n {
        0 => ok(json!({"data": [{"index": 0, "embedding": [1, 0, 0, 0]}, {"index": 0, "embedding": [0, 1, 0, 0]}]})),
        _ => ok(json!({"data": [{"index": 0, "embedding": [1, 0, 0, 0]}, {"index": 7, "embedding": [0, 1, 0, 0]}]})),
    });
    let embedder = openai(&stub.url, "");
    assert!(failure(&*embedder, &texts).contains("index 0 twice"));
    assert!(failure(&*embedder, &texts).contains("index 7 for 2 vectors"));
}

#[test]
fn unauthorized_mentions_api_key_and_hides_it() {
    // OpenAI echoes the key it refused; ctx must not pass it on.
    let stub = Stub::start(|_, _| {
        status(
            401,
            json!({"error": {"message": format!("Incorrect API key provided: {KEY}."), "type": "invalid_request_error"}}),
        )
    });
    let message = failure(&*openai(&stub.url, ""), &["t0"]);
    assert_eq!(stub.count(), 1, "401 is not retried");
    for part in ["openai:text-embedding-3-small", "HTTP 401", "Incorrect API key provided", "api_key", "${VAR}"] {
        assert!(message.contains(part), "{part:?} missing from: {message}");
    }
}

#[test]
fn ollama_404_says_pull_the_model() {
    let stub =
        Stub::start(|_, _| status(404, json!({"error": "model \"nomic-embed-text\" not found, try pulling it first"})));
    let message = failure(&*ollama(&stub.url, ""), &["t0"]);
    assert_eq!(stub.count(), 1);
    assert!(message.contains("not found, try pulling it first"), "{message}");
    assert!(message.contains("`ollama pull nomic-embed-text`"), "{message}");
}

#[test]
fn config_errors_name_the_key() {
    let error = |section: &str| match embedder(section) {
        Ok(_) => panic!("built from:\n{section}"),
        Err(e @ EmbedError::Config(_)) => e.to_string(),
        Err(e) => panic!("not a config error: {e}"),
    };
    let message = error("provider = \"ollama\"\ndims = 768\n");
    assert!(message.contains("needs `model`") && message.contains("nomic-embed-text"), "{message}");
    let message = error("provider = \"openai\"\nmodel = \"text-embedding-3-small\"\n");
    assert!(message.contains("set dims = N") && message.contains("1536"), "{message}");
    let message = error("provider = \"ollama\"\nmodel = \"nomic-embed-text\"\n");
    assert!(message.contains("768 for nomic-embed-text"), "{message}");
}

#[test]
fn called_inside_a_runtime_does_not_panic() {
    let stub = Stub::start(|_, seen| ollama_answer(seen));
    let embedder = ollama(&stub.url, "");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let vectors = runtime.block_on(async move { embedder.embed(&["t0", "t1"]) }).unwrap();
    assert_eq!(vectors.len(), 2);
}
