//! The queue between a script's `progress(...)` and the MCP client. It is bounded: a script that
//! reports faster than the client reads drops reports (counted, logged once per call) instead
//! of growing memory, and one report's message is capped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::lua::{Progress, ProgressSink};

/// Reports waiting for a slow client; more are dropped.
pub const QUEUE_LEN: usize = 64;
/// Longest message of one report, in bytes; longer ones are cut and say so.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// The receiving end: what the MCP call loop forwards to the client.
pub struct ProgressQueue {
    rx: mpsc::Receiver<Progress>,
    dropped: Arc<AtomicU64>,
}

/// A sink for the script and the queue it fills.
pub fn queue() -> (ProgressSink, ProgressQueue) {
    let (tx, rx) = mpsc::channel(QUEUE_LEN);
    let dropped = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&dropped);
    let sink: ProgressSink = Arc::new(move |mut report: Progress| {
        report.message = report.message.map(cap_message);
        if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(report) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    (sink, ProgressQueue { rx, dropped })
}

impl ProgressQueue {
    /// The next report; `None` once the sink is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<Progress> {
        self.rx.recv().await
    }

    pub fn try_recv(&mut self) -> Option<Progress> {
        self.rx.try_recv().ok()
    }

    /// Reports dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Cuts a message to [`MAX_MESSAGE_BYTES`] at a character boundary, saying how long it was.
pub fn cap_message(message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    // A new string: truncating in place would keep the whole allocation alive in the queue.
    format!("{}… (progress message truncated from {} bytes)", &message[..end], message.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(message: &str) -> Progress {
        Progress { done: 1.0, total: None, message: Some(message.to_string()) }
    }

    #[test]
    fn long_messages_are_cut_at_a_character_boundary() {
        assert_eq!(cap_message("short".into()), "short");
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let cut = cap_message(long);
        assert!(cut.len() < MAX_MESSAGE_BYTES + 64, "{}", cut.len());
        assert!(cut.ends_with(&format!("(progress message truncated from {} bytes)", 2 * MAX_MESSAGE_BYTES)));
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (sink, mut queue) = queue();
        for _ in 0..QUEUE_LEN + 10 {
            sink(report(&"x".repeat(4096)));
        }
        assert_eq!(queue.dropped(), 10);
        let first = queue.try_recv().expect("queued");
        assert!(first.message.unwrap().len() < 1100);
    }
}
