//! The call log is an audit log: a call that may change something is in the log, committed,
//! before its answer leaves, and is refused without running when the log cannot take it.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{ServeChild, Workspace, BIN};
use crate::gateway::fault_section;

/// A Lua tool that is not annotated read-only: every call of it must be in the log.
const NOTE: &str = r#"
tool = {
    name = "note",
    description = "Takes a note (pretend it deploys).",
    parameters = { { name = "text", type = "string", required = true } },
}
function tool.execute(params, context)
    return { noted = params.text }
end
"#;

fn serve(ws: &Workspace) -> ServeChild {
    ServeChild::spawn(Command::new(BIN).current_dir(ws.path()).env_remove("CTX_CONFIG").envs(ws.env()).args([
        "serve",
        "--no-reload",
        "--bind",
        "127.0.0.1:0",
    ]))
}

/// The `text` of every logged call of `note`: from the log's file, or the shared database.
fn logged_notes(ws: &Workspace) -> std::collections::HashSet<String> {
    let params: Vec<String> = match &ws.shared {
        None => {
            let db = rusqlite::Connection::open(ws.path().join("data/calls.sqlite")).unwrap();
            let mut rows = db.prepare("SELECT params FROM calls WHERE tool = 'note'").unwrap();
            rows.query_map([], |row| row.get::<_, String>(0)).unwrap().map(Result::unwrap).collect()
        }
        Some(shared) => shared
            .pg()
            .run(|c| async move {
                let rows = c.query("SELECT params FROM calls WHERE tool = 'note'", &[]).await?;
                Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
            })
            .unwrap(),
    };
    params
        .iter()
        .map(|p| serde_json::from_str::<Value>(p).unwrap()["text"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// `POST` `body` to `path` of `serve`: the status and the JSON answer (null when not JSON).
fn post_json(
    rt: &tokio::runtime::Runtime,
    client: &reqwest::Client,
    serve: &ServeChild,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let url = format!("http://{}{path}", serve.addr);
    rt.block_on(async {
        let response = client.post(url).json(&body).send().await.unwrap();
        (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
    })
}

fn runtime() -> tokio::runtime::Runtime {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn every_answered_call_that_may_change_something_is_in_the_log_after_kill_9() {
    Workspace::each_backend("[tools.script.note]\npath = \"tools/note.lua\"\n", |ws, backend| {
        ws.write("tools/note.lua", NOTE);
        let mut serve = serve(ws);
        let url = format!("http://{}/tools/note", serve.addr);
        let answered: Arc<Mutex<Vec<String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let rt = runtime();
        let clients: Vec<_> = (0..8)
            .map(|c| {
                let (url, answered, stop) = (url.clone(), Arc::clone(&answered), Arc::clone(&stop));
                rt.spawn(async move {
                    let client = reqwest::Client::new();
                    for n in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let text = format!("c{c}-{n}");
                        let Ok(response) = client.post(&url).json(&json!({ "text": text })).send().await else { break };
                        if response.status() != 200 {
                            break;
                        }
                        // Answered: the whole body arrived.
                        let Ok(body) = response.json::<Value>().await else { break };
                        assert_eq!(body["result"]["noted"], json!(text), "{body}");
                        answered.lock().unwrap().push(text);
                    }
                })
            })
            .collect();
        // Calls as fast as 8 clients make them, then the server is killed in the middle of them.
        let deadline = Instant::now() + Duration::from_secs(30);
        while answered.lock().unwrap().len() < 1_500 {
            assert!(Instant::now() < deadline, "only {} calls answered in 30 s", answered.lock().unwrap().len());
            std::thread::sleep(Duration::from_millis(20));
        }
        serve.child.kill().unwrap(); // SIGKILL
        serve.child.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        rt.block_on(async {
            for client in clients {
                let _ = client.await;
            }
        });
        let answered = answered.lock().unwrap().clone();

        let logged = logged_notes(ws);
        let missing: Vec<&String> = answered.iter().filter(|t| !logged.contains(*t)).collect();
        assert!(
            missing.is_empty(),
            "{backend}: {} of {} answered calls are not in the log: {:?}",
            missing.len(),
            answered.len(),
            &missing[..missing.len().min(10)]
        );
    });
}

#[test]
fn a_call_that_may_change_something_is_refused_and_not_run_when_the_log_cannot_take_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("upstream.log");
    let ws = Workspace::new(&fault_section("f", &["--log", log.to_str().unwrap()], ""));
    let serve = serve(&ws);
    let rt = runtime();
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| post_json(&rt, &client, &serve, path, body);
    // Wait for the upstream, without a call (the log's writer starts with the first call).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health: Value = rt.block_on(async {
            client.get(format!("http://{}/health", serve.addr)).send().await.unwrap().json().await.unwrap()
        });
        if health["upstreams"][0]["state"] == "ready" {
            break;
        }
        assert!(Instant::now() < deadline, "the upstream never got ready: {health}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The log's file becomes one it cannot open (a folder stands where it was).
    let file = ws.path().join("data/calls.sqlite");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    std::fs::create_dir(&file).unwrap();

    let (status, body) = post("/tools/f__echo", json!({"text": "deploy"}));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "audit_unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("did not run") && message.contains("tool-call log"), "{message}");
    let upstream_saw = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!upstream_saw.contains("call echo"), "the call ran upstream: {upstream_saw}");
    // A read-only call still runs.
    let (status, body) = post("/tools/search", json!({"query": "x"}));
    assert_eq!(status, 200, "{body}");
    let metrics = rt.block_on(async {
        client.get(format!("http://{}/metrics", serve.addr)).send().await.unwrap().text().await.unwrap()
    });
    assert!(metrics.lines().any(|l| l == "ctx_call_log_refused_total 1"), "{metrics}");
}

#[test]
fn a_log_that_cannot_be_opened_at_start_refuses_calls_that_may_change_something() {
    let ws = Workspace::new("[tools.script.note]\npath = \"tools/note.lua\"\n");
    ws.write("tools/note.lua", NOTE);
    // A folder stands where the log's file would be: the server starts, and says why.
    std::fs::create_dir_all(ws.path().join("data/calls.sqlite")).unwrap();
    let serve = serve(&ws);
    let rt = runtime();
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| post_json(&rt, &client, &serve, path, body);
    let (status, body) = post("/tools/note", json!({"text": "x"}));
    assert_eq!((status, &body["error"]["code"]), (503, &json!("audit_unavailable")), "{body}");
    let (status, body) = post("/tools/search", json!({"query": "x"}));
    assert_eq!(status, 200, "{body}");
    let log = serve.stderr.lock().unwrap().clone();
    assert!(log.contains("cannot be opened"), "{log}");
}
