//! `fault_upstream`: a small MCP server over stdio that misbehaves on demand (crash, hang, slow or
//! huge answers, `list_changed`, exit at start), for the gateway tests. Real servers do none of
//! this when asked. Built by `cargo test` as an example: `target/debug/examples/fault_upstream`.
//!
//! Flags (any order):
//!   --exit-at-start      exit with status 3 before reading stdin
//!   --hang-at-start      never answer `initialize` (stdin is read and ignored)
//!   --starts FILE        append `<pid>\n` (or `<pid> <grandchild-pid>\n`) to FILE at each start
//!   --log FILE           append one line per notable event: `call <tool>`, `cancelled <requestId>`
//!   --grandchild         spawn `sleep 3600` at start (process-group kill tests)
//!   --stderr-lines N     write N lines of 1 KiB to stderr at start
//!   --resources          declare and serve resources `fault://doc/<id>`
//!   --tools N            list N more tools `t<i>` (each echoes its text)
//!   --big-tool BYTES     list one more tool `big` whose description is BYTES long
//!   --schema FILE        list one more tool `custom` whose inputSchema is FILE's JSON
//!   --endless-pages      every tools/list page has a nextCursor, a new one each time
//!   --repeat-cursor      every tools/list page has the same nextCursor
//!   --huge-line BYTES    write one BYTES long line (no JSON) to stdout before serving
//!   --hostile            list the hostile tools below
//!   --describe TEXT      list one more tool `described` whose description is TEXT
//!   --spew               list the tool `spew` (below)
//!
//! With --hostile, three more tools: `flood` sends `count` tools/list_changed notifications without changing
//! anything; `raw` writes `line` to stdout as is (stray responses, garbage); `ask` sends the
//! client sampling and roots requests and answers with what came back.
//!
//! With --spew, the tool `spew` floods the client with notifications of `kind` (`progress`, for
//! the call's own progress token; `log`, logging messages; `resource`, resource updates), each
//! carrying `bytes` of text (2048 by default), `per_second` of them (0: as fast as it can). It
//! ignores cancellation and never answers, unless `seconds` is given: then it stops after that
//! long and answers `spewed N`. It stops when the connection breaks, and logs `spew <kind> <N>`
//! (the number it sent) to --log.
//!
//! Tools: echo, add, slow, hang, progress, huge, crash, add_tool, fail, env, link (see `tools()`).
//! Prompt: greet.

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, Implementation, JsonObject, ListPromptsResult, ListResourceTemplatesRequestMethod,
    ListResourceTemplatesResult, ListResourcesRequestMethod, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, Prompt, PromptArgument, PromptMessage,
    ReadResourceRequestMethod, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate, ResourcesCapability, Role, ServerCapabilities, ServerConfig,
    SubscriptionFilter, Tool,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio::sync::broadcast;

const USAGE: &str = "usage: fault_upstream [--exit-at-start] [--hang-at-start] [--starts FILE] \
[--log FILE] [--grandchild] [--stderr-lines N] [--resources] [--tools N] [--big-tool BYTES] \
[--schema FILE] [--endless-pages] [--repeat-cursor] [--huge-line BYTES] [--hostile] [--describe TEXT] [--spew]";

/// A `huge` answer above this is refused rather than aborting the process on allocation.
const HUGE_LIMIT: u64 = 1 << 30;

#[derive(Default)]
struct Flags {
    exit_at_start: bool,
    hang_at_start: bool,
    starts: Option<PathBuf>,
    log: Option<PathBuf>,
    grandchild: bool,
    stderr_lines: usize,
    resources: bool,
    tools: usize,
    big_tool: usize,
    schema: Option<Value>,
    endless_pages: bool,
    repeat_cursor: bool,
    huge_line: usize,
    hostile: bool,
    describe: Option<String>,
    spew: bool,
}

impl Flags {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Flags, String> {
        let mut flags = Flags::default();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            match arg.as_str() {
                "--exit-at-start" => flags.exit_at_start = true,
                "--hang-at-start" => flags.hang_at_start = true,
                "--starts" => flags.starts = Some(value("--starts")?.into()),
                "--log" => flags.log = Some(value("--log")?.into()),
                "--grandchild" => flags.grandchild = true,
                "--stderr-lines" => {
                    let n = value("--stderr-lines")?;
                    flags.stderr_lines = n.parse().map_err(|_| format!("--stderr-lines needs a count, not {n:?}"))?;
                }
                "--resources" => flags.resources = true,
                "--tools" => flags.tools = count(&value("--tools")?)?,
                "--big-tool" => flags.big_tool = count(&value("--big-tool")?)?,
                "--huge-line" => flags.huge_line = count(&value("--huge-line")?)?,
                "--schema" => {
                    let path = value("--schema")?;
                    let text = std::fs::read_to_string(&path).map_err(|e| format!("--schema {path}: {e}"))?;
                    flags.schema = Some(serde_json::from_str(&text).map_err(|e| format!("--schema {path}: {e}"))?);
                }
                "--endless-pages" => flags.endless_pages = true,
                "--repeat-cursor" => flags.repeat_cursor = true,
                "--hostile" => flags.hostile = true,
                "--describe" => flags.describe = Some(value("--describe")?),
                "--spew" => flags.spew = true,
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(flags)
    }
}

fn count(n: &str) -> Result<usize, String> {
    n.parse().map_err(|_| format!("expected a count, not {n:?}"))
}

fn main() -> ExitCode {
    let flags = match Flags::parse(std::env::args().skip(1)) {
        Ok(flags) => flags,
        Err(e) => {
            eprintln!("fault_upstream: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The start is recorded before any fault, so a crash loop still counts its starts.
    let mut start_line = std::process::id().to_string();
    if flags.grandchild {
        // Its stdio is detached: a grandchild holding our stdout would hide our exit from the
        // client. Never waited for, on purpose: the tests check that a group kill reaps it.
        match std::process::Command::new("sleep")
            .arg("3600")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(child) => start_line.push_str(&format!(" {}", child.id())),
            Err(e) => {
                eprintln!("fault_upstream: cannot spawn the grandchild `sleep 3600`: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(path) = &flags.starts {
        if let Err(e) = append_line(path, &start_line) {
            eprintln!("fault_upstream: cannot write --starts {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if flags.stderr_lines > 0 {
        let mut stderr = std::io::stderr().lock();
        for i in 0..flags.stderr_lines {
            // 1 KiB per line, newline included.
            let _ = writeln!(stderr, "{:.<1023}", format!("stderr line {i} "));
        }
    }
    if flags.exit_at_start {
        return ExitCode::from(3);
    }
    if flags.huge_line > 0 {
        // Written in pieces: the line never has to fit in this process's memory either.
        let mut stdout = std::io::stdout().lock();
        let chunk = vec![b'x'; 1 << 20];
        let mut left = flags.huge_line;
        while left > 0 {
            let n = left.min(chunk.len());
            if stdout.write_all(&chunk[..n]).is_err() {
                return ExitCode::FAILURE;
            }
            left -= n;
        }
        let _ = stdout.write_all(b"\n");
        let _ = stdout.flush();
    }
    if flags.hang_at_start {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        return ExitCode::SUCCESS;
    }
    // One thread: the server must start in a few ms (tests restart it a hundred times).
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fault_upstream: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fault_upstream: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(flags: Flags) -> Result<(), String> {
    let (changed, _) = broadcast::channel(16);
    let server = Fault {
        inner: Arc::new(Inner {
            resources: flags.resources,
            log: flags.log,
            added: Mutex::default(),
            changed,
            extra_tools: flags.tools,
            big_tool: flags.big_tool,
            schema: flags.schema,
            endless_pages: flags.endless_pages,
            repeat_cursor: flags.repeat_cursor,
            hostile: flags.hostile,
            describe: flags.describe,
            spew: flags.spew,
        }),
    };
    let running =
        server.serve(rmcp::transport::stdio_pipes()).await.map_err(|e| format!("MCP handshake over stdio: {e}"))?;
    running.waiting().await.map_err(|e| format!("MCP over stdio: {e}"))?;
    Ok(())
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    // One write per line on an O_APPEND file: concurrent processes never interleave a line.
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(format!("{line}\n").as_bytes())
}

#[derive(Clone)]
struct Fault {
    inner: Arc<Inner>,
}

struct Inner {
    resources: bool,
    log: Option<PathBuf>,
    /// Tools registered by `add_tool`, in order.
    added: Mutex<Vec<String>>,
    /// Fires when `add_tool` changed the list, for 2026-era clients (`subscriptions/listen`).
    changed: broadcast::Sender<()>,
    extra_tools: usize,
    big_tool: usize,
    schema: Option<Value>,
    endless_pages: bool,
    repeat_cursor: bool,
    hostile: bool,
    describe: Option<String>,
    spew: bool,
}

impl Fault {
    fn log(&self, event: &str) {
        if let Some(path) = &self.inner.log {
            if let Err(e) = append_line(path, event) {
                eprintln!("fault_upstream: cannot write --log {}: {e}", path.display());
            }
        }
    }

    fn tools(&self) -> Vec<Tool> {
        let mut tools = vec![
            Tool::new(
                "echo",
                "Answers with the text it was given.",
                object(
                    json!({
                        "text": {"type": "string"}
                    }),
                    &["text"],
                ),
            )
            .with_raw_output_schema(Arc::new(object(json!({"text": {"type": "string"}}), &["text"]))),
            Tool::new(
                "add",
                "Adds two numbers.",
                object(
                    json!({
                        "a": {"type": "number"}, "b": {"type": "number"}
                    }),
                    &["a", "b"],
                ),
            )
            .with_raw_output_schema(Arc::new(object(json!({"sum": {"type": "number"}}), &["sum"]))),
            Tool::new(
                "slow",
                "Sleeps ms milliseconds, then answers.",
                object(
                    json!({
                        "ms": {"type": "integer", "minimum": 0}
                    }),
                    &["ms"],
                ),
            ),
            Tool::new("hang", "Never answers; logs the cancellation.", object(json!({}), &[])),
            Tool::new(
                "progress",
                "Reports steps progress notifications, then answers.",
                object(
                    json!({
                        "steps": {"type": "integer", "minimum": 0}
                    }),
                    &["steps"],
                ),
            ),
            Tool::new(
                "huge",
                "Answers with bytes 'x' characters.",
                object(
                    json!({
                        "bytes": {"type": "integer", "minimum": 0}
                    }),
                    &["bytes"],
                ),
            ),
            // Annotated destructive: code mode's policy refuses it to scripts.
            Tool::new("crash", "Exits the server at once, without answering.", object(json!({}), &[]))
                .with_annotations(rmcp::model::ToolAnnotations::from_raw(
                    None,
                    Some(false),
                    Some(true),
                    Some(false),
                    Some(false),
                )),
            Tool::new(
                "add_tool",
                "Registers an echo-like tool and sends tools/list_changed.",
                object(
                    json!({
                        "name": {"type": "string"}
                    }),
                    &["name"],
                ),
            ),
            Tool::new(
                "fail",
                "Answers with isError and the message.",
                object(
                    json!({
                        "message": {"type": "string"}
                    }),
                    &["message"],
                ),
            ),
            Tool::new(
                "env",
                "Reports an environment variable of the server (null when unset).",
                object(
                    json!({
                        "name": {"type": "string"}
                    }),
                    &["name"],
                ),
            )
            .with_raw_output_schema(Arc::new(object(json!({"value": {"type": ["string", "null"]}}), &["value"]))),
            Tool::new("link", "Answers with a resource link and an embedded resource.", object(json!({}), &[])),
        ];
        if self.inner.hostile {
            tools.extend([
                Tool::new(
                    "flood",
                    "Sends count tools/list_changed notifications; the list stays the same.",
                    object(json!({"count": {"type": "integer", "minimum": 0}}), &["count"]),
                ),
                Tool::new(
                    "raw",
                    "Writes line to stdout as is, outside the protocol.",
                    object(json!({"line": {"type": "string"}}), &["line"]),
                ),
                Tool::new("ask", "Sends the client sampling and roots requests.", object(json!({}), &[])),
            ]);
        }
        if self.inner.spew {
            tools.push(Tool::new(
                "spew",
                "Floods the client with notifications of kind, each with bytes of text; ignores cancellation.",
                object(
                    json!({
                        "kind": {"enum": ["progress", "log", "resource"]},
                        "bytes": {"type": "integer", "minimum": 0},
                        "per_second": {"type": "integer", "minimum": 0},
                        "seconds": {"type": "number", "minimum": 0},
                    }),
                    &["kind"],
                ),
            ));
        }
        let echo_like = |name: String, description: String| {
            Tool::new(name, description, object(json!({"text": {"type": "string"}}), &["text"]))
        };
        tools.extend((0..self.inner.extra_tools).map(|i| echo_like(format!("t{i}"), "One of many.".into())));
        if self.inner.big_tool > 0 {
            tools.push(echo_like("big".into(), "d".repeat(self.inner.big_tool)));
        }
        if let Some(text) = &self.inner.describe {
            tools.push(echo_like("described".into(), text.clone()));
        }
        if let Some(Value::Object(schema)) = &self.inner.schema {
            tools.push(Tool::new("custom", "Its inputSchema comes from --schema.", schema.clone()));
        }
        let added = self.inner.added.lock().unwrap_or_else(PoisonError::into_inner);
        tools.extend(added.iter().map(|name| {
            Tool::new(
                name.clone(),
                "Added by add_tool: answers with the text.",
                object(
                    json!({
                        "text": {"type": "string"}
                    }),
                    &["text"],
                ),
            )
        }));
        tools
    }

    async fn call(
        &self,
        name: &str,
        args: &JsonObject,
        cx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        match name {
            "echo" => {
                let text = string(args, name, "text")?;
                let mut result = CallToolResult::structured(json!({ "text": text }));
                result.content = vec![ContentBlock::text(text)];
                Ok(result)
            }
            "add" => {
                let (a, b) = (number(args, name, "a")?, number(args, name, "b")?);
                let sum = sum(a, b);
                let mut result = CallToolResult::structured(json!({ "sum": sum }));
                result.content = vec![ContentBlock::text(sum.to_string())];
                Ok(result)
            }
            "slow" => {
                let ms = integer(args, name, "ms")?;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(text(format!("slept {ms}")))
            }
            "hang" => {
                // rmcp cancels this token on notifications/cancelled, and drops the answer of a
                // cancelled request, so the error below never reaches the client.
                cx.ct.cancelled().await;
                self.log(&format!("cancelled {}", cx.id));
                Err(McpError::internal_error("cancelled", None))
            }
            "progress" => {
                let steps = integer(args, name, "steps")?;
                if let Some(token) = cx.meta.get_progress_token() {
                    for i in 1..=steps {
                        let note = ProgressNotificationParam::new(token.clone(), i as f64)
                            .with_total(steps as f64)
                            .with_message(format!("step {i}"));
                        cx.peer
                            .notify_progress(note)
                            .await
                            .map_err(|e| McpError::internal_error(format!("progress notification: {e}"), None))?;
                    }
                }
                Ok(text("done".into()))
            }
            "huge" => {
                let bytes = integer(args, name, "bytes")?;
                if bytes > HUGE_LIMIT {
                    return Err(McpError::invalid_params(
                        format!("huge: bytes must be at most {HUGE_LIMIT}, not {bytes}"),
                        None,
                    ));
                }
                Ok(text("x".repeat(bytes as usize)))
            }
            "crash" => std::process::exit(1),
            "add_tool" => {
                let new = string(args, name, "name")?;
                if new.is_empty() || self.tools().iter().any(|t| t.name == new) {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                        "add_tool: {new:?} is empty or already a tool; pick another name"
                    ))]));
                }
                self.inner.added.lock().unwrap_or_else(PoisonError::into_inner).push(new.clone());
                let _ = self.inner.changed.send(());
                // Session-era clients (2025-11-25, what stdio clients negotiate) get it here.
                cx.peer
                    .notify_tool_list_changed()
                    .await
                    .map_err(|e| McpError::internal_error(format!("tools/list_changed: {e}"), None))?;
                Ok(text(format!("added {new}")))
            }
            "fail" => Ok(CallToolResult::error(vec![ContentBlock::text(string(args, name, "message")?)])),
            "env" => {
                let var = string(args, name, "name")?;
                Ok(CallToolResult::structured(json!({ "value": std::env::var(var).ok() })))
            }
            "link" => Ok(CallToolResult::success(vec![
                ContentBlock::resource_link(Resource::new("fault://doc/1", "doc 1").with_mime_type("text/plain")),
                ContentBlock::resource(
                    ResourceContents::text("document 2", "fault://doc/2").with_mime_type("text/plain"),
                ),
            ])),
            "flood" => {
                for _ in 0..integer(args, name, "count")? {
                    cx.peer
                        .notify_tool_list_changed()
                        .await
                        .map_err(|e| McpError::internal_error(format!("tools/list_changed: {e}"), None))?;
                }
                Ok(text("flooded".into()))
            }
            "spew" => self.spew(args, cx).await,
            "raw" => {
                // Straight to fd 1, one write: a line under PIPE_BUF never interleaves with
                // rmcp's own writes.
                let line = format!("{}\n", string(args, name, "line")?);
                let mut stdout = std::io::stdout().lock();
                stdout
                    .write_all(line.as_bytes())
                    .and_then(|()| stdout.flush())
                    .map_err(|e| McpError::internal_error(format!("raw: {e}"), None))?;
                Ok(text("written".into()))
            }
            // Deprecated in the 2026 protocol, still what a 2025-era server may send.
            #[allow(deprecated)]
            "ask" => {
                let sampling = cx
                    .peer
                    .create_message(rmcp::model::CreateMessageRequestParams::new(
                        vec![rmcp::model::SamplingMessage::user_text("hi")],
                        16,
                    ))
                    .await;
                let roots = cx.peer.list_roots().await;
                let show = |r: Result<Value, String>| match r {
                    Ok(v) => json!({"ok": v}),
                    Err(e) => json!({"error": e}),
                };
                let sampling = show(sampling.map(|r| json!(r)).map_err(|e| e.to_string()));
                let roots = show(roots.map(|r| json!(r)).map_err(|e| e.to_string()));
                Ok(CallToolResult::structured(json!({"sampling": sampling, "roots": roots})))
            }
            "custom" => Ok(text("custom".into())),
            other if self.inner.added.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|t| t == other) => {
                Ok(text(string(args, other, "text")?))
            }
            other => Err(McpError::invalid_params(format!("unknown tool {other:?}; tools/list names the tools"), None)),
        }
    }
}

impl Fault {
    /// The `spew` tool: notifications until `seconds` pass or the connection breaks.
    // Logging messages are deprecated in the 2026 protocol, still what a 2025-era server may send.
    #[allow(deprecated)]
    async fn spew(&self, args: &JsonObject, cx: &RequestContext<RoleServer>) -> Result<CallToolResult, McpError> {
        let kind = string(args, "spew", "kind")?;
        let bytes = args.get("bytes").and_then(Value::as_u64).unwrap_or(2048).min(1 << 20) as usize;
        let per_second = args.get("per_second").and_then(Value::as_u64).unwrap_or(0);
        let until = args
            .get("seconds")
            .and_then(Value::as_f64)
            .map(|s| tokio::time::Instant::now() + Duration::from_secs_f64(s));
        let payload = "s".repeat(bytes);
        let token = cx
            .meta
            .get_progress_token()
            .unwrap_or_else(|| rmcp::model::ProgressToken(rmcp::model::NumberOrString::String("spew".into())));
        let mut sent = 0u64;
        let outcome = loop {
            if until.is_some_and(|t| tokio::time::Instant::now() >= t) {
                break Ok(());
            }
            let result = match kind.as_str() {
                "progress" => {
                    let note = ProgressNotificationParam::new(token.clone(), sent as f64).with_message(payload.clone());
                    cx.peer.notify_progress(note).await
                }
                "log" => {
                    let note = rmcp::model::LoggingMessageNotificationParam::new(
                        rmcp::model::LoggingLevel::Info,
                        json!({"text": payload}),
                    );
                    cx.peer.notify_logging_message(note).await
                }
                "resource" => {
                    let uri = format!("fault://doc/{payload}");
                    cx.peer.notify_resource_updated(rmcp::model::ResourceUpdatedNotificationParam::new(uri)).await
                }
                other => {
                    return Err(bad_argument("spew", "kind", &format!("progress, log or resource, not {other:?}")))
                }
            };
            if let Err(e) = result {
                break Err(e);
            }
            sent += 1;
            if per_second > 0 {
                tokio::time::sleep(Duration::from_secs_f64(1.0 / per_second as f64)).await;
            } else if sent.is_multiple_of(64) {
                // Lets the runtime read stdin (a cancellation, which this tool ignores anyway).
                tokio::task::yield_now().await;
            }
        };
        self.log(&format!("spew {kind} {sent}"));
        match outcome {
            Ok(()) => Ok(text(format!("spewed {sent}"))),
            Err(e) => Err(McpError::internal_error(format!("spew: {e}"), None)),
        }
    }
}

fn object(properties: Value, required: &[&str]) -> JsonObject {
    let schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    match schema {
        Value::Object(map) => map,
        _ => unreachable!("json! of an object literal is an object"),
    }
}

fn text(text: String) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(text)])
}

fn bad_argument(tool: &str, key: &str, want: &str) -> McpError {
    McpError::invalid_params(format!("{tool}: argument {key:?} must be {want}"), None)
}

fn string(args: &JsonObject, tool: &str, key: &str) -> Result<String, McpError> {
    args.get(key).and_then(Value::as_str).map(str::to_owned).ok_or_else(|| bad_argument(tool, key, "a string"))
}

fn number(args: &JsonObject, tool: &str, key: &str) -> Result<serde_json::Number, McpError> {
    match args.get(key) {
        Some(Value::Number(n)) => Ok(n.clone()),
        _ => Err(bad_argument(tool, key, "a number")),
    }
}

fn integer(args: &JsonObject, tool: &str, key: &str) -> Result<u64, McpError> {
    args.get(key).and_then(Value::as_u64).ok_or_else(|| bad_argument(tool, key, "a non-negative integer"))
}

/// Integers add exactly (2 + 3 is `5`, not `5.0`); anything else adds as floating point.
fn sum(a: serde_json::Number, b: serde_json::Number) -> Value {
    if let (Some(a), Some(b)) = (a.as_i64(), b.as_i64()) {
        if let Some(sum) = a.checked_add(b) {
            return json!(sum);
        }
    }
    json!(a.as_f64().unwrap_or(f64::NAN) + b.as_f64().unwrap_or(f64::NAN))
}

impl ServerHandler for Fault {
    fn get_info(&self) -> ServerConfig {
        let mut capabilities =
            ServerCapabilities::builder().enable_tools().enable_tool_list_changed().enable_prompts().build();
        if self.inner.resources {
            capabilities.resources = Some(ResourcesCapability::default());
        }
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("fault_upstream", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut result = ListToolsResult::with_all_items(self.tools());
        if self.inner.repeat_cursor {
            result.next_cursor = Some("again".into());
        } else if self.inner.endless_pages {
            let page = _request.and_then(|r| r.cursor).and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
            result.next_cursor = Some((page + 1).to_string());
        }
        Ok(result)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let name: Cow<'_, str> = request.name;
        self.log(&format!("call {name}"));
        let args = request.arguments.unwrap_or_default();
        self.call(&name, &args, &cx).await.map(Into::into)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let name = PromptArgument::new("name").with_description("Who to greet").with_required(true);
        Ok(ListPromptsResult::with_all_items(vec![Prompt::new(
            "greet",
            Some("Greets someone by name."),
            Some(vec![name]),
        )]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        if request.name != "greet" {
            return Err(McpError::invalid_params(
                format!("unknown prompt {:?}; the prompt is greet", request.name),
                None,
            ));
        }
        let who = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| McpError::invalid_params("greet: argument \"name\" must be a string", None))?;
        Ok(GetPromptResult::new(vec![PromptMessage::new_text(Role::User, format!("Hello, {who}"))]).into())
    }

    // Without --resources the capability is not declared, so the methods do not exist either
    // (rmcp's defaults would answer with empty lists).
    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        if !self.inner.resources {
            return Err(McpError::method_not_found::<ListResourcesRequestMethod>());
        }
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new("fault://doc/1", "doc 1").with_mime_type("text/plain"),
            Resource::new("fault://doc/2", "doc 2").with_mime_type("text/plain"),
        ]))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        if !self.inner.resources {
            return Err(McpError::method_not_found::<ListResourceTemplatesRequestMethod>());
        }
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("fault://doc/{id}", "doc").with_mime_type("text/plain")
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        if !self.inner.resources {
            return Err(McpError::method_not_found::<ReadResourceRequestMethod>());
        }
        match request.uri.strip_prefix("fault://doc/") {
            Some(id) if !id.is_empty() => {
                Ok(ReadResourceResult::new(vec![
                    ResourceContents::text(format!("document {id}"), request.uri.clone()).with_mime_type("text/plain")
                ])
                .into())
            }
            _ => Err(McpError::resource_not_found(
                format!("no resource {:?}; the resources are fault://doc/<id>", request.uri),
                None,
            )),
        }
    }

    /// 2026-era clients get `list_changed` through `subscriptions/listen`.
    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(requested.supported_by(&self.get_info().capabilities))
    }

    async fn listen(&self, cx: SubscriptionContext) -> Result<(), McpError> {
        if cx.accepted().tools_list_changed != Some(true) {
            cx.cancelled().await;
            return Ok(());
        }
        let mut changed = self.inner.changed.subscribe();
        loop {
            tokio::select! {
                _ = cx.cancelled() => return Ok(()),
                received = changed.recv() => match received {
                    Ok(()) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        if cx.sink().notify_tool_list_changed().await.is_err() {
                            return Ok(());
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return Ok(()),
                },
            }
        }
    }
}
