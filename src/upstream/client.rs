//! ctx's MCP client side of one upstream connection: the handler that receives the upstream's
//! notifications (progress, `list_changed`), connecting over stdio or Streamable HTTP, and one
//! request with a deadline, progress routing and `notifications/cancelled` when abandoned.
//! What the upstream sends unasked is bounded (see [`flood`]).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CancelledNotification, CancelledNotificationParam, ClientCapabilities, ClientNotification, ClientRequest,
    Implementation, InitializeRequestParams, JsonRpcMessage, ProgressNotificationParam, ProgressToken, RequestId,
    ServerNotification,
};
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RoleClient, RunningServiceCancellationToken, RxJsonRpcMessage,
    TxJsonRpcMessage,
};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::{ClientHandler, ServiceError, ServiceExt};
use serde_json::{Map, Value as Json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::flood::{self, ByteCount, CallMeter, ServerMeter, Verdict};
use super::process::{self, Child};
use crate::config::upstream::{UpstreamSection, UpstreamTransport};
use crate::contract::{Progress, ProgressSink};

/// Which lists an upstream said changed (bits), and a wake-up for the supervisor.
#[derive(Default)]
pub struct Changes {
    bits: AtomicU8,
    pub notify: Notify,
}

pub const TOOLS: u8 = 1;
pub const RESOURCES: u8 = 2;
pub const PROMPTS: u8 = 4;

impl Changes {
    fn mark(&self, bit: u8) {
        self.bits.fetch_or(bit, Ordering::SeqCst);
        self.notify.notify_one();
    }

    /// The lists marked since the last call.
    pub fn take(&self) -> u8 {
        self.bits.swap(0, Ordering::SeqCst)
    }
}

/// Routes the upstream's progress notifications to the caller of the request that carries
/// the token.
#[derive(Default)]
pub struct ProgressRouter {
    inner: Mutex<Routes>,
}

#[derive(Default)]
struct Routes {
    /// Each call's sink, and its progress so far against [`flood::Limits::per_call`].
    sinks: HashMap<ProgressToken, (ProgressSink, CallMeter)>,
    /// Notifications that arrived before their request's sink was registered (rmcp picks the
    /// token while sending, and handles notifications on their own tasks).
    early: VecDeque<(Instant, ProgressNotificationParam)>,
}

const EARLY_KEEP: Duration = Duration::from_secs(5);
const EARLY_MAX: usize = 64;

impl ProgressRouter {
    fn register(&self, token: ProgressToken, sink: ProgressSink) {
        let early: Vec<ProgressNotificationParam> = {
            let mut routes = self.lock();
            routes.sinks.insert(token.clone(), (sink.clone(), CallMeter::new(Instant::now())));
            let (mine, rest) = routes.early.drain(..).partition(|(_, p)| p.progress_token == token);
            routes.early = rest;
            mine.into_iter().map(|(_, p)| p).collect::<Vec<_>>()
        };
        for p in early {
            sink(progress(p));
        }
    }

    /// Stops routing `token`'s progress; returns how many of its notifications were dropped
    /// over the per-call rate.
    fn unregister(&self, token: &ProgressToken) -> u64 {
        self.lock().sinks.remove(token).map_or(0, |(_, meter)| meter.dropped)
    }

    fn deliver(&self, p: ProgressNotificationParam) {
        let sink = {
            let mut routes = self.lock();
            match routes.sinks.get_mut(&p.progress_token) {
                Some((sink, meter)) => {
                    // Past the call's rate the rest of the second's progress is dropped: the
                    // caller still learns how far it got from the next second's.
                    if !meter.admit(Instant::now(), &flood::LIMITS) {
                        return;
                    }
                    sink.clone()
                }
                None => {
                    let now = Instant::now();
                    routes.early.retain(|(at, _)| now.duration_since(*at) < EARLY_KEEP);
                    if routes.early.len() >= EARLY_MAX {
                        routes.early.pop_front();
                    }
                    routes.early.push_back((now, p));
                    return;
                }
            }
        };
        sink(progress(p));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn progress(p: ProgressNotificationParam) -> Progress {
    Progress { done: p.progress, total: p.total, message: p.message }
}

/// ctx's client handler for one connection (progress is routed by [`Tap`], not here).
pub struct Handler {
    changes: Arc<Changes>,
}

/// The transport, with the upstream's progress notifications routed as they are read, and
/// what it sends unasked metered.
///
/// rmcp hands notifications to the handler on tasks of their own, so a progress notification
/// sent just before the result could reach the handler after the caller got the result and
/// stopped listening. Routed here, in the order of the stream, none is lost.
///
/// Metered here, a message over the server's rate is dropped before rmcp turns it into a task
/// and logs it, and a server that floods is cut off: the stream ends (ctx stops reading, so
/// the flood costs nothing more), with the reason in `cut` for the supervisor.
struct Tap<T> {
    inner: T,
    progress: Arc<ProgressRouter>,
    /// A dropped `list_changed` still marks its list here: it only says "relist", and the last
    /// one of a burst may be a real change.
    changes: Arc<Changes>,
    meter: ServerMeter,
    cut: Cut,
    /// Cut off: the stream stays ended.
    ended: bool,
    /// Over Streamable HTTP, an error that answers no request means the server refused the
    /// session itself (a restarted server answers 400 or 404 to every request of the old one).
    http: bool,
}

/// Why ctx ended a connection, once it did, and the signal that ends it: a flood, a failed
/// send, a server that no longer knows ctx's session, or a failed event stream (`http`).
#[derive(Clone, Default)]
pub struct Cut {
    why: Arc<Mutex<Option<String>>>,
    gone: CancellationToken,
}

impl Cut {
    /// Ends the connection; the first reason is the one kept.
    pub fn set(&self, why: String) {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(why);
        self.gone.cancel();
    }

    /// Why the connection was ended, if ctx ended it.
    pub fn reason(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl<T> Tap<T> {
    fn new(
        inner: T,
        server: &str,
        progress: Arc<ProgressRouter>,
        changes: &Arc<Changes>,
        cut: &Cut,
        http: bool,
    ) -> Tap<T> {
        Tap {
            inner,
            progress,
            changes: Arc::clone(changes),
            meter: ServerMeter::new(server, flood::LIMITS, Instant::now()),
            cut: cut.clone(),
            ended: false,
            http,
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Tap<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        // A message that cannot be sent because the server is unreachable or the pipe broke ends
        // the connection: rmcp would keep it and every later call would wait its timeout. A
        // server's error answer to one request fails that request only.
        let sent = self.inner.send(item);
        let cut = self.cut.clone();
        async move {
            let result = sent.await;
            if let Err(e) = &result {
                if super::http::connection_lost(e) {
                    cut.set(format!("sending to the upstream failed: {}", super::http::describe(e)));
                }
            }
            result
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        let Tap { inner, progress, changes, meter, cut, ended, http } = self;
        async move {
            if *ended {
                return None;
            }
            loop {
                let message = tokio::select! {
                    message = inner.receive() => message?,
                    () = cut.gone.cancelled() => {
                        *ended = true;
                        return None;
                    }
                };
                if let JsonRpcMessage::Error(e) = &message {
                    // Only a refusal of the session itself: a server also answers a body it
                    // cannot parse (one caller's oversized arguments) without an id.
                    if *http && e.id.is_none() && e.error.message.to_ascii_lowercase().contains("session") {
                        cut.set(format!("the upstream refused ctx's session: {}", e.error.message));
                        *ended = true;
                        return None;
                    }
                }
                // Answers to ctx's own requests are never dropped; everything else is unasked.
                if matches!(message, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_)) {
                    return Some(message);
                }
                let size = || {
                    let mut count = ByteCount::default();
                    let _ = serde_json::to_writer(&mut count, &message);
                    count.0
                };
                match meter.admit(Instant::now(), size) {
                    Verdict::Pass => {}
                    Verdict::Drop => {
                        if let JsonRpcMessage::Notification(n) = &message {
                            if let Some(bit) = list_bit(&n.notification) {
                                changes.mark(bit);
                            }
                        }
                        continue;
                    }
                    Verdict::CutOff(why) => {
                        cut.set(why);
                        *ended = true;
                        return None;
                    }
                }
                if let JsonRpcMessage::Notification(n) = &message {
                    if let ServerNotification::ProgressNotification(p) = &n.notification {
                        progress.deliver(p.params.clone());
                    }
                }
                return Some(message);
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// An error with its causes (`error sending request: client error (Connect): Connection
/// refused`): the outermost message alone rarely says what happened.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// The list a `list_changed` notification is about.
fn list_bit(notification: &ServerNotification) -> Option<u8> {
    match notification {
        ServerNotification::ToolListChangedNotification(_) => Some(TOOLS),
        ServerNotification::ResourceListChangedNotification(_) => Some(RESOURCES),
        ServerNotification::PromptListChangedNotification(_) => Some(PROMPTS),
        _ => None,
    }
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.changes.mark(TOOLS);
    }

    async fn on_resource_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.changes.mark(RESOURCES);
    }

    async fn on_prompt_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.changes.mark(PROMPTS);
    }

    fn get_info(&self) -> InitializeRequestParams {
        InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("ctx", env!("CARGO_PKG_VERSION")),
        )
    }
}

type Done = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One live connection to an upstream.
pub struct Connection {
    pub peer: Peer<RoleClient>,
    cancel: Option<RunningServiceCancellationToken>,
    /// Resolves when rmcp's service loop has ended (EOF, error, cancel, or ctx cut it off).
    done: Option<Done>,
    pub child: Option<Child>,
    /// Also kept by the server's shared state: a call the cut ended says why.
    pub cut: Cut,
}

impl Connection {
    /// Resolves when the connection is gone; says why. Cancel-safe.
    pub async fn closed(&mut self) -> String {
        let service = async {
            match self.done.as_mut() {
                Some(done) => done.await,
                None => std::future::pending().await,
            }
        };
        let child = async {
            match self.child.as_mut() {
                Some(child) => child.exited().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = service => {
                self.done = None;
                if let Some(why) = self.cut.reason() {
                    return why;
                }
                // The process usually exits with its stdout: give its status a moment to show.
                match self.child.as_mut() {
                    Some(child) => match tokio::time::timeout(Duration::from_millis(200), child.exited()).await {
                        Ok(status) => exit_message(child, status),
                        Err(_) => "the upstream closed the connection".to_string(),
                    },
                    None => "the upstream closed the connection".to_string(),
                }
            }
            status = child => {
                let child = self.child.as_ref().expect("child");
                exit_message(child, status)
            }
        }
    }

    /// Closes the connection (stdin EOF for a child) and stops the process.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(cancel) = self.cancel.take() {
            cancel.cancel();
        }
        if let Some(done) = self.done.take() {
            // rmcp drains in-flight responses for up to 2 s before it closes the transport.
            let _ = tokio::time::timeout(grace + Duration::from_secs(1), done).await;
        }
        if let Some(mut child) = self.child.take() {
            let status = child.stop(grace).await;
            tracing::debug!(group = child.group(), "upstream process stopped: {}", process::describe(status));
        }
    }
}

fn exit_message(child: &Child, status: std::process::ExitStatus) -> String {
    let mut msg = format!("the process exited with {}", process::describe(status));
    if let Some(line) = child.tail.lock().unwrap_or_else(|p| p.into_inner()).as_deref() {
        msg.push_str("; its last stderr line: ");
        msg.push_str(line);
    }
    msg
}

/// Connects to `section`'s server and runs the initialize handshake within `limit`.
pub async fn connect(
    section: &UpstreamSection,
    guard: Option<&std::path::Path>,
    limit: Duration,
    grace: Duration,
    progress: Arc<ProgressRouter>,
    executions: Arc<super::sniff::Executions>,
    changes: Arc<Changes>,
) -> Result<Connection, String> {
    let handler = Handler { changes: Arc::clone(&changes) };
    let cut = Cut::default();
    match &section.transport {
        UpstreamTransport::Stdio { command, args, env, cwd } => {
            let spec = process::Spec { server: &section.name, command, args, env, cwd: cwd.as_deref(), guard };
            let (mut child, stdout, stdin) =
                process::spawn(&spec).map_err(|e| format!("cannot start `{command}`: {e}"))?;
            let handshake = tokio::time::timeout(
                limit,
                handler.serve(Tap::new(
                    // Bounded by `frame` (which answers an oversized answer's request at once);
                    // rmcp's own limit is one past it, so rmcp never drops a line silently.
                    AsyncRwTransport::new_client(
                        super::frame::Bounded::new(stdout, &section.name).reading_executions(executions),
                        stdin,
                    )
                    .with_max_line_length(super::frame::MAX_MESSAGE + 1),
                    &section.name,
                    progress,
                    &changes,
                    &cut,
                    false,
                )),
            );
            let result = tokio::select! {
                r = handshake => r,
                status = child.exited() => {
                    let msg = format!("{} before it answered initialize", exit_message(&child, status));
                    child.stop(grace).await;
                    return Err(msg);
                }
            };
            match result {
                Ok(Ok(running)) => Ok(connection(running, Some(child), cut)),
                Ok(Err(e)) => {
                    let msg = match tokio::time::timeout(Duration::from_millis(200), child.exited()).await {
                        Ok(status) => format!("{} before it answered initialize", exit_message(&child, status)),
                        Err(_) => cut.reason().unwrap_or_else(|| format!("initialize failed: {e}")),
                    };
                    child.stop(grace).await;
                    Err(msg)
                }
                Err(_) => {
                    child.stop(grace).await;
                    Err(format!("no answer to initialize within {} s", limit.as_secs_f64()))
                }
            }
        }
        UpstreamTransport::Http { url, headers } => {
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            use rmcp::transport::StreamableHttpClientTransport;
            let mut map = HashMap::new();
            for (name, value) in headers {
                let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("header name `{name}` is not valid"))?;
                let value = reqwest::header::HeaderValue::from_str(value)
                    .map_err(|_| format!("the value of header `{name}` is not valid"))?;
                map.insert(name, value);
            }
            // A lost session ends the connection (see `http`), so that the supervisor
            // reconnects and relists: rmcp's own quiet re-initialization would keep a tool list
            // from before the server restarted.
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(map)
                .reinit_on_expired_session(false);
            let transport = Tap::new(
                StreamableHttpClientTransport::with_client(super::http::Watched::new(&cut, &executions), config),
                &section.name,
                progress,
                &changes,
                &cut,
                true,
            );
            match tokio::time::timeout(limit, handler.serve(transport)).await {
                Ok(Ok(running)) => Ok(connection(running, None, cut)),
                Ok(Err(e)) => Err(cut.reason().unwrap_or_else(|| format!("initialize failed: {e}"))),
                Err(_) => Err(format!("no answer to initialize within {} s", limit.as_secs_f64())),
            }
        }
    }
}

fn connection(
    running: rmcp::service::RunningService<RoleClient, Handler>,
    child: Option<Child>,
    cut: Cut,
) -> Connection {
    let peer = running.peer().clone();
    let cancel = running.cancellation_token();
    let done: Done = Box::pin(async move {
        let _ = running.waiting().await;
    });
    Connection { peer, cancel: Some(cancel), done: Some(done), child, cut }
}

/// Why one request failed (the caller adds the server's name).
#[derive(Debug)]
pub enum Failure {
    Timeout,
    Rpc { code: i32, message: String, data: Option<Json> },
    Disconnected(String),
}

/// Sends `request` over the shared connection and waits up to `limit` for its result (as
/// JSON). Progress notifications for it go to `progress`. When the wait ends without a result
/// (deadline, or the caller dropped this future) the upstream gets `notifications/cancelled`.
pub async fn request(
    peer: &Peer<RoleClient>,
    request: ClientRequest,
    limit: Duration,
    progress: Option<(&Arc<ProgressRouter>, ProgressSink)>,
) -> Result<Map<String, Json>, Failure> {
    request_routed(peer, request, limit, progress).await.map(|(result, _)| result)
}

/// [`request`], and the route of its progress, still open: an upstream task goes on reporting
/// progress with the token of the `tools/call` that created it (MCP 2025-11-25), after that
/// call answered. Progress stops being routed when the returned [`Route`] is dropped.
pub async fn request_routed(
    peer: &Peer<RoleClient>,
    request: ClientRequest,
    limit: Duration,
    progress: Option<(&Arc<ProgressRouter>, ProgressSink)>,
) -> Result<(Map<String, Json>, Option<Route>), Failure> {
    let handle = peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await
        .map_err(|e| Failure::Disconnected(e.to_string()))?;
    let mut guard = Abandon {
        peer: peer.clone(),
        id: Some(handle.id.clone()),
        reason: "abandoned by ctx's caller",
        route: progress
            .as_ref()
            .map(|(router, _)| Route { router: Arc::clone(router), token: handle.progress_token.clone() }),
    };
    if let Some((router, sink)) = progress {
        router.register(handle.progress_token.clone(), sink);
    }
    let answer = match tokio::time::timeout(limit, handle.rx).await {
        Err(_) => {
            guard.reason = "request timeout"; // the guard sends the cancellation
            return Err(Failure::Timeout);
        }
        Ok(answer) => answer,
    };
    guard.id = None;
    let route = guard.route.take();
    match answer {
        Ok(Ok(result)) => match serde_json::to_value(&result) {
            Ok(Json::Object(map)) => Ok((map, route)),
            Ok(other) => Err(Failure::Disconnected(format!("the upstream answered with a non-object result: {other}"))),
            Err(e) => Err(Failure::Disconnected(format!("the upstream's result does not serialize: {e}"))),
        },
        Ok(Err(ServiceError::McpError(e))) => {
            Err(Failure::Rpc { code: e.code.0, message: e.message.to_string(), data: e.data })
        }
        Ok(Err(e)) => Err(Failure::Disconnected(e.to_string())),
        Err(_) => Err(Failure::Disconnected("the connection closed".to_string())),
    }
}

/// One request's progress route: while it lives, the upstream's progress notifications with
/// its token reach the request's sink.
pub struct Route {
    router: Arc<ProgressRouter>,
    token: ProgressToken,
}

impl Drop for Route {
    fn drop(&mut self) {
        let dropped = self.router.unregister(&self.token);
        if dropped > 0 {
            tracing::debug!(
                "{dropped} progress notifications of one upstream call dropped (over {} a second)",
                flood::LIMITS.per_call
            );
        }
    }
}

/// Sends `notifications/cancelled` for a request nobody waits for any more (rmcp 3.9 does
/// this only in its typed helpers, not for `send_request_with_option`), and unroutes its
/// progress (unless the caller took the route).
struct Abandon {
    peer: Peer<RoleClient>,
    id: Option<RequestId>,
    reason: &'static str,
    route: Option<Route>,
}

impl Drop for Abandon {
    fn drop(&mut self) {
        drop(self.route.take());
        let Some(id) = self.id.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (peer, reason) = (self.peer.clone(), self.reason);
        runtime.spawn(async move {
            let param = CancelledNotificationParam::new(Some(id), Some(reason.to_string()));
            let note = ClientNotification::CancelledNotification(CancelledNotification::new(param));
            let _ = peer.send_notification(note).await;
        });
    }
}
