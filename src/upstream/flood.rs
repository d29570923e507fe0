//! Bounds on what an upstream sends unasked (notifications, and requests to ctx): past a rate,
//! one call's progress is dropped, and so is everything unasked from the server; a server that
//! keeps that up is cut off, and its supervisor restarts it with its backoff.
//!
//! Without them, an upstream that sends progress notifications without end keeps ctx reading,
//! parsing and routing them (a third of a core, and long after the call was cancelled), and
//! with `-v` every one of them was a log line.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The rates, per second, and when a server is cut off.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Progress notifications of one call passed on to its caller per second. A person reads a
    /// few a second; an MCP client renders them at most at its frame rate.
    pub per_call: u32,
    /// Unasked messages of one server handled per second; the rest of that second's are dropped
    /// before rmcp sees them.
    pub per_server: u32,
    /// Their bytes (as ctx re-encodes them) per second: a few large messages flood as well as
    /// many small ones.
    pub per_server_bytes: usize,
    /// Seconds over the server's limit, within `span`, that cut the server off.
    pub strikes: usize,
    pub span: Duration,
}

/// The limits in use. A busy server that reports progress per item, with logging on, sends a
/// few dozen messages a second; one over 500 (or 1 MiB) in a second is flooding. One such
/// second is a burst and is only trimmed; three within ten seconds is sustained, and the server
/// is cut off within about two seconds of the start of a flood.
pub const LIMITS: Limits =
    Limits { per_call: 50, per_server: 500, per_server_bytes: 1 << 20, strikes: 3, span: Duration::from_secs(10) };

const SECOND: Duration = Duration::from_secs(1);

/// One call's progress notifications in the current second.
#[derive(Clone, Copy, Debug)]
pub struct CallMeter {
    start: Instant,
    passed: u32,
    /// Dropped over the call's life (reported once, when it ends).
    pub dropped: u64,
}

impl CallMeter {
    pub fn new(now: Instant) -> CallMeter {
        CallMeter { start: now, passed: 0, dropped: 0 }
    }

    /// Whether one more progress notification of this call goes to its caller.
    pub fn admit(&mut self, now: Instant, limits: &Limits) -> bool {
        if now.duration_since(self.start) >= SECOND {
            self.start = now;
            self.passed = 0;
        }
        if self.passed < limits.per_call {
            self.passed += 1;
            true
        } else {
            self.dropped += 1;
            false
        }
    }
}

/// What to do with one unasked message of a server.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
    /// Cut the server off; says why (for the supervisor's warning and `/health`).
    CutOff(String),
}

/// One server's unasked messages: the current second's count and bytes, and the recent seconds
/// that went over.
#[derive(Debug)]
pub struct ServerMeter {
    server: String,
    limits: Limits,
    start: Instant,
    messages: u32,
    bytes: usize,
    /// This second went over: the rest of it is dropped unread.
    over: bool,
    strikes: VecDeque<Instant>,
    dropped: u64,
}

impl ServerMeter {
    pub fn new(server: &str, limits: Limits, now: Instant) -> ServerMeter {
        ServerMeter {
            server: server.to_string(),
            limits,
            start: now,
            messages: 0,
            bytes: 0,
            over: false,
            strikes: VecDeque::new(),
            dropped: 0,
        }
    }

    /// Counts one message; `size` measures it (only while under the limit: a dropped message is
    /// not measured).
    pub fn admit(&mut self, now: Instant, size: impl FnOnce() -> usize) -> Verdict {
        if now.duration_since(self.start) >= SECOND {
            self.start = now;
            self.messages = 0;
            self.bytes = 0;
            self.over = false;
        }
        if self.over {
            self.dropped += 1;
            return Verdict::Drop;
        }
        self.messages += 1;
        self.bytes = self.bytes.saturating_add(size());
        if self.messages <= self.limits.per_server && self.bytes <= self.limits.per_server_bytes {
            return Verdict::Pass;
        }
        self.over = true;
        self.dropped += 1;
        while self.strikes.front().is_some_and(|t| now.duration_since(*t) >= self.limits.span) {
            self.strikes.pop_front();
        }
        self.strikes.push_back(now);
        if self.strikes.len() < self.limits.strikes {
            tracing::debug!(
                server = %self.server,
                "upstream sent over {} messages (or {} KiB) in a second; the rest of that second's are dropped",
                self.limits.per_server,
                self.limits.per_server_bytes >> 10
            );
            return Verdict::Drop;
        }
        Verdict::CutOff(format!(
            "it sent more than {} notifications (or {} KiB of them) a second, in {} seconds within {} s ({} dropped): a flood; ctx disconnected it",
            self.limits.per_server,
            self.limits.per_server_bytes >> 10,
            self.strikes.len(),
            self.limits.span.as_secs(),
            self.dropped
        ))
    }
}

/// Counts bytes written, to measure a message by encoding it without keeping the encoding.
#[derive(Default)]
pub struct ByteCount(pub usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: Limits =
        Limits { per_call: 3, per_server: 10, per_server_bytes: 1000, strikes: 3, span: Duration::from_secs(10) };

    #[test]
    fn a_call_passes_its_rate_and_drops_the_rest_of_each_second() {
        let t0 = Instant::now();
        let mut call = CallMeter::new(t0);
        let passed = (0..10).filter(|_| call.admit(t0, &TEST)).count();
        assert_eq!((passed, call.dropped), (3, 7));
        assert!(call.admit(t0 + SECOND, &TEST), "a new second passes again");
    }

    #[test]
    fn a_burst_is_trimmed_and_a_sustained_flood_is_cut_off() {
        let t0 = Instant::now();
        let mut server = ServerMeter::new("t", TEST, t0);
        let mut measured = 0;
        let second = |server: &mut ServerMeter, at: Instant, measured: &mut usize| -> Vec<Verdict> {
            (0..100)
                .map(|_| {
                    server.admit(at, || {
                        *measured += 1;
                        1
                    })
                })
                .collect()
        };
        let first = second(&mut server, t0, &mut measured);
        assert_eq!(first.iter().filter(|v| **v == Verdict::Pass).count(), 10);
        assert!(first[10..].iter().all(|v| *v == Verdict::Drop));
        assert_eq!(measured, 11, "a dropped message is not measured");
        // Quiet seconds in between: two seconds over the limit within the span are still a burst.
        let again = second(&mut server, t0 + 3 * SECOND, &mut measured);
        assert!(!again.iter().any(|v| matches!(v, Verdict::CutOff(_))), "{again:?}");
        assert_eq!(again.iter().filter(|v| **v == Verdict::Pass).count(), 10);
        let third = second(&mut server, t0 + 5 * SECOND, &mut measured);
        let Some(Verdict::CutOff(why)) = third.into_iter().find(|v| matches!(v, Verdict::CutOff(_))) else {
            panic!("three seconds over the limit within 10 s cut the server off")
        };
        assert!(why.contains("more than 10 notifications") && why.contains("3 seconds within 10 s"), "{why}");
    }

    #[test]
    fn strikes_age_out_and_bytes_count_too() {
        let t0 = Instant::now();
        let mut server = ServerMeter::new("t", TEST, t0);
        for i in 0..5u32 {
            // One strike every 6 s: never three within 10 s.
            let at = t0 + 6 * i * SECOND;
            let verdicts: Vec<Verdict> = (0..3).map(|_| server.admit(at, || 600)).collect();
            assert_eq!(verdicts, [Verdict::Pass, Verdict::Drop, Verdict::Drop], "second {i}");
        }
    }
}
