//! A stdio upstream's stdout, read with a bound per message.
//!
//! rmcp drops a line over its own limit (16 MiB) without a word to the request it answered, so
//! the caller waited for its full timeout (60 s by default) and then heard "timeout". This
//! reader sits under rmcp's: a line over [`MAX_MESSAGE`] is cut off, and when it is an answer
//! to one of ctx's requests (`{"jsonrpc":"2.0","id":N,"result"|"error"...`, the order every
//! SDK writes) that request gets an error at once that says why. Memory stays bounded: the rest
//! of the line is read and thrown away, never buffered.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use serde_json::{json, Value as Json};
use tokio::io::{AsyncRead, ReadBuf};

use super::sniff::{self, Executions};

/// The longest message ctx reads from a stdio upstream (rmcp's own limit and its HTTP one).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Marks the error this reader makes up, so that it maps to "too large" and not to an
/// upstream's own error.
pub const TOO_LARGE_MARK: &str = "ctx_upstream_answer_too_large";

/// How much of a line's start is kept to find its id.
const HEAD: usize = 256;
/// Bytes read from the pipe at a time.
const CHUNK: usize = 64 * 1024;

pub struct Bounded<R> {
    inner: R,
    server: String,
    limit: usize,
    raw: Box<[u8]>,
    raw_pos: usize,
    raw_len: usize,
    /// Bytes for rmcp, in stream order; `out_pos` of them already handed out.
    out: Vec<u8>,
    out_pos: usize,
    /// Bytes of the current line handed out so far.
    line: usize,
    head: Vec<u8>,
    /// Throwing away the rest of an oversized line.
    skipping: bool,
    /// Where answers to `tools/list` are read for what rmcp's types drop (see [`sniff`]).
    executions: Option<Arc<Executions>>,
    /// Whether the current line is kept for `executions`: undecided until its head is read.
    sniff: Sniff,
    /// The current line, while it is kept.
    kept: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sniff {
    Undecided,
    Keep,
    Skip,
}

impl<R> Bounded<R> {
    pub fn new(inner: R, server: &str) -> Bounded<R> {
        Bounded::with_limit(inner, server, MAX_MESSAGE)
    }

    /// Also reads the answers to `tools/list` into `executions`.
    pub fn reading_executions(mut self, executions: Arc<Executions>) -> Bounded<R> {
        self.executions = Some(executions);
        self
    }

    pub fn with_limit(inner: R, server: &str, limit: usize) -> Bounded<R> {
        Bounded {
            inner,
            server: server.to_string(),
            limit,
            raw: vec![0; CHUNK].into_boxed_slice(),
            raw_pos: 0,
            raw_len: 0,
            out: Vec::new(),
            out_pos: 0,
            line: 0,
            head: Vec::new(),
            skipping: false,
            executions: None,
            sniff: Sniff::Undecided,
            kept: Vec::new(),
        }
    }

    /// Moves the read bytes to `out`, cutting oversized lines.
    fn process(&mut self) {
        while self.raw_pos < self.raw_len {
            let chunk = &self.raw[self.raw_pos..self.raw_len];
            let newline = chunk.iter().position(|b| *b == b'\n');
            let take = newline.map_or(chunk.len(), |i| i + 1);
            let content = take - usize::from(newline.is_some());
            if self.skipping {
                // Still throwing away an oversized line.
            } else if self.line + content > self.limit {
                let keep = HEAD.saturating_sub(self.head.len()).min(take);
                self.head.extend_from_slice(&chunk[..keep]);
                // The newline ends the part rmcp holds: cut JSON does not parse, and rmcp
                // drops it. Then the made-up answer, if the line was an answer.
                self.out.push(b'\n');
                match answer_id(&self.head) {
                    Some(id) => {
                        tracing::warn!(server = %self.server, "upstream answer over {} MiB dropped; its request fails", self.limit >> 20);
                        let line = too_large(id, self.limit);
                        self.out.extend_from_slice(line.as_bytes());
                    }
                    None => {
                        tracing::warn!(server = %self.server, "upstream message over {} MiB dropped", self.limit >> 20)
                    }
                }
                self.skipping = true;
                self.sniff = Sniff::Skip;
                self.kept.clear();
            } else {
                let keep = HEAD.saturating_sub(self.head.len()).min(take);
                self.head.extend_from_slice(&chunk[..keep]);
                self.out.extend_from_slice(&chunk[..take]);
                self.line += take;
                if self.executions.is_some() {
                    keep_for_sniffing(
                        (&mut self.sniff, &mut self.kept, &self.head),
                        &chunk[..content],
                        keep,
                        newline.is_some(),
                    );
                }
            }
            if newline.is_some() {
                if self.sniff == Sniff::Keep {
                    if let Some(executions) = &self.executions {
                        executions.see(&self.kept);
                    }
                }
                self.kept.clear();
                if self.kept.capacity() > sniff::MAX_MESSAGE / 4 {
                    self.kept = Vec::new();
                }
                self.sniff = Sniff::Undecided;
                self.line = 0;
                self.head.clear();
                self.skipping = false;
            }
            self.raw_pos += take;
        }
    }
}

/// Keeps the current line while it may be a tool list: `content` is this chunk's part of it (no
/// newline), of which the first `in_head` bytes also went to `head`. Decided once the head is
/// read (or the line ends); only such answers are copied.
fn keep_for_sniffing(
    (sniff, kept, head): (&mut Sniff, &mut Vec<u8>, &[u8]),
    content: &[u8],
    in_head: usize,
    ends: bool,
) {
    match *sniff {
        Sniff::Undecided if head.len() >= HEAD || ends => {
            if sniff::may_be_tool_list(head) {
                *sniff = Sniff::Keep;
                // The head holds the whole line so far (it was shorter than the head).
                kept.extend_from_slice(head);
                if in_head < content.len() {
                    kept.extend_from_slice(&content[in_head..]);
                }
            } else {
                *sniff = Sniff::Skip;
            }
        }
        Sniff::Keep if kept.len() + content.len() > sniff::MAX_MESSAGE => {
            *sniff = Sniff::Skip;
            kept.clear();
        }
        Sniff::Keep => kept.extend_from_slice(content),
        Sniff::Undecided | Sniff::Skip => {}
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Bounded<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.out_pos < this.out.len() {
                let n = (this.out.len() - this.out_pos).min(buf.remaining());
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.raw_pos < this.raw_len {
                this.process();
                continue;
            }
            let mut read = ReadBuf::new(&mut this.raw);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(())); // end of stream
            }
            this.raw_pos = 0;
            this.raw_len = n;
        }
    }
}

/// The id of an answer, from the start of its line: `{"jsonrpc":"2.0","id":<id>,"result"` (or
/// `"error"`). Anything else (a request or notification, keys in another order) is `None`: a
/// made-up answer must never fail a request it does not belong to.
fn answer_id(head: &[u8]) -> Option<Json> {
    let text = match std::str::from_utf8(head) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
    };
    let body = text.trim_start().strip_prefix('{')?;
    let at = body.find("\"id\"")?;
    // A brace or bracket before it: "id" may belong to a nested value.
    if body[..at].contains(['{', '[']) {
        return None;
    }
    let rest = body[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    let (id, after) = if let Some(string) = rest.strip_prefix('"') {
        let mut escaped = false;
        let end = string.char_indices().find_map(|(i, c)| {
            let end = !escaped && c == '"';
            escaped = !escaped && c == '\\';
            end.then_some(i)
        })?;
        (serde_json::from_str::<Json>(&rest[..end + 2]).ok()?, &string[end + 1..])
    } else {
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(rest.len());
        (Json::from(rest[..end].parse::<i64>().ok()?), &rest[end..])
    };
    let next = after.trim_start().strip_prefix(',')?.trim_start();
    (next.starts_with("\"result\"") || next.starts_with("\"error\"")).then_some(id)
}

fn too_large(id: Json, limit: usize) -> String {
    let message = format!(
        "its answer is over {} MiB, the most ctx reads from an upstream server; ctx dropped it. Ask for less (a narrower query, a page)",
        limit >> 20
    );
    let error = json!({"code": -32603, "message": message, "data": {"reason": TOO_LARGE_MARK}});
    format!("{}\n", json!({"jsonrpc": "2.0", "id": id, "error": error}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn read_all(input: Vec<u8>, limit: usize) -> String {
        // A test's own runtime: the reader is async and a unit test has no ctx runtime to run it on.
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let mut reader = Bounded::with_limit(&input[..], "t", limit);
            let mut out = Vec::new();
            reader.read_to_end(&mut out).await.unwrap();
            String::from_utf8(out).unwrap()
        })
    }

    #[test]
    fn lines_within_the_limit_pass_unchanged() {
        let input = "{\"a\":1}\n\n{\"b\":2}\nno newline at the end";
        assert_eq!(read_all(input.as_bytes().to_vec(), 64), input);
    }

    #[test]
    fn an_oversized_answer_becomes_an_error_for_its_id_and_the_next_line_survives() {
        let big = format!("{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{{\"t\":\"{}\"}}}}\n", "x".repeat(200_000));
        let input = [big.as_bytes(), b"{\"next\":1}\n"].concat();
        let out = read_all(input, 1024);
        // What was handed out of the big line (none here: it overflows in its first read) ends
        // at a newline, and never parses.
        assert!(out.lines().all(|l| l.len() <= 1024), "a line over the limit got through");
        let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
        let error: Json = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(error["id"], 7);
        assert_eq!(error["error"]["data"]["reason"], TOO_LARGE_MARK);
        assert_eq!(lines[1..], ["{\"next\":1}"]);
    }

    #[test]
    fn ids_are_found_only_in_answers() {
        assert_eq!(answer_id(b"{\"jsonrpc\":\"2.0\",\"id\":12,\"result\":{"), Some(json!(12)));
        assert_eq!(answer_id(b" { \"jsonrpc\" : \"2.0\" , \"id\" : \"a\\\"b\" , \"error\""), Some(json!("a\"b")));
        assert_eq!(answer_id(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"x\""), None);
        assert_eq!(answer_id(b"{\"result\":{\"id\":3,\"result\":1"), None);
        assert_eq!(answer_id(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\""), None);
        assert_eq!(answer_id(b"xxxxxxxx"), None);
        assert_eq!(answer_id(&[0xff, 0xfe]), None);
    }
}
