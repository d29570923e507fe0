//! The two operator routes the console stands on, against a real `ctx serve`: `/chat` (one turn
//! with a language model, here a local stub of the OpenAI and Ollama APIs, which are external
//! services) and `/sources/{name}/sync` (a sync started and watched through the server).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{stub, ServeChild, StubRequest, Workspace, BIN};

const ADMIN: &str = "admin-token-0123456789abcdef";
const READER: &str = "reader-token-0123456789abcd";
const KEY: &str = "sk-chat-secret-key-4242";

struct Server {
    _ws: Workspace,
    serve: ServeChild,
    runtime: tokio::runtime::Runtime,
    client: reqwest::Client,
}

impl Server {
    fn start(ws: Workspace) -> Server {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let serve = ServeChild::spawn(
            Command::new(BIN)
                .current_dir(ws.path())
                .env_remove("CTX_CONFIG")
                .env_remove("CTX_LOG")
                .env("CHAT_KEY", KEY)
                .args(["serve", "--bind", "127.0.0.1:0"]),
        );
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        Server { _ws: ws, serve, runtime, client: reqwest::Client::new() }
    }

    fn send(&self, token: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("http://{}{path}", self.serve.addr);
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        self.runtime.block_on(async {
            let mut request = self.client.request(method, url).bearer_auth(token);
            if let Some(body) = body {
                request = request.json(&body);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        })
    }
}

/// The sample workspace with an admin token, a scoped token that may use `search` only, and
/// `extra` appended.
fn workspace(extra: &str) -> Workspace {
    let ws = Workspace::sample();
    let config = std::fs::read_to_string(ws.path().join("ctx.toml")).unwrap();
    let config = config.replacen(
        "[server]\n",
        &format!(
            "[server]\nauth_token = \"{ADMIN}\"\ntokens = [{{ name = \"reader\", token = \"{READER}\", tools = [\"search\"] }}]\n"
        ),
        1,
    );
    ws.write("ctx.toml", &format!("{config}\n{extra}"));
    ws
}

fn chat_section(provider: &str, addr: std::net::SocketAddr) -> String {
    let url = if provider == "openai" { format!("http://{addr}/v1") } else { format!("http://{addr}") };
    format!("[chat]\nprovider = \"{provider}\"\nmodel = \"stub-model\"\nurl = \"{url}\"\napi_key = \"${{CHAT_KEY}}\"\n")
}

fn body(request: &StubRequest) -> Value {
    serde_json::from_str(&request.body).unwrap()
}

/// A model that asks for `search` when the conversation ends with the user, and answers with
/// the tool's result once it has one.
fn openai_model(request: &StubRequest) -> (u16, String) {
    let sent = body(request);
    let last = sent["messages"].as_array().unwrap().last().unwrap().clone();
    let message = if last["role"] == "user" {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "search", "arguments": "{\"query\": \"roll back a deploy\"}"}}]})
    } else {
        json!({"role": "assistant", "content": format!("the tool said {}", last["content"].as_str().unwrap().len())})
    };
    (200, json!({"choices": [{"index": 0, "message": message}]}).to_string())
}

#[test]
fn chat_offers_the_model_only_the_tools_of_the_callers_token_and_keeps_the_key_on_the_server() {
    let (addr, received) = stub(openai_model);
    let s = Server::start(workspace(&chat_section("openai", addr)));

    let (status, info) = s.send(READER, "GET", "/chat", None);
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["enabled"], true);
    assert_eq!(info["provider"], "openai");
    assert_eq!(info["tools"], 1, "{info}");
    assert!(!info.to_string().contains(KEY), "{info}");

    let question = json!({"messages": [{"role": "user", "content": "how do I roll back?"}]});
    let (status, answer) = s.send(READER, "POST", "/chat", Some(question.clone()));
    assert_eq!(status, 200, "{answer}");
    let call = &answer["message"]["tool_calls"][0];
    assert_eq!(call["name"], "search");
    assert_eq!(call["arguments"], json!({"query": "roll back a deploy"}));
    assert!(!answer.to_string().contains(KEY));

    let (status, admin) = s.send(ADMIN, "POST", "/chat", Some(question));
    assert_eq!(status, 200, "{admin}");

    let requests = received.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_eq!(request.path, "/v1/chat/completions");
        assert_eq!(request.headers.get("authorization").map(String::as_str), Some(&*format!("Bearer {KEY}")));
        assert_eq!(body(request)["model"], "stub-model");
    }
    let offered = |r: &StubRequest| -> Vec<String> {
        body(r)["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(offered(&requests[0]), ["search"], "the scoped token's model sees its one tool");
    let all = offered(&requests[1]);
    assert!(all.contains(&"echo".to_string()) && all.contains(&"get".to_string()), "{all:?}");
    assert!(body(&requests[0])["tools"][0]["function"]["parameters"]["properties"]["query"].is_object());

    // The tool's result goes back as a tool message answering the call.
    let follow_up = json!({"messages": [
        {"role": "user", "content": "how do I roll back?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"hits\": []}"},
    ]});
    let (status, answer) = s.send(READER, "POST", "/chat", Some(follow_up));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["message"]["content"], "the tool said 12");
    assert!(answer["message"].get("tool_calls").is_none(), "{answer}");
    let sent = body(received.lock().unwrap().last().unwrap());
    assert_eq!(sent["messages"][1]["tool_calls"][0]["function"]["arguments"], "{\"query\":\"roll back a deploy\"}");
    assert_eq!(sent["messages"][2], json!({"role": "tool", "content": "{\"hits\": []}", "tool_call_id": "call_1"}));
}

#[test]
fn chat_through_ollama_names_the_tool_of_each_result() {
    let (addr, received) = stub(|request| {
        let sent = body(request);
        let last = sent["messages"].as_array().unwrap().last().unwrap().clone();
        let message = if last["role"] == "user" {
            json!({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "search", "arguments": {"query": "deploy"}}}]})
        } else {
            json!({"role": "assistant", "content": "found it"})
        };
        (200, json!({"model": "stub-model", "message": message, "done": true}).to_string())
    });
    let s = Server::start(workspace(&chat_section("ollama", addr)));
    let (status, first) =
        s.send(ADMIN, "POST", "/chat", Some(json!({"messages": [{"role": "user", "content": "deploys?"}]})));
    assert_eq!(status, 200, "{first}");
    let call = first["message"]["tool_calls"][0].clone();
    assert_eq!(call["name"], "search");
    let id = call["id"].as_str().unwrap().to_string();
    let conversation = json!({"messages": [
        {"role": "user", "content": "deploys?"},
        first["message"],
        {"role": "tool", "tool_call_id": id, "content": "[]"},
    ]});
    let (status, second) = s.send(ADMIN, "POST", "/chat", Some(conversation));
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["message"]["content"], "found it");
    let requests = received.lock().unwrap().clone();
    assert_eq!(requests[0].path, "/api/chat");
    let sent = body(&requests[1]);
    assert_eq!(sent["stream"], false);
    assert_eq!(sent["messages"][2]["tool_name"], "search");
    assert_eq!(sent["messages"][1]["tool_calls"][0]["function"]["arguments"], json!({"query": "deploy"}));
}

#[test]
fn a_failing_model_is_a_bad_gateway_in_its_own_words_without_the_key() {
    // The stub echoes the key: whole in a 500's message (past the 500 characters a message is
    // cut to, so a cut before redaction would leave part of it), and in a 401's.
    let (addr, _) = stub(|request| {
        let auth = request.headers.get("authorization").cloned().unwrap_or_default();
        let first = body(request)["messages"][0]["content"].as_str().unwrap_or_default().to_string();
        if first == "refused" {
            return (401, json!({"error": {"message": format!("Incorrect API key provided: {auth}")}}).to_string());
        }
        let padding = "x".repeat(480);
        (500, json!({"error": {"message": format!("overloaded {padding} {auth}")}}).to_string())
    });
    let s = Server::start(workspace(&chat_section("openai", addr)));
    let ask =
        |text: &str| s.send(READER, "POST", "/chat", Some(json!({"messages": [{"role": "user", "content": text}]})));

    let (status, error) = ask("refused");
    assert_eq!(status, 502, "{error}");
    assert_eq!(error["error"]["code"], "bad_gateway");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("refused the request (401") && message.contains("check chat.api_key"), "{message}");
    assert!(!message.contains("sk-"), "what the service says of a refused key is not passed on: {message}");

    let (status, error) = ask("busy");
    assert_eq!(status, 502, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("answered 500 Internal Server Error: overloaded xxx"), "{message}");
    assert!(!message.contains("sk-chat") && !message.contains("4242"), "{message}");
    let log = s.serve.stderr.lock().unwrap().clone();
    assert!(!log.contains("sk-chat"), "the server's log: {log}");
}

#[test]
fn without_chat_the_server_says_how_to_turn_it_on_and_checks_the_conversation_first() {
    let s = Server::start(workspace(""));
    let (status, info) = s.send(ADMIN, "GET", "/chat", None);
    assert_eq!(status, 200);
    assert_eq!(info["enabled"], false);
    assert!(info["hint"].as_str().unwrap().contains("[chat]"), "{info}");
    let (status, error) =
        s.send(ADMIN, "POST", "/chat", Some(json!({"messages": [{"role": "user", "content": "hi"}]})));
    assert_eq!(status, 503, "{error}");
    assert_eq!(error["error"]["code"], "unavailable");
    assert!(error["error"]["message"].as_str().unwrap().contains("provider = \"openai\""), "{error}");
    // A malformed conversation is the caller's to fix, whatever the config: each problem at its field.
    let bad = json!({"messages": [{"role": "robot", "content": "hi"}, {"role": "tool", "content": "x"}]});
    let (status, error) = s.send(ADMIN, "POST", "/chat", Some(bad));
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["details"][0]["path"], "/messages/0/role", "{error}");
    let (status, error) = s.send(ADMIN, "POST", "/chat", Some(json!({"messages": []})));
    assert_eq!(status, 400, "{error}");
}

#[test]
fn a_sync_started_through_the_server_shows_its_progress_and_summary_to_the_operator_only() {
    let ws = workspace("");
    // A new document since the sample's own sync, for this sync to add.
    ws.write("docs/new-page.md", "# A new page\n\nAdded after the first sync.\n");
    let s = Server::start(ws);

    let (status, refused) = s.send(READER, "POST", "/sources/filesystem:docs/sync", None);
    assert_eq!(status, 403, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("server.auth_token"), "{refused}");
    let (status, _) = s.send(READER, "GET", "/sources/sync", None);
    assert_eq!(status, 403);
    let (status, missing) = s.send(ADMIN, "POST", "/sources/filesystem:nope/sync", None);
    assert_eq!(status, 404, "{missing}");
    assert!(missing["error"]["message"].as_str().unwrap().contains("filesystem:docs"), "{missing}");

    let (status, started) = s.send(ADMIN, "POST", "/sources/filesystem:docs/sync", None);
    assert_eq!(status, 202, "{started}");
    assert_eq!(started["source"], "filesystem:docs");
    let deadline = Instant::now() + Duration::from_secs(30);
    let job = loop {
        let (status, jobs) = s.send(ADMIN, "GET", "/sources/sync", None);
        assert_eq!(status, 200, "{jobs}");
        let job = jobs["jobs"][0].clone();
        if job["state"] != "running" {
            break job;
        }
        assert!(Instant::now() < deadline, "still running: {job}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["summary"]["added"], 1, "{job}");
    assert!(job["seen"].as_u64().unwrap() >= 7, "{job}");
    assert!(job["finished_at"].is_string(), "{job}");

    // The start is in the call log, committed before the sync began.
    let (_, calls) = s.send(ADMIN, "GET", "/calls?tool=sources/sync", None);
    let entry = &calls["calls"][0];
    assert_eq!(entry["tool"], "sources/sync", "{calls}");
    assert_eq!(entry["params"], json!({"source": "filesystem:docs", "full": false}), "{calls}");
    assert_eq!(entry["outcome"], "ok", "{calls}");
    assert_eq!(calls["calls"].as_array().unwrap().len(), 1, "refused starts are not logged: {calls}");

    // The source's status has the sync's duration, and a search finds the new page.
    let (_, sources) = s.send(ADMIN, "GET", "/tools/sources", None);
    assert!(sources["sources"][0]["last_sync_seconds"].is_number(), "{sources}");
    let (_, found) = s.send(ADMIN, "POST", "/tools/search", Some(json!({"query": "added after the first sync"})));
    assert!(found.to_string().contains("new-page.md"), "{found}");
}
