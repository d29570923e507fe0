//! The accept loop: a cap on open connections and shares of it per caller, header, body and
//! idle timeouts, and graceful shutdown. `axum::serve` has none of these limits, so clients that
//! open connections and never finish a request (slowloris) could hold every file descriptor,
//! `/health` included.
//!
//! - Header timeout: a connection has `header_timeout` to send a request's headers, counted
//!   from connecting or from the first byte of its next request.
//! - Body timeout: once a handler starts reading a request's body, the body must end within
//!   `body_timeout` and, after [`BODY_RATE_GRACE`], arrive at `body_min_rate` bytes a second on
//!   average. A late body is answered 408 (the handler is dropped) and the connection closed.
//!   The clock starts at the server's first read of the body, not at the headers, so a client
//!   is not blamed for time the server spent before it asked.
//! - Idle timeout: between requests, a connection may wait `idle_timeout` for the next one.
//! - Cap: at most `max_connections` open at once (lowered to fit the open-file limit). When all
//!   are taken, a new connection closes the oldest one that has no request in flight (an idle
//!   or half-sent one), so a flood of such connections cannot lock real clients out: the
//!   newest connection is the last to go. If every connection is busy, the new one waits up to
//!   [`WAIT_FOR_SLOT`], then is closed.
//! - Shares: a busy connection cannot be evicted, so no one caller may hold them all. A request
//!   with a scoped token (`[[server.tokens]]`) counts against its token until its response
//!   ends: at most `per_token` at once, and all scoped tokens together at most the cap less an
//!   eighth, which stays for `/health`, the unscoped token and new connections. Over either,
//!   the request is answered 429 and its connection closed. Until a connection sends a request
//!   with a valid token it counts against its address: over `per_address`, a new connection
//!   from that address closes the address's own oldest idle one, never another client's, and
//!   if all of them are busy the newcomer's first request is answered 429. The unscoped token
//!   (and every client of a server without tokens) has no share: it can call every tool, so a
//!   share would not contain it, and it is often shared by all clients, whom a share would only
//!   squeeze.
//!
//! A request in flight whose body has arrived (a long tool call, an SSE stream) is never timed
//! out or evicted here; the shares bound how many of those one caller holds.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::respond::ApiError;
use crate::tools::Principal;
use crate::types::ErrorCode;

/// How long a new connection waits for a free slot when every open one is busy.
pub const WAIT_FOR_SLOT: Duration = Duration::from_secs(1);

/// How long a body is read before its minimum rate applies: the first bytes may wait on a slow
/// start (TCP's, a proxy's, a `100-continue` round trip).
pub const BODY_RATE_GRACE: Duration = Duration::from_secs(5);

/// After answering 408, how long the connection may take to send that answer before it is
/// closed anyway.
const LATE_BODY_CLOSE: Duration = Duration::from_secs(1);

/// Connection limits of the HTTP server.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// Longest a request body may take, from the server's first read to its last byte.
    pub body_timeout: Duration,
    /// Least average rate of a body in bytes a second, after [`BODY_RATE_GRACE`]; 0: no check.
    pub body_min_rate: u64,
    /// Requests one scoped token may have in flight; `None`: half of the cap.
    pub per_token: Option<usize>,
    /// Connections one address may hold before authenticating; `None`: half of the cap.
    pub per_address: Option<usize>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 512,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            body_min_rate: 4096,
            per_token: None,
            per_address: None,
        }
    }
}

impl ConnectionLimits {
    /// The longest a connection's watchdog sleeps. Never longer than the shortest body limit,
    /// so a body that starts while it sleeps is seen before its deadline.
    fn busy_poll(&self) -> Duration {
        let mut every = self.header_timeout.min(self.idle_timeout).min(self.body_timeout);
        if self.body_min_rate > 0 {
            every = every.min(BODY_RATE_GRACE);
        }
        every
    }
}

/// The shares of one running server, fitted to its actual cap.
#[derive(Clone, Copy, Debug)]
struct Shares {
    /// The cap, after [`fit_to_file_limit`].
    max: usize,
    per_token: usize,
    /// All scoped tokens together.
    scoped: usize,
    per_address: usize,
}

impl Shares {
    fn new(limits: &ConnectionLimits, max: usize) -> Shares {
        let half = (max / 2).max(1);
        Shares {
            max,
            per_token: limits.per_token.unwrap_or(half).clamp(1, max),
            scoped: (max - max / 8).max(1),
            per_address: limits.per_address.unwrap_or(half).clamp(1, max),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The open connections, oldest first, and what each caller holds of them.
#[derive(Default)]
pub struct Connections {
    table: Mutex<Table>,
    next_id: AtomicU64,
    callers: Arc<Mutex<Callers>>,
}

#[derive(Default)]
struct Table {
    open: BTreeMap<u64, Entry>,
    /// Per address, its connections that have not authenticated (and are not being evicted).
    unauthenticated: HashMap<IpAddr, usize>,
}

struct Entry {
    conn: Arc<Conn>,
    /// Counted in `unauthenticated`.
    counted: bool,
}

impl Table {
    fn uncount(unauthenticated: &mut HashMap<IpAddr, usize>, entry: &mut Entry) {
        if !std::mem::take(&mut entry.counted) {
            return;
        }
        if let Some(n) = unauthenticated.get_mut(&entry.conn.ip) {
            *n -= 1;
            if *n == 0 {
                unauthenticated.remove(&entry.conn.ip);
            }
        }
    }
}

/// Requests in flight per scoped token.
#[derive(Default)]
struct Callers {
    busy: HashMap<String, usize>,
    /// All scoped tokens together.
    scoped: usize,
}

/// Whether a new connection's address had room for it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Admission {
    Fits,
    /// Over the share: the address's own oldest idle connection is closing to make room.
    MadeRoom,
    /// Over the share with every connection of the address busy: the newcomer's first request
    /// without a token is refused.
    Refused,
}

impl Connections {
    /// Connections open now.
    pub fn count(&self) -> usize {
        lock(&self.table).open.len()
    }

    /// Makes room for a new connection from `ip` among that address's own connections.
    fn admit(&self, ip: IpAddr, share: usize) -> Admission {
        let mut table = lock(&self.table);
        if table.unauthenticated.get(&ip).copied().unwrap_or(0) < share {
            return Admission::Fits;
        }
        let Table { open, unauthenticated } = &mut *table;
        let mut own = open.values_mut().filter(|e| e.counted && e.conn.ip == ip);
        let idle = own.find(|e| e.conn.evictable());
        let made_room = idle.is_some();
        if let Some(entry) = idle {
            entry.conn.evict();
            Table::uncount(unauthenticated, entry);
        }
        let busy = open.values().filter(|e| e.counted && e.conn.ip == ip && !e.conn.evictable()).count();
        match (busy >= share, made_room) {
            (true, _) => Admission::Refused,
            (false, true) => Admission::MadeRoom,
            (false, false) => Admission::Fits,
        }
    }

    fn insert(&self, ip: IpAddr, refused: bool) -> (u64, Arc<Conn>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(ip, refused));
        let mut table = lock(&self.table);
        *table.unauthenticated.entry(ip).or_default() += 1;
        table.open.insert(id, Entry { conn: Arc::clone(&conn), counted: true });
        (id, conn)
    }

    fn remove(&self, id: u64) {
        let mut table = lock(&self.table);
        let Table { open, unauthenticated } = &mut *table;
        if let Some(mut entry) = open.remove(&id) {
            Table::uncount(unauthenticated, &mut entry);
        }
    }

    /// The connection sent a request with a valid token: it no longer counts against its address.
    fn authenticated(&self, id: u64) {
        let mut table = lock(&self.table);
        let Table { open, unauthenticated } = &mut *table;
        if let Some(entry) = open.get_mut(&id) {
            Table::uncount(unauthenticated, entry);
        }
    }

    /// Tells the oldest connection with no request in flight to close. False when all are busy.
    fn evict_oldest_idle(&self) -> bool {
        let mut table = lock(&self.table);
        let Table { open, unauthenticated } = &mut *table;
        let Some(entry) = open.values_mut().find(|e| e.conn.evictable()) else {
            return false;
        };
        entry.conn.evict();
        Table::uncount(unauthenticated, entry);
        true
    }
}

/// What the request guard needs of the connection a request came on: whom to count it against.
/// In the request's extensions when the request came through [`serve`].
#[derive(Clone)]
pub struct ConnectionHandle {
    id: u64,
    conn: Arc<Conn>,
    connections: Arc<Connections>,
    shares: Shares,
}

/// Why a request was refused its place.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "token {name:?} already has {held} requests in flight, its share of the server's connections \
         (server.max_connections_per_token = {share}); this connection is closed. Retry when one of them ends, \
         or raise server.max_connections_per_token"
    )]
    Token { name: String, held: usize, share: usize },
    #[error(
        "the scoped tokens together already have {held} requests in flight, all they may hold: the last eighth of \
         server.max_connections ({max}) is kept for the auth_token, /health and new connections; this connection \
         is closed. Retry when one of them ends, or raise server.max_connections"
    )]
    Scoped { held: usize, max: usize },
    #[error(
        "{ip} already has {share} connections busy that have not sent a request with a valid token, its share \
         (server.max_connections_per_address = {share}); this connection is closed. Send requests on the open \
         connections, close some, or raise server.max_connections_per_address"
    )]
    Address { ip: IpAddr, share: usize },
}

impl ConnectionHandle {
    /// A request with a valid token (or on a server without tokens): the connection stops
    /// counting against its address, and a scoped token's request counts against the token
    /// until its response ends. `None`: the unscoped caller, which has no share.
    pub fn claim(&self, principal: Option<&Arc<Principal>>) -> Result<(), Refusal> {
        if !self.conn.authenticated.swap(true, Ordering::AcqRel) {
            self.connections.authenticated(self.id);
        }
        let Some(principal) = principal else { return Ok(()) };
        let name = principal.name();
        let mut callers = lock(&self.connections.callers);
        let held = callers.busy.get(name).copied().unwrap_or(0);
        if held >= self.shares.per_token {
            return Err(Refusal::Token { name: name.to_string(), held, share: self.shares.per_token });
        }
        if callers.scoped >= self.shares.scoped {
            return Err(Refusal::Scoped { held: callers.scoped, max: self.shares.max });
        }
        match callers.busy.get_mut(name) {
            Some(n) => *n += 1,
            None => {
                callers.busy.insert(name.to_string(), 1);
            }
        }
        callers.scoped += 1;
        drop(callers);
        let claim = Claim { principal: Arc::clone(principal), callers: Arc::clone(&self.connections.callers) };
        // A claim left from before (none in HTTP/1, one request at a time) is released here.
        let _previous = lock(&self.conn.claim).replace(claim);
        Ok(())
    }

    /// A request without a valid token (an open route): refused on a connection its address
    /// had no room for.
    pub fn anonymous(&self) -> Result<(), Refusal> {
        if self.conn.refused {
            return Err(Refusal::Address { ip: self.conn.ip, share: self.shares.per_address });
        }
        Ok(())
    }
}

/// A scoped token's request in flight; dropping it gives the place back.
struct Claim {
    principal: Arc<Principal>,
    callers: Arc<Mutex<Callers>>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut callers = lock(&self.callers);
        if let Some(n) = callers.busy.get_mut(self.principal.name()) {
            *n = n.saturating_sub(1);
        }
        callers.scoped = callers.scoped.saturating_sub(1);
    }
}

/// Which body limit a request missed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum LateBody {
    /// Not finished within `body_timeout`.
    TooLong,
    /// Under `body_min_rate` after the grace.
    TooSlow,
}

/// What a connection's watchdog must do when a deadline passes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expiry {
    Close(&'static str),
    Late(LateBody),
}

/// What the watchdog of one connection knows about it.
struct Conn {
    started: Instant,
    /// The client's address.
    ip: IpAddr,
    /// Admitted over its address's share: a request without a token is refused.
    refused: bool,
    /// Has sent a request with a valid token.
    authenticated: AtomicBool,
    /// Requests whose response has not been sent in full.
    in_flight: AtomicUsize,
    /// Requests started on this connection; the number of the current one.
    requests: AtomicU64,
    /// Milliseconds after `started` at which the last response ended.
    idle_since: AtomicU64,
    /// 1 + milliseconds after `started` of the first byte of a request head still being read;
    /// 0 when none is.
    head_started: AtomicU64,
    /// 1 + milliseconds after `started` at which the server began reading the current request's
    /// body, while that body is unfinished; 0 when none is being read.
    body_since: AtomicU64,
    /// Bytes of that body received so far.
    body_bytes: AtomicU64,
    /// Set by the watchdog: the request (by number) whose body is late, and which limit it missed.
    late: Mutex<Option<(u64, LateBody)>>,
    /// Wakes the request whose body is late.
    late_notify: Notify,
    /// The scoped token the request in flight counts against.
    claim: Mutex<Option<Claim>>,
    evicted: AtomicBool,
    evict: Notify,
}

impl Conn {
    fn new(ip: IpAddr, refused: bool) -> Conn {
        Conn {
            started: Instant::now(),
            ip,
            refused,
            authenticated: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            head_started: AtomicU64::new(0),
            body_since: AtomicU64::new(0),
            body_bytes: AtomicU64::new(0),
            late: Mutex::new(None),
            late_notify: Notify::new(),
            claim: Mutex::new(None),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// No request in flight and not already told to close.
    fn evictable(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0 && !self.evicted.load(Ordering::Acquire)
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.evict.notify_one();
    }

    /// When this connection's deadline passes if nothing changes, and what then; `None` while a
    /// request runs with its body in (or none to read).
    fn deadline(&self, limits: &ConnectionLimits) -> Option<(u64, Expiry)> {
        let ms = |d: Duration| d.as_millis() as u64;
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return self.body_deadline(limits);
        }
        if self.requests.load(Ordering::Acquire) == 0 {
            return Some((
                ms(limits.header_timeout),
                Expiry::Close("no complete request headers in time (server.header_timeout_secs)"),
            ));
        }
        match self.head_started.load(Ordering::Acquire) {
            0 => Some((
                self.idle_since.load(Ordering::Acquire) + ms(limits.idle_timeout),
                Expiry::Close("idle between requests (server.idle_timeout_secs)"),
            )),
            started => Some((
                started - 1 + ms(limits.header_timeout),
                Expiry::Close("request headers not finished in time (server.header_timeout_secs)"),
            )),
        }
    }

    /// The deadline of a body being read: the earlier of the body timeout and the moment its
    /// average rate falls under the minimum (each byte buys `1 / body_min_rate` s past the grace).
    fn body_deadline(&self, limits: &ConnectionLimits) -> Option<(u64, Expiry)> {
        let ms = |d: Duration| d.as_millis() as u64;
        let since = self.body_since.load(Ordering::Acquire);
        if since == 0 {
            return None;
        }
        let start = since - 1;
        let whole = start + ms(limits.body_timeout);
        // Rate 0: no rate check.
        if let Some(earned) =
            self.body_bytes.load(Ordering::Acquire).saturating_mul(1000).checked_div(limits.body_min_rate)
        {
            let rate = (start + ms(BODY_RATE_GRACE)).saturating_add(earned);
            if rate < whole {
                return Some((rate, Expiry::Late(LateBody::TooSlow)));
            }
        }
        Some((whole, Expiry::Late(LateBody::TooLong)))
    }

    /// Resolves when a deadline passes, with what to do.
    async fn expired(&self, limits: &ConnectionLimits) -> Expiry {
        loop {
            let now = self.now_ms();
            match self.deadline(limits) {
                Some((at, expiry)) if at <= now => return expiry,
                // A request may begin, and read a body, while this sleeps: never sleep past
                // the first moment a body's deadline could fall.
                Some((at, _)) => tokio::time::sleep(Duration::from_millis(at - now).min(limits.busy_poll())).await,
                // A request is running: look again later (the end of its response resets the
                // clock, and a body it starts to read gets a deadline).
                None => tokio::time::sleep(limits.busy_poll()).await,
            }
        }
    }

    /// A request head has been read in full: the request is in flight until its response ends.
    fn begin(self: &Arc<Self>) -> InFlight {
        self.body_since.store(0, Ordering::Release);
        self.body_bytes.store(0, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let number = self.requests.fetch_add(1, Ordering::AcqRel) + 1;
        self.head_started.store(0, Ordering::Release);
        InFlight { conn: Arc::clone(self), number }
    }

    fn saw_bytes(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0 && self.head_started.load(Ordering::Acquire) == 0 {
            self.head_started.store(self.now_ms() + 1, Ordering::Release);
        }
    }

    /// The server began reading request `number`'s body.
    fn body_started(&self, number: u64) {
        if self.requests.load(Ordering::Acquire) == number {
            self.body_since.store(self.now_ms() + 1, Ordering::Release);
        }
    }

    /// Request `number`'s body ended, or the server stopped reading it.
    fn body_ended(&self, number: u64) {
        if self.requests.load(Ordering::Acquire) == number {
            self.body_since.store(0, Ordering::Release);
        }
    }

    /// The watchdog found the current request's body late: tell the request.
    fn body_is_late(&self, late: LateBody) {
        *lock(&self.late) = Some((self.requests.load(Ordering::Acquire), late));
        self.late_notify.notify_one();
    }

    /// Which limit request `number`'s body missed, if it did and is still unfinished.
    fn late_for(&self, number: u64) -> Option<LateBody> {
        match *lock(&self.late) {
            Some((late, why)) if late == number && self.body_since.load(Ordering::Acquire) != 0 => Some(why),
            _ => None,
        }
    }

    /// The 408 for request `number`'s late body, which closes the connection.
    fn late_response(&self, why: LateBody, limits: &ConnectionLimits) -> Response {
        let received = self.body_bytes.load(Ordering::Acquire);
        let since = self.body_since.load(Ordering::Acquire);
        let secs = self.now_ms().saturating_sub(since.saturating_sub(1)) as f64 / 1000.0;
        let message = match why {
            LateBody::TooLong => format!(
                "the request body did not arrive within {} s (server.body_timeout_secs): {received} bytes came. \
                 The connection is closed; send the request again with its whole body, or raise \
                 server.body_timeout_secs for large bodies over slow links",
                limits.body_timeout.as_secs()
            ),
            LateBody::TooSlow => format!(
                "the request body arrived too slowly: {received} bytes in {secs:.1} s, under {} bytes a second \
                 after the first {} s (server.body_min_bytes_per_sec). The connection is closed; send the \
                 request again with its whole body",
                limits.body_min_rate,
                BODY_RATE_GRACE.as_secs()
            ),
        };
        closing(ApiError::new(ErrorCode::Timeout, message).into_response(), None)
    }
}

/// `response` with `Connection: close` (hyper then closes the connection after it, leaving any
/// unread body unread) and, when given, `Retry-After`.
pub fn closing(mut response: Response, retry_after_secs: Option<u64>) -> Response {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    if let Some(secs) = retry_after_secs {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// Held by a request until its response has been sent (or dropped).
struct InFlight {
    conn: Arc<Conn>,
    /// The request's number on its connection.
    number: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.conn;
        conn.body_ended(self.number);
        // Taken out before it is dropped: the claim's drop takes the callers' lock.
        let claim = lock(&conn.claim).take();
        drop(claim);
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

/// A request body that tells its connection's watchdog when the server starts reading it, how
/// much has come, and when it ends (or the server stops reading it).
struct Timed {
    body: Incoming,
    conn: Arc<Conn>,
    /// The request's number on its connection.
    number: u64,
    state: BodyState,
}

#[derive(Clone, Copy, PartialEq)]
enum BodyState {
    Unread,
    Reading,
    Done,
}

impl Timed {
    fn finish(&mut self) {
        if self.state == BodyState::Reading {
            self.conn.body_ended(self.number);
        }
        self.state = BodyState::Done;
    }
}

impl http_body::Body for Timed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if this.state == BodyState::Unread {
            if this.body.is_end_stream() {
                this.state = BodyState::Done;
            } else {
                this.state = BodyState::Reading;
                this.conn.body_started(this.number);
            }
        }
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.conn.body_bytes.fetch_add(data.len() as u64, Ordering::AcqRel);
                }
                // A reader that stops at the last byte (without polling for the end) is done too.
                if this.body.is_end_stream() {
                    this.finish();
                }
            }
            Poll::Ready(_) => this.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        self.finish();
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
    let shares = Shares::new(&limits, max);
    let slots = Arc::new(Semaphore::new(max));
    let mut warned: Option<Instant> = None;
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(&e, &mut warned).await;
                    continue;
                }
            },
            _ = stopping.cancelled() => break,
        };
        // An IPv4 client of a dual-stack listener arrives as ::ffff:a.b.c.d: one address either way.
        let ip = peer.ip().to_canonical();
        let admission = connections.admit(ip, shares.per_address);
        let slot = match Arc::clone(&slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                // The address's own idle connection closing frees the slot this one needs.
                let evicted = admission == Admission::MadeRoom || connections.evict_oldest_idle();
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
        let (id, conn) = connections.insert(ip, admission == Admission::Refused);
        let handle = ConnectionHandle { id, conn, connections: Arc::clone(&connections), shares };
        let (router, connections, stopping) = (router.clone(), Arc::clone(&connections), stopping.clone());
        tokio::spawn(async move {
            serve_connection(tcp, router, handle, limits, stopping).await;
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
    handle: ConnectionHandle,
    limits: ConnectionLimits,
    stopping: CancellationToken,
) {
    let conn = Arc::clone(&handle.conn);
    let io = TokioIo::new(Watched { tcp, conn: Arc::clone(&conn) });
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let conn = Arc::clone(&handle.conn);
        let in_flight = conn.begin();
        let number = in_flight.number;
        // Most requests have no body (GET): nothing to time, and no race to set up below.
        let has_body = !http_body::Body::is_end_stream(request.body());
        let (mut parts, body) = request.into_parts();
        parts.extensions.insert(handle.clone());
        let body = Timed { body, conn: Arc::clone(&conn), number, state: BodyState::Unread };
        // Router is always ready (axum documents it), so `call` needs no `poll_ready` first.
        let response = tower_service::Service::call(&mut router.clone(), hyper::Request::from_parts(parts, body));
        async move {
            let response = if has_body {
                unless_late(response, &conn, number, &limits).await
            } else {
                response.await.unwrap_or_else(|never| match never {})
            };
            Ok::<_, Infallible>(response.map(|body| Tracked { body, _in_flight: in_flight }))
        }
    });
    // No hyper timer: its header timeout would arm a timer for every request (measured: a few
    // per cent of an echo call), and the watchdog below already covers headers, bodies and idle
    // time.
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

/// The handler's response, unless the watchdog finds request `number`'s body late first: then
/// the handler is dropped (and with it the body) and the answer is 408.
async fn unless_late(
    response: impl Future<Output = Result<Response, Infallible>>,
    conn: &Conn,
    number: u64,
    limits: &ConnectionLimits,
) -> Response {
    tokio::pin!(response);
    loop {
        tokio::select! {
            biased;
            answered = &mut response => return answered.unwrap_or_else(|never| match never {}),
            () = conn.late_notify.notified() => {
                // A notice for an earlier request, or for a body that made it after all, is stale.
                if let Some(why) = conn.late_for(number) {
                    return conn.late_response(why, limits);
                }
            }
        }
    }
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
    let mut draining = false;
    loop {
        tokio::select! {
            expiry = conn.expired(&limits) => match expiry {
                Expiry::Close(why) => return close(why),
                Expiry::Late(late) => {
                    conn.body_is_late(late);
                    // The request answers 408 with `Connection: close`, and hyper closes the
                    // connection after it; this closes it should that answer not go out.
                    tokio::time::sleep(LATE_BODY_CLOSE).await;
                    return close(match late {
                        LateBody::TooLong => "request body not finished in time (server.body_timeout_secs)",
                        LateBody::TooSlow => "request body too slow (server.body_min_bytes_per_sec)",
                    });
                }
            },
            _ = conn.evict.notified(), if !draining => {
                return close("making room for a new one (server.max_connections)");
            }
            _ = stopping.cancelled(), if !draining => {
                // hyper's graceful shutdown waits for a request head already begun, which a
                // half-sent request would stretch to the header timeout: with nothing in
                // flight, close at once.
                if conn.in_flight.load(Ordering::Acquire) == 0 {
                    return close("the server is stopping");
                }
                // Timeouts stay on while draining: a half-sent request must not hold shutdown up.
                draining = true;
                order.notify.notify_one();
            }
        }
    }
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
            ..ConnectionLimits::default()
        };
        let conn = Arc::new(Conn::new(IpAddr::from([127, 0, 0, 1]), false));
        assert_eq!(conn.deadline(&limits).map(|d| d.0), Some(2000), "a new connection gets the header timeout");
        let request = conn.begin();
        assert_eq!(conn.deadline(&limits), None, "a request in flight, its body not being read, never times out");
        conn.saw_bytes();
        assert_eq!(conn.head_started.load(Ordering::Acquire), 0, "body bytes are not a new head");
        drop(request);
        let idle = conn.idle_since.load(Ordering::Acquire);
        assert_eq!(conn.deadline(&limits).map(|d| d.0), Some(idle + 7000), "between requests: the idle timeout");
        conn.saw_bytes();
        let head = conn.head_started.load(Ordering::Acquire) - 1;
        assert_eq!(conn.deadline(&limits).map(|d| d.0), Some(head + 2000), "a head under way: the header timeout");
    }

    #[test]
    fn a_body_being_read_gets_the_earlier_of_its_timeout_and_its_rate_deadline() {
        let limits =
            ConnectionLimits { body_timeout: Duration::from_secs(30), body_min_rate: 1000, ..Default::default() };
        let conn = Arc::new(Conn::new(IpAddr::from([127, 0, 0, 1]), false));
        let request = conn.begin();
        conn.body_started(request.number);
        let start = conn.body_since.load(Ordering::Acquire) - 1;
        let late = |d: Option<(u64, Expiry)>| d.map(|(at, e)| (at - start, e));
        let too_slow = Expiry::Late(LateBody::TooSlow);
        assert_eq!(late(conn.deadline(&limits)), Some((5000, too_slow)), "nothing came: the grace only");
        conn.body_bytes.store(10_000, Ordering::Release);
        assert_eq!(late(conn.deadline(&limits)), Some((15_000, too_slow)), "each byte buys 1 ms at 1000 B/s");
        conn.body_bytes.store(1_000_000, Ordering::Release);
        let too_long = Expiry::Late(LateBody::TooLong);
        assert_eq!(late(conn.deadline(&limits)), Some((30_000, too_long)), "never past the body timeout");
        let no_rate = ConnectionLimits { body_min_rate: 0, ..limits };
        conn.body_bytes.store(0, Ordering::Release);
        assert_eq!(late(conn.deadline(&no_rate)), Some((30_000, too_long)), "rate 0: the timeout alone");

        conn.body_is_late(LateBody::TooSlow);
        assert_eq!(conn.late_for(request.number), Some(LateBody::TooSlow));
        assert_eq!(conn.late_for(request.number + 1), None, "a notice is for one request");
        conn.body_ended(request.number);
        assert_eq!(conn.deadline(&limits), None, "a finished body has no deadline");
        assert_eq!(conn.late_for(request.number), None, "a body that made it after all is not late");
        drop(request);
        let next = conn.begin();
        conn.body_started(next.number - 1);
        assert_eq!(conn.body_since.load(Ordering::Acquire), 0, "an earlier request's body does not start the clock");
    }

    #[test]
    fn the_busy_watchdog_looks_before_any_body_deadline() {
        let limits = ConnectionLimits { body_timeout: Duration::from_secs(2), ..Default::default() };
        assert_eq!(limits.busy_poll(), Duration::from_secs(2));
        let limits = ConnectionLimits { body_timeout: Duration::from_secs(30), ..Default::default() };
        assert_eq!(limits.busy_poll(), BODY_RATE_GRACE);
        let limits = ConnectionLimits { body_min_rate: 0, ..limits };
        assert_eq!(limits.busy_poll(), Duration::from_secs(10), "the header timeout");
    }

    #[test]
    fn an_address_over_its_share_evicts_its_own_oldest_idle_connection_and_then_is_refused() {
        let connections = Connections::default();
        let (a, b) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        let (_, other) = connections.insert(b, false);
        let (_, first) = connections.insert(a, false);
        let (second_id, second) = connections.insert(a, false);
        assert_eq!(connections.admit(b, 2), Admission::Fits);
        assert_eq!(connections.admit(a, 2), Admission::MadeRoom);
        assert!(first.evicted.load(Ordering::Acquire), "the address's oldest goes");
        assert!(!other.evicted.load(Ordering::Acquire), "another address's older one stays");
        let (_, third) = connections.insert(a, false);
        let _busy = (second.begin(), third.begin());
        assert_eq!(connections.admit(a, 2), Admission::Refused, "both of its connections are busy");
        assert!(!second.evicted.load(Ordering::Acquire) && !third.evicted.load(Ordering::Acquire));
        connections.authenticated(second_id);
        assert_eq!(connections.admit(a, 2), Admission::Fits, "an authenticated connection no longer counts");
    }

    #[test]
    fn a_scoped_token_holds_at_most_its_share_and_the_unscoped_caller_has_none() {
        let connections = Arc::new(Connections::default());
        let limits = ConnectionLimits { per_token: Some(2), ..Default::default() };
        let shares = Shares::new(&limits, 8);
        assert_eq!((shares.per_token, shares.scoped, shares.per_address), (2, 7, 4));
        let reader = Arc::new(Principal::new("reader", &["search".to_string()]).unwrap());
        let writer = Arc::new(Principal::new("writer", &["*".to_string()]).unwrap());
        let open = |ip: [u8; 4]| {
            let (id, conn) = connections.insert(IpAddr::from(ip), false);
            let in_flight = conn.begin();
            (ConnectionHandle { id, conn, connections: Arc::clone(&connections), shares }, in_flight)
        };
        let held: Vec<_> = (0..2).map(|_| open([10, 0, 0, 1])).collect();
        for (handle, _) in &held {
            handle.claim(Some(&reader)).unwrap();
        }
        let (extra, _extra) = open([10, 0, 0, 2]);
        assert!(matches!(extra.claim(Some(&reader)), Err(Refusal::Token { share: 2, .. })));
        let message = extra.claim(Some(&reader)).unwrap_err().to_string();
        assert!(message.contains("server.max_connections_per_token"), "{message}");
        extra.claim(Some(&writer)).expect("another token has its own share");
        extra.claim(None).expect("the unscoped caller has no share");
        drop(held);
        let (again, _again) = open([10, 0, 0, 1]);
        again.claim(Some(&reader)).expect("a finished request gives its place back");
    }
}
