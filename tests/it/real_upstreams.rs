//! The real upstream MCP servers that `scripts/test-env` installs from the registries answer
//! rmcp's client (the one the gateway uses): `@modelcontextprotocol/server-everything` (npm) over
//! stdio and over Streamable HTTP, and `mcp-server-time` (PyPI) over stdio.

use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

use crate::common::test_command;
use crate::fault_upstream::{call, connect, text, Recorder, WAIT};

/// The everything server's tools that are there whatever the client declares; it adds more
/// (roots, sampling, elicitation, tasks) after `initialized`, by what the client supports.
const EVERYTHING_TOOLS: [&str; 12] = [
    "echo",
    "get-annotated-message",
    "get-env",
    "get-resource-links",
    "get-resource-reference",
    "get-structured-content",
    "get-sum",
    "get-tiny-image",
    "gzip-file-as-resource",
    "toggle-simulated-logging",
    "toggle-subscriber-updates",
    "trigger-long-running-operation",
];

fn command(words: &[String], args: &[&str]) -> Command {
    let mut command = Command::new(&words[0]);
    command
        .args(&words[1..])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

fn names<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut names: Vec<&str> = items.into_iter().collect();
    names.sort_unstable();
    names
}

#[tokio::test]
async fn everything_over_stdio() {
    let Some(everything) = test_command("CTX_TEST_EVERYTHING") else { return };
    let s = connect(command(&everything, &["stdio"])).await;
    let info = s.client.peer_info().expect("initialize result");
    assert_eq!(info.server_info.as_ref().map(|i| i.name.as_str()), Some("mcp-servers/everything"));
    let caps = &info.capabilities;
    assert_eq!(caps.tools.as_ref().and_then(|t| t.list_changed), Some(true), "{caps:?}");
    assert!(caps.resources.is_some() && caps.prompts.is_some(), "{caps:?}");

    let tools = s.client.list_all_tools().await.unwrap();
    let tool_names = names(tools.iter().map(|t| t.name.as_ref()));
    for want in EVERYTHING_TOOLS {
        assert!(tool_names.contains(&want), "{want} missing from {tool_names:?}");
    }
    let echoed = s.client.call_tool(call("echo", json!({"message": "hello 17"}))).await.unwrap();
    assert_eq!(text(&echoed), "Echo: hello 17");
    let sum = s.client.call_tool(call("get-sum", json!({"a": 2, "b": 3}))).await.unwrap();
    assert!(text(&sum).contains('5'), "{sum:?}");

    let resources = s.client.list_resources(None).await.unwrap().resources;
    let templates = s.client.list_resource_templates(None).await.unwrap().resource_templates;
    let prompts = s.client.list_prompts(None).await.unwrap().prompts;
    assert!(!resources.is_empty() && !templates.is_empty() && !prompts.is_empty());
    assert!(resources.iter().any(|r| r.uri == "demo://resource/static/document/features.md"), "{resources:?}");
    let templates = names(templates.iter().map(|t| t.uri_template.as_str()));
    assert!(templates.contains(&"demo://resource/dynamic/text/{resourceId}"), "{templates:?}");
    let prompts = names(prompts.iter().map(|p| p.name.as_str()));
    assert!(prompts.contains(&"simple-prompt") && prompts.contains(&"args-prompt"), "{prompts:?}");

    // It registers more tools once `initialized` arrives (which depend on the client's
    // capabilities), and says so: a gateway that lists only once right after the handshake can
    // miss them.
    tokio::time::timeout(WAIT, s.recorder.list_changed.notified()).await.expect("tools/list_changed after initialized");
    let relisted = s.client.list_all_tools().await.unwrap();
    assert!(relisted.iter().any(|t| t.name == "simulate-research-query"), "{relisted:?}");
    // Its log goes to stderr, never into the protocol stream.
    assert!(s.stderr.lock().unwrap().contains("Starting default (STDIO) server"));
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn time_server_over_stdio() {
    let Some(time) = test_command("CTX_TEST_TIME_SERVER") else { return };
    let s = connect(command(&time, &["--local-timezone", "UTC"])).await;
    let info = s.client.peer_info().expect("initialize result");
    assert_eq!(info.server_info.as_ref().map(|i| i.name.as_str()), Some("mcp-time"), "{info:?}");
    let tools = s.client.list_all_tools().await.unwrap();
    assert_eq!(names(tools.iter().map(|t| t.name.as_ref())), ["convert_time", "get_current_time"]);

    let now = s.client.call_tool(call("get_current_time", json!({"timezone": "Europe/Paris"}))).await.unwrap();
    assert_ne!(now.is_error, Some(true), "{now:?}");
    let body: Value = serde_json::from_str(&text(&now)).unwrap_or_else(|e| panic!("{e}: {now:?}"));
    assert_eq!(body["timezone"], json!("Europe/Paris"), "{body}");
    assert!(body["datetime"].as_str().is_some_and(|d| d.len() >= 19), "{body}");

    let bad = s.client.call_tool(call("get_current_time", json!({"timezone": "Nowhere/17"}))).await;
    match bad {
        Ok(result) => assert_eq!(result.is_error, Some(true), "{result:?}"),
        Err(e) => assert!(e.to_string().contains("Nowhere/17"), "{e}"),
    }
    s.client.cancel().await.unwrap();
}

/// A port that was free a moment ago. The everything server takes its port from `$PORT` and
/// cannot report one it picked itself (it prints `$PORT`), so the test picks it, and retries
/// when another process took it first.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The everything server in `streamableHttp` mode, once it listens.
async fn start_everything_http(everything: &[String]) -> (Child, u16, Arc<Mutex<String>>) {
    for _ in 0..3 {
        let port = free_port();
        let mut command = command(everything, &["streamableHttp"]);
        // It logs every request on stdout; only stderr says when it listens.
        command.env("PORT", port.to_string()).stdin(Stdio::null()).stdout(Stdio::null());
        let mut child = command.spawn().unwrap();
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let log: Arc<Mutex<String>> = Default::default();
        let deadline = Instant::now() + WAIT;
        let listening = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    let ready = line.contains("listening on port");
                    log.lock().unwrap_or_else(PoisonError::into_inner).push_str(&(line + "\n"));
                    if ready {
                        break true;
                    }
                }
                _ => break false,
            }
        };
        // Keep draining stderr: a full pipe would block the server.
        let drained = Arc::clone(&log);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                drained.lock().unwrap_or_else(PoisonError::into_inner).push_str(&(line + "\n"));
            }
        });
        if listening {
            return (child, port, log);
        }
        let status = tokio::time::timeout(WAIT, child.wait()).await;
        let said = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
        assert!(said.contains("already in use"), "the everything server did not start ({status:?}):\n{said}");
    }
    panic!("three free ports in a row were taken before the everything server bound them");
}

#[tokio::test]
async fn everything_over_streamable_http() {
    let Some(everything) = test_command("CTX_TEST_EVERYTHING") else { return };
    let (_server, port, log) = start_everything_http(&everything).await;
    // ctx's reqwest has no TLS provider of its own (plain http here, but building a client needs one).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = StreamableHttpClientTransportConfig::with_uri(format!("http://127.0.0.1:{port}/mcp"));
    let transport = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    let client = match tokio::time::timeout(WAIT, Recorder::default().serve(transport)).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!("initialize over HTTP: {e}; server log:\n{}", log.lock().unwrap()),
        Err(_) => panic!("no answer to initialize over HTTP; server log:\n{}", log.lock().unwrap()),
    };
    let info = client.peer_info().expect("initialize result");
    assert_eq!(info.server_info.as_ref().map(|i| i.name.as_str()), Some("mcp-servers/everything"));
    let tools = client.list_all_tools().await.unwrap();
    let tool_names = names(tools.iter().map(|t| t.name.as_ref()));
    for want in EVERYTHING_TOOLS {
        assert!(tool_names.contains(&want), "{want} missing from {tool_names:?}");
    }
    let echoed = client.call_tool(call("echo", json!({"message": "over http"}))).await.unwrap();
    assert_eq!(text(&echoed), "Echo: over http");
    let _ = tokio::time::timeout(Duration::from_secs(5), client.cancel()).await;
}
