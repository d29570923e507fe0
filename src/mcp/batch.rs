//! JSON-RPC batches (a JSON array of messages). MCP dropped them in 2025-06-18, so ctx answers
//! every batch with one clear error, over HTTP and over stdio: rmcp alone answers HTTP 415 with a
//! deserialisation message, or a bare "Invalid request" on stdio.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use rmcp::model::{ErrorCode, ErrorData, ServerJsonRpcMessage};
use rmcp::service::RxJsonRpcMessage;
use rmcp::transport::Transport;
use rmcp::RoleServer;
use serde_json::{json, Value as Json};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;

pub const MESSAGE: &str = "batches are not supported by this protocol version; send one request per message";

/// The body starts with `[` (after whitespace and a UTF-8 byte order mark).
pub fn is_batch(body: &[u8]) -> bool {
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[')
}

/// The JSON-RPC error for a batch. Its id is null: a batch has no single id to answer.
pub fn refusal() -> Json {
    json!({"jsonrpc": "2.0", "id": null, "error": {"code": ErrorCode::INVALID_REQUEST.0, "message": MESSAGE}})
}

/// Batch lines seen on stdin and not answered yet.
#[derive(Default)]
pub struct Seen {
    count: AtomicUsize,
    notify: Notify,
}

impl Seen {
    fn add(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    fn take(&self) -> bool {
        self.count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Line {
    /// Only whitespace so far.
    Start,
    Batch,
    Other,
}

/// Reads newline-delimited JSON-RPC (stdio) and blanks every batch line, counting it in
/// [`Seen`]. rmcp skips a blank line without a word; [`Answering`] answers it.
pub struct BatchFilter<R> {
    inner: R,
    line: Line,
    seen: Arc<Seen>,
}

impl<R> BatchFilter<R> {
    pub fn new(inner: R, seen: Arc<Seen>) -> Self {
        BatchFilter { inner, line: Line::Start, seen }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for BatchFilter<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        for byte in &mut buf.filled_mut()[before..] {
            match (this.line, *byte) {
                (_, b'\n') => this.line = Line::Start,
                (Line::Start, b'[') => {
                    this.line = Line::Batch;
                    this.seen.add();
                    *byte = b' ';
                }
                // A byte order mark or whitespace before the first character.
                (Line::Start, b) if b.is_ascii_whitespace() || b >= 0x80 => {}
                (Line::Start, _) => this.line = Line::Other,
                (Line::Batch, _) => *byte = b' ',
                (Line::Other, _) => {}
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// A transport that answers the batches its [`BatchFilter`] blanked out.
pub struct Answering<T> {
    inner: T,
    seen: Arc<Seen>,
}

impl<T> Answering<T> {
    pub fn new(inner: T, seen: Arc<Seen>) -> Self {
        Answering { inner, seen }
    }
}

impl<T: Transport<RoleServer>> Transport<RoleServer> for Answering<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            while self.seen.take() {
                let error = ErrorData::new(ErrorCode::INVALID_REQUEST, MESSAGE, None);
                if self.inner.send(ServerJsonRpcMessage::error(error, None)).await.is_err() {
                    return None;
                }
            }
            // rmcp's line reader keeps a partial line when its read is dropped, so leaving it
            // for a batch to answer loses nothing.
            tokio::select! {
                message = self.inner.receive() => return message,
                _ = self.seen.notify.notified() => {}
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn batches_are_recognised() {
        assert!(is_batch(b"[{}]"));
        assert!(is_batch(b" \r\n\t[]"));
        assert!(is_batch(b"\xEF\xBB\xBF[]"));
        assert!(!is_batch(b"{\"a\": [1]}"));
        assert!(!is_batch(b""));
    }

    #[test]
    fn the_filter_blanks_batch_lines_only() {
        // A test's own runtime: the filter is async and a unit test has no ctx runtime to run it on.
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let seen = Arc::new(Seen::default());
        let input: &[u8] = b"{\"id\":1,\"a\":[2]}\n  [{\"id\":3}]\n{\"id\":4}\n[1,\n";
        let mut filter = BatchFilter::new(input, Arc::clone(&seen));
        let mut out = String::new();
        runtime.block_on(filter.read_to_string(&mut out)).unwrap();
        let blank = |n: usize| " ".repeat(n);
        assert_eq!(out, format!("{{\"id\":1,\"a\":[2]}}\n{}\n{{\"id\":4}}\n{}\n", blank(12), blank(3)));
        assert!(seen.take() && seen.take() && !seen.take());
    }
}
