//! A stdio upstream's stderr, read by a task and written to ctx's log, bounded: long lines are
//! cut, and past a budget per minute lines are counted instead of logged. Never to stdout,
//! which in `ctx mcp` stdio mode carries only protocol.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

/// The longest line logged; the rest of a longer line is counted, not kept.
pub const MAX_LINE: usize = 4096;
/// Lines and bytes logged per window; the rest are counted and reported once per window.
const LINES_PER_WINDOW: u32 = 200;
const BYTES_PER_WINDOW: usize = 64 * 1024;
const WINDOW: Duration = Duration::from_secs(60);

/// The last line the server wrote, for the error message when it dies at start.
pub type Tail = Arc<Mutex<Option<String>>>;

/// Counts lines against the budget of the current window.
#[derive(Debug)]
pub struct Budget {
    start: Instant,
    lines: u32,
    bytes: usize,
    dropped_lines: u32,
    dropped_bytes: usize,
}

/// What to do with one line.
#[derive(Debug, PartialEq, Eq)]
pub struct Admit {
    pub log: bool,
    /// The previous window ended with this many lines (bytes) dropped: say so first.
    pub report_dropped: Option<(u32, usize)>,
}

impl Budget {
    pub fn new(now: Instant) -> Budget {
        Budget { start: now, lines: 0, bytes: 0, dropped_lines: 0, dropped_bytes: 0 }
    }

    pub fn admit(&mut self, now: Instant, len: usize) -> Admit {
        let mut report_dropped = None;
        if now.duration_since(self.start) >= WINDOW {
            if self.dropped_lines > 0 {
                report_dropped = Some((self.dropped_lines, self.dropped_bytes));
            }
            *self = Budget::new(now);
        }
        let log = self.lines < LINES_PER_WINDOW && self.bytes + len <= BYTES_PER_WINDOW;
        if log {
            self.lines += 1;
            self.bytes += len;
        } else {
            self.dropped_lines += 1;
            self.dropped_bytes += len;
        }
        Admit { log, report_dropped }
    }

    /// Lines dropped in the current window (reported when the stream ends).
    pub fn dropped(&self) -> (u32, usize) {
        (self.dropped_lines, self.dropped_bytes)
    }
}

/// Reads `stderr` to its end, logging each line with the server's name.
pub fn spawn_reader<R>(server: String, mut stderr: R, tail: Tail) -> tokio::task::JoinHandle<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut budget = Budget::new(Instant::now());
        let mut line: Vec<u8> = Vec::with_capacity(256);
        let mut cut = 0usize; // bytes of the current line beyond MAX_LINE
        let mut buf = vec![0u8; 8192];
        loop {
            let n = match stderr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for &b in &buf[..n] {
                if b == b'\n' {
                    emit(&server, &line, cut, &mut budget, &tail);
                    line.clear();
                    cut = 0;
                } else if line.len() < MAX_LINE {
                    line.push(b);
                } else {
                    cut += 1;
                }
            }
        }
        if !line.is_empty() {
            emit(&server, &line, cut, &mut budget, &tail);
        }
        let (lines, bytes) = budget.dropped();
        if lines > 0 {
            tracing::warn!(server = %server, "upstream stderr: {lines} lines ({bytes} bytes) not logged (over the limit of {LINES_PER_WINDOW} lines or {} KiB a minute)", BYTES_PER_WINDOW / 1024);
        }
    })
}

fn emit(server: &str, line: &[u8], cut: usize, budget: &mut Budget, tail: &Tail) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches('\r');
    if text.trim().is_empty() {
        return;
    }
    *tail.lock().unwrap_or_else(|p| p.into_inner()) = Some(text.to_string());
    let admit = budget.admit(Instant::now(), line.len() + cut);
    if let Some((lines, bytes)) = admit.report_dropped {
        tracing::warn!(server = %server, "upstream stderr: {lines} lines ({bytes} bytes) not logged in the last minute (over the limit)");
    }
    if admit.log {
        if cut > 0 {
            tracing::info!(server = %server, "upstream stderr: {text} [... {cut} more bytes cut]");
        } else {
            tracing::info!(server = %server, "upstream stderr: {text}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_drops_past_the_limit_and_reports_in_the_next_window() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let logged = (0..500).filter(|_| b.admit(t0, 100).log).count();
        assert_eq!(logged, LINES_PER_WINDOW as usize);
        assert_eq!(b.dropped(), (300, 30_000));
        let next = b.admit(t0 + WINDOW, 100);
        assert_eq!(next, Admit { log: true, report_dropped: Some((300, 30_000)) });
    }

    #[test]
    fn budget_counts_bytes_too() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let logged = (0..100).filter(|_| b.admit(t0, MAX_LINE).log).count();
        assert_eq!(logged, BYTES_PER_WINDOW / MAX_LINE);
    }
}
