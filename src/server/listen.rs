//! The accept loop: a cap on open connections, a header timeout, a keep-alive idle timeout and
//! graceful shutdown. `axum::serve` has none of these limits, so clients that open connections
//! and never finish a request (slowloris) could hold every file descriptor, `/health` included.
//!
//! - Header timeout: a connection has `header_timeout` to send a request's headers, counted
//!   from connecting or from the first byte of its next request.
//! - Idle timeout: between requests, a connection may wait `idle_timeout` for the next one.
//! - Cap: at most `max_connections` open at once (lowered to fit the open-file limit). When all
//!   are taken, a new connection closes the oldest one that has no request in flight (an idle
//!   or half-sent one), so a flood of such connections cannot lock real clients out: the
//!   newest connection is the last to go. If every connection is busy, the new one waits up to
//!   [`WAIT_FOR_SLOT`], then is closed.
//!
//! A request in flight (a long tool call, an SSE stream) is never timed out or evicted here.
//! TODO(hardening): nor is a request whose body stalls after its headers; the bearer token is
//! checked before any body is read, so only a caller with the token (or any local process on a
//! token-less loopback bind) can do that.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

/// How long a new connection waits for a free slot when every open one is busy.
pub const WAIT_FOR_SLOT: Duration = Duration::from_secs(1);

/// Connection limits of the HTTP server.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// The open connections, oldest first.
#[derive(Default)]
pub struct Connections {
    table: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
}

impl Connections {
    /// Connections open now.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self) -> (u64, Arc<Conn>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new());
        self.lock().insert(id, Arc::clone(&conn));
        (id, conn)
    }

    fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Tells the oldest connection with no request in flight to close. False when all are busy.
    fn evict_oldest_idle(&self) -> bool {
        let table = self.lock();
        let Some(conn) =
            table.values().find(|c| c.in_flight.load(Ordering::Acquire) == 0 && !c.evicted.load(Ordering::Acquire))
        else {
            return false;
        };
        conn.evicted.store(true, Ordering::Release);
        conn.evict.notify_one();
        true
    }
}

/// What the watchdog of one connection knows about it.
struct Conn {
    started: Instant,
    /// Requests whose response has not been sent in full.
    in_flight: AtomicUsize,
    /// Requests started on this connection.
    requests: AtomicU64,
    /// Milliseconds after `started` at which the last response ended.
    idle_since: AtomicU64,
    /// 1 + milliseconds after `started` of the first byte of a request head still being read;
    /// 0 when none is.
    head_started: AtomicU64,
    evicted: AtomicBool,
    evict: Notify,
}

impl Conn {
    fn new() -> Conn {
        Conn {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// When this connection must close if nothing changes, and why; `None` while busy.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<(u64, &'static str)> {
        let ms = |d: Duration| d.as_millis() as u64;
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        if self.requests.load(Ordering::Acquire) == 0 {
            return Some((
                ms(limits.header_timeout),
                "no complete request headers in time (server.header_timeout_secs)",
            ));
        }
        match self.head_started.load(Ordering::Acquire) {
            0 => Some((
                self.idle_since.load(Ordering::Acquire) + ms(limits.idle_timeout),
                "idle between requests (server.idle_timeout_secs)",
            )),
            started => Some((
                started - 1 + ms(limits.header_timeout),
                "request headers not finished in time (server.header_timeout_secs)",
            )),
        }
    }

    /// Resolves when a timeout passes, with the reason.
    async fn expired(&self, limits: &ConnectionLimits) -> &'static str {
        loop {
            let now = self.now_ms();
            match self.deadline(limits) {
                Some((at, why)) if at <= now => return why,
                Some((at, _)) => tokio::time::sleep(Duration::from_millis(at - now)).await,
                // A request is running: look again later (the end of its response resets the clock).
                None => tokio::time::sleep(limits.header_timeout.min(limits.idle_timeout)).await,
            }
        }
    }

    /// A request head has been read in full: the request is in flight until its response ends.
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.requests.fetch_add(1, Ordering::AcqRel);
        self.head_started.store(0, Ordering::Release);
        InFlight(Arc::clone(self))
    }

    fn saw_bytes(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 && self.head_started.load(Ordering::Acquire) == 0 {
            self.head_started.store(self.now_ms() + 1, Ordering::Release);
        }
    }
}

/// Held by a request until its response has been sent (or dropped).
struct InFlight(Arc<Conn>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.0;
        conn.idle_since.store(conn.now_ms(), Ordering::Release);
        conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request in flight until hyper is done with it.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// The socket, telling its watchdog when bytes of a new request arrive.
struct Watched {
    tcp: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.saw_bytes();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Accepts and serves until `stopping` is cancelled, then waits for every connection to end
/// (each is told to finish its current request and close).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    connections: Arc<Connections>,
    stopping: CancellationToken,
) {
    let max = fit_to_file_limit(limits.max_connections);
    let slots = Arc::new(Semaphore::new(max));
    let mut warned: Option<Instant> = None;
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    accept_failed(&e, &mut warned).await;
                    continue;
                }
            },
            _ = stopping.cancelled() => break,
        };
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                let evicted = connections.evict_oldest_idle();
                match tokio::time::timeout(WAIT_FOR_SLOT, Arc::clone(&slots).acquire_owned()).await {
                    Ok(Ok(slot)) => slot,
                    _ => {
                        if warned.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
                            warned = Some(Instant::now());
                            tracing::warn!(
                                "all {max} connections are busy (server.max_connections; evicted an idle one: {evicted}); \
                                 closing new connections until one ends"
                            );
                        }
                        continue;
                    }
                }
            }
        };
        // Streamed replies (MCP's SSE) go out in several writes; without TCP_NODELAY, Nagle's
        // algorithm and the client's delayed ACK hold each reply back by about 40 ms.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let (id, conn) = connections.insert();
        let (router, connections, stopping) = (router.clone(), Arc::clone(&connections), stopping.clone());
        tokio::spawn(async move {
            serve_connection(tcp, router, conn, limits, stopping).await;
            connections.remove(id);
            drop(slot);
        });
    }
    drop(listener);
    // Every slot back means every connection has ended.
    let _ = slots.acquire_many(max as u32).await;
}

async fn serve_connection(
    tcp: TcpStream,
    router: Router,
    conn: Arc<Conn>,
    limits: ConnectionLimits,
    stopping: CancellationToken,
) {
    let io = TokioIo::new(Watched { tcp, conn: Arc::clone(&conn) });
    let watched = Arc::clone(&conn);
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let in_flight = watched.begin();
        // Router is always ready (axum documents it), so `call` needs no `poll_ready` first.
        let response = tower_service::Service::call(&mut router.clone(), request);
        async move {
            let response = response.await.unwrap_or_else(|never| match never {});
            Ok::<_, Infallible>(response.map(|body| Tracked { body, _in_flight: in_flight }))
        }
    });
    // No hyper timer: its header timeout would arm a timer for every request (measured: a few
    // per cent of an echo call), and the watchdog below already covers headers and idle time.
    let http = hyper::server::conn::http1::Builder::new();
    let connection = http.serve_connection(io, service);
    tokio::pin!(connection);
    // The timeouts, eviction and shutdown are watched by a task of their own, which tells the
    // connection what to do through one `Notify`: polled together with the connection, they
    // cost every request a timer and a cancellation-token poll.
    let order = Arc::new(Order::default());
    let watchdog = tokio::spawn(watch(Arc::clone(&conn), limits, stopping, Arc::clone(&order)));
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection ended: {e}");
                }
                break;
            }
            _ = order.notify.notified() => {
                if order.close.load(Ordering::Acquire) {
                    break;
                }
                connection.as_mut().graceful_shutdown();
            }
        }
    }
    watchdog.abort();
}

/// What a connection's watchdog tells it: close now, or finish the request in flight and close.
#[derive(Default)]
struct Order {
    notify: Notify,
    close: AtomicBool,
}

/// Watches one connection's timeouts, eviction and shutdown, and orders it to close or drain.
async fn watch(conn: Arc<Conn>, limits: ConnectionLimits, stopping: CancellationToken, order: Arc<Order>) {
    let close = |why: &str| {
        tracing::debug!("closing a connection: {why}");
        order.close.store(true, Ordering::Release);
        order.notify.notify_one();
    };
    tokio::select! {
        why = conn.expired(&limits) => return close(why),
        _ = conn.evict.notified() => {
            return close("making room for a new one (server.max_connections)");
        }
        _ = stopping.cancelled() => {}
    }
    // hyper's graceful shutdown waits for a request head already begun, which a half-sent
    // request would stretch to the header timeout: with nothing in flight, close at once.
    if conn.in_flight.load(Ordering::Acquire) == 0 {
        return close("the server is stopping");
    }
    order.notify.notify_one();
    // Still on while draining: a half-sent request must not hold shutdown up.
    let why = conn.expired(&limits).await;
    close(why);
}

/// Accept errors are about one connection (reset before accept) or about the process (out of
/// file descriptors). Neither stops the server; the second gets a pause, so the loop does not
/// spin, and a warning at most every 10 s.
async fn accept_failed(e: &std::io::Error, warned: &mut Option<Instant>) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        return;
    }
    if warned.is_none_or(|at| at.elapsed() > Duration::from_secs(10)) {
        *warned = Some(Instant::now());
        tracing::warn!("cannot accept connections: {e}; lower server.max_connections or raise the open-file limit");
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// The connection cap, lowered to leave a quarter of the open-file limit (at least 64) for the
/// knowledge base, scripts' HTTP calls and the rest: connections past the limit would fail to
/// accept, and `/health` with them.
fn fit_to_file_limit(configured: usize) -> usize {
    let Some(limit) = open_file_limit() else { return configured.max(1) };
    let room = limit.saturating_sub((limit / 4).max(64)).max(1);
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    if configured > room {
        tracing::warn!(
            "server.max_connections = {configured} does not fit under the open-file limit ({limit}); using {room}. \
             Raise the limit (ulimit -n) to allow more"
        );
        return room;
    }
    configured.max(1)
}

/// The soft limit on open files, where the system says (Linux).
fn open_file_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_limit_is_read() {
        if cfg!(target_os = "linux") {
            assert!(open_file_limit().is_some_and(|n| n > 0));
        }
    }

    #[test]
    fn deadlines_follow_the_connection() {
        let limits = ConnectionLimits {
            max_connections: 1,
            header_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(7),
        };
        let conn = Arc::new(Conn::new());
        assert_eq!(conn.deadline(&limits).map(|d| d.0), Some(2000), "a new connection gets the header timeout");
        let request = conn.begin();
        assert_eq!(conn.deadline(&limits), None, "a request in flight never times out");
        conn.saw_bytes();
        assert_eq!(conn.head_started.load(Ordering::Acquire), 0, "body bytes are not a new head");
        drop(request);
        let idle = conn.idle_since.load(Ordering::Acquire);
        assert_eq!(conn.deadline(&limits).map(|d| d.0), Some(idle + 7000), "between requests: the idle timeout");
        conn.saw_bytes();
        let head = conn.head_started.load(Ordering::Acquire) - 1;
        assert_eq!(conn.deadline(&limits).map(|d| d.0), Some(head + 2000), "a head under way: the header timeout");
    }
}
