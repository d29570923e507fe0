//! ctx's HTTP client for Streamable HTTP upstreams, and the watch on it that notices a lost
//! connection while nobody calls.
//!
//! rmcp keeps the server's event stream (`GET`) open and retries it quietly when it fails. A
//! server that restarted answers that retry with 400 or 404 (the session is gone), and one that
//! is down refuses it; rmcp would keep retrying for ever while the server looked ready. Here
//! the first such failure ends the connection, so the supervisor reconnects and relists.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_client::{StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse};
use sse_stream::{Error as SseError, Sse};

use super::client::Cut;
use super::sniff::Executions;

/// ctx's client for one connection: the shared [`http_client`], the connection's [`Cut`], and
/// where the answers to `tools/list` are read for what rmcp's types drop ([`Executions`]).
#[derive(Clone)]
pub struct Watched {
    inner: reqwest::Client,
    cut: Cut,
    executions: Arc<Executions>,
}

impl Watched {
    pub fn new(cut: &Cut, executions: &Arc<Executions>) -> Watched {
        Watched { inner: http_client(), cut: cut.clone(), executions: Arc::clone(executions) }
    }

    /// An answer that comes as an event stream is read for tool lists as it passes.
    fn reading(
        &self,
        answer: Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        match answer {
            Ok(StreamableHttpPostResponse::Sse(stream, id)) => {
                let read = Reading { inner: stream, executions: Arc::clone(&self.executions) };
                Ok(StreamableHttpPostResponse::Sse(Box::pin(read), id))
            }
            other => other,
        }
    }
}

/// An answer's event stream, each event's data shown to [`Executions`] on the way.
struct Reading {
    inner: Stream,
    executions: Arc<Executions>,
}

impl futures_core::Stream for Reading {
    type Item = Result<Sse, SseError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let next = self.inner.as_mut().poll_next(cx);
        if let std::task::Poll::Ready(Some(Ok(event))) = &next {
            if let Some(data) = &event.data {
                let head = &data.as_bytes()[..data.len().min(256)];
                if super::sniff::may_be_tool_list(head) {
                    self.executions.see(data.as_bytes());
                }
            }
        }
        next
    }
}

type Stream = std::pin::Pin<Box<dyn futures_core::Stream<Item = Result<Sse, SseError>> + Send + 'static>>;

impl StreamableHttpClient for Watched {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let answer = self.inner.post_message(uri, message, session_id, auth_header, custom_headers).await;
        self.reading(answer)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let answer = self
            .inner
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.reading(answer)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner.delete_session(uri, session_id, auth_header, custom_headers).await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Stream, StreamableHttpError<Self::Error>> {
        let opened = self.inner.get_stream(uri, session_id, last_event_id, auth_header, custom_headers).await;
        self.watch(opened)
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Stream, StreamableHttpError<Self::Error>> {
        let opened = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        self.watch(opened)
    }
}

impl Watched {
    /// A failure to open the event stream that means the session or the server is gone (400,
    /// 404 or 410 for the session, or no connection) ends the connection; a server without one
    /// (405) or with a passing error (5xx, 429, 409) is fine.
    fn watch(
        &self,
        opened: Result<Stream, StreamableHttpError<reqwest::Error>>,
    ) -> Result<Stream, StreamableHttpError<reqwest::Error>> {
        if let Err(e) = &opened {
            let session_gone = match e {
                StreamableHttpError::Client(e) => matches!(e.status().map(|s| s.as_u16()), Some(400 | 404 | 410)),
                StreamableHttpError::SessionExpired => true,
                _ => false,
            };
            if session_gone || unreachable(e) {
                self.cut.set(format!("the upstream's event stream failed: {}", describe(e)));
            }
        }
        opened
    }
}

/// Whether a failed request means the server cannot be reached or the connection is gone; a
/// server's error answer (5xx, 429, a refused request) is that request's failure only, so one
/// caller's bad request never cuts the connection every caller shares.
pub fn unreachable(e: &StreamableHttpError<reqwest::Error>) -> bool {
    match e {
        StreamableHttpError::Client(e) => e.is_connect(),
        StreamableHttpError::SessionExpired | StreamableHttpError::TransportChannelClosed => true,
        _ => false,
    }
}

/// [`unreachable`] for a transport's error of any type: a stdio pipe that fails is always gone.
pub fn connection_lost(e: &(dyn std::error::Error + 'static)) -> bool {
    match e.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
        Some(e) => unreachable(e),
        None => true,
    }
}

/// A failed request in a user's words: rmcp's message stops at reqwest's "error sending request
/// for url (…)", whose causes say why (`Connection refused`).
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    match e.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
        Some(StreamableHttpError::Client(inner)) => super::client::chain(inner),
        _ => super::client::chain(e),
    }
}

/// ctx's HTTP client for upstreams (rustls with ring, no proxy from the environment: through
/// a proxy ctx could not see where its upstream traffic goes).
///
/// Redirects are followed only within the configured origin (`/mcp` to `/mcp/` is common): an
/// upstream that redirects elsewhere would make ctx send the section's `headers` (reqwest drops
/// only `Authorization` and cookies across hosts, not `X-Api-Key`) to a host it was not given.
pub fn http_client() -> reqwest::Client {
    // Static: one client whose policy is all constants, no config; the same client serves any application.
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let redirects = reqwest::redirect::Policy::custom(|attempt| {
                let first = attempt.previous().first().cloned();
                match first {
                    Some(first) if attempt.previous().len() > 5 => {
                        attempt.error(format!("more than 5 redirects from {}", first.origin().ascii_serialization()))
                    }
                    Some(first) if same_origin(&first, attempt.url()) => attempt.follow(),
                    Some(first) => {
                        // reqwest's error says only "error following redirect": the log says why.
                        let message = format!(
                            "an upstream server redirected to another origin ({}); ctx follows redirects within {} only: set url to where the server is",
                            attempt.url().origin().ascii_serialization(),
                            first.origin().ascii_serialization()
                        );
                        tracing::warn!("{message}");
                        attempt.error(message)
                    }
                    None => attempt.follow(),
                }
            });
            reqwest::Client::builder()
                .user_agent(concat!("ctx/", env!("CARGO_PKG_VERSION")))
                .pool_idle_timeout(Duration::from_secs(60))
                .redirect(redirects)
                .no_proxy()
                .build()
                .expect("the HTTP client builds")
        })
        .clone()
}

/// Whether `next` is on the origin (scheme, host, port) of `first`.
fn same_origin(first: &reqwest::Url, next: &reqwest::Url) -> bool {
    first.origin() == next.origin()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_stay_on_the_configured_origin() {
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(same_origin(&url("https://h.example/mcp"), &url("https://h.example/mcp/")));
        assert!(same_origin(&url("https://h.example/mcp"), &url("https://h.example:443/other")));
        assert!(!same_origin(&url("https://h.example/mcp"), &url("http://h.example/mcp")));
        assert!(!same_origin(&url("https://h.example/mcp"), &url("https://h.example:8443/mcp")));
        assert!(!same_origin(&url("https://h.example/mcp"), &url("https://169.254.169.254/latest")));
    }
}
