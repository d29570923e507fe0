//! MCP over rmcp: `tools/list` and `tools/call` as a thin adapter over the one call path.
//!
//! rmcp types stay in this module. The registry knows nothing about MCP: listing entries come
//! from [`ToolSpec`], results from [`Output::mcp`] and [`CallError::mcp`], and every call goes
//! through [`Tools::call`], which validates, runs and maps errors once for REST and MCP alike.

mod approve;
pub mod batch;
mod convert;
pub mod direct;
mod notify;
pub mod progress;
pub mod sessions;
mod tasks;
mod upstream;

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, CompleteRequestMethod, CompleteRequestParams,
    CompleteResult, CustomRequest, CustomResult, ErrorCode as RpcCode, GetPromptRequestParams, GetPromptResponse,
    GetTaskParams, GetTaskResult, Implementation, ListPromptsResult, ListResourceTemplatesRequestMethod,
    ListResourceTemplatesResult, ListResourcesRequestMethod, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse,
    ServerCapabilities, ServerConfig, SubscriptionFilter, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value as Json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::lua::{CancelHandle, Progress};
use crate::tools::{CallError, CallOptions, Tools};
use sessions::SharedSessions;

/// Tools per `tools/list` page.
pub const PAGE_SIZE: usize = 50;

/// Which lists a reload changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changed {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
}

/// The MCP server handler. Cheap to clone: rmcp makes one per session and per stateless request.
#[derive(Clone)]
pub struct Mcp {
    inner: Arc<Inner>,
    /// Over stdio: the wait for the upstreams before the first `tools/list` (see [`FirstList`]).
    first_list: Option<Arc<FirstList>>,
}

/// Desktop clients list tools once, at start, and many ignore `list_changed`: over stdio the
/// first `tools/list` (or call) waits, up to `[mcp] stdio_wait`, for every upstream to be ready
/// or to have failed once, so that their tools are in the one list the client reads.
struct FirstList {
    within: std::time::Duration,
    done: tokio::sync::OnceCell<()>,
}

struct Inner {
    tools: Arc<Tools>,
    /// Fires when the tool or prompt list changed (hot reload); every connected client is told.
    changed: broadcast::Sender<Changed>,
    page_size: usize,
    /// Calls answered by the direct route (see `direct.rs`).
    direct_calls: Arc<std::sync::atomic::AtomicU64>,
    /// Session-era clients to tell about list changes.
    session_peers: Arc<notify::SessionPeers>,
}

impl Mcp {
    pub fn new(tools: Arc<Tools>) -> Mcp {
        Mcp::with_page_size(tools, PAGE_SIZE)
    }

    pub fn with_page_size(tools: Arc<Tools>, page_size: usize) -> Mcp {
        let (changed, _) = broadcast::channel(16);
        Mcp {
            inner: Arc::new(Inner {
                tools,
                changed,
                page_size: page_size.max(1),
                direct_calls: Default::default(),
                session_peers: Default::default(),
            }),
            first_list: None,
        }
    }

    /// Over stdio, the first list or call waits for the upstreams (see [`FirstList`]).
    async fn upstreams_settled(&self) {
        let Some(first) = &self.first_list else { return };
        first
            .done
            .get_or_init(|| async {
                let Some(upstreams) = self.inner.tools.upstreams() else { return };
                let late = upstreams.settled(first.within).await;
                // The registry takes in new upstream tools on its own thread; take them in now,
                // so that the list about to be answered has them.
                self.inner.tools.refresh_upstreams();
                if !late.is_empty() {
                    tracing::warn!(
                        "upstream MCP servers not ready within {} s ([mcp] stdio_wait): {}; the client's first tools/list goes without their tools, which follow with notifications/tools/list_changed",
                        first.within.as_secs_f64(),
                        late.join(", ")
                    );
                }
            })
            .await;
    }

    /// How many `tools/call` requests the direct route answered (the rest went through rmcp).
    pub fn direct_calls(&self) -> u64 {
        self.inner.direct_calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `/mcp`: rmcp's Streamable HTTP endpoint behind the direct route for plain stateless
    /// tool calls (and the refusals rmcp cannot word well: batches, too many sessions).
    /// `allowed_origins` is the server's `[server] allowed_origins`.
    pub fn http_route(
        &self,
        allowed_origins: &[String],
        max_body_bytes: usize,
        sessions: SharedSessions,
        shutdown: CancellationToken,
    ) -> direct::DirectRoute {
        let limit = rmcp_body_limit(max_body_bytes);
        let rmcp = self.http_service(allowed_origins, max_body_bytes, Arc::clone(&sessions), shutdown);
        direct::DirectRoute::new(self.clone(), rmcp, limit, sessions)
    }

    pub fn tools(&self) -> &Arc<Tools> {
        &self.inner.tools
    }

    /// Tells every connected client that the tool list changed (`notifications/tools/list_changed`).
    pub fn tools_changed(&self) {
        self.lists_changed(Changed { tools: true, prompts: false, resources: false });
    }

    /// Tells every connected client which lists changed (`notifications/tools/list_changed`,
    /// `notifications/prompts/list_changed`).
    pub fn lists_changed(&self, changed: Changed) {
        if changed.tools || changed.prompts || changed.resources {
            let _ = self.inner.changed.send(changed);
        }
    }

    /// The Streamable HTTP endpoint (mounted at `/mcp`). The server's guard has already checked
    /// the token, Host and Origin; rmcp checks Origin again with the same settings.
    pub fn http_service(
        &self,
        allowed_origins: &[String],
        max_body_bytes: usize,
        sessions: SharedSessions,
        shutdown: CancellationToken,
    ) -> StreamableHttpService<Mcp, sessions::Sessions> {
        // Plain JSON replies on the stateless (2026) path: a call that reports no progress gets
        // one JSON body, and a client that hangs up cancels the call at once (an SSE reply would
        // only notice at its next keep-alive write). Progress still switches the reply to SSE.
        let mut config = StreamableHttpServerConfig::default()
            .with_json_response(true)
            .with_cancellation_token(shutdown)
            .with_max_request_body_bytes(rmcp_body_limit(max_body_bytes));
        // The guard is the one Host check (`server::guard::is_loopback_host`): a second list
        // here would disagree with it (rmcp allows 127.0.0.1 but not the rest of 127.0.0.0/8).
        config = config.disable_allowed_hosts();
        if !allowed_origins.is_empty() {
            let mut origins = allowed_origins.to_vec();
            // Same-origin pages (served by ctx itself) pass the guard; let them through here too.
            origins.extend(["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"].map(String::from));
            config = config.with_allowed_origins(origins);
        }
        let handler = self.clone();
        StreamableHttpService::new(move || Ok(handler.clone()), sessions, config)
    }

    /// Serves MCP on stdin/stdout until the client closes the stream. The first `tools/list`
    /// waits up to `stdio_wait` for the upstream servers.
    pub async fn serve_stdio(mut self, stdio_wait: std::time::Duration) -> Result<(), String> {
        self.first_list = Some(Arc::new(FirstList { within: stdio_wait, done: Default::default() }));
        // Pipes (how MCP clients launch servers) are driven by the IO reactor; a terminal or file
        // falls back to tokio's blocking stdio, which hands every read and write to a thread.
        let (stdin, stdout) = rmcp::transport::stdio_pipes();
        let seen = Arc::new(batch::Seen::default());
        let lines = rmcp::transport::async_rw::AsyncRwTransport::new_server(
            batch::BatchFilter::new(stdin, Arc::clone(&seen)),
            stdout,
        );
        let transport = batch::Answering::new(lines, seen);
        let running = self.serve(transport).await.map_err(|e| format!("MCP over stdio: {e}"))?;
        running.waiting().await.map_err(|e| format!("MCP over stdio: {e}"))?;
        Ok(())
    }

    /// rmcp's `tools/call` (sessions, stdio, and the stateless requests the direct route does
    /// not take): what the request carries, read from rmcp's types, for [`Mcp::tools_call`].
    async fn call(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let answer = request.input_responses.as_ref().and_then(|r| r.get(approve::INPUT_KEY)).map(approve::answered);
        let principal = principal(&cx);
        let asking = match may_ask(self.inner.tools.current().approvals(), principal.as_deref()) {
            true => approve::asking(&cx),
            false => approve::Asking::No,
        };
        let call = CallRequest {
            name: request.name.to_string(),
            arguments: request.arguments.unwrap_or_default(),
            principal,
            asking,
            answered: answer.zip(request.request_state.clone()),
            tasks: cx.client_capabilities().is_some_and(|c| c.supports_tasks()),
            cx: Some(cx),
        };
        self.tools_call(call).await
    }

    /// The one implementation of MCP's `tools/call`, in every era and whichever route the
    /// request came by (rmcp's handler, or the direct route for plain stateless calls): the call
    /// through the pipeline once, its progress and cancellation, the approval question, and the
    /// answer ([`respond`]).
    pub(super) async fn tools_call(&self, request: CallRequest) -> Result<CallToolResponse, McpError> {
        let CallRequest { name, arguments, principal, asking, answered, tasks, cx } = request;
        let params = Json::Object(arguments);
        if answered.is_none() && self.runs_as_task(&name, principal.as_deref(), tasks) {
            return self.start_modern(name, params, principal).await;
        }
        // A 2026-era retry that answers ctx's approval question.
        if let Some((answer, state)) = answered {
            let asked = match may_ask(self.inner.tools.current().approvals(), principal.as_deref()) {
                true => self.inner.tools.current().approvals().asked(&state),
                false => None,
            };
            let result = match asked {
                Some(token) => self.decide_and_run(cx.as_ref(), &name, params, &token, answer, principal).await,
                None => Err(CallError::ApprovalRefused(format!(
                    "tool '{name}' did not run: the answer does not come from a question this server asked (it restarted, or the state was changed); call again without it"
                ))),
            };
            return respond(&self.inner.tools, result, false);
        }
        let token = cx.as_ref().and_then(|cx| cx.meta.get_progress_token());
        let (sink, mut progress_rx) = progress::queue();
        // Without a token the sink is dropped here, and the queue ends at once.
        let progress = token.is_some().then_some(sink);
        // A client that can be asked in this era is asked while the call waits in the pipeline.
        let ask = match (&cx, asking) {
            (Some(cx), approve::Asking::Request) => Some(Arc::new(approve::Elicit {
                cx: cx.clone(),
                policy: Arc::clone(self.inner.tools.current().approvals()),
                caller: principal.as_ref().map(|p| p.name().to_string()).unwrap_or_default(),
            }) as Arc<dyn crate::tools::Ask>),
            _ => None,
        };
        let options = CallOptions {
            cancel: CancelHandle::new(),
            progress,
            caller: "mcp",
            principal: principal.clone(),
            ask,
            ..Default::default()
        };
        // Dropping the call future cancels the script (Tools::call), so leaving the loop on
        // `notifications/cancelled` or a closed transport stops it.
        let call = self.inner.tools.call(name.clone(), params, options);
        tokio::pin!(call);
        let send = |p: Progress| {
            let peer = cx.as_ref().map(|cx| cx.peer.clone());
            let token = token.clone();
            async move {
                if let (Some(token), Some(peer)) = (token, peer) {
                    let mut note = ProgressNotificationParam::new(token, p.done);
                    if let Some(total) = p.total {
                        note = note.with_total(total);
                    }
                    if let Some(message) = p.message {
                        note = note.with_message(message);
                    }
                    // The client may be gone; the call's outcome decides what happens next.
                    let _ = peer.notify_progress(note).await;
                }
            }
        };
        let result = loop {
            tokio::select! {
                biased;
                Some(p) = progress_rx.recv() => send(p).await,
                result = &mut call => break result,
                _ = cancelled(cx.as_ref()) => break Err(CallError::cancelled(&name)),
            }
        };
        // Progress reported just before the end goes out before the result.
        while let Some(p) = progress_rx.try_recv() {
            send(p).await;
        }
        let dropped = progress_rx.dropped();
        if dropped > 0 {
            tracing::warn!(
                "tool {name}: dropped {dropped} progress reports the client did not read in time (at most {} wait)",
                progress::QUEUE_LEN
            );
        }
        respond(&self.inner.tools, result, asking == approve::Asking::InputRequired)
    }

    /// Records the user's answer for the approval of `token`, like a decision made with `ctx
    /// approvals` (so the log and `/approvals` show who decided), then makes the call with the
    /// token: the one call path checks that it is this call, this caller, and approved.
    async fn decide_and_run(
        &self,
        cx: Option<&RequestContext<RoleServer>>,
        tool: &str,
        params: Json,
        token: &str,
        answer: approve::Answer,
        principal: Option<Arc<crate::tools::Principal>>,
    ) -> Result<crate::tools::Output, CallError> {
        let policy = Arc::clone(self.inner.tools.current().approvals());
        let caller = principal.as_ref().map(|p| p.name().to_string()).unwrap_or_default();
        let token = approve::record(policy, token, &caller, answer).await?;
        let options = CallOptions {
            cancel: CancelHandle::new(),
            caller: "mcp",
            principal,
            approval: Some(token),
            ..Default::default()
        };
        let call = self.inner.tools.call(tool.to_string(), params, options);
        tokio::select! {
            result = call => result,
            _ = cancelled(cx) => Err(CallError::cancelled(tool)),
        }
    }
}

/// What a `tools/call` request carries, however it came.
pub(super) struct CallRequest {
    pub name: String,
    pub arguments: serde_json::Map<String, Json>,
    /// Whom the call is made for (a scoped token), if anyone.
    pub principal: Option<Arc<crate::tools::Principal>>,
    /// Whether and how this client may be asked to approve a call.
    pub asking: approve::Asking,
    /// A 2026-era retry's answer to ctx's approval question, with the question's request state.
    pub answered: Option<(approve::Answer, String)>,
    /// The client declared the 2026 era's tasks extension: a long-running call may answer a
    /// task handle.
    pub tasks: bool,
    /// rmcp's context of the request (its progress token, its peer, its cancellation), when it
    /// came through rmcp. The direct route's plain calls carry no progress token, cannot be
    /// asked with a request of the server's, and are cancelled by dropping their future.
    pub cx: Option<RequestContext<RoleServer>>,
}

/// Resolves when rmcp cancels the request (`notifications/cancelled`, a closed transport);
/// never without a context.
async fn cancelled(cx: Option<&RequestContext<RoleServer>>) {
    match cx {
        Some(cx) => cx.ct.cancelled().await,
        None => std::future::pending().await,
    }
}

/// How a `tools/call`'s outcome is answered, in every era and on both HTTP routes (rmcp's
/// handler and the direct route): a protocol error in JSON-RPC's own words; a pending approval,
/// when the client may be asked with an input-required result (`ask_by_input`), as the question;
/// any other outcome as a tool result.
fn respond(
    tools: &Tools,
    outcome: Result<crate::tools::Output, CallError>,
    ask_by_input: bool,
) -> Result<CallToolResponse, McpError> {
    match outcome {
        Err(e) if e.is_protocol_error() => Err(convert::protocol_error(&e)),
        Err(CallError::ApprovalRequired(pending)) if ask_by_input => {
            let state = tools.current().approvals().question_state(&pending);
            match approve::input_required(&pending, state) {
                Some(question) => Ok(CallToolResponse::InputRequired(question)),
                None => Ok(convert::error_result(&CallError::ApprovalRequired(pending))?.into()),
            }
        }
        Ok(output) => Ok(convert::output(&output)?.into()),
        Err(e) => Ok(convert::error_result(&e)?.into()),
    }
}

/// A finished call as MCP answers it, for a task's store: the `CallToolResult` as JSON, or the
/// JSON-RPC error object (`true`) when the call never reached the tool.
pub fn task_result(result: &Result<crate::tools::Output, CallError>) -> (Json, bool) {
    let rendered = match result {
        Err(e) if e.is_protocol_error() => Err(convert::protocol_error(e)),
        Ok(output) => convert::output(output),
        Err(e) => convert::error_result(e),
    };
    match rendered {
        Ok(result) => (serde_json::to_value(result).unwrap_or_default(), false),
        Err(error) => (serde_json::to_value(error).unwrap_or_default(), true),
    }
}

/// Whom a request's calls are made for: the scoped token the HTTP request carried (the guard
/// put it in the request's extensions, and rmcp hands the request's parts to the handler).
/// Stdio and unscoped requests have none.
fn principal(cx: &RequestContext<RoleServer>) -> Option<Arc<crate::tools::Principal>> {
    let parts = cx.extensions.get::<axum::http::request::Parts>()?;
    parts.extensions.get::<crate::contract::Caller>().and_then(|c| c.0.clone())
}

/// Whether the caller's own client may be asked to approve its calls: only when the operator
/// turned it on (`[approval] ask_clients`), and for a scoped token only when its entry says
/// `approve_own_calls = true`. Otherwise holding a token would be enough to approve its calls.
pub(super) fn may_ask(approvals: &crate::approval::Policy, principal: Option<&crate::tools::Principal>) -> bool {
    approvals.ask_clients && principal.is_none_or(|p| p.approves_own_calls())
}

/// Starts the call-log entry of an MCP request that is not a tool call, with its caller.
fn observe<'a>(
    registry: &'a crate::tools::Registry,
    cx: &RequestContext<RoleServer>,
    method: &'a str,
    params: &Json,
) -> crate::tools::Observed<'a> {
    let options = CallOptions { caller: "mcp", principal: principal(cx), ..Default::default() };
    crate::tools::Observed::start(registry.state(), method, params, &options)
}

/// rmcp's body limit: the server's, but never below what MCP handshakes need.
fn rmcp_body_limit(max_body_bytes: usize) -> usize {
    max_body_bytes.max(64 * 1024)
}

impl ServerHandler for Mcp {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tasks()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_prompts()
            .enable_prompts_list_changed();
        // Resources exist only through upstream servers that offer them.
        let capabilities = if upstream::has_resources(&self.inner.tools) {
            capabilities.enable_resources().enable_resources_list_changed().build()
        } else {
            capabilities.build()
        };
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("ctx", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "ctx: search and read your team's knowledge base (search, get, sources), run the team's Lua tools, and start from its agents (prompts).",
            )
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.upstreams_settled().await;
        let registry = self.inner.tools.current();
        let principal = principal(&cx);
        let all: Vec<_> = registry.specs_for(principal.as_deref()).collect();
        let start = match request.and_then(|r| r.cursor) {
            None => 0,
            Some(cursor) => cursor.parse::<usize>().ok().filter(|&n| n <= all.len()).ok_or_else(|| {
                McpError::invalid_params(
                    format!("invalid cursor {cursor:?}: pass the nextCursor of the previous page"),
                    Some(json!({ "cursor": cursor })),
                )
            })?,
        };
        let end = (start + self.inner.page_size).min(all.len());
        let page = all[start..end]
            .iter()
            .map(|(spec, description)| {
                let mut tool = convert::tool(spec);
                if let Some(description) = description {
                    tool.description = Some(description.clone().into());
                }
                tool
            })
            .collect();
        Ok(ListToolsResult {
            next_cursor: (end < all.len()).then(|| end.to_string()),
            ..ListToolsResult::with_all_items(page)
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.upstreams_settled().await;
        self.call(request, cx).await
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, McpError> {
        self.modern_get(principal(&cx).as_deref(), &request.task_id).await.map(GetTaskResult::new)
    }

    async fn update_task(&self, request: UpdateTaskParams, cx: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.modern_update(principal(&cx), &request.task_id, &request.input_responses).await
    }

    async fn cancel_task(&self, request: CancelTaskParams, cx: RequestContext<RoleServer>) -> Result<(), McpError> {
        self.modern_cancel(principal(&cx).as_deref(), &request.task_id).await
    }

    /// A `tools/call` whose params are not `{name, arguments?}` lands here (rmcp cannot parse
    /// it as a call): answer -32602 with what was wrong rather than "method not found".
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _cx: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        if request.method == "tools/call" {
            return Err(McpError::invalid_params(
                "tools/call needs params {\"name\": string, \"arguments\": object (optional)}",
                Some(json!({ "params": request.params })),
            ));
        }
        Err(McpError::new(RpcCode::METHOD_NOT_FOUND, format!("unknown method {:?}", request.method), None))
    }

    // ctx serves tools only. rmcp answers these with empty results by default; a server that
    // does not declare the capability must say "method not found" instead.
    async fn complete(
        &self,
        _request: CompleteRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        Err(McpError::method_not_found::<CompleteRequestMethod>())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let principal = principal(&cx);
        let current = self.inner.tools.current();
        let observed = observe(&current, &cx, "prompts/list", &Json::Null);
        let registry = self.inner.tools.current();
        let mut prompts: Vec<_> = registry.agents_for(principal.as_deref()).map(convert::prompt).collect();
        // The catalog prompt shows what `execute` can reach: only for a caller that may call it.
        if crate::tools::principal::allows(principal.as_deref(), "execute") {
            prompts.extend(convert::catalog_prompt(&registry));
        }
        let reach = upstream::Reach::new(&registry, principal.as_deref());
        prompts.extend(upstream::prompts(&self.inner.tools, &reach));
        observed.finish(Ok(json!({ "count": prompts.len() })));
        Ok(ListPromptsResult::with_all_items(prompts))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let tools = &self.inner.tools;
        let principal = principal(&cx);
        let registry = tools.current();
        let is_agent = registry.agents_for(principal.as_deref()).any(|a| a.name == request.name);
        let scripted = request.arguments.as_ref().and_then(|a| a.get("tool")).and_then(Json::as_str);
        let scripted = scripted.filter(|t| *t != "execute");
        // The catalog prompt is for callers that may run the script it is about; to any other,
        // it does not exist (the agent path answers "unknown").
        let may_script = crate::tools::principal::allows(principal.as_deref(), scripted.unwrap_or("execute"));
        if !is_agent && request.name == crate::code::PROMPT && may_script {
            let params = json!({ "name": request.name, "arguments": request.arguments });
            let current = self.inner.tools.current();
            let observed = observe(&current, &cx, "prompts/get", &params);
            let result = crate::code::catalog_prompt(&registry, scripted, principal.as_deref());
            let summary = result
                .as_ref()
                .map(|text| json!({ "bytes": text.len() }))
                .map_err(|m| CallError::BadRequest(m.clone()));
            observed.finish(summary.as_ref().cloned());
            return match result {
                Ok(text) => Ok(convert::catalog_result(text).into()),
                Err(message) => Err(McpError::invalid_params(message, None)),
            };
        }
        if !is_agent {
            let params = json!({ "name": request.name, "arguments": request.arguments });
            let current = self.inner.tools.current();
            let observed = observe(&current, &cx, "prompts/get", &params);
            let arguments = request.arguments.clone().unwrap_or_default();
            let reach = upstream::Reach::new(&registry, principal.as_deref());
            let upstream = upstream::get_prompt(tools, &reach, &request.name, arguments);
            let found = tokio::select! {
                found = upstream => found,
                _ = cx.ct.cancelled() => return Err(McpError::internal_error("cancelled", None)),
            };
            if let Some(result) = found {
                let summary = match &result {
                    Ok(prompt) => Ok(json!({ "messages": prompt.messages.len() })),
                    Err(e) => Err(CallError::Internal(e.message.to_string())),
                };
                observed.finish(summary.as_ref().cloned());
                return result.map(Into::into);
            }
            // Not an upstream prompt either: the agent path below answers (and logs) "unknown".
            observed.forget();
        }
        let args = request.arguments.map(Json::Object).unwrap_or(Json::Null);
        let options = CallOptions { caller: "mcp", principal, ..Default::default() };
        let resolve = self.inner.tools.prompt(request.name, args, options);
        let result = tokio::select! {
            result = resolve => result,
            _ = cx.ct.cancelled() => return Err(McpError::internal_error("cancelled", None)),
        };
        match result {
            Ok(prompt) => Ok(convert::prompt_result(prompt).into()),
            Err(e) if e.is_protocol_error() => Err(convert::protocol_error(&e)),
            // A failing agent script has no result form in prompts/get: report it as an error
            // with the same sanitised message and the REST error body as data.
            Err(e) => Err(McpError::internal_error(e.to_string(), serde_json::to_value(e.body()).ok())),
        }
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        if !upstream::has_resources(&self.inner.tools) {
            return Err(McpError::method_not_found::<ListResourcesRequestMethod>());
        }
        let current = self.inner.tools.current();
        let observed = observe(&current, &cx, "resources/list", &Json::Null);
        let principal = principal(&cx);
        let registry = self.inner.tools.current();
        let reach = upstream::Reach::new(&registry, principal.as_deref());
        let resources = upstream::resources(&self.inner.tools, &reach);
        observed.finish(Ok(json!({ "count": resources.len() })));
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        if !upstream::has_resources(&self.inner.tools) {
            return Err(McpError::method_not_found::<ListResourceTemplatesRequestMethod>());
        }
        let current = self.inner.tools.current();
        let observed = observe(&current, &cx, "resources/templates/list", &Json::Null);
        let principal = principal(&cx);
        let registry = self.inner.tools.current();
        let reach = upstream::Reach::new(&registry, principal.as_deref());
        let templates = upstream::templates(&self.inner.tools, &reach);
        observed.finish(Ok(json!({ "count": templates.len() })));
        Ok(ListResourceTemplatesResult::with_all_items(templates))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let current = self.inner.tools.current();
        let observed = observe(&current, &cx, "resources/read", &json!({ "uri": request.uri }));
        let principal = principal(&cx);
        let registry = self.inner.tools.current();
        let reach = upstream::Reach::new(&registry, principal.as_deref());
        let result = tokio::select! {
            result = upstream::read(&self.inner.tools, &reach, &request.uri) => result,
            _ = cx.ct.cancelled() => return Err(McpError::internal_error("cancelled", None)),
        };
        let summary = match &result {
            Ok(read) => Ok(json!({ "contents": read.contents.len() })),
            Err(e) => Err(CallError::BadRequest(e.message.to_string())),
        };
        observed.finish(summary.as_ref().cloned());
        result.map(Into::into)
    }

    /// Session-era clients (2025-11-25) get `list_changed` on their session's stream.
    async fn on_initialized(&self, cx: NotificationContext<RoleServer>) {
        let parts = cx.extensions.get::<axum::http::request::Parts>();
        let session =
            parts.and_then(|p| p.headers.get("mcp-session-id")).and_then(|v| v.to_str().ok()).map(String::from);
        self.inner.session_peers.add(session, cx.peer, &self.inner.changed);
    }

    /// Stateless-era clients (2026-07-28) subscribe with `subscriptions/listen`.
    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(requested.supported_by(&self.get_info().capabilities))
    }

    async fn listen(&self, cx: SubscriptionContext) -> Result<(), McpError> {
        let parts = cx.request_context().extensions.get::<axum::http::request::Parts>();
        let tasks = parts.and_then(|p| p.extensions.get::<tasks::ListenedTasks>()).map(|t| t.0.clone());
        let Some(tasks) = tasks else { return self.listen_lists(&cx).await };
        // Both until the client ends the subscription; the tasks' notices stop once all ended.
        let told = async {
            self.tell_listened(&cx, tasks).await;
            cx.cancelled().await;
            Ok(())
        };
        tokio::select! {
            result = self.listen_lists(&cx) => result,
            result = told => result,
        }
    }
}

impl Mcp {
    /// `list_changed` notices on a `subscriptions/listen` stream, as its filter asks.
    async fn listen_lists(&self, cx: &SubscriptionContext) -> Result<(), McpError> {
        let accepted = cx.accepted();
        let (want_tools, want_prompts, want_resources) = (
            accepted.tools_list_changed == Some(true),
            accepted.prompts_list_changed == Some(true),
            accepted.resources_list_changed == Some(true),
        );
        if !want_tools && !want_prompts && !want_resources {
            cx.cancelled().await;
            return Ok(());
        }
        let mut changed = self.inner.changed.subscribe();
        loop {
            tokio::select! {
                _ = cx.cancelled() => return Ok(()),
                received = changed.recv() => {
                    let lists = match received {
                        Ok(lists) => lists,
                        Err(broadcast::error::RecvError::Lagged(_)) => Changed { tools: true, prompts: true, resources: true },
                        Err(broadcast::error::RecvError::Closed) => return Ok(()),
                    };
                    if want_resources && lists.resources && cx.sink().notify_resource_list_changed().await.is_err() {
                        return Ok(());
                    }
                    if want_tools && lists.tools && cx.sink().notify_tool_list_changed().await.is_err() {
                        return Ok(());
                    }
                    if want_prompts && lists.prompts && cx.sink().notify_prompt_list_changed().await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}
