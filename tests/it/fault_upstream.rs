//! The fault-injecting upstream (`tests/upstream/fault.rs`), driven by rmcp's client over its
//! stdio: every tool and flag does what the gateway tests rely on. Also home of [`binary`], which
//! the gateway tests use to find (and build) it, and of the small rmcp client the real-upstream
//! tests share ([`connect`], [`Recorder`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, GetPromptRequestParams, ProgressNotificationParam,
    ReadResourceRequestParams, ResourceContents,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

/// Generous bound on anything the tests wait for; they assert behaviour, not speed.
pub const WAIT: Duration = Duration::from_secs(20);

/// `target/<profile>/examples/fault_upstream`, built once per test run. `cargo test` builds
/// examples, but `cargo test --test it` does not, and a binary left from an older source would
/// test the wrong thing: so the first caller runs `cargo build --example fault_upstream`.
pub fn binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            // The test binary is target/<profile>/deps/it-<hash>.
            let exe = std::env::current_exe().expect("the test binary's path");
            let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test binary>");
            let path = profile_dir.join("examples/fault_upstream");
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut build = std::process::Command::new(cargo);
            build.current_dir(crate::common::repo()).args(["build", "--quiet", "--example", "fault_upstream"]);
            // cargo runs this test with the package's own variables set (CARGO_PKG_NAME,
            // CARGO_MANIFEST_DIR, OUT_DIR...). Build scripts such as ring's rerun when those
            // change, so passing them on would rebuild half the tree here, and again in the
            // next `cargo test`.
            for (name, _) in std::env::vars_os() {
                let name = name.to_string_lossy();
                let injected = ["CARGO_MANIFEST_", "CARGO_PKG_", "CARGO_BIN_EXE_", "CARGO_CRATE_", "CARGO_PRIMARY_"]
                    .iter()
                    .any(|prefix| name.starts_with(prefix));
                if injected || name == "OUT_DIR" || name == "CARGO_TARGET_TMPDIR" {
                    build.env_remove(&*name);
                }
            }
            if profile_dir.file_name().is_some_and(|name| name == "release") {
                build.arg("--release");
            }
            let output = build.output().expect("run cargo build --example fault_upstream");
            assert!(
                output.status.success(),
                "cargo build --example fault_upstream failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(path.exists(), "{} is missing after cargo build --example fault_upstream", path.display());
            path
        })
        .clone()
}

/// What the client saw besides answers.
#[derive(Clone, Default)]
pub struct Recorder {
    pub list_changed: Arc<tokio::sync::Notify>,
    pub list_changed_count: Arc<Mutex<usize>>,
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Recorder {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }

    async fn on_tool_list_changed(&self, _cx: NotificationContext<RoleClient>) {
        *self.list_changed_count.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.list_changed.notify_one();
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _cx: NotificationContext<RoleClient>) {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner).push(params);
    }
}

/// One server child and an rmcp client session on its stdio.
pub struct Session {
    pub child: Child,
    pub client: RunningService<RoleClient, Recorder>,
    pub recorder: Recorder,
    /// The server's stderr so far (drained so that a chatty server never blocks on a full pipe).
    pub stderr: Arc<Mutex<String>>,
}

fn command(args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    command
}

/// Spawns the command (stdin and stdout piped) and completes the MCP handshake on its stdio.
pub async fn connect(mut command: Command) -> Session {
    let mut child = command.spawn().unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let stdin = child.stdin.take().expect("piped stdin");
    let stderr: Arc<Mutex<String>> = Default::default();
    if let Some(mut pipe) = child.stderr.take() {
        let stderr = Arc::clone(&stderr);
        tokio::spawn(async move {
            let mut buf = vec![0; 8192];
            while let Ok(n @ 1..) = tokio::io::AsyncReadExt::read(&mut pipe, &mut buf).await {
                stderr.lock().unwrap_or_else(PoisonError::into_inner).push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
    }
    let recorder = Recorder::default();
    let handshake = tokio::time::timeout(WAIT, recorder.clone().serve((stdout, stdin))).await;
    let failed = match handshake {
        Ok(Ok(client)) => return Session { child, client, recorder, stderr },
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer to initialize in {WAIT:?}"),
    };
    panic!("{command:?}: {failed}; its stderr:\n{}", stderr.lock().unwrap_or_else(PoisonError::into_inner));
}

pub fn call(name: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else { panic!("arguments must be an object") };
    CallToolRequestParams::new(name.to_owned()).with_arguments(arguments)
}

/// The result's text blocks, joined.
pub fn text(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect()
}

/// Waits until `done` holds for the file's contents, or fails with what the file had.
async fn wait_for_file(path: &Path, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let contents = std::fs::read_to_string(path).unwrap_or_default();
        if done(&contents) {
            return contents;
        }
        assert!(Instant::now() < deadline, "{what}: {} has {contents:?}", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn exit_status(child: &mut Child) -> std::process::ExitStatus {
    tokio::time::timeout(WAIT, child.wait()).await.expect("fault_upstream exits in time").expect("wait")
}

#[tokio::test]
async fn lists_and_answers_its_tools() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut command = command(&["--log", log.to_str().unwrap()]);
    command.env("FAULT_17_VISIBLE", "seen").env_remove("FAULT_17_ABSENT");
    let s = connect(command).await;

    let info = s.client.peer_info().expect("server info after initialize");
    assert_eq!(info.server_info.as_ref().map(|i| i.name.as_str()), Some("fault_upstream"));
    assert!(info.capabilities.tools.as_ref().and_then(|t| t.list_changed) == Some(true), "{info:?}");
    assert!(info.capabilities.resources.is_none(), "no resources without --resources: {info:?}");

    let tools = s.client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["echo", "add", "slow", "hang", "progress", "huge", "crash", "add_tool", "fail", "env", "link"]);
    for tool in &tools {
        assert_eq!(tool.input_schema.get("type"), Some(&json!("object")), "{}", tool.name);
    }
    let echo = tools.iter().find(|t| t.name == "echo").unwrap();
    assert_eq!(echo.input_schema["required"], json!(["text"]));
    assert!(echo.output_schema.is_some(), "echo declares its outputSchema");

    let echoed = s.client.call_tool(call("echo", json!({"text": "hi there"}))).await.unwrap();
    assert_eq!(text(&echoed), "hi there");
    assert_eq!(echoed.structured_content, Some(json!({"text": "hi there"})));

    let added = s.client.call_tool(call("add", json!({"a": 2, "b": 3}))).await.unwrap();
    assert_eq!(added.structured_content, Some(json!({"sum": 5})));
    assert_eq!(text(&added), "5");
    let added = s.client.call_tool(call("add", json!({"a": 0.5, "b": 2}))).await.unwrap();
    assert_eq!(added.structured_content, Some(json!({"sum": 2.5})));

    let bad = s.client.call_tool(call("add", json!({"a": "two", "b": 3}))).await.unwrap_err();
    assert!(bad.to_string().contains("argument \"a\" must be a number"), "{bad}");

    let failed = s.client.call_tool(call("fail", json!({"message": "it broke"}))).await.unwrap();
    assert_eq!(failed.is_error, Some(true));
    assert_eq!(text(&failed), "it broke");

    let slow = s.client.call_tool(call("slow", json!({"ms": 30}))).await.unwrap();
    assert_eq!(text(&slow), "slept 30");

    let huge = s.client.call_tool(call("huge", json!({"bytes": 3_000_000}))).await.unwrap();
    let huge = text(&huge);
    assert_eq!(huge.len(), 3_000_000);
    assert!(huge.bytes().all(|b| b == b'x'));

    let visible = s.client.call_tool(call("env", json!({"name": "FAULT_17_VISIBLE"}))).await.unwrap();
    assert_eq!(visible.structured_content, Some(json!({"value": "seen"})));
    let absent = s.client.call_tool(call("env", json!({"name": "FAULT_17_ABSENT"}))).await.unwrap();
    assert_eq!(absent.structured_content, Some(json!({"value": null})));

    let link = s.client.call_tool(call("link", json!({}))).await.unwrap();
    assert_eq!(link.content.len(), 2, "{link:?}");
    assert_eq!(link.content[0].as_resource_link().map(|r| r.uri.as_str()), Some("fault://doc/1"));
    match link.content[1].as_resource().map(|r| &r.resource) {
        Some(ResourceContents::TextResourceContents { uri, text, .. }) => {
            assert_eq!((uri.as_str(), text.as_str()), ("fault://doc/2", "document 2"));
        }
        other => panic!("an embedded text resource, not {other:?}"),
    }

    let prompts = s.client.list_prompts(None).await.unwrap();
    assert_eq!(prompts.prompts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["greet"]);
    let greet = s
        .client
        .get_prompt(
            GetPromptRequestParams::new("greet").with_arguments(json!({"name": "Ada"}).as_object().cloned().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(serde_json::to_value(&greet.messages).unwrap()[0]["content"]["text"], json!("Hello, Ada"));

    let no_resources = s.client.list_resources(None).await.unwrap_err();
    assert!(
        no_resources.to_string().contains("-32601") || no_resources.to_string().contains("resources/list"),
        "{no_resources}"
    );

    let logged = std::fs::read_to_string(&log).unwrap();
    for tool in ["echo", "add", "fail", "slow", "huge", "env", "link"] {
        assert!(logged.lines().any(|l| l == format!("call {tool}")), "call {tool} in {logged:?}");
    }
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn reports_progress_to_the_token() {
    let s = connect(command(&[])).await;
    // rmcp's client puts its own progress token on every request (it replaces any in `_meta`),
    // so the notifications are matched by that token, not by one the test chose.
    let params = call("progress", json!({"steps": 4}));
    let done = s.client.call_tool(params).await.unwrap();
    assert_eq!(text(&done), "done");
    // Notifications are dispatched to the handler on their own tasks: wait for all four.
    let deadline = Instant::now() + WAIT;
    let seen = loop {
        let seen = s.recorder.progress.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if seen.len() >= 4 || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut steps: Vec<(f64, Option<f64>, Option<String>)> =
        seen.iter().map(|p| (p.progress, p.total, p.message.clone())).collect();
    steps.sort_by(|a, b| a.0.total_cmp(&b.0));
    let want: Vec<_> = (1..=4).map(|i| (i as f64, Some(4.0), Some(format!("step {i}")))).collect();
    assert_eq!(steps, want);
    assert!(seen.iter().all(|p| p.progress_token == seen[0].progress_token), "one token: {seen:?}");
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn add_tool_sends_list_changed_and_lists_it() {
    let s = connect(command(&[])).await;
    let before = s.client.list_all_tools().await.unwrap().len();
    let added = s.client.call_tool(call("add_tool", json!({"name": "late_17"}))).await.unwrap();
    assert_eq!(text(&added), "added late_17");
    tokio::time::timeout(WAIT, s.recorder.list_changed.notified())
        .await
        .expect("notifications/tools/list_changed after add_tool");
    let after = s.client.list_all_tools().await.unwrap();
    assert_eq!(after.len(), before + 1);
    assert_eq!(after.last().map(|t| t.name.as_ref()), Some("late_17"));
    let echoed = s.client.call_tool(call("late_17", json!({"text": "from the new tool"}))).await.unwrap();
    assert_eq!(text(&echoed), "from the new tool");

    let again = s.client.call_tool(call("add_tool", json!({"name": "late_17"}))).await.unwrap();
    assert_eq!(again.is_error, Some(true), "a second add of the same name is refused");
    assert_eq!(*s.recorder.list_changed_count.lock().unwrap(), 1);
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn hang_logs_the_cancellation() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let s = connect(command(&["--log", log.to_str().unwrap()])).await;
    // Dropping the call future makes rmcp send notifications/cancelled for it.
    let hung = tokio::time::timeout(Duration::from_millis(300), s.client.call_tool(call("hang", json!({})))).await;
    assert!(hung.is_err(), "hang answered: {hung:?}");
    let logged = wait_for_file(&log, "the cancellation is logged", |l| l.contains("cancelled ")).await;
    let lines: Vec<&str> = logged.lines().collect();
    assert_eq!(lines[0], "call hang", "{logged:?}");
    let id = lines[1].strip_prefix("cancelled ").expect("cancelled <requestId>");
    assert!(id.parse::<u64>().is_ok(), "the request id, not {id:?}");
    // The server is still serving after the dropped call.
    let echoed = s.client.call_tool(call("echo", json!({"text": "still here"}))).await.unwrap();
    assert_eq!(text(&echoed), "still here");
    s.client.cancel().await.unwrap();
}

#[tokio::test]
async fn crash_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let mut s = connect(command(&["--starts", starts.to_str().unwrap()])).await;
    let pid = s.child.id().expect("running");
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), format!("{pid}\n"));

    let crashed = tokio::time::timeout(WAIT, s.client.call_tool(call("crash", json!({})))).await;
    assert!(matches!(crashed, Ok(Err(_))), "crash has no answer, the call fails: {crashed:?}");
    assert_eq!(exit_status(&mut s.child).await.code(), Some(1));
}

#[tokio::test]
async fn exit_at_start_and_stderr_lines() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let mut child = command(&["--exit-at-start", "--starts", starts.to_str().unwrap(), "--stderr-lines", "5"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    assert_eq!(exit_status(&mut child).await.code(), Some(3));
    let mut bytes = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut stderr, &mut bytes).await.unwrap();
    let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
    assert_eq!(lines.len(), 5);
    assert!(
        lines.iter().all(|l| l.len() == 1024),
        "1 KiB lines: {:?}",
        lines.iter().map(|l| l.len()).collect::<Vec<_>>()
    );
    // The start is counted even when the server exits at once (crash-loop tests count starts).
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), format!("{pid}\n"));

    let usage = command(&["--no-such-flag"]).stdin(Stdio::null()).output().await.unwrap();
    assert_eq!(usage.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("unknown argument \"--no-such-flag\""));
}

#[tokio::test]
async fn hang_at_start_never_answers_initialize() {
    let mut child = command(&["--hang-at-start"]).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let handshake = tokio::time::timeout(Duration::from_millis(500), Recorder::default().serve((stdout, stdin))).await;
    assert!(handshake.is_err(), "initialize was answered");
    // The handshake future owned stdin: dropping it closed stdin, and the server ends.
    assert_eq!(exit_status(&mut child).await.code(), Some(0));
}

/// Kills the grandchild `sleep` even when an assertion fails first.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").arg(self.0.to_string()).status();
    }
}

#[tokio::test]
async fn grandchild_outlives_a_plain_kill() {
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let mut s = connect(command(&["--grandchild", "--starts", starts.to_str().unwrap()])).await;
    let pid = s.child.id().unwrap();
    let stderr = || s.stderr.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let line = std::fs::read_to_string(&starts).unwrap_or_else(|e| panic!("--starts file: {e}; stderr:\n{}", stderr()));
    let (first, grandchild) =
        line.trim_end().split_once(' ').unwrap_or_else(|| panic!("<pid> <grandchild-pid>, not {line:?}"));
    let grandchild: u32 = grandchild.parse().unwrap();
    let _cleanup = KillOnDrop(grandchild);
    assert_eq!(first, pid.to_string());
    // Read until it shows `sleep 3600` (a second at most): under a loaded test run the exec may
    // not show in /proc at once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let cmdline = loop {
        let cmdline = std::fs::read(format!("/proc/{grandchild}/cmdline"))
            .unwrap_or_else(|e| panic!("the grandchild {grandchild} runs: {e}; stderr:\n{}", stderr()));
        if cmdline == b"sleep\x003600\x00" || std::time::Instant::now() > deadline {
            break cmdline;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(String::from_utf8_lossy(&cmdline), "sleep\x003600\x00", "/proc/{grandchild}/cmdline");

    // Killing only the child leaves the grandchild running: what the gateway's process-group
    // kill must handle.
    s.child.start_kill().unwrap();
    let status = exit_status(&mut s.child).await;
    let stat = std::fs::read_to_string(format!("/proc/{grandchild}/stat"));
    assert!(stat.is_ok(), "the grandchild {grandchild} survives its parent (which ended with {status}): {stat:?}");
}

#[tokio::test]
async fn serves_resources_with_the_flag() {
    let s = connect(command(&["--resources"])).await;
    let info = s.client.peer_info().unwrap();
    assert!(info.capabilities.resources.is_some(), "{info:?}");
    let listed = s.client.list_resources(None).await.unwrap();
    let uris: Vec<&str> = listed.resources.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(uris, ["fault://doc/1", "fault://doc/2"]);
    let templates = s.client.list_resource_templates(None).await.unwrap();
    assert_eq!(templates.resource_templates.len(), 1);
    assert_eq!(templates.resource_templates[0].uri_template, "fault://doc/{id}");

    for id in ["1", "2", "42"] {
        let read = s.client.read_resource(ReadResourceRequestParams::new(format!("fault://doc/{id}"))).await.unwrap();
        match &read.contents[..] {
            [ResourceContents::TextResourceContents { uri, text, .. }] => {
                assert_eq!(uri, &format!("fault://doc/{id}"));
                assert_eq!(text, &format!("document {id}"));
            }
            other => panic!("one text resource, not {other:?}"),
        }
    }
    let missing = s.client.read_resource(ReadResourceRequestParams::new("other://x")).await.unwrap_err();
    assert!(missing.to_string().contains("no resource \"other://x\""), "{missing}");
    s.client.cancel().await.unwrap();
}
