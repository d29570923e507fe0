//! The real upstream MCP servers that `scripts/test-env` installs from the registries, as
//! `[mcp.servers.<name>]` of a real `ctx serve`, called through ctx over REST and MCP:
//! `@modelcontextprotocol/server-everything` (npm) over stdio and over Streamable HTTP, and
//! `mcp-server-time` (PyPI) over stdio.

use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde_json::json;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

use crate::common::{test_command, Workspace};
use crate::fault_upstream::WAIT;
use crate::gateway::{serve, McpStdio, Served};

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

/// `[mcp.servers.<name>]` running `words` (a command line from `scripts/test-env`) and `args`.
pub(crate) fn stdio_section(name: &str, words: &[String], args: &[&str]) -> String {
    let args: Vec<String> =
        words[1..].iter().map(String::as_str).chain(args.iter().copied()).map(|a| format!("{a:?}")).collect();
    format!("[mcp.servers.{name}]\ncommand = {:?}\nargs = [{}]\n", words[0], args.join(", "))
}

/// The names `GET /tools/list` shows.
fn listed(served: &Served) -> Vec<String> {
    let (status, list) = served.get("/tools/list");
    assert_eq!(status, 200, "{list}");
    list["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_string()).collect()
}

/// ctx serves the everything server's tools under its prefix, over REST (validated against the
/// upstream's own input schemas, structured content passed through) and over MCP; the tool that
/// runs only as a task is offered too, and a plain MCP call of it gets the task's result.
#[test]
fn everything_over_stdio_through_ctx() {
    let Some(everything) = test_command("CTX_TEST_EVERYTHING") else { return };
    let ws = Workspace::new(&stdio_section("everything", &everything, &["stdio"]));
    let served = serve(ws, &[]);
    let row = served.ready("everything");
    assert_eq!((&row["transport"], &row["restarts"]), (&json!("stdio"), &json!(0)), "{row}");
    let tools = listed(&served);
    for want in EVERYTHING_TOOLS {
        assert!(tools.contains(&format!("everything__{want}")), "everything__{want} missing from {tools:?}");
    }
    // The tool it registers after `initialized` runs only as a task: ctx runs it as one.
    assert!(tools.contains(&"everything__simulate-research-query".to_string()), "{tools:?}");

    let (status, body) = served.post("/tools/everything__echo", json!({"message": "hello through ctx"}));
    assert_eq!((status, body), (200, json!({"result": "Echo: hello through ctx"})));
    let (status, body) = served.post("/tools/everything__get-sum", json!({"a": 2, "b": 3}));
    assert_eq!((status, body), (200, json!({"result": "The sum of 2 and 3 is 5."})));
    // Its structured content is the result.
    let (status, body) = served.post("/tools/everything__get-structured-content", json!({"location": "New York"}));
    assert_eq!(status, 200, "{body}");
    assert!(body["result"]["temperature"].is_number() && body["result"]["conditions"].is_string(), "{body}");
    // ctx checks the arguments against the upstream's schema before the call goes out.
    let (status, body) = served.post("/tools/everything__get-sum", json!({"a": "two"}));
    assert_eq!((status, &body["error"]["code"]), (400, &json!("bad_request")), "{body}");
    let paths: Vec<&str> =
        body["error"]["details"].as_array().unwrap().iter().map(|d| d["path"].as_str().unwrap()).collect();
    assert_eq!(names(paths), ["/a", "/b"], "{body}");

    // The same server through ctx's MCP side (`ctx serve mcp --stdio`, its own connection).
    let mut mcp = McpStdio::start(&served.ws);
    let tool = mcp.wait_tool("everything__echo");
    assert_eq!(tool["inputSchema"]["required"], json!(["message"]), "{tool}");
    let (reply, _) =
        mcp.request("tools/call", json!({"name": "everything__echo", "arguments": {"message": "over mcp"}}));
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    assert_eq!(reply["result"]["content"][0]["text"], "Echo: over mcp", "{reply}");
    let tool = mcp.wait_tool("everything__simulate-research-query");
    assert_eq!(tool["inputSchema"]["required"], json!(["topic"]), "{tool}");
    let (reply, _) = mcp.request(
        "tools/call",
        json!({"name": "everything__simulate-research-query", "arguments": {"topic": "over mcp"}}),
    );
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    let text = reply["result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("# Research Report: over mcp"), "{reply}");
    // The upstream's own task stays upstream: its related-task metadata is not passed on.
    assert!(reply["result"]["_meta"].get("io.modelcontextprotocol/related-task").is_none(), "{reply}");
}

/// mcp-server-time (PyPI) behind ctx: its two tools, a real answer, and its own failure passed
/// back as the tool's error (the call worked, the work did not).
#[test]
fn time_server_through_ctx() {
    let Some(time) = test_command("CTX_TEST_TIME_SERVER") else { return };
    let served = serve(Workspace::new(&stdio_section("time", &time, &["--local-timezone", "UTC"])), &[]);
    served.ready("time");
    let names = listed(&served);
    let mine: Vec<&String> = names.iter().filter(|n| n.starts_with("time__")).collect();
    assert_eq!(mine, ["time__convert_time", "time__get_current_time"]);

    let (status, body) = served.post("/tools/time__get_current_time", json!({"timezone": "Europe/Paris"}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["timezone"], "Europe/Paris", "{body}");
    assert!(body["result"]["datetime"].as_str().is_some_and(|d| d.len() >= 19), "{body}");

    let (status, body) = served.post(
        "/tools/time__convert_time",
        json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["time_difference"], "+9.0h", "{body}");
    assert!(body["result"]["target"]["datetime"].as_str().is_some_and(|d| d.contains("T21:00:00+09:00")), "{body}");

    let (status, body) = served.post("/tools/time__get_current_time", json!({"timezone": "Nowhere/17"}));
    assert_eq!(status, 200, "{body}");
    let error = body["result"]["error"].as_str().unwrap_or_else(|| panic!("no error in {body}"));
    assert!(error.contains("Invalid timezone") && error.contains("Nowhere/17"), "{body}");
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

/// The everything server over Streamable HTTP as a `url` upstream of ctx.
#[test]
fn everything_over_streamable_http_through_ctx() {
    let Some(everything) = test_command("CTX_TEST_EVERYTHING") else { return };
    // The everything server's stderr is drained by a task of this runtime, kept for the test.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (_server, port, log) = runtime.block_on(start_everything_http(&everything));
    let config = format!("[mcp.servers.everything]\nurl = \"http://127.0.0.1:{port}/mcp\"\n");
    let served = serve(Workspace::new(&config), &[]);
    let row = served.ready("everything");
    assert_eq!(row["transport"], "http", "{row}");
    let names = listed(&served);
    for want in EVERYTHING_TOOLS {
        assert!(names.contains(&format!("everything__{want}")), "everything__{want} missing from {names:?}");
    }
    let (status, body) = served.post("/tools/everything__echo", json!({"message": "over http"}));
    let said = log.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!((status, body), (200, json!({"result": "Echo: over http"})), "the server's log:\n{said}");
}
